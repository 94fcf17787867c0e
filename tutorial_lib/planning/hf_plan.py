"""Memory plans for a Hugging Face model on your GPUs: ``train_hf.py``'s own model and step, traced in fake mode.

``plan_hf("qwen2.5-7b", world_size=4, seq_len=2048, layout="bf16 + AC full")`` builds the architecture from its
``config.json`` (a shipped config of a public model, or the folder of a model you downloaded) with the lesson script's
own ``build_model`` (``transformers`` on ``meta``, activation checkpointing, LoRA through peft, ``fully_shard`` per
decoder layer and at the root, ``materialize``), then runs its own ``train_step`` twice inside ``FakeTensorMode``
over a fake process group of ``world_size`` ranks, the second under torch's ``FSDPMemTracker`` (as
``plan_memory`` does for ``train_lm.py``; see ``memory_plan``'s docstring for what the tracker sees and what it
does not). No weights, no GPU, no download: a 7 B model plans in seconds on a laptop's CPU.

Layouts (``LAYOUTS``), in order of the memory savers they add: FSDP2 fp32; bf16 compute (``MixedPrecisionPolicy``,
fp32 shards and optimizer state); activation checkpointing, selective then full; CPU offload (FSDP2's
``CPUOffloadPolicy``); and LoRA on a frozen base. CPU offload is not traced (FSDP2's offload needs a GPU): its plan is
the full-checkpointing plan with the shards, gradients and optimizer state moved to the host, whose bytes
``host_bytes`` reports.

Units: bytes, GiB = 2**30 bytes. A GPU's usable capacity is what CUDA reports as total memory, less than its label:
an RTX 4090D "24 GB" card gives CUDA about 23.6 GiB (``GPU_CAPACITY_BYTES``); ``MemoryPlan.headroom_bytes`` keeps
1 GiB for the CUDA context and NCCL's buffers and 10% for the caching allocator (judgements, not measured here).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, replace
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..notebook.script_source import import_script
from .memory_model import shard_rows
from .memory_plan import GIB, MemoryPlan, categories_of, fake_world
from .tracker_counting import DEVICES, counted_as_cuda, device_snapshot, hierarchy_warning_silenced

CONFIGS_DIR = Path(__file__).parent / "data" / "hf_configs"
# The shipped configs: the published config.json numbers of these models (their Hugging Face model cards'
# parameter counts, 0.49 B, 1.54 B, 7.61 B and 8.03 B, are what transformers builds from them: tests check).
SHIPPED = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.1-8b")
LARGE = ("llama-3.1-70b",)  # shipped too, not in the 24 GB table: what scripts/bench.py times (70.55 B parameters)
# Layout name -> train_hf.py flags. "+ offload" is derived from the full-checkpointing trace (see above).
LAYOUTS = {
    "fp32": ["--precision", "fp32"],
    "bf16": ["--precision", "bf16"],
    "bf16 + AC selective": ["--precision", "bf16", "--ac-mode", "selective"],
    "bf16 + AC full": ["--precision", "bf16", "--ac-mode", "full"],
    "bf16 + AC full + offload": ["--precision", "bf16", "--ac-mode", "full", "--cpu-offload"],
    "LoRA r16, bf16 + AC full": ["--precision", "bf16", "--ac-mode", "full", "--lora-rank", 16],
}
HF_LAYOUTS = LAYOUTS  # the name tutorial_lib exports
FULL_FINE_TUNING = tuple(name for name in LAYOUTS if not name.startswith("LoRA"))
# What CUDA reports as total memory (torch.cuda.mem_get_info()[1]): less than the label. RTX 4090D: 24 GB of
# GDDR6X, about 23.6 GiB usable (the issue's figure from the seeds' machines; no 4090D has run this workbook here).
GPU_CAPACITY_BYTES = {"RTX 4090D 24 GB": int(23.6 * GIB), "H100 80 GB": int(79.1 * GIB)}
TABLE_CSV = Path(__file__).parent / "data" / "hf_table.csv"


def model_folder(model: str | Path) -> Path:
    """The folder holding ``model``'s config.json: a shipped name (``SHIPPED``) or a path to a folder (or to its
    config.json).

    Raises:
        ConfigError: neither a shipped name nor a folder with a config.json.
    """
    name = str(model)
    if name.lower() in SHIPPED + LARGE:
        return CONFIGS_DIR / name.lower()
    path = Path(name).expanduser()
    if path.name == "config.json":
        path = path.parent
    if not (path / "config.json").is_file():
        raise ConfigError(f"model {name!r}: not a shipped config ({', '.join(SHIPPED)}) and no config.json in "
                          f"{path}: pass the folder you downloaded the model to (it holds config.json)")
    return path


def load_hf_config(model: str | Path):
    """``model``'s config, checked the way ``train_hf.py`` checks it before anything runs.

    Raises:
        ConfigError: a missing or malformed config.json, an architecture the script was not checked with, a size
            field that is not a positive integer: the message names the file and the field.
    """
    folder = model_folder(model)
    script = import_script("train_hf")
    try:
        return script.load_config(folder)
    except SystemExit as e:
        raise ConfigError(str(e.code)) from None


def _check(layout: str, world_size: int, seq_len: int, batch_size: int, replicate_degree: int, config) -> None:
    if layout not in LAYOUTS:
        raise ConfigError(f"layout {layout!r} is not one of {list(LAYOUTS)}")
    for name, value in (("world_size", world_size), ("seq_len", seq_len), ("batch_size", batch_size),
                        ("replicate_degree", replicate_degree)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
    if world_size % replicate_degree:
        raise ConfigError(f"{world_size} GPUs do not divide into a (replicate {replicate_degree}, shard "
                          f"{world_size / replicate_degree:g}) mesh: use a GPU count that is a multiple of "
                          f"replicate_degree={replicate_degree}")
    if seq_len > config.max_position_embeddings:
        raise ConfigError(f"seq_len {seq_len} is above the model's max_position_embeddings "
                          f"{config.max_position_embeddings} (its config.json)")


@contextlib.contextmanager
def _no_packing():
    """transformers asks whether a batch packs several sequences into one row (``find_packed_sequence_indices``:
    are the positions one run 0..T-1?). A real run of train_hf.py answers no (its windows are never packed) and
    attends with SDPA's ``is_causal``; fake tensors have no values to answer with, so transformers assumes packing and
    builds an explicit (batch, 1, T, T) mask: another attention path, more memory. The plan answers as the run does."""
    from unittest import mock
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        yield
        return
    with mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None):
        yield


def plan_hf(model: str | Path = "qwen2.5-7b", *, world_size: int = 4, seq_len: int = 1024, batch_size: int = 1,
            layout: str = "bf16", replicate_degree: int = 1, attn: str = "sdpa", device: str = "cpu",
            _fake: bool = True) -> MemoryPlan:
    """Plan every rank's peak memory in a training step of ``train_hf.py`` for ``model`` on ``world_size`` GPUs.

    Args:
        model: a shipped config name (``SHIPPED``) or a folder with the model's config.json (no weights needed).
        world_size: GPUs (ranks) to plan for (>= 1).
        seq_len: tokens per sequence (<= the config's ``max_position_embeddings``).
        batch_size: sequences per rank per step.
        layout: one of ``LAYOUTS``.
        replicate_degree: HSDP: replicas of the sharded model (the mesh is (replicate_degree, world_size /
            replicate_degree)); 1: FSDP over all GPUs.
        attn: the script's ``--attn``: "sdpa" (fused: the output and log-sum-exp saved) or "eager" (the T x T
            scores and probabilities materialised and saved).
        device: ``"cpu"`` or ``"cuda"``: the device whose memory tracker the plan counts as (``plan_memory``'s
            ``device``: on ``"cuda"`` every storage rounded up to 512 bytes, AdamW's ``step`` counters, on the CPU,
            left out), so a plan compares with a ``--track-memory`` run on that device.

    Returns:
        A ``MemoryPlan`` with ``parallel`` "fsdp" (or "hsdp"), every rank's peak by category (``rank_peak_bytes``:
        ranks whose shards differ in size, ``torch.chunk``'s rows of a dimension the ranks do not divide, are traced
        each), the rank that peaks (``peak_rank``) and its plan (``peak_bytes``), ``n_params``, in ``notes`` the
        layout and, under offload, the host bytes, and ``collective_buffer_bytes`` (``largest_collective_bytes``),
        also in ``unsimulated_bytes``, so its headroom counts that buffer as ``plan_memory``'s does: a collective can
        hold it beyond the traced peak (for Qwen2.5-7B the root unit's fp32 gradients of the embedding and the head
        before their reduce-scatter, 4.06 GiB, which decides whether the 7B fits 8 GPUs without offload).

    Raises:
        ConfigError: a bad config (see ``load_hf_config``), layout, size or device; a GPU count the mesh cannot use; a
            process group already existing in this process.
    """
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    config = load_hf_config(model)
    _check(layout, world_size, seq_len, batch_size, replicate_degree, config)
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}")
    if dist.is_available() and dist.is_initialized():
        raise ConfigError("this process already has a process group; plan_hf makes a fake one of its own")
    script = import_script("train_hf")
    if attn not in ("sdpa", "eager"):
        raise ConfigError(f"attn must be 'sdpa' or 'eager', got {attn!r}")
    flags = [str(a) for a in LAYOUTS[layout]]
    offload = "--cpu-offload" in flags
    traced = [f for f in flags if f != "--cpu-offload"]  # offload's GPU bytes: derived from this trace (offloaded)
    args = script.parse_args([*traced, "--model", str(model_folder(model)), "--seq-len", str(seq_len),
                              "--batch-size", str(batch_size), "--max-steps", "2", "--attn", attn])
    trace = dict(script=script, args=args, config=config, world_size=world_size, replicate_degree=replicate_degree,
                 batch_size=batch_size, seq_len=seq_len, device=device, fake=_fake)
    first = _trace_hf(**trace, rank=0)
    shards = world_size // replicate_degree
    plans, groups = _every_rank_hf(first, trace, world_size, shards)
    totals = {rank: sum(plan.values()) for rank, plan in plans.items()}
    peak_rank = max(sorted(totals), key=lambda r: (totals[r], -r))
    # fp32 shards of every parameter (4 bytes); fp32 gradients (4) and AdamW's two moments (8) of the trainable ones.
    analytic = (4 * first.n_params + 12 * first.n_trainable) / shards
    notes = [f"layout {layout}: train_hf.py {' '.join(flags)}",
             f"{first.n_trainable} of {first.n_params} parameters trained"]
    if len(groups) > 1:
        notes.append(f"{len(groups)} distinct shard sizes over {world_size} ranks: traced once each (ranks "
                     + ", ".join(str(r[0]) for r in groups) + ")")
    if device == "cuda":
        notes.append("counted as torch's tracker counts a CUDA run: every storage rounded up to 512 bytes, AdamW's "
                     "step counters (on the CPU) left out")
    plan = MemoryPlan(args=tuple([*traced, "--seq-len", str(seq_len), "--batch-size", str(batch_size)]),
                      parallel="hsdp" if replicate_degree > 1 else "fsdp", world_size=world_size,
                      n_params=first.n_params, peak_bytes=dict(plans[peak_rank]), state_bytes_analytic=analytic,
                      plan_time_s=time.perf_counter() - start, torch_version=torch.__version__,
                      notes=tuple(notes), collective_buffer_bytes=first.buffer, unsimulated_bytes=first.buffer,
                      rank_peak_bytes={rank: dict(plans[rank]) for rank in sorted(plans)}, peak_rank=peak_rank,
                      device=device)
    return offloaded(plan) if offload else plan


def _every_rank_hf(first, trace: dict, world_size: int, shards: int) -> tuple[dict, list]:
    """Every rank's ``{category: bytes}``: rank 0's trace (``first``), and one more per distinct set of shard sizes
    (``torch.chunk``'s rows per rank of every parameter); and the groups of ranks that share one."""
    groups: dict[tuple, list[int]] = {}  # the rows of every parameter a rank holds -> the ranks holding those rows
    for rank in range(world_size):  # HSDP's mesh is (replicate, shard): rank r holds shard r % shards
        groups.setdefault(tuple(shard_rows(shape[0], shards, rank % shards) if shape else 1
                                for shape in first.shapes), []).append(rank)
    plans = {}
    for ranks in groups.values():
        plan_of = first.peak if ranks[0] == 0 else _trace_hf(**trace, rank=ranks[0]).peak
        plans.update({rank: plan_of for rank in ranks})
    return plans, list(groups.values())


@dataclass(frozen=True)
class _HFTrace:
    peak: dict  # {category: bytes} at the tracked step's peak, of the planned device
    n_params: int
    n_trainable: int
    buffer: int  # largest_collective_bytes
    shapes: tuple  # every parameter's global shape


def _trace_hf(*, script, args, config, world_size: int, replicate_degree: int, batch_size: int, seq_len: int,
              device: str, fake: bool, rank: int) -> _HFTrace:
    """train_hf.py's model and two steps in fake mode over a fake process group of ``world_size``, as ``rank``; the
    second step under torch's FSDPMemTracker (as ``--track-memory``), counted as ``device``'s tracker counts."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    cpu = torch.device("cpu")
    with fake_world(world_size, rank):
        shape = (replicate_degree, world_size // replicate_degree) if replicate_degree > 1 else (world_size,)
        names = ("replicate", "shard") if replicate_degree > 1 else ("shard",)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)  # before fake mode: it needs real tensors
        # On meta, outside fake mode (peft moves its adapters with swap_tensors, which fake tensors refuse); then
        # storage inside it: fake tensors, with no values to check.
        net = script.shard(script.meta_model(args, config), args, cpu, mesh)
        shapes = tuple(tuple(p.shape) for p in net.parameters())  # global shapes (DTensor), before fake mode
        # The script's own Windows over a real all-zero token stream just long enough (real inputs, fake outputs).
        windows = script.Windows(torch.zeros(2 * batch_size * world_size * seq_len + 1, dtype=torch.long), seq_len,
                                 0)
        windows.order = list(range(windows.n))  # its shuffle, done here: under fake mode randperm has no values
        # fake=False (tests): real tensors, the same steps, to check what fake mode changes.
        with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext(), _no_packing():
            script.materialize(net, cpu, check=False)
            optimizer = script.build_optimizer(args, net)
            script.train_step(net, optimizer, windows, args, rank, world_size, cpu)  # warm-up: state, caches
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
            counting = counted_as_cuda(optimizer) if device == "cuda" else contextlib.nullcontext()
            with counting:  # from before the tracker registers the model and optimizer
                tracker = FSDPMemTracker(net, optimizer)
                with tracker, hierarchy_warning_silenced():  # transformers' kernels "Func" modules: see its docstring
                    script.train_step(net, optimizer, windows, args, rank, world_size, cpu)
            peak = device_snapshot(tracker.get_tracker_snapshot("peak"), device)
            n_params = sum(p.numel() for p in net.parameters())
            n_trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
            buffer = largest_collective_bytes(net, script.compute_dtype(args, cpu).itemsize)
    return _HFTrace(categories_of(peak), n_params, n_trainable, buffer, shapes)


def largest_collective_bytes(net, param_bytes: int) -> int:
    """The largest buffer one FSDP2 collective of ``net``'s step holds (bytes): per unit (a module ``fully_shard``
    made, with its own parameters, not its sub-units'), its all-gather output (every parameter, unsharded, in the
    compute dtype: ``param_bytes`` per element) or its reduce-scatter input (the trainable ones' gradients, unsharded,
    fp32); the largest over units. ``MemoryPlan.collective_buffer_bytes``: a real gloo run can hold one such buffer a
    moment longer than the plan."""
    from torch.distributed.fsdp import FSDPModule
    units = [m for m in net.modules() if isinstance(m, FSDPModule)]
    largest = 0
    for unit in units:
        nested = {id(p) for sub in unit.modules() if sub is not unit and isinstance(sub, FSDPModule)
                  for p in sub.parameters()}
        own = [p for p in unit.parameters() if id(p) not in nested]
        gathered = param_bytes * sum(p.numel() for p in own)
        reduced = 4 * sum(p.numel() for p in own if p.requires_grad)
        largest = max(largest, gathered, reduced)
    return largest


def offloaded(plan: MemoryPlan) -> MemoryPlan:
    """``plan`` under FSDP2's ``CPUOffloadPolicy``: its parameter shards, its sharded gradients and its optimizer state
    on the host (``host_bytes`` reports them), the rest on the GPU, every rank's plan alike. Derived, not traced:
    FSDP2's offload needs a GPU. Backward still computes a unit's gradients unsharded on the GPU and reduce-scatters
    them there before the shard goes to the host (torch's ``CPUOffloadPolicy``: "Sharded gradients are copied
    device-to-host in backward"), so the gradient bytes at the peak beyond the sharded ones stay on the GPU: for
    Qwen2.5-7B the root unit's unsharded head gradient, 1 GiB. The sharded fp32 gradient of a rank is at most its fp32
    parameter shard (equal when every parameter trains)."""
    def split(peak: dict) -> tuple[dict, int]:
        peak = dict(peak)
        sharded = min(peak["gradients"], peak["parameters"])
        host = peak["parameters"] + sharded + peak["optimizer state"]
        peak["parameters"], peak["gradients"], peak["optimizer state"] = 0, peak["gradients"] - sharded, 0
        return peak, host
    peak, host = split(plan.peak_bytes)
    ranks = {rank: split(bytes_)[0] for rank, bytes_ in plan.rank_peak_bytes.items()}
    note = (f"CPU offload: {host} bytes of shards, sharded gradients and optimizer state on the host, not the GPU "
            "(derived from the trace without offload)")
    return replace(plan, args=(*plan.args, "--cpu-offload"), peak_bytes=peak, rank_peak_bytes=ranks,
                   notes=(*plan.notes, note))


def host_bytes(plan: MemoryPlan) -> int:
    """Bytes an offload plan keeps on the host (0 for other layouts)."""
    for note in plan.notes:
        if note.startswith("CPU offload: "):
            return int(note.split()[2])
    return 0


def gpu_prediction_bytes(plan: MemoryPlan) -> float:
    """What the plan predicts a GPU's ``max_memory_reserved`` plus context to be: the traced peak, plus the caching
    allocator's 10% and 1 GiB for the CUDA context and NCCL (``memory_plan``'s margins) (bytes)."""
    from .memory_plan import CONTEXT_MARGIN_BYTES, FRAGMENTATION_MARGIN
    return plan.total_bytes * (1 + FRAGMENTATION_MARGIN) + CONTEXT_MARGIN_BYTES


def hf_table(models: Sequence[str] = SHIPPED, layouts: Sequence[str] = tuple(LAYOUTS), gpus: Sequence[int] = (4,),
             seq_lens: Sequence[int] = (1024, 4096), *, capacity_bytes: int = GPU_CAPACITY_BYTES["RTX 4090D 24 GB"],
             progress=None):
    """Plans for every model x layout x GPU count x sequence length, one sequence per GPU: a DataFrame with the
    peak by category (GiB), the peak, the largest collective buffer (``MemoryPlan.unsimulated_bytes``, GiB), the
    headroom on a GPU of ``capacity_bytes`` (GiB, the buffer counted; < 0: does not fit) and ``fits``. ``python -m tutorial_lib.planning.hf_plan table`` writes the shipped ``TABLE_CSV``."""
    import pandas as pd
    rows, traced = [], {}
    for model in models:
        for layout in layouts:
            for n in gpus:
                for seq_len in seq_lens:
                    if LAYOUTS[layout] == [*LAYOUTS["bf16 + AC full"], "--cpu-offload"] and \
                            (model, "bf16 + AC full", n, seq_len) in traced:
                        plan = offloaded(traced[model, "bf16 + AC full", n, seq_len])  # no second trace
                    else:
                        plan = plan_hf(model, world_size=n, seq_len=seq_len, layout=layout)
                    traced[model, layout, n, seq_len] = plan
                    headroom = plan.headroom_bytes(capacity_bytes)
                    rows.append({"model": str(model), "n_params": plan.n_params, "layout": layout, "gpus": n,
                                 "seq_len": seq_len, **{f"{k} (GiB)": v / GIB for k, v in plan.peak_bytes.items()},
                                 "peak_gib": plan.total_bytes / GIB,
                                 "collective buffer (GiB)": plan.unsimulated_bytes / GIB,
                                 "host_gib": host_bytes(plan) / GIB,
                                 "headroom_gib": headroom / GIB, "fits": headroom >= 0,
                                 "plan_time_s": plan.plan_time_s, "torch": plan.torch_version})
                    if progress:
                        progress(rows[-1])
    return pd.DataFrame(rows)


def read_hf_table():
    """The shipped table (``TABLE_CSV``, written by ``python -m tutorial_lib.planning.hf_plan table``): every shipped
    model x layout on 1, 2, 4, 8 and 16 RTX 4090D (16: two nodes of 8), sequences of 1024 and 4096 tokens, one per
    GPU."""
    import pandas as pd
    return pd.read_csv(TABLE_CSV)


def fits(table, model: str, layout: str, gpus: int = 4, seq_len: int = 1024) -> bool:
    """Whether the table's plan of ``model`` in ``layout`` on ``gpus`` GPUs at ``seq_len`` fits (headroom >= 0).

    Raises:
        ConfigError: the table has no such row.
    """
    rows = table[(table["model"] == model) & (table["layout"] == layout) & (table["gpus"] == gpus)
                 & (table["seq_len"] == seq_len)]
    if rows.empty:
        raise ConfigError(f"no plan for {model}, {layout}, {gpus} GPUs, seq_len {seq_len} in the table")
    return bool(rows["fits"].iloc[0])


def recommend_layout(table, model: str | Path, gpus: int, seq_len: int, *, progress=None) -> dict:
    """The full fine-tuning layout with the fewest memory savers that fits ``model`` on ``gpus`` GPUs at ``seq_len``
    (``FULL_FINE_TUNING`` order), else the LoRA layout if it fits: ``{"layout": name or None, "headroom_gib": ...,
    "full_fine_tuning": bool}``.

    Args:
        table: plans to pick from (``read_hf_table()``: the shipped models on 1, 2, 4, 8 and 16 RTX 4090D), or ``None``.
        model: a shipped name (any case), or a folder with a config.json (your own model). When ``table`` has no row
            for it at ``gpus`` and ``seq_len``, its layouts are planned here first (``hf_table``: about a minute for a
            7B on 2 CPU cores), on RTX 4090D 24 GB.
        gpus: GPUs (>= 1).
        seq_len: tokens per sequence (one sequence per GPU).
        progress: called with each row planned here (as ``hf_table``'s).

    Raises:
        ConfigError: ``model`` is neither a shipped name nor a folder with a config.json; or what ``plan_hf`` refuses
            (an architecture it cannot plan, a GPU count the mesh cannot use), naming the value.
    """
    name = str(model)
    key = name.lower() if name.lower() in SHIPPED + LARGE else name
    rows = None
    if table is not None:
        rows = table[(table["model"] == key) & (table["gpus"] == gpus) & (table["seq_len"] == seq_len)]
    if rows is None or rows.empty:
        model_folder(model)  # neither a shipped name nor a folder: refused here, naming it, before any plan
        rows = hf_table([model], gpus=(gpus,), seq_lens=(seq_len,), progress=progress)
    for layout in (*FULL_FINE_TUNING, *[name for name in LAYOUTS if name not in FULL_FINE_TUNING]):
        row = rows[rows["layout"] == layout]
        if not row.empty and bool(row["fits"].iloc[0]):
            return {"layout": layout, "headroom_gib": float(row["headroom_gib"].iloc[0]),
                    "full_fine_tuning": layout in FULL_FINE_TUNING}
    return {"layout": None, "headroom_gib": float(rows["headroom_gib"].max()), "full_fine_tuning": False}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tutorial_lib.planning.hf_plan table``: rewrite the shipped table (minutes on 2 cores)."""
    import argparse
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("command", choices=["table"])
    p.add_argument("--out", default=str(TABLE_CSV))
    p.add_argument("--models", nargs="+", default=list(SHIPPED), choices=SHIPPED)
    p.add_argument("--gpus", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    args = p.parse_args(argv)
    # Every row printed as one JSON line as soon as it is planned: an interrupted table keeps what it planned.
    table = hf_table(args.models, gpus=args.gpus, progress=lambda r: print(json.dumps(
        {k: (bool(v) if k == "fits" else v) for k, v in r.items()}), flush=True))
    table.to_csv(args.out, index=False, float_format="%.6g")
    print(f"{len(table)} plans written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["SHIPPED", "LAYOUTS", "GPU_CAPACITY_BYTES", "model_folder", "load_hf_config", "plan_hf", "offloaded",
           "host_bytes",
           "gpu_prediction_bytes", "hf_table", "read_hf_table", "recommend_layout", "HF_LAYOUTS", "fits"]
