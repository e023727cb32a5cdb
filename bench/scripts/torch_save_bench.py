"""Time ``torch.save`` of a state dict of STATE_MIB until it returns, into hydrant or a local file.

    python3 torch_save_bench.py hydrant HOST:PORT BUCKET/KEY STATE_MIB [- SAVES]
    python3 torch_save_bench.py hydrant-local HOST:PORT BUCKET/KEY STATE_MIB SOCKET [SAVES]
    python3 torch_save_bench.py file - PATH STATE_MIB [- SAVES]

`hydrant`: hydrant.torch.save (returns once the object is durable on the node's NVMe).
`hydrant-local`: the same through the server's same-host socket SOCKET.
`file`: torch.save into a local file, then os.fsync (durable on the local disk). The state
dict is 64 tensors of float32 (random), saved SAVES times (2 by default) by one process
(hydrant: as TARGET.0, TARGET.1, ...). Prints `first_seconds=S seconds=S bytes=B`: the first
save's time and the last's.
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
    # Two saves, as a training job saves again and again: the first pays what a process sets
    # up once (connections, and for the same-host socket its region's memory).
    saves = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    times = []
    for save in range(saves):
        started = time.monotonic()
        if mode in ("hydrant", "hydrant-local"):
            import hydrant
            import hydrant.torch

            if save == 0:
                local = {}
                if mode == "hydrant-local":
                    local = {"local_socket": sys.argv[5]}
                client = hydrant.Client(endpoint, **local)
            hydrant.torch.save(state, f"{target}.{save}", client=client)
            size = client.stat(f"{target}.{save}").size
        elif mode == "file":
            with open(target, "wb") as file:
                torch.save(state, file)
                file.flush()
                os.fsync(file.fileno())
            size = os.path.getsize(target)
        else:
            sys.exit(f"unknown mode {mode}")
        times.append(time.monotonic() - started)
    print(f"first_seconds={times[0]:.3f} seconds={times[-1]:.3f} bytes={size}")


if __name__ == "__main__":
    main()
