"""Tensor and sequence parallelism on a GPT-style transformer, then 2-D (FSDP x TP), each checked against one process.

Run card
    torchrun --nproc-per-node 2 tensor_parallel.py --lessons block sequence model   # a 1-D mesh of 2 ranks
    torchrun --nproc-per-node 4 tensor_parallel.py --lessons 2d                     # a (2, 2) mesh: dp x tp
    python tensor_parallel.py --lessons block sequence model                        # a world of one (mesh of 1)
    torchrun --nproc-per-node 2 tensor_parallel.py --lessons model --optimizer adamw --track-memory  # memory

What it shows (every lesson builds the same model from the same seed, and the same model unsharded as "one process")
    * block: ``parallelize_module`` with ``ColwiseParallel`` on the attention's q, k, v projections and the MLP's
      first Linear, ``RowwiseParallel`` on the attention output and the MLP's second Linear (Megatron-LM's split:
      each rank holds whole heads and a slice of the MLP's hidden units). Per block: one all-reduce after the
      attention and one after the MLP in forward, one for each input gradient in backward; the input is made a
      DTensor once per sub-module (``PrepareModuleInput``), or q, k and v each all-reduce their own input
      gradient. Which weights each rank holds, the activation bytes each rank saves for backward (per module),
      and outputs and gradients against one process. A control: a nanoGPT-style fused qkv Linear split the same
      way gives every rank parts of q, k and v of different heads, and a wrong output.
    * sequence: ``SequenceParallel`` on the norms and ``PrepareModuleInput`` from ``Shard(1)``: the all-reduces
      become an all-gather (into the attention / MLP) and a reduce-scatter (out of them), and the norms' activations
      are split along the sequence.
    * model: the whole model (embedding, blocks, final norm, vocabulary-parallel head) trained a few SGD steps with
      ``loss_parallel`` (the cross-entropy computed on vocabulary shards, logits never gathered), with and without
      sequence parallelism: collectives per step, activation bytes per rank, and the loss of every step against one
      process trained on the same batches.
    * 2d: a (dp, tp) ``DeviceMesh``: tensor parallel inside each tp group, FSDP2 (``fully_shard``) across the dp
      groups; which rows of a weight each rank holds, which group runs which collective, and the loss of each
      data-parallel group (and their mean) against one process on the same rows.

Rank 0 prints each output's and each step's loss against one process. In a workbook run, ``_workbook.py`` beside it
measures what notebook 12 reads: collectives counted with torch.profiler (each is one c10d dispatcher op whatever the
backend), which process group ran each (a ``TorchDispatchMode``), activation bytes (every tensor autograd saves for
backward passes a ``saved_tensors_hooks`` pack hook), who holds which rows, and a fused-qkv control; each rank
writes ``<metrics-dir>/tp_rank<RANK>.json``. Only torch and the Python standard library.
"""

import argparse
import contextlib
import os
import sys
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, loss_parallel, parallelize_module)

try:  # the workbook's instruments, written beside this file in a workbook run; a copy runs without them
    import _workbook as workbook
except ImportError:
    workbook = None

