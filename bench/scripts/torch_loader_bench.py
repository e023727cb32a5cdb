"""One epoch of a PyTorch DataLoader over shard objects, with simulated accelerator compute;
how many samples per second it delivered and how busy the accelerator was.

    python3 torch_loader_bench.py hydrant HOST:PORT PREFIX WORKERS COMPUTE_MS
    python3 torch_loader_bench.py hydrant-unplanned HOST:PORT PREFIX WORKERS COMPUTE_MS
    python3 torch_loader_bench.py s3torchconnector ENDPOINT_URL s3://BUCKET/PREFIX WORKERS COMPUTE_MS

`hydrant`: hydrant.torch.ShardDataset over PREFIX (BUCKET/PREFIX) through hydrant's native
protocol, each worker announcing its order to the server (loader-order prefetch);
`hydrant-unplanned`: the same without announcing it. `s3torchconnector`: S3IterableDataset.from_prefix over the S3 endpoint (the origin
directly). Each shard is one sample; the "accelerator" spends COMPUTE_MS per sample (a sleep, as
the benchmark harness's simulated compute). Prints `samples=N seconds=S samples_per_second=R
utilisation=U bytes=B` (utilisation: compute time / wall time).
"""

import sys
import time

import torch.utils.data


def main():
    mode, endpoint, prefix, workers, compute_ms = sys.argv[1:6]
    workers, compute = int(workers), float(compute_ms) / 1000
    if mode in ("hydrant", "hydrant-unplanned"):
        import hydrant
        import hydrant.torch

        dataset = hydrant.torch.ShardDataset(prefix, client=hydrant.Client(endpoint), shuffle=True,
                                             seed=0, transform=lambda path, data: len(data),
                                             plan=mode == "hydrant")
    elif mode == "s3torchconnector":
        from s3torchconnector import S3ClientConfig, S3IterableDataset

        dataset = S3IterableDataset.from_prefix(
            prefix, region="us-east-1", endpoint=endpoint,
            s3client_config=S3ClientConfig(force_path_style=True),
            transform=lambda item: len(item.read()), enable_sharding=True,
        )
    else:
        sys.exit(f"unknown mode {mode}")
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                         prefetch_factor=4 if workers else None)
    samples = 0
    size = 0
    busy = 0.0
    started = time.monotonic()
    for length in loader:
        samples += 1
        size += length
        begun = time.monotonic()
        time.sleep(compute)
        busy += time.monotonic() - begun
    seconds = time.monotonic() - started
    print(f"samples={samples} seconds={seconds:.3f} samples_per_second={samples / seconds:.2f} "
          f"utilisation={busy / seconds:.3f} bytes={size}")


if __name__ == "__main__":
    main()
