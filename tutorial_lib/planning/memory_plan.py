"""A memory plan of one training step, per rank, by category: torch's own memory tracker run in fake mode.

``plan_memory(["--n-layers", 32, "--d-model", 4096, ...], world_size=8)`` builds the model ``train_lm.py`` builds
(its own ``build_model``, imported by path: ``tl.import_script``), with the layout, precision and activation
checkpointing its flags say, and runs its training step (its own ``train_step``) twice: a warm-up (it creates the
optimizer's state, FSDP's lazy initialisation and DTensor's sharding caches, whose first use allocates global-shape
tensors that fake mode would count), then one step under
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` (``MemTracker`` without FSDP), all inside
``FakeTensorMode`` and over a fake process group of ``world_size`` ranks: one process, no tensor memory allocated,
no collective sent, seconds for a 7 B model. The tracker sees every tensor the step creates and frees, as it does in
a real run, and reports the peak by category: parameters (the rank's shards), all-gathered parameters, gradients,
optimizer state, activations, all-gather and reduce-scatter buffers, temporaries. Every rank is planned:
``torch.chunk`` gives the remainder rows to the first ranks, so when the world size does not divide a parameter's
first dimension the ranks hold different shards. FSDP2 pads every rank's parameter storage to the largest shard, but
AdamW's state follows the unpadded shard: in issue 35's trial, 3 ranks, rank 2's optimizer state was 1.22% below rank
0's plan; a 3-rank gloo run here equals each rank's own plan byte for byte, or one collective buffer above it
(``matches_plan``; tests/integration/test_memory_plan_ranks.py, torch 2.8 and 2.13). Ranks
with the same shard sizes have the same plan, so the step is traced once per distinct set of shard sizes (once when
the world size divides every first dimension), on a fake process group whose rank is that set's first rank.
``MemoryPlan.rank_peak_bytes`` holds every rank's
plan, ``peak_rank`` the rank whose total is largest, and ``peak_bytes`` that rank's plan.

Measured against real runs (tests/test_train_lm.py, notebook 11): ``train_lm.py --track-memory`` runs the same
tracker on the same second step with real tensors and real gloo collectives. Where the peak is at the end of forward
(activations dominate: the notebook's and the test's configurations) every category was equal, byte for byte, on
every rank and every run, FSDP2 and DDP, torch 2.8 and 2.13, AdamW with ``foreach`` off (the script's default) or on.
Where the peak falls in backward or in the optimizer step (a small batch, a large vocabulary), a real run's
reduce-scatter buffers can live longer than fake mode's, as long as the collective takes on the wire: one
configuration gave the plan exactly in one run and 3.9% more on one rank in the next; the root unit's reduce-scatter
input was seen held into the optimizer step (397 of 1484 MiB, where the plan said 1201 MiB in all). So
``unsimulated_bytes`` holds the largest unit's reduce-scatter input and ``headroom_bytes`` counts it. Conditions:
one micro-batch per step, no ``torch.compile`` (a compiled graph frees and fuses differently).

DDP cannot run on fake tensors (its C++ reducer needs real storage), so a DDP plan traces one process whose gradients
behave as DDP's: ``gradient_as_bucket_view=True`` makes the buckets the gradients' storage, held from the first
backward on (``zero_grad(set_to_none=True)`` frees the views, not the buckets). The plan keeps one process's
gradients allocated for the whole step (``zero_grad`` zeroes them instead of freeing them), so the bucket bytes are
counted once, at whatever moment the peak falls. (Until 2026-12 the plan added the buckets on top of the one-process
peak, which counted the gradients twice wherever that peak fell in backward or in the optimizer step: a large model
with a small batch.) torch's tracker files the buckets under activations in a real DDP run (it first sees their
storage in backward); the plan shows them as gradients, and ``compare_plan`` moves them.

On CUDA (``device="cuda"``) torch's tracker rounds every storage up to 512 bytes (``_PYTORCH_MIN_ALLOCATE`` in
``torch/distributed/_tools/mem_tracker.py``, ``_WeakRefInfo._calculate_mem_consumed``; on CPU it counts exact bytes),
and AdamW keeps its ``step`` counters on the CPU (``foreach`` off, not ``capturable`` or ``fused``: the script's
default), outside the GPU's snapshot. The plan runs on CPU fake tensors either way; ``device="cuda"`` counts every
storage the step creates as the CUDA tracker does (rounded up to 512 bytes), except the ``step`` counters, which it
leaves out of the plan, and means bf16 compute where ``--precision`` is not given (the script's default on a GPU).
Not emulated: the CUDA attention kernels save other tensors than the CPU's (a random-number state of 64 bytes, a
logsumexp of another layout), and CUDA's autocast casts other ops than the CPU's: no GPU has compared a plan with a
CUDA run yet (``scripts/gpu_check.py`` does, where one is lent).

What the plan does not see (the margin to keep on a GPU): the CUDA context (300-500 MB per process, outside the
allocator), the caching allocator's rounding and fragmentation (``max_memory_reserved`` above
``max_memory_allocated``), NCCL's communication buffers and workspace, cuBLAS's workspace, and the memory of
another process on the same GPU. ``headroom_bytes`` subtracts ``CONTEXT_MARGIN_BYTES`` and ``FRAGMENTATION_MARGIN``
of the plan, a judgement (no GPU measured it here), stated where it is used. The capacity it starts from is what CUDA
can use, not the card's label: an RTX 4090 D sold as 24 GB gives CUDA about 23.6 GiB (``USABLE_GIB_4090D``; the
driver and display keep the rest; a figure reported for these cards, not measured here).

Sources: torch.distributed._tools.fsdp2_mem_tracker (FSDPMemTracker's docstring and tests); torch's fake process
group (torch.testing._internal.distributed.fake_pg, the "fake" backend); torchtitan's meta-device initialisation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, MetricsError
from .memory_model import bytes_per_parameter, shard_rows
from .tracker_counting import (CUDA_MIN_ALLOCATE, DEVICES, counted_as_cuda, device_snapshot, fake_world,
                               largest_by_category)
from ..notebook.script_source import import_script, script_instruments

# The tracker's categories (FSDPMemTracker's _FSDPRefType, MemTracker's _MemRefType) -> the plan's.
CATEGORIES = {"SHARDED_PARAM": "parameters", "PARAM": "parameters", "UNSHARDED_PARAM": "gathered parameters",
              "SHARDED_GRAD": "gradients", "UNSHARDED_GRAD": "gradients", "GRAD": "gradients",
              "OPT": "optimizer state", "ACT": "activations", "ALL_GATHER": "all-gather buffers",
              "REDUCE_SCATTER": "reduce-scatter buffers", "TEMP": "temporaries", "BUFFER": "other", "INP": "other",
              "OTH": "other"}
ORDER = ("parameters", "gathered parameters", "gradients", "optimizer state", "activations", "all-gather buffers",
         "reduce-scatter buffers", "temporaries", "other")
CONTEXT_MARGIN_BYTES = 1 << 30  # CUDA context (300-500 MB) + NCCL buffers + cuBLAS workspace, per process: 1 GiB
FRAGMENTATION_MARGIN = 0.10  # the caching allocator's rounding and fragmentation, as a share of the plan
GIB = 1 << 30
# What CUDA can allocate on an RTX 4090 D "24 GB" card (24 GiB of GDDR6X, of which the driver keeps about 0.4 GiB;
# reported for these cards, not measured here): the capacity the 24 GB table plans against, before the margins above.
USABLE_GIB_4090D = 23.6


@dataclass(frozen=True)
class MemoryPlan:
    """The peak tensor memory of one rank in one training step, by category.

    Attributes:
        args: the script's arguments planned (strings).
        parallel: none, ddp, fsdp or hsdp (the script's ``--parallel``).
        world_size: ranks simulated.
        n_params: parameters of the model (count).
        peak_bytes: ``{category: bytes}`` at the peak, categories in ``ORDER`` (bytes), of ``peak_rank``: the rank
            whose total is largest (rank 0 when several tie).
        state_bytes_analytic: parameters + gradients + AdamW state per rank from ``tl.planning.bytes_per_parameter``
            (16 bytes per parameter, / world size under FSDP; the shard dimension only under HSDP).
        plan_time_s: wall time of the plan (seconds).
        torch_version: the torch that planned it.
        unsimulated_bytes: FSDP/HSDP: the largest unit's reduce-scatter input (its gradients, unsharded, fp32), which
            a real run can still hold at the peak while fake mode has freed it (see the module docstring); counted
            by ``headroom_bytes``, not in ``peak_bytes`` (bytes).
        notes: what the plan added or assumed, in words.
        collective_buffer_bytes: the largest buffer one collective of the step holds (bytes). gloo's worker thread
            can drop the last reference to one after the main thread's next allocation (traced: ``train_hf.py``'s
            all-gather output in backward, 15 of 222 ranks beside three busy loops): a real peak lies in ``[plan,
            plan + collective_buffer_bytes]`` (``matches_plan``). In ``unsimulated_bytes`` too, except ``plan_hf``'s.
        rank_peak_bytes: every rank's ``{category: bytes}`` at its own peak, ``{rank: ...}`` for ranks 0..world_size-1
            (empty in a plan made without it: ``for_rank`` then answers ``peak_bytes``).
        peak_rank: the rank whose planned total is largest (the first of them when several tie).
        device: the device whose tracker the plan counts as (``"cpu"``: exact bytes; ``"cuda"``: every storage rounded
            up to 512 bytes, AdamW's ``step`` counters left out, as torch's tracker counts a CUDA run).
        largest_bytes: rank 0's ``{tracker category: bytes}`` (``SHARDED_PARAM``, ``UNSHARDED_PARAM``, ``GRAD``, ``OPT``,
            ...), each at its largest in the step, whenever that was (``largest_by_category``): a static count.
    """

    args: tuple[str, ...]
    parallel: str
    world_size: int
    n_params: int
    peak_bytes: Mapping[str, int]
    state_bytes_analytic: float
    plan_time_s: float
    torch_version: str
    unsimulated_bytes: int = 0
    notes: tuple[str, ...] = field(default=())
    collective_buffer_bytes: int = 0
    rank_peak_bytes: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    peak_rank: int = 0
    device: str = "cpu"
    largest_bytes: Mapping[str, int] = field(default_factory=dict)

    def for_rank(self, rank: int) -> Mapping[str, int]:
        """Rank ``rank``'s ``{category: bytes}`` at its peak (``peak_bytes`` when the plan has no per-rank plans).

        Raises:
            ConfigError: a rank outside 0..world_size-1.
        """
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ConfigError(f"rank must be an int in 0..{self.world_size - 1}, got {rank!r}")
        return self.rank_peak_bytes.get(rank, self.peak_bytes)

    @property
    def total_bytes(self) -> int:
        """The peak: the sum of ``peak_bytes`` (bytes)."""
        return sum(self.peak_bytes.values())

    def headroom_bytes(self, capacity_bytes: float) -> float:
        """``capacity_bytes`` minus the plan and ``unsimulated_bytes``, minus ``CONTEXT_MARGIN_BYTES`` and
        ``FRAGMENTATION_MARGIN`` of the plan (bytes; negative: does not fit)."""
        planned = self.total_bytes + self.unsimulated_bytes
        return capacity_bytes - planned * (1 + FRAGMENTATION_MARGIN) - CONTEXT_MARGIN_BYTES

    def as_row(self) -> dict:
        """The plan as one flat dict (GiB per category): a DataFrame row."""
        row = {"parallel": self.parallel, "world_size": self.world_size, "n_params": self.n_params}
        row.update({f"{k} (GiB)": v / GIB for k, v in self.peak_bytes.items()})
        row["peak (GiB)"] = self.total_bytes / GIB
        row["analytic state (GiB)"] = self.state_bytes_analytic / GIB
        return row


def categories_of(snapshot: Mapping[str, int]) -> dict[str, int]:
    """A tracker snapshot ``{"SHARDED_PARAM": bytes, ..., "Total": bytes}`` (names with or without their enum's
    prefix) as the plan's ``{category: bytes}``, every category of ``ORDER`` present; the total is left out.

    Raises:
        MetricsError: a category this module does not know (a torch that added one).
    """
    out = dict.fromkeys(ORDER, 0)
    for name, value in snapshot.items():
        name = str(name).rsplit(".", 1)[-1]
        if name == "Total":
            continue
        if name not in CATEGORIES:
            raise MetricsError(f"unknown memory tracker category {name!r}; known: {sorted(CATEGORIES)}")
        out[CATEGORIES[name]] += int(value)
    return out


def plan_memory(args: Sequence[object] = (), *, world_size: int = 1, script: str | Path = "train_lm",
                device: str = "cpu") -> MemoryPlan:
    """Plan every rank's peak memory in a training step of ``train_lm.py ARGS`` on ``world_size`` ranks.

    Args:
        args: the script's flags (``--parallel``, ``--n-layers``, ``--d-model``, ``--n-heads``, ``--block-size``,
            ``--vocab-size``, ``--batch-size``, ``--precision``, ``--ac-mode``, ...), checked by
            its own parser. Without ``--precision`` the script computes in fp32 on CPU and in bf16 on a GPU: the plan
            follows ``device``.
        world_size: ranks to simulate (>= 1); ``--parallel none`` needs 1, ``hsdp`` a multiple of
            ``--replicate-degree``.
        script: the lesson script (a shipped name or a path) whose model and training step are planned.
        device: ``"cpu"`` or ``"cuda"``: the device the run uses, whose memory tracker the plan counts as (see the
            module docstring: on ``"cuda"`` every storage rounded up to 512 bytes, AdamW's ``step`` counters left
            out).

    Returns:
        A ``MemoryPlan``: every rank's peak by category (``rank_peak_bytes``, bytes), the rank that peaks
        (``peak_rank``) and its plan (``peak_bytes``).

    Raises:
        ConfigError: bad flags (the script's own message), a world size the layout cannot use, flags the plan
            cannot follow (``--compile``, ``--grad-accum-steps`` > 1), a device not in ``DEVICES``, or a process group
            already exists here.
    """
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"world_size must be an int >= 1, got {world_size!r}")
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}")
    module = import_script(script)
    argv = [str(a) for a in args]
    try:
        parsed = module.parse_args(argv)
    except SystemExit as e:
        raise ConfigError(f"{Path(str(script)).stem}: invalid flags {argv} (see the message above)") from e
    if parsed.compile or parsed.grad_accum_steps != 1:
        raise ConfigError("plan_memory plans eager steps of one micro-batch: drop --compile and --grad-accum-steps")
    if parsed.parallel == "none" and world_size != 1:
        raise ConfigError(f"--parallel none is one process: world_size must be 1, got {world_size}")
    if parsed.parallel == "hsdp" and world_size % parsed.replicate_degree:
        raise ConfigError(f"world_size {world_size} is not a multiple of --replicate-degree {parsed.replicate_degree}")
    if dist.is_available() and dist.is_initialized():
        raise ConfigError("this process already has a process group; plan_memory makes a fake one of its own: "
                          "call it where no process group exists (e.g. the notebook, not a rank)")
    if device == "cuda" and parsed.precision is None:
        parsed.precision = "bf16"  # the script's default on a GPU (compute_dtype)
    ddp = parsed.parallel == "ddp"
    if ddp:  # DDP's reducer cannot run on fake tensors: plan one process whose gradients live as long as DDP's buckets
        parsed.parallel = "none"
    traced = _traced_step(module, parsed, world_size, rank=0, device=device, persistent_grads=ddp)
    n_params, largest_unit, shapes = traced.n_params, traced.largest_unit, traced.shapes
    plans, notes = _every_rank(module, parsed, world_size, device, categories_of(traced.snapshot), shapes)
    if ddp:
        bucket_bytes = n_params * 4  # fp32 gradients, one bucket element per parameter element
        for plan in {id(p): p for p in plans.values()}.values():
            plan["gradients"] = bucket_bytes  # a few large buckets: not rounded per parameter even on CUDA
        notes.append(f"DDP: the gradients, {bucket_bytes} bytes, held for the whole step as DDP's buckets hold them "
                     "(gradient_as_bucket_view), counted once")
    totals = {rank: sum(plan.values()) for rank, plan in plans.items()}
    peak_rank = max(sorted(totals), key=lambda r: (totals[r], -r))
    shards = {"none": 1, "fsdp": world_size, "hsdp": world_size // parsed.replicate_degree}[parsed.parallel]
    analytic = n_params * bytes_per_parameter("ddp")["total"] / shards  # 16 bytes per parameter, sharded or not
    unsimulated = 4 * largest_unit if parsed.parallel in ("fsdp", "hsdp") else 0
    if unsimulated:
        notes.append(f"not in the peak: the largest unit's reduce-scatter input, {unsimulated} bytes (the headroom "
                     "counts it)")
    if device == "cuda":
        notes.append("counted as torch's tracker counts a CUDA run: every storage rounded up to 512 bytes, AdamW's "
                     "step counters (on the CPU) left out")
    return MemoryPlan(args=tuple(argv), parallel="ddp" if ddp else parsed.parallel, world_size=world_size,
                      n_params=n_params, peak_bytes=dict(plans[peak_rank]), state_bytes_analytic=analytic,
                      plan_time_s=time.perf_counter() - start, torch_version=torch.__version__,
                      unsimulated_bytes=unsimulated, notes=tuple(notes), collective_buffer_bytes=unsimulated,
                      rank_peak_bytes={rank: dict(plans[rank]) for rank in sorted(plans)}, peak_rank=peak_rank,
                      device=device, largest_bytes=traced.largest)


def _every_rank(module, parsed, world_size: int, device: str, rank0: dict, shapes) -> tuple[dict, list]:
    """Every rank's ``{category: bytes}``, from rank 0's and one more trace per distinct set of FSDP shard sizes
    (``torch.chunk``'s rows per rank of every parameter); and a note when there was more than one set."""
    plans = {0: rank0}
    if parsed.parallel not in ("fsdp", "hsdp"):  # DDP and one process: every rank holds the same tensors
        return {rank: rank0 for rank in range(world_size)}, []
    shards = world_size // (parsed.replicate_degree if parsed.parallel == "hsdp" else 1)
    groups: dict[tuple, list[int]] = {}
    for rank in range(world_size):  # HSDP's mesh is (replicate, shard): rank r holds shard r % shards
        groups.setdefault(tuple(shard_rows(shape[0], shards, rank % shards) for shape in shapes), []).append(rank)
    for ranks in groups.values():
        if ranks[0] != 0:
            plans[ranks[0]] = categories_of(
                _traced_step(module, parsed, world_size, rank=ranks[0], device=device).snapshot)
        plans.update({rank: plans[ranks[0]] for rank in ranks[1:]})
    if len(groups) == 1:
        return plans, []
    return plans, [f"{len(groups)} distinct shard sizes over {world_size} ranks: traced once each (ranks "
                   + ", ".join(str(r[0]) for r in groups.values()) + ")"]


@dataclass(frozen=True)
class _Traced:
    snapshot: dict  # the tracker's peak snapshot of the tracked step, of the planned device
    n_params: int  # parameters of the model
    largest_unit: int  # parameters of the largest FSDP unit (a block, or the root's own)
    shapes: tuple  # every parameter's global shape
    largest: dict  # each category at its largest in the tracked step (largest_by_category)


def _traced_step(module, parsed, world_size: int, *, rank: int = 0, device: str = "cpu",
                 persistent_grads: bool = False) -> _Traced:
    """The script's model and training step in fake mode over ``world_size`` fake ranks, as rank ``rank``.

    ``persistent_grads``: ``zero_grad`` zeroes the gradients instead of freeing them (DDP's buckets).
    ``device="cuda"``: counted as torch's tracker counts a CUDA run (``counted_as_cuda``)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu = torch.device("cpu")
    with fake_world(world_size if parsed.parallel != "none" else 1, rank if parsed.parallel != "none" else 0):
        mesh = module.make_mesh(parsed, world_size, cpu) if parsed.parallel in ("fsdp", "hsdp") else None
        with FakeTensorMode():
            model = module.build_model(parsed, cpu, mesh, init=False)  # fake weights: no values to initialise
            optimizer = module.build_optimizer(parsed, model)
            if persistent_grads:
                zero_grad = optimizer.zero_grad
                optimizer.zero_grad = lambda set_to_none=True: zero_grad(set_to_none=False)
            data = torch.empty(parsed.corpus_bytes, dtype=torch.uint8)  # the corpus the real run keeps in memory
            n_val = int(len(data) * parsed.val_fraction)
            batches = module.Batches(module.TokenWindows(data[:-n_val], parsed.block_size), parsed.batch_size,
                                     rank if parsed.parallel != "none" else 0, world_size, parsed.seed)
            if len(batches.sampler) < 2 * world_size * parsed.batch_size:  # the epoch's order of every window
                raise ConfigError(f"--corpus-bytes {parsed.corpus_bytes} gives each of {world_size} ranks fewer than "
                                  f"2 batches of {parsed.batch_size} windows: raise it")
            batches.order = list(range(len(batches.sampler)))  # a fake tensor has no values to shuffle by
            # As --track-memory: one step to warm up (the optimizer's state, FSDP's lazy initialisation, DTensor's
            # sharding caches), then the second step under the tracker.
            scaler = module.make_scaler(parsed, cpu)
            loss, norm = module.train_step(model, optimizer, scaler, batches, parsed, cpu)
            loss_global = loss.clone()  # noqa: F841  (the script's loop keeps these until the next step)
            counting = counted_as_cuda(optimizer) if device == "cuda" else contextlib.nullcontext()
            with counting:  # from before the tracker registers the model and optimizer (MemTracker.track_external)
                tracker = script_instruments(module).make_tracker(model, optimizer)  # --track-memory's tracker
                with tracker:
                    module.train_step(model, optimizer, scaler, batches, parsed, cpu)
            snapshot = device_snapshot(tracker.get_tracker_snapshot("peak"), device)
            largest = largest_by_category(tracker, device)
            n_params = sum(p.numel() for p in model.parameters())
            shapes = tuple(tuple(p.shape) for p in model.parameters())
            block_numels = [sum(p.numel() for p in block.parameters()) for block in model.blocks]
    return _Traced(snapshot, n_params, max(block_numels + [n_params - sum(block_numels)]), shapes, largest)


def read_memory_snapshots(run_dir: str | Path) -> list[dict[str, int]]:
    """The peaks a ``train_lm.py --track-memory`` run measured, one ``{category: bytes}`` per rank, sorted by rank:
    of the rank's accelerator when it has one (on a GPU the corpus and each batch's first copy stay on the CPU), else
    of the CPU.

    DDP's gradient buckets, which torch's tracker files under activations, stay there: compare with a plan
    through ``compare_plan``, which moves them.

    Raises:
        MetricsError: the run wrote no ``memory_rank<R>.json``.
    """
    from ..runs.metrics import read_rank_json
    out = []
    for record in read_rank_json(run_dir, "memory"):
        devices = sorted(record["peak"], key=lambda d: d.startswith("cpu"))  # an accelerator first
        out.append(categories_of(record["peak"][devices[0]]))
    return out


def compare_plan(plan: MemoryPlan, measured: Mapping[str, int], rank: int | None = None):
    """A DataFrame: per category the planned and measured bytes, their difference and relative error.

    ``measured`` is one rank's ``read_memory_snapshots`` entry; ``rank`` is that rank, whose own plan it is compared
    with (``plan.for_rank(rank)``; None: ``plan.peak_bytes``, the rank that peaks). For a DDP plan, the measured
    activations lose and the measured gradients gain the bucket bytes the plan counts as gradients (see the module
    docstring), so both count them alike.
    """
    import pandas as pd
    planned = plan.peak_bytes if rank is None else plan.for_rank(rank)
    measured = dict(measured)
    if plan.parallel == "ddp":
        buckets = plan.n_params * 4
        measured["activations"] -= buckets
        measured["gradients"] += buckets
    rows = [{"category": k, "planned_bytes": planned[k], "measured_bytes": measured.get(k, 0)} for k in ORDER]
    rows.append({"category": "total", "planned_bytes": sum(planned.values()), "measured_bytes": sum(measured.values())})
    table = pd.DataFrame(rows).set_index("category")
    table["difference_bytes"] = table["planned_bytes"] - table["measured_bytes"]
    measured_or_nan = table["measured_bytes"].where(table["measured_bytes"] > 0)
    table["relative_error"] = (table["difference_bytes"].abs() / measured_or_nan).fillna(float("inf")).where(
        table["difference_bytes"] != 0, 0.0)  # 0 when equal, inf when only one side has bytes
    return table


def matches_plan(plan: MemoryPlan, measured: Mapping[str, int], rank: int | None = None) -> bool:
    """Whether one rank's measured peak (a ``read_memory_snapshots`` entry) is what ``plan`` allows: parameters and
    optimizer state equal byte for byte, the total in ``[plan, plan + plan.collective_buffer_bytes]`` (see
    ``MemoryPlan``). ``rank``: as in ``compare_plan``."""
    table = compare_plan(plan, measured, rank)
    exact = bool((table.loc[["parameters", "optimizer state"], "difference_bytes"] == 0).all())
    extra_bytes = -int(table.loc["total", "difference_bytes"])
    return exact and 0 <= extra_bytes <= plan.collective_buffer_bytes


# GPT-3's family (Brown et al., 2020, table 2.1): layers, width, heads; with a 50304-token vocabulary (GPT-2's,
# padded to a multiple of 64) and 1024-token windows. n_params is what the script builds (untied head).
GPT_SIZES = {"125M": (12, 768, 12), "350M": (24, 1024, 16), "760M": (24, 1536, 16), "1.3B": (24, 2048, 16),
             "2.7B": (32, 2560, 32), "6.7B": (32, 4096, 32)}
LAYOUTS = {"DDP fp32": ["--parallel", "ddp", "--precision", "fp32"],
           "FSDP2 fp32": ["--parallel", "fsdp", "--precision", "fp32"],
           "FSDP2 bf16": ["--parallel", "fsdp", "--precision", "bf16"],
           "FSDP2 bf16 + AC": ["--parallel", "fsdp", "--precision", "bf16", "--ac-mode", "full"]}


def memory_table(sizes: Sequence[str] = tuple(GPT_SIZES), world_sizes: Sequence[int] = (1, 4, 8),
                 layouts: Sequence[str] = tuple(LAYOUTS), *, capacity_gib: float = USABLE_GIB_4090D, batch_size: int = 1,
                 block_size: int = 1024, vocab_size: int = 50304, device: str = "cuda"):
    """Fits or not, and the headroom, for GPT sizes x world sizes x layouts on GPUs of ``capacity_gib`` each.

    Args:
        sizes: keys of ``GPT_SIZES``; world_sizes: GPUs (one rank each); layouts: keys of ``LAYOUTS``.
        capacity_gib: memory per GPU that CUDA can allocate (GiB). An RTX 4090 D's "24 GB" is 24 GiB of GDDR6X, of
            which CUDA gets about 23.6 GiB (``USABLE_GIB_4090D``, the default); the margins of ``headroom_bytes``
            come off that.
        batch_size, block_size, vocab_size: windows per rank, tokens per window, vocabulary.
        device: the device whose tracker the plans count as (``plan_memory``'s ``device``): ``"cuda"`` for GPUs.

    Returns:
        A DataFrame, one row per (size, world size, layout): ``model``, ``n_params``, ``gpus``, ``layout``,
        ``peak_gib`` (the plan of the rank that peaks), ``unsimulated_gib`` (``MemoryPlan.unsimulated_bytes``), ``state_analytic_gib``
        (16 bytes per parameter / shards), ``headroom_gib`` (``headroom_bytes``: after the margins), ``fits``.
        DDP on one GPU is one process.

    Raises:
        ConfigError: an unknown size or layout.
    """
    import pandas as pd
    unknown = [s for s in sizes if s not in GPT_SIZES] + [x for x in layouts if x not in LAYOUTS]
    if unknown:
        raise ConfigError(f"unknown sizes or layouts {unknown}; sizes: {list(GPT_SIZES)}, layouts: {list(LAYOUTS)}")
    rows = []
    for size in sizes:
        for world in world_sizes:
            for layout in layouts:
                plan = plan_memory(table_args(size, layout, world, batch_size=batch_size, block_size=block_size,
                                              vocab_size=vocab_size), world_size=world, device=device)
                headroom = plan.headroom_bytes(capacity_gib * GIB) / GIB
                rows.append({"model": size, "n_params": plan.n_params, "gpus": world, "layout": layout,
                             "peak_gib": round(plan.total_bytes / GIB, 3),
                             "unsimulated_gib": round(plan.unsimulated_bytes / GIB, 3),
                             "state_analytic_gib": round(plan.state_bytes_analytic / GIB, 3),
                             "headroom_gib": round(headroom, 3), "fits": bool(headroom >= 0)})
    return pd.DataFrame(rows)


def table_args(size: str, layout: str, world_size: int, *, batch_size: int = 1, block_size: int = 1024,
               vocab_size: int = 50304) -> list:
    """train_lm.py's flags for one row of ``memory_table`` (DDP on one GPU is ``--parallel none``)."""
    n_layers, d_model, n_heads = GPT_SIZES[size]
    flags = list(LAYOUTS[layout])
    if world_size == 1 and flags[1] == "ddp":
        flags[1] = "none"
    return ["--n-layers", n_layers, "--d-model", d_model, "--n-heads", n_heads, "--block-size", block_size,
            "--vocab-size", vocab_size, "--batch-size", batch_size, *flags]


def read_memory_table():
    """The stored ``memory_table()`` for 24 GB GPUs (``tutorial_lib/planning/data/memory_table_24gb.csv``, written by
    ``python -m tutorial_lib.planning.memory_plan``: 23.6 GiB usable per GPU, plans counted as on CUDA; the torch that
    planned it is in its ``torch`` column)."""
    import pandas as pd
    return pd.read_csv(Path(__file__).resolve().parent / "data" / "memory_table_24gb.csv")


def largest_fitting(table, layout: str, gpus: int) -> str | None:
    """The largest model size in ``memory_table``'s ``table`` that fits with ``layout`` on ``gpus`` GPUs, or None."""
    fitting = table[(table["layout"] == layout) & (table["gpus"] == gpus) & table["fits"]]
    return None if fitting.empty else fitting.sort_values("n_params")["model"].iloc[-1]


__all__ = ["MemoryPlan", "plan_memory", "read_memory_snapshots", "compare_plan", "matches_plan", "memory_table",
           "table_args", "read_memory_table", "largest_fitting", "categories_of", "counted_as_cuda",
           "device_snapshot", "GPT_SIZES", "LAYOUTS", "CONTEXT_MARGIN_BYTES", "FRAGMENTATION_MARGIN",
           "USABLE_GIB_4090D", "CUDA_MIN_ALLOCATE", "DEVICES"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tutorial_lib.planning.memory_plan [OUT.csv]``: plan ``memory_table()`` and write it (default: the
    stored table), with the torch version and the seconds each plan took printed."""
    import sys

    import torch
    argv = list(sys.argv[1:] if argv is None else argv)
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent / "data" / "memory_table_24gb.csv"
    table = memory_table()
    table["torch"] = torch.__version__
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    print(table.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
