"""Notebook 03's exercises (mixed precision): a loss scaler that really scales, the steps an overflowing first scale
skips, clipping after ``unscale_``, and one fp16 loop with a loss scaler, gradient accumulation and clipping."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..i18n import N_, Message
from .core import Difference, Spec, register
from .nb02 import AllReducesPerMicroBatch
from .observing import ObservedCheck, Property, Variants
from .properties import Distributed, FirstDifference, SameSteps
from .same_values import LostEntries, SameGradNorms, SameTensors, rounded

OVERFLOW_FIRST_SCALE, OVERFLOW_GRAD = 2.0**24, 0.5  # 03.2's question
BATCHES_31 = (12, 16, 24)  # 03.1's --batch: the global batch, each rank half of it
MAX_NORMS_33 = (0.5, 1.0, 2.0)  # 03.3's --max-norm; its gradients' norms are 10 and more: clipping acts every step
PARAMETERS_33 = 8 * 16 + 16 + 16 + 1  # 03.3's model: Linear(8, 16), Tanh, Linear(16, 1)


@dataclass(frozen=True)
class LossScale(Property):
    """03.1: the scale each ``backward()`` ran with is above 1. It is this rank's loss (what ``backward()`` ran on)
    over the unscaled loss, which is the solution's on the same seed and batch divided by the solution's scale:
    ``GradScaler("cpu")``'s first, ``reference_scale``, which its 3 steps without an overflow never change."""

    reference_scale: float = 2.0**16
    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            want, got = reference[observed.rank].losses(), observed.losses()
            scales = [g * self.reference_scale / w if g is not None and w else None for g, w in zip(got, want)]
            if len(got) == len(want) and all(s is not None and s > 1 for s in scales):
                continue
            expected = int(self.reference_scale) if float(self.reference_scale).is_integer() else self.reference_scale
            out.append(Difference(Message("loss scale each backward() ran with (its loss over the unscaled loss)"),
                                  [expected] * len(want), rounded(scales), observed.rank,
                                  note=self._note()))
        return out


# 03.1: an fp16 autocast run with a tiny loss weight, against the solution on the same seed and batch. Section 5d's
# lesson: a scaler built for a device the run does not use is disabled, and the fp16 backward loses tiny gradients; the
# loss backward() ran on shows the scale, the gradients at each step what was lost. The first property that differs is
# said: the scale backward() ran with (above 1), the gradient entries lost to fp16's range (exactly 0 where the
# solution's are not), then the norm of the gradients each step applied. The backward runs in fp16, so a correct fix
# with another scale (2**20) rounds elsewhere, where fp16's subnormals cut the solution's precision: measured 7e-4 of
# the largest entry, 1e-5 of the norm. Rounding, in fp16: a gradient entry sums at most 12 products on a rank in an fp16
# matmul, then the all-reduce's addition and division: 14 terms (1.4 % of the norm). The starter loses every entry; a
# loss weight left out is 1e8 times off.
SCALER_THAT_SCALES = ObservedCheck(
    properties=(Distributed("DDP"), SameSteps(), FirstDifference((
        LossScale(note=N_("a scale of 1: backward() ran on the loss as it was, so the fp16 backward met these tiny "
                          "gradients unscaled and rounded most of them to 0 (the warnings your ranks printed say why "
                          "nothing scaled them)")),
        LostEntries("grad", note=N_("fp16 rounds any value below about 3e-8 to 0: {lost} gradient entries were lost in "
                                    "backward(), and the optimizer had nothing to apply for them")),
        SameGradNorms(terms=max(BATCHES_31) // 2 + 2, dtype="float16", note=N_(
            "from step {step} on, the gradients this rank's optimizer applied had {ratio:.3g} times the solution's "
            "norm, more than fp16's rounding allows: its loss or its backward() is not the solution's"))))),
    variants=Variants({"--batch": BATCHES_31}))


def overflow_skips(ctx) -> int:
    """03.2: the steps a GradScaler skips from a first scale of 2**24 when the largest gradient is 0.5: the scale
    halves after each skipped step, until the scaled gradient is finite in fp16."""
    scale, skipped = OVERFLOW_FIRST_SCALE, 0
    while torch.isinf(torch.tensor(OVERFLOW_GRAD * scale).half()):
        skipped, scale = skipped + 1, scale / 2
    return skipped


