"""Time ``torch.save`` of a state dict of STATE_MIB until it returns, into hydrant or a local file.

    python3 torch_save_bench.py hydrant HOST:PORT BUCKET/KEY STATE_MIB
    python3 torch_save_bench.py file - PATH STATE_MIB

`hydrant`: hydrant.torch.save (returns once the object is durable on the node's NVMe).
`file`: torch.save into a local file, then os.fsync (durable on the local disk). The state
dict is 64 tensors of float32 (random). Prints `seconds=S bytes=B`.
"""

import os
import sys
import time

import torch


def main():
    mode, endpoint, target, state_mib = sys.argv[1:5]
    tensors = 64
    elements = int(state_mib) * (1 << 20) // 4 // tensors
    generator = torch.Generator().manual_seed(0)
    state = {f"layer{index}.weight": torch.rand(elements, generator=generator) for index in range(tensors)}
    started = time.monotonic()
    if mode == "hydrant":
        import hydrant
        import hydrant.torch

        hydrant.torch.save(state, target, client=hydrant.Client(endpoint))
        size = hydrant.Client(endpoint).stat(target).size
    elif mode == "file":
        with open(target, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        size = os.path.getsize(target)
    else:
        sys.exit(f"unknown mode {mode}")
    seconds = time.monotonic() - started
    print(f"seconds={seconds:.3f} bytes={size}")


if __name__ == "__main__":
    main()
