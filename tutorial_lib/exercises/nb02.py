"""Notebook 02's exercises (data and accumulation): a sampler that reshuffles every epoch, the samples padding
repeats, gradient accumulation with one all-reduce per optimizer step."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DistributedSampler

from ..i18n import N_, Message
from .core import Difference, Spec, register, rounding_tolerance
from .observing import ObservedCheck, Property, Variants, variant_arg
from .properties import Distributed, SameSteps
from .same_values import SameTensors, rounded

PAD_SAMPLES, PAD_RANKS = 100, 7  # 02.2's question
EPOCHS_21, STEPS_PER_EPOCH_21 = (2, 3, 4), 2  # 02.1's --epochs; 12 samples in batches of 3 on 2 ranks: 2 steps each
MICRO_BATCHES_23, STEPS_23, SAMPLES_23 = (3, 4, 5), 2, 8  # 02.3's --micro-batches (K), optimizer steps, micro-batch


def _shard(n: int, ranks: int, rank: int, epoch: int, seed: int = 0) -> list[int]:
    """The indices ``DistributedSampler`` (shuffle on, padding) gives ``rank`` of ``ranks`` in ``epoch``."""
    sampler = DistributedSampler(range(n), num_replicas=ranks, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


@dataclass(frozen=True)
class LossesEpochByEpoch(Property):
    """02.1: the loss of every batch a rank trained on (what each ``backward()`` ran on) equals the solution's on the
    same seed, epoch by epoch, within ``rounding_tolerance(float32, terms, |the solution's loss|)``. The solution's
    batches are the shard its sampler deals the rank in each epoch, a new order every epoch; the first epoch whose
    losses differ is said per rank, beside the solution's."""

    terms: int = 64

    def check(self, mine, reference, variant):
        epochs = int(variant_arg(variant, "--epochs", "3"))
        out = []
        for observed in mine:
            want, got = reference[observed.rank].losses(), observed.losses()
            per_epoch = max(len(want) // epochs, 1)
            for epoch in range(epochs):
                w, g = want[epoch * per_epoch:(epoch + 1) * per_epoch], got[epoch * per_epoch:(epoch + 1) * per_epoch]
                if len(g) == len(w) and all(a is not None and b is not None and abs(a - b) <= rounding_tolerance(
                        torch.float32, self.terms, max(abs(b), 1e-30)) for a, b in zip(g, w)):
                    continue
                out.append(Difference(
                    Message("losses of the batches trained on in epoch {epoch}", {"epoch": epoch}),
                    rounded(w), rounded(g), observed.rank, note=_epoch_note(epoch)))
                break
        return out


def _epoch_note(epoch: int) -> Message:
    """02.1's note on the first epoch whose losses differ from the solution's: what the run did instead."""
    if epoch == 0:
        return Message("already epoch 0's batches differ from the solution's: this rank did not train on the shard a "
                       "DistributedSampler with shuffle on and the script's seed deals it")
    return Message("the epochs before matched the solution's batch for batch, and epoch {epoch} differs from its first "
                   "batch on: from there this rank trained on other batches than the solution, whose sampler deals "
                   "each epoch in a new order", {"epoch": epoch})


# 02.1: the loss of each batch each rank trained on (a DDP'd Linear(4, 1), SGD), against the solution's on the same seed
# and epochs: the batches a rank's sampler deals it, epoch by epoch. Section 1's lesson: the sampler reshuffles only
# when told the epoch, so a loop that never tells it trains every epoch on epoch 0's batches; what each backward() ran
# on shows which batches a rank trained on, whatever it prints. Rounding alone: a loss is a mean of 3 squared residuals
# of 5 terms (4 products and the bias), and the weights it runs with carry the steps before (each a mean over 6 samples,
# summed over 2 ranks): 32 roundings per step, for the 2 steps of each of up to 4 epochs. A correct fix reads the very
# same batches and is usually exact; the starter's losses differ in their first digit from epoch 1 on.
SAMPLER_RESHUFFLES = ObservedCheck(
    properties=(Distributed("DDP"), SameSteps(), LossesEpochByEpoch(terms=32 * STEPS_PER_EPOCH_21 * max(EPOCHS_21))),
    variants=Variants({"--epochs": EPOCHS_21}))


def padded_repeats(ctx) -> int:
    """02.2: the index positions that repeat an index when DistributedSampler pads 100 samples for 7 ranks."""
    indices = [i for rank in range(PAD_RANKS) for i in _shard(PAD_SAMPLES, PAD_RANKS, rank, 0)]
    return len(indices) - len(set(indices))


@dataclass(frozen=True)
class AllReducesPerMicroBatch(Property):
    """02.3: the all-reduces each ``backward()`` issued (DDP's gradient buckets; none for a micro-batch whose
    gradients stay on the rank), grouped by the optimizer step they led up to, equal the solution's on the same
    variant: K - 1 ``backward()`` calls without any, then the buckets, once, in the last. Each rank's first step that
    differs is said, with what its pattern means the run did."""

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            ref = reference[observed.rank]
            for step in range(1, len(ref.steps) + 1):
                want, got = _per_micro_batch(ref, step), _per_micro_batch(observed, step)
                if got == want:
                    continue
                outside = sum(c.backward is None for c in observed.collectives_of("all_reduce", step=step))
                out.append(Difference(
                    Message("gradient all-reduces per micro-batch (each backward()), optimizer step {step}",
                            {"step": step}), want, got, observed.rank, note=_calls_note(got, want, outside)))
                break
        return out


def _per_micro_batch(observed, step: int) -> list[int]:
    """The all-reduces each ``backward()`` of optimizer step ``step`` issued, in order."""
    return [len(observed.collectives_of("all_reduce", backward=b.index)) for b in observed.backwards if b.step == step]


def _calls_note(calls: list[int], expected: list[int], outside: int = 0) -> Message | None:
    """02.3's note on a step's all-reduces per micro-batch that are not the solution's: what the run did instead
    (``outside``: the step's all-reduces issued outside any ``backward()``)."""
    if not calls or not expected or len(calls) != len(expected):
        return Message("{k} backward() calls in this step where the solution makes {n}: the step does not accumulate "
                       "the same micro-batches", {"k": len(calls), "n": len(expected)})
    if sum(calls) > sum(expected):
        fields = {"total": sum(calls), "k": len(calls), "factor": sum(calls) / max(sum(expected), 1),
                  "synced": sum(1 for c in calls if c)}
        if fields["synced"] == len(calls):
            return Message("{total} bucket all-reduces for {k} micro-batches: every micro-batch synchronised its "
                           "gradients, {factor:g} x the communication of a step, which needs the ranks' sum only "
                           "once, for optimizer.step()", fields)
        return Message("{total} bucket all-reduces for {k} micro-batches: {synced} of them synchronised their "
                       "gradients, {factor:g} x the communication of a step, which needs the ranks' sum only once, "
                       "for optimizer.step()", fields)
    if sum(calls) == 0 and outside:
        return Message("no all-reduce inside this step's backward() calls, and {n} outside them: DDP never "
                       "synchronised these gradients in its buckets; the all-reduces the script made itself are "
                       "others", {"n": outside})
    if sum(calls) == 0:
        return Message("no gradient all-reduce in this step: each rank's optimizer stepped on its own gradients, and "
                       "the ranks' weights drift apart")
    first = next(k for k, c in enumerate(calls) if c) + 1
    if first < len(calls):
        return Message("the gradients were all-reduced in micro-batch {k} of {n}, before the last: the micro-batches "
                       "after it never reached the other rank", {"k": first, "n": len(calls)})
    return None  # the last micro-batch, another number of buckets: the counts say it


# 02.3: K micro-batches per optimizer step on 2 ranks, against the solution on the same seed and K: the all-reduces of
# each backward() (only the last of a step all-reduces, its buckets once), and the gradients each step applied (one
# process's on the whole batch, 01.1). Section 3's lesson: accumulation needs the ranks' sum once per optimizer step,
# and the gradient it steps with stays one process's. Rounding alone: a gradient entry is a mean over K x 8 samples,
# split over 2 ranks and K micro-batches (plus the all-reduce's addition and the divisions), and the second step's
# weights carry the first's: (K x 8 + 3) roundings per step, 2 steps, K at most 5.
ACCUMULATION_WITH_ONE_ALL_REDUCE = ObservedCheck(
    properties=(Distributed("DDP"), SameSteps(), AllReducesPerMicroBatch(),
                SameTensors("grad", terms=STEPS_23 * (max(MICRO_BATCHES_23) * SAMPLES_23 + 3), note=N_(
                    "the gradient this rank's optimizer applied is {ratio:.3g} times the solution's (one process's "
                    "on the whole batch): the micro-batches it accumulated are weighted otherwise"))),
    variants=Variants({"--micro-batches": MICRO_BATCHES_23}))


register(Spec("02.1", N_("A sampler that reshuffles every epoch"), solution="02_1_train.py",
              verify=SAMPLER_RESHUFFLES,
              hints=(N_("Section 1: the plot without set_epoch. Compare the samples your ranks print in epoch 0, 1 "
                        "and 2: what does DistributedSampler shuffle with?"),
                     N_("DistributedSampler shuffles with seed + epoch, and its epoch is what you last gave "
                        "sampler.set_epoch(epoch): call it at the top of every epoch, before iterating the loader."))))
register(Spec("02.2", N_("The samples padding repeats"), solution="02_2.py", expected=padded_repeats,
              wrong={PAD_SAMPLES % PAD_RANKS: N_("that is how many samples drop_last=True would leave out; the "
                                                 "default pads instead, up to the next multiple of the world size"),
                     0: N_("without drop_last, DistributedSampler pads the index list, and the padding repeats "
                           "indices"),
                     -(-PAD_SAMPLES // PAD_RANKS) * PAD_RANKS: N_("that is every index the ranks read in one epoch; "
                                                                  "how many of them are repeats?")},
              hints=(N_("Section 1's claim: with padding, ceil(N / world_size) * world_size - N indices are seen "
                        "twice. Each rank gets the same number of indices."),
                     N_("Each of the 7 ranks gets ceil(100 / 7) = 15 indices, 105 in all, for 100 samples."))))
register(Spec("02.3", N_("Gradient accumulation with one all-reduce per step"), solution="02_3_train.py",
              verify=ACCUMULATION_WITH_ONE_ALL_REDUCE,
              hints=(N_("Section 3: every backward() under DDP all-reduces the gradients. Which of the K backward() "
                        "calls of a step needs the ranks' sum?"),
                     N_("Run the first K - 1 micro-batches (forward and backward) inside `with model.no_sync():` and "
                        "the last one outside it; keep the loss divided by K."))))
