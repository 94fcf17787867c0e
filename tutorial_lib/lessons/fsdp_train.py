"""A small transformer trained with DDP, FSDP2 (fully_shard) or FSDP1, with exact per-rank memory accounting.

Run card
    python fsdp_train.py --strategy fsdp2 --max-steps 5                         # one process, a world of 1
    torchrun --nproc-per-node 2 fsdp_train.py --strategy ddp --max-steps 5      # every rank a full replica
    torchrun --nproc-per-node 2 fsdp_train.py --strategy fsdp2 --max-steps 5    # state sharded over 2 ranks
    torchrun --nproc-per-node 2 fsdp_train.py --strategy fsdp2 --precision bf16 --activation-checkpointing
    torchrun --nproc-per-node 2 fsdp_train.py --strategy fsdp1 --wrap fine      # the seed's min_num_params=100
    torchrun --nproc-per-node 2 fsdp_train.py --strategy fsdp2 --precision fp16 # CUDA only, with a GradScaler
    torchrun --nproc-per-node 2 fsdp_train.py --strategy fsdp2 --compile      # each block compiled, then sharded

What it shows
    * DDP keeps the whole model, its gradients and the optimizer state on every rank; FSDP shards all
      three: each rank owns 1/world_size of every parameter (FSDP2: a DTensor ``Shard(0)`` per parameter;
      FSDP1: one flat, padded parameter per wrapped unit) and all-gathers a unit only while it runs;
    * the optimizer is built *after* sharding, so its state is created for the local shards only;
    * a mixed-precision policy computes in bf16 but keeps fp32 shards, fp32 gradients and fp32 optimizer
      state: it saves activation memory and all-gather traffic, not persistent state;
    * activation checkpointing keeps only each block's input and recomputes the rest in backward;
    * wrap granularity: one FSDP unit per block, one unit for the whole model, or one per Linear.

Only torch and the Python standard library are used, so the file can be copied to a cluster as is. In a workbook run,
``_workbook.py`` beside it adds the notebooks' measurements, each reached from a line marked ``# workbook``: one JSON
line per step per rank in ``<metrics-dir>/rank<RANK>.jsonl`` with the exact bytes of this rank's parameters, gradients
and optimizer state (local shards), the bytes saved for backward (activations), RSS on CPU and the allocator peak on
CUDA; ``<metrics-dir>/model_rank<RANK>.json`` with the parameter shapes (for the analytic memory model) and the FSDP
units.
"""

import argparse
import contextlib
import functools
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record

try:  # the workbook's instruments, written beside this file in a workbook run; a copy trains without them
    import _workbook as workbook
except ImportError:
    workbook = None


class NoRecorder:  # stands in for _workbook's recorder in a copy without _workbook.py: every call does nothing
    def __getattr__(self, name):
        return lambda *args, **kwargs: contextlib.nullcontext()  # (and is an empty `with` where one is expected)


