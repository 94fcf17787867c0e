"""The properties of the exercises that ask for a design (issue 44), on fabricated observed runs: 12.4's
synchronisations per block and whole gradients (any placement put together), and 13.4's measures of optimizer state
and loss. Each pattern a correct plan or solution makes passes; the lesson's mistake fails with a note that says what
the run did and never names the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.exercises.core import load_all
from tutorial_lib.exercises.observing import Variant
from tutorial_lib.runs.observed import (Backward, Collective, ObservedRank, ObservedRun, OptimizerStep, ParamRecord,
                                        TensorRecord)

EPS32 = torch.finfo(torch.float32).eps
FIX_12_4 = ("ColwiseParallel", "RowwiseParallel", "PrepareModuleInput", "SequenceParallel")


@pytest.fixture(autouse=True)
def english():
    tl.set_language("en")
    yield
    tl.set_language("en")


def recorded(t: torch.Tensor, **where) -> TensorRecord:
    """``t`` as the observer records it (bit for bit), with a DTensor's ``placements`` and ``mesh`` when given."""
    from tutorial_lib.child.observer_torch import summary
    return TensorRecord.of({**summary(torch, t, 4096), **where})


def tp_run(phases: list[tuple[list[str], list[str]]], grads=None, placements: str = "S(0)") -> ObservedRun:
    """A 2-rank observed run: optimizer step ``s`` issues ``phases[s - 1][0]`` (collective kinds, in order) in its
    forward and ``phases[s - 1][1]`` inside its ``backward()``; each step's parameters have the gradients ``grads``
    (whole tensors), held by rank r as its part under ``placements`` ("S(0)": chunk r of dim 0; "P(sum)": half the
    gradient on each rank; "R": the whole on each)."""
    grads = grads if grads is not None else [torch.tensor([[0.5, -1.0], [2.0, 0.25]])]
    mesh = {"shape": [2], "ranks": [0, 1]}
    ranks = {}
    for rank in (0, 1):
        collectives, seq = [], 0
        for step, (forward, backward) in enumerate(phases, start=1):
            for kinds, inside in ((forward, None), (backward, step)):
                for kind in kinds:
                    seq += 1
                    collectives.append(Collective(seq, kind, kind, f"c10d::{kind}", "0", 2, seq, 64, 64, "float32",
                                                  (), "sum", step, inside))
        held = {"S(0)": lambda g: g.chunk(2)[rank].contiguous(), "P(sum)": lambda g: g / 2, "R": lambda g: g}
        params = tuple(ParamRecord(i, f"p{i}", 0, recorded(held[placements](g), placements=[placements], mesh=mesh),
                                   recorded(held[placements](torch.zeros_like(g)), placements=[placements],
                                            mesh=mesh))
                       for i, g in enumerate(grads))
        ranks[rank] = ObservedRank(
            rank, 2, 0, process_group={"world_size": 2}, collectives=collectives,
            backwards=[Backward(s, s, 0.5, 1, (), "float32") for s in range(1, len(phases) + 1)],
            steps=[OptimizerStep(s, "SGD", 1, (0.1,), 0, params) for s in range(1, len(phases) + 1)])
    return ObservedRun(Path("."), ranks)


SECTION_1 = (["all_reduce"] * 4, ["all_reduce"] * 4)  # 2 blocks: an all-reduce after each pair, each way
SEQUENCE_PARALLEL = (["all_gather", "reduce_scatter"] * 4 + ["all_gather"], ["reduce_scatter", "all_gather"] * 4)


def prop_12_4(kind: str):
    return next(p for p in load_all()["12.4"].verify.properties if type(p).__name__ == kind)


@pytest.mark.parametrize("phases, where, said", [
    ((["all_reduce"] * 4, ["all_reduce"] * 8), "collectives in the backward() of optimizer step 1",
     "backward synchronised the ranks 8 times for 2 blocks"),
    ((["all_reduce"] * 6, ["all_reduce"] * 4), "collectives in the forward of optimizer step 1",
     "the forward synchronised the ranks 6 times for 2 blocks"),
    ((["reduce_scatter"] * 4 + ["all_gather"] * 7, ["all_gather"] * 4),
     "collectives in the forward of optimizer step 1", "7 all-gathers for 4 reduce-scatters"),
])
def test_12_4_section_1_and_sequence_parallel_pass_and_more_syncs_per_block_fail(phases, where, said):
    syncs, variant = prop_12_4("SyncsPerBlock"), Variant(7, ("--seed", "7"), 2)
    for plan in (SECTION_1, SEQUENCE_PARALLEL):
        assert syncs.check(tp_run([plan, plan]), None, variant) == [], plan
    found = syncs.check(tp_run([SECTION_1, phases]), None, variant)  # step 2 only: the first step over is said
    assert [(str(d.what), d.rank) for d in found] == [(where.replace("step 1", "step 2"), r) for r in (0, 1)]
    assert said in str(found[0].note), str(found[0].note)
    assert not any(key in str(found[0].note) for key in FIX_12_4)


