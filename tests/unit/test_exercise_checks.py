"""The exercises' machinery without launches (issue 36): answers checked exactly and never revealed by a check, hints
opened one at a time, progress kept beside the runs, bad input named, the verdict in the learner's language."""

from __future__ import annotations

import json
import re

import pytest

import tutorial_lib as tl
from tutorial_lib.exercises.core import SOLUTIONS, Context, load_all
from tutorial_lib.exercises.store import progress_path


@pytest.fixture(autouse=True)
def english():
    tl.set_language("en")
    yield
    tl.set_language("en")


def test_the_workbook_has_at_least_35_exercises_13_of_them_launched_on_ranks_and_every_one_a_solution():
    specs = load_all()
    assert len(specs) >= 35, len(specs)
    assert sum(s.kind == "script" for s in specs.values()) >= 13
    notebooks = {s.notebook for s in specs.values()}
    assert notebooks == {f"{n:02d}" for n in range(1, 16)}, notebooks
    for notebook in notebooks:
        mine = [s for s in specs.values() if s.notebook == notebook]
        # 2 to 5: 04 has a fifth, the open challenge issue 44 asked of every notebook (04.5); one launched on ranks
        assert 2 <= len(mine) <= 5 and any(s.kind != "value" for s in mine), notebook
        assert [s.number for s in mine] == list(range(1, len(mine) + 1)), notebook
    assert all((SOLUTIONS / s.solution).is_file() and len(s.hints) == 2 for s in specs.values())


def test_a_value_answer_is_checked_exactly_and_a_wrong_one_is_not_answered_for_the_learner(tmp_path):
    ex = tl.exercise("01.2", tmp_path)
    none = ex.check()
    assert not none.solved and none.problem is not None and none.differences == []
    wrong = ex.check(675_904)
    assert not wrong.solved and "step counter" in str(wrong.differences[0].note)
    off_by_one = ex.check(675_929)
    assert not off_by_one.solved and off_by_one.differences[0].note is None
    expected = ex.spec.expected(None)
    for verdict in (none, wrong, off_by_one):
        assert str(expected) not in str(verdict) and f"{expected:,}" not in str(verdict)
    assert ex.check(expected).solved and ex.check(float(expected)).solved
    table = tl.progress(tmp_path, notebook="01")
    assert list(table.index) == ["01.1", "01.2", "01.3", "01.4"]
    assert table.loc["01.2", "checks"] == 4, "no answer (None) is not a check"
    assert table.loc["01.2", "solved"] and table.loc["01.2", "first_solved"]
    assert not table.loc["01.1", "solved"] and table.loc["01.1", "checks"] == 0


def test_hints_open_one_level_at_a_time_then_point_to_the_solution_which_warns_before_it_shows_anything(tmp_path):
    ex = tl.exercise("01.1", tmp_path)
    first, second, third, again = ex.hint(), ex.hint(), ex.hint(), ex.hint()
    assert first.text == ex.spec.hints[0] and second.text == ex.spec.hints[1]
    assert "Hint 1 of 3" in first.heading and "Hint 3 of 3" in third.heading and "ex1.hint(1)" in first.footer
    assert "ex1.solution()" in third.text and again == third, "once every level is open, hint() repeats the last"
    solution_text = (SOLUTIONS / ex.spec.solution).read_text()
    assert all(solution_text not in str(h) for h in (first, second, third))
    warning = ex.solution()
    assert solution_text not in str(warning) and "01_1_train.py" in warning.text and "progress" in warning.text
    assert not tl.progress(tmp_path).loc["01.1", "solution_opened"], "the warning opens nothing"
    assert ex.solution().text == solution_text and ex.solution().text == solution_text
    row = tl.progress(tmp_path).loc["01.1"]
    assert row["hints_opened"] == 3 and row["solution_opened"]
    assert "solution_asked" not in tl.progress(tmp_path).columns


