"""Every exercise, both ways (issue 36): the notebook's starter fails its own check (the control) and the solution in
``tutorial_lib/exercises/solutions/`` passes it; a value exercise's known wrong answers fail with their note. The
script exercises launch on 2 real CPU ranks."""

from __future__ import annotations

import ast
import re
import runpy

import nbformat
import pytest

import tutorial_lib as tl
from conftest import ROOT
from tutorial_lib.exercises.core import SOLUTIONS, load_all

pytestmark = pytest.mark.integration
SPECS = load_all()
WRITEFILE = re.compile(r"%%writefile \{ex(\d+)\.script\}\n")


def starters() -> dict[str, tuple[str, object]]:
    """``{exercise id: ("script", text) or ("value", answer)}`` from every notebook's cells tagged exercise-starter."""
    found = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if "exercise-starter" not in cell.metadata.get("tags", []):
                continue
            match = WRITEFILE.match(cell.source)
            if match:
                found[f"{path.name[:2]}.{match[1]}"] = ("script", cell.source[match.end():])
                continue
            call = ast.parse(cell.source).body[0].value
            number = re.fullmatch(r"ex(\d+)", call.func.value.id)[1]
            answer = next((k.value for k in call.keywords if k.arg == "answer"), call.args[0] if call.args else None)
            found[f"{path.name[:2]}.{number}"] = ("value", ast.literal_eval(answer))
    return found


STARTERS = starters()


def test_every_exercise_has_its_starter_in_its_notebook_and_every_starter_its_exercise():
    assert sorted(STARTERS) == sorted(SPECS)
    for exercise_id, (kind, _starter) in STARTERS.items():
        assert kind == SPECS[exercise_id].kind, exercise_id


@pytest.mark.parametrize("exercise_id", sorted(SPECS))
def test_the_starter_fails_its_check_and_the_solution_passes(exercise_id, tmp_path):
    ex = tl.exercise(exercise_id, tmp_path / "runs", timeout_s=120)
    kind, starter = STARTERS[exercise_id]
    if kind == "script":
        ex.script.write_text(starter)
        first = ex.check()
        ex.script.write_text((SOLUTIONS / ex.spec.solution).read_text())
        second = ex.check()
    else:
        first = ex.check(starter)
        for wrong in ex.spec.wrong:
            verdict = ex.check(wrong)
            assert not verdict.solved and verdict.differences[0].note is not None, (wrong, str(verdict))
        second = ex.check(runpy.run_path(str(SOLUTIONS / ex.spec.solution))["answer"])
    assert not first.solved, f"the starter of {exercise_id} passes its check:\n{first}"
    assert first.differences or first.failure is not None or first.problem is not None, str(first)
    assert second.solved, f"the solution of {exercise_id} fails its check:\n{second}"
    table = tl.progress(tmp_path / "runs")
    checked = 2 if kind == "script" else 1 + len(ex.spec.wrong)  # a value starter (None) is nothing to check yet
    assert table.loc[exercise_id, "solved"] and table.loc[exercise_id, "checks"] == checked
