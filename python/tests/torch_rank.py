"""One rank of test_torch.py's two-rank job: reads a ShardDataset through a DataLoader with two
workers for two epochs and writes what it read, in order, as JSON.

    python3 torch_rank.py RANK WORLD PORT SERVER PREFIX OUT
"""

import json
import sys

import torch.distributed
import torch.utils.data

import hydrant
import hydrant.torch


def main():
    rank, world, port, server, prefix, out = sys.argv[1:7]
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=int(world)
    )
    dataset = hydrant.torch.ShardDataset(
        prefix, client=hydrant.Client(server), seed=7, transform=lambda path, data: (path, len(data))
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    epochs = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        epochs.append([path for path, _ in loader])
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    with open(out, "w") as file:
        json.dump(epochs, file)


if __name__ == "__main__":
    main()
