"""The three newer kinds of exercise without launches (issue 44): predict then run, find the bug, open challenges.

What is decided here is decided on values: the rounds a prediction or an answer belongs to (kept in progress.json),
the quantities a prediction or a challenge reads from observed records (``ObservedRun`` values built here, as the
reader builds them), the truth a found bug is checked against (the doctor's fixture run directories of torch 2.8 and
2.13), and what a learner is told when nothing can be checked. The launches are in tests/integration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tutorial_lib as tl
from conftest import FIXTURES, ROOT
from tutorial_lib.diagnosis.causes import CauseId
from tutorial_lib.exercises import rounds, store
from tutorial_lib.exercises.bugs import Found, FindTheBug, fold, found_in, shown_lines
from tutorial_lib.exercises.challenges import (Bound, CommBytesPerStep, CompiledGraphs, FinalLoss, GraphBreaks,
                                               SameOnEveryRank)
from tutorial_lib.exercises.core import load_all
from tutorial_lib.exercises.nb04 import TrainingStateBytes
from tutorial_lib.exercises.observing import Variant, Variants
from tutorial_lib.exercises.predicting import Prediction, Quantity
from tutorial_lib.i18n import Message
from tutorial_lib.runs.observed import (Backward, Collective, ObservedRank, ObservedRun, OptimizerStep, ParamRecord,
                                        TensorRecord)

RUN_DIRS = FIXTURES / "run_dirs"


@pytest.fixture(autouse=True)
def english():
    tl.set_language("en")
    yield
    tl.set_language("en")


def collective(kind: str, step: int, input_bytes: int, seq: int = 1) -> Collective:
    return Collective(seq=seq, op=kind, kind=kind, torch_op=f"c10d::{kind}", group="0", group_size=2, group_seq=seq,
                      input_bytes=input_bytes, output_bytes=input_bytes, dtype="float32", shapes=(), reduce_op=None,
                      step=step, backward=None)


def param(name: str, sha1: str) -> ParamRecord:
    return ParamRecord(0, name, 0, None, TensorRecord((4,), "float32", 4, 16, sha1))


def rank(r: int, *, collectives=(), steps=2, losses=(1.0, 0.5), compiled=None, sha1="a") -> ObservedRank:
    """One rank's record as read_observed builds it: ``steps`` optimizer steps, one backward each (``losses``)."""
    observed = ObservedRank(r, 2, 0, collectives=list(collectives), compiled=compiled)
    observed.steps = [OptimizerStep(s, "SGD", 1, (0.1,), 32, (param("w", sha1),)) for s in range(1, steps + 1)]
    observed.backwards = [Backward(s, s, loss, 1, (), "float32") for s, loss in zip(range(1, steps + 1), losses)]
    return observed


def run_of(*ranks: ObservedRank) -> ObservedRun:
    return ObservedRun(ROOT, {r.rank: r for r in ranks})


def test_every_exercise_of_the_new_kinds_is_declared_with_its_kind_and_launches():
    specs = load_all()
    kinds = {i: (s.kind, s.launches) for i, s in specs.items() if s.kind in ("predict", "find-bug", "challenge")}
    assert kinds == {"04.4": ("predict", 1), "04.5": ("challenge", 2), "07.4": ("find-bug", 1),
                     "08.4": ("challenge", 2), "10.4": ("challenge", 2), "13.4": ("challenge", 2),
                     "14.1": ("predict", 1), "14.2": ("find-bug", 1), "14.3": ("challenge", 2)}
    assert [s.kind for i, s in specs.items() if s.notebook == "14"] == ["predict", "find-bug", "challenge"]


def test_a_prediction_needs_listed_variants_and_a_tolerance_only_for_bytes():
    with pytest.raises(ValueError, match="listable"):
        Prediction("04_4_units.py", Quantity(), Variants(seed=True), explain=lambda o, m: Message("x"))
    with pytest.raises(ValueError, match="tolerance"):
        Prediction("04_4_units.py", Quantity("count"), Variants({"--blocks": (2,)}, seed=False),
                   explain=lambda o, m: Message("x"), tolerance=0.1)
    with pytest.raises(ValueError, match="no program"):
        Prediction("nothing.py", Quantity(), Variants({"--blocks": (2,)}, seed=False), explain=lambda o, m: None)
    with pytest.raises(ValueError, match="what="):
        Quantity("peak")


