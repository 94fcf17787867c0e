"""Which ``scaled_dot_product_attention`` backends exist on a device, and how fast each is against the math one.

``torch.nn.functional.scaled_dot_product_attention`` (SDPA) dispatches to one of several implementations: the
math composite (plain matmul, softmax, matmul: always there), FlashAttention, memory-efficient attention
(xFormers' kernel), cuDNN attention, and an overrideable slot for other devices. Which ones can run depends on
the device, the dtype, the shapes and the torch build; ``torch.nn.attention.sdpa_kernel(backend)`` restricts
the choice to one, so trying each in turn says which exist here. Seed 000 (section 6) suggests "xFormers or
FlashAttention" for attention: since torch 2.0 SDPA brings both kernels, no extra package needed.
Source: https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html
"""

from __future__ import annotations

import statistics
import time
import warnings

import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import ConfigError

# The aten op each backend runs: which one a plain SDPA call dispatched to.
BACKEND_OPS = {
    "_scaled_dot_product_attention_math": "MATH",
    "_scaled_dot_product_flash_attention": "FLASH_ATTENTION",
    "_scaled_dot_product_flash_attention_for_cpu": "FLASH_ATTENTION",
    "_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION",
    "_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION",
}


class _OpRecorder(TorchDispatchMode):
    """Records the name of every aten op dispatched while active (below autograd: the kernels that really run)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _time_ms(run, device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # CUDA runs asynchronously: wait before reading the clock
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def default_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> str:
    """The backend a plain SDPA call (no ``sdpa_kernel``) picks for these inputs, read from the aten op it
    dispatched to (``BACKEND_OPS``). ``"MATH"`` when no fused kernel ran: the math composite is decomposed into
    matmul and softmax before the dispatcher's Python hook sees it, so it shows up as those."""
    with _OpRecorder() as recorder:
        _attention(q, k, v, causal)
    return next((BACKEND_OPS[op] for op in recorder.ops if op in BACKEND_OPS), "MATH")


def sdpa_backends(device: str = "cpu", dtype: torch.dtype = torch.float32, *, batch: int = 4, heads: int = 8,
                  seq_len: int = 512, head_dim: int = 64, causal: bool = True, repeats: int = 5) -> pd.DataFrame:
    """Try every SDPA backend on one attention call; time those that run against the math backend.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (GPU 0, or the current device).
        dtype: of the queries, keys and values (FlashAttention on CUDA needs fp16 or bf16).
        batch, heads, seq_len, head_dim: the shape ``(batch, heads, seq_len, head_dim)`` (counts, > 0).
        causal: a causal mask (``is_causal=True``), as in a decoder.
        repeats: timed calls per backend after one warm-up call (count, > 0); the median is reported.

    Returns:
        One row per backend (``torch.nn.attention.SDPBackend``), in its order: ``backend``, ``available``
        (it ran), ``median_ms``, ``speedup_vs_math`` (math's median time / this one's), ``max_abs_diff_vs_math``
        (largest difference of its output from math's) and ``why_not`` (the error, and the warnings that say why
        a kernel was not used, for a backend that did not run). ``.attrs["default"]`` is the backend a plain
        call picked (``default_backend``).

    Raises:
        ConfigError: ``device`` not ``cpu``/``cuda``, ``cuda`` without a GPU, or a count below 1.
    """
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch.cuda.is_available() is False here; use device='cpu'")
    for name, value in {"batch": batch, "heads": heads, "seq_len": seq_len, "head_dim": head_dim,
                        "repeats": repeats}.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    torch_device = torch.device(device)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=generator).to(torch_device, dtype)
               for _ in range(3))
    outputs, rows = {}, []
    for backend in SDPBackend.__members__.values():
        if backend.name == "ERROR":  # not a backend: what a failed selection returns
            continue
        row = {"backend": backend.name, "available": False, "median_ms": float("nan"), "why_not": ""}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
                    outputs[backend.name] = _attention(q, k, v, causal)  # the warm-up call
                    row["median_ms"] = _time_ms(lambda: _attention(q, k, v, causal), torch_device, repeats)
                row["available"] = True
            except RuntimeError as e:
                row["why_not"] = " | ".join([str(e).splitlines()[0]] + [str(w.message).splitlines()[0] for w in caught])
        rows.append(row)
    table = pd.DataFrame(rows)
    math_ms = table.set_index("backend").loc["MATH", "median_ms"]
    table["speedup_vs_math"] = math_ms / table["median_ms"]
    table["max_abs_diff_vs_math"] = [
        (outputs[b].float() - outputs["MATH"].float()).abs().max().item() if b in outputs else float("nan")
        for b in table["backend"]]
    table = table[["backend", "available", "median_ms", "speedup_vs_math", "max_abs_diff_vs_math", "why_not"]]
    table.attrs["default"] = default_backend(q, k, v, causal)
    return table
