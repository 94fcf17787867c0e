"""Model parallelism as in seed 000 section 4.3: the two halves of a model on two devices, activations moved between.

Run card
    python model_parallel.py --max-steps 5                        # one process; halves on cuda:0 and cuda:1 if present
    torchrun --nproc-per-node 1 model_parallel.py --max-steps 5   # the same, launched by torchrun
    torchrun --nproc-per-node 2 model_parallel.py                 # 4 GPUs: rank r on cuda:2r and cuda:2r+1
    torchrun --nproc-per-node 4 model_parallel.py                 # 4 GPUs: rank r on cuda:r alone (logical split)

What it shows
    * ``part1`` (Linear 1000 -> 2000) lives on one device and ``part2`` (Linear 2000 -> 1000) on another; the
      forward moves the activation between them with ``.to(device)`` and autograd moves the gradient back;
    * each device holds only its half's parameters, gradients and optimizer state;
    * one device idles while the other computes (no pipelining here): model parallelism buys memory, not speed;
    * with fewer than two GPUs per rank both halves share the rank's own GPU, and the script says so; no two
      ranks ever get the same GPU (NCCL refuses a group with two ranks on one device).
The split model's outputs are checked against the same weights on a single device. Writes
``<metrics-dir>/rank<RANK>.jsonl`` (one line per step) and ``<metrics-dir>/mp_rank<RANK>.json``.
Only torch and the Python standard library.
"""

import argparse
import copy
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
    p.add_argument("--max-steps", type=int, default=5, help="optimizer steps (count)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per step (count)")
    p.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate (unitless)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: CUDA when available, else cpu (both halves then on the CPU)")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for the metrics files (created)")
    p.add_argument("--pg-timeout-s", type=float, default=60.0, help="collective timeout (seconds)")
    args = p.parse_args(argv)
    for name in ("max_steps", "batch_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.pg_timeout_s <= 0:
        p.error(f"--pg-timeout-s must be > 0, got {args.pg_timeout_s}")
    return args


def pick_devices(local_rank, local_world_size, gpu_count):
    """The devices of one rank's two halves, chosen so that no GPU is given to two ranks of the node.

    Args:
        local_rank: this rank's index on its node (LOCAL_RANK; 0 without torchrun).
        local_world_size: ranks on this node (LOCAL_WORLD_SIZE; 1 without torchrun).
        gpu_count: GPUs this process sees (0: both halves on the CPU).

    Returns:
        Two device names: ``cuda:2r`` and ``cuda:2r+1`` when there are two GPUs per rank, else
        ``cuda:r`` twice (the split is then only logical), or ``cpu`` twice.

    Raises:
        ValueError: more ranks on the node than GPUs.
    """
    if gpu_count == 0:
        return ["cpu", "cpu"]
    if local_world_size > gpu_count:
        raise ValueError(f"LOCAL_WORLD_SIZE={local_world_size} ranks but only {gpu_count} GPU(s): NCCL refuses two ranks "
                         f"on one GPU; use torchrun --nproc-per-node <= {gpu_count}, or --device cpu")
    if gpu_count >= 2 * local_world_size:
        return [f"cuda:{2 * local_rank}", f"cuda:{2 * local_rank + 1}"]  # a pair per rank: rank r gets 2r and 2r+1
    # Not a pair for every rank: each keeps its own GPU (cuda:r). Giving rank 0 a pair would hand cuda:1 to
    # rank 0 and rank 1 at once, and NCCL stops at init ("Duplicate GPU detected").
    return [f"cuda:{local_rank}"] * 2


def setup(args):
    """Join the process group under torchrun; return (rank, local_rank, world_size, [device of each half])."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): "
                 "use --device cpu, or a machine with a GPU and a CUDA build of torch")
    if use_cuda and torch.cuda.device_count() == 0:
        raise SystemExit("model_parallel.py: --device cuda, but no CUDA GPU is visible here; use --device auto or cpu")
    gpu_count = torch.cuda.device_count() if use_cuda else 0
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # torchrun's ranks on this node
    devices = [torch.device(d) for d in pick_devices(local_rank, local_world_size, gpu_count)]
    if devices[0].type == "cuda":
        torch.cuda.set_device(devices[0])
    if "RANK" in os.environ:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=timedelta(seconds=args.pg_timeout_s),
                                device_id=devices[0] if use_cuda else None)
    return rank, local_rank, world_size, devices


def cleanup():
    if dist.is_initialized():
        dist.destroy_process_group()


class ParallelModel(nn.Module):
    """The seed's model, with the devices passed in instead of hard-coded ``cuda:0`` / ``cuda:1``."""

    def __init__(self, dev0, dev1):
        super().__init__()
        self.dev0, self.dev1 = dev0, dev1
        self.part1 = nn.Linear(1000, 2000).to(dev0)
        self.part2 = nn.Linear(2000, 1000).to(dev1)

    def forward(self, x):
        x = torch.relu(self.part1(x.to(self.dev0)))
        return self.part2(x.to(self.dev1))  # the activation crosses devices here; its gradient comes back in backward


def bytes_on(model, device):
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.device == device)


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    rank, local_rank, world_size, devices = setup(args)
    try:
        train(args, rank, world_size, devices)
    finally:
        cleanup()


def train(args, rank, world_size, devices):
    torch.manual_seed(args.seed)
    model = ParallelModel(*devices)
    reference = copy.deepcopy(model).to(devices[0])  # the same weights, both halves on one device
    reference.dev1 = devices[0]
    split = devices[0] != devices[1]
    note = (f"part1 on {devices[0]}, part2 on {devices[1]}" if split else
            f"both halves on {devices[0]}: fewer than 2 devices for this rank, so the split is only logical")
    sys.stdout.write(note + "\n")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    metrics_dir = Path(args.metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    with open(metrics_dir / f"rank{rank}.jsonl", "a", buffering=1) as f:
        for step in range(1, args.max_steps + 1):
            t0 = time.perf_counter()
            g = torch.Generator().manual_seed(args.seed * 1009 + step)
            x = torch.randn(args.batch_size, 1000, generator=g)
            y = torch.randn(args.batch_size, 1000, generator=g).to(devices[1])  # targets live with the output
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            if devices[0].type == "cuda":
                torch.cuda.synchronize()
            f.write(json.dumps({"step": step, "max_steps": args.max_steps, "rank": rank, "world_size": world_size,
                                "loss_local": loss.item(), "loss_global": loss.item(),
                                "step_time_s": time.perf_counter() - t0}) + "\n")
    with torch.no_grad():
        x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(args.seed))
        reference.load_state_dict(model.state_dict())  # copies each half's weights onto the reference's device
        diff = (model(x).to(devices[0]) - reference(x)).abs().max().item()
    result = {"rank": rank, "world_size": world_size, "split_across_devices": split, "note": note,
              "devices": [str(d) for d in devices], "max_abs_diff_vs_one_device": diff,
              "param_bytes_per_device": {str(d): bytes_on(model, d) for d in dict.fromkeys(devices)}}
    (metrics_dir / f"mp_rank{rank}.json").write_text(json.dumps(result))
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