def test_12_4_gradients_put_together_from_shards_or_partial_sums_pass_and_a_factor_of_2_fails():
    same, variant = prop_12_4("SameWholeGradients"), Variant(7, ("--seed", "7"), 2)
    grads = [torch.tensor([[0.5, -1.0], [2.0, 0.25]]), torch.tensor([[0.125, 3.0], [-0.75, 1.5]])]
    solution = tp_run([SECTION_1], grads, "R")
    for placements in ("S(0)", "P(sum)", "R"):  # a norm's gradient is Partial under sequence parallelism
        assert same.check(tp_run([SECTION_1], grads, placements), solution, variant) == [], placements
    near = [g * (1 + 8 * EPS32) for g in grads]
    assert same.check(tp_run([SECTION_1], near, "S(0)"), solution, variant) == []
    found = same.check(tp_run([SECTION_1], [g * 2 for g in grads], "S(0)"), solution, variant)
    assert len(found) == 1 and "p0 (step 1)" in str(found[0].what) and "2 times the solution's" in str(found[0].note)


def test_12_4_a_rank_holding_whole_weights_where_the_solution_holds_shards_is_named():
    held, variant = prop_12_4("HeldParameterBytes"), Variant(7, ("--seed", "7"), 2)
    grads = [torch.ones(4, 2)]
    solution = tp_run([SECTION_1], grads, "S(0)")
    assert held.check(tp_run([SECTION_1], grads, "S(0)"), solution, variant) == []
    found = held.check(tp_run([SECTION_1], grads, "R"), solution, variant)
    assert [d.rank for d in found] == [0, 1] and "2.00 times the solution's parameter bytes" in str(found[0].note)
    assert "1 parameters whole" in str(found[0].note) and "p0" in str(found[0].note)


def fine_tune(losses: list[float], state_bytes: dict[int, list[tuple[str, int, int]]]) -> ObservedRun:
    """A 2-rank observed fine-tune: a ``backward()`` per loss on every rank, and rank r's optimizer steps
    ``state_bytes[r]`` as ``(optimizer class, optimizer id, state bytes after it)``, one per backward in turn."""
    ranks = {}
    for rank, steps in state_bytes.items():
        ranks[rank] = ObservedRank(
            rank, 2, 0, process_group={"world_size": 2},
            backwards=[Backward(i, i, loss, 1, (), "float32") for i, loss in enumerate(losses, start=1)],
            steps=[OptimizerStep(i, name, oid, (3e-3,), nbytes, ()) for i, (name, oid, nbytes) in
                   enumerate(steps, start=1)])
    return ObservedRun(Path("."), ranks)


def test_13_4_state_is_each_optimizers_last_summed_and_the_most_of_any_rank_and_adamw_steps_are_counted():
    from tutorial_lib.exercises.nb13 import LastLosses, OptimizerStateBytes, OptimizerSteps
    full = fine_tune([5.0, 4.0, 3.5, 3.0, 2.5], {r: [("AdamW", 1, 1000)] * 5 for r in (0, 1)})
    # ZeroRedundancyOptimizer: its own (no state) and its inner AdamW's step per backward, rank 1 the larger share
    zero = fine_tune([5.0, 4.0, 3.5, 3.0, 2.5], {0: [("ZeroRedundancyOptimizer", 2, 0), ("AdamW", 3, 480)] * 5,
                                                 1: [("ZeroRedundancyOptimizer", 2, 0), ("AdamW", 3, 520)] * 5})
    assert OptimizerStateBytes().of(full) == 1000 and OptimizerStateBytes().of(zero) == 520
    assert LastLosses().of(full) == pytest.approx(3.0)
    variant = Variant(1, ("--seed", "1"), 2)
    assert OptimizerSteps().check(zero, full, variant) == []
    adagrad = fine_tune([5.0, 4.0, 3.5, 3.0, 2.5], {r: [("Adagrad", 1, 500)] * 5 for r in (0, 1)})
    found = OptimizerSteps(note="another optimizer ({others})").check(adagrad, full, variant)
    assert [(d.rank, d.expected, d.measured) for d in found] == [(0, 5, 0), (1, 5, 0)]
    assert "Adagrad" in str(found[0].note)


def test_13_4_a_first_loss_other_than_the_baselines_is_another_model_and_rounding_is_not():
    from tutorial_lib.exercises.nb13 import SameStart
    variant = Variant(1, ("--seed", "1"), 2)
    steps = {r: [("AdamW", 1, 1000)] * 3 for r in (0, 1)}
    baseline = fine_tune([5.25, 4.5, 4.0], steps)
    assert SameStart().check(fine_tune([5.25 * (1 + 4 * EPS32), 3.0, 2.0], steps), baseline, variant) == []
    found = SameStart(note="{ratio:.4g} times").check(fine_tune([5.30, 4.5, 4.0], steps), baseline, variant)
    assert [d.rank for d in found] == [0, 1] and "1.01 times" in str(found[0].note)
    assert [d.rank for d in SameStart().check(fine_tune([5.25, 4.5], steps), baseline, variant)] == [0, 1]