LESSONS = ("block", "sequence", "model", "2d")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lessons", nargs="+", choices=LESSONS, default=["block", "sequence", "model"],
                   help="what to run, in this order (2d needs an even world of at least 4 ranks)")
    p.add_argument("--vocab-size", type=int, default=128, help="vocabulary size (count; divisible by the tp size)")
    p.add_argument("--dim", type=int, default=64, help="model width (count)")
    p.add_argument("--n-heads", type=int, default=8,
                   help="attention heads (count; divisible by the tp size: 8 fits 1, 2, 4 and 8 ranks)")
    p.add_argument("--n-layers", type=int, default=2, help="transformer blocks of the model lessons (count)")
    p.add_argument("--seq-len", type=int, default=16, help="tokens per sequence (count; divisible by the tp size)")
    p.add_argument("--batch-size", type=int, default=4,
                   help="sequences per step (count); in 2d, per data-parallel group")
    p.add_argument("--max-steps", type=int, default=3, help="SGD steps of the model and 2d lessons (count, >= 2)")
    p.add_argument("--lr", type=float, default=0.5, help="learning rate (unitless)")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="sgd",
                   help="optimizer of the model lesson: sgd (no state) or adamw (2 fp32 moments per parameter)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and of the synthetic data")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl on cuda, gloo on cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0,
                   help="collective timeout of the process group (seconds); torch's default is 10 minutes on NCCL, "
                        "30 on gloo")
    if workbook:  # workbook
        workbook.add_tp_flags(p)  # workbook: --metrics-dir, --track-memory
    args = p.parse_args(argv)
    for name in ("vocab_size", "dim", "n_heads", "n_layers", "seq_len", "batch_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.dim % args.n_heads:
        p.error(f"--n-heads must divide --dim, got --dim {args.dim} --n-heads {args.n_heads}")
    if args.max_steps < 2:
        p.error(f"--max-steps must be >= 2 (the first step is profiled, the second shows the update), got "
                f"{args.max_steps}")
    if args.lr <= 0 or args.pg_timeout_s <= 0:
        p.error(f"--lr and --pg-timeout-s must be > 0, got {args.lr}, {args.pg_timeout_s}")
    if workbook:  # workbook
        workbook.check_tp_flags(p, args)  # workbook
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False (no GPU visible, or a CPU-only torch build); "
                "use --device cpu or --device auto")
    return args


def check_world(args, world_size):
    """Refuse, before any lesson runs, sizes that the tensor-parallel split cannot divide.

    Raises: ValueError naming the flag, its value and the tp size (the world for block/sequence/model, 2 for 2d).
    """
    sizes = ([world_size] if {"block", "sequence", "model"} & set(args.lessons) else []) + \
        ([2] if "2d" in args.lessons else [])
    if "2d" in args.lessons and (world_size < 4 or world_size % 2):
        raise ValueError(f"--lessons 2d needs an even world of at least 4 ranks (a (WORLD_SIZE // 2, 2) mesh), got "
                         f"WORLD_SIZE={world_size}; run it with torchrun --nproc-per-node 4")
    for tp in sizes:
        for flag, value in (("--n-heads", args.n_heads), ("--vocab-size", args.vocab_size),
                            ("--seq-len", args.seq_len)):
            if value % tp:
                raise ValueError(f"{flag} {value} is not divisible by the tensor-parallel size {tp}: every rank must "
                                 f"hold whole heads, an equal slice of the vocabulary and of the sequence")


def largest_tp_size(ranks, args=None):
    """The largest tensor-parallel size from 2 to ``ranks`` that ``check_world`` accepts for ``args`` (default: the
    script's defaults), or 0 when none does: a notebook with 3 GPUs runs TP on 2 of them."""
    args = parse_args([]) if args is None else args
    for n in range(ranks, 1, -1):
        try:
            check_world(args, n)
            return n
        except ValueError:
            continue
    return 0


