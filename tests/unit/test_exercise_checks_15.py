"""Notebook 15's exercises without launches: 15.1's comparison of a restarted replica group's optimizer steps with the
live group's, on fabricated observer records (each step: a digest of the gradient it applied and of the weights it
left, its learning rate), and 15.2's rule beside the records of a real drill's shape. The launches are in
tests/integration/test_exercises.py (the starter fails, the solution passes) and test_exercise_cheats.py (the corpus
of tests/fixtures/exercises/15.1/)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tutorial_lib as tl
from tutorial_lib.exercises.core import load_all
from tutorial_lib.exercises.healing import Drill, Followed, HealCheck, follow
from tutorial_lib.exercises.nb15 import samples_not_trained_on
from tutorial_lib.runs.observed import OptimizerStep, ParamRecord, TensorRecord


@pytest.fixture(autouse=True)
def english():
    tl.set_language("en")
    yield
    tl.set_language("en")


def digest(text: str) -> TensorRecord:
    return TensorRecord((2,), "float32", 2, 8, text.ljust(40, "0")[:40])


def step(grad: str, weights: str, lr: float = 0.01) -> OptimizerStep:
    """One optimizer step of a one-parameter model: the gradient it applied, the weights it left (their digests)."""
    return OptimizerStep(1, "AdamW", 1, (lr,), 64, (ParamRecord(0, "w", 0, digest(grad), digest(weights)),))


# Group 0's steps: step i applied gradient gi and left weights wi, at a learning rate that decays.
LIVE = [step(f"g{i}", f"w{i}", lr=0.01 / i) for i in range(1, 21)]


def drill(restarted, at_restart=10, waited=None, survivor=LIVE):
    return Drill(Path("."), survivor, survivor[:3], restarted, 4, at_restart, waited)


def said(differences) -> str:
    return "\n".join(f"{d.what} | {d.expected} | {d.measured} | {d.note}" for d in differences)


def test_a_group_that_continues_the_live_groups_steps_bit_for_bit_passes():
    healed = [step(f"g{i}", f"w{i}", lr=0.01 / i) for i in range(13, 21)]
    assert follow(healed, LIVE) == Followed(12, 8, 8) and HealCheck().compare(drill(healed)) == []
    # its last steps after group 0's last one are not compared (group 0 was killed after it)
    longer = healed + [step("g99", "w99")]
    assert follow(longer, LIVE).compared == 8 and HealCheck().compare(drill(longer)) == []


def test_the_starters_heal_leaves_other_weights_from_the_first_step_and_the_learning_rate_is_shown():
    fresh = [step("g13", "x13", lr=0.0005)] + [step(f"h{i}", f"x{i}", lr=0.0005 * i) for i in range(2, 9)]
    found = follow(fresh, LIVE)
    assert (found.joined, found.matched) == (12, 0)
    differences = HealCheck().compare(drill(fresh))
    text = said(differences)
    assert "0 of 8" in text and "step 1 after its restart applied the same averaged gradient" in text, text
    assert "learning rate of group 1's step 1" in text and "0.000769231 | 0.0005" in text, text


def test_a_heal_of_the_weights_and_the_optimizer_with_the_loops_own_counter_differs_from_the_second_step():
    half = [step("g13", "w13", lr=0.01 / 13), step("g14", "y14", lr=0.001)] + [step(f"k{i}", f"y{i}") for i in range(6)]
    text = said(HealCheck().compare(drill(half)))
    assert "1 of 8" in text and "step 2 after its restart" in text and "learning rate of group 1's step 2" in text


def test_a_group_that_never_averaged_or_started_over_is_named_so():
    alone = [step(f"z{i}", f"z{i}") for i in range(8)]
    assert follow(alone, LIVE).joined is None
    assert "group 0 never applied" in said(HealCheck().compare(drill(alone)))
    over = [step(f"g{i}", f"w{i}", lr=0.01 / i) for i in range(1, 9)]  # alone from the seed, on group 0's batches
    text = said(HealCheck().compare(drill(over)))
    assert "after step 10, where group 0 was" in text and "| 1 |" in text and "started over" in text, text


def test_a_phase_that_did_not_come_in_time_is_said_with_what_was_measured():
    check = HealCheck()
    text = said(check.compare(Drill(Path("."), LIVE[:5], LIVE[:1], [], 5, None, "together")))
    assert "optimizer steps of group 1 before the kill | at least 3 | 1" in text and "group 0" not in text, text
    text = said(check.compare(Drill(Path("."), LIVE[:5], LIVE[:3], [], 4, None, "alone")))
    assert "optimizer steps of group 0 after group 1 was killed | at least 5 | 1" in text
    assert "did not go on without it" in text
    text = said(check.compare(Drill(Path("."), LIVE, LIVE[:3], LIVE[12:14], 4, 10, "after")))
    assert "optimizer steps of group 1 after its restart | at least 8 | 2" in text


def test_15_2s_rule_counts_the_steps_after_the_last_commit_through_the_step_it_heals_in():
    """The shape of section 2's records (a real drill): group 1 last committed step A, healed at step H (the step
    it joined at), and the survivor's commits A+1 .. H+1 each had one participant: H + 1 - A batches lost."""
    spec = load_all()["15.2"]
    assert samples_not_trained_on(None) == (561 - 500) * 32 == 1952
    assert (560 - 500) * 32 in spec.wrong and 61 in spec.wrong and 1952 not in spec.wrong


def test_15_1_keeps_the_starters_warm_up_a_script_that_drops_it_or_changes_it_fails():
    check = load_all()["15.1"].verify
    schedule = [0.01 * min((s + 1) / 20, (20 / (s + 1)) ** 0.5) for s in range(40)]
    live = [step(f"g{i}", f"w{i}", lr=schedule[i]) for i in range(20)]
    healed = [step(f"g{i}", f"w{i}", lr=schedule[i]) for i in range(12, 20)]
    assert check.compare(drill(healed, survivor=live)) == []
    constant = [step(f"g{i}", f"w{i}", lr=0.01) for i in range(20)]  # 0.01 is the schedule's at step 19, every step
    text = said(check.compare(drill(constant[12:], survivor=constant)))
    assert "learning rates of group 0's optimizer steps" in text and "warm-up and decay" in text, text
    other = [step(f"g{i}", f"w{i}", lr=0.001 * (i + 1)) for i in range(20)]
    assert "learning rates of group 0's" in said(check.compare(drill(other[12:], survivor=other)))
