"""A GPT-style language model trained on real text, from one process to many GPUs: DDP, FSDP2 or HSDP.

Run card
    python train_lm.py --parallel none --max-steps 200                      # one process, CPU or one GPU
    torchrun --nproc-per-node 2 train_lm.py --parallel ddp                  # replicas, gradients all-reduced
    torchrun --nproc-per-node 4 train_lm.py --parallel fsdp --ac-mode selective
    torchrun --nproc-per-node 4 train_lm.py --parallel hsdp --replicate-degree 2   # shard in 2, replicate x 2
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr HOST --master-port 29500 \
        train_lm.py --parallel hsdp --replicate-degree 2 --n-layers 24 --d-model 2048 --n-heads 16
                                                                            # node 0 of 2 (node 1: --node-rank 1)
    python train_lm.py --create-seed-checkpoint seed                        # the initial weights, written once
    torchrun --nproc-per-node 2 train_lm.py --init-from seed --save-every 50 --async-save
    torchrun --nproc-per-node 2 train_lm.py --resume latest                 # continue exactly where it stopped
    torchrun --nproc-per-node 3 train_lm.py --resume latest                 # or on another world size (see below)

What it shows
    * the model is built on the ``meta`` device (shapes, no memory), sharded with ``fully_shard`` block by block
      and then the root, given real (sharded) storage with ``to_empty``, and only then initialised: no rank ever
      holds the whole model, which is what lets FSDP train models larger than one device (torchtitan's pattern);
    * a seed checkpoint, written once by one process, so every layout (one process, DDP, FSDP, HSDP) starts from
      the same weights; DCP reads each rank's own shards of it;
    * real text on every machine without a download: the standard library's source as bytes (vocabulary 256), in
      windows the ranks share out of ``DistributedSampler``'s shuffle from a position all agree on (lm_data.py);
    * bf16 through FSDP's ``MixedPrecisionPolicy`` (fp32 shards, gradients reduced in fp32) or ``torch.autocast``;
      activation checkpointing per block, whole (``full``) or op by op (``selective``: matmul and attention
      outputs kept, the rest recomputed); gradient clipping on (sharded) DTensor gradients; warm-up + cosine LR;
    * the held-out loss as an exact distributed mean (token-loss sums and token counts all-reduced);
    * DCP checkpoints, ``dcp.save`` or ``dcp.async_save`` on a process group of their own, and an exact resume
      (model, optimizer, LR scheduler, data position, RNG: the resumed loss curve equals the uninterrupted one), on
      another world size too, where only the RNG is reseeded (lm_checkpoint.py); the per-rank batch stays
      --batch-size, so the global batch changes with the world size.

Beside it, imported plainly as nanoGPT's train.py imports model.py: ``lm_model.py`` (the GPT), ``lm_data.py`` (the
corpus, each rank's batches) and ``lm_checkpoint.py`` (what a checkpoint holds, resuming it). They import only torch and
the standard library: copy the four files to a cluster as they are. Checkpoints need numpy beside torch (DCP gathers
its plans with ``gather_object``, which goes through numpy; pip's torch does not install it). In a workbook run,
``_workbook.py`` beside them adds what the notebooks measure (per-step JSON lines, tokens/s, MFU, memory, save times,
``--track-memory``), each reached from a line marked ``# workbook``.
"""

import argparse
import contextlib
import math
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record

from lm_checkpoint import (TrainState, checkpoint_state, load_checkpoint, load_initial_weights, resume_path,
                           save_checkpoint)
from lm_data import CORPUS_FILES, Batches, TokenWindows, read_corpus  # noqa: F401 (CORPUS_FILES: notebook 11)
from lm_model import GPT, GPTConfig

try:  # the workbook's instruments, written beside this file in a workbook run; a copy trains without them
    import _workbook as workbook
except ImportError:
    workbook = None


