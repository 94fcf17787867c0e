"""FSDP2's knobs, measured on every rank: when to reshard, HSDP on a 2-D mesh, accumulation, gradient clipping.

Run card
    torchrun --nproc-per-node 4 fsdp_knobs.py --lessons reshard hsdp      # an int reshard and a 2x2 mesh need 4
    torchrun --nproc-per-node 2 fsdp_knobs.py --lessons averaging accumulation clipping
    python fsdp_knobs.py --lessons reshard averaging accumulation clipping   # a world of one

What it shows (each lesson builds the same small model again, from the same seed)
    * reshard: ``fully_shard(module, reshard_after_forward=...)``. True frees a unit's gathered parameters after
      its forward and all-gathers them again in backward; False keeps them until backward (no second all-gather,
      but every unit stays gathered between forward and backward); an int k reshards to groups of k ranks after
      forward, so the backward all-gather runs inside a group of k; the default (None) is True for inner units
      and False for the root.
    * hsdp: FSDP1's HYBRID_SHARD in FSDP2 terms: ``fully_shard(module, mesh=2-D DeviceMesh)`` with dimensions
      ("replicate", "shard"): a parameter is sharded inside a shard group and replicated across the replicate
      groups; gradients are reduce-scattered inside the shard group, then all-reduced across the replicate group.
      Also NO_SHARD (a shard dimension of size 1) and HYBRID_SHARD without the backward re-gather.
    * accumulation: ``set_requires_gradient_sync(False)`` on every micro-batch but the last: one reduce-scatter
      per unit per optimizer step instead of one per micro-batch, and the same gradients.
    * averaging: the gradients against one process's on the whole batch, with FSDP2's default ReduceOp.AVG
      reduce-scatter and with ``set_force_sum_reduction_for_comms(True)`` (sum, then divide); on gloo the
      default is wrong on torch 2.8 (pytorch/pytorch#162338), so every other lesson here sums then divides.
    * clipping: ``clip_grad_norm_`` on FSDP2's DTensor gradients returns a DTensor; its ``full_tensor()`` equals
      DDP's norm on the same data, each rank's gradient shards have their own norm, and the clipped gradients
      equal DDP's.

Every collective is counted with torch.profiler: each c10d collective is a dispatcher op (``c10d::_allgather_base_``
all-gather, ``c10d::_reduce_scatter_base_`` reduce-scatter, ``c10d::allreduce_`` all-reduce) whatever the backend.
Each rank writes ``<metrics-dir>/knobs_rank<RANK>.json``; rank 0 prints a few lines per lesson. Only torch and the Python standard library.
"""

import argparse
import collections
import contextlib
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record

