"""The planner held against figures other people published: ZeRO's model states and Korthikanti et al.'s activations.

Two papers give memory figures that the workbook's planner can reproduce from its own parts, with no GPU:

* **ZeRO** (Rajbhandari, Rasley, Ruwase and He, 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models", SC20, arXiv:1910.02054), Figure 1: the model states (parameters, gradients, optimizer state) per GPU of a
  7.5 B-parameter model trained with mixed-precision Adam on 64 GPUs: 120 GB (plain data parallel), 31.4 GB (stage 1,
  P_os), 16.6 GB (stage 2, P_os+g), 1.9 GB (stage 3, P_os+g+p). The paper's arithmetic (§3.1, §5), with Psi
  parameters, N GPUs and K = 12 bytes of optimizer state per parameter (an fp32 master copy 4, Adam's momentum 4 and
  variance 4), next to 2 bytes of fp16 parameter and 2 of fp16 gradient: baseline (2 + 2 + K) Psi; stage 1
  2 Psi + 2 Psi + K Psi / N; stage 2 2 Psi + (2 + K) Psi / N; stage 3 (2 + 2 + K) Psi / N; GB = 1e9 bytes.
  ``zero_rows`` puts the planner's bytes (``memory_model.predict_state_bytes``) beside each.

  The workbook's mixed precision keeps the same 16 bytes per parameter split otherwise: FSDP2's
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` and DDP under autocast keep fp32 parameters (4, the
  "master" copy is the parameter itself), fp32 gradients (4) and Adam's two fp32 moments (8): 4 + 4 + 8 = 16 = ZeRO's
  2 + 2 + 12. So the totals agree where everything is replicated (baseline) or everything is sharded (stage 3, which
  FSDP2's full sharding is), and they differ where ZeRO replicates part of the state: stage 1's torch equivalent,
  ``ZeroRedundancyOptimizer`` over fp32 parameters, replicates 4 + 4 bytes and shards 8, where ZeRO replicates 2 + 2 and
  shards 12 (its master copy is optimizer state). Stage 2 has no equivalent in torch's data-parallel wrappers: FSDP's
  "SHARD_GRAD_OP" (FSDP2's ``reshard_after_forward=False``) keeps parameters sharded between steps.

* **Korthikanti et al.** (Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi and Catanzaro, 2022, "Reducing
  Activation Recomputation in Large Transformer Models", arXiv:2205.05198, MLSys 2023), §4 and Table 2: the bytes of
  activations one GPT layer stores for its backward, with 16-bit activations, dropout, the attention scores
  materialised and a 4h GeLU MLP: sbh(34 + 5as/h) with no parallelism (s sequence, b micro-batch, h width, a heads),
  sbh(10 + 24/t + 5as/(ht)) with tensor parallelism of degree t, sbh(34/t + 5as/(ht)) with sequence parallelism too.
  (Table 2 as public sources cite it; the arXiv text was not reachable from here. §4.1's terms are listed in
  ``KORTHIKANTI_TERMS``.) ``korthikanti_bytes`` and ``korthikanti_terms`` are
  that arithmetic; ``tutorial_lib.planning.layer_memory`` measures such a layer (``megatron_layer``, in Megatron-LM's
  order) with torch's ``MemTracker`` in ``FakeTensorMode`` and lists it tensor by tensor against these terms.

``python -m tutorial_lib.planning.layer_memory`` prints both comparisons.

GiB (2**30 bytes) is what the planner prints elsewhere; the papers' GB are 1e9 bytes: the names here say which.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from .memory_model import predict_state_bytes

GB = 10 ** 9  # the papers' gigabyte (ZeRO's Figure 1 reads 7.5e9 x 16 bytes as "120GB")


@dataclass(frozen=True)
class PublishedFigure:
    """One number a paper printed, with where it is and what it assumed.

    Attributes:
        source: the paper (authors, year, title, where published).
        where: the figure or table, and the row.
        quantity: what the number measures.
        value: the number as printed.
        unit: its unit as printed (GB = 1e9 bytes).
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
# The planner's equivalent of each stage: a memory_model strategy, or None where torch has none.
ZERO_EQUIVALENTS = {0: "ddp", 1: "zero1", 2: None, 3: "fsdp2"}
ZERO_DIFFERENCES = {
    0: "none: 4 + 4 + 8 = 16 = 2 + 2 + 12",
    1: ("the workbook replicates fp32 parameters and gradients (4 + 4) where ZeRO replicates fp16 ones (2 + 2) and "
        "counts its fp32 master copy (4) in the partitioned K: 4 Psi (1 - 1/N) more on average; and "
        "ZeroRedundancyOptimizer partitions whole parameters, so the rank that owns the embedding (206 M elements, "
        "more than Psi/N) holds more than 1/N of the moments"),
    2: "no equivalent to compare",
    3: "none: 16/N = 16/N; FSDP2's torch.chunk rows give rank 0 a few elements more",
}
ZERO_EQUIVALENT_WORDS = {
    0: "DDP with AdamW (fp32 parameters, gradients, two moments: replicated)",
    1: "DDP with torch's ZeroRedundancyOptimizer(AdamW) (parameters and gradients replicated, moments partitioned)",
    2: "none: torch shards gradients only together with parameters (FSDP)",
    3: "FSDP2 full shard (fully_shard), AdamW, fp32 shards under a bf16 MixedPrecisionPolicy or none",
}


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