class NoRecorder:  # stands in for _workbook's recorder in a copy without _workbook.py: every call does nothing
    def __getattr__(self, name):
        return lambda *args, **kwargs: contextlib.nullcontext()  # (and is an empty `with` where one is expected)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parallel", choices=["none", "ddp", "fsdp", "hsdp"], default="fsdp",
                   help="none: one process; ddp: replicas; fsdp: fully_shard over all ranks; hsdp: fully_shard on a "
                        "2-D DeviceMesh (replicate x shard)")
    p.add_argument("--reshard-after-forward", choices=["yes", "no"], default="yes",
                   help="fsdp/hsdp: free each block's gathered parameters after its forward (yes: ZeRO stage 3) or "
                        "keep them until its backward (no: one all-gather fewer, the memory of ZeRO stage 2)")
    # The model: GPT-2's shape. 6 x 384 x 6 heads is nanoGPT's small (Shakespeare) configuration; 12 x 768 x 12 with
    # --block-size 1024 --vocab-size 50257 is GPT-2 small's shape: 162.9 M parameters here (163.0 M with --bias), not
    # GPT-2's 124 M, because this head is untied (GPT-2 shares the token embedding's 38.6 M); 32 x 4096 x 32 is 6.4 B.
    for name, default, help in [
            ("--replicate-degree", 2, "hsdp: replicas; must divide the world size"), ("--n-layers", 2, "blocks"),
            ("--d-model", 128, "model width"), ("--n-heads", 4, "attention heads; must divide --d-model"),
            ("--block-size", 128, "tokens per window, the context length"), ("--vocab-size", 256, ">= 256 bytes"),
            ("--max-steps", 100, "optimizer steps of the whole training"), ("--batch-size", 8, "windows per rank"),
            ("--grad-accum-steps", 1, "micro-batches per optimizer step"), ("--warmup-steps", 10, "then cosine"),
            ("--corpus-bytes", 1 << 20, "bytes of standard-library source"), ("--log-every", 10, "print every N"),
            ("--eval-every", 0, "evaluate every N steps (0: at the end only)"), ("--seed", 0, "weights, data order"),
            ("--eval-windows", 64, "held-out windows per evaluation"), ("--sample-tokens", 0, "bytes to generate"),
            ("--save-every", 0, "save every N steps and at the end (0: never)"),
            ("--stop-at-step", 0, "stop after this step, as a job at its time limit (0: --max-steps)")]:
        p.add_argument(name, type=int, default=default, help=f"{help} (count)")
    for name, default, help in [
            ("--dropout", 0.0, "probability [0, 1)"), ("--lr", 3e-3, "peak learning rate (> 0)"),
            ("--min-lr-ratio", 0.1, "final / peak learning rate [0, 1)"), ("--weight-decay", 0.1, "AdamW's (>= 0)"),
            ("--clip-grad-norm", 1.0, "clip the global gradient norm (0: off)"),
            ("--val-fraction", 0.1, "share of the corpus held out (0, 1)"),
            ("--bucket-cap-mb", 25.0, "ddp: gradient bucket size (MiB)"),
            ("--pg-timeout-s", 120.0, "collective timeout of the process group (s)")]:
        p.add_argument(name, type=float, default=default, help=help)
    for name, help in [("--bias", "biases in Linear and LayerNorm (GPT-2 has them)"),
                       ("--foreach", "AdamW's foreach: faster on GPUs, temporaries for all parameters at once"),
                       ("--compile", "torch.compile each block"),
                       ("--async-save", "dcp.async_save: write while training continues"),
                       ("--no-optimize-ddp", "ddp + compile: optimize_ddp = False (one graph, no split at buckets)"),
                       ("--deterministic", "deterministic kernels only: a resumed fp32 CUDA run then matches an "
                                           "unbroken one bit for bit; an op without one raises, naming itself")]:
        p.add_argument(name, action="store_true", help=help)
    for name, choices, default, help in [
            ("--precision", ["fp32", "bf16", "fp16"], None, "compute dtype (default: bf16 on CUDA, fp32 on CPU); "
             "parameters, gradients and optimizer state stay fp32; fp16: CUDA only, with a gradient scaler"),
            ("--grad-scaler", ["auto", "on", "off"], "auto", "torch.amp.GradScaler: auto = on for fp16 only"),
            ("--ac-mode", ["none", "full", "selective"], "none", "activation checkpointing per block: full = its "
             "whole forward recomputed in backward; selective = all but its matmul and attention outputs"),
            ("--save-group", ["own", "default"], "own", "--async-save's process group: own (a new gloo group); "
             "default: the mistake, training's own (on gloo the save's collectives interleave with training's)"),
            ("--device", ["auto", "cpu", "cuda"], "auto", "auto: cuda:LOCAL_RANK when CUDA is available, else cpu"),
            ("--backend", ["auto", "nccl", "gloo"], "auto", "process-group backend; auto: nccl on cuda, gloo on cpu")]:
        p.add_argument(name, choices=choices, default=default, help=help)
    for name, default, help in [
            ("--compile-backend", "inductor", "inductor (needs a C++ compiler on CPU), or aot_eager (quick)"),
            ("--create-seed-checkpoint", "", "write the initial weights to this folder (DCP) and exit; one process"),
            ("--init-from", "", "initial weights: a DCP folder (a seed checkpoint) or a .pt full state dict"),
            ("--checkpoint-dir", "checkpoints", "folder of step-N/ checkpoints"),
            ("--resume", "none", "none; latest: the newest complete step-N/ in --checkpoint-dir; or a path"),
            ("--prompt", "def ", "text the sample continues")]:
        p.add_argument(name, type=str, default=default, help=help)
    if workbook:
        workbook.add_lm_flags(p)  # workbook: --metrics-dir, --log-windows, --track-memory
    args = p.parse_args(argv)
    for name in ("n_layers", "d_model", "n_heads", "block_size", "max_steps", "batch_size", "grad_accum_steps",
                 "corpus_bytes", "eval_windows", "log_every", "replicate_degree", "warmup_steps", "lr", "pg_timeout_s",
                 "bucket_cap_mb"):
        if getattr(args, name) <= 0:  # refuse bad values before anything starts
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("eval_every", "save_every", "stop_at_step", "sample_tokens", "clip_grad_norm", "weight_decay"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.precision == "fp16" and not use_cuda:
        # fp16 matmuls on CPU are emulated and extremely slow (a 2048^3 matmul took 43 s on the lesson machine).
        p.error("--precision fp16 needs CUDA: fp16 compute on CPU is unusably slow; use --precision bf16 on CPU")
    if args.d_model % args.n_heads:
        p.error(f"--n-heads must divide --d-model, got --d-model {args.d_model} --n-heads {args.n_heads}")
    if args.vocab_size < 256:
        p.error(f"--vocab-size must be >= 256 (the byte values), got {args.vocab_size}")
    for name in ("dropout", "val_fraction", "min_lr_ratio"):
        if not 0 <= getattr(args, name) < 1 or (name == "val_fraction" and args.val_fraction == 0):
            p.error(f"--{name.replace('_', '-')} must be in {'(0' if name == 'val_fraction' else '[0'}, 1), "
                    f"got {getattr(args, name)}")
    if args.block_size * 2 > args.corpus_bytes * args.val_fraction:
        p.error(f"--block-size {args.block_size} leaves fewer than 2 held-out windows in --corpus-bytes "
                f"{args.corpus_bytes} x --val-fraction {args.val_fraction}")
    if workbook:
        workbook.check_lm_flags(p, args)  # workbook: --track-memory needs a second step
    return args


def setup(args):
    """Join the process group (a world of one without torchrun); return (rank, local_rank, world_size, device)."""
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): "
                 "use --device cpu, or a machine with a GPU and a CUDA build of torch")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")  # LOCAL_RANK: this node's GPU
    if args.deterministic:  # before the first CUDA kernel: cuBLAS reads its workspace setting once
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if use_cuda:
        torch.cuda.set_device(device)
    backend = ("nccl" if use_cuda else "gloo") if args.backend == "auto" else args.backend
    timeout = timedelta(seconds=args.pg_timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timeout, device_id=device if backend == "nccl" else None)
    else:  # DCP and FSDP want a process group even alone: a world of one over an in-memory store
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return rank, local_rank, world_size, device


