"""One language per line (issue 45), proven by pseudo-localisation.

A catalogue made here at run time (from the Chinese one's messages: every message the library can word) wraps each
msgid in ``⟦ ⟧``. Under it, what a learner meets in a cell: an exercise check (the notebook's starter, then the
solution), a failed launch and the doctor's report on it, and a hang stopped at a check's limit. Every line the library
prints must carry the markers: a line without them is English the Chinese edition would show in a Chinese cell.
Evidence stays verbatim and is the only exception: a rank's own lines (``[rank N]``) and torchrun's (``[torchrun]``)."""

from __future__ import annotations

import json
import re

import pytest
from babel.messages.pofile import read_po, write_po

import tutorial_lib as tl
from conftest import FIXTURES
from test_exercises import HANGING, STARTERS
from tutorial_lib import i18n
from tutorial_lib.errors import LaunchError
from tutorial_lib.exercises.core import SOLUTIONS

pytestmark = pytest.mark.integration
OPEN, CLOSE = "⟦", "⟧"
EVIDENCE = re.compile(r"^\s*\[(rank \d+|torchrun)\] ")


def unmarked(lines: list[str]) -> list[str]:
    """The lines that are neither evidence nor worded by the catalogue (no ``⟦``)."""
    return [line for line in lines if line.strip() and OPEN not in line and not EVIDENCE.match(line)]


@pytest.fixture
def pseudo(tmp_path):
    """The pseudo language ``"pseudo"``: every message of the Chinese catalogue, its msgstr ``⟦msgid⟧`` (the plural
    form for a message with one), in a locale folder of its own; English and the package's folder again afterwards."""
    source = i18n.LOCALE_DIR / "zh" / "LC_MESSAGES" / f"{i18n.DOMAIN}.po"
    with source.open("rb") as f:
        catalogue = read_po(f, locale="zh")
    for message in catalogue:
        if message.id:
            message.string = ((OPEN + message.id[1] + CLOSE,) if isinstance(message.id, (list, tuple))
                              else OPEN + message.id + CLOSE)
    folder = tmp_path / "locale" / "pseudo" / "LC_MESSAGES"
    folder.mkdir(parents=True)
    with (folder / f"{i18n.DOMAIN}.po").open("wb") as f:
        write_po(f, catalogue)
    i18n.use_locale_dir(tmp_path / "locale")
    tl.set_language("pseudo")
    yield
    i18n.use_locale_dir(None)
    tl.set_language("en")


def test_the_check_of_unmarked_lines_finds_english():  # the control: the assert below can fail
    assert unmarked(["[launcher] ranks run in /tmp/x", "[rank 0] loss 1.0", "[torchrun] W1205 a warning",
                     "  ⟦run directory: /tmp/x⟧", ""]) == ["[launcher] ranks run in /tmp/x"]


def test_every_line_the_library_prints_in_a_check_a_failure_and_a_hang_is_in_the_learners_language(
        pseudo, tmp_path, capsys):
    ex = tl.exercise("01.1", tmp_path / "runs", timeout_s=120)
    ex.script.write_text(STARTERS["01.1"][1])  # the notebook's starter cell
    wrong = ex.check()
    ex.script.write_text((SOLUTIONS / ex.spec.solution).read_text())
    right = ex.check()
    print(wrong, right, sep="\n")
    with pytest.raises(LaunchError) as failed:
        tl.run_script(FIXTURES / "rank_raises.py", ["1:ValueError"], nproc_per_node=2, runs_dir=tmp_path / "runs",
                      timeout_s=120)
    print(tl.diagnose(failed.value))
    hang = tl.exercise("01.1", tmp_path / "hang", timeout_s=25)  # 25 s: room for two torch imports on 2 busy cores
    hang.script.write_text(HANGING)
    stuck = hang.check()
    print(stuck)
    out = capsys.readouterr().out
    assert not wrong.solved and right.solved and stuck.failure is not None, out
    assert "[rank 1] ValueError: bad batch on rank 1" in out and "rank 1 was stuck at train.py:6" in out, out
    english = unmarked(out.splitlines())
    assert not english, "lines the library printed outside the catalogue:\n" + "\n".join(english)