LESSONS = ("reshard", "hsdp", "accumulation", "clipping", "averaging")
COLLECTIVES = {"c10d::_allgather_base_": "all_gather", "c10d::_reduce_scatter_base_": "reduce_scatter",
               "c10d::allreduce_": "all_reduce"}  # (FSDP1 on gloo all-gathers into a list: c10d::allgather_)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--lessons", nargs="+", choices=LESSONS, default=["reshard", "averaging", "accumulation", "clipping"],
                   help="what to run, in this order (hsdp needs an even world of at least 4 ranks; reshard's int "
                        "variant runs only on such a world)")
    p.add_argument("--dim", type=int, default=64, help="model width (count)")
    p.add_argument("--n-layers", type=int, default=3, help="residual MLP blocks, one FSDP unit each (count)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank per micro-batch (count)")
    p.add_argument("--grad-accum-steps", type=int, default=4, help="micro-batches per optimizer step (count)")
    p.add_argument("--max-norm", type=float, default=0.05, help="clip_grad_norm_'s max_norm (unitless)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and of the synthetic data")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for knobs_rank<RANK>.json (created)")
    p.add_argument("--pg-timeout-s", type=float, default=60.0,
                   help="collective timeout of the process group (seconds); torch's default is 10 minutes on NCCL, 30 on gloo")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl on cuda, gloo on cpu")
    args = p.parse_args(argv)
    for name in ("dim", "n_layers", "batch_size", "grad_accum_steps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.max_norm <= 0:
        p.error(f"--max-norm must be > 0, got {args.max_norm}")
    if args.pg_timeout_s <= 0:
        p.error(f"--pg-timeout-s must be > 0, got {args.pg_timeout_s}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False (no GPU visible, or a CPU-only torch build); "
                "use --device cpu or --device auto")
    return args


def even_world_of_four(world_size):
    """True when ``world_size`` is even and at least 4: a 2-D mesh with shard groups of 2, and an int reshard of
    ``world_size // 2`` (a divisor strictly between 1 and the world size), both need that."""
    return world_size >= 4 and world_size % 2 == 0


def check_world(lessons, world_size):
    """Refuse, before any lesson runs, a world size that a requested lesson cannot use.

    Args: lessons: the names given to --lessons; world_size: WORLD_SIZE (count of ranks).
    Raises: ValueError naming --lessons and WORLD_SIZE when hsdp is requested on a world that is not even and >= 4.
    """
    if "hsdp" in lessons and not even_world_of_four(world_size):
        raise ValueError(f"--lessons hsdp needs an even world of at least 4 ranks, got WORLD_SIZE={world_size} "
                         f"(--lessons {' '.join(lessons)}; run hsdp with torchrun --nproc-per-node 4)")


def setup(args):
    """Join the process group (a world of one over an in-memory store without torchrun); return (rank, world, device)."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # LOCAL_RANK: the GPU index on this node
    backend = ("nccl" if use_cuda else "gloo") if args.backend == "auto" else args.backend
    timeout = timedelta(seconds=args.pg_timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:  # FSDP needs a process group even alone
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), device


class Block(nn.Module):
    """A residual MLP block: one FSDP unit."""

    def __init__(self, dim):
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class Net(nn.Module):
    """Input layer, blocks, head. The input layer and the head belong to the root unit."""

    def __init__(self, dim, n_layers, n_classes=8):
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(args, device):
    torch.manual_seed(args.seed)  # the same weights on every rank: FSDP keeps each rank's own shard of them
    return Net(args.dim, args.n_layers).to(device)


def shard(model, sum_then_divide=True, **kwargs):
    """fully_shard bottom-up: one unit per block, then the root (input layer and head)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    if sum_then_divide and dist.get_backend() == "gloo":
        # FSDP2 averages fp32 gradients with a ReduceOp.AVG reduce-scatter. gloo's reduce-scatter in torch 2.8
        # sums instead (pytorch/pytorch#162338): gradients come out world_size times too large, silently.
        # Summing and dividing afterwards is right on every version and backend (set per FSDP module).
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    return model


def global_batch(args, world_size, micro_steps=1):
    """Inputs and targets of one optimizer step for all ranks (identical everywhere): rank r's micro-batch m is
    rows [(m * world_size + r) * batch_size, ... + batch_size)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    n = micro_steps * world_size * args.batch_size
    return torch.randn(n, args.dim, generator=g), torch.randint(0, 8, (n,), generator=g)


def rows_of(xs, ys, args, rank, world_size, micro, device):
    first = (micro * world_size + rank) * args.batch_size
    return xs[first:first + args.batch_size].to(device), ys[first:first + args.batch_size].to(device)


def local(t):
    """This rank's part of a tensor: the local shard of a DTensor, the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def placement_name(placement):
    """``Shard(0)``, ``Replicate()`` or ``Partial()``: how a DTensor is laid out over one mesh dimension."""
    if placement.is_shard():
        return f"Shard({placement.dim})"
    return "Replicate()" if placement.is_replicate() else "Partial()"


def held_param_bytes(model):
    """Bytes of the parameters this rank holds now: sharded units count their shard, gathered ones the whole."""
    return sum(local(p).numel() * local(p).element_size() for p in model.parameters())


@contextlib.contextmanager
def count_collectives():
    """Count the collectives issued inside the block, with torch.profiler (the dict is filled when it exits).

    ``all_gather`` etc.: calls; ``all_gather_group_sizes``: {group size: calls}, read from the tensor shapes (an
    all-gather's output is group-size times its input, a reduce-scatter's input group-size times its output).
    """
    counts = {name: 0 for name in COLLECTIVES.values()}
    counts.update(all_gather_group_sizes={}, reduce_scatter_group_sizes={})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        yield counts
    sizes = {"all_gather": collections.Counter(), "reduce_scatter": collections.Counter()}
    for event in prof.events():
        name = COLLECTIVES.get(event.name)
        if name is None:
            continue
        counts[name] += 1
        if name in sizes:  # shapes: [output, input, ...]
            out, inp = (max(1, torch.Size(s).numel()) for s in event.input_shapes[:2])
            sizes[name][out // inp if name == "all_gather" else inp // out] += 1
    for name, counter in sizes.items():
        counts[f"{name}_group_sizes"] = {str(k): v for k, v in sorted(counter.items())}


def train_step(model, args, rank, world_size, device, micro_steps=1, sync_every_micro_step=True, probe=None):
    """One optimizer step's forward and backward (no optimizer: the gradients are what we look at)."""
    xs, ys = global_batch(args, world_size, micro_steps)
    for micro in range(micro_steps):
        if not sync_every_micro_step:
            # Reduce-scatter only on the last micro-batch; before that, keep accumulating unsharded gradients.
            model.set_requires_gradient_sync(micro == micro_steps - 1)
        x, y = rows_of(xs, ys, args, rank, world_size, micro, device)
        loss = F.cross_entropy(model(x), y) / micro_steps
        if probe is not None:
            probe["param_bytes_after_forward"] = held_param_bytes(model)  # between this forward and its backward
        loss.backward()


def reference_grads(args, device, world_size, micro_steps=1):
    """Gradients of the unsharded model on the whole global batch, in one process: what every strategy must give."""
    model = build(args, device)
    xs, ys = global_batch(args, world_size, micro_steps)
    F.cross_entropy(model(xs.to(device)), ys.to(device)).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def max_grad_diff(model, reference, chunk_of):
    """Largest |local gradient shard - the reference's matching rows| over all parameters."""
    worst = 0.0
    for name, p in model.named_parameters():
        rows = chunk_of(reference[name])
        worst = max(worst, (local(p.grad) - rows).abs().max().item())
    return worst


def lesson_reshard(args, rank, world_size, device):
    settings = {"default (None)": {}, "True": {"reshard_after_forward": True}, "False": {"reshard_after_forward": False}}
    if even_world_of_four(world_size):  # an int must divide the world and lie strictly between 1 and it
        settings[str(world_size // 2)] = {"reshard_after_forward": world_size // 2}
    elif rank == 0:
        sys.stdout.write(f"reshard: the int variant (reshard_after_forward=WORLD_SIZE // 2) is skipped: WORLD_SIZE="
                         f"{world_size}, and an int must divide the world size and lie strictly between 1 and it "
                         f"(this script uses k = WORLD_SIZE // 2 on an even world of at least 4 ranks)\n")
    out = {}
    for label, kwargs in settings.items():
        model = shard(build(args, device), **kwargs)
        train_step(model, args, rank, world_size, device)  # the first step also runs FSDP's lazy initialisation
        probe = {}
        with count_collectives() as counts:
            train_step(model, args, rank, world_size, device, probe=probe)
        out[label] = {**counts, **probe, "param_bytes_after_step": held_param_bytes(model)}
    return out


def lesson_hsdp(args, rank, world_size, device):
    from torch.distributed.device_mesh import init_device_mesh
    check_world(["hsdp"], world_size)
    reference = reference_grads(args, device, world_size)
    out = {}
    for label, shape, kwargs in [("HYBRID_SHARD", (world_size // 2, 2), {}),
                                 ("_HYBRID_SHARD_ZERO2", (world_size // 2, 2), {"reshard_after_forward": False}),
                                 ("NO_SHARD", (world_size, 1), {})]:
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))
        model = shard(build(args, device), mesh=mesh, **kwargs)
        train_step(model, args, rank, world_size, device)
        model.zero_grad(set_to_none=True)
        with count_collectives() as counts:
            train_step(model, args, rank, world_size, device)
        shard_index, shard_size = mesh["shard"].get_local_rank(), mesh["shard"].size()
        weight = model.inp.weight  # who holds which rows of one parameter
        rows = weight.shape[0] // shard_size
        out[label] = {
            **counts, "mesh_shape": list(shape), "mesh_coordinate": mesh.get_coordinate(),
            "shard_group": dist.get_process_group_ranks(mesh["shard"].get_group()),
            "replicate_group": dist.get_process_group_ranks(mesh["replicate"].get_group()),
            "placements": [placement_name(p) for p in weight.placements], "inp_weight_rows": [shard_index * rows, (shard_index + 1) * rows],
            "inp_weight_local_sum": local(weight).sum().item(),
            "max_grad_diff_vs_one_process": max_grad_diff(
                model, reference, lambda g: torch.chunk(g, shard_size, dim=0)[shard_index]),
            "param_bytes": held_param_bytes(model),
        }
    return out


def lesson_accumulation(args, rank, world_size, device):
    reference = reference_grads(args, device, world_size, args.grad_accum_steps)
    out = {}
    for label, sync in [("sync every micro-batch", True), ("set_requires_gradient_sync(False) until the last", False)]:
        model = shard(build(args, device))
        train_step(model, args, rank, world_size, device)
        model.zero_grad(set_to_none=True)
        with count_collectives() as counts:
            train_step(model, args, rank, world_size, device, args.grad_accum_steps, sync_every_micro_step=sync)
        out[label] = {**counts, "max_grad_diff_vs_one_process": max_grad_diff(
            model, reference, lambda g: torch.chunk(g, world_size, dim=0)[rank])}
    return out


def lesson_averaging(args, rank, world_size, device):
    reference = reference_grads(args, device, world_size)
    out = {}
    for label, sum_then_divide in [("ReduceOp.AVG (the default)", False), ("sum, then divide", True)]:
        model = shard(build(args, device), sum_then_divide=sum_then_divide)
        train_step(model, args, rank, world_size, device)
        # |FSDP's gradient shards| / |the matching rows of one process's gradients|: 1 when averaged right
        norms = [(local(p.grad).norm().item(), torch.chunk(reference[n], world_size, dim=0)[rank].norm().item())
                 for n, p in model.named_parameters()]
        out[label] = {"grad_norm_ratio_vs_one_process": sum(a for a, _ in norms) / sum(b for _, b in norms),
                      "max_grad_diff_vs_one_process": max_grad_diff(
                          model, reference, lambda g: torch.chunk(g, world_size, dim=0)[rank])}
    return out


def lesson_clipping(args, rank, world_size, device):
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(build(args, device), device_ids=[device.index] if device.type == "cuda" else None)
    fsdp = shard(build(args, device))
    for model in (ddp, fsdp):
        train_step(model, args, rank, world_size, device)  # the same data and weights: the same gradients
    shard_norm = torch.linalg.vector_norm(torch.stack([local(p.grad).norm() for p in fsdp.parameters()])).item()
    ddp_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.max_norm)
    norm = torch.nn.utils.clip_grad_norm_(fsdp.parameters(), args.max_norm)  # a DTensor: every rank must call it
    full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    clipped = {n: p.grad for n, p in ddp.module.named_parameters()}
    diff = max((p.grad.full_tensor() - clipped[n]).abs().max().item() for n, p in fsdp.named_parameters())
    return {"norm_type": type(norm).__name__, "norm_placements": [placement_name(p) for p in getattr(norm, "placements", [])],
            "norm_local": local(norm).item(), "norm_full": full.item(), "ddp_norm": ddp_norm.item(),
            "local_shard_grad_norm": shard_norm, "max_norm": args.max_norm,
            "max_clipped_grad_diff_vs_ddp": diff,
            "clipped_norm_full": torch.linalg.vector_norm(torch.stack([g.norm() for g in clipped.values()])).item()}


def summary(name, out, result):
    """Short lines saying what one lesson measured on this rank (the JSON holds every number)."""
    kib = lambda n: f"{n / 2**10:.1f} KiB"  # noqa: E731
    if name == "reshard":
        return [f"reshard_after_forward={label.replace('default (None)', 'None (the default)')}: {r['all_gather']} all-gathers (by group size {r['all_gather_group_sizes']}),"
                f" {r['reduce_scatter']} reduce-scatters per step; holds {kib(r['param_bytes_after_forward'])} between"
                f" forward and backward, {kib(r['param_bytes_after_step'])} after the step"
                f" (unsharded: {kib(result['param_bytes_unsharded'])})" for label, r in out.items()]
    if name == "hsdp":
        return [f"{label}: mesh {r['mesh_shape']}, shard group {r['shard_group']}, replicate group {r['replicate_group']};"
                f" {r['all_gather']} all-gathers, {r['reduce_scatter']} reduce-scatters, {r['all_reduce']} all-reduces;"
                f" max |grad - one process| {r['max_grad_diff_vs_one_process']:.1e}" for label, r in out.items()]
    if name == "averaging":
        return [f"{label}: gradients x{r['grad_norm_ratio_vs_one_process']:.3f} of one process's on the whole batch"
                f" (max |diff| {r['max_grad_diff_vs_one_process']:.1e})" for label, r in out.items()]
    if name == "accumulation":
        return [f"{label}: {r['reduce_scatter']} reduce-scatters, {r['all_gather']} all-gathers for"
                f" {result['args']['grad_accum_steps']} micro-batches; max |grad - one process|"
                f" {r['max_grad_diff_vs_one_process']:.1e}" for label, r in out.items()]
    if name == "clipping":
        return [f"clip_grad_norm_ returns a {out['norm_type']} {out['norm_placements']}: full norm {out['norm_full']:.6f},"
                f" DDP's {out['ddp_norm']:.6f}; this rank's shard norm {out['local_shard_grad_norm']:.6f};"
                f" clipped gradients vs DDP's: max |diff| {out['max_clipped_grad_diff_vs_ddp']:.1e}"]
    return []


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    # torch 2.13's profiler logs each start and stop on stderr, and 2.8's CUDA wheel on a machine without a GPU
    # an error per profile (gpuGetDeviceCount): the counts are what this script wants from it.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    rank, world_size, device = setup(args)
    try:
        lessons = {"reshard": lesson_reshard, "hsdp": lesson_hsdp, "accumulation": lesson_accumulation,
                   "clipping": lesson_clipping, "averaging": lesson_averaging}
        result = {"rank": rank, "world_size": world_size, "torch": torch.__version__, "args": vars(args),
                  "param_bytes_unsharded": sum(p.numel() * p.element_size() for p in build(args, device).parameters()),
                  "root_param_bytes": sum(p.numel() * p.element_size() for n, p in build(args, device).named_parameters()
                                          if not n.startswith("blocks."))}
        check_world(args.lessons, world_size)  # before any lesson: a late refusal would waste the earlier ones
        for name in args.lessons:
            result[name] = lessons[name](args, rank, world_size, device)
            if rank == 0:
                lines = summary(name, result[name], result)
                sys.stdout.write("".join(f"{name} (rank 0 of {world_size}): {line}\n" for line in lines))
            dist.barrier()
        path = Path(args.metrics_dir) / f"knobs_rank{rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        sys.stdout.write(f"rank {rank}: {', '.join(args.lessons)} done; every number in {path.resolve()}\n")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