def model_config(args):
    return GPTConfig(**{name: getattr(args, name) for name in GPTConfig.__dataclass_fields__})  # the same names


def compute_dtype(args, device):
    if args.precision is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]


def make_mesh(args, world_size, device):
    """The DeviceMesh FSDP shards over: 1-D (all ranks) for fsdp, 2-D (replicate, shard) for hsdp."""
    from torch.distributed.device_mesh import init_device_mesh
    if args.parallel == "hsdp":
        shape, names = (args.replicate_degree, world_size // args.replicate_degree), ("replicate", "shard")
    else:
        shape, names = (world_size,), ("shard",)
    return init_device_mesh(device.type, shape, mesh_dim_names=names)


def build_model(args, device, mesh=None, init=True):
    """The model on ``device``, laid out as --parallel says; every rank builds only what it keeps."""
    sharded = args.parallel in ("fsdp", "hsdp")
    # FSDP: build on the meta device (shapes, no memory, no random numbers), shard, then allocate each rank's shards
    # only. DDP and one process hold the whole model anyway: built on the device directly.
    with torch.device("meta" if sharded else device):
        model = GPT(model_config(args))
    model.checkpointing = args.ac_mode
    if args.compile:
        if args.no_optimize_ddp:
            torch._dynamo.config.optimize_ddp = False  # DDP's graph split at bucket boundaries off: one graph per block
        for block in model.blocks:
            # In place, before sharding (torchtitan's order: activation checkpointing, compile, FSDP).
            block.compile(backend=args.compile_backend)
    if sharded:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
        dtype = compute_dtype(args, device)
        # Compute (and all-gather) in bf16; keep fp32 shards and reduce gradients in fp32 ("master weights").
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for block in model.blocks:
            # One unit per block: gathered just before it runs, freed after it (or, with reshard_after_forward=False,
            # kept gathered from its forward until its backward).
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=args.reshard_after_forward == "yes")
        fully_shard(model, mesh=mesh, mp_policy=mp)  # the root: embeddings, final norm, head
        if dist.get_backend() == "gloo":
            # gloo's reduce-scatter in torch 2.8 treats ReduceOp.AVG as a sum (pytorch/pytorch#162338): sum, then
            # divide, right on every version (notebook 09).
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.set_force_sum_reduction_for_comms(True)
        model.to_empty(device=device)  # real storage now: each rank's shards only
    if init:
        model.init_weights(args.seed)
        if args.init_from:
            load_initial_weights(model, args.init_from)
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        # gradient_as_bucket_view: the gradients live in DDP's all-reduce buckets, not in a second copy.
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                    bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=True)
    return model


