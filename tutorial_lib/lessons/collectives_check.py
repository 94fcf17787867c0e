"""Check that every rank can talk to every other: all_reduce, all_gather, broadcast, and bandwidth.

Run card
    python collectives_check.py                          # one process (a world of size 1)
    torchrun --nproc-per-node 2 collectives_check.py     # 2 ranks (gloo on CPU, nccl on CUDA)

Each rank contributes its own rank, checks the result of every collective, measures
all_reduce bandwidth for a few message sizes, and writes ``<metrics-dir>/collectives_rank<RANK>.json``.
It exits with an error on the first rank whose result is wrong.

Bandwidth follows nccl-tests' definitions (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
algbw = size / time; busbw = algbw * 2 * (n - 1) / n for all_reduce, which is comparable across world sizes.
Only torch and the Python standard library are used.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--metrics-dir", type=str, default="metrics",
                   help="folder for collectives_rank<RANK>.json (created if missing)")
    p.add_argument("--sizes-bytes", type=int, nargs="+", default=[4096, 65536, 1 << 20, 8 << 20],
                   help="all_reduce message sizes to time (bytes, float32 elements)")
    p.add_argument("--iters", type=int, default=5, help="timed repetitions per size (count)")
    p.add_argument("--warmup-iters", type=int, default=2, help="untimed repetitions per size (count)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0, help="collective timeout (seconds)")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl on cuda, gloo on cpu (gloo also moves cuda tensors: "
                        "tl.run_in_process uses it so no NCCL runs inside a notebook's kernel)")
    p.add_argument("--device-from", choices=["local_rank", "rank"], default="local_rank",
                   help="which variable picks the GPU: local_rank (right) or rank (the seed's mistake: on "
                        "node 1 of a 2-GPU-per-node job RANK is 2 or 3, and cuda:2 does not exist there)")
    args = p.parse_args(argv)
    if args.iters <= 0 or args.warmup_iters < 0:
        p.error(f"--iters must be > 0 and --warmup-iters >= 0, got {args.iters} and {args.warmup_iters}")
    if any(s < 4 for s in args.sizes_bytes):
        p.error(f"every --sizes-bytes must be >= 4 (one float32), got {args.sizes_bytes}")
    return args


def setup(args):
    """Join the process group; outside torchrun, make a world of one so the same code runs."""
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): "
                 "use --device cpu, or a machine with a GPU and a CUDA build of torch")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    # LOCAL_RANK picks the GPU on this node; RANK is unique across all nodes.
    index = local_rank if args.device_from == "local_rank" else int(os.environ.get("RANK", 0))
    device = torch.device("cuda", index) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = ("nccl" if use_cuda else "gloo") if args.backend == "auto" else args.backend
    timeout = timedelta(seconds=args.pg_timeout_s)
    # device_id binds the group to this rank's GPU (nccl then needs no guess for barrier()).
    device_id = device if backend == "nccl" else None
    if "RANK" in os.environ:  # launched by torchrun: it set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        dist.init_process_group(backend=backend, timeout=timeout, device_id=device_id)
    else:
        store = dist.HashStore()  # in memory: a world of one needs no rendezvous (nor a folder in /tmp)
        dist.init_process_group(backend=backend, store=store, rank=0, world_size=1, timeout=timeout,
                                device_id=device_id)
    return device, backend, index


def check(name, expected, got):
    return {"name": name, "expected": expected, "got": got, "ok": expected == got}


def run_checks(device):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    results = []

    t = torch.tensor([rank + 1], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)  # every rank ends with 1 + 2 + ... + world_size
    results.append(check("all_reduce_sum", world_size * (world_size + 1) // 2, int(t.item())))

    gathered = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(gathered, torch.tensor([rank], dtype=torch.int64, device=device))
    results.append(check("all_gather", list(range(world_size)), [int(g.item()) for g in gathered]))

    b = torch.tensor([1000 + rank], dtype=torch.int64, device=device)
    dist.broadcast(b, src=0)  # everybody receives rank 0's value
    results.append(check("broadcast_from_0", 1000, int(b.item())))
    return results


def time_all_reduce(device, sizes_bytes, iters, warmup_iters):
    world_size = dist.get_world_size()
    rows = []
    for size_bytes in sizes_bytes:
        x = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
        times = []
        for i in range(warmup_iters + iters):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            dist.all_reduce(x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= warmup_iters:
                times.append(time.perf_counter() - t0)
        time_s = statistics.median(times)
        algbw = x.numel() * 4 / time_s
        rows.append({
            "size_bytes": x.numel() * 4, "time_s": time_s,
            "algbw_GBps": algbw / 1e9,  # GB = 1e9 bytes, as nccl-tests
            "busbw_GBps": algbw * 2 * (world_size - 1) / world_size / 1e9,
        })
    return rows


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    device, backend, gpu_index = setup(args)
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                               "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")}
        sys.stdout.write(f"RANK={env['RANK']} LOCAL_RANK={env['LOCAL_RANK']} WORLD_SIZE={env['WORLD_SIZE']} "
                         f"backend={backend} device={device} host={socket.gethostname()} pid={os.getpid()}\n")
        checks = run_checks(device)
        bandwidth = time_all_reduce(device, args.sizes_bytes, args.iters, args.warmup_iters)
        out = {"rank": rank, "world_size": world_size, "backend": backend, "device": str(device),
               "host": socket.gethostname(), "pid": os.getpid(), "env": env,
               "device_from": args.device_from, "gpu_index": gpu_index,
               "visible_gpus": torch.cuda.device_count(),
               "checks": checks, "bandwidth": bandwidth}
        Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.metrics_dir) / f"collectives_rank{rank}.json").write_text(json.dumps(out, indent=1))
        failed = [c for c in checks if not c["ok"]]
        if failed:
            raise AssertionError(f"rank {rank}: collectives returned wrong results: {failed}")
        sys.stdout.write(f"rank {rank}: {len(checks)} collectives correct\n")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
