"""Notebook 12's exercises (tensor and pipeline parallelism): the micro-batches a 4-stage GPipe needs for a given
bubble, replayed as section 4 replays the stages; a TP plan whose collectives must match section 1's table."""

from __future__ import annotations

import torch

from ..i18n import N_, Message
from ..runs.pipeline import idle_fractions, in_flight, replay_slots
from .core import Context, Difference, Spec, register

STAGES_12_1, BUBBLE_12_1 = 4, 0.2  # four GPUs as four stages; each may idle at most a fifth of the step
STAGES_12_2, MICROBATCHES_12_2, STAGE_12_2 = 4, 8, 1  # 1F1B, 4 stages, 8 micro-batches: the second stage's peak

# Section 1's table for one block under TP (Megatron's plan): one all-reduce after each Colwise -> Rowwise pair in
# forward (after the attention, after the MLP), one per prepared input in backward; no all-gather, no reduce-scatter.
TP_BLOCK_COLLECTIVES = {"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}


def fewest_microbatches(ctx: Context) -> int:
    """12.1: the fewest micro-batches m for which every stage of a 4-stage GPipe step idles at most 1/5 of it, found
    by replaying GPipe's order (every forward, then every backward) in equal slots, as section 4 replays the stages'."""
    for m in range(1, 1000):
        orders = {s: [f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)] for s in range(STAGES_12_1)}
        if (idle_fractions(replay_slots(orders)) <= BUBBLE_12_1 + 1e-12).all():
            return m
    raise AssertionError("no m below 1000")


def one_f_one_b(stages: int, m: int) -> dict[int, list[str]]:
    """1F1B's order of actions per stage: stage s warms up with min(p - s, m) forwards, then alternates one backward,
    one forward, then runs the backwards left (arXiv:2104.04473, section 2.2)."""
    orders = {}
    for s in range(stages):
        warm = min(stages - s, m)
        order = [f"F{i}" for i in range(warm)]
        for i in range(m - warm):
            order += [f"B{i}", f"F{warm + i}"]
        orders[s] = order + [f"B{i}" for i in range(m - warm, m)]
    return orders


def peak_in_flight(ctx: Context) -> int:
    """12.2: the most micro-batches whose activations stage 1 holds at once under 1F1B (4 stages, 8 micro-batches),
    counted from the order of actions (replayed first: an order that cannot run raises)."""
    orders = one_f_one_b(STAGES_12_2, MICROBATCHES_12_2)
    replay_slots(orders)
    return in_flight(orders[STAGE_12_2])


def _counts(record: dict, phase: str) -> dict:
    found = record.get(phase)
    return {k: v for k, v in found.items() if v} if isinstance(found, dict) else found


def tp_plan_collectives(ctx: Context) -> list[Difference]:
    """12.3: the block's TP plan on 2 ranks issues section 1's collectives (forward and backward), shards q, and
    computes the same output and input gradient as the same script on 1 rank."""
    pair, differences = ctx.per_rank(ctx.launch(nproc_per_node=2), 2)
    single, missing = ctx.per_rank(ctx.launch(nproc_per_node=1), 1)
    differences += missing
    if differences:
        return differences
    one = single[0]
    for rank, record in sorted(pair.items()):
        for phase, expected in TP_BLOCK_COLLECTIVES.items():
            measured = _counts(record, phase)
            if measured != expected:
                differences.append(Difference(Message("collectives in {phase}", {"phase": phase}), expected, measured,
                                              rank, note=Message(
                    "each ColwiseParallel that receives a plain tensor makes its own replicated input, and reduces "
                    "its own input gradient in backward: prepare the attention's input once (PrepareModuleInput)")
                    if phase == "backward" and isinstance(measured, dict)
                    and measured.get("all_reduce", 0) > expected["all_reduce"] else None))
        if record.get("wq_rows") != one["wq_rows"] // 2:
            differences.append(Difference(Message("rows of wq on this rank (ColwiseParallel: half of them)"),
                                          one["wq_rows"] // 2, record.get("wq_rows"), rank))
        for key, what in (("out", Message("largest |output - one rank's output|")),
                          ("x_grad", Message("largest |input gradient - one rank's|"))):
            reference, mine = torch.tensor(one[key]), torch.tensor(record.get(key) or [])
            if mine.shape != reference.shape:
                differences.append(Difference(what, f"{reference.numel()} values", mine.numel(), rank))
                continue
            gap = (mine - reference).abs().max().item()
            if gap > 1e-5 * max(reference.abs().max().item(), 1e-3):
                differences.append(Difference(what, "<= 1e-05 x its largest value", gap, rank))
    return differences


register(Spec("12.1", N_("Micro-batches for a bubble of at most 1/5 on 4 stages"), solution="12_1.py",
              expected=fewest_microbatches,
              wrong={15: N_("that makes (p - 1) / m at most 1/5; the step is m + p - 1 slots long, not m"),
                     4: N_("that is the answer for 2 stages; here each of the 4 GPUs is a stage"),
                     13: N_("that leaves each stage idle less than 1/5 of the step, but a smaller m does too")},
              hints=(N_("Section 4: with equal forwards and backwards, GPipe and 1F1B leave each stage idle for "
                        "(p - 1) / (m + p - 1) of the step (p stages, m micro-batches)."),
                     N_("Solve (4 - 1) / (m + 4 - 1) <= 1/5 for the smallest whole m: 3 x 5 <= m + 3."))))
register(Spec("12.2", N_("Activations in flight on a 1F1B stage"), solution="12_2.py", expected=peak_in_flight,
              wrong={8: N_("that is GPipe: every forward before any backward, all m micro-batches held at once"),
                     4: N_("that is stage 0: stage s warms up with p - s forwards, and this is stage 1"),
                     2: N_("stages count from 0: stage 1 is the second of the four stages")},
              hints=(N_("Section 4's memory table: 1F1B starts backward on stage s after p - s forwards, then "
                        "alternates one forward and one backward."),
                     N_("In flight on stage s: min(m, p - s). Here p = 4, m = 8, s = 1."))))
register(Spec("12.3", N_("A TP plan with section 1's collectives"), solution="12_3_tp.py",
              verify=tp_plan_collectives,
              hints=(N_("Section 1's table: under TP one block issues 2 all-reduces in forward and 2 in backward. Run "
                        "the check: which phase issues more, and which modules receive a plain tensor?"),
                     N_("Add \"0\": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts="
                        "(Replicate(),)) to the plan: q, k and v then share one DTensor input, and their input "
                        "gradients are summed locally and reduced once."))))