def build_optimizer(args, model):
    # Built after sharding, so its state is created for the local shards only. Weight decay on matrices only.
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "emb" not in n]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2 or "emb" in n]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    # foreach=False: one parameter at a time, so the update's temporaries are one parameter's size (torch's default
    # on GPUs, foreach=True, is faster and holds them for all parameters at once).
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), foreach=args.foreach)


def warmup_cosine(args):
    def factor(step):  # step: optimizer steps taken so far
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        progress = min(1.0, (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps))
        return args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


@torch.no_grad()
def evaluate(model, dataset, args, rank, world_size, device):
    """Mean cross-entropy (nats per byte) over the first --eval-windows held-out windows, exact on any world size:
    rank r takes windows r, r + W, ...; loss *sums* and token *counts* are all-reduced. Under FSDP every forward is
    collective (it all-gathers): every rank runs as many batches as the busiest one, its extra windows weighted 0."""
    model.eval()
    n = min(args.eval_windows, len(dataset))
    mine = list(range(rank, n, world_size))
    batches = math.ceil(math.ceil(n / world_size) / args.batch_size)
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of token losses, tokens]
    for b in range(batches):
        picked = mine[b * args.batch_size:(b + 1) * args.batch_size]
        weight = torch.tensor([1.0] * len(picked) + [0.0] * (args.batch_size - len(picked)), device=device)
        x, y = zip(*(dataset[i] for i in picked + [0] * (args.batch_size - len(picked))))
        x, y = torch.stack(x).to(device), torch.stack(y).to(device)
        with autocast_for(args, device):
            logits = model(x)
        losses = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
        totals[0] += (losses.sum(dim=1) * weight).sum().double()
        totals[1] += weight.sum().double() * y.shape[1]
    dist.all_reduce(totals)  # SUM: over all ranks, every window once
    reshard(model)
    model.train()
    return (totals[0] / totals[1]).item()