def gpt_shapes(*, n_layers: int = 36, width: int = 4096, vocab_size: int = 50304,
               max_positions: int = 2048) -> dict[str, list[int]]:
    """The parameter shapes of a GPT-2-style model (learned positions, biases, two LayerNorms per layer, a tied head).

    The default, 36 layers of width 4096, has 7.46 B parameters: a stand-in for ZeRO's 7.5 B model (the paper gives no
    layout for it), whose shapes decide how ``ZeroRedundancyOptimizer`` partitions whole parameters over the ranks.

    Args:
        n_layers, width, vocab_size, max_positions: the model's size (counts).

    Returns:
        ``{name: shape}`` in ``model.parameters()`` order, for ``memory_model.predict_state_bytes``.
    """
    h = width
    shapes = {"wte.weight": [vocab_size, h], "wpe.weight": [max_positions, h]}
    for i in range(n_layers):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": [h], p + "ln_1.bias": [h], p + "attn.c_attn.weight": [3 * h, h],
                       p + "attn.c_attn.bias": [3 * h], p + "attn.c_proj.weight": [h, h], p + "attn.c_proj.bias": [h],
                       p + "ln_2.weight": [h], p + "ln_2.bias": [h], p + "mlp.c_fc.weight": [4 * h, h],
                       p + "mlp.c_fc.bias": [4 * h], p + "mlp.c_proj.weight": [h, 4 * h], p + "mlp.c_proj.bias": [h]})
    shapes.update({"ln_f.weight": [h], "ln_f.bias": [h]})
    return shapes


def planner_bytes_per_parameter(strategy: str, shapes: Mapping[str, Sequence[int]], *,
                                world_size: int) -> dict[str, float]:
    """The planner's model states per rank, in bytes per model parameter, on the rank that holds the most.

    Args:
        strategy: a ``memory_model`` strategy (``"ddp"``, ``"zero1"``, ``"fsdp2"``, ``"fsdp1"``), AdamW.
        shapes: ``{name: shape}`` of the model (``gpt_shapes()``).
        world_size: ranks (>= 1).

    Returns:
        ``{"params", "grads", "optimizer_state", "total"}`` in bytes per parameter of the whole model, from
        ``predict_state_bytes`` (AdamW's 4-byte step tensors included), for the rank with the largest total, and
        ``"rank"``: which rank that is.
    """
    n_params = sum(math.prod(s) for s in shapes.values())
    best = max((predict_state_bytes(shapes, strategy=strategy, world_size=world_size, rank=r)
                for r in range(world_size)), key=lambda s: s.state_bytes)
    row = {"params": best.param_bytes / n_params, "grads": best.grad_bytes / n_params,
           "optimizer_state": best.optimizer_state_bytes / n_params}
    row["total"] = sum(row.values())
    row["rank"] = best.rank
    return row


