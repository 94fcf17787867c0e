"""A learner's script that borrows the answer is refused before launching (issue 44): an import of the workbook's
library (the exercises, their checks, their solutions) or a read of the shipped solutions, found in the script's
syntax tree; the shipped solutions and the notebooks' starters are the learner's kind of script and are not refused."""

from __future__ import annotations

import re

import nbformat
import pytest

import tutorial_lib as tl
from conftest import ROOT
from tutorial_lib.exercises.core import SOLUTIONS, load_all
from tutorial_lib.exercises.own_work import borrowed

SOLUTION_13_2 = SOLUTIONS / "13_2_train.py"
CHEATS = {
    "run_path of the shipped solution (13.2)": f"import runpy\nrunpy.run_path({str(SOLUTION_13_2)!r}, "
                                               "run_name='__main__')\n",
    "import tutorial_lib.exercises": "import json\nimport tutorial_lib.exercises\nprint('check', json.dumps({}))\n",
    "from the solutions": "from tutorial_lib.exercises.solutions import __name__ as solutions\n",
    "open a solution by a relative path": "exec(open('../../tutorial_lib/exercises/solutions/13_2_train.py').read())\n",
    "open by the solution's name": ("import glob\n"
                                    "exec(open(glob.glob('/**/13_2_train.py', recursive=True)[0]).read())\n"),
    "importlib": "import importlib\nm = importlib.import_module('tutorial_lib.exercises.nb13')\n",
    "__import__": "tl = __import__('tutorial_lib')\n",
    "a path in an f-string": "import os\nroot = os.getcwd()\nexec(open(f'{root}/exercises/solutions/x.py').read())\n",
    "import the package as tl": "import torch\nimport tutorial_lib as tl\n",
    "a Path of the package": "from pathlib import Path\np = Path('/somewhere/tutorial_lib') / 'exercises'\n",
}


def starters() -> dict[str, str]:
    found = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            match = re.match(r"%%writefile \{ex(\d+)\.script\}\n", cell.source)
            if match and "exercise-starter" in cell.metadata.get("tags", []):
                found[f"{path.name[:2]}.{match[1]}"] = cell.source[match.end():]
    return found


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_script_that_imports_the_library_or_reads_the_solutions_is_found(name):
    found = borrowed(CHEATS[name])
    assert found, name
    assert all(f.line >= 1 for f in found)


def test_what_is_found_says_the_line_and_what_it_names():
    found = borrowed(CHEATS["run_path of the shipped solution (13.2)"])
    assert [(f.line, f.reads_solution) for f in found] == [(2, True)]
    assert "line 2 names the shipped solutions" in str(found[0].message()) and "13_2_train.py" in found[0].what
    found = borrowed(CHEATS["import tutorial_lib.exercises"])
    assert [(f.line, f.what, f.reads_solution) for f in found] == [(2, "tutorial_lib.exercises", False)]


def test_the_shipped_solutions_and_the_notebooks_starters_are_not_refused():
    """Only a script exercise's or an open challenge's script is scanned (a value exercise's solution may use the
    library to work its answer out: it is never launched as the learner's)."""
    found = starters()
    scripts = {i: s for i, s in load_all().items() if s.kind in ("script", "challenge")}
    assert sorted(found) == sorted(scripts) and len(found) == 26 + 5  # 26 script exercises, 5 open challenges
    for exercise_id, text in found.items():
        assert borrowed(text) == [], exercise_id
        assert borrowed((SOLUTIONS / scripts[exercise_id].solution).read_text()) == [], exercise_id


def test_comments_docstrings_and_look_alike_names_are_not_held_against_a_script():
    text = ('"""My fix for exercise 13.2, written without tutorial_lib."""\nimport json  # see tutorial_lib/exercises\n'
            "my_tutorial_lib_notes = 'solutions.txt'\nprint('check', json.dumps({'step': 1}))\n")
    assert borrowed(text) == []
    assert borrowed("def broken(:\n  import tutorial_lib\n") == [], "a syntax error is the launch's to name"


@pytest.mark.parametrize("name", ["run_path of the shipped solution (13.2)", "import tutorial_lib.exercises",
                                  "from the solutions", "open a solution by a relative path"])
def test_a_refused_script_is_never_launched_says_why_and_is_not_counted(tmp_path, name):
    tl.set_language("en")
    ex = tl.exercise("13.2", tmp_path)
    ex.script.write_text(CHEATS[name])
    verdict = ex.check()
    assert not verdict.solved and not verdict.attempted and verdict.run_dirs == [], str(verdict)
    assert "was not launched" in str(verdict.problem) and "line" in str(verdict.problem)
    assert "your own code" in str(verdict.problem)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exercises"], "no run directory"
    assert tl.progress(tmp_path).loc["13.2", "checks"] == 0