# 03.3: fp16 with a GradScaler and gradient clipping at --max-norm, against the solution on the same seed and threshold:
# the norm of the gradients each optimizer step applied (all parameters as one vector: what clipping bounds). Section
# 5c's lesson: clipping must measure the true gradients, after the scale is divided out of them. Clipping acts on every
# step here, so the solution applies max_norm x |g| / (|g| + 1e-6). Rounding alone: the clipping norm sums the squares
# of 161 entries (two orders differ by twice that), then the coefficient and the product: 2 x 161 + 3.
CLIP_AFTER_UNSCALE = ObservedCheck(
    properties=(Distributed("DDP"), SameSteps(),
                SameGradNorms(terms=2 * PARAMETERS_33 + 3, note=N_(
                    "from step {step} on, the gradients this rank's optimizer applied had {ratio:.3g} times the "
                    "solution's norm, about 1/{inverse:.0f}: clipping bounded gradients that were still multiplied by "
                    "the loss scale, and the scaler divided them again afterwards, so every step barely moved the "
                    "weights"),
                    note_larger=N_("at step {step} the gradients this rank's optimizer applied had {ratio:.3g} times "
                                   "the solution's norm: nothing bounded them to the clipping threshold"))),
    variants=Variants({"--max-norm": MAX_NORMS_33}))