def setup(args):
    """Join the process group (a world of one over an in-memory store without torchrun).

    Returns: (rank, world size, device)."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # LOCAL_RANK: the GPU index on this node
    backend = ("nccl" if use_cuda else "gloo") if args.backend == "auto" else args.backend
    timeout = timedelta(seconds=args.pg_timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:  # a DeviceMesh needs a process group even alone
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), device


# --- the model: a GPT-style decoder (pre-norm blocks, causal attention with SDPA, a GELU MLP) -----------------------

class Attention(nn.Module):
    """Causal self-attention with separate q, k, v projections: ColwiseParallel gives each rank its heads' columns of
    each. A fused qkv Linear (nanoGPT's ``c_attn``, laid out [q | k | v]) split the same way gives rank 0 q and part
    of k (``fused_qkv_control``); it needs its columns regrouped per head before the split."""

    def __init__(self, dim, n_heads):
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        # -1, not n_heads: under tensor parallelism each rank's q, k, v hold only its own heads
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, n_heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Embedding(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, vocab_size, dim, seq_len):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, dim), nn.Embedding(seq_len, dim)

    def forward(self, tokens):
        return self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))


class GPT(nn.Module):
    def __init__(self, vocab_size, dim, n_heads, n_layers, seq_len):
        super().__init__()
        self.embed = Embedding(vocab_size, dim, seq_len)
        self.blocks = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# --- the parallel plans: which module is split how ------------------------------------------------------------------

def block_plan(sequence_parallel=False, prepare_input=True):
    """``parallelize_module`` plan of one Block, keys relative to the block.

    Colwise (output features split) then Rowwise (input features split): the pair needs no collective in between,
    and one at the end: an all-reduce of the partial sums (Replicate), or with sequence parallelism a reduce-scatter
    along the sequence (Shard(1)). The norms then run on sequence shards, and the input of the attention and of the
    MLP is all-gathered back to the whole sequence first.
    """
    between = Shard(1) if sequence_parallel else Replicate()  # the layout of activations between sub-modules
    plan = {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=between),
            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=between)}
    if prepare_input:
        # Make the input a DTensor once for q, k and v together: their three partial input gradients are summed
        # locally and reduced once. Without it each projection converts (and in backward reduces) its own.
        plan["attn"] = PrepareModuleInput(input_layouts=(between,), desired_input_layouts=(Replicate(),))
        plan["mlp"] = PrepareModuleInput(input_layouts=(between,), desired_input_layouts=(Replicate(),))
    if sequence_parallel:
        plan["norm1"], plan["norm2"] = SequenceParallel(), SequenceParallel()
    return plan


def model_plan(n_layers, sequence_parallel=False, vocab_parallel_loss=True):
    """Plan of the whole GPT: every block as ``block_plan``, the head split over the vocabulary.

    The embeddings stay whole on every rank (small here); with sequence parallelism their output is cut along the
    sequence (no communication) for the first norm. With ``vocab_parallel_loss`` the head's output stays a DTensor
    sharded over the vocabulary, for ``loss_parallel``; otherwise it is all-gathered into whole logits.
    """
    plan = {f"blocks.{i}.{key}": style for i in range(n_layers)
            for key, style in block_plan(sequence_parallel).items()}
    if sequence_parallel:
        plan["embed"] = PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),))
        plan["norm"] = SequenceParallel()
    plan["head"] = ColwiseParallel(input_layouts=Shard(1) if sequence_parallel else Replicate(),
                                   output_layouts=Shard(-1) if vocab_parallel_loss else Replicate(),
                                   use_local_output=not vocab_parallel_loss)
    return plan


def build(module_cls, args, device):
    """A Block or the GPT, from the seed: the same weights on every rank and in the one-process reference."""
    torch.manual_seed(args.seed)
    if module_cls is GPT:
        return GPT(args.vocab_size, args.dim, args.n_heads, args.n_layers, args.seq_len).to(device)
    return module_cls(args.dim, args.n_heads).to(device)


def batch(args, step, device, rows=None):
    """Token batch of one step (the same on every rank): inputs and next-token-like targets (a fixed permutation)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    n = rows or args.batch_size
    x = torch.randint(0, args.vocab_size, (n, args.seq_len), generator=g)
    perm = torch.randperm(args.vocab_size, generator=torch.Generator().manual_seed(args.seed + 17))
    return x.to(device), perm[x].to(device)


def local(t):
    """This rank's part of a tensor: the local shard of a DTensor, the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def whole(t):
    """The whole tensor: a DTensor gathered (``full_tensor``: Shard all-gathered, Partial reduced)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


# --- the lessons ---------------------------------------------------------------------------------------------------

def measured(name, *args):  # workbook: the workbook's measurement `name` around a block of code, or none (a copy alone)
    return getattr(workbook, name)(*args) if workbook else contextlib.nullcontext({})  # workbook


def run_block(block, x):
    """Forward and backward of one block on ``x`` (a leaf); loss = sum of squares / 2."""
    x = x.detach().clone().requires_grad_(True)
    with measured("tp_block_pass", block, "forward") as forward:  # workbook: collectives, activation bytes
        y = block(x)
    with measured("tp_block_pass", block, "backward") as backward:  # workbook: collectives
        (y.float().pow(2).sum() / 2).backward()
    return {"output": y.detach(), "input_grad": x.grad,
            "grads": {n: whole(p.grad) for n, p in block.named_parameters()}, **forward, **backward}


def say(rank, label, run, reference):
    """Rank 0 prints how far a run's output is from one process's."""
    if rank == 0:
        diff = (run["output"] - reference["output"]).abs().max().item()
        sys.stdout.write(f"{label}: output max |difference| from one process {diff:.2e}\n")


def lesson_block(args, rank, world_size, device):
    """One Block under tensor parallelism: forward and backward against the unsharded block on the same input."""
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("tp",))
    x = torch.randn(2, args.seq_len, args.dim, generator=torch.Generator().manual_seed(args.seed + 1)).to(device)
    one = run_block(build(Block, args, device), x)  # one process: the whole block
    runs = {}
    for label, plan in [("TP", block_plan()), ("TP, q/k/v each ColwiseParallel", block_plan(prepare_input=False))]:
        block = parallelize_module(build(Block, args, device), mesh, plan)
        runs[label] = block, run_block(block, x)
        say(rank, f"block, {label}", runs[label][1], one)
    if workbook:  # workbook: summaries, comparisons, shards and the fused-qkv control
        return workbook.tp_block_records(one, runs, build(Block, args, device), mesh, x)  # workbook
    return {}


