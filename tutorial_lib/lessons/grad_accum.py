"""Gradient accumulation under DDP: no_sync() vs an all-reduce on every micro-batch, counted.

Run card
    python grad_accum.py --grad-accum-steps 1 --batch-size 64             # one process, the whole batch at once
    torchrun --nproc-per-node 2 grad_accum.py --grad-accum-steps 4 --batch-size 8
    torchrun --nproc-per-node 2 grad_accum.py --grad-accum-steps 4 --batch-size 8 \
        --accumulation every_micro_step                                     # the seeds' loop

One optimizer step consumes a global batch of grad_accum_steps * world_size * batch_size samples (batch_size:
per rank per micro-batch): on every micro-step each rank takes its own slice. Each micro-batch loss is divided
by grad_accum_steps, so the accumulated gradient is the gradient of the *mean* loss over the global batch, the
same as one process computing the whole batch at once (and DDP averages over ranks on top).

During backward DDP all-reduces every gradient bucket. Inside ``model.no_sync()`` it only
accumulates locally, so with no_sync on the first K-1 micro-batches there is one round of
all-reduces per optimizer step instead of K. A DDP communication hook counts the bucket
all-reduces actually issued. Writes per-step lines to ``<metrics-dir>/rank<RANK>.jsonl`` and the
final parameters to ``<metrics-dir>/params_rank<RANK>.pt``. Only torch and the standard library.
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
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-steps", type=int, default=3, help="optimizer steps (count)")
    p.add_argument("--grad-accum-steps", type=int, default=4, help="micro-batches per optimizer step (count)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per rank per micro-batch (count)")
    p.add_argument("--accumulation", choices=["no_sync", "every_micro_step"], default="no_sync",
                   help="no_sync: all-reduce only on the last micro-batch; every_micro_step: the seeds' loop")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (unitless)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0, help="collective timeout (seconds)")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for rank<RANK>.jsonl and params")
    args = p.parse_args(argv)
    for name in ("max_steps", "grad_accum_steps", "batch_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    return args


def setup(args):
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): "
                 "use --device cpu, or a machine with a GPU and a CUDA build of torch")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")  # LOCAL_RANK, not RANK
    if use_cuda:
        torch.cuda.set_device(device)
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=args.pg_timeout_s),
                                device_id=device if use_cuda else None)
    return device


class AllReduceCounter:
    """DDP communication hook state: counts the bucket all-reduces DDP issues, then does them."""

    def __init__(self):
        self.calls = 0


def counting_allreduce_hook(counter, bucket):
    counter.calls += 1
    return default_hooks.allreduce_hook(None, bucket)  # None: the default process group; averages


def global_batch(step, args, world_size):
    """The samples of one optimizer step: (grad_accum_steps * world_size * batch_size) rows, same on every rank."""
    g = torch.Generator().manual_seed(args.seed * 100_003 + step)
    n = args.grad_accum_steps * world_size * args.batch_size
    x = torch.randn(n, 32, generator=g)
    y = x[:, :4].sin() + 0.1 * torch.randn(n, 4, generator=g)
    return x, y


@record
def main():
    args = parse_args()
    device = setup(args)
    try:
        train(args, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def train(args, device):
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4)).to(device)
    counter = AllReduceCounter()
    if dist.is_initialized():
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        model.register_comm_hook(counter, counting_allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
    log = open(Path(args.metrics_dir) / f"rank{rank}.jsonl", "a", buffering=1)
    mb = args.batch_size
    for step in range(1, args.max_steps + 1):
        t0 = time.perf_counter()
        x, y = global_batch(step, args, world_size)
        calls_before = counter.calls
        loss_sum = 0.0
        for k in range(args.grad_accum_steps):
            rows = slice((k * world_size + rank) * mb, (k * world_size + rank + 1) * mb)  # this rank's slice
            last = k == args.grad_accum_steps - 1
            # Skip the gradient all-reduce on all but the last micro-batch: gradients accumulate locally.
            sync_off = args.accumulation == "no_sync" and not last and isinstance(model, DDP)
            with model.no_sync() if sync_off else contextlib.nullcontext():
                loss = loss_fn(model(x[rows].to(device)), y[rows].to(device)) / args.grad_accum_steps
                loss.backward()
            loss_sum += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        log.write(json.dumps({
            "step": step, "max_steps": args.max_steps, "rank": rank, "world_size": world_size,
            "accumulation": args.accumulation, "grad_accum_steps": args.grad_accum_steps,
            "loss_local": loss_sum, "all_reduce_calls": counter.calls - calls_before,
            "step_time_s": time.perf_counter() - t0,
            "samples_per_s": args.grad_accum_steps * mb / (time.perf_counter() - t0),
        }) + "\n")
    log.close()
    inner = model.module if isinstance(model, DDP) else model
    torch.save({k: v.detach().cpu() for k, v in inner.state_dict().items()},
               Path(args.metrics_dir) / f"params_rank{rank}.pt")
    if isinstance(model, DDP):
        sys.stdout.write(f"{args.accumulation}: {counter.calls} bucket all-reduces in {args.max_steps} "
                         "optimizer steps\n")
    else:  # one process: a plain model, nothing to all-reduce
        sys.stdout.write(f"one process, no DDP: {args.max_steps} optimizer steps, no all-reduce\n")
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