def reshard(model):
    """FSDP keeps the root unit's parameters gathered after its forward (backward would need them first); after a
    forward without backward (evaluation, generation) that is a whole copy of the root for nothing: free it."""
    if hasattr(model, "reshard"):  # an FSDPModule
        model.reshard()


def autocast_for(args, device):
    """torch.autocast for none/ddp in bf16; FSDP casts through its MixedPrecisionPolicy instead."""
    dtype = compute_dtype(args, device)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32 and args.parallel in ("none", "ddp"))


def make_scaler(args, device):
    """fp16's gradient scaler; with bf16 or fp32 a disabled one, whose every call passes through."""
    on = args.grad_scaler == "on" or (args.grad_scaler == "auto" and args.precision == "fp16")
    return torch.amp.GradScaler(device.type, enabled=on)


def train_step(model, optimizer, scaler, batches, args, device):
    """One optimizer step over --grad-accum-steps micro-batches; returns (mean loss, gradient norm) as tensors."""
    loss_sum = torch.zeros((), device=device)
    for micro in range(args.grad_accum_steps):
        x, y = batches.next(device)
        # DDP: all-reduce only after the last micro-batch (no_sync). FSDP reduce-scatters after each one on purpose:
        # holding unsharded gradients until the last (set_requires_gradient_sync(False)) costs the memory it saves.
        last = micro == args.grad_accum_steps - 1
        sync = model.no_sync() if args.parallel == "ddp" and not last else contextlib.nullcontext()
        with sync:
            with autocast_for(args, device):
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten()) / args.grad_accum_steps
            scaler.scale(loss).backward()  # DDP all-reduces, FSDP reduce-scatters the gradients here
        loss_sum += loss.detach()
    scaler.unscale_(optimizer)  # clipping must see the true gradients, not the scaled ones
    # On FSDP's DTensor gradients the norm is a DTensor; full_tensor() is the global value (Partial on torch 2.8).
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm or float("inf"))
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    scaler.step(optimizer)  # optimizer.step(), skipped when a gradient is inf/NaN (fp16 overflow)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, norm


