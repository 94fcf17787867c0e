"""A parameter that gets no gradient breaks DDP; two fixes, and what the flag fix costs.

Run card
    python unused_params.py --loss-uses a                                                # one process: fails too
    torchrun --nproc-per-node 2 unused_params.py --loss-uses a                          # fails on step 2
    torchrun --nproc-per-node 2 unused_params.py --loss-uses a --find-unused-parameters  # fix 1 (costs time)
    torchrun --nproc-per-node 2 unused_params.py --loss-uses both                        # fix 2: use every output

The model has a shared trunk and two heads; with ``--loss-uses a`` its forward skips head ``b``, as a
conditionally used branch would. DDP waits during backward for a gradient of *every* parameter before
it all-reduces a bucket, so head ``b``'s parameters keep their bucket from ever completing, and the
next forward raises "Expected to have finished reduction in the prior iteration before starting a new
one". ``find_unused_parameters=True`` makes DDP walk the autograd graph from the outputs after every
forward to mark parameters that will get no gradient (extra work every step); using every module in
the loss (or not creating the unused one) needs no flag. The flag also costs an all_reduce per step: DDP
all-reduces a map of the parameters each rank used, so that a parameter unused on one rank but used on
another is handled right (notebook 01 counts them from what each rank issued, seen by the workbook's observer).
Writes ``<metrics-dir>/rank<RANK>.jsonl``. Only torch and the standard library.
"""

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-steps", type=int, default=30, help="optimizer steps (count)")
    p.add_argument("--loss-uses", choices=["a", "both"], default="a",
                   help="a: the forward skips head b (the mistake); both: both heads feed the loss")
    p.add_argument("--find-unused-parameters", action="store_true", help="DDP(find_unused_parameters=True)")
    p.add_argument("--hidden-dim", type=int, default=256, help="width of trunk and heads (count)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0, help="collective timeout (seconds)")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl on cuda, gloo on cpu (gloo also moves cuda tensors: "
                        "tl.run_in_process uses it so no NCCL runs inside a notebook's kernel)")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for rank<RANK>.jsonl")
    args = p.parse_args(argv)
    if args.max_steps <= 0 or args.hidden_dim <= 0:
        p.error(f"--max-steps and --hidden-dim must be > 0, got {args.max_steps}, {args.hidden_dim}")
    return args


class TwoHeads(nn.Module):
    def __init__(self, hidden, use_b):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head_a = nn.Linear(hidden, 1)
        self.head_b = nn.Linear(hidden, 1)
        self.use_b = use_b

    def forward(self, x):
        h = self.trunk(x)
        # head_b exists (and is registered with DDP) but is skipped: its parameters get no gradient.
        return self.head_a(h), (self.head_b(h) if self.use_b else None)


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
    model = DDP(TwoHeads(args.hidden_dim, use_b=args.loss_uses == "both").to(device), device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=args.find_unused_parameters)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
    log = open(Path(args.metrics_dir) / f"rank{rank}.jsonl", "a", buffering=1)
    g = torch.Generator().manual_seed(rank)
    for step in range(1, args.max_steps + 1):
        t0 = time.perf_counter()
        x = torch.randn(64, 32, generator=g).to(device)
        a, b = model(x)
        loss = (a - 1).pow(2).mean()
        if b is not None:
            loss = loss + (b + 1).pow(2).mean()  # every module feeds the loss: every parameter gets a gradient
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        record = {"step": step, "max_steps": args.max_steps, "rank": rank,
                  "world_size": dist.get_world_size(), "loss_local": loss.item(),
                  "step_time_s": time.perf_counter() - t0}
        log.write(json.dumps(record) + "\n")
    log.close()
    sys.stdout.write(f"rank {rank}: {args.max_steps} steps done\n")
    dist.barrier()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
