"""Which samples does each rank get? DistributedSampler over two epochs, with and without set_epoch.

Run card
    python sampler_demo.py --dataset-size 11                     # one process: it gets every index
    torchrun --nproc-per-node 2 sampler_demo.py --dataset-size 11

For every epoch each rank records the indices its DistributedSampler yields, with the default
padding (``drop_last=False``: the index list is extended by repeating its first indices until it
divides evenly, so some samples are seen twice per epoch) and with ``drop_last=True`` (the tail is
dropped, so some samples are not seen in that epoch). It does so for two loops: the right one,
which calls ``sampler.set_epoch(epoch)`` before each epoch (the shuffle is reseeded with
seed + epoch), and the mistake, which never calls it (every epoch repeats the first epoch's order).
Writes ``<metrics-dir>/sampler_rank<RANK>.json``: ``{"rank", "world_size", "dataset_size",
"set_epoch": {"padded", "drop_last"}, "no_set_epoch": {"padded", "drop_last"}}``, each leaf
``{"num_samples", "total_size", "epochs": [[index, ...] per epoch]}``. Only torch and the standard
library are used.
"""

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset-size", type=int, default=11, help="samples in the dataset (count)")
    p.add_argument("--epochs", type=int, default=2, help="epochs to record (count)")
    p.add_argument("--batch-size", type=int, default=2, help="DataLoader batch size per rank (samples)")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed, the same on every rank")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for sampler_rank<RANK>.json")
    args = p.parse_args(argv)
    for name in ("dataset_size", "epochs", "batch_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    return args


class IndexDataset(Dataset):
    """Sample i is just the number i, so what a rank receives shows which samples it got."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return i


def epoch_indices(dataset, args, rank, world_size, drop_last, set_epoch):
    # rank/num_replicas default to the process group's; passed explicitly here for clarity.
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=drop_last)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    epochs = []
    for epoch in range(args.epochs):
        if set_epoch:  # the right loop; the mistake leaves this out
            sampler.set_epoch(epoch)  # reshuffle: the permutation is seeded with seed + epoch
        epochs.append([int(i) for batch in loader for i in batch])
    return {"num_samples": len(sampler), "total_size": sampler.total_size, "epochs": epochs}


@record
def main():
    args = parse_args()
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # no tensors move: gloo everywhere
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    try:
        dataset = IndexDataset(args.dataset_size)
        out = {"rank": rank, "world_size": world_size, "dataset_size": args.dataset_size}
        for loop, set_epoch in (("set_epoch", True), ("no_set_epoch", False)):
            out[loop] = {variant: epoch_indices(dataset, args, rank, world_size, drop_last, set_epoch)
                         for variant, drop_last in (("padded", False), ("drop_last", True))}
        Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.metrics_dir) / f"sampler_rank{rank}.json").write_text(json.dumps(out))
        for loop, label in (("set_epoch", "with set_epoch"), ("no_set_epoch", "without set_epoch (the mistake)")):
            for epoch, indices in enumerate(out[loop]["padded"]["epochs"]):
                sys.stdout.write(f"{label}, epoch {epoch}: indices {indices}\n")
        if distributed:
            dist.barrier()
    finally:
        if distributed:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