def create_seed_checkpoint(args, device):
    """One process builds the model, initialises it and saves its weights with DCP: every later run, whatever its
    layout and world size, can start from exactly these weights (torchtitan's seed checkpoint)."""
    model = GPT(model_config(args)).to(device)
    model.init_weights(args.seed)
    dcp.save({"model": model.state_dict()}, checkpoint_id=args.create_seed_checkpoint)
    sys.stdout.write(f"seed checkpoint: {sum(p.numel() for p in model.parameters())} parameters in "
                     f"{args.create_seed_checkpoint}\n")


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    rank, local_rank, world_size, device = setup(args)
    try:
        if args.create_seed_checkpoint:
            if world_size != 1:
                sys.exit("--create-seed-checkpoint runs as one process: python train_lm.py --create-seed-checkpoint D")
            create_seed_checkpoint(args, device)
        else:
            check_world(args, world_size)
            train(args, rank, local_rank, world_size, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()  # also after an error: leave cleanly, the peers see this rank go


def train(args, rank, local_rank, world_size, device):
    data = read_corpus(args.corpus_bytes)
    n_val = int(len(data) * args.val_fraction)
    train_set, val_set = TokenWindows(data[:-n_val], args.block_size), TokenWindows(data[-n_val:], args.block_size)
    mesh = make_mesh(args, world_size, device) if args.parallel in ("fsdp", "hsdp") else None
    model = build_model(args, device, mesh)
    optimizer = build_optimizer(args, model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args))
    scaler = make_scaler(args, device)
    batches = Batches(train_set, args.batch_size, rank, world_size, args.seed)
    torch.manual_seed(args.seed + 7919 * (rank + 1))  # dropout's draws: reproducible, different on every rank
    train_state = TrainState()
    # async_save's background writes use collectives of their own: on a group of their own, they never interleave
    # with training's on the default group (on gloo they did, and a rank aborted: a collective mismatch).
    save_group = dist.new_group(backend="gloo") if args.async_save and args.save_group == "own" else None
    state = checkpoint_state(model, optimizer, scheduler, scaler, batches, train_state, rank, device)
    path = resume_path(args)
    if path is not None:  # model, optimizer, scheduler, data position, step, this rank's RNG
        saved_world = load_checkpoint(state, path, args, rank, world_size)
        resharded = (f" (saved on {saved_world} ranks, now {world_size}: data position kept, RNG reseeded)"
                     if saved_world != world_size else "")
        sys.stdout.write(f"rank {rank}: resumed from {path} at step {train_state.step}{resharded}\n")
    log = (workbook.LMStepRecorder(args, rank, local_rank, world_size, device, model, optimizer, data,  # workbook
                                   train_state.step, compute_dtype(args, device))  # workbook
           if workbook else NoRecorder())  # workbook
    pending = None  # the async save in flight
    last_step = min(args.max_steps, args.stop_at_step or args.max_steps)
    while train_state.step < last_step:
        train_state.step += 1
        step, step_start, lr = train_state.step, time.perf_counter(), scheduler.get_last_lr()[0]
        with log.tracking(step):  # workbook: --track-memory, torch's memory tracker on the second step
            loss, grad_norm = train_step(model, optimizer, scaler, batches, args, device)
        scheduler.step()
        loss_global = loss.clone()
        dist.all_reduce(loss_global)  # SUM then / world: each rank's loss is over its own windows
        loss_global /= world_size
        evaluating = (args.eval_every and step % args.eval_every == 0) or step == last_step
        eval_loss = evaluate(model, val_set, args, rank, world_size, device) if evaluating else None
        if args.save_every and (step % args.save_every == 0 or step == last_step):
            if pending is not None:
                pending.result()  # one save at a time: the previous one must have finished
            t0 = time.perf_counter()
            pending = save_checkpoint(state, step, save_group, args)
            log.saved(step, time.perf_counter() - t0)  # workbook: how long training was blocked
        log.step_done(step, loss, loss_global, grad_norm, lr, eval_loss, batches, step_start)  # workbook: JSON line
        if rank == 0 and (step % args.log_every == 0 or step == args.max_steps or eval_loss):
            tokens = args.batch_size * args.grad_accum_steps * args.block_size  # this rank's, this step
            tokens_per_s = tokens / (time.perf_counter() - step_start)
            sys.stdout.write(f"step {step}/{args.max_steps} loss {loss_global.item():.4f}"
                             + (f" eval_loss {eval_loss:.4f}" if eval_loss is not None else "")
                             + f" lr {lr:.2e} tokens/s {tokens_per_s:.0f}\n")
    if pending is not None:
        pending.result()
    if args.sample_tokens:
        text = generate(model, args, device)
        sys.stdout.write(f"sample: {text!r}\n" if rank == 0 else "")
        log.sample(text)  # workbook: metrics/sample_rank0.json
    log.close()  # workbook
    dist.barrier()  # nobody tears the process group down while a peer still uses it


@torch.no_grad()
def generate(model, args, device):
    """Continue --prompt by --sample-tokens bytes. Every rank runs it (FSDP's forwards are collective) with the same
    generator, so every rank draws the same bytes."""
    model.eval()
    idx = torch.tensor([list(args.prompt.encode())], device=device)
    with autocast_for(args, device):  # DDP's module generates alone: no gradients, nothing to synchronise
        idx = getattr(model, "module", model).generate(idx, args.sample_tokens,
                                                       torch.Generator(device=device).manual_seed(args.seed))
    reshard(model)
    model.train()
    return bytes(idx[0].tolist()).decode("utf-8", errors="replace")


def check_world(args, world_size):
    if args.parallel == "none" and world_size > 1:
        sys.exit(f"--parallel none runs one process, got WORLD_SIZE={world_size}: use ddp, fsdp or hsdp")
    if args.parallel == "hsdp" and world_size % args.replicate_degree:
        sys.exit(f"--replicate-degree {args.replicate_degree} must divide the world size {world_size}")


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
