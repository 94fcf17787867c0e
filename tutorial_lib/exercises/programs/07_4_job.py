"""Exercise 07.4: a job that fails; read its output and name the rank, the line and the cause.

Each rank trains a small linear model on its own shard of records and all-reduces its gradient every step; the job's
collectives time out after 3 s, so a hang becomes an error. A record holds a sample's features, and may name a cache
file the rank must wait for (another job writes it). Which shard holds a bad record, and what is wrong with it, follow
from the data seed (--seed).

    torchrun --nproc-per-node 2 07_4_job.py --seed 3
"""
import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def make_shard(seed, rank, steps):  # this rank's records, one per step, from the data seed
    g = torch.Generator().manual_seed(seed)
    bad_rank, bad_step, bad_kind = [int(v) for v in torch.randint(0, 1000, (3,), generator=g)]
    records = [{"features": torch.randn(8, 4, generator=g).tolist()} for _ in range(steps)]
    if rank == bad_rank % 2:
        step = 1 + bad_step % (steps - 1)
        records[step] = {} if bad_kind % 2 else {"features": records[0]["features"], "cache": "tokens.cache"}
    return records


def wait_for(path):  # until another job has written the cache file
    while not os.path.exists(path):
        time.sleep(0.05)


parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0, help="the data seed")
parser.add_argument("--steps", type=int, default=4, help="records per rank (count)")
args = parser.parse_args()
dist.init_process_group("gloo", timeout=timedelta(seconds=3))  # a hang becomes an error after 3 s
rank = dist.get_rank()
weight = torch.zeros(4, requires_grad=True)
for step, record in enumerate(make_shard(args.seed, rank, args.steps), start=1):
    x = torch.tensor(record["features"])
    if "cache" in record:
        wait_for(record["cache"])
    loss = (x @ weight - 1).pow(2).mean()
    loss.backward()
    dist.all_reduce(weight.grad)  # the ranks' gradients, summed
    with torch.no_grad():
        weight -= 0.1 * weight.grad / dist.get_world_size()
        weight.grad.zero_()
    print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