STRATEGIES = ("ddp", "fsdp2", "fsdp1")
PRECISIONS = ("fp32", "bf16", "fp16")
WRAPS = ("block", "none", "fine")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--strategy", choices=STRATEGIES, default="fsdp2",
                   help="ddp: replicate; fsdp2: torch.distributed.fsdp.fully_shard; fsdp1: FullyShardedDataParallel")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32; bf16: compute in bfloat16, fp32 shards and reduce; fp16: CUDA only, with a grad scaler")
    p.add_argument("--grad-scaler", choices=["auto", "on", "off"], default="auto",
                   help="torch.amp.GradScaler (ShardedGradScaler with fsdp1): auto = on for fp16 only; off with "
                        "fp16 is the seed's mistake (gradients underflow)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each block's activations in backward (non-reentrant checkpoint)")
    p.add_argument("--wrap", choices=WRAPS, default="block",
                   help="FSDP units: block = one per transformer block + root; none = root only; "
                        "fine = one per Linear (fsdp2) / size_based_auto_wrap_policy(min_num_params=100) (fsdp1)")
    p.add_argument("--cpu-offload", action="store_true",
                   help="fsdp2 only: keep shards, gradients and optimizer state in CPU memory (CPUOffloadPolicy)")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                   help="adamw: 2 fp32 states per parameter; sgd (no momentum): none")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate (unitless)")
    p.add_argument("--vocab-size", type=int, default=1024, help="tokens in the vocabulary (count)")
    p.add_argument("--dim", type=int, default=192, help="model width (count)")
    p.add_argument("--n-layers", type=int, default=4, help="transformer blocks (count)")
    p.add_argument("--n-heads", type=int, default=4, help="attention heads; must divide --dim (count)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sample (count)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank per micro-batch (count)")
    p.add_argument("--grad-accum-steps", type=int, default=1, help="micro-batches per optimizer step (count)")
    p.add_argument("--max-steps", type=int, default=5, help="optimizer steps (count)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and of the synthetic data")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0,
                   help="collective timeout of the process group (seconds); torch's default is 10 minutes on NCCL, 30 on gloo")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl on cuda, gloo on cpu (gloo also moves cuda tensors: "
                        "tl.run_in_process uses it so no NCCL runs inside a notebook's kernel)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block (in place) before wrapping: torchtitan's order (checkpoint, "
                        "compile, shard); ddp and fsdp2")
    p.add_argument("--compile-backend", type=str, default="inductor",
                   help="torch.compile's backend: inductor (generates kernels; needs a C++ compiler on CPU), or "
                        "aot_eager (traces forward and backward, runs them eagerly: quick to compile)")
    p.add_argument("--no-optimize-ddp", action="store_true",
                   help="ddp + compile: torch._dynamo.config.optimize_ddp = False (one graph, no split at buckets)")
    if workbook:  # workbook
        workbook.add_fsdp_flags(p)  # workbook: --metrics-dir
    return check_args(p, p.parse_args(argv))


def check_args(p, args):
    """Refuse bad values before anything starts, naming the flag and the value (argparse exits with 2)."""
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "seq_len", "batch_size", "grad_accum_steps", "max_steps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.dim % args.n_heads:
        p.error(f"--n-heads must divide --dim, got --dim {args.dim} --n-heads {args.n_heads}")
    if args.pg_timeout_s <= 0:
        p.error(f"--pg-timeout-s must be > 0, got {args.pg_timeout_s}")
    if args.compile and args.strategy == "fsdp1":
        p.error("--compile is implemented for --strategy ddp and fsdp2 (each block compiled, then wrapped), got fsdp1")
    if args.no_optimize_ddp and not (args.compile and args.strategy == "ddp"):
        p.error("--no-optimize-ddp changes how torch.compile splits DDP's graph: it needs --compile --strategy ddp")
    if args.cpu_offload and args.strategy != "fsdp2":
        p.error(f"--cpu-offload is implemented for --strategy fsdp2 only, got --strategy {args.strategy}")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.precision == "fp16" and not use_cuda:
        # fp16 matmuls on CPU are emulated and extremely slow (a 2048^3 matmul took 43 s on the lesson machine).
        p.error("--precision fp16 needs CUDA: fp16 compute on CPU is unusably slow; use --precision bf16 on CPU")
    return args


def setup(args):
    """Join the process group when launched by torchrun; return (rank, local_rank, world_size, device)."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): "
                 "use --device cpu, or a machine with a GPU and a CUDA build of torch")
    if use_cuda:
        device = torch.device("cuda", local_rank)  # LOCAL_RANK: the GPU index on this node, not the global RANK
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = ("nccl" if use_cuda else "gloo") if args.backend == "auto" else args.backend
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=args.pg_timeout_s),
                                device_id=device if backend == "nccl" else None)
    elif args.strategy != "ddp":
        # FSDP needs a process group even alone: a world of one over an in-memory store (no network, no torchrun).
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=args.pg_timeout_s))
    return rank, local_rank, world_size, device


def cleanup():
    if dist.is_initialized():
        dist.destroy_process_group()


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP, each with a residual."""

    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(attn)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab_size, dim, n_layers, n_heads, seq_len):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def global_batch(step, args, world_size):
    """Token sequences of one optimizer step for *all* ranks and micro-steps (identical on every rank).

    ``grad_accum_steps * world_size * batch_size`` samples; micro-step m of rank r takes rows
    ``[(m * world_size + r) * batch_size, ... + batch_size)``, so any split of the same global batch (more ranks,
    more micro-steps, smaller micro-batches) sees the same samples and computes the same mean loss.
    The target of each position is its token mapped by a fixed permutation: synthetic and quickly learnable.
    """
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    n = args.grad_accum_steps * world_size * args.batch_size
    x = torch.randint(0, args.vocab_size, (n, args.seq_len), generator=g)
    perm = torch.randperm(args.vocab_size, generator=torch.Generator().manual_seed(args.seed + 17))
    return x, perm[x]