def test_a_count_is_predicted_exactly_and_bytes_within_the_stated_relative_tolerance():
    counts = load_all()["04.4"].verify
    assert counts.agrees(9, 9) and not counts.agrees(8, 9) and not counts.agrees(9.5, 9)
    in_bytes = Prediction("04_4_units.py", Quantity("output_bytes", "all_gather", rank=1),
                          Variants({"--blocks": (2,)}, seed=False), explain=lambda o, m: Message("x"), tolerance=0.05)
    assert in_bytes.agrees(1_000_000, 1_049_000) and not in_bytes.agrees(1_000_000, 1_060_000)


def test_a_quantity_is_read_from_the_observed_records_of_its_rank_and_step():
    both = run_of(rank(0, collectives=[collective("all_gather", 1, 64)]),
                  rank(1, collectives=[collective("all_gather", 1, 64), collective("all_gather", 2, 64, 2),
                                       collective("all_gather", 2, 32, 3), collective("all_reduce", 2, 8, 4)]))
    assert Quantity("count", "all_gather", rank=1, step=-1).measure(both) == 2
    assert Quantity("count", "all_gather", rank=1, step=1).measure(both) == 1
    assert Quantity("input_bytes", "all_gather", rank=1, step=2).measure(both) == 96
    assert Quantity("state_bytes", rank=0).measure(both) == 32
    with pytest.raises(tl.errors.MetricsError, match="took 2 optimizer steps"):
        Quantity("count", rank=0, step=3).measure(both)
    assert str(Quantity("count", "all_gather", rank=1, name="all-gathers").describe()) == (
        "all-gathers on rank 1 in the last optimizer step")


def test_the_variants_of_a_round_are_listed_and_a_fresh_one_avoids_those_seen_and_the_last():
    variants = Variants({"--blocks": (2, 3), "--reshard-after-forward": ("true", "false")}, seed=False)
    listed = rounds.every_variant(variants)
    assert [rounds.key(v) for v in listed] == [
        "--blocks 2 --reshard-after-forward true @2", "--blocks 2 --reshard-after-forward false @2",
        "--blocks 3 --reshard-after-forward true @2", "--blocks 3 --reshard-after-forward false @2"]
    seen = {rounds.key(v) for v in listed[:3]}
    assert rounds.pick_fresh(variants, seen) == (listed[3], True)
    variant, fresh = rounds.pick_fresh(variants, seen | {rounds.key(listed[3])}, last=rounds.key(listed[3]))
    assert not fresh and rounds.key(variant) != rounds.key(listed[3]), "all seen: another than the last, not fresh"
    assert rounds.every_variant(Variants(seed=True)) is None
    assert rounds.from_dict(json.loads(json.dumps(rounds.as_dict(listed[1])))) == listed[1]
    assert rounds.options(listed[1]) == {"--blocks": "2", "--reshard-after-forward": "false"}


def test_a_prediction_is_recorded_for_the_round_shown_and_a_check_before_it_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TUTORIAL_LIB_EXERCISE_VARIANT_SEED", "3")
    ex = tl.exercise("04.4", tmp_path)
    early = ex.predict(7)  # the round was never shown: not a prediction for it
    assert "not recorded" in early.text and "04_4_units.py --blocks" in early.text
    shown = ex.predict()
    assert "no prediction yet" in shown.text and shown.text.split("This round: ")[1].split(".")[0] in early.text
    assert "not recorded" in ex.predict("nine").footer and "not a form this check reads" in ex.predict("nine").text
    before = ex.check()
    assert not before.solved and before.run_dirs == [] and not before.attempted
    assert "predict first" in str(before.problem) and "Nothing was run" in str(before.problem)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exercises"], "no run directory: nothing was launched"
    assert "recorded for" in ex.predict("12").text and "recorded for" in ex.predict(9).text
    entry = store.entry_of(store.read_store(tmp_path), "04.4")
    assert [(p["value"], p["counts"]) for p in entry["predictions"]] == [(12, True), (9, True)]
    assert entry["round"]["n"] == 1 and not entry["round"]["revealed"]
    row = tl.progress(tmp_path).loc["04.4"]
    assert row["prediction"] == 9 and row["measured"] is None and row["checks"] == 0 and row["kind"] == "predict"
    with pytest.raises(tl.ConfigError, match="01.1 is a script exercise"):
        tl.exercise("01.1", tmp_path).predict(3)
    assert "predict(...)" in str(ex.check(12).problem), "an answer in check() says where a prediction goes"


