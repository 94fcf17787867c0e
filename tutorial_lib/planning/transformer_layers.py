"""The layers ``layer_memory`` measures: Korthikanti et al.'s GPT layer as Megatron-LM writes it, the workbook's own.

``megatron_layer`` follows Megatron-LM's ``ParallelTransformerLayer`` in the order Korthikanti et al. (2022,
arXiv:2205.05198, §4.1) count its activations; ``tp_plan`` splits it as Megatron's tensor (and sequence) parallelism
does, for ``parallelize_module``; ``workbook_layer`` is ``train_lm.py``'s ``Block`` (from ``lm_model.py``).
Build them inside ``FakeTensorMode`` to measure them without memory.
"""

from __future__ import annotations

import contextlib
import math

from ..errors import ConfigError


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
    dropout, no biases), imported from the lesson's model file ``lm_model.py``, at width ``h``, ``a`` heads, block
    size ``s``."""
    from ..notebook.script_source import import_script
    from ..runs.rundir import LESSONS_DIR
    module = import_script(LESSONS_DIR / "lm_model.py")
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


__all__ = ["megatron_layer", "workbook_layer", "tp_plan"]