def zero_rows(shapes: Mapping[str, Sequence[int]] | None = None, *, n_params: int = ZERO_PARAMS,
              world_size: int = ZERO_GPUS):
    """ZeRO's Figure 1 beside the planner: a DataFrame, one row per stage.

    Args:
        shapes: the layout the planner partitions (default ``gpt_shapes()``, 7.46 B parameters); its bytes per
            parameter are scaled to ``n_params``.
        n_params: Psi (default 7.5e9, Figure 1's).
        world_size: N_d (default 64, Figure 1's).

    Returns:
        A DataFrame indexed by stage (0 = baseline) with: ``published (GB)`` (Figure 1's number, GB = 1e9 bytes),
        ``paper bytes/param`` (the paper's split "params + grads + optimizer"), ``paper formula (GB)`` (its
        arithmetic, unrounded), ``planner equivalent`` (in words), ``planner bytes/param`` (the planner's split),
        ``planner (GB)`` (bytes per parameter x Psi, the largest rank), ``planner mean (GB)`` (over the ranks),
        ``planner / formula - 1`` (the largest rank), ``why they differ`` and ``source``. Stage 2's planner columns
        are empty (no equivalent).
    """
    import pandas as pd

    shapes = gpt_shapes() if shapes is None else shapes
    rows = []
    for stage in ZERO_STAGES:
        paper = zero_paper_bytes_per_parameter(stage, world_size=world_size)
        row = {"stage": stage, "published (GB)": ZERO_FIGURE_1[stage].value,
               "paper bytes/param": _split(paper), "paper formula (GB)": paper["total"] * n_params / GB,
               "planner equivalent": ZERO_EQUIVALENT_WORDS[stage], "planner bytes/param": None,
               "planner (GB)": None, "planner mean (GB)": None, "planner / formula - 1": None}
        strategy = ZERO_EQUIVALENTS[stage]
        if strategy is not None:
            planned = planner_bytes_per_parameter(strategy, shapes, world_size=world_size)
            row["planner bytes/param"] = _split(planned)
            row["planner (GB)"] = planned["total"] * n_params / GB
            per_rank = [predict_state_bytes(shapes, strategy=strategy, world_size=world_size, rank=r).state_bytes
                        for r in range(world_size)]
            row["planner mean (GB)"] = sum(per_rank) / world_size / sum(math.prod(x) for x in shapes.values()) \
                * n_params / GB
            row["planner / formula - 1"] = row["planner (GB)"] / row["paper formula (GB)"] - 1
        row["why they differ"] = ZERO_DIFFERENCES[stage]
        row["source"] = f"{ZERO_FIGURE_1[stage].where}; {ZERO_SOURCE}"
        rows.append(row)
    return pd.DataFrame(rows).set_index("stage")


def _split(row: Mapping[str, float]) -> str:
    return " + ".join(f"{row[k]:.4g}" for k in ("params", "grads", "optimizer_state")) + f" = {row['total']:.4g}"


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


__all__ = ["PublishedFigure", "ZERO_FIGURE_1", "ZERO_SOURCE", "ZERO_PARAMS", "ZERO_GPUS", "ZERO_K", "ZERO_EQUIVALENTS",
           "zero_paper_bytes_per_parameter", "gpt_shapes", "planner_bytes_per_parameter", "zero_rows",
           "KORTHIKANTI_SOURCE", "KORTHIKANTI_TABLE_2", "KORTHIKANTI_TERMS", "korthikanti_terms", "korthikanti_bytes",
           "LAYOUTS", "GB"]
