"""One language per line (issue 45), proven by pseudo-localisation.

A catalogue made here at run time (from the Chinese one's messages: every message the library can word) wraps each
msgid in ``⟦ ⟧``. Under it, what a learner meets in a cell: an exercise check (the notebook's starter, then the
solution), a failed launch and the doctor's report on it, and a hang stopped at a check's limit. Every line the library
prints must carry the markers: a line without them is English the Chinese edition would show in a Chinese cell.
Evidence stays verbatim and is the only exception: a rank's own lines (``[rank N]``) and torchrun's (``[torchrun]``)."""

from __future__ import annotations

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