def test_a_round_on_inputs_whose_measurement_was_seen_takes_predictions_that_never_count(tmp_path):
    """Once every variant's measurement has been shown, a round opens on one of them (rounds.open_round: fresh False);
    a prediction for it is kept, and said not to count."""
    ex = tl.exercise("04.4", tmp_path)
    ex.predict()

    def everything_seen(entry):
        entry["revealed"] = [rounds.key(v) for v in rounds.every_variant(ex.spec.verify.variants)]
        entry["round"] = None
        rounds.open_round(entry, ex.spec.verify.variants)
    assert store.update(tmp_path, "04.4", everything_seen)["round"]["fresh"] is False
    note = ex.predict(9)
    assert "will not count" in note.text and "shown to you in an earlier round" in note.text
    entry = store.entry_of(store.read_store(tmp_path), "04.4")
    assert entry["predictions"][-1]["counts"] is False and entry["prediction"] is None


def test_the_progress_table_keeps_its_columns_and_adds_prediction_measured_and_best(tmp_path):
    table = tl.progress(tmp_path)
    assert list(table.columns) == ["title", "kind", "checks", "solved", "first_solved", "hints_opened",
                                   "solution_opened", "prediction", "measured", "best"]
    assert table.loc["01.1", "best"] is None and table.loc["10.4", "kind"] == "challenge"
    assert set(table["kind"]) == {"script", "value", "predict", "find-bug", "challenge"}


def test_a_record_with_lists_starts_each_entry_with_its_own_and_a_number_that_is_not_one_starts_afresh(tmp_path):
    path = store.progress_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"04.4": {"predictions": "many", "prediction": True, "best": 3.5}}))
    first = store.update(tmp_path, "04.4", lambda e: e["predictions"].append({"value": 1}))
    second = store.entry_of(store.read_store(tmp_path), "14.1")
    assert first["predictions"] == [{"value": 1}] and second["predictions"] == []
    assert store.DEFAULTS["predictions"] == [], "the defaults are never an entry's own list"
    assert first["prediction"] is None and first["best"] == 3.5


