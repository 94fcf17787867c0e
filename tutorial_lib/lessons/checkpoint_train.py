"""Checkpointing done right: DDP or FSDP2, sharded (DCP) or full saves, exact resume, crash-safe folders.

Run card
    python checkpoint_train.py --max-steps 12 --save-every 6                   # one process
    torchrun --nproc-per-node 2 checkpoint_train.py --strategy fsdp2 --format dcp --save-every 6
    torchrun --nproc-per-node 2 checkpoint_train.py --resume latest            # continue where it stopped
    torchrun --nproc-per-node 1 checkpoint_train.py --strategy fsdp2 \
        --resume ../other-run/checkpoints/step-6                              # 2-rank save, 1-rank load
    torchrun --nproc-per-node 2 --max-restarts 1 checkpoint_train.py --resume latest \
        --save-every 4 --fail-rank 1 --fail-step 7        # crash once, restart, resume (--fail-*: _workbook.py)

What it shows
    * a checkpoint is everything the next step depends on: model, optimizer, LR scheduler, grad
      scaler, the step counter, the sampler's epoch and position, and the RNG state of *every* rank
      (dropout draws differ per rank). Restoring all of it makes the resumed loss curve bitwise
      identical to an uninterrupted run on CPU;
    * ``--format dcp``: ``torch.distributed.checkpoint`` writes each rank's own shards in parallel
      (no gather), and a different number of ranks can load them (resharding);
    * ``--format full``: the full state dict is *gathered on every rank* (a collective under FSDP)
      and written by rank 0 only; ``--save-mode rank0-only`` is seed 001's mistake (the gather is
      entered on rank 0 alone) and hangs until ``--pg-timeout-s``; ``--load-mode rank0-only`` is its
      load: plain tensors loaded into FSDP2's DTensor parameters on rank 0 only, which raises;
    * the LR scheduler is built with its defaults *before* the optimizer's state is loaded, then its own state
      is loaded: a scheduler's constructor takes a step that sets every group's learning rate to its first
      (warmup) value, so one built after the optimizer's state was loaded (``--scheduler-order
      built-after-load``) overwrites the restored rate and the first resumed step uses the warmup's;
    * crash safety: a save goes to ``<checkpoint-dir>/.tmp-step-N/`` and becomes ``step-N/`` (with its
      ``checkpoint.json``) only once every rank has finished writing; a folder without both never
      counts, so a process killed during a save leaves the previous checkpoint as the newest one;
    * ``--resume latest`` continues from the newest complete checkpoint (or starts fresh if there is
      none), which is what an elastic restart (torchrun ``--max-restarts``) needs.

Only torch and the Python standard library are imported, so the file can be copied to a cluster as is; DCP needs
numpy installed beside torch (it gathers its save and load plans with ``gather_object``, which goes through numpy,
and pip's torch does not install it). In a workbook run, ``_workbook.py`` beside it adds what the notebooks use to
measure it and to break it on purpose, each reached from a line marked ``# workbook``: one JSON line per step per rank
in ``<metrics-dir>/rank<RANK>.jsonl`` (with ``attempt`` = TORCHELASTIC_RESTART_COUNT and ``resumed_from_step``), each
save's and load's time and bytes in ``<metrics-dir>/checkpoint_rank<RANK>.json``, ``--dump-loaded-state`` and the
failures on purpose (``--fail-rank``, ``--fail-step``, ``--fail-mode``).
"""

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, get_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict,
                                                     set_state_dict)
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

try:  # the workbook's instruments, written beside this file in a workbook run; a copy trains without them
    import _workbook as workbook
except ImportError:
    workbook = None


class NoRecorder:  # stands in for _workbook's recorder in a copy without _workbook.py: every call does nothing
    def __getattr__(self, name):
        return lambda *args, **kwargs: contextlib.nullcontext()  # (and is an empty `with` where one is expected)


