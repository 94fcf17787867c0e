"""Notebook 03's exercises (mixed precision): a loss scaler that really scales, the steps an overflowing first scale
skips, clipping after ``unscale_``."""

from __future__ import annotations

import torch

from ..i18n import N_, Message
from .core import Context, Difference, Spec, register, steps_reported

STEPS_31, STEPS_33 = 3, 5  # the steps 03.1's and 03.3's scripts train
OVERFLOW_FIRST_SCALE, OVERFLOW_GRAD = 2.0**24, 0.5  # 03.2's question
MAX_NORM = 1.0  # 03.3's clipping threshold (the script's MAX_NORM)




def _round(values: list) -> list:
    """Floats shown with 4 significant digits (a list the learner reads)."""
    return [float(f"{v:.4g}") if isinstance(v, float) else v for v in values]


def scaler_that_scales(ctx: Context) -> list[Difference]:
    """03.1: an fp16 run with a tiny loss weight keeps its gradients: a scale above 1, no gradient rounded to 0."""
    found, differences = steps_reported(ctx.records(ctx.launch(nproc_per_node=2)), STEPS_31)
    default_scale = torch.amp.GradScaler("cpu").get_scale()  # what an enabled scaler starts at (65536)
    for rank, mine in sorted(found.items()):
        dtypes = [r.get("dtype") for r in mine]
        if dtypes != [str(torch.float16)] * len(mine):
            differences.append(Difference(
                Message("dtype of the model's output per step"), [str(torch.float16)] * len(mine), dtypes, rank,
                note=Message("keep the fp16 autocast: the exercise is about fp16's range")))
        scales = [r.get("scale") for r in mine]
        if not all(isinstance(s, (int, float)) and s > 1 for s in scales):
            differences.append(Difference(
                Message("loss scale per step"), [default_scale] * len(mine), scales, rank,
                note=Message("a scale of 1.0 is a disabled scaler: torch.cuda.amp.GradScaler() on a machine "
                             "without CUDA warns and then only passes the loss through")))
        zeros = [r.get("zero_fraction") for r in mine]
        if zeros != [0] * len(mine):
            differences.append(Difference(
                Message("fraction of the gradients that are exactly 0, per step"), [0.0] * len(mine), _round(zeros),
                rank, note=Message("fp16 rounds anything below about 3e-8 to 0: the loss must be scaled up before "
                                   "backward(), and the gradients unscaled in fp32")))
    return differences


def overflow_skips(ctx: Context) -> int:
    """03.2: the steps a GradScaler skips from a first scale of 2**24 when the largest gradient is 0.5: the scale
    halves after each skipped step, until the scaled gradient is finite in fp16."""
    scale, skipped = OVERFLOW_FIRST_SCALE, 0
    while torch.isinf(torch.tensor(OVERFLOW_GRAD * scale).half()):
        skipped, scale = skipped + 1, scale / 2
    return skipped


def clip_after_unscale(ctx: Context) -> list[Difference]:
    """03.3: every step the optimizer applies a gradient of norm min(true norm, MAX_NORM), and clipping measured the
    true norm (which exceeds MAX_NORM at least once: clipping really acts)."""
    found, differences = steps_reported(ctx.records(ctx.launch(nproc_per_node=2)), STEPS_33)
    for rank, mine in sorted(found.items()):
        scales = [r.get("scale") for r in mine]
        if not all(isinstance(s, (int, float)) and s > 1 for s in scales):
            differences.append(Difference(Message("loss scale per step"), "> 1", scales, rank, note=Message(
                "keep the GradScaler: the exercise is about the order of its calls")))
            continue
        applied = [r for r in mine if r.get("applied_norm", 0) > 0]  # a step the scaler skipped moves nothing
        if len(applied) < STEPS_33 - 1:
            differences.append(Difference(Message("optimizer steps applied"), f">= {STEPS_33 - 1}", len(applied),
                                          rank))
        if not any(r.get("clip_saw", 0) > MAX_NORM for r in applied):
            differences.append(Difference(Message("largest norm clipping measured"), f"> {MAX_NORM}",
                                          max((r.get("clip_saw", 0) for r in mine), default=None), rank))
        expected = [min(r.get("clip_saw", 0), MAX_NORM) for r in applied]
        measured = [r["applied_norm"] for r in applied]
        if any(abs(m - e) > 0.01 * e for m, e in zip(measured, expected)):
            ratio = max(e / max(m, 1e-30) for m, e in zip(measured, expected))
            differences.append(Difference(
                Message("norm of the gradient the optimizer applied, per step"), _round(expected), _round(measured),
                rank, note=Message("up to {ratio:.0f} times too small, about the loss scale ({scale:g}): "
                                   "clip_grad_norm_ measured the gradients while they were still multiplied by it. "
                                   "Call scaler.unscale_(optimizer) before clipping",
                                   {"ratio": ratio, "scale": scales[0]})))
    return differences


register(Spec("03.1", N_("A loss scaler that really scales"), solution="03_1_train.py", verify=scaler_that_scales,
              hints=(N_("Section 5d: what does seed 000's scaler do on a machine without CUDA? Print "
                        "scaler.is_enabled(), and read the warnings your ranks printed."),
                     N_("Build the scaler for the device the autocast runs on: torch.amp.GradScaler(\"cpu\") here "
                        "(torch.amp.GradScaler(\"cuda\") on GPUs). Keep the loss weight and the fp16 autocast."))))
register(Spec("03.2", N_("The steps an overflowing first scale skips"), solution="03_2.py", expected=overflow_skips,
              wrong={7: N_("fp16's largest finite value is 65504, not 65536: 0.5 x 2**17 = 65536 still overflows"),
                     0: N_("0.5 x 2**24 is far above fp16's largest value, 65504: the first steps overflow and the "
                           "scaler skips them"),
                     9: N_("0.5 x 2**16 = 32768 fits in fp16: that step is applied, not skipped")},
              hints=(N_("Section 2's overflow run: a step whose scaled gradients are inf is skipped, and the scale is "
                        "halved. fp16's largest finite value is in section 2's table."),
                     N_("Find the largest power of two s with 0.5 x s <= 65504, then count the scales from 2**24 down "
                        "to just above it."))))
register(Spec("03.3", N_("Clip after unscale_"), solution="03_3_train.py", verify=clip_after_unscale,
              hints=(N_("Section 5c: what does clip_grad_norm_ see while the gradients are still multiplied by the "
                        "scale? Compare clip_saw with the scale your ranks printed."),
                     N_("The order is scaler.scale(loss).backward(), scaler.unscale_(optimizer), clip_grad_norm_, "
                        "scaler.step(optimizer), scaler.update(). Keep MAX_NORM at 1.0."))))