def test_a_cause_is_read_in_any_case_and_spacing_and_a_bad_answer_is_named_before_anything_runs(tmp_path):
    assert fold("Collective Timeout") == fold("collective_timeout") == fold(CauseId.COLLECTIVE_TIMEOUT) == fold(
        " COLLECTIVE-timeout ")
    ex = tl.exercise("07.4", tmp_path)
    for kwargs, said in [({"rank": 1, "line": 3}, "cause missing"),
                         ({"rank": "one", "line": 3, "cause": "python exception"}, "rank='one': a whole number"),
                         ({"rank": 1, "line": 3, "cause": "cosmic rays"}, "pick one of: collective timeout, python "
                                                                          "exception"),
                         ({"rank": 1, "line": 3, "cause": "python exception"}, "ex4.check() launches the job")]:
        verdict = ex.check(**kwargs)
        assert not verdict.solved and not verdict.attempted and said in str(verdict.problem), (kwargs, verdict)
    assert tl.progress(tmp_path).loc["07.4", "checks"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exercises"], "no run directory: nothing was launched"
    with pytest.raises(ValueError, match="at least two causes"):
        FindTheBug("07_4_job.py", (CauseId.COLLECTIVE_TIMEOUT,), Variants())


def restored(version: str, tmp_path) -> Path:
    """The captured runs of ``version`` copied with their error files' modification times as written (``mtimes.json``,
    as tests/unit/test_doctor_versions.py restores them): a fresh clone's files all have the checkout's time, and the
    rank that failed first is the one whose error file is oldest."""
    import os
    import shutil

    base = Path(shutil.copytree(RUN_DIRS / f"torch-{version}", tmp_path / version))
    for run_dir in (p for p in base.iterdir() if (p / "mtimes.json").is_file()):
        for relative, offset_ns in json.loads((run_dir / "mtimes.json").read_text()).items():
            os.utime(run_dir / relative, ns=(1_700_000_000 * 10**9 + offset_ns,) * 2)
    return base


def first_error(run_dir: Path) -> int:
    """The local rank whose error file ``mtimes.json`` records as written first."""
    times = json.loads((run_dir / "mtimes.json").read_text())
    return int(Path(min((k for k in times if k.endswith("error.json")), key=times.get)).parent.name)


@pytest.mark.parametrize("version", ["2.8", "2.13"])
def test_the_truth_of_a_failed_run_is_the_doctors_rank_and_cause_and_the_innermost_line_of_the_script(version,
                                                                                                       tmp_path):
    """The doctor's captured runs: the rank that raised, the last frame of the script in its traceback (dynamo's
    'from user code' frame included), the cause; a run whose stacks name no place of a stopped rank says nothing."""
    base = restored(version, tmp_path)
    assert found_in(base / "07-crashing-rank", "ddp_train.py") == Found(1, 201, CauseId.PYTHON_EXCEPTION)
    # Every rank fails alike in 14's runs: the truth is the rank whose error file was written first (its recorded time)
    assert found_in(base / "14-compile-fullgraph-break", "compile_train.py") == Found(
        first_error(base / "14-compile-fullgraph-break"), 96, CauseId.COMPILE_GRAPH_BREAK)
    assert found_in(base / "14-compile-recompile-limit", "compile_train.py") == Found(
        first_error(base / "14-compile-recompile-limit"), 189, CauseId.COMPILE_RECOMPILE_LIMIT)
    assert found_in(base / "07-hang-collective-timeout", "ddp_train.py") is None  # captured before run.json's where
    # A fatal signal (gloo's abort): the innermost frame of the script in faulthandler's report, read from the doctor's
    # Frame values (Diagnosis.stack; a regex over their text found none before issue 48).
    assert found_in(base / "07-skipped-collective", "ddp_train.py") == Found(0, 295, CauseId.COLLECTIVE_MISMATCH)
    log = (base / "07-crashing-rank" / "output.log").read_text()
    assert 'ddp_train.py", line 201, in inject_failure' in log, "line 201 is the frame that raised, the innermost"


def test_the_lines_a_learner_reads_keep_the_scripts_frames_and_the_error_and_fold_the_rest():
    shown = shown_lines(RUN_DIRS / "torch-2.13" / "14-compile-fullgraph-break", 40, "compile_train.py")
    rank0 = "\n".join(shown[0])
    assert 'compile_train.py", line 96' in rank0 and "Unsupported" in rank0
    assert "tutorial_lib/child" not in rank0 and "frames of torch or Python here" in rank0
    assert all(len(lines) <= 40 for lines in shown.values())


def test_a_bound_holds_against_a_number_or_the_baselines_measurement_and_says_which():
    half, near = Bound(CommBytesPerStep(), ratio=0.5), Bound(FinalLoss(), within=0.02)
    assert half.holds(50, 100) and not half.holds(50.5, 100) and not half.holds(None, 100)
    assert near.holds(1.019, 1.0) and not near.holds(1.021, 1.0) and near.holds(0.981, 1.0)
    assert Bound(GraphBreaks(), at_most=0).holds(0, None) and not Bound(CompiledGraphs(), at_least=1).holds(0, 5)
    assert str(half.rule(25_348)) == "at most 0.5 x the baseline's (12,674 bytes)"
    assert str(near.rule(0.0592)) == "within 2% of the baseline's 0.0592"
    with pytest.raises(ValueError, match="one of"):
        Bound(FinalLoss(), at_most=1, within=0.1)


def test_a_challenges_measures_read_bytes_from_step_2_the_last_losses_and_what_dynamo_counted():
    sent = [collective("all_gather", 1, 8), collective("all_reduce", 1, 100, 2), collective("all_reduce", 2, 50, 3),
            collective("all_reduce", 3, 50, 4), collective("broadcast", 2, 999, 5)]
    run = run_of(rank(0, collectives=sent, steps=3, losses=(3.0, 2.0, 1.0), compiled={"graphs": 4, "graph_breaks": 1}),
                 rank(1, collectives=sent[:3], steps=3, losses=(3.0, 2.0, 3.0), compiled={"graphs": 6,
                                                                                         "graph_breaks": 0}))
    assert CommBytesPerStep().of(run) == 50, "step 1's setup is left out, and a broadcast is not training's traffic"
    assert FinalLoss(last=2).of(run) == pytest.approx(((2 + 1) / 2 + (2 + 3) / 2) / 2)
    assert CompiledGraphs().of(run) == 6 and GraphBreaks().of(run) == 1
    untouched = run_of(rank(0, steps=0, losses=()), rank(1, steps=0, losses=()))
    assert CommBytesPerStep().of(untouched) is None and FinalLoss().of(untouched) is None


def test_the_training_state_a_rank_holds_is_its_last_steps_parameters_gradients_and_optimizer_state():
    def held(r: int, grad_bytes: int | None, state_bytes: int) -> ObservedRank:
        observed = rank(r)
        grad = None if grad_bytes is None else TensorRecord((4,), "float32", 4, grad_bytes, "g")
        first = OptimizerStep(1, "AdamW", 1, (0.1,), 999, (param("w", "a"),))  # an earlier step: not counted
        last = OptimizerStep(2, "AdamW", 1, (0.1,), state_bytes,
                             (ParamRecord(0, "w", 0, grad, TensorRecord((4,), "float32", 4, 16, "a")),
                              ParamRecord(1, "b", 0, None, TensorRecord((2,), "float32", 2, 8, "b"))))
        observed.steps = [first, last]
        return observed
    run = run_of(held(0, 16, 40), held(1, None, 20))
    assert TrainingStateBytes().of(run) == 16 + 16 + 8 + 40, "rank 0's: two parameters, one gradient, the state"
    assert TrainingStateBytes().of(run_of(rank(0, steps=0), rank(1, steps=0))) is None
    assert TrainingStateBytes.bytes and Bound(TrainingStateBytes(), ratio=0.6).holds(142_912, 284_736)
    assert not Bound(TrainingStateBytes(), ratio=0.6).holds(284_736 * 3 // 4, 284_736), "the optimizer state alone"


def test_ranks_that_end_with_different_parameters_are_named():
    same = run_of(rank(0, sha1="x"), rank(1, sha1="x"))
    other = run_of(rank(0, sha1="x"), rank(1, sha1="y"))
    variant = Variant(0, (), 2)
    assert SameOnEveryRank().check(same, None, variant) == []
    [difference] = SameOnEveryRank().check(other, None, variant)
    assert difference.rank == 1 and "different models" in str(difference.note)


def test_a_predict_verdict_and_a_found_bugs_parts_speak_chinese_in_the_chinese_edition(tmp_path):
    tl.set_language("zh")
    ex = tl.exercise("04.4", tmp_path)
    assert "这一轮" in ex.predict().text and "预测" in str(ex.check())
    assert "三项都要给出" in str(tl.exercise("07.4", tmp_path).check(rank=1, line=2))


def test_the_exercises_page_counts_each_kind():
    specs = load_all()
    page = (ROOT / "docs" / "exercises.md").read_text()
    counts = {kind: sum(s.kind == kind for s in specs.values()) for kind in
              ("script", "value", "predict", "find-bug", "challenge")}
    said = (f"{len(specs)} in all: {counts['script']} script exercises, {counts['value']} value exercises, "
            f"{counts['predict']} predict then run, {counts['find-bug']} find the bug and {counts['challenge']} open "
            "challenges")
    assert said in " ".join(page.split()), said
