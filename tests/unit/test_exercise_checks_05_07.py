"""The checks of notebooks 05-07 (a job interrupted once, two nodes, hangs) on fabricated observed runs, no launch: each
property passes what the lesson's fix does, fails what the starter did, and says what the run did (issue 44)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch

import tutorial_lib as tl
from conftest import ROOT
from tutorial_lib.exercises.core import load_all
from tutorial_lib.exercises.observing import Variant
from tutorial_lib.exercises.properties import CountAtLeast, Matched
from tutorial_lib.exercises.same_values import DistinctLosses, SameTensors
from tutorial_lib.runs.observed import (Backward, Collective, ObservedRank, ObservedRun, OptimizerStep, ParamRecord,
                                        TensorRecord)

EPS32 = torch.finfo(torch.float32).eps
SPECS = load_all()


@pytest.fixture(autouse=True)
def english():
    tl.set_language("en")
    yield
    tl.set_language("en")


def record(t: torch.Tensor) -> TensorRecord:
    from tutorial_lib.child.observer_torch import summary
    return TensorRecord.of(summary(torch, t, 4096))


def step(n: int, values: list[float], grads: list[float] | None = None) -> OptimizerStep:
    """Optimizer step ``n`` of one parameter (a vector) whose value after it is ``values``."""
    grad = record(torch.tensor(grads if grads is not None else values))
    return OptimizerStep(n, "SGD", 1, (0.1,), 0, (ParamRecord(0, "weight", 0, grad, record(torch.tensor(values))),))


def collective(seq: int, kind: str, nbytes: int, backward: int | None = None, size: int = 2) -> Collective:
    return Collective(seq, kind, kind, f"c10d::{kind}", "0", size, seq, nbytes, nbytes, "float32", ((),), None, 1,
                      backward)


def rank(r: int, world_size: int = 2, *, losses=(), steps=(), collectives=()) -> ObservedRank:
    return ObservedRank(r, world_size, 0, process_group={"world_size": world_size},
                        backwards=[Backward(i, i, loss, 1, (), "float32") for i, loss in enumerate(losses, 1)],
                        steps=list(steps), collectives=list(collectives), exit_code=0)


def run(*ranks: ObservedRank) -> ObservedRun:
    return ObservedRun(Path("."), {r.rank: r for r in ranks})


# 05.1, 05.3: a job interrupted once, compared with the uninterrupted solution. The check picks stop from the variant.
VARIANT_05 = Variant(7, ("--seed", "7", "--steps", "6"), 2)
LOSSES = {0: [2.5, 2.25, 2.0, 1.75, 1.5, 1.25], 1: [3.5, 3.25, 3.0, 2.75, 2.5, 2.25]}
VALUES = [[0.1 * s, -0.2 * s] for s in range(1, 7)]


def trajectory(r: int, first: int, last: int, *, losses=None, values=None) -> ObservedRank:
    """Rank ``r`` training steps ``first`` to ``last`` of the uninterrupted run (or other ``losses``/``values``)."""
    losses = losses if losses is not None else LOSSES[r][first - 1:last]
    values = values if values is not None else VALUES[first - 1:last]
    return rank(r, losses=losses, steps=[step(k, v) for k, v in enumerate(values, 1)],
                collectives=[collective(k, "all_reduce", 8, backward=k) for k in range(1, len(losses) + 1)])


def check_05(attempt: int, mine: ObservedRun, exercise_id: str = "05.1") -> list:
    """The properties of 05.x's check for ``attempt`` (0: before the interruption, 1: after the restart) on ``mine``,
    against the uninterrupted reference (all 6 steps)."""
    check = SPECS[exercise_id].verify
    reference = run(trajectory(0, 1, 6), trajectory(1, 1, 6))
    return [d for p in (check.before if attempt == 0 else check.properties) if not hasattr(p, "wrapper")
            for d in p.check(mine, reference, VARIANT_05)]


def test_05_the_interruption_falls_with_at_least_two_steps_on_each_side_and_both_exercises_share_the_check():
    from tutorial_lib.exercises.nb05 import interruption
    for seed in range(1, 50):
        for steps in (5, 6, 7):
            stop, total = interruption(Variant(seed, ("--seed", str(seed), "--steps", str(steps)), 2))
            assert total == steps and 2 <= stop <= steps - 2
    assert interruption(VARIANT_05) == (3, 6)
    assert SPECS["05.1"].verify is SPECS["05.3"].verify and SPECS["05.1"].launches == 2


def test_05_an_exact_resume_passes_and_the_starters_replayed_steps_are_said():
    assert check_05(0, run(trajectory(0, 1, 3), trajectory(1, 1, 3))) == []
    assert check_05(1, run(trajectory(0, 4, 6), trajectory(1, 4, 6))) == []
    replayed = run(*(trajectory(r, 1, 6, values=VALUES) for r in (0, 1)))  # attempt 1 trained steps 1..6 again
    found = check_05(1, replayed)
    assert [(d.rank, d.expected, d.measured) for d in found] == [(0, 3, 6), (1, 3, 6)]
    assert "3 steps it had already trained before the interruption ran a second time" in str(found[0].note)
    one = check_05(1, run(*(trajectory(r, 3, 6) for r in (0, 1))))  # started one step early: 1 step replayed
    assert "1 step it had already trained" in str(one[0].note) and "that batch twice" in str(one[0].note)


def test_05_losses_are_compared_bit_for_bit_and_the_first_rank_that_differs_is_said():
    """05.3's starter: rank 1 restores rank 0's random state, so its loss differs at the first resumed step, rank 0's
    only once the weights have moved. Exact: the same operations on the same inputs give the same bits on CPU, so a
    loss one float32 rounding away is already another computation."""
    rank1 = LOSSES[1][3:]
    off = [rank1[0] * (1 + EPS32), *rank1[1:]]
    found = check_05(1, run(trajectory(0, 4, 6, losses=[1.75, 1.6, 1.3]), trajectory(1, 4, 6, losses=off)))
    assert [(d.rank, str(d.what)) for d in found] == [
        (0, "loss at step 5 after the restart (attempt 1), compared with the uninterrupted run's"),
        (1, "loss at step 4 after the restart (attempt 1), compared with the uninterrupted run's")]
    assert found[1].expected == repr(2.75) and found[1].measured == repr(off[0])
    assert "random state" in str(found[1].note)


def test_05_an_update_that_differs_after_equal_losses_is_said_and_attempt_0_is_held_to_the_uninterrupted_run():
    last = [list(v) for v in VALUES[3:]]
    last[-1][1] += 1e-3  # the last step's update differs: no later loss shows it
    found = check_05(1, run(*(trajectory(r, 4, 6, values=last) for r in (0, 1))))
    assert [(d.rank, str(d.what)) for d in found] == [
        (r, "largest |parameter - the uninterrupted run's| after step 6") for r in (0, 1)]
    assert found[0].measured == pytest.approx(1e-3, rel=1e-3) and "did not step from the state" in str(found[0].note)
    other = check_05(0, run(*(trajectory(r, 1, 3, losses=[9.0, 8.0, 7.0]) for r in (0, 1))))
    assert [d.rank for d in other] == [0, 1] and "before any checkpoint was loaded" in str(other[0].note)
    short = check_05(0, run(*(trajectory(r, 1, 2) for r in (0, 1))))
    assert [(d.expected, d.measured) for d in short] == [(3, 2), (3, 2)]


# Matched (07.2, 07.3): the ranks' collectives, in order.
def test_matched_passes_the_same_collectives_and_names_the_first_that_differs():
    same = [collective(1, "barrier", 0), collective(2, "all_reduce", 8)]
    assert Matched().check(run(rank(0, collectives=same), rank(1, collectives=same)), None, VARIANT_05) == []
    sends = [collective(3, "send", 8)]  # point-to-point: the ranks differ by design
    assert Matched().check(run(rank(0, collectives=same + sends), rank(1, collectives=same)), None, VARIANT_05) == []
    found = Matched().check(run(rank(0, collectives=same), rank(1, collectives=same[1:])), None, VARIANT_05)
    assert [(d.rank, str(d.what), str(d.expected), str(d.measured)) for d in found] == [
        (1, "collective 1 of the run, compared with rank 0's", "barrier across 2 ranks, 0 bytes",
         "all_reduce across 2 ranks, 8 bytes")]
    assert "did not call the same collectives in the same order" in str(found[0].note)
    short = Matched().check(run(rank(0, collectives=same), rank(1, collectives=same[:1])), None, VARIANT_05)
    assert str(short[0].what) == "collective 2 of the run, compared with rank 0's" and str(short[0].measured) == "none"


# DistinctLosses (06.2): two ranks with the same loss trained on the same samples.
def test_distinct_losses_pass_and_equal_ones_name_the_ranks():
    four = Variant(3, (), 4)
    assert DistinctLosses().check(run(*(rank(r, 4, losses=[1.0 + r]) for r in range(4))), None, four) == []
    starter = run(*(rank(r, 4, losses=[[6.17, 8.21][r % 2]]) for r in range(4)))  # nodes 0 and 1: the same halves
    found = DistinctLosses().check(starter, None, four)
    assert [d.measured for d in found] == [[0, 2], [1, 3]] and "ranks [0, 2] computed the same loss" in str(
        found[0].note)
    note = SPECS["06.2"].verify.properties[1]
    assert "trained on the same samples" in str(note.check(starter, None, four)[0].note)


# CountAtLeast (07.3): the loss crosses the ranks outside backward(), at least as often as in the solution.
def test_count_at_least_allows_more_and_says_fewer():
    prop = next(p for p in SPECS["07.3"].verify.properties if isinstance(p, CountAtLeast))
    ddp = [collective(1, "all_gather", 8), collective(2, "all_reduce", 1284, backward=1)]
    losses = [collective(3 + k, "all_reduce", 4) for k in range(3)]
    solution = run(rank(0, collectives=ddp + losses), rank(1, collectives=ddp + losses))
    gathered = [collective(3 + k, kind, 8) for k in range(3) for kind in ("all_gather", "all_gather")]
    reduced = [collective(3 + k, "reduce", 4) for k in range(3)]
    for fix in (gathered, reduced):
        assert prop.check(run(rank(0, collectives=ddp + fix), rank(1, collectives=ddp + fix)), solution,
                          VARIANT_05) == []
    dropped = run(rank(0, collectives=ddp), rank(1, collectives=ddp))  # rank 0 logs its own loss: no collective
    found = prop.check(dropped, solution, VARIANT_05)
    assert [(d.rank, d.expected, d.measured) for d in found] == [(0, ">= 4", 1), (1, ">= 4", 1)]
    assert "holds no other rank's loss" in str(found[0].note)
    assert "all_reduce outside" not in str(found[0].note) and "dist.all_reduce(global_loss)" not in str(found[0].note)


# 06.2 and 06.3: the gradient of a split over 4 ranks against the solution's, within what rounding allows.
def four_ranks(grad: list[float]) -> ObservedRun:
    return run(*(rank(r, 4, losses=[float(r)], steps=[step(1, [0.0] * len(grad), grad)]) for r in range(4)))


@pytest.mark.parametrize("exercise_id", ["06.2", "06.3"])
def test_06_a_gradient_summed_in_another_order_passes_and_one_that_misses_samples_fails(exercise_id):
    same = next(p for p in SPECS[exercise_id].verify.properties if isinstance(p, SameTensors))
    grad = [-2.4765, -1.8859, -2.7718, -3.8039, 0.6]
    reference, four = four_ranks(grad), Variant(5, (), 4)
    reordered = [g * (1 + 64 * EPS32) for g in grad]  # 64 roundings of the largest entry: another grouping of the sum
    assert 64 * EPS32 * 3.8039 > 1e-6 * 3.8039, "more than a fixed 1e-6 would allow"
    assert same.check(four_ranks(reordered), reference, four) == []
    missing = same.check(four_ranks([g * 0.96 for g in grad]), reference, four)  # 1 sample of 25 left out
    assert missing and "0.96 times the solution's" in str(missing[0].note)


def test_07_1s_hang_is_exercise_2s_starter_as_the_notebook_writes_it():
    from tutorial_lib.exercises.nb07 import HANG
    for folder in ("notebooks", "notebooks/zh"):
        cells = nbformat.read(ROOT / folder / "07_troubleshooting.ipynb", as_version=4).cells
        starter = next(c.source for c in cells if c.source.startswith("%%writefile {ex2.script}\n"))
        assert starter.removeprefix("%%writefile {ex2.script}\n") + "\n" == HANG
