"""Time a torch.distributed.checkpoint (DCP) save of a state dict of STATE_MIB until it returns.

    python3 dcp_save_bench.py hydrant HOST:PORT hydrant://BUCKET/PREFIX STATE_MIB
    python3 dcp_save_bench.py s3torchconnector ENDPOINT_URL s3://BUCKET/PREFIX STATE_MIB

`hydrant`: hydrant.torch.dcp.StorageWriter (returns once every object is on the node's NVMe).
`s3torchconnector`: its DCP S3StorageWriter, straight to the S3 endpoint. Both with 4 writer
threads. The state dict is 64 tensors of float32 (random). Prints `seconds=S bytes=B`.
"""

import sys
import time

import torch
import torch.distributed.checkpoint as dcp


def main():
    mode, endpoint, checkpoint, state_mib = sys.argv[1:5]
    tensors = 64
    elements = int(state_mib) * (1 << 20) // 4 // tensors
    generator = torch.Generator().manual_seed(0)
    state = {f"layer{index}.weight": torch.rand(elements, generator=generator) for index in range(tensors)}
    if mode == "hydrant":
        from hydrant.torch.dcp import StorageWriter

        writer = StorageWriter(checkpoint, thread_count=4, servers=endpoint)
    elif mode == "s3torchconnector":
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3StorageWriter
        from s3torchconnector.dcp.s3_file_system import S3FileSystem

        config = S3ClientConfig(force_path_style=True)
        writer = S3StorageWriter("us-east-1", checkpoint, s3client_config=config, thread_count=4)
        # The writer takes no endpoint: give its file system a client of the endpoint.
        writer.fs = S3FileSystem("us-east-1", s3_client=S3Client("us-east-1", endpoint=endpoint, s3client_config=config))
    else:
        sys.exit(f"unknown mode {mode}")
    started = time.monotonic()
    dcp.save(state, storage_writer=writer, no_dist=True)
    seconds = time.monotonic() - started
    size = sum(tensor.numel() * tensor.element_size() for tensor in state.values())
    print(f"seconds={seconds:.3f} bytes={size}")


if __name__ == "__main__":
    main()