def test_an_earlier_hint_is_read_again_by_its_level_also_after_a_kernel_restart(tmp_path):
    import subprocess
    import sys

    ex = tl.exercise("02.3", tmp_path)
    assert ex.hint().text == ex.spec.hints[0] and ex.hint().text == ex.spec.hints[1]
    # a new kernel: nothing of this process's state, only RUNS_DIR/exercises/progress.json
    code = ("import sys, tutorial_lib as tl\nex = tl.exercise('02.3', sys.argv[1])\n"
            "print(ex.hint(1).text == ex.spec.hints[0], ex.hint(2).text == ex.spec.hints[1], "
            "'Hint 3 of 3' in ex.hint().heading)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["True", "True", "True"], out.stderr
    assert ex.hint(1).text == ex.spec.hints[0], "re-reading the first opens nothing new"
    assert tl.progress(tmp_path).loc["02.3", "hints_opened"] == 3
    fresh = tl.exercise("02.1", tmp_path)
    assert fresh.hint(2).text == fresh.spec.hints[1] and tl.progress(tmp_path).loc["02.1", "hints_opened"] == 2
    for level in (0, 4, "1", True, 1.0):
        with pytest.raises(tl.ConfigError, match=r"ex1\.hint\(.*\): a hint's level, 1 to 3"):
            fresh.hint(level)


def test_the_solutions_warning_is_given_once_also_across_a_kernel_restart(tmp_path):
    ex = tl.exercise("01.2", tmp_path)
    first = ex.solution()
    assert "answer =" not in str(first) and "01_2.py" in first.text and "ex2.hint()" in first.footer
    again = tl.exercise("01.2", tmp_path).solution()  # another handle, as after a restart: the record decides
    assert "answer =" in again.text and again.code
    record = json.loads(progress_path(tmp_path).read_text())["01.2"]
    assert record["solution_asked"] and record["solution_opened"] and record["checks"] == 0


def test_a_script_exercise_before_its_cell_ran_says_what_to_do_and_launches_nothing(tmp_path):
    verdict = tl.exercise("01.1", tmp_path).check()
    assert not verdict.solved and verdict.run_dirs == [] and "%%writefile" in str(verdict.problem)
    assert [p.name for p in tmp_path.iterdir()] == ["exercises"]


def test_bad_ids_and_limits_are_named_before_anything_runs(tmp_path):
    with pytest.raises(tl.ConfigError, match=r"no exercise '1\.1'.*01\.1, 01\.2"):
        tl.exercise("1.1", tmp_path)
    with pytest.raises(tl.ConfigError, match="notebook '99' has no exercises; these do: 01"):
        tl.exercises("99", tmp_path)
    with pytest.raises(tl.ConfigError, match="timeout_s=0"):
        tl.exercise("01.1", tmp_path, timeout_s=0)
    assert [e.id for e in tl.exercises("01_ddp", tmp_path)] == ["01.1", "01.2", "01.3", "01.4"]


def test_a_damaged_progress_file_is_named_and_kept_and_a_write_leaves_no_temporary_file(tmp_path):
    tl.exercise("01.2", tmp_path).check(1)
    path = progress_path(tmp_path)
    assert json.loads(path.read_text())["01.2"]["checks"] == 1
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    path.write_text("{not json")
    with pytest.raises(tl.ConfigError, match="progress.json is not a readable progress file"):
        tl.progress(tmp_path)
    assert path.read_text() == "{not json"


def test_the_check_reads_each_ranks_check_lines_and_skips_what_only_looks_like_one(tmp_path):
    (tmp_path / "output.log").write_text(
        '[default0]:check {"step": 1}\n[default1]:check {"step": 1}\n[default0]:step 2 loss 0.5\n'
        '[default0]:check {"step": 2}\n[default1]:check {broken\nI1202 torchrun line\n')
    assert Context.records(tmp_path) == {0: [{"step": 1}, {"step": 2}], 1: [{"step": 1}]}


def test_the_verdict_and_the_hints_speak_chinese_in_the_chinese_edition(tmp_path):
    tl.set_language("zh")
    verdict = tl.exercise("01.2", tmp_path).check(675_904)
    assert "练习 01.2" in str(verdict) and "尚未完成" in str(verdict) and "计数器" in str(verdict)
    assert "提示" in str(tl.exercise("01.2", tmp_path).hint())


def test_the_exercises_page_lists_every_exercise_by_id_kind_and_title():
    from conftest import ROOT

    page = (ROOT / "docs" / "exercises.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if re.match(r"\| \d\d\.\d \|", line)}
    specs = load_all()
    assert sorted(rows) == sorted(specs)
    for exercise_id, spec in specs.items():
        assert f"| {spec.kind} | {spec.title} |" in rows[exercise_id], exercise_id


def test_a_numpy_value_or_a_one_row_series_is_taken_as_the_number_it_holds(tmp_path):
    import numpy as np
    import pandas as pd

    ex = tl.exercise("01.2", tmp_path)
    expected = ex.spec.expected(None)
    assert ex.check(np.int64(expected)).solved and ex.check(np.array([expected])).solved
    assert ex.check(pd.Series([expected])).solved and not ex.check(np.array([expected, 1])).solved


def test_a_damaged_record_never_costs_the_verdict_and_malformed_entries_start_afresh(tmp_path):
    path = progress_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{oops")
    ex = tl.exercise("01.2", tmp_path)
    verdict = ex.check(ex.spec.expected(None))
    assert verdict.solved and "not recorded" in str(verdict) and "progress.json" in str(verdict)
    path.write_text(json.dumps({"01.2": {"checks": "many", "solved": 5}, "01.1": 7}))
    assert ex.check(1).differences and tl.progress(tmp_path).loc["01.2", "checks"] == 1
    assert tl.progress(tmp_path).loc["01.1", "checks"] == 0


def test_an_unwritable_runs_folder_and_a_notebook_without_exercises_are_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(tl.ConfigError, match="pass a writable RUNS_DIR"):
        tl.exercise("01.1", blocker / "runs").script
    verdict = tl.exercise("01.2", blocker / "runs").check(3)
    assert not verdict.solved and "not recorded" in str(verdict)
    with pytest.raises(tl.ConfigError, match="notebook '99' has no exercises"):
        tl.progress(tmp_path, notebook="99")


def test_two_kernels_recording_at_once_lose_no_update(tmp_path):
    """Three processes record attempts into one progress file at once (the store's lock); none is lost. Each records
    through ``store.record_attempt``, what every counted check calls (the check itself is tested above), and all
    start recording together: each waits, once it has imported the package, until all three are ready."""
    import subprocess
    import sys
    import time

    code = ("import pathlib, sys, time\n"
            "from tutorial_lib.exercises import store\n"
            "root = pathlib.Path(sys.argv[1])\n"
            "(root / f'ready{sys.argv[2]}').touch()\n"
            "while not (root / 'go').exists(): time.sleep(0.005)\n"
            "for _ in range(100): store.record_attempt(root, '01.2', False)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(n)]) for n in range(3)]
    try:
        deadline = time.monotonic() + 300
        while not all((tmp_path / f"ready{n}").exists() for n in range(3)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [p.poll() for p in procs]
            time.sleep(0.05)
        (tmp_path / "go").touch()
        assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert tl.progress(tmp_path).loc["01.2", "checks"] == 300


def test_records_the_check_cannot_compare_are_named_not_raised(tmp_path, monkeypatch):
    from tutorial_lib.exercises import core

    spec = core.REGISTRY["01.1"]
    monkeypatch.setitem(core.REGISTRY, "01.1", core.dataclasses.replace(
        spec, verify=lambda ctx: [core.Difference(core.Message("x"), 1, {"grad": None}["grad"][0])]))
    ex = tl.exercise("01.1", tmp_path)
    ex.script.write_text("print('check', 5)\n")
    verdict = ex.check()
    assert not verdict.solved and "TypeError" in str(verdict.problem) and "observer" in str(verdict.problem)


def test_a_script_with_a_syntax_error_is_not_solved_and_says_where_without_launching(tmp_path):
    ex = tl.exercise("01.1", tmp_path)
    ex.script.write_text("import json\nprint('check', json.dumps({})\n")
    verdict = ex.check()
    assert not verdict.solved and verdict.run_dirs == [] and "SyntaxError" in str(verdict.problem)
    assert "train.py:2" in str(verdict.problem), str(verdict.problem)


def test_a_check_line_with_a_step_and_a_loss_is_a_point_of_the_live_views_progress():
    """Issue 44: while a check runs, each rank's progress is the launcher's live view; its points are read from the
    check lines the ranks print (a step, then a loss), as a script of your own's printed lines are."""
    from tutorial_lib.exercises.core import CHECK_PROGRESS_PATTERN
    from tutorial_lib.runs.printed_metrics import compile_loss_pattern

    pattern = compile_loss_pattern(CHECK_PROGRESS_PATTERN)
    found = pattern.search('check {"step": 3, "loss": 0.5123, "find_unused": false}')
    assert found and (found["step"], float(found["loss"])) == ("3", 0.5123)
    assert pattern.search('check {"step": 2, "loss": 1.5e-05}')["loss"] == "1.5e-05"
    for other in ('check {"epoch": 1, "indices": [1, 2]}', 'check {"step": 1, "scale": 1.0}',
                  'step 3 loss 0.5', 'check {"eval_loss": 5.7, "tokens_scored": 152}'):
        assert pattern.search(other) is None, other