def apply_checkpointing(model):
    """Wrap every Block in a non-reentrant checkpoint wrapper (the seed's call, with the imports it lacked)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: isinstance(m, Block))


def wrap_fsdp2(model, args, device):
    """fully_shard bottom-up: each unit all-gathers its parameters just before it runs and frees them after."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
    kwargs = {}
    if args.precision != "fp32":
        # Compute (and all-gather) in bf16/fp16, but reduce-scatter gradients in fp32: the shards, their
        # gradients and the optimizer state stay fp32 ("master weights").
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype_of(args.precision), reduce_dtype=torch.float32)
    if args.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")  # pinning needs CUDA
    units = []
    if args.wrap == "fine":
        units = [m for m in model.modules() if isinstance(m, nn.Linear)]
    elif args.wrap == "block":
        units = [m for m in model.modules() if isinstance(m, Block) or type(m).__name__ == "CheckpointWrapper"]
        units = [m for m in units if not any(m is not u and m in list(u.modules()) for u in units)]  # outermost
    for module in units:
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)  # the root: embedding, norm, head and everything not in a unit above
    if dist.get_backend() == "gloo":
        # FSDP2 averages fp32/bf16 gradients with a ReduceOp.AVG reduce-scatter, which gloo's reduce-scatter in
        # torch 2.8 silently treats as a sum (pytorch/pytorch#162338): gradients world_size times too large.
        # Sum, then divide: right on every version (notebook 09 measures both).
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    return model


def wrap_fsdp1(model, args, device):
    """FullyShardedDataParallel with an auto-wrap policy *bound* with functools.partial (seed 001, corrected)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy
    if args.wrap == "fine":
        # The seed called size_based_auto_wrap_policy(min_num_params=100) directly: TypeError (it is the policy
        # itself, FSDP calls it per module). Bound with partial it works, and wraps nearly every layer.
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
    elif args.wrap == "block":
        block_types = {Block}
        if args.activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
            block_types = {CheckpointWrapper}
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=block_types)
    else:
        policy = None
    mp = None
    if args.precision != "fp32":
        mp = MixedPrecision(param_dtype=dtype_of(args.precision), reduce_dtype=torch.float32,
                            buffer_dtype=dtype_of(args.precision))
    # device_id is required on CPU too ("FSDP needs a non-CPU accelerator device" without it).
    return FSDP(model, auto_wrap_policy=policy, mixed_precision=mp, device_id=device)


def dtype_of(precision):
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def build(args, device):
    """This rank's model: the whole model (DDP) or its shards (FSDP2, FSDP1), with activation checkpointing if asked."""
    # Same seed on every rank: DDP would broadcast rank 0's weights anyway, FSDP does not (each rank keeps its
    # own shard of what *it* initialised), so without this the shards would come from different models.
    torch.manual_seed(args.seed)
    model = TinyTransformer(args.vocab_size, args.dim, args.n_layers, args.n_heads, args.seq_len).to(device)
    shapes = {name: list(p.shape) for name, p in model.named_parameters()}  # workbook: for the memory model
    if args.activation_checkpointing:
        apply_checkpointing(model)  # before wrapping: FSDP then shards the wrapped blocks
    if args.compile:
        if args.no_optimize_ddp:
            torch._dynamo.config.optimize_ddp = False  # no split at DDP's buckets: one graph
        for block in model.blocks:
            # In place, before sharding: FSDP2's hooks stay outside each block's graph, so a compiled block
            # all-gathers and reduce-scatters exactly as the eager one does (notebook 14 counts them).
            block.compile(backend=args.compile_backend)
    if args.strategy == "ddp":
        if dist.is_initialized():
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    elif args.strategy == "fsdp2":
        model = wrap_fsdp2(model, args, device)
    else:
        model = wrap_fsdp1(model, args, device)
    return model, shapes


