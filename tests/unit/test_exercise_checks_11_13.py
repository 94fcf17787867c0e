"""Exercises 11.2, 11.3, 12.3 and 13.2 on fabricated observed runs (issue 44): a correct fix off by rounding passes and
the starter's mistake fails, as the checks read what each rank did (no launch here); a NaN is never within rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.exercises.core import load_all

EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture(autouse=True)
def english():
    tl.set_language("en")
    yield
    tl.set_language("en")


def tensor_record(t: torch.Tensor):
    from tutorial_lib.child.observer_torch import summary
    from tutorial_lib.runs.observed import TensorRecord
    return TensorRecord.of(summary(torch, t, 4096))


def made_up_run(ranks: dict[int, dict]):
    """An observed 2-rank run: ``ranks[r]`` may give ``losses`` (one per backward()), ``steps`` (per optimizer step,
    ``{name: gradient}``), ``final`` (``{name: gradient}`` left at the end) and ``collectives`` (``(kind, backward)``,
    ``backward`` ``None`` outside any backward())."""
    from tutorial_lib.runs.observed import (Backward, Collective, ObservedRank, ObservedRun, OptimizerStep,
                                            ParamRecord)
    out = {}
    for rank, spec in ranks.items():
        observed = ObservedRank(rank, 2, 0, process_group={"world_size": 2})
        observed.backwards = [Backward(i, i, loss, 1, (), "float32")
                              for i, loss in enumerate(spec.get("losses", []), 1)]
        observed.steps = [OptimizerStep(n, "SGD", 1, (0.1,), 0, tuple(
            ParamRecord(i, name, 0, tensor_record(grad), tensor_record(torch.zeros_like(grad)))
            for i, (name, grad) in enumerate(grads.items()))) for n, grads in enumerate(spec.get("steps", []), 1)]
        if "final" in spec:
            observed.final = {1: [ParamRecord(i, name, None, tensor_record(grad), tensor_record(torch.zeros_like(grad)))
                                  for i, (name, grad) in enumerate(spec["final"].items())]}
        observed.collectives = [Collective(n, kind, kind, f"c10d::{kind}_", "0", 2, n, 4, 4, "float32", (), None, 1,
                                           backward)
                                for n, (kind, backward) in enumerate(spec.get("collectives", []), 1)]
        out[rank] = observed
    return ObservedRun(Path("."), out)


def prop(exercise_id: str, kind: str, index: int = 0):
    """The ``index``-th property of class ``kind`` in the exercise's ObservedCheck."""
    return [p for p in load_all()[exercise_id].verify.properties if type(p).__name__ == kind][index]


def variant():
    from tutorial_lib.exercises.observing import Variant
    return Variant(7, ("--seed", "7"), 2)


