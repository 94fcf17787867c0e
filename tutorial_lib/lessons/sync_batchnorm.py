"""SyncBatchNorm: batch statistics over the *global* batch instead of each rank's slice (CUDA only).

Run card
    torchrun --nproc-per-node 2 sync_batchnorm.py                       # on 2 GPUs (nccl)
    python sync_batchnorm.py                                            # one GPU, world of one
    torchrun --nproc-per-node 2 sync_batchnorm.py --batchnorm plain     # plain BatchNorm under DDP, CPU too

Plain BatchNorm under DDP normalises with each rank's own mean and variance, so a small per-rank
batch gives noisy statistics. Its running statistics (buffers) do not drift apart: by default DDP
copies rank 0's buffers to every rank at the start of each forward (``broadcast_buffers=True``; torch
2.13 names it ``forward_sync_buffers`` and warns on the old name); switched off, they drift apart.
``nn.SyncBatchNorm`` all-reduces the statistics so every
rank normalises with those of the global batch. It runs only on GPUs (CUDA, XPU, ...): on CPU its
forward raises ``ValueError: SyncBatchNorm expected input tensor to be on GPU``.
The script checks that after one forward every rank's running mean equals that of one BatchNorm on
the concatenated global batch, and writes ``<metrics-dir>/syncbn_rank<RANK>.json``.
``--batchnorm plain`` (any device) trains plain BatchNorm under DDP for ``--steps`` steps, with that
buffer sync on and off, and writes per step the batch mean each rank normalised with
and the running mean its BatchNorm held as its forward began: ``<metrics-dir>/batchnorm_rank<RANK>.json``.
Only torch and the standard library are used.
"""

import argparse
import inspect
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank (count)")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for syncbn_rank<RANK>.json")
    p.add_argument("--batchnorm", choices=["sync", "plain"], default="sync",
                   help="sync: SyncBatchNorm (GPUs only); plain: nn.BatchNorm1d under DDP (any device), "
                        "writes batchnorm_rank<RANK>.json")
    p.add_argument("--steps", type=int, default=3, help="training steps of --batchnorm plain (count)")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl (this script runs on GPUs only; gloo also moves cuda "
                        "tensors: tl.run_in_process uses it so no NCCL runs inside a notebook's kernel)")
    args = p.parse_args(argv)
    if args.batch_size <= 1:
        p.error(f"--batch-size must be > 1 (BatchNorm needs a variance), got {args.batch_size}")
    if args.steps <= 0:
        p.error(f"--steps must be > 0, got {args.steps}")
    return args


@record
def main():
    args = parse_args()
    if args.batchnorm == "plain":
        return plain_batchnorm(args)
    if not torch.cuda.is_available():
        raise SystemExit("sync_batchnorm.py needs CUDA GPUs: SyncBatchNorm does not run on CPU")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank)  # LOCAL_RANK picks this node's GPU
    torch.cuda.set_device(device)
    backend = "nccl" if args.backend == "auto" else args.backend
    device_id = device if backend == "nccl" else None
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timedelta(seconds=60), device_id=device_id)
    else:
        dist.init_process_group(backend, init_method="tcp://127.0.0.1:29511", rank=0, world_size=1,
                                timeout=timedelta(seconds=60), device_id=device_id)
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(world_size * args.batch_size, 8, generator=g) * 3 + 1  # the global batch, on every rank
        mine = x[rank * args.batch_size:(rank + 1) * args.batch_size].to(device)
        bn = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(8))).to(device)
        bn.train()(mine)
        reference = nn.BatchNorm1d(8).train()
        reference(x)  # one BatchNorm over the whole global batch, on CPU
        running_mean = bn[0].running_mean.cpu()
        max_diff = (running_mean - reference.running_mean).abs().max().item()
        local = nn.BatchNorm1d(8).train()
        local(mine.cpu())  # what plain BatchNorm would have seen on this rank
        out = {"rank": rank, "world_size": world_size, "max_abs_diff_vs_global": max_diff,
               "max_abs_diff_local_vs_global": (local.running_mean - reference.running_mean).abs().max().item()}
        Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.metrics_dir) / f"syncbn_rank{rank}.json").write_text(json.dumps(out))
        sys.stdout.write(f"rank {rank}: SyncBatchNorm running_mean vs global batch: max |diff| {max_diff:.2e}\n")
        if max_diff > 1e-5:
            raise AssertionError(f"SyncBatchNorm statistics differ from the global batch's by {max_diff}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def plain_batchnorm(args):
    """nn.BatchNorm1d under DDP, with its buffer sync on and off: per step, each rank's batch mean (what it
    normalises with) and the running mean its BatchNorm held as its forward began (after DDP's broadcast)."""
    ddp_args = inspect.signature(nn.parallel.DistributedDataParallel).parameters
    sync_keyword = "forward_sync_buffers" if "forward_sync_buffers" in ddp_args else "broadcast_buffers"  # torch 2.8
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = ("nccl" if use_cuda else "gloo") if args.backend == "auto" else args.backend
    device_id = device if backend == "nccl" else None
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timedelta(seconds=60), device_id=device_id)
    else:
        dist.init_process_group(backend, init_method="tcp://127.0.0.1:29512", rank=0, world_size=1,
                                timeout=timedelta(seconds=60), device_id=device_id)
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        out = {"rank": rank, "world_size": world_size, "sync_keyword": sync_keyword}
        for sync in (True, False):
            torch.manual_seed(0)
            model = nn.Sequential(nn.BatchNorm1d(8), nn.Linear(8, 1)).to(device)
            ddp = nn.parallel.DistributedDataParallel(model, **{sync_keyword: sync},
                                                      device_ids=[device.index] if use_cuda else None)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
            seen = {"batch_mean": [], "running_mean_at_forward": []}
            def record_entry(module, inputs):  # runs inside DDP's forward, after its buffer broadcast
                seen["batch_mean"].append(inputs[0].mean(0).tolist())
                seen["running_mean_at_forward"].append(module.running_mean.tolist())
            model[0].register_forward_pre_hook(record_entry)
            g = torch.Generator().manual_seed(1)
            for _ in range(args.steps):
                x = torch.randn(world_size * args.batch_size, 8, generator=g) * 3 + 1  # the global batch
                mine = x[rank * args.batch_size:(rank + 1) * args.batch_size].to(device)
                ddp(mine).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            out[f"sync_buffers={sync}"] = {**seen, "running_mean_after": model[0].running_mean.tolist()}
        Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.metrics_dir) / f"batchnorm_rank{rank}.json").write_text(json.dumps(out))
        sys.stdout.write(f"rank {rank}: plain BatchNorm, {args.steps} steps with {sync_keyword} True and False\n")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
