"""Which dtype each op really runs in under ``torch.autocast``, recorded from a forward pass.

Autocast keeps per-device lists of ops that run in the low-precision dtype (matmuls, convolutions),
ops that always run in fp32 (losses, reductions such as ``sum`` and, on CUDA, ``softmax`` and
``layer_norm``), and ops that follow their inputs. The lists differ between CPU and CUDA and between
torch versions, so the lesson records them instead of quoting them. Source: "Automatic Mixed
Precision package - torch.amp", https://pytorch.org/docs/stable/amp.html (section "Autocast Op
Reference").
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..errors import ConfigError

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _DtypeRecorder(TorchFunctionMode):
    """Records (op, input dtypes, output dtype) of every torch function called while active."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in args if torch.is_tensor(a) and a.is_floating_point()]
        if torch.is_tensor(out) and out.is_floating_point() and inputs:
            self.rows.append({
                "op": getattr(func, "__name__", str(func)),
                "input_dtypes": ", ".join(sorted({str(a.dtype).removeprefix("torch.") for a in inputs})),
                "output_dtype": str(out.dtype).removeprefix("torch."),
            })
        return out


class AutocastDemoModel(nn.Module):
    """A small classifier block with op kinds autocast treats differently: linear, layer_norm, gelu."""

    def __init__(self, dim: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.norm = nn.LayerNorm(2 * dim)
        self.down = nn.Linear(2 * dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.norm(self.up(x))))  # logits


def autocast_op_dtypes(precision: str = "bf16", device: str = "cpu", *, loss_inside_autocast: bool = True,
                       model: nn.Module | None = None, inputs: torch.Tensor | None = None,
                       loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> pd.DataFrame:
    """Run one forward pass and loss under ``torch.autocast`` and list the dtype every op produced.

    Args:
        precision: ``"bf16"`` or ``"fp16"`` (the autocast dtype).
        device: ``"cpu"`` or ``"cuda"``: the autocast device type (its op lists differ).
        loss_inside_autocast: compute the loss inside the autocast region (the correct pattern) or
            after it (a common mistake: the loss then runs in whatever dtype the output had).
        model, inputs: the model (fp32 parameters) and a batch for it; default: ``AutocastDemoModel``
            and a (8, 32) batch of random inputs.
        loss_fn: maps the model's output to a scalar loss; default: cross entropy of the logits
            against fixed labels for the demo model, MSE against zeros for any other model.

    Returns:
        One row per recorded op in call order: ``op``, ``input_dtypes``, ``output_dtype``,
        ``reduced`` (True if the output is the low-precision dtype) and ``where``
        (``"forward"`` or ``"loss"``). Parameters stay fp32 throughout; only the compute is cast.

    Raises:
        ConfigError: unknown ``precision`` or ``device``, or ``device="cuda"`` without a GPU.
    """
    if precision not in AUTOCAST_DTYPES:
        raise ConfigError(f"precision={precision!r} is not an autocast dtype; use one of {sorted(AUTOCAST_DTYPES)}")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}: use 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch.cuda.is_available() is False; use device='cpu'")
    generator = torch.Generator().manual_seed(0)
    if model is None:
        model = AutocastDemoModel()
    model = model.to(device)
    if inputs is None:
        inputs = torch.randn(8, 32, generator=generator)
    inputs = inputs.to(device)
    if loss_fn is None:
        def loss_fn(out: torch.Tensor) -> torch.Tensor:
            if isinstance(model, AutocastDemoModel):
                labels = torch.arange(out.shape[0], device=out.device) % out.shape[1]
                return F.cross_entropy(out, labels)
            return F.mse_loss(out, torch.zeros_like(out, dtype=torch.float32))
    dtype = AUTOCAST_DTYPES[precision]
    recorder = _DtypeRecorder()
    with recorder:
        with torch.autocast(device, dtype=dtype):
            out = model(inputs)
            forward_ops = len(recorder.rows)
            if loss_inside_autocast:
                loss_fn(out)
        if not loss_inside_autocast:
            loss_fn(out)
    table = pd.DataFrame(recorder.rows, columns=["op", "input_dtypes", "output_dtype"])
    table["reduced"] = table["output_dtype"] == str(dtype).removeprefix("torch.")
    table["where"] = ["forward" if i < forward_ops else "loss" for i in range(len(table))]
    return table


def autocast_supported(precision: str, device: str = "cpu") -> bool:
    """Whether this torch can autocast to ``precision`` on ``device`` (``"fp32"`` is always True).

    Args:
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        device: ``"cpu"`` or ``"cuda"``.

    An unsupported dtype makes ``torch.autocast`` warn and disable itself; this checks for that
    instead of guessing from the version. On CUDA, bf16 also needs compute capability 8.0 or newer.

    Raises:
        ConfigError: unknown ``precision``.
    """
    if precision == "fp32":
        return True
    if precision not in AUTOCAST_DTYPES:
        raise ConfigError(f"precision={precision!r}: use 'fp32', 'bf16' or 'fp16'")
    if device == "cuda" and (not torch.cuda.is_available()
                             or (precision == "bf16" and not torch.cuda.is_bf16_supported())):
        return False
    dtype = AUTOCAST_DTYPES[precision]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast(device, dtype=dtype):
            return torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == dtype


def cpu_low_precision_flags() -> list[str]:
    """The CPU's instruction-set flags that speed up bf16/fp16 math (Linux ``/proc/cpuinfo``; [] elsewhere).

    ``avx512_bf16``/``amx_bf16`` make bf16 matmuls fast on CPU; without them bf16 is emulated and can
    be slower than fp32. ``avx512_fp16``/``amx_fp16`` do the same for fp16, which is rare.
    """
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    wanted = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")
    return [flag for flag in wanted if flag in flags]


def float_formats() -> pd.DataFrame:
    """Range and precision of fp32, bf16 and fp16 from ``torch.finfo``: why fp16 needs a loss scaler.

    Columns: ``bits``, ``max``, ``smallest_normal``, ``smallest_subnormal``, ``eps`` (the gap above 1.0).
    bf16 keeps fp32's 8 exponent bits (same range, fewer digits); fp16 has 5, so values below about
    6e-5 lose digits (subnormals), below about 3e-8 (half the smallest subnormal, 6e-8) become 0, and values
    above 65504 become inf.
    """
    rows = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        info = torch.finfo(dtype)
        rows[name] = {"bits": info.bits, "max": info.max, "smallest_normal": info.smallest_normal,
                      "smallest_subnormal": float(torch.tensor(0, dtype=dtype).nextafter(
                          torch.tensor(1, dtype=dtype))), "eps": info.eps}
    return pd.DataFrame.from_dict(rows, orient="index")