COMPLETE_MARKER = "checkpoint.json"  # written last, inside the temporary folder, before the rename
FULL_FILE = "model_optim.pt"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp",
                   help="ddp: replicas; fsdp2: fully_shard (parameters and optimizer state sharded)")
    p.add_argument("--max-steps", type=int, default=12, help="optimizer steps of the whole training (count)")
    p.add_argument("--stop-at-step", type=int, default=0,
                   help="stop (after saving) at this step, as a job hitting its time limit (0: run to --max-steps)")
    p.add_argument("--save-every", type=int, default=0,
                   help="save a checkpoint every N steps and at the last step (count; 0: never)")
    p.add_argument("--checkpoint-dir", type=str, default="checkpoints",
                   help="folder of step-N/ checkpoints (created if missing)")
    p.add_argument("--resume", type=str, default="none",
                   help="none: start fresh; latest: the newest complete step-N/ in --checkpoint-dir, or fresh "
                        "if there is none; or the path of one step-N/ folder")
    p.add_argument("--format", choices=["dcp", "full"], default="dcp",
                   help="dcp: sharded torch.distributed.checkpoint, every rank writes; full: one torch.save "
                        "file of the gathered state, written by rank 0")
    p.add_argument("--save-mode", choices=["correct", "rank0-only"], default="correct",
                   help="rank0-only: seed 001's mistake, the full state dict gathered on rank 0 only (hangs)")
    p.add_argument("--load-mode", choices=["correct", "rank0-only"], default="correct",
                   help="rank0-only: seed 001's load, model.load_state_dict(torch.load(...)) on rank 0 only "
                        "(--format full); into FSDP2's sharded parameters it raises")
    p.add_argument("--scheduler-order", choices=["correct", "built-after-load"], default="correct",
                   help="built-after-load: on resume, the LR scheduler is built again after the optimizer's state "
                        "was loaded (then its state loaded): the first resumed step uses the warmup's first rate")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step (count)")
    p.add_argument("--dataset-size", type=int, default=256, help="samples in the synthetic dataset (count)")
    p.add_argument("--input-dim", type=int, default=32, help="features per sample (count)")
    p.add_argument("--hidden-dim", type=int, default=128, help="width of the hidden layers (count)")
    p.add_argument("--n-layers", type=int, default=2, help="hidden layers (count)")
    p.add_argument("--output-dim", type=int, default=4, help="targets per sample (count)")
    p.add_argument("--dropout", type=float, default=0.1,
                   help="dropout probability (0..1); its random masks make the RNG state part of the checkpoint")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (unitless)")
    p.add_argument("--warmup-steps", type=int, default=3, help="linear warmup, then cosine decay (count)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, the data and the sampler")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0,
                   help="collective timeout of the process group (seconds); torch's default is 10 minutes on NCCL, 30 on gloo")
    if workbook:  # workbook
        workbook.add_checkpoint_flags(p)  # workbook: --metrics-dir, --dump-loaded-state, --fail-*
    args = check_args(p, p.parse_args(argv))
    if workbook:  # workbook
        workbook.check_checkpoint_flags(p, args)  # workbook
    return args


def check_args(p, args):
    """Refuse bad values before anything starts, naming the flag and the value (argparse exits with 2)."""
    for name in ("max_steps", "batch_size", "dataset_size", "input_dim", "hidden_dim", "n_layers", "output_dim"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("save_every", "stop_at_step", "warmup_steps"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not 0 <= args.dropout < 1:
        p.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.pg_timeout_s <= 0:
        p.error(f"--pg-timeout-s must be > 0, got {args.pg_timeout_s}")
    return args


def setup(args):
    """Join the process group when launched by torchrun; return (rank, local_rank, world_size, device)."""
    distributed = "RANK" in os.environ  # torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): "
                 "use --device cpu, or a machine with a GPU and a CUDA build of torch")
    if use_cuda:
        device = torch.device("cuda", local_rank)  # LOCAL_RANK: the GPU index on this node
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not distributed:  # DCP works without a process group (one process); it warns that it assumes so
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    if distributed:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo",
                                timeout=timedelta(seconds=args.pg_timeout_s),
                                device_id=device if use_cuda else None)
    return rank, local_rank, world_size, device


def cleanup():
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier():
    if dist.is_initialized():
        dist.barrier()