register(Spec("03.1", N_("A loss scaler that really scales"), solution="03_1_train.py", verify=SCALER_THAT_SCALES,
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
register(Spec("03.3", N_("Clip after unscale_"), solution="03_3_train.py", verify=CLIP_AFTER_UNSCALE,
              hints=(N_("Section 5c: what does clip_grad_norm_ see while the gradients are still multiplied by the "
                        "scale? Compare the norm your ranks print with the scale."),
                     N_("The order is scaler.scale(loss).backward(), scaler.unscale_(optimizer), clip_grad_norm_, "
                        "scaler.step(optimizer), scaler.update(). Keep --max-norm as the check gives it."))))


MICRO_BATCHES_34, MAX_NORMS_34, STEPS_34 = (2, 3, 4), (0.3, 0.35, 0.4), 6  # 03.4's --micro-batches, --max-norm, steps


@dataclass(frozen=True)
class StepLossScale(Property):
    """03.4: the scale each optimizer step's ``backward()`` calls ran with is at least ``min_scale``, on every rank.
    Read per step, so that a step split into other micro-batches than the solution's (or not split) is read too: the
    losses this rank's ``backward()`` calls of the step ran on, added up, over the unscaled sum of the solution's on the
    same rank (its losses over its scale, ``reference_scale``: ``GradScaler("cpu")``'s first, which its steps without
    an overflow never change). A micro-batch's loss is its mean over its samples divided by K, so the step's losses add
    up to the mean over the rank's share either way; a loss left undivided reads as a scale of K (at most 4 here), hence
    a bound far above it: ``min_scale``, 2**8, which ``GradScaler``'s first scale (2**16) stays above unless 8 steps in
    a row overflow (none do here)."""

    reference_scale: float = 2.0**16
    min_scale: float = 2.0**8
    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            ref = reference[observed.rank]
            scales = []
            for step in range(1, len(ref.steps) + 1):
                want = sum(b.loss for b in ref.backwards if b.step == step and b.loss is not None)
                got = [b.loss for b in observed.backwards if b.step == step]
                scales.append(sum(got) * self.reference_scale / want if got and None not in got and want else None)
            if all(s is not None and s >= self.min_scale for s in scales):
                continue
            unscaled = all(s is not None and s < self.min_scale for s in scales)  # the note's case: no scale at all
            out.append(Difference(
                Message("loss scale each optimizer step's backward() calls ran with (their losses over the unscaled "
                        "ones)"), f">= {self.min_scale:g}", rounded(scales), observed.rank,
                note=self._note() if unscaled else None))
        return out


@dataclass(frozen=True)
class StepsFirst(SameSteps):
    """``SameSteps``, and a run that took another number of optimizer steps than the solution is not compared step
    by step (its steps are not the solution's: what a later property would compare is not the same step)."""

    stops_the_check = True  # not a field (ObservedCheck reads it)


# 03.4: fp16 autocast, gradient accumulation over K micro-batches and clipping at --max-norm in one loop, against the
# solution on the same seed, K and threshold. The lessons of notebook 02 (section 3: the ranks' sum once per step) and
# of this one (sections 2 and 5c: a scale for fp16's range, clipping the true gradients): the all-reduces of each
# backward() (none but in a step's last micro-batch), the scale the backward() calls ran with (at least 2), then the
# norm and the entries of the gradients each optimizer step applied. The data is chosen so that clipping acts in the
# first steps and not in the last ones (measured on 300 seeds for each K and threshold: 99% of the runs have both),
# so a step that sums its micro-batches where it should average them, or clips nothing, shows; and so that no scaled
# fp16 gradient of a micro-batch comes within a factor of 5 of fp16's largest value at the scaler's first scale
# (12,688 at most, measured likewise): a correct run never skips a step. Rounding, in fp16: each micro-batch's
# gradient entry is the sum of 4 products rounded to fp16, after 3 roundings of the values before it (the loss's
# gradient, Tanh's, the second layer's) in fp16; up to 4 micro-batches, then the all-reduce's addition and division:
# 4 x 4 + 2 = 18 roundings of fp16 (1.8 % of the norm), where the mistakes are off by 2 and more.
ROUNDINGS_34 = 4 * max(MICRO_BATCHES_34) + 2
FP16_LOOP = ObservedCheck(
    properties=(Distributed("DDP"),
                StepsFirst(note=N_(
                    "a scaler skips the optimizer step whose scaled gradients overflowed fp16 (and halves the "
                    "scale), and a step per micro-batch makes more steps than the solution's one per K "
                    "micro-batches")),
                AllReducesPerMicroBatch(),
                FirstDifference((
                    StepLossScale(note=N_(
                        "no loss scale: backward() ran on the losses as they were, or a few times them (a step's "
                        "micro-batch losses added up rather than averaged read as K), so the fp16 backward met the "
                        "gradients unscaled: what falls below fp16's smallest value (about 6e-8) is lost, and below "
                        "6e-5 it keeps fewer digits")),
                    SameGradNorms(terms=ROUNDINGS_34, dtype="float16", note=N_(
                        "from step {step} on, the gradients this rank's optimizer applied had {ratio:.3g} times the "
                        "solution's norm (1/{inverse:.3g}): the solution applies the step's true gradient, the mean "
                        "over its micro-batches, clipped to --max-norm; clipping measured, or the optimizer got, "
                        "gradients of another size"),
                        note_larger=N_(
                            "at step {step} the gradients this rank's optimizer applied had {ratio:.3g} times the "
                            "solution's norm: more than the step's mean gradient clipped to --max-norm, so its "
                            "micro-batches' gradients were added up rather than averaged, or nothing bounded them")),
                    SameTensors("grad", terms=ROUNDINGS_34, dtype="float16", note=N_(
                        "the gradient this rank's optimizer applied has the solution's norm within fp16's rounding "
                        "and points elsewhere ({ratio:.3g} times its length): it is not the mean over all the step's "
                        "micro-batches, some were left out or counted twice"))))),
    variants=Variants({"--micro-batches": MICRO_BATCHES_34, "--max-norm": MAX_NORMS_34}))

register(Spec("03.4", N_("One fp16 loop: a loss scaler, accumulation and clipping"), solution="03_4_train.py",
              verify=FP16_LOOP,
              hints=(N_("Three lessons meet in one step: notebook 02's section 3 (which backward() needs the ranks' "
                        "sum), this notebook's section 2 (what fp16 needs to keep small gradients) and section 5c "
                        "(what clipping must measure). Write down the order of the calls in one optimizer step."),
                     N_("Per step: for each of the K micro-batches, forward under autocast, loss / K, "
                        "scaler.scale(loss).backward(), all but the last inside model.no_sync(); then once: "
                        "scaler.unscale_(optimizer), clip_grad_norm_, scaler.step(optimizer), scaler.update(), with "
                        "scaler = torch.amp.GradScaler(\"cpu\")."))))