def lesson_sequence(args, rank, world_size, device):
    """The same Block with sequence parallelism: each rank passes in and gets out its slice of the sequence."""
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("tp",))
    x = torch.randn(2, args.seq_len, args.dim, generator=torch.Generator().manual_seed(args.seed + 1)).to(device)
    one = run_block(build(Block, args, device), x)
    block = parallelize_module(build(Block, args, device), mesh, block_plan(sequence_parallel=True))
    run = run_block(block, x.chunk(world_size, dim=1)[rank])  # this rank's tokens only
    reference = {**one, "output": one["output"].chunk(world_size, dim=1)[rank],
                 "input_grad": one["input_grad"].chunk(world_size, dim=1)[rank]}
    say(rank, "sequence, SP (rank 0's tokens)", run, reference)
    return workbook.tp_sequence_record(run, reference, one, block) if workbook else {}  # workbook


def train_step(model, optimizer, x, y):
    """One optimizer step of the tensor-parallel GPT: forward to vocabulary-sharded logits, the cross-entropy on the
    shards (``loss_parallel``), backward, step. Returns (loss, logits), DTensors."""
    logits = model(x)  # a DTensor sharded over the vocabulary: each rank holds V / tp of every row
    with loss_parallel():  # cross-entropy on vocabulary shards: max, sum-exp and target all-reduced
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, logits


def build_optimizer(args, model):
    """SGD (no state), or AdamW with ``foreach=False`` (two fp32 moments per parameter element, a loop of per-tensor
    updates: torch's memory tracker in fake mode counts its state exactly)."""
    if args.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False)
    return torch.optim.SGD(model.parameters(), lr=args.lr)


def lesson_model(args, rank, world_size, device):
    """The whole GPT, a few SGD steps with loss_parallel, with and without sequence parallelism."""
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("tp",))
    out = {}
    for label, sp in [("TP", False), ("TP + SP", True)]:
        reference = build(GPT, args, device)  # one process, trained on the same batches
        model = parallelize_module(build(GPT, args, device), mesh, model_plan(args.n_layers, sequence_parallel=sp))
        optimizer, ref_optimizer = build_optimizer(args, model), build_optimizer(args, reference)
        steps = []
        for step in range(1, args.max_steps + 1):
            x, y = batch(args, step, device)
            with measured("tp_model_step", args, step, model, optimizer) as record:  # workbook: collectives, ...
                loss, logits = train_step(model, optimizer, x, y)
            ref_loss = F.cross_entropy(reference(x).flatten(0, 1), y.flatten())
            ref_loss.backward()
            ref_optimizer.step()
            ref_optimizer.zero_grad(set_to_none=True)
            steps.append({"step": step, "loss": whole(loss).item(), "loss_one_process": ref_loss.item(), **record})
            if rank == 0:
                sys.stdout.write(f"model, {label}, step {step}: loss {steps[-1]['loss']:.6f}, one process "
                                 f"{steps[-1]['loss_one_process']:.6f}\n")
        out[label] = {"steps": steps, **(workbook.tp_model_record(model, reference, logits) if workbook else {})}  # workbook
    return out


