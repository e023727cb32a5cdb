"""One rank of test_torch.py's DCP tests.

    python3 torch_dcp_rank.py MODE RANK WORLD PORT SERVER CHECKPOINT OUT

MODE: save (writes the model's state to CHECKPOINT, and rank 0 a torch.save of it to OUT for
comparison), load (loads CHECKPOINT into a model of other weights and writes "equal" or
"different" against OUT to OUT.result), crash (saves, and SIGKILLs itself as its second object
is being stored), load-absent (writes "refused" to OUT if loading CHECKPOINT fails).
"""

import os
import signal
import sys

import torch
import torch.distributed
import torch.distributed.checkpoint as dcp

import hydrant.fs
from hydrant.torch.dcp import StorageReader, StorageWriter


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))


def main():
    mode, rank, world, port, server, checkpoint, out = sys.argv[1:8]
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=int(world)
    )
    if mode in ("save", "crash"):
        state = {"model": model(0).state_dict(), "step": torch.tensor(1200)}
        if mode == "crash":
            stored = [0]
            upload = hydrant.fs.HydrantFile._upload_chunk

            def dying(self, final=False):
                if final:
                    stored[0] += 1
                    if stored[0] == 2:
                        os.kill(os.getpid(), signal.SIGKILL)
                return upload(self, final)

            hydrant.fs.HydrantFile._upload_chunk = dying
        dcp.save(state, storage_writer=StorageWriter(checkpoint, servers=server))
        if int(rank) == 0:
            torch.save(state, out)
    elif mode == "load":
        state = {"model": model(1).state_dict(), "step": torch.tensor(0)}
        dcp.load(state, storage_reader=StorageReader(checkpoint, servers=server))
        expected = torch.load(out)
        equal = int(state["step"]) == int(expected["step"]) and all(
            torch.equal(state["model"][name], tensor) for name, tensor in expected["model"].items()
        )
        with open(f"{out}.result-{rank}", "w") as file:
            file.write("equal" if equal else "different")
    elif mode == "load-absent":
        state = {"model": model(1).state_dict(), "step": torch.tensor(0)}
        try:
            dcp.load(state, storage_reader=StorageReader(checkpoint, servers=server))
            outcome = "loaded"
        except BaseException:  # DCP's CheckpointException is not an Exception
            outcome = "refused"
        with open(out, "w") as file:
            file.write(outcome)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
