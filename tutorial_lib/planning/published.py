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
  ``KORTHIKANTI_TERMS``.) ``MegatronLayer`` is such a layer written in PyTorch, in Megatron-LM's order;
  ``layer_activations`` measures what its forward leaves for backward with torch's ``MemTracker`` in ``FakeTensorMode``
  (the planner's tool: no memory, no GPU) and ``activation_breakdown`` lists it tensor by tensor against the paper's
  terms. ``activation_comparison`` puts the paper, this layer and the workbook's own ``train_lm.py`` block (fused
  attention, no dropout) side by side: notebook 13's cell.

GiB (2**30 bytes) is what the planner prints elsewhere; the papers' GB are 1e9 bytes: the names here say which.
"""

from __future__ import annotations

import contextlib
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
    "none": "sbh(34 + 5as/h)",  # no parallelism (§4.1, Eq. 1)
    "tp": "sbh(10 + 24/t + 5as/(ht))",  # tensor parallel (§4.2.1, Eq. 2)
    "tp+sp": "sbh(34/t + 5as/(ht))",  # tensor + sequence parallel (§4.2.2, Eq. 4)
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


def _nn():
    import torch
    import torch.nn as nn
    return torch, nn


def _dropout_module(p: float, mode: str | None):
    """Dropout as a GPU runs it (``"mask"``: ``native_dropout``, a bool mask saved), as ``nn.functional.dropout`` runs
    on this device (``"module"``: on CPU a noise tensor of the input's dtype is saved), or none (``None``)."""
    torch, nn = _nn()

    class Dropout(nn.Module):
        def forward(self, x):
            if mode is None:
                return x
            if mode == "mask":
                return torch.native_dropout(x, p, True)[0]
            return torch.nn.functional.dropout(x, p, True)

    return Dropout()


def megatron_layer(*, h: int, a: int, s: int, dropout: str | None = "mask", p: float = 0.1, dtype=None):
    """A GPT layer as Megatron-LM writes it and Korthikanti et al. count it (a module; build it in ``FakeTensorMode``).

    Pre-norm, activations laid out [s, b, h]: LayerNorm, the fused QKV linear (heads interleaved as Megatron's, so a
    column-parallel split gives each rank whole heads), the scores ``baddbmm(Q, K^T, alpha=1/sqrt(d))``, a causal mask
    (a buffer), softmax, dropout on the attention probabilities, attention over V, the output linear, dropout,
    residual; LayerNorm, fc1 (4h), GeLU, fc2, dropout, residual.

    Args:
        h: width; a: attention heads (h divisible by a); s: the longest sequence (the causal mask's size).
        dropout: ``"mask"`` (``torch.native_dropout``: a 1-byte bool mask, what ``nn.Dropout`` does on CUDA and what
            the paper counts), ``"module"`` (``nn.functional.dropout``: on CPU it saves a noise tensor of the
            activations' dtype, 2 bytes per element in bf16) or None (no dropout at all: the control).
        p: the dropout probability.
        dtype: the parameters' dtype (default: torch's default dtype); bf16 for the paper's 16-bit activations.

    Returns:
        An ``nn.Module`` taking and returning [s, b, h]; under tensor parallelism (``tp_plan``) its attention runs on
        the local heads.
    """
    torch, nn = _nn()
    if h % a:
        raise ConfigError(f"h = {h} is not divisible by a = {a}")
    if dropout not in ("mask", "module", None):
        raise ConfigError(f"dropout must be 'mask', 'module' or None, got {dropout!r}")

    class MegatronLayer(nn.Module):
        def __init__(self):
            super().__init__()
            f = {"dtype": dtype}
            self.h, self.a, self.d = h, a, h // a
            self.ln1 = nn.LayerNorm(h, **f)
            self.qkv = nn.Linear(h, 3 * h, **f)
            self.dense = nn.Linear(h, h, **f)
            self.ln2 = nn.LayerNorm(h, **f)
            self.fc1 = nn.Linear(h, 4 * h, **f)
            self.fc2 = nn.Linear(4 * h, h, **f)
            self.attn_drop, self.drop1, self.drop2 = (_dropout_module(p, dropout) for _ in range(3))
            self.register_buffer("causal", torch.ones(s, s, dtype=torch.bool).triu(1), persistent=False)

        def forward(self, x):
            d = self.d
            mixed = self.qkv(self.ln1(x))  # [s, b, 3h / t]: whole heads, each [q | k | v] (s whole under SP too)
            sq, b = mixed.shape[:2]
            mixed = mixed.view(sq, b, -1, 3 * d)
            heads = mixed.shape[2]  # a / t under tensor parallelism
            q, k, v = (y.reshape(sq, b * heads, d).transpose(0, 1) for y in mixed.split(d, dim=-1))  # views
            scores = torch.baddbmm(torch.empty(b * heads, sq, sq, dtype=q.dtype, device=q.device), q,
                                   k.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(d))  # as Megatron: Q, K saved
            scores = scores.view(b, heads, sq, sq).masked_fill(self.causal[:sq, :sq], float("-inf"))
            probs = self.attn_drop(torch.softmax(scores, dim=-1)).view(b * heads, sq, sq)
            context = torch.bmm(probs, v).transpose(0, 1).reshape(sq, b, heads * d)  # a copy: the linear saves it
            x = x + self.drop1(self.dense(context))
            return x + self.drop2(self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x)))))

    return MegatronLayer()


