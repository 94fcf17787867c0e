"""Uneven inputs under DDP: a rank with more batches hangs the others, unless training runs inside Join.

Run card
    python uneven_inputs.py                                               # one process: nothing is uneven
    torchrun --nproc-per-node 2 uneven_inputs.py --pg-timeout-s 5          # rank 1 has 2 extra batches: hangs
    torchrun --nproc-per-node 2 uneven_inputs.py --join                    # the fix: torch.distributed.algorithms.Join

Every DDP backward is a collective: all ranks must run the same number of them. Here rank
``--extra-rank`` gets ``--extra-batches`` more batches than the others. Without Join, the ranks that
finished go on to the next collective (the final barrier) while the busy rank waits in its
backward's all-reduce for partners that never come: both sides block until the process-group
timeout, then fail. Inside ``Join([model])`` a rank that runs out of data "shadows" the collectives
of the ranks still training (all-reducing zeros), so everyone finishes. See
https://pytorch.org/tutorials/advanced/generic_join.html. Only torch and the standard library.
"""

import argparse
import contextlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=4, help="batches on every rank (count)")
    p.add_argument("--extra-rank", type=int, default=1, help="the rank that gets extra batches")
    p.add_argument("--extra-batches", type=int, default=2, help="how many extra batches it gets (count)")
    p.add_argument("--join", action="store_true", help="train inside Join([model]) (the fix)")
    p.add_argument("--pg-timeout-s", type=float, default=5.0,
                   help="collective timeout (seconds): how long a hang lasts before it becomes an error")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl on cuda, gloo on cpu (gloo also moves cuda tensors: "
                        "tl.run_in_process uses it so no NCCL runs inside a notebook's kernel)")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for rank<RANK>.jsonl")
    args = p.parse_args(argv)
    if args.batches <= 0 or args.extra_batches < 0 or args.pg_timeout_s <= 0:
        p.error(f"need --batches > 0, --extra-batches >= 0, --pg-timeout-s > 0; got {args.batches}, "
                f"{args.extra_batches}, {args.pg_timeout_s}")
    return args


@record
def main():
    args = parse_args()
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): "
                 "use --device cpu, or a machine with a GPU and a CUDA build of torch")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = ("nccl" if use_cuda else "gloo") if args.backend == "auto" else args.backend
    timeout, device_id = timedelta(seconds=args.pg_timeout_s), device if backend == "nccl" else None
    if "RANK" in os.environ:  # launched by torchrun
        dist.init_process_group(backend, timeout=timeout, device_id=device_id)
    else:  # plain `python`: a world of one, so the same code runs
        store = dist.HashStore()  # in memory: a world of one needs no rendezvous (nor a folder in /tmp)
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout, device_id=device_id)
    try:
        train(args, device)
    finally:
        dist.destroy_process_group()


def train(args, device):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(16, 1).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n_batches = args.batches + (args.extra_batches if rank == args.extra_rank else 0)
    Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
    log = open(Path(args.metrics_dir) / f"rank{rank}.jsonl", "a", buffering=1)
    g = torch.Generator().manual_seed(rank)
    with Join([model]) if args.join else contextlib.nullcontext():
        for step in range(1, n_batches + 1):
            t0 = time.perf_counter()
            x = torch.randn(8, 16, generator=g).to(device)
            loss = model(x).pow(2).mean()
            loss.backward()  # a collective: blocks until every rank (or Join's shadow) joins it
            optimizer.step()
            optimizer.zero_grad()
            log.write(json.dumps({"step": step, "max_steps": n_batches, "rank": rank,
                                  "world_size": dist.get_world_size(), "loss_local": loss.item(),
                                  "step_time_s": time.perf_counter() - t0}) + "\n")
    log.close()
    sys.stdout.write(f"rank {rank}: trained on {n_batches} batches, waiting for the others\n")
    sys.stdout.flush()
    dist.barrier()  # without Join, the ranks that finished early wait here, the busy rank in its all-reduce
    sys.stdout.write(f"rank {rank}: all ranks finished\n")


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