# 11.2: a rank's loss is a float32 sum of up to 360 non-negative token losses (364 terms with the roundings after); the
# gradient the same sums. A fix that rounds otherwise (a float64 sum) lands a few units in the last place away.
def lm_head_gradients(scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {"weight": torch.randn(256, 16, generator=g) * 1e-3 * scale, "bias": torch.randn(256, generator=g) * 1e-3
            * scale}


def test_11_2_a_fix_a_few_roundings_away_passes_and_the_mean_of_the_ranks_means_fails():
    same_grads, same_losses = prop("11.2", "SameTensors"), prop("11.2", "SameLosses")
    assert same_grads.terms == same_losses.terms == 8 * 45 + 4, "every token of 9 windows, and 4 roundings after"
    losses = {0: [6.326705455780029, 6.321126461029053], 1: [5.125784873962402, 5.121165752410889]}
    reference = made_up_run({r: {"losses": losses[r], "steps": [lm_head_gradients()] * 2} for r in (0, 1)})
    off = 1 + 200 * EPS32  # 200 roundings: within 364
    fix = made_up_run({r: {"losses": [v * off for v in losses[r]], "steps": [lm_head_gradients(off)] * 2}
                       for r in (0, 1)})
    assert same_grads.check(fix, reference, variant()) == [] and same_losses.check(fix, reference, variant()) == []
    # the starter: each rank's mean per token (1.19 and 0.83 times its share of the step's loss), DDP averaging them
    means = made_up_run({0: {"losses": [v * 0.9 for v in losses[0]], "steps": [lm_head_gradients(1.05)] * 2},
                         1: {"losses": [v * 1.12 for v in losses[1]], "steps": [lm_head_gradients(1.05)] * 2}})
    found = same_grads.check(means, reference, variant())
    assert len(found) == 1 and "did not all weigh the same" in str(found[0].note) and "1.05 times" in str(found[0].note)
    found = same_losses.check(means, reference, variant())
    assert [d.rank for d in found] == [0, 1] and "not this rank's share" in str(found[0].note)
    assert "0.9 times" in str(found[0].note) and "backward() 1" in str(found[0].what)
    for d in found:
        assert "world_size" not in str(d.note) and "all_reduce" not in str(d.note), "what the run did, not the fix"


def test_a_nan_is_never_within_rounding_of_a_loss_or_a_tensor():
    from tutorial_lib.exercises.same_values import SameLosses, SameTensors
    reference = made_up_run({r: {"losses": [2.0, 1.5], "final": {"w": torch.ones(3)}} for r in (0, 1)})
    nan = made_up_run({r: {"losses": [2.0, float("nan")], "final": {"w": torch.tensor([1.0, float("nan"), 1.0])}}
                       for r in (0, 1)})
    found = SameLosses(terms=64, note="later {backward}", note_first="first").check(nan, reference, variant())
    assert [(d.rank, str(d.note)) for d in found] == [(0, "later 2"), (1, "later 2")]
    assert all("backward() 2 " in str(d.what) for d in found), [str(d.what) for d in found]
    assert [d.rank for d in SameTensors("grad", at="final").check(nan, reference, variant())] == [0, 1]
    fewer = made_up_run({r: {"losses": [2.0]} for r in (0, 1)})
    found = SameLosses().check(fewer, reference, variant())
    assert [(d.expected, d.measured) for d in found] == [(2, 1), (2, 1)] and "backward() calls" in str(found[0].what)


# 12.3: the block's collectives as torch saw them, per phase; and each rank's gradient shards, whose entries go through
# the block's float32 sums (238 terms) and a sum over the batch's positions (at most 24).
FORWARD, BACKWARD = [("all_reduce", None)] * 2, [("all_reduce", 1)] * 2
SETUP = [("scatter", None)] * 6 + [("broadcast", None)] * 2  # parallelize_module's weights, once: not counted


def tp_gradients(scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(12)
    return {"0.wq.weight": torch.randn(16, 32, generator=g) * scale,
            "3.weight": torch.randn(32, 64, generator=g) * scale}


def test_12_3_collectives_per_phase_and_gradients_a_few_roundings_away_pass_and_the_starters_extra_all_reduces_fail():
    counts, same = prop("12.3", "PhaseCounts"), prop("12.3", "SameTensors")
    assert same.terms == 238 + 24
    reference = made_up_run({r: {"collectives": SETUP + FORWARD + BACKWARD, "final": tp_gradients()} for r in (0, 1)})
    fix = made_up_run({r: {"collectives": SETUP + FORWARD + BACKWARD, "final": tp_gradients(1 + 200 * EPS32)}
                       for r in (0, 1)})
    assert counts.check(fix, reference, variant()) == [] and same.check(fix, reference, variant()) == []
    assert 200 * EPS32 > 1e-5, "200 roundings: refused by the old 1e-5 of the largest value"
    starter = made_up_run({r: {"collectives": SETUP + FORWARD + BACKWARD * 2, "final": tp_gradients()} for r in (0, 1)})
    found = counts.check(starter, reference, variant())
    assert [(d.rank, d.measured["all_reduce"]) for d in found] == [(0, 4), (1, 4)]
    assert "inside backward()" in str(found[0].what) and "2 all-reduces more" in str(found[0].note)
    assert "PrepareModuleInput" not in str(found[0].note)
    one_more = made_up_run({r: {"collectives": SETUP + FORWARD + BACKWARD + [("all_reduce", 1)]} for r in (0, 1)})
    assert "1 all-reduce more than" in str(counts.check(one_more, reference, variant())[0].note)
    # another phase, another kind: said, without the note that explains extra backward all-reduces
    sequence_parallel = made_up_run({r: {"collectives": [("all_gather", None)] * 2 + [("reduce_scatter", 1)] * 2}
                                     for r in (0, 1)})
    found = counts.check(sequence_parallel, reference, variant())
    assert len(found) == 4 and all(d.note is None for d in found) and found[0].measured["all_gather"] == 2
    wrong = made_up_run({r: {"final": tp_gradients(1.01)} for r in (0, 1)})
    found = same.check(wrong, reference, variant())
    assert [d.rank for d in found] == [0, 1] and "1.01 times the solution's" in str(found[0].note)


# 13.2: which parameters the optimizer steps (the tied head), and every step's loss on every rank, with 4 x 128 terms
# of rounding (a buffer computed with another power formula).
def test_13_2_a_buffer_an_ulp_apart_passes_and_an_untied_head_or_a_garbage_buffer_fails():
    params, losses = prop("13.2", "SameParameters"), prop("13.2", "SameLosses")
    assert losses.terms == 4 * 128
    tied = [{"embed.weight": torch.ones(64, 16)}] * 3
    untied = [{"embed.weight": torch.ones(64, 16), "head.weight": torch.ones(64, 16)}] * 3
    right = {0: [8.87, 8.41, 8.0], 1: [7.24, 6.93, 6.61]}
    reference = made_up_run({r: {"losses": right[r], "steps": tied} for r in (0, 1)})
    ulp_apart = made_up_run({r: {"losses": [v * (1 + 300 * EPS32) for v in right[r]], "steps": tied} for r in (0, 1)})
    assert params.check(ulp_apart, reference, variant()) == [] and losses.check(ulp_apart, reference, variant()) == []
    apart = made_up_run({r: {"losses": [right[r][0], right[r][1] * 1.01, right[r][2]], "steps": untied}
                         for r in (0, 1)})
    found = params.check(apart, reference, variant())
    assert [d.rank for d in found] == [0, 1] and "steps head.weight as a tensor of its own" in str(found[0].note)
    found = losses.check(apart, reference, variant())
    assert len(found) == 2 and all("backward() 2 " in str(d.what) for d in found), [str(d.what) for d in found]
    assert "first step agrees" in str(found[0].note)
    never_stepped = made_up_run({r: {"losses": right[r]} for r in (0, 1)})
    assert [(str(d.what), d.expected, d.measured) for d in params.check(never_stepped, reference, variant())] == [
        ("optimizer steps taken", 3, 0)] * 2
    garbage = made_up_run({r: {"losses": [v * 0.9 for v in right[r]], "steps": tied} for r in (0, 1)})
    found = losses.check(garbage, reference, variant())
    assert len(found) == 2 and all("backward() 1 " in str(d.what) for d in found), [str(d.what) for d in found]
    assert "first step's loss already differs" in str(found[0].note) and "inv_freq" not in str(found[0].note)


# 11.3: the weights each rank holds, a copy of one process's (one rounding's room), and the loss of the first batch.
def test_11_3_one_process_rows_pass_and_rows_drawn_on_each_rank_fail():
    values, losses = prop("11.3", "SameTensors"), prop("11.3", "SameLosses")
    assert values.what == "value" and values.at == "final" and values.terms == 1
    g = torch.Generator().manual_seed(13)
    whole = torch.randn(16, 8, generator=g)

    def shards(rows):  # each rank's rows of the first weight, as its value (the gradients are not compared)
        from tutorial_lib.runs.observed import ObservedRank, ObservedRun, ParamRecord
        out = {}
        for rank, t in enumerate(rows):
            observed = ObservedRank(rank, 2, 0, process_group={"world_size": 2})
            observed.final = {1: [ParamRecord(0, "0.weight", None, None, tensor_record(t))]}
            out[rank] = observed
        return ObservedRun(Path("."), out)
    reference = shards([whole[:8], whole[8:]])
    assert values.check(shards([whole[:8].clone(), whole[8:].clone()]), reference, variant()) == []
    found = values.check(shards([whole[:8], whole[:8]]), reference, variant())  # rank 1 drew rank 0's numbers
    assert [d.rank for d in found] == [1] and "no single process would build" in str(found[0].note)
    loss = made_up_run({r: {"losses": [0.0400080]} for r in (0, 1)})
    assert losses.check(made_up_run({r: {"losses": [0.0400080 * (1 + 30 * EPS32)]} for r in (0, 1)}), loss,
                        variant()) == []
    found = losses.check(made_up_run({r: {"losses": [0.0080405]} for r in (0, 1)}), loss, variant())
    assert [d.rank for d in found] == [0, 1] and "did not run on one process's weights" in str(found[0].note)