# A first cell put before a notebook's own: the notebook's prints (its cells' code is the English twin's in both
# editions, and its words are the notebook's, not the library's) carry a tag of their own, so what is left untagged
# in a stream was written by the library, or is evidence: a rank's or torchrun's labelled line, or a line of a script
# run in the kernel's process (tl.run_in_process), found in that run's output.log.
NOTEBOOK_PRINTS = '''import builtins, sys
_print = builtins.print
def print(*args, sep=" ", end="\\n", file=None, flush=False):
    caller = sys._getframe(1).f_code.co_filename
    if "ipykernel_" in caller or caller.startswith("<ipython"):  # a cell's own print
        args = ["⟪nb⟫ " + sep.join(map(str, args)).replace("\\n", "\\n⟪nb⟫ ")]
    _print(*args, sep=sep, end=end, file=file, flush=flush)
builtins.print = print'''
NOTEBOOK = re.compile(r"^⟪nb⟫ |^(Writing|Overwriting) /")  # a cell's print; %%writefile's own line
DATA_REPR = re.compile(r"^(\{'|\[|[A-Z]\w*\((\w+=|'))")
FRAME = re.compile(r"^\s+\S+\.py:\d+ in \S+")  # a stack's frame under the doctor's "stack" row (evidence)


def library_lines(output) -> list[str]:
    """The lines of one cell output the library wrote: a stream's untagged lines; a display's text unless it is a
    table the notebook built (a DataFrame: its labels are the notebook's), a figure, or a listing of a script (the
    script's own text, evidence); a progress table's summary above its table."""
    if output.output_type == "stream":
        return [line for line in output.text.splitlines() if not NOTEBOOK.match(line)]
    if output.output_type == "error":
        return []
    data = output.get("data", {})
    html, text = data.get("text/html", ""), data.get("text/plain", "")
    if "tutorial-lib-progress" in html:
        return text.split("\n\n", 1)[0].splitlines()
    if 'class="dataframe"' in html or "image/png" in data or "<span" in html or text.startswith("<Figure"):
        return []
    if DATA_REPR.match(text):  # a value's repr (tl.check_parameters' dict, a DevicePlan): names and values, no words
        return []
    return text.splitlines()


@pytest.mark.parametrize("name", ["01_ddp", "07_troubleshooting"])
def test_a_zh_notebook_under_the_pseudo_language_writes_every_library_line_in_it(pseudo, tmp_path, monkeypatch, name):
    """The whole notebook in a kernel of its own, the pseudo catalogue given to it (and so to its launches' ranks) by
    ``$TUTORIAL_LIB_LOCALE_DIR`` and ``$TUTORIAL_LIB_LANG``: live views, launch notes, the doctor, exercise verdicts
    (the starters: wrong answers), progress tables."""
    import nbformat
    import papermill as pm

    from conftest import ROOT

    monkeypatch.setenv("TUTORIAL_LIB_LOCALE_DIR", str(tmp_path / "locale"))
    monkeypatch.setenv("TUTORIAL_LIB_LANG", "pseudo")
    folder = ROOT / "notebooks" / "zh"
    nb = nbformat.read(folder / f"{name}.ipynb", as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(NOTEBOOK_PRINTS))
    source = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, source)
    out = pm.execute_notebook(source, tmp_path / "out.ipynb", parameters={"RUNS_DIR": str(tmp_path / "runs")},
                              cwd=str(folder), kernel_name="python3", progress_bar=False)
    in_process = set()  # the lines scripts printed in the kernel's process: evidence, as a rank's
    for record in (tmp_path / "runs").glob("*/run.json"):
        if json.loads(record.read_text()).get("in_process"):
            in_process |= set((record.parent / "output.log").read_text().splitlines())
    english = []
    for index, cell in enumerate(out.cells):
        for output in cell.get("outputs", []):
            english += [f"cell {index}: {line}" for line in unmarked(library_lines(output))
                        if not FRAME.match(line) and line not in in_process]
    marked = sum(OPEN in line for cell in out.cells for o in cell.get("outputs", []) for line in library_lines(o))
    assert marked > 20, f"{marked} lines in the pseudo language: the catalogue did not reach the kernel"
    assert not english, "lines the library wrote outside the catalogue:\n" + "\n".join(english)