def make_scaler(args, device):
    """A gradient scaler for fp16 (``--grad-scaler auto``), or ``None``: bf16 and fp32 need none."""
    if not (args.grad_scaler == "on" or (args.grad_scaler == "auto" and args.precision == "fp16")):
        return None
    if args.strategy == "fsdp1":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        return ShardedGradScaler(device.type)  # unscales and checks inf/nan across all ranks' shards
    return torch.amp.GradScaler(device.type)  # not the deprecated torch.cuda.amp.GradScaler of seed 000


def train(args, rank, world_size, device):
    model, shapes = build(args, device)
    # Built after wrapping: with FSDP it sees the local shards, so its state is sharded too.
    optimizer_class = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.SGD
    optimizer = optimizer_class(model.parameters(), lr=args.lr)
    scaler = make_scaler(args, device)
    # DDP has no mixed-precision policy: autocast casts per op instead (FSDP2/FSDP1 get it from the policy).
    autocast = args.strategy == "ddp" and args.precision != "fp32"
    recorder = (workbook.FSDPStepRecorder(args, rank, world_size, device, model, optimizer, scaler, shapes)  # workbook
                if workbook else NoRecorder())  # workbook
    for step in range(1, args.max_steps + 1):
        t0 = time.perf_counter()
        recorder.step_start()  # workbook: this step's measurements start from zero
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=device)
        xs, ys = global_batch(step, args, world_size)
        for micro in range(args.grad_accum_steps):
            first = (micro * world_size + rank) * args.batch_size  # this rank's rows of this micro-step
            x, y = xs[first:first + args.batch_size].to(device), ys[first:first + args.batch_size].to(device)
            # DDP: all-reduce only on the last micro-step (no_sync). FSDP reduce-scatters on every micro-step on
            # purpose: skipping it (FSDP2 set_requires_gradient_sync(False), FSDP1 no_sync) would keep unsharded
            # gradients between micro-steps, the memory that sharding saves.
            skip_sync = args.strategy == "ddp" and dist.is_initialized() and micro < args.grad_accum_steps - 1
            with model.no_sync() if skip_sync else contextlib.nullcontext():
                with recorder.saved_activations():  # workbook: the bytes this forward keeps for backward
                    with torch.autocast(device.type, dtype=dtype_of(args.precision), enabled=autocast):
                        logits = model(x)
                        loss = F.cross_entropy(logits.float().view(-1, args.vocab_size), y.view(-1)) / args.grad_accum_steps
                (scaler.scale(loss) if scaler else loss).backward()  # DDP all-reduces / FSDP reduce-scatters here
            loss_sum += loss.detach()
        recorder.gradients()  # workbook: gradient elements that underflowed (fp16), the scale backward used
        if scaler:
            scaler.step(optimizer)  # unscales, and skips the step if any rank's gradients hold inf/nan
            scaler.update()
        else:
            optimizer.step()
        loss_global = loss_sum.clone()
        if dist.is_initialized():
            dist.all_reduce(loss_global)  # the rank's loss is local; the global mean needs a collective
            loss_global /= world_size
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # CUDA runs asynchronously: wait before reading the clock
        step_time_s = time.perf_counter() - t0
        recorder.step_done(step, loss_sum, loss_global, step_time_s)  # workbook: one JSON line per step
        sys.stdout.write(f"step {step}/{args.max_steps} loss_global {loss_global.item():.5f} "
                         f"step_time_s {step_time_s:.3f}\n")  # one write per line: ranks never interleave
    recorder.close()  # workbook
    if dist.is_initialized():
        dist.barrier()  # nobody tears the process group down while a peer still uses it


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    rank, local_rank, world_size, device = setup(args)
    try:
        train(args, rank, world_size, device)
    finally:
        cleanup()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