def workbook_layer(*, h: int, a: int, s: int, dtype=None):
    """The workbook's own layer: ``train_lm.py``'s ``Block`` (pre-norm, fused ``scaled_dot_product_attention``, no
    dropout, no biases), imported from the lesson script, at width ``h``, ``a`` heads, block size ``s``."""
    from ..notebook.script_source import import_script
    module = import_script("train_lm")
    cfg = module.GPTConfig(vocab_size=256, block_size=s, n_layers=1, d_model=h, n_heads=a, dropout=0.0, bias=False)
    with _default_dtype(dtype):
        return module.Block(cfg)


@contextlib.contextmanager
def _default_dtype(dtype):
    torch, _ = _nn()
    if dtype is None:
        yield
        return
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


# --- Measuring a layer: torch's MemTracker in fake mode, and what autograd saved, tensor by tensor -------------------

@dataclass(frozen=True)
class LayerActivations:
    """What one layer's forward leaves for its backward, on one rank.

    Attributes:
        layer: ``"megatron"`` or ``"workbook"``; layout: ``"none"``, ``"tp"`` or ``"tp+sp"``; t: ranks of the
            tensor-parallel mesh (1 without).
        s, b, h, a: sequence length, micro-batch, width, heads.
        activation_bytes: the planner's number: ``MemTracker``'s activations after the forward (the input made inside
            the tracker, so it counts) less the output's bytes (the next layer's input, counted there): the tensors
            a layer in a stack keeps for backward (bytes, this rank).
        tracker_bytes: ``MemTracker``'s activations after the forward, output included (bytes).
        rows: one dict per tensor storage autograd saved (``activation_breakdown``'s rows), which add up to
            ``activation_bytes``.
    """

    layer: str
    layout: str
    t: int
    s: int
    b: int
    h: int
    a: int
    activation_bytes: int
    tracker_bytes: int
    rows: tuple[dict, ...]

    @property
    def sbh(self) -> int:
        """s x b x h (elements): Korthikanti et al.'s unit."""
        return self.s * self.b * self.h