class MLP(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim, layers, dropout):
        super().__init__()
        blocks, width = [], input_dim
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden_dim), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden_dim
        blocks.append(nn.Linear(width, output_dim))
        self.net = nn.Sequential(*blocks)

    def forward(self, x):
        return self.net(x)


def build_model(args, device):
    # Same seed on every rank: DDP would broadcast rank 0's weights, FSDP2 does not.
    torch.manual_seed(args.seed)
    model = MLP(args.input_dim, args.hidden_dim, args.output_dim, args.n_layers, args.dropout).to(device)
    if not dist.is_initialized():
        return model  # one process: nothing to wrap
    if args.strategy == "ddp":
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import FSDPModule, fully_shard
    for layer in model.net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)  # each Linear is one all-gather unit; its parameters become DTensor Shard(0)
    fully_shard(model)
    if dist.get_backend() == "gloo":
        # FSDP2 averages gradients with a ReduceOp.AVG reduce-scatter, which gloo's reduce-scatter in torch 2.8
        # silently treats as a sum (pytorch/pytorch#162338): gradients world_size times too large. Sum, then
        # divide: right on every version (notebook 09 measures both).
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    return model


def synthetic_dataset(args):
    """(x, y) of --dataset-size samples from a fixed random teacher network: the same on every rank."""
    g = torch.Generator().manual_seed(args.seed + 1_000_003)
    x = torch.randn(args.dataset_size, args.input_dim, generator=g)
    w1 = torch.randn(args.input_dim, 16, generator=g) / args.input_dim ** 0.5
    w2 = torch.randn(16, args.output_dim, generator=g) / 4.0
    return x, torch.tanh(x @ w1) @ w2 + 0.01 * torch.randn(args.dataset_size, args.output_dim, generator=g)


class ResumableBatches:
    """This rank's batches from a DistributedSampler, with the (epoch, position) needed to continue exactly.

    A DataLoader's iterator cannot be saved; its position can. ``set_epoch`` reshuffles (the same
    permutation on every rank), ``position`` counts the batches already taken in that epoch.
    """

    def __init__(self, dataset_size, batch_size, rank, world_size, seed):
        # drop_last: every rank gets the same number of batches, no sample is seen twice in an epoch.
        self.sampler = DistributedSampler(range(dataset_size), num_replicas=world_size, rank=rank,
                                          shuffle=True, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self.epoch, self.position = 0, 0
        if len(self.sampler) < batch_size:
            raise SystemExit(f"--dataset-size {dataset_size} gives {len(self.sampler)} samples per rank, "
                             f"fewer than one batch of {batch_size}")

    def next_indices(self):
        if (self.position + 1) * self.batch_size > len(self.sampler):
            self.epoch, self.position = self.epoch + 1, 0  # a new epoch: a new shuffle
        self.sampler.set_epoch(self.epoch)
        indices = list(self.sampler)[self.position * self.batch_size:(self.position + 1) * self.batch_size]
        self.position += 1
        return indices

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state):
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def warmup_cosine(args):
    def factor(step):  # step = scheduler.last_epoch: optimizer steps taken so far
        if step < args.warmup_steps:
            return (step + 1) / (args.warmup_steps + 1)
        progress = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)
        return 0.5 * (1 + torch.cos(torch.tensor(torch.pi * min(1.0, progress))).item())
    return factor


