"""Data parallelism by hand (all_reduce of every gradient, then of the loss), with one rank skipping a collective
or calling two in the wrong order.

Run card
    python collective_mismatch.py --max-steps 5                     # one process: nothing to mismatch
    torchrun --nproc-per-node 2 collective_mismatch.py --fail-rank 1 --fail-step 3 --pg-timeout-s 5
    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --nproc-per-node 2 collective_mismatch.py --fail-rank 1 --fail-step 3
    torchrun --nproc-per-node 2 collective_mismatch.py --fail-mode reorder --fail-rank 1 --fail-step 3

What it shows
    * every collective is a rendezvous: all ranks must call the same collectives, in the same order, with
      tensors of the same size; the n-th collective of one rank is matched with the n-th of the others;
    * when rank ``--fail-rank`` skips the loss all_reduce of step ``--fail-step``, its next collective (the
      first gradient of the next step, 4096 floats) meets the peers' loss all_reduce (1 float): gloo notices
      the size difference and aborts the process ("Received data size doesn't match expected size");
    * with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` torch wraps the process group and compares every collective's
      fingerprint (op, shape, dtype) across ranks *before* running it, and raises a Python error that names
      both ranks' calls ("Detected mismatch between collectives on ranks");
    * with ``--fail-mode reorder`` that rank all-reduces two gradients of the same size (the first layer's bias
      and the second layer's weight, 64 floats each) in swapped order at ``--fail-step``: no size differs, so
      nothing fails, and each of those all-reduces sums one rank's bias with another rank's weight. Every
      rank saves its gradients before and after that step's all-reduces to ``<metrics-dir>/grads_rank<RANK>.pt``.
    The gradients are averaged by hand (what DDP does in buckets during backward) because DDP's constructor
    crashes (SIGSEGV) under TORCH_DISTRIBUTED_DEBUG=DETAIL with gloo in torch 2.8 and 2.13 (notebook 07 says so,
    tests/integration/test_troubleshooting.py launches it).

Each rank appends one JSON line per step to ``<metrics-dir>/rank<RANK>.jsonl``.
Only torch and the Python standard library are used.
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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-steps", type=int, default=5, help="optimizer steps to run (count)")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step (count)")
    p.add_argument("--dim", type=int, default=64, help="features per sample and hidden width (count)")
    p.add_argument("--fail-rank", type=int, default=-1,
                   help="global rank that skips a collective, as ddp_train.py --fail-mode skip-collective (-1: none)")
    p.add_argument("--fail-step", type=int, default=3, help="step at which that rank misbehaves (count)")
    p.add_argument("--fail-mode", choices=["skip-collective", "reorder"], default="skip-collective",
                   help="skip-collective: that rank skips the loss all_reduce of that step; reorder: it all-reduces "
                        "two same-size gradients in swapped order (no error, wrong sums)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and the synthetic data")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for rank<RANK>.jsonl")
    p.add_argument("--pg-timeout-s", type=float, default=60.0, help="collective timeout of the process group (s)")
    args = p.parse_args(argv)
    for name in ("max_steps", "batch_size", "dim", "fail_step"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.pg_timeout_s <= 0:
        p.error(f"--pg-timeout-s must be > 0, got {args.pg_timeout_s}")
    if args.fail_rank >= 0 and args.fail_step >= args.max_steps:
        p.error(f"--fail-step must be < --max-steps ({args.max_steps}) so a later collective meets the skipped "
                f"one, got {args.fail_step}")
    return args


def setup(args):
    """Join the process group when launched by torchrun (gloo: this lesson runs on CPU); return (rank, world)."""
    if "RANK" in os.environ:  # torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT
        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=args.pg_timeout_s))
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def cleanup():
    if dist.is_initialized():
        dist.destroy_process_group()


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    rank, world_size = setup(args)
    try:
        train(args, rank, world_size)
    finally:
        cleanup()


def train(args, rank, world_size):
    torch.manual_seed(args.seed)  # the same initial weights on every rank (no DDP broadcast here)
    model = nn.Sequential(nn.Linear(args.dim, args.dim), nn.ReLU(), nn.Linear(args.dim, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    metrics_dir = Path(args.metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    with open(metrics_dir / f"rank{rank}.jsonl", "a", buffering=1) as metrics_file:
        for step in range(1, args.max_steps + 1):
            t0 = time.perf_counter()
            g = torch.Generator().manual_seed(args.seed * 100_003 + step * world_size + rank)  # own data per rank
            x = torch.randn(args.batch_size, args.dim, generator=g)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            params = dict(model.named_parameters())
            order = list(params)  # 0.weight [64, 64], 0.bias [64], 2.weight [1, 64], 2.bias [1]
            swap = args.fail_mode == "reorder" and rank == args.fail_rank and step == args.fail_step
            if swap:  # the mistake, e.g. iterating a set or a dict built differently on one rank
                order[1], order[2] = order[2], order[1]  # 0.bias and 2.weight: 64 floats each, gloo sees no difference
            saves = args.fail_mode == "reorder" and step == args.fail_step  # every rank keeps this step's gradients
            before = {name: p.grad.clone() for name, p in params.items()} if saves else None
            if dist.is_initialized():
                for name in order:  # what DDP does during backward, one tensor at a time
                    dist.all_reduce(params[name].grad, op=dist.ReduceOp.SUM)
                    params[name].grad /= world_size
            if saves:
                after = {name: p.grad.clone() for name, p in params.items()}
                torch.save({"before": before, "after": after, "order": order}, metrics_dir / f"grads_rank{rank}.pt")
            optimizer.step()
            loss_global = loss.detach().clone()
            skip = args.fail_mode == "skip-collective" and rank == args.fail_rank and step == args.fail_step
            if dist.is_initialized() and not skip:  # skip: the mistake, e.g. a collective under `if rank == 0`
                dist.all_reduce(loss_global, op=dist.ReduceOp.SUM)
                loss_global /= world_size
            if skip:
                sys.stdout.write(f"rank {rank}: skipping the loss all_reduce of step {step} (--fail-rank)\n")
            metrics_file.write(json.dumps({
                "step": step, "max_steps": args.max_steps, "rank": rank, "world_size": world_size,
                "loss_local": loss.item(), "loss_global": loss_global.item(),
                "step_time_s": time.perf_counter() - t0, "skipped_collective": skip,
            }) + "\n")
    if dist.is_initialized():
        dist.barrier()  # nobody tears the process group down while a peer still uses it
    sys.stdout.write(f"rank {rank}: {args.max_steps} steps done\n")


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