def lesson_2d(args, rank, world_size, device):
    """FSDP2 across the dp dimension, tensor parallel within the tp dimension, on a (world // 2, 2) mesh."""
    from torch.distributed.fsdp import FSDPModule, fully_shard
    mesh = init_device_mesh(device.type, (world_size // 2, 2), mesh_dim_names=("dp", "tp"))
    dp_rank, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
    reference = build(GPT, args, device)
    model = build(GPT, args, device)
    # 1. tensor parallel inside each tp group (whole logits here: a plain cross-entropy, every collective visible)
    parallelize_module(model, mesh["tp"], model_plan(args.n_layers, vocab_parallel_loss=False))
    # 2. FSDP2 across the dp groups, on the TP-sharded parameters: one unit per block, then the root
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    if dist.get_backend() == "gloo":  # FSDP2's ReduceOp.AVG reduce-scatter sums on gloo in torch 2.8 (pytorch#162338)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    holdings = workbook.tp_2d_holdings(model, reference) if workbook else {}  # workbook: who holds which rows
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=args.lr)
    steps = []
    for step in range(1, args.max_steps + 1):
        x, y = batch(args, step, device, rows=dp_size * args.batch_size)  # the global batch of every dp group
        rows = slice(dp_rank * args.batch_size, (dp_rank + 1) * args.batch_size)  # this dp group's rows
        with measured("tp_2d_step", step) as record, warnings.catch_warnings():  # workbook: collectives, groups
            # torch 2.13's FSDP2 warns when a module returns a view (in-place ops on it would skip a hook): the
            # head's whole logits (DTensor.to_local()) are one, and nothing here modifies them in place.
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
            loss = F.cross_entropy(model(x[rows]).flatten(0, 1), y[rows].flatten())
            loss.backward()  # TP all-reduces in the tp group; FSDP reduce-scatters gradients in the dp group
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():  # one process, on this dp group's rows only, before its step on the whole batch
            ref_rows_loss = F.cross_entropy(reference(x[rows]).flatten(0, 1), y[rows].flatten()).item()
        ref_loss = F.cross_entropy(reference(x).flatten(0, 1), y.flatten())
        ref_loss.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad(set_to_none=True)
        steps.append({"step": step, "loss": loss.item(), "loss_one_process_same_rows": ref_rows_loss,
                      "loss_one_process_whole_batch": ref_loss.item(), **record})
        if mesh["tp"].get_local_rank() == 0:
            sys.stdout.write(f"2d, dp group {dp_rank}, step {step}: loss {loss.item():.6f}, one process on its rows "
                             f"{ref_rows_loss:.6f}\n")
    if workbook:  # workbook
        return workbook.tp_2d_record(mesh, dp_rank, holdings, steps, model, reference)  # workbook
    return {"steps": steps}


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    # torch 2.13's profiler logs each start and stop on stderr, and 2.8's CUDA wheel on a machine without a GPU an
    # error per profile (gpuGetDeviceCount): the counts are what this script wants from it.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    rank, world_size, device = setup(args)
    try:
        check_world(args, world_size)  # before any lesson: a late refusal would waste the earlier ones
        lessons = {"block": lesson_block, "sequence": lesson_sequence, "model": lesson_model, "2d": lesson_2d}
        result = {"rank": rank, "world_size": world_size, "torch": torch.__version__, "device": str(device),
                  "args": vars(args)}
        for name in args.lessons:
            result[name] = lessons[name](args, rank, world_size, device)
            if rank == 0:
                sys.stdout.write(f"{name}: done on {world_size} rank(s)\n")
            dist.barrier()
        if workbook:  # workbook
            path = workbook.write_rank_json(args, "tp_rank<RANK>.json", result)  # workbook: what notebook 12 reads
            sys.stdout.write(f"rank {rank}: {', '.join(args.lessons)} done; every number in {path.resolve()}\n")  # workbook
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