def layer_activations(*, s: int, b: int, h: int, a: int, layer: str = "megatron", dropout: str | None = "mask",
                      t: int = 1, layout: str = "none", dtype: str = "bf16") -> LayerActivations:
    """Measure one layer's activations with torch's ``MemTracker`` in ``FakeTensorMode`` (no memory, no GPU).

    The layer runs one forward on an input made inside the tracker; the tracker's activations at the end, less the
    output, are the bytes a layer in a stack keeps for its backward (its own input included). A second, identical
    forward is walked through autograd's graph (every ``_saved_*`` tensor of every node) to list those tensors one by
    one (``rows``); their sum is checked equal to the tracker's figure.

    Args:
        s: sequence length; b: micro-batch; h: width; a: attention heads (counts).
        layer: ``"megatron"`` (``megatron_layer``: Korthikanti et al.'s layer) or ``"workbook"`` (``workbook_layer``:
            ``train_lm.py``'s block; ``layout`` must be ``"none"``).
        dropout: the Megatron layer's dropout (``megatron_layer``'s ``dropout``: ``"mask"``, ``"module"``, None).
        t: tensor-parallel ranks (a fake process group of ``t`` ranks; rank 0 is measured, every rank holds the same).
        layout: ``"none"``, ``"tp"`` (``tp_plan``: Megatron's column/row split) or ``"tp+sp"`` (with sequence
            parallelism: the norms and dropouts on sequence shards).
        dtype: ``"bf16"`` (the paper's 16-bit activations), ``"fp16"`` or ``"fp32"``.

    Returns:
        ``LayerActivations``.

    Raises:
        ConfigError: an unknown layer, layout or dtype; a parallel layout for the workbook layer; t that does not
            divide a or s; a process group already exists in this process; the breakdown and the tracker disagree.
    """
    torch, _ = _nn()
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if dtype not in dtypes:
        raise ConfigError(f"dtype must be one of {sorted(dtypes)}, got {dtype!r}")
    if layer not in ("megatron", "workbook"):
        raise ConfigError(f"layer must be 'megatron' or 'workbook', got {layer!r}")
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "none" and t != 1 or layout != "none" and (t < 1 or a % t or s % t):
        raise ConfigError(f"t = {t} for layout {layout!r}: 1 without parallelism, else a divisor of a = {a} and s = {s}")
    if layer == "workbook" and layout != "none":
        raise ConfigError("the workbook's layer is measured without tensor parallelism (layout 'none')")
    if dist.is_available() and dist.is_initialized():
        raise ConfigError("this process already has a process group; layer_activations makes a fake one of its own")
    dt = dtypes[dtype]

    def build():
        if layer == "workbook":
            return workbook_layer(h=h, a=a, s=s, dtype=dt)
        return megatron_layer(h=h, a=a, s=s, dropout=dropout, dtype=dt)

    shape = (s, b, h) if layer == "megatron" else (b, s, h)
    with _world(t if layout != "none" else 1) as mesh:
        with FakeTensorMode():
            model = build()
            if layout != "none":
                from torch.distributed.tensor.parallel import parallelize_module
                parallelize_module(model, mesh, tp_plan(layout))
            local = (s // t if layout == "tp+sp" else s, b, h)
            from .memory_plan_tp import _propagation_in_its_own_fake_mode
            tracker = MemTracker()
            tracker.track_external(model)
            with tracker, _propagation_in_its_own_fake_mode():
                x = torch.empty(local, dtype=dt, requires_grad=True)
                y = model(x)
                snapshot = next(iter(tracker.get_tracker_snapshot().values()))
            tracker_bytes = sum(v for k, v in snapshot.items() if _is_act(k))
            out_bytes = sum(st.nbytes() for st in _storages(y))
            del y, x
            rows = _saved_rows(model, local, dt, layer)
    activation_bytes = tracker_bytes - out_bytes
    listed = sum(r["bytes"] for r in rows)
    if listed != activation_bytes:
        raise ConfigError(f"the tensors autograd saved add up to {listed} bytes, the tracker counted {activation_bytes}: "
                          "a torch whose ops save other tensors than this module knows (see activation_breakdown)")
    del shape
    return LayerActivations(layer=layer, layout=layout, t=t, s=s, b=b, h=h, a=a, activation_bytes=activation_bytes,
                            tracker_bytes=tracker_bytes, rows=tuple(rows))


def tp_plan(layout: str) -> dict:
    """``parallelize_module``'s plan for ``megatron_layer``: Megatron's tensor parallelism (QKV and fc1 split by
    columns, the output linear and fc2 by rows), and with ``"tp+sp"`` the LayerNorms on sequence shards (dim 0 of
    [s, b, h]) with the column-parallel linears all-gathering their input and the row-parallel ones reduce-scattering
    their output."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    if layout == "tp":
        return {"qkv": ColwiseParallel(), "dense": RowwiseParallel(), "fc1": ColwiseParallel(),
                "fc2": RowwiseParallel()}
    if layout == "tp+sp":
        return {"ln1": SequenceParallel(sequence_dim=0, use_local_output=True),
                "qkv": ColwiseParallel(input_layouts=Shard(0)),
                "dense": RowwiseParallel(output_layouts=Shard(0)),
                "ln2": SequenceParallel(sequence_dim=0, use_local_output=True),
                "fc1": ColwiseParallel(input_layouts=Shard(0)),
                "fc2": RowwiseParallel(output_layouts=Shard(0))}
    raise ConfigError(f"layout must be 'tp' or 'tp+sp', got {layout!r}")


@contextlib.contextmanager
def _world(t: int):
    """A fake process group of ``t`` ranks and a 1-D mesh over it (None for one rank without parallelism)."""
    if t == 1:
        yield None
        return
    from torch.distributed.device_mesh import init_device_mesh
    from .memory_plan import fake_world
    with fake_world(t):
        yield init_device_mesh("cpu", (t,), mesh_dim_names=("tp",))


def _is_act(key) -> bool:
    name = getattr(key, "name", str(key))
    return name.rsplit(".", 1)[-1] in ("ACT", "Activation")


def _storages(t) -> list:
    """The storages behind a tensor (a DTensor's or a wrapper's inner tensors)."""
    torch, _ = _nn()
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        inner = [getattr(t, name) for name in attrs]
        return [st for x in inner if isinstance(x, torch.Tensor) for st in _storages(x)]
    return [t.untyped_storage()]


def _saved_rows(model, local_shape, dt, layer: str) -> list[dict]:
    """One forward under a recorder of which module and op made each storage, then autograd's saved tensors."""
    torch, _ = _nn()
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    made: dict[int, tuple[str, str, int]] = {}
    keep = []  # the storages, so that no id is reused while the table is built
    stack = [""]
    outputs: dict[int, str] = {}

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            from torch.distributed.tensor import DTensor
            if any(tp is DTensor for tp in types):
                return NotImplemented
            out = func(*args, **(kwargs or {}))
            for i, t in enumerate(tree_flatten(out)[0]):
                if isinstance(t, torch.Tensor):
                    for st in _storages(t):
                        if st._cdata not in made:
                            made[st._cdata] = (stack[-1], func.__name__.split(".")[0], i)
                            keep.append(st)
            return out

    names = {m: n for n, m in model.named_modules()}
    handles = []
    for m in names:
        if m is model:
            continue
        handles.append(m.register_forward_pre_hook(lambda mod, args: stack.append(names[mod]), prepend=True))

        def post(mod, args, out):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    for st in _storages(t):
                        outputs.setdefault(st._cdata, names[mod])
            stack.pop()
        handles.append(m.register_forward_hook(post, prepend=False))
    try:
        with Recorder():
            x = torch.empty(local_shape, dtype=dt, requires_grad=True)
            for st in _storages(x):
                made[st._cdata] = ("", "input", 0)
                keep.append(st)
            y = model(x)
    finally:
        for handle in handles:
            handle.remove()
    params = {st._cdata for p in [*model.parameters(), *model.buffers()] for st in _storages(p)}
    saved: dict[int, dict] = {}
    seen, todo = set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in sorted(a for a in dir(node) if a.startswith("_saved_")):
            try:
                value = getattr(node, attr)
            except Exception:  # a saved value that is not a tensor (or freed): nothing to count
                continue
            for t in (value if isinstance(value, (tuple, list)) else (value,)):
                if not isinstance(t, torch.Tensor):
                    continue
                for st in _storages(t):
                    key = st._cdata
                    if key in params:
                        continue
                    row = saved.setdefault(key, {"bytes": st.nbytes(), "saved by": set(), "shape": tuple(t.shape),
                                                 "dtype": str(t.dtype).replace("torch.", "")})
                    row["saved by"].add(f"{node.name()}.{attr[len('_saved_'):]}")
        todo.extend(next_node for next_node, _ in node.next_functions)
    out_storages = {st._cdata for st in _storages(y)}
    rows = []
    for key, row in saved.items():
        if key in out_storages:
            continue
        module, op, index = made.get(key, ("?", "?", 0))
        if op == "?" and row["bytes"] <= 8:  # a Python number autograd wrapped as a 0-d tensor: no allocation
            continue
        term = (_megatron_term if layer == "megatron" else _workbook_term)(module, op, index, outputs.get(key))
        rows.append({"term": term, "made by": f"{module or 'layer'}: {op}" + (f"[{index}]" if index else ""),
                     "saved by": ", ".join(sorted(row["saved by"])), "shape": row["shape"], "dtype": row["dtype"],
                     "bytes": row["bytes"]})
    del keep
    return rows


def _megatron_term(module: str, op: str, index: int, output_of: str | None) -> str:
    """The paper's name for a tensor ``megatron_layer`` saved (or what it is where the paper has no such term)."""
    if op == "input":
        return "LayerNorm 1 input"
    if module in ("ln1", "ln2"):
        if index:
            return "LayerNorm statistics (mean, rstd): not in the paper's count"
        return "QKV linear input (LayerNorm 1 output)" if module == "ln1" else "fc1 input (LayerNorm 2 output)"
    if module in ("qkv", "fc1"):
        if output_of == module:
            return "Q, K and V (the QKV linear's output)" if module == "qkv" else "GeLU input (fc1 output)"
        return ("QKV linear input, all-gathered (Megatron keeps the shard)" if module == "qkv"
                else "fc1 input, all-gathered (Megatron keeps the shard)")
    drops = {"attn_drop": "attention dropout", "drop1": "attention residual dropout", "drop2": "MLP residual dropout"}
    if module in drops:
        if output_of == module:
            return drops[module] + " output" + (" (for attention over V)" if module == "attn_drop" else "")
        return drops[module] + " mask"
    if op.startswith("_softmax") or op == "softmax":
        return "softmax output"
    if op == "gelu":
        return "fc2 input (GeLU output)"
    if op == "add":
        return "LayerNorm 2 input"
    if module == "" and op in ("clone", "_unsafe_view", "view", "copy_", "_reshape_copy", "reshape", "contiguous"):
        return "output linear input"
    return f"{module or 'layer'}: {op} (not in the paper's count)"


def _workbook_term(module: str, op: str, index: int, output_of: str | None) -> str:
    """What a tensor saved by ``train_lm.py``'s block is, in the paper's words where one applies."""
    if op == "input":
        return "LayerNorm 1 input"
    if module in ("norm1", "norm2"):
        if index:
            return "LayerNorm statistics (mean, rstd): not in the paper's count"
        return "QKV linear input (LayerNorm 1 output)" if module == "norm1" else "fc1 input (LayerNorm 2 output)"
    if module == "attn.qkv":
        return "Q, K and V (the QKV linear's output)"
    if module == "mlp.fc":
        return "GeLU input (fc1 output)"
    if module == "attn" and "attention" in op:
        return ("output linear input (SDPA's output, saved by SDPA and, as a view, by the output linear)" if index == 0
                else "SDPA logsumexp, fp32 (in place of the paper's 5as^2b)" if index == 1
                else f"SDPA {op}[{index}]")
    if module == "attn" and op in ("clone", "_unsafe_view", "view", "_reshape_copy", "reshape", "contiguous"):
        return "output linear input"
    if module == "mlp" and op == "gelu":
        return "fc2 input (GeLU output)"
    if op == "add":
        return "LayerNorm 2 input"
    return f"{module or 'layer'}: {op}"


def activation_breakdown(measured: LayerActivations):
    """The tensors a layer saved, grouped by the paper's term, beside the paper's bytes (a DataFrame).

    Args:
        measured: a ``layer_activations`` result.

    Returns:
        A DataFrame indexed by term: ``measured (bytes)`` (this rank), ``paper (bytes)`` (``korthikanti_terms`` for
        the same s, b, h, a, t and layout; Q, K and V, one tensor in PyTorch, are compared with the paper's "Q and K"
        + "V"), ``difference (bytes)``, ``measured / sbh`` and ``made by`` / ``saved by`` (ops and autograd nodes),
        and a last row ``total``. Terms on one side only are what one counts and the other does not.
    """
    import pandas as pd

    m = measured
    paper = korthikanti_terms(s=m.s, b=m.b, h=m.h, a=m.a, t=m.t, layout=m.layout)
    paper["Q, K and V (the QKV linear's output)"] = paper.pop("Q and K (for QK^T)") + paper.pop(
        "V (for attention over V)")
    if m.layout == "tp+sp":  # Megatron keeps the sequence shard of these inputs; PyTorch's linear saves the gathered one
        for term in ("QKV linear input (LayerNorm 1 output)", "fc1 input (LayerNorm 2 output)"):
            paper[term.split(" (")[0] + ", all-gathered (Megatron keeps the shard)"] = 0.0
    grouped: dict[str, dict] = {}
    for row in m.rows:
        g = grouped.setdefault(row["term"], {"measured (bytes)": 0, "made by": set(), "saved by": set()})
        g["measured (bytes)"] += row["bytes"]
        g["made by"].add(row["made by"])
        g["saved by"].update(row["saved by"].split(", "))
    terms = list(paper) + [k for k in grouped if k not in paper]
    rows = []
    for term in terms:
        g = grouped.get(term, {"measured (bytes)": 0, "made by": set(), "saved by": set()})
        rows.append({"term": term, "measured (bytes)": g["measured (bytes)"], "paper (bytes)": paper.get(term, 0.0),
                     "made by": ", ".join(sorted(g["made by"])), "saved by": ", ".join(sorted(g["saved by"]))})
    table = pd.DataFrame(rows).set_index("term")
    table.loc["total"] = [table["measured (bytes)"].sum(), table["paper (bytes)"].sum(), "", ""]
    table["difference (bytes)"] = table["measured (bytes)"] - table["paper (bytes)"]
    table["measured / sbh"] = table["measured (bytes)"] / m.sbh
    return table[["measured (bytes)", "paper (bytes)", "difference (bytes)", "measured / sbh", "made by", "saved by"]]


def activation_comparison(*, s: int = 1024, b: int = 1, h: int = 1024, a: int = 16):
    """Korthikanti et al.'s count, their kind of layer measured, and the workbook's layer measured (a DataFrame).

    Args:
        s: sequence length; b: micro-batch; h: width; a: heads (defaults: a 1024-token sequence through a layer of
            width 1024 with 16 heads).

    Returns:
        A DataFrame with rows ``paper: sbh(34 + 5as/h)``, ``Megatron-style layer (dropout, scores materialised)``,
        ``the same without dropout``, ``workbook layer (train_lm.py: fused SDPA, no dropout)``; columns
        ``bytes per layer`` (bf16 activations), ``/ sbh`` and ``vs paper`` (ratio). Why the workbook's layer saves
        less: fused attention keeps no s x s scores (the 5as/h term becomes the fp32 logsumexp, 4as bytes per
        sequence... per head and token) and no dropout leaves no masks; it saves its attention output twice (the
        fused kernel's output and the copy the output linear saves).
    """
    import pandas as pd

    sbh = s * b * h
    paper = korthikanti_bytes(s=s, b=b, h=h, a=a)
    rows = [("paper: sbh(34 + 5as/h)", paper)]
    for label, kwargs in (("Megatron-style layer (dropout, scores materialised)", {"layer": "megatron"}),
                          ("the same without dropout", {"layer": "megatron", "dropout": None}),
                          ("workbook layer (train_lm.py: fused SDPA, no dropout)", {"layer": "workbook"})):
        rows.append((label, layer_activations(s=s, b=b, h=h, a=a, **kwargs).activation_bytes))
    table = pd.DataFrame([{"layer": k, "bytes per layer": int(v), "/ sbh": v / sbh, "vs paper": v / paper}
                          for k, v in rows]).set_index("layer")
    return table


__all__ = ["PublishedFigure", "ZERO_FIGURE_1", "ZERO_SOURCE", "ZERO_PARAMS", "ZERO_GPUS", "ZERO_K", "ZERO_EQUIVALENTS",
           "zero_paper_bytes_per_parameter", "gpt_shapes", "planner_bytes_per_parameter", "zero_rows",
           "KORTHIKANTI_SOURCE", "KORTHIKANTI_TABLE_2", "KORTHIKANTI_TERMS", "korthikanti_terms", "korthikanti_bytes",
           "megatron_layer", "workbook_layer", "tp_plan", "LayerActivations", "layer_activations",
           "activation_breakdown", "activation_comparison", "GB"]
