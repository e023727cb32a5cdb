"""Time a torch.distributed.checkpoint (DCP) save of a state dict of STATE_MIB until it returns.

    python3 dcp_save_bench.py hydrant HOST:PORT hydrant://BUCKET/PREFIX STATE_MIB [- SAVES]
    python3 dcp_save_bench.py hydrant-local HOST:PORT hydrant://BUCKET/PREFIX STATE_MIB SOCKET [SAVES]
    python3 dcp_save_bench.py s3torchconnector ENDPOINT_URL s3://BUCKET/PREFIX STATE_MIB [- SAVES]
    python3 dcp_save_bench.py boto3 ENDPOINT_URL s3://BUCKET/PREFIX STATE_MIB [- SAVES]

`hydrant`: hydrant.torch.dcp.StorageWriter (returns once every object is on the node's NVMe).
`hydrant-local`: the same, writing through the server's same-host socket SOCKET.
`s3torchconnector`: its DCP S3StorageWriter, straight to the S3 endpoint (it fails against moto's server: "Header ETag not found").
`boto3`: DCP's own FileSystemWriter over a file system of boto3 calls, straight to the S3
endpoint: each object is spooled and uploaded with boto3's transfer manager (multipart in 16 MiB
parts, 4 at a time), `.metadata` written under a temporary name and copied into place as DCP
does. All with 4 writer threads. The state dict is 64 tensors of float32 (random), saved SAVES
times (2 by default) by one process, under PREFIX/save-0, PREFIX/save-1, ... Prints
`first_seconds=S seconds=S bytes=B`: the first save's time and the last's.
"""

import contextlib
import io
import sys
import tempfile
import time

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemWriter


class _Upload(io.RawIOBase):
    """An object being written: spooled, and uploaded when closed (DCP closes its streams)."""

    def __init__(self, upload):
        super().__init__()
        self._spool = tempfile.SpooledTemporaryFile(max_size=64 << 20)
        self._upload = upload

    def writable(self):
        return True

    def write(self, data):
        return self._spool.write(data)

    def tell(self):
        return self._spool.tell()

    def close(self):
        if not self.closed:
            self._spool.seek(0)
            self._upload(self._spool)
            self._spool.close()
        super().close()


class Boto3FileSystem(FileSystemBase):
    """What DCP's FileSystemWriter needs of a file system, as boto3 calls on s3://BUCKET/KEY."""

    def __init__(self, endpoint):
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                   aws_access_key_id="bench", aws_secret_access_key="bench")
        self.transfer = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20,
                                       max_concurrency=4)

    @staticmethod
    def _split(path):
        bucket, _, key = str(path)[len("s3://"):].partition("/")
        return bucket, key

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        bucket, key = self._split(path)
        if "w" in mode:
            stream = _Upload(lambda spool: self.client.upload_fileobj(spool, bucket, key,
                                                                      Config=self.transfer))
            try:
                yield stream
            finally:
                stream.close()
        else:
            data = io.BytesIO()
            self.client.download_fileobj(bucket, key, data)
            data.seek(0)
            yield data

    def concat_path(self, path, suffix):
        return f"{str(path).rstrip('/')}/{suffix}"

    def rename(self, path, new_path):
        bucket, key = self._split(path)
        new_bucket, new_key = self._split(new_path)
        self.client.copy_object(Bucket=new_bucket, Key=new_key,
                                CopySource={"Bucket": bucket, "Key": key})
        self.client.delete_object(Bucket=bucket, Key=key)

    def init_path(self, path):
        return str(path)

    def mkdir(self, path):
        pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return str(checkpoint_id).startswith("s3://")

    def exists(self, path):
        bucket, key = self._split(path)
        try:
            self.client.head_object(Bucket=bucket, Key=key)
            return True
        except self.client.exceptions.ClientError:
            return False

    def rm_file(self, path):
        bucket, key = self._split(path)
        self.client.delete_object(Bucket=bucket, Key=key)


def main():
    mode, endpoint, checkpoint, state_mib = sys.argv[1:5]
    tensors = 64
    elements = int(state_mib) * (1 << 20) // 4 // tensors
    generator = torch.Generator().manual_seed(0)
    state = {f"layer{index}.weight": torch.rand(elements, generator=generator) for index in range(tensors)}
    if mode in ("hydrant", "hydrant-local"):
        from hydrant.torch.dcp import StorageWriter

        local = {"local_socket": sys.argv[5]} \
            if mode == "hydrant-local" else {}
        writer = StorageWriter(checkpoint, thread_count=4, servers=endpoint, **local)
    elif mode == "s3torchconnector":
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3StorageWriter
        from s3torchconnector.dcp.s3_file_system import S3FileSystem

        config = S3ClientConfig(force_path_style=True)
        writer = S3StorageWriter("us-east-1", checkpoint, s3client_config=config, thread_count=4)
        # The writer takes no endpoint: give its file system a client of the endpoint.
        writer.fs = S3FileSystem("us-east-1", s3_client=S3Client("us-east-1", endpoint=endpoint, s3client_config=config))
    elif mode == "boto3":
        writer = FileSystemWriter(checkpoint, thread_count=4, sync_files=False)
        writer.fs = Boto3FileSystem(endpoint)
        writer.path = checkpoint
    else:
        sys.exit(f"unknown mode {mode}")
    # Two saves, as a training job saves again and again: the first pays what a process sets
    # up once (connections, and for the same-host socket its regions' memory).
    saves = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    times = []
    for save in range(saves):
        started = time.monotonic()
        dcp.save(state, storage_writer=writer, checkpoint_id=f"{checkpoint}/save-{save}",
                 no_dist=True)
        times.append(time.monotonic() - started)
    size = sum(tensor.numel() * tensor.element_size() for tensor in state.values())
    print(f"first_seconds={times[0]:.3f} seconds={times[-1]:.3f} bytes={size}")


if __name__ == "__main__":
    main()
