"""The planner held against figures other people published: ZeRO's model states, torchtitan's reserved memory on
H100s and Korthikanti et al.'s activations. Each row names both sides' setups, compares like with like, has a stated
tolerance and a control that must leave it; none needs a GPU:

* **ZeRO** (Rajbhandari, Rasley, Ruwase and He, 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models", SC20, arXiv:1910.02054), Figure 1: the model states (parameters, gradients, optimizer state) per GPU of a
  7.5 B-parameter model trained with mixed-precision Adam on 64 GPUs: 120 GB (plain data parallel), 31.4 GB (stage 1,
  P_os), 16.6 GB (stage 2, P_os+g), 1.9 GB (stage 3, P_os+g+p). The paper's arithmetic (§3.1, §5), with Psi
  parameters, N GPUs and K = 12 bytes of optimizer state per parameter (an fp32 master copy 4, Adam's momentum 4 and
  variance 4), next to 2 bytes of fp16 parameter and 2 of fp16 gradient: baseline (2 + 2 + K) Psi; stage 1
  2 Psi + 2 Psi + K Psi / N; stage 2 2 Psi + (2 + K) Psi / N; stage 3 (2 + 2 + K) Psi / N; GB = 1e9 bytes.

  ``zero_row`` holds each stage against the traced planner: ``plan_memory`` runs ``train_lm.py``'s step of a model of
  7.46 B parameters (``ZERO_STAND_IN``: the paper gives no 7.5 B layout) on 64 fake ranks under torch's memory
  tracker, and the model states are the tracker's parameter, gradient and optimizer-state categories, each at its
  largest in the step (``MemoryPlan.largest_bytes``): a static count, as Figure 1's. Stage 0 is DDP, stage 3 FSDP2's
  full shard, stage 2 FSDP2 with ``reshard_after_forward=False`` (each block's bf16 parameters stay gathered from its
  forward to its backward). The workbook's mixed precision splits ZeRO's 16 bytes per parameter otherwise: fp32
  parameters (the master copy is the parameter), fp32 gradients and two fp32 moments, 4 + 4 + 8 = 16 = 2 + 2 + 12; so
  stages 0 and 3 count the same bytes, and stage 2 holds 2/N bytes per parameter more (fp32 gradient shards where ZeRO
  keeps fp16 ones: 2 + 16/N against 2 + 14/N), stated as ``zero_difference_bytes`` and taken off before comparing.
  Each row must come within ``ZERO_TOLERANCE`` (1%) of the paper's formula, and ``ZERO_CONTROL``, a 6.97 B model,
  must not. Stage 1 is not traced (``ZERO_UNTRACED`` says why).

* **Korthikanti et al.** (Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi and Catanzaro, 2022, "Reducing
  Activation Recomputation in Large Transformer Models", arXiv:2205.05198, MLSys 2023), §4 and Table 2: the bytes of
  activations one GPT layer stores for its backward, with 16-bit activations, dropout, the attention scores
  materialised and a 4h GeLU MLP: sbh(34 + 5as/h) with no parallelism (s sequence, b micro-batch, h width, a heads),
  sbh(10 + 24/t + 5as/(ht)) with tensor parallelism of degree t, sbh(34/t + 5as/(ht)) with sequence parallelism too.
  (Table 2 as public sources cite it; the arXiv text was not reachable from here. §4.1's terms are listed in
  ``KORTHIKANTI_TERMS``.) ``korthikanti_bytes`` and ``korthikanti_terms`` are
  that arithmetic; ``tutorial_lib.planning.layer_memory`` measures such a layer (``megatron_layer``, in Megatron-LM's
  order) with torch's ``MemTracker`` in ``FakeTensorMode`` and lists it tensor by tensor against these terms.

* **torchtitan** (``TORCHTITAN_LLAMA3_8B``): its Llama 3.1 8B on 8 H100s of 96 GB, 82.4 GiB of max reserved memory,
  against ``plan_hf`` plus the caching allocator's 10% (``torchtitan_row``; tolerance 15%, a 24-layer control).

``python -m tutorial_lib.planning.layer_memory`` prints the ZeRO rows and the Korthikanti comparisons.

GiB (2**30 bytes) is what the planner prints elsewhere; the papers' GB are 1e9 bytes: the names here say which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from .memory_plan import plan_memory

GB = 10 ** 9  # the papers' gigabyte (ZeRO's Figure 1 reads 7.5e9 x 16 bytes as "120GB")


@dataclass(frozen=True)
class PublishedFigure:
    """One number a paper or a benchmark page printed, with where it is and what it assumed.

    Attributes:
        source: the paper (authors, year, title, where published) or the page (repository, file, date).
        where: the figure or table, and the row.
        quantity: what the number measures.
        value: the number as printed.
        unit: its unit as printed (GB = 1e9 bytes, GiB = 2**30 bytes).
        conditions: the setting the number is for, in words.
    """

    source: str
    where: str
    quantity: str
    value: float
    unit: str
    conditions: str


ZERO_SOURCE = ("Rajbhandari, Rasley, Ruwase and He (2020), 'ZeRO: Memory Optimizations Toward Training Trillion "
               "Parameter Models', SC20, arXiv:1910.02054")
ZERO_PARAMS = 7_500_000_000  # Psi, Figure 1
ZERO_GPUS = 64  # N_d, Figure 1
ZERO_K = 12  # bytes of optimizer state per parameter for mixed-precision Adam: fp32 master, momentum, variance
ZERO_STAGES = (0, 1, 2, 3)  # 0: the baseline (plain data parallel)
_ZERO_CONDITIONS = "Psi = 7.5e9 parameters, N_d = 64 GPUs, mixed-precision Adam (K = 12); model states only"
ZERO_FIGURE_1 = {
    0: PublishedFigure(ZERO_SOURCE, "Figure 1, 'Baseline'", "model states per GPU", 120.0, "GB", _ZERO_CONDITIONS),
    1: PublishedFigure(ZERO_SOURCE, "Figure 1, 'P_os'", "model states per GPU", 31.4, "GB", _ZERO_CONDITIONS),
    2: PublishedFigure(ZERO_SOURCE, "Figure 1, 'P_os+g'", "model states per GPU", 16.6, "GB", _ZERO_CONDITIONS),
    3: PublishedFigure(ZERO_SOURCE, "Figure 1, 'P_os+g+p'", "model states per GPU", 1.9, "GB", _ZERO_CONDITIONS),
}
# The stand-in for Figure 1's model. The paper gives no layout for a 7.5 B model: Figure 1 is an accounting, and Table 4
# (the configurations of Figures 2-4) lists 1.5 B (48 layers x 1600), 8 B (72 x 3072) and ranges at widths 1920-8192,
# none of 7.5 B. So: train_lm.py's GPT (untied head, learned positions, no biases, GPT-2's vocabulary padded to
# 50304, 1024 positions) at GPT-3 6.7B's width and heads (Brown et al. 2020, Table 2.1: 4096, 32) with the layer count
# whose total is nearest 7.5e9: 35 layers, 7,463,006,208 parameters (0.49% below Psi). Every first dimension divides
# by 64 (4096, 12288, 16384, 50304 = 64 x 786, 1024), so FSDP's shards are exact.
ZERO_STAND_IN = {"n_layers": 35, "d_model": 4096, "n_heads": 32}
# The control: a model 7.0% smaller than Psi, built another way (14 layers of width 6144, 48 heads: 6.97 B parameters;
# few layers, so its trace is quick). Every row must leave its tolerance with it.
ZERO_CONTROL = {"n_layers": 14, "d_model": 6144, "n_heads": 48}
ZERO_TOLERANCE = 0.01  # |comparable / formula - 1|: the stand-in is 0.49% off Psi; nothing else may differ
ZERO_FLAGS = ["--vocab-size", 50304, "--block-size", 1024, "--batch-size", 1, "--precision", "bf16"]
# Each stage's torch layout (train_lm.py flags; AdamW, foreach off: the script's), and the tracker categories
# (torch.distributed._tools: MemTracker's _MemRefType, FSDPMemTracker's _FSDPRefType) that make its model states,
# each at its largest in the traced step (MemoryPlan.largest_bytes).
ZERO_LAYOUTS = {0: ["--parallel", "ddp"], 2: ["--parallel", "fsdp", "--reshard-after-forward", "no"],
                3: ["--parallel", "fsdp"]}
ZERO_STATES = {0: ("PARAM", "GRAD", "OPT"), 2: ("SHARDED_PARAM", "UNSHARDED_PARAM", "SHARDED_GRAD", "OPT"),
               3: ("SHARDED_PARAM", "SHARDED_GRAD", "OPT")}
ZERO_EQUIVALENT_WORDS = {
    0: "DDP, AdamW under bf16 autocast: fp32 parameters 4, gradients 4 (DDP's buckets), moments 8, all replicated",
    1: "not traced: DDP + torch.distributed.optim.ZeroRedundancyOptimizer (see ZERO_UNTRACED)",
    2: ("FSDP2 fully_shard(reshard_after_forward=False), bf16 MixedPrecisionPolicy: every block's bf16 parameters "
        "gathered from its forward to its backward (2), fp32 shards 4/N, fp32 gradient shards 4/N, moments 8/N"),
    3: "FSDP2 fully_shard, bf16 MixedPrecisionPolicy: fp32 shards 4/N, fp32 gradient shards 4/N, moments 8/N",
}
# What separates the torch layout's count from the paper's, per parameter, and why (the comparable quantity is the
# traced count minus this).
ZERO_DIFFERENCES = {
    0: "none: 4 + 4 + 8 = 16 = 2 + 2 + 12",
    2: ("2/N: FSDP2 keeps fp32 gradient shards (4/N) where ZeRO keeps fp16 ones (2/N): 2 + 16/N against ZeRO's "
        "2 + 14/N; the gathered bf16 parameters (2) are ZeRO's replicated fp16 ones"),
    3: "none: 4/N + 4/N + 8/N = 16/N = (2 + 2 + 12)/N",
}
# Stage 1 is not a traced row, and why (torch/distributed/optim/zero_redundancy_optimizer.py, torch 2.8 and 2.13).
ZERO_UNTRACED = {1: (
    "not traced yet: torch's equivalent is DDP with torch.distributed.optim.ZeroRedundancyOptimizer(AdamW). train_lm.py "
    "does not build it: its DCP checkpoints read the optimizer through get_state_dict, and "
    "ZeroRedundancyOptimizer.state_dict() raises unless consolidate_state_dict(to=rank) has gathered every rank's "
    "state first. And its partition gives whole parameters to ranks, greedily per parameter group "
    "(_partition_parameters), so each of the 64 ranks holds a different share, where the DDP plan traces one process "
    "of a world of 1. Its count, 4 + 4 + 8/N bytes per parameter on average (ZeRO's 2 + 2 + 12/N, 4 (1 - 1/N) less), is "
    "memory_model's 'zero1' arithmetic, whose partition equals torch's on a fake 3-rank group "
    "(test_zero1_partition_is_torchs): not evidence for the traced planner.")}


def zero_paper_bytes_per_parameter(stage: int, *, world_size: int = ZERO_GPUS, k: int = ZERO_K) -> dict[str, float]:
    """ZeRO's model states per GPU, in bytes per model parameter, as the paper counts them (its §3.1 and §5).

    Args:
        stage: 0 (the data-parallel baseline), 1 (P_os), 2 (P_os+g) or 3 (P_os+g+p).
        world_size: N_d, the data-parallel GPUs (>= 1).
        k: bytes of optimizer state per parameter (12 for mixed-precision Adam: an fp32 master copy, momentum and
            variance).

    Returns:
        ``{"params": ..., "grads": ..., "optimizer_state": ..., "total": ...}`` (bytes per parameter per GPU): fp16
        parameters 2, fp16 gradients 2, optimizer state K, each divided by N_d from the stage that partitions it.

    Raises:
        ConfigError: a stage outside 0-3 or a world size below 1.
    """
    if stage not in ZERO_STAGES:
        raise ConfigError(f"stage must be one of {ZERO_STAGES} (0: the baseline), got {stage!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be an integer >= 1, got {world_size!r}")
    n = world_size
    row = {"params": 2 / n if stage >= 3 else 2.0, "grads": 2 / n if stage >= 2 else 2.0,
           "optimizer_state": k / n if stage >= 1 else float(k)}
    row["total"] = sum(row.values())
    return row


def zero_difference_bytes(stage: int, n_params: int, world_size: int) -> float:
    """The bytes per GPU by which stage ``stage``'s torch layout holds more model states than ZeRO's count for
    ``n_params`` parameters on ``world_size`` GPUs (``ZERO_DIFFERENCES`` in words): 0 for stages 0 and 3,
    ``2 * n_params / world_size`` for stage 2."""
    if stage not in ZERO_LAYOUTS:
        raise ConfigError(f"stage must be one of {tuple(ZERO_LAYOUTS)} (the traced ones), got {stage!r}")
    return 2 * n_params / world_size if stage == 2 else 0.0


def zero_args(stage: int, model: Mapping[str, int] | None = None) -> list:
    """train_lm.py's flags for ZeRO stage ``stage``'s torch layout on ``model`` (``{"n_layers", "d_model",
    "n_heads"}``; default ``ZERO_STAND_IN``), as ``plan_memory`` takes them."""
    model = ZERO_STAND_IN if model is None else model
    zero_difference_bytes(stage, 1, 1)  # checks the stage
    return ["--n-layers", model["n_layers"], "--d-model", model["d_model"], "--n-heads", model["n_heads"],
            *ZERO_FLAGS, *ZERO_LAYOUTS[stage]]


@dataclass(frozen=True)
class ZeroRow:
    """One row of ZeRO's Figure 1 beside the traced planner (GB = 1e9 bytes).

    Attributes:
        stage: 0 (baseline), 2 or 3.
        published_gb: Figure 1's number, as printed.
        formula_gb: the paper's arithmetic at Psi = 7.5e9, N = 64 (Figure 1's number unrounded).
        setup: both sides' setups, in words.
        n_params: parameters of the traced model.
        traced_gb: the model states the traced step holds (``ZERO_STATES[stage]``, each at its largest), rank 0.
        difference_gb: ``zero_difference_bytes`` for the traced model.
        comparable_gb: ``traced_gb - difference_gb``: what ZeRO's count is for the traced model.
        relative_error: ``comparable_gb / formula_gb - 1``.
        within_tolerance: ``abs(relative_error) <= ZERO_TOLERANCE``.
        plan_time_s: the trace's wall time (seconds).
        torch_version: the torch that traced it.
    """

    stage: int
    published_gb: float
    formula_gb: float
    setup: str
    n_params: int
    traced_gb: float
    difference_gb: float
    comparable_gb: float
    relative_error: float
    within_tolerance: bool
    plan_time_s: float
    torch_version: str


def zero_row(stage: int, model: Mapping[str, int] | None = None, *, world_size: int = ZERO_GPUS) -> ZeroRow:
    """ZeRO's Figure 1, stage ``stage``, against ``plan_memory`` tracing ``train_lm.py``'s step of ``model``.

    Args:
        stage: 0, 2 or 3 (stage 1: ``ZERO_UNTRACED``).
        model: ``{"n_layers", "d_model", "n_heads"}`` (default ``ZERO_STAND_IN``; ``ZERO_CONTROL`` must fail).
        world_size: GPUs (default Figure 1's 64; the formula stays at 64).

    Returns:
        A ``ZeroRow``: the traced model states (the tracker's categories ``ZERO_STATES[stage]``, each at its largest
        in the step: ``MemoryPlan.largest_bytes``), less ``zero_difference_bytes``, against the paper's formula.

    Raises:
        ConfigError: a stage that is not traced.
    """
    plan = plan_memory(zero_args(stage, model), world_size=world_size)
    traced = sum(plan.largest_bytes[name] for name in ZERO_STATES[stage])
    difference = zero_difference_bytes(stage, plan.n_params, world_size)
    formula = zero_paper_bytes_per_parameter(stage)["total"] * ZERO_PARAMS / GB
    comparable = (traced - difference) / GB
    shape = model or ZERO_STAND_IN
    setup = (f"paper: {ZERO_FIGURE_1[stage].where}, {_ZERO_CONDITIONS}; planner: train_lm.py "
             f"{shape['n_layers']} layers x {shape['d_model']} ({plan.n_params:,} parameters), {world_size} fake "
             f"ranks, {ZERO_EQUIVALENT_WORDS[stage]}; torch {plan.torch_version}; tracker categories "
             f"{' + '.join(ZERO_STATES[stage])}")
    return ZeroRow(stage=stage, published_gb=ZERO_FIGURE_1[stage].value, formula_gb=formula, setup=setup,
                   n_params=plan.n_params, traced_gb=traced / GB, difference_gb=difference / GB,
                   comparable_gb=comparable, relative_error=comparable / formula - 1,
                   within_tolerance=abs(comparable / formula - 1) <= ZERO_TOLERANCE, plan_time_s=plan.plan_time_s,
                   torch_version=plan.torch_version)


def zero_rows(stages: Sequence[int] = tuple(ZERO_LAYOUTS), model: Mapping[str, int] | None = None):
    """``zero_row`` for each stage, as a DataFrame indexed by stage (``ZeroRow``'s fields as columns, GB)."""
    import pandas as pd
    from dataclasses import asdict

    return pd.DataFrame([asdict(zero_row(stage, model)) for stage in stages]).set_index("stage")


# --- torchtitan's Llama 3.1 8B: a GPU measurement ---------------------------------------------------------------------

TORCHTITAN_SOURCE = ("pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (the torchtitan team, end of "
                     "2024; torch 1963fc8 of 2024-12-23, torchtitan 9dec370 of 2024-12-26)")
TORCHTITAN_LLAMA3_8B = PublishedFigure(
    TORCHTITAN_SOURCE, "Table 1, row 'FSDP' (no torch.compile, no Float8)",
    "max reserved memory per GPU: torch.cuda.memory_stats()['reserved_bytes.all.peak'] (torchtitan's "
    "memory/max_reserved(GiB), GiB = 2**30 bytes), stable over the run",
    82.4, "GiB",
    "torchtitan's own Llama 3.1 8B (its model code; the shapes of Meta's: 32 layers, width 4096, 32 heads, 8 KV heads, "
    "MLP 14336, vocabulary 128256, untied output), FSDP2 over 8 NVIDIA H100 with 96 GB HBM2e each (Grand Teton, "
    "NVLink), local batch 2, sequence 8192 (train_configs/llama3_8b.toml), selective activation checkpointing 'op' "
    "(mm outputs saved except every second one, SDPA and reduce-scatter outputs saved), bf16 parameters with fp32 "
    "reduction, AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1, foreach: optimizer.fused off by default)")
TORCHTITAN_GPU = "NVIDIA H100 96 GB HBM2e"  # not the 80 GB H100 of hf_plan.GPU_CAPACITY_BYTES
# The workbook's side: train_hf.py's step of Hugging Face's LlamaForCausalLM from the shipped config (the same
# shapes, other kernels), its selective policy (mm and addmm outputs saved except every second one, bmm's and SDPA's
# saved; torchtitan's also saves the reduce-scatter outputs, which FSDP2 does not checkpoint here), AdamW with foreach off, on 8 fake ranks. Its reserved-style prediction is the plan plus the caching
# allocator's FRAGMENTATION_MARGIN (10%), not the CONTEXT_MARGIN_BYTES: the CUDA context and NCCL's buffers lie outside
# the allocator, so outside reserved_bytes.
TORCHTITAN_PLAN = {"model": "llama-3.1-8b", "world_size": 8, "seq_len": 8192, "batch_size": 2,
                   "layout": "bf16 + AC selective"}
# The tolerance: reserved above allocated is a judgement here (no GPU measured it): 15% covers a reserved-over-
# allocated share from 0 to about 25%.
TORCHTITAN_TOLERANCE = 0.15


def torchtitan_row(config: str | None = None) -> dict:
    """torchtitan's 82.4 GiB (``TORCHTITAN_LLAMA3_8B``) beside the planner's reserved-style prediction.

    Args:
        config: the model (``plan_hf``'s ``model``: a shipped name or a folder with a config.json); default the
            shipped Llama 3.1 8B. A changed model is the row's control.

    Returns:
        ``{"published (GiB)", "plan (GiB)", "predicted reserved (GiB)", "relative error", "within tolerance",
        "plan time (s)", "torch", "setup"}``: the plan's peak, that plus ``FRAGMENTATION_MARGIN``, its error against
        82.4 GiB and whether that is within ``TORCHTITAN_TOLERANCE``.
    """
    from .hf_plan import plan_hf
    from .memory_plan import FRAGMENTATION_MARGIN, GIB

    args = dict(TORCHTITAN_PLAN, model=config or TORCHTITAN_PLAN["model"])
    plan = plan_hf(**args)
    predicted = plan.total_bytes * (1 + FRAGMENTATION_MARGIN) / GIB
    error = predicted / TORCHTITAN_LLAMA3_8B.value - 1
    return {"published (GiB)": TORCHTITAN_LLAMA3_8B.value, "plan (GiB)": plan.total_bytes / GIB,
            "predicted reserved (GiB)": predicted, "relative error": error,
            "within tolerance": abs(error) <= TORCHTITAN_TOLERANCE, "plan time (s)": plan.plan_time_s,
            "torch": plan.torch_version,
            "setup": f"published: {TORCHTITAN_LLAMA3_8B.conditions}; planner: plan_hf({args}), peak + 10%"}


# --- Korthikanti et al. 2022: activations per transformer layer ------------------------------------------------------

KORTHIKANTI_SOURCE = ("Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi and Catanzaro (2022), 'Reducing Activation "
                      "Recomputation in Large Transformer Models', arXiv:2205.05198 (MLSys 2023)")
# Table 2: activation bytes per transformer layer, 16-bit activations.
KORTHIKANTI_TABLE_2 = {
    "none": "sbh(34 + 5as/h)",  # no parallelism (§4.1)
    "tp": "sbh(10 + 24/t + 5as/(ht))",  # tensor parallel (§4.2)
    "tp+sp": "sbh(34/t + 5as/(ht))",  # tensor + sequence parallel (§4.2)
    "tp+selective": "sbh(10 + 24/t)",  # tensor parallel + selective activation recomputation
    "tp+sp+selective": "sbh(34/t)",  # tensor + sequence parallel + selective activation recomputation
    "full": "sbh(2)",  # full activation recomputation: the layer's input only
}
# §4.1's terms, in units of sbh (bytes) or as^2b (bytes), and how each divides under tensor ("tp") and sequence
# ("sp") parallelism: "t" divided by t, "1" replicated on every rank.
KORTHIKANTI_TERMS = (
    # (term, coefficient, unit, under tp, under tp+sp)
    ("LayerNorm 1 input", 2, "sbh", "1", "t"),
    ("QKV linear input (LayerNorm 1 output)", 2, "sbh", "1", "t"),
    ("Q and K (for QK^T)", 4, "sbh", "t", "t"),
    ("softmax output", 2, "as^2b", "t", "t"),
    ("attention dropout mask", 1, "as^2b", "t", "t"),
    ("attention dropout output (for attention over V)", 2, "as^2b", "t", "t"),
    ("V (for attention over V)", 2, "sbh", "t", "t"),
    ("output linear input", 2, "sbh", "t", "t"),
    ("attention residual dropout mask", 1, "sbh", "1", "t"),
    ("LayerNorm 2 input", 2, "sbh", "1", "t"),
    ("fc1 input (LayerNorm 2 output)", 2, "sbh", "1", "t"),
    ("GeLU input (fc1 output)", 8, "sbh", "t", "t"),
    ("fc2 input (GeLU output)", 8, "sbh", "t", "t"),
    ("MLP residual dropout mask", 1, "sbh", "1", "t"),
)
LAYOUTS = ("none", "tp", "tp+sp")


def korthikanti_terms(*, s: int, b: int, h: int, a: int, t: int = 1, layout: str = "none") -> dict[str, float]:
    """§4.1's activation terms of one layer, in bytes, for ``layout`` (Korthikanti et al. 2022).

    Args:
        s: sequence length (tokens); b: micro-batch (sequences); h: width; a: attention heads.
        t: tensor-parallel degree (1 for ``"none"``).
        layout: ``"none"``, ``"tp"`` (Megatron's tensor parallelism) or ``"tp+sp"`` (with sequence parallelism).

    Returns:
        ``{term: bytes}`` in ``KORTHIKANTI_TERMS``' order; their sum is ``korthikanti_bytes``.

    Raises:
        ConfigError: an unknown layout, or t != 1 without parallelism.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "none" and t != 1:
        raise ConfigError(f"layout 'none' has no tensor parallelism: t must be 1, got {t}")
    out = {}
    for term, coefficient, unit, tp, sp in KORTHIKANTI_TERMS:
        size = s * b * h if unit == "sbh" else a * s * s * b
        divide = {"none": "1", "tp": tp, "tp+sp": sp}[layout] == "t"
        out[term] = coefficient * size / (t if divide else 1)
    return out


def korthikanti_bytes(*, s: int, b: int, h: int, a: int, t: int = 1, layout: str = "none") -> float:
    """Table 2's activation bytes per transformer layer (Korthikanti et al. 2022).

    ``"none"``: sbh(34 + 5as/h); ``"tp"``: sbh(10 + 24/t + 5as/(ht)); ``"tp+sp"``: sbh(34/t + 5as/(ht)). Arguments as
    ``korthikanti_terms``; bytes (16-bit activations, 1-byte dropout masks).
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    sbh = s * b * h
    quadratic = 5 * a * s / (h * t)
    return sbh * {"none": 34 + 5 * a * s / h, "tp": 10 + 24 / t + quadratic, "tp+sp": 34 / t + quadratic}[layout]


__all__ = ["PublishedFigure", "ZERO_FIGURE_1", "ZERO_SOURCE", "ZERO_PARAMS", "ZERO_GPUS", "ZERO_K", "ZERO_STAND_IN",
           "ZERO_CONTROL", "ZERO_TOLERANCE", "ZERO_LAYOUTS", "ZERO_STATES", "ZERO_UNTRACED", "ZeroRow",
           "zero_paper_bytes_per_parameter", "zero_difference_bytes", "zero_args", "zero_row", "zero_rows",
           "TORCHTITAN_LLAMA3_8B", "TORCHTITAN_GPU", "TORCHTITAN_PLAN", "TORCHTITAN_TOLERANCE", "torchtitan_row",
           "KORTHIKANTI_SOURCE", "KORTHIKANTI_TABLE_2", "KORTHIKANTI_TERMS", "korthikanti_terms", "korthikanti_bytes",
           "LAYOUTS", "GB"]
