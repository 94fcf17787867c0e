"""The three newer kinds of exercise on real launches (issue 44): what a learner could do to pass without the work
fails. A number given after the check showed the measurement is refused and never counts; a find-the-bug answer read
from one failed run fails on another; an open challenge has more than one solution, and a number reached by skipping
training, by ranks that never sync, by compressing what the challenge asks to send as it is or by compiling nothing is
not one of them, nor a best.

The variants are pinned (``TUTORIAL_LIB_EXERCISE_VARIANT_SEED``): 07.4's seed 10 makes the first launch a hang on
rank 1 and the next one an exception on rank 0 (the job's data seeds 9362 and 7027), so the two runs differ in all
three parts. The challenges' corpus is ``tests/fixtures/exercise_kinds/`` (its README says what each file is)."""

from __future__ import annotations

import runpy

import pytest

import tutorial_lib as tl
from conftest import FIXTURES
from tutorial_lib.exercises import rounds, store
from tutorial_lib.exercises.bugs import found_in
from tutorial_lib.exercises.core import SOLUTIONS, load_all
from tutorial_lib.exercises.observing import VARIANT_SEED_ENV

pytestmark = pytest.mark.integration
CORPUS = FIXTURES / "exercise_kinds"
SPECS = load_all()


def solution(exercise_id: str):
    return runpy.run_path(str(SOLUTIONS / SPECS[exercise_id].solution))["answer"]


def round_options(ex) -> dict[str, str]:
    return rounds.options(rounds.from_dict(ex.spec.verify.current(ex.spec, ex.runs_root)["variant"]))


def test_a_prediction_after_the_reveal_is_refused_kept_and_never_counts(tmp_path, monkeypatch):
    monkeypatch.setenv(VARIANT_SEED_ENV, "4")
    ex = tl.exercise("04.4", tmp_path, timeout_s=120)
    first_round = ex.predict().text.split("This round: ")[1].split(". Predict")[0]
    right = solution("04.4")(round_options(ex))
    ex.predict(right + 1)
    missed = ex.check()
    assert not missed.solved and "your prediction is +1 from the measurement" in str(missed), str(missed)
    assert f"measured: {right} all-gathers on rank 1" in str(missed) and "root" in str(missed), "what explains it"
    late = ex.predict(right)  # the measurement was just shown
    assert "not recorded as a prediction" in late.text and first_round in late.text
    entry = store.entry_of(store.read_store(tmp_path), "04.4")
    assert entry["predictions"][-1]["after_reveal"] and not entry["predictions"][-1]["counts"]
    first_inputs = first_round.split(" on ")[0].split("04_4_units.py ")[1]
    assert entry["round"]["n"] == 2 and first_inputs not in entry["round"]["key"], "the next round, other inputs"
    again = ex.check()  # the refused number is no prediction for the next round either
    assert not again.solved and again.run_dirs == [] and "predict first" in str(again.problem)
    row = tl.progress(tmp_path).loc["04.4"]
    assert (row["prediction"], row["measured"], row["checks"], row["solved"]) == (right + 1, right, 1, False)
    ex.predict(solution("04.4")(round_options(ex)))  # the next round, predicted before its run: it counts
    assert ex.check().solved
    assert [m["agrees"] for m in store.entry_of(store.read_store(tmp_path), "04.4")["measurements"]] == [False, True]


def test_a_find_the_bug_answer_read_from_one_run_fails_on_another(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(VARIANT_SEED_ENV, "10")
    ex, read = tl.exercise("07.4", tmp_path, timeout_s=60), solution("07.4")
    capsys.readouterr()
    first_run = ex.check().run_dirs[0]
    first = read(capsys.readouterr().out)
    assert first == (1, 31, "collective timeout"), "a hang: the rank torchrun stopped, where its stack was"
    assert ex.check(rank=first[0], line=first[1], cause=first[2]).solved
    second_run = ex.check().run_dirs[0]  # another variant: the next launch
    second = read(capsys.readouterr().out)
    assert found_in(first_run, "job.py") != found_in(second_run, "job.py") and second[0] != first[0]
    copied = ex.check(rank=first[0], line=first[1], cause=first[2])
    assert not copied.solved and "rank 1: wrong" in str(copied) and "cause collective timeout: wrong" in str(copied)
    assert ex.check(rank=second[0], line=second[1], cause=second[2]).solved
    answers = store.entry_of(store.read_store(tmp_path), "07.4")["answers"]
    assert [a["round"] for a in answers] == [1, 2, 2] and [all(a["right"].values()) for a in answers] == [
        True, False, True]


@pytest.mark.parametrize("exercise_id", ["04.5", "08.4", "10.4", "13.4", "14.3"])
def test_a_challenge_has_more_than_one_solution_and_a_number_reached_without_the_work_is_neither_met_nor_best(
        exercise_id, tmp_path, monkeypatch):
    monkeypatch.setenv(VARIANT_SEED_ENV, "44")  # one variant: the baseline is launched once and kept
    ex = tl.exercise(exercise_id, tmp_path, timeout_s=180)
    outcomes = {}
    for path in sorted((CORPUS / exercise_id).glob("*.py")):
        ex.script.write_text(path.read_text())
        outcomes[path.stem] = ex.check()
    assert any(name.startswith("correct_") for name in outcomes) and any(n.startswith("cheat_") for n in outcomes)
    for name, verdict in outcomes.items():
        assert verdict.solved == name.startswith("correct_"), f"{exercise_id}/{name}:\n{verdict}"
        assert len(verdict.run_dirs) == 2, verdict.run_dirs
    ex.script.write_text((SOLUTIONS / ex.spec.solution).read_text())
    assert ex.check().solved, "the shipped solution: a second way to the target"
    measurements = store.entry_of(store.read_store(tmp_path), exercise_id)["measurements"]
    name = ex.spec.verify.target.measure.name
    counted = [m["values"][name] for m in measurements if m["counted"]]
    assert tl.progress(tmp_path).loc[exercise_id, "best"] == min(counted)
    best = tl.progress(tmp_path).loc[exercise_id, "best"]
    for m, stem in zip(measurements, sorted(outcomes)):  # a cheat is neither met nor a best; one that misses the
        if stem.startswith("cheat_"):  # target honestly (the lesson's mistake kept) is a measurement like any
            assert not m["met"] and (not m["counted"] or m["values"][name] > best), (stem, m)
    if exercise_id in ("08.4", "10.4"):  # ranks that never synced sent nothing (left nothing after backward): the
        # smallest number, and not a best
        assert min(m["values"][name] for m in measurements) == 0 < best
