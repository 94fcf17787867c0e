"""Notebook 09's exercises (FSDP in depth): the all-gathers of an accumulated step, the bytes a rank holds between
forward and backward with the default ``reshard_after_forward``, accumulation with one reduce-scatter per unit, and
accumulation that gathers each unit once per step (three settings for three kinds of collective)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..i18n import N_, Message
from ..notebook.script_source import import_script
from .core import Context, Difference, Spec, register
from .observing import ObservedCheck, Property, Variants
from .properties import Distributed, SameSteps
from .same_values import SameTensors


def _knobs_model(*argv: str) -> torch.nn.Module:
    lesson = import_script("fsdp_knobs")
    args = lesson.parse_args(list(argv))
    return lesson.Net(args.dim, args.n_layers), args


def accumulated_all_gathers(ctx: Context) -> int:
    """09.1: all-gathers per optimizer step of fsdp_knobs.py at --n-layers 5 with 4 micro-batches, the default
    reshard_after_forward, set_requires_gradient_sync(False) until the last: 2U - 1 per micro-batch."""
    model, args = _knobs_model("--n-layers", "5")
    units = len(model.blocks) + 1  # one unit per block, and the root (input layer and head)
    return args.grad_accum_steps * (2 * units - 1)


def held_after_forward(ctx: Context) -> int:
    """09.2: bytes of parameters rank 0 of 4 holds between forward and backward, the default reshard_after_forward,
    at notebook 09's MODEL (--dim 64 --n-layers 3): the root whole, every block's 1/4."""
    model, _args = _knobs_model("--dim", "64", "--n-layers", "3")
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    blocks = sum(p.numel() * p.element_size() for p in model.blocks.parameters())
    return (total - blocks) + blocks // 4


@dataclass(frozen=True)
class ReduceScattersPerStep(Property):
    """09.3: every optimizer step reduce-scattered as often as the solution's on the same variant: once per FSDP unit,
    the accumulated gradients' sum in the last micro-batch's backward. The first step that differs is reported per
    rank, with how many of its ``backward()`` calls reduce-scattered."""

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            got, want = observed.per_step("reduce_scatter"), reference[observed.rank].per_step("reduce_scatter")
            step = next((s for s, (g, w) in enumerate(zip(got, want), start=1) if g != w), None)
            if step is None:
                continue  # the same counts, or other steps (SameSteps says so)
            units = len(observed.fully_shard_units())
            backwards = [b.index for b in observed.backwards if b.step == step]
            synced = sum(1 for b in backwards if observed.collectives_of("reduce_scatter", backward=b))
            fields = {"measured": got[step - 1], "units": units, "synced": synced, "micro": len(backwards),
                      "factor": got[step - 1] / max(want[step - 1], 1)}
            if got[step - 1] > want[step - 1] and synced == len(backwards):
                note = Message("every one of the step's {micro} backward() calls reduce-scattered its gradients: "
                               "{measured} reduce-scatters for {units} units, {factor:g} x the communication of an "
                               "accumulated step, which needs the ranks' sum once per unit", fields)
            elif got[step - 1] > want[step - 1]:
                note = Message("{synced} of the step's {micro} backward() calls reduce-scattered their gradients: "
                               "{measured} reduce-scatters for {units} units, {factor:g} x the communication of an "
                               "accumulated step, which needs the ranks' sum once per unit", fields)
            else:
                note = Message("{measured} reduce-scatters for {units} units: the accumulated gradients of some units "
                               "were never summed over the ranks, and the optimizer did not step them with that sum",
                               fields)
            out.append(Difference(Message("reduce-scatters in optimizer step {step}", {"step": step}),
                                  want[step - 1], got[step - 1], observed.rank, note=note))
        return out


# 09.3: on 2 ranks, each optimizer step of --micro-batches micro-batches reduce-scatters once per FSDP unit (the
# solution's count on the same variant), and the gradients the optimizer steps with are the solution's, shards put
# together: by section 4, one process's on the whole batch. A step's gradients come from the same samples in another
# order: each entry sums at most 4 micro-batches x 16 samples, then the roundings after: the division by K, the
# reduce-scatter's addition and FSDP's division by world_size (64 + 3 = 67 terms, rounding_tolerance).
ONE_REDUCE_SCATTER_PER_UNIT = ObservedCheck(
    properties=(Distributed("FSDP2"), SameSteps(), ReduceScattersPerStep(),
                SameTensors("grad", terms=67, note=N_(
                    "the gradient this step was taken with is {ratio:.3g} times the solution's on the same inputs: it "
                    "is not the mean over every micro-batch of both ranks"))),
    variants=Variants({"--batch": (8, 12, 16), "--micro-batches": (2, 3, 4)}))


def _gathers(observed, step: int) -> tuple[int, int]:
    """``(all-gathers in forward, all-gathers inside backward())`` of optimizer step ``step`` on ``observed``."""
    gathers = observed.collectives_of("all_gather", step=step)
    inside = sum(1 for c in gathers if c.backward is not None)
    return len(gathers) - inside, inside


@dataclass(frozen=True)
class AllGathersPerStep(Property):
    """09.4: every optimizer step all-gathered as often as the solution's on the same variant, in its forwards
    (outside ``backward()``) and inside its ``backward()`` calls. The first step that differs is reported per rank, a
    line for each phase that differs, with what its count means the run did: units freed after each backward (every
    forward gathers them again), freed after each forward (every backward does), or kept gathered across an
    optimizer step (the forward ran on the weights before it)."""

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            ref = reference[observed.rank]
            steps = range(1, min(len(observed.steps), len(ref.steps)) + 1)
            step = next((s for s in steps if _gathers(observed, s) != _gathers(ref, s)), None)
            if step is None:
                continue  # the same counts, or other steps (SameSteps says so)
            (forward, backward), (want_forward, want_backward) = _gathers(observed, step), _gathers(ref, step)
            fields = {"units": len(observed.fully_shard_units()), "previous": step - 1,
                      "micro": sum(1 for b in observed.backwards if b.step == step)}
            if forward != want_forward:
                if forward > want_forward:
                    note = Message("the step's {micro} forwards all-gathered {measured} times for {units} units: "
                                   "each backward() left the units as shards, so every micro-batch's forward "
                                   "gathered them anew", {**fields, "measured": forward})
                elif step > 1:
                    note = Message("the step's forwards all-gathered {measured} times for {units} units: the units "
                                   "kept what was gathered before optimizer step {previous} changed the shards, so "
                                   "this step's forwards and gradients are those of the old weights",
                                   {**fields, "measured": forward})
                else:
                    note = None
                out.append(Difference(Message("all-gathers in the forwards of optimizer step {step}", {"step": step}),
                                      want_forward, forward, observed.rank, note=note))
            if backward != want_backward:
                note = Message("the step's {micro} backward() calls all-gathered {measured} times: units were "
                               "freed to their shards after their forward, and every micro-batch's backward gathered "
                               "them again", {**fields, "measured": backward}) if backward > want_backward else None
                out.append(Difference(Message("all-gathers inside the backward() calls of optimizer step {step}",
                                              {"step": step}), want_backward, backward, observed.rank, note=note))
        return out


# 09.4: on 2 ranks, each optimizer step of --micro-batches micro-batches reduce-scatters once per FSDP unit and
# all-gathers as often as the solution on the same variant, in its forwards and in its backward() calls (once per unit
# per step, all in the first forward), and the gradients each step is taken with are the solution's, shards put
# together. Section 1's all-gathers of a step and section 4's accumulation at once: no reduce-scatter before the last
# micro-batch, the units kept gathered from forward to backward and from one micro-batch to the next, and freed after
# the last backward, since the optimizer then changes the shards. Rounding as 09.3's: at most 4 micro-batches x 16
# samples per entry, then the division by K, the reduce-scatter's addition and FSDP's division (67 terms).
GATHERED_ONCE_PER_STEP = ObservedCheck(
    properties=(Distributed("FSDP2"), SameSteps(), ReduceScattersPerStep(), AllGathersPerStep(),
                SameTensors("grad", terms=67, note=N_(
                    "the gradient this step was taken with is {ratio:.3g} times the solution's on the same inputs (in "
                    "norm): it is not the mean over every micro-batch of both ranks, on the weights of this step"))),
    variants=Variants({"--batch": (8, 12, 16), "--micro-batches": (2, 3, 4)}))


register(Spec("09.1", N_("All-gathers of an accumulated FSDP step"), solution="09_1.py",
              expected=accumulated_all_gathers,
              wrong={11: N_("that is one micro-batch: set_requires_gradient_sync(False) skips reduce-scatters, not "
                            "all-gathers; every micro-batch's forward and backward need the parameters"),
                     48: N_("the default keeps the root gathered from its forward to its backward: 2U - 1 per "
                            "micro-batch, not 2U"),
                     36: N_("count the root too: the input layer and the head are a unit of their own")},
              hints=(N_("Section 4's accumulation table: with K micro-batches the all-gathers are the same with and "
                        "without gradient sync. How many units does --n-layers 5 make?"),
                     N_("U = 5 blocks + the root = 6 units. The default reshard_after_forward gives 2U - 1 "
                        "all-gathers per forward and backward; a step has K = 4 (fsdp_knobs.py's default)."))))
register(Spec("09.2", N_("Bytes a rank holds between forward and backward"), solution="09_2.py",
              expected=held_after_forward, byte_count=True,
              wrong={103_944: N_("that is reshard_after_forward=True, 1/N of everything: the default keeps the root "
                                 "gathered"),
                     415_776: N_("that is the whole model: reshard_after_forward=False"),
                     207_888: N_("that is an int 2 (1/2 of every unit); the default frees inner units to 1/N and "
                                 "keeps the root whole")},
              hints=(N_("Section 1: the default is True for the inner units (1/N held after their forward) and False "
                        "for the root (held whole until backward)."),
                     N_("fsdp_knobs.py at --dim 64 --n-layers 3: the root (inp 64 x 64 + 64, head 64 x 8 + 8) whole, "
                        "each block (64 -> 256 -> 64, with biases) 1/4; fp32, 4 bytes per element."))))
register(Spec("09.3", N_("Accumulation with one reduce-scatter per unit"), solution="09_3_train.py",
              verify=ONE_REDUCE_SCATTER_PER_UNIT,
              hints=(N_("Section 4: by default FSDP reduce-scatters after every backward. Which FSDPModule method "
                        "is DDP's no_sync() for FSDP2?"),
                     N_("Before each backward call model.set_requires_gradient_sync(micro == K - 1): no sync until "
                        "the last micro-batch, whose backward reduce-scatters the accumulated sum once per unit."))))
register(Spec("09.4", N_("Accumulation that gathers each unit once per step"), solution="09_4_train.py",
              verify=GATHERED_ONCE_PER_STEP,
              hints=(N_("Section 1 counted where a step's all-gathers go: each unit's forward, and its backward again "
                        "unless it stays gathered after its forward; section 4: each micro-batch's backward frees the "
                        "units too, and reduce-scatters. Which of the three does each count in the verdict come from?"),
                     N_("Three settings: fully_shard(layer, reshard_after_forward=False) for the inner units, and "
                        "before each backward model.set_requires_gradient_sync(last) and "
                        "model.set_reshard_after_backward(last), last = (micro == K - 1): the units are freed, and "
                        "their gradients reduce-scattered, once per step."))))