def rng_state(device):
    """This rank's random generators: each rank draws its own dropout masks."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def attempt_number():
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))  # 0 on the first attempt


def complete_checkpoints(folder):
    """{step: path} of the complete checkpoints in ``folder``: ``step-N/`` holding ``checkpoint.json``."""
    found = {}
    for path in Path(folder).glob("step-*"):
        suffix = path.name.removeprefix("step-")
        if suffix.isdigit() and (path / COMPLETE_MARKER).is_file():
            found[int(suffix)] = path
    return found


def full_options(**extra):
    # full_state_dict: gather DTensor shards into whole tensors (a collective under FSDP);
    # cpu_offload: keep the gathered copy on CPU and only on rank 0 (the other ranks get {}).
    return StateDictOptions(full_state_dict=True, cpu_offload=True, **extra)


def resume_path(args):
    if args.resume == "none":
        return None
    if args.resume == "latest":
        found = complete_checkpoints(args.checkpoint_dir)
        return found[max(found)] if found else None  # none yet: the first attempt starts fresh
    path = Path(args.resume)
    if not (path / COMPLETE_MARKER).is_file():
        raise SystemExit(f"--resume {args.resume!r} is not a complete checkpoint folder (no {COMPLETE_MARKER})")
    return path


def save_checkpoint(args, step, model, optimizer, scheduler, scaler, batches, rank, world_size, device):
    """Write ``<checkpoint-dir>/step-<step>/`` atomically. Every rank must call this (it has collectives)."""
    root = Path(args.checkpoint_dir)
    tmp, final = root / f".tmp-step-{step}", root / f"step-{step}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left over by an attempt that died during this save
        tmp.mkdir(parents=True)
    barrier()  # the folder exists before anyone writes into it
    # 1. this rank's own state: its RNG (differs per rank), plus the small state every rank shares
    extra = {"rng": rng_state(device), "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
             "batches": batches.state_dict(), "step": step}
    torch.save(extra, tmp / f"extra_rank{rank}.pt")
    if workbook:  # workbook
        workbook.inject_checkpoint_failure(args, rank, step, "save")  # workbook: --fail-mode kill-during-save
    # 2. model and optimizer
    if args.format == "dcp":
        # Every rank writes its own shards (__<rank>_0.distcp) in parallel; rank 0 adds .metadata.
        # get_state_dict gives keys without DDP's "module." prefix and with FQN-keyed optimizer state.
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp, no_dist=not dist.is_initialized())
    elif args.save_mode == "rank0-only":
        if rank == 0:  # seed 001's mistake: the gather below is a collective, entered by rank 0 alone
            model_sd = get_model_state_dict(model, options=full_options())
            optim_sd = get_optimizer_state_dict(model, optimizer, options=full_options())
            torch.save({"model": model_sd, "optim": optim_sd}, tmp / FULL_FILE)
    else:
        # Gathered on *every* rank (each sends its shards), written by rank 0 only.
        model_sd = get_model_state_dict(model, options=full_options())
        optim_sd = get_optimizer_state_dict(model, optimizer, options=full_options())
        if rank == 0:
            torch.save({"model": model_sd, "optim": optim_sd}, tmp / FULL_FILE)
    barrier()  # every rank has finished writing: only now may the checkpoint become visible
    if rank == 0:
        marker = {"step": step, "world_size": world_size, "format": args.format, "strategy": args.strategy,
                  "files": {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}}
        with open(tmp / COMPLETE_MARKER, "w") as f:
            json.dump(marker, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():  # saved before by an attempt that later crashed: replace it
            old = root / f".old-step-{step}"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            shutil.rmtree(old)
        tmp.rename(final)  # atomic on one filesystem: readers see no folder or a complete one
        dir_fd = os.open(root, os.O_RDONLY)
        os.fsync(dir_fd)  # make the rename itself durable
        os.close(dir_fd)
    barrier()


def load_checkpoint(args, path, model, optimizer, scheduler, scaler, batches, rank, world_size, device):
    """Restore everything from the step folder ``path``; return its step. Every rank must call this."""
    path = Path(path)
    marker = json.loads((path / COMPLETE_MARKER).read_text())
    if marker["format"] == "dcp":
        # The current model's (sharded) state dict says which pieces this rank needs; DCP reads them
        # from whichever files hold them, so the saving world size may differ (resharding).
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        # Seed 001 loads on rank 0 only into a sharded model. Instead: rank 0 reads the file and
        # broadcast_from_rank0 sends every rank its part (its shards under FSDP, everything under DDP).
        full = torch.load(path / FULL_FILE, map_location="cpu", weights_only=True) if rank == 0 else {}
        if args.load_mode == "rank0-only" and rank == 0:  # seed 001's load: whole tensors into this rank's model
            model.load_state_dict(full["model"])  # FSDP2: "got mixed torch.Tensor and DTensor"
        options = full_options(broadcast_from_rank0=dist.is_initialized())
        set_model_state_dict(model, full.get("model", {}), options=options)
        set_optimizer_state_dict(model, optimizer, full.get("optim", {}), options=options)
    own = path / f"extra_rank{rank}.pt"
    if not own.exists():  # more ranks than at save time: this rank's RNG state was never saved
        sys.stdout.write(f"rank {rank}: no {own.name} (saved with {marker['world_size']} ranks); "
                         "using rank 0's shared state and a fresh RNG seed\n")
    extra = torch.load(own if own.exists() else path / "extra_rank0.pt", weights_only=False)
    scheduler.load_state_dict(extra["scheduler"])
    scaler.load_state_dict(extra["scaler"])
    batches.load_state_dict(extra["batches"])
    if own.exists() and marker["world_size"] == world_size:
        set_rng_state(extra["rng"], device)  # last: nothing may draw random numbers after this
    else:
        torch.manual_seed(args.seed + 7919 * (rank + 1) + extra["step"])
    barrier()
    return extra["step"]


def train(args, rank, local_rank, world_size, device):
    model = build_model(args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args))
    # A GradScaler matters only for fp16 training (the mixed-precision lesson); in fp32 it is disabled and
    # passes everything through. Its state (scale, growth tracker) belongs in a checkpoint all the same.
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    batches = ResumableBatches(args.dataset_size, args.batch_size, rank, world_size, args.seed)
    data_x, data_y = synthetic_dataset(args)
    torch.manual_seed(args.seed + 7919 * (rank + 1))  # each rank its own dropout masks
    recorder = (workbook.CheckpointStepRecorder(args, rank, local_rank, world_size, device, model, optimizer)  # workbook
                if workbook else NoRecorder())  # workbook
    attempt, resumed_from = attempt_number(), 0
    path = resume_path(args)
    if path is not None:
        with recorder.checkpoint_event("load", path):  # workbook: this rank's load time and bytes
            resumed_from = load_checkpoint(args, path, model, optimizer, scheduler, scaler, batches,
                                           rank, world_size, device)
        if args.scheduler_order == "built-after-load":  # the mistake: its constructor steps, setting the warmup's lr
            scheduler_state = scheduler.state_dict()
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args))
            scheduler.load_state_dict(scheduler_state)  # restores its step count, not the optimizer's lr
        sys.stdout.write(f"attempt {attempt}: resumed from {path.name} (step {resumed_from})\n")
        recorder.dump_loaded_state()  # workbook: --dump-loaded-state, what was loaded (a collective)
    elif attempt:
        sys.stdout.write(f"attempt {attempt}: no complete checkpoint, starting from step 0\n")
    loss_fn = nn.MSELoss()
    last_step = min(args.max_steps, args.stop_at_step or args.max_steps)
    for step in range(resumed_from + 1, last_step + 1):
        recorder.begin(step)  # workbook: --fail-mode raise, a no-op by default
        t0 = time.perf_counter()
        idx = batches.next_indices()
        x, y = data_x[idx].to(device), data_y[idx].to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()  # DDP all-reduces / FSDP2 reduce-scatters gradients here
        scaler.step(optimizer)
        scaler.update()
        lr = optimizer.param_groups[0]["lr"]  # the rate this step used (what the scheduler believes may differ)
        scheduler.step()
        loss_global = loss.detach().float().clone()
        if dist.is_initialized():
            dist.all_reduce(loss_global)
            loss_global /= world_size
        recorder.step_done(step, loss, loss_global, lr, batches.epoch, time.perf_counter() - t0)  # workbook
        if args.save_every and (step % args.save_every == 0 or step == last_step):
            with recorder.checkpoint_event("save", step=step):  # workbook: this rank's save time and bytes
                save_checkpoint(args, step, model, optimizer, scheduler, scaler, batches, rank, world_size, device)
            sys.stdout.write(f"step {step}: saved step-{step} ({args.format}) loss_global {loss_global.item():.5f}\n")
    recorder.close()  # workbook
    barrier()  # nobody tears the process group down while a peer still uses it


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    rank, local_rank, world_size, device = setup(args)
    try:
        train(args, rank, local_rank, world_size, device)
    finally:
        cleanup()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
