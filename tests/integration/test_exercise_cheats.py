"""The cheat corpus (issue 44): for every script exercise, scripts that game its check fail it, and correct fixes that
differ from the shipped solution pass it. ``tests/fixtures/exercises/README.md`` says what each kind of file is.

The checks observe what each rank did (``tutorial_lib.exercises.observing``): a script that keeps the bug and prints
the numbers the check once read, skips the distributed part, writes another rank's lines, runs the shipped solution,
or writes in numbers from an earlier run is seen doing what it did. The variant each check picks is pinned here
(``TUTORIAL_LIB_EXERCISE_VARIANT_SEED``), and one runs folder per exercise keeps the solution's reference run, so each
exercise's reference launches once."""

from __future__ import annotations

from pathlib import Path

import pytest

import tutorial_lib as tl
from conftest import FIXTURES
from tutorial_lib.exercises.core import load_all
from tutorial_lib.exercises.observing import VARIANT_SEED_ENV

pytestmark = pytest.mark.integration
CORPUS = FIXTURES / "exercises"
SPECS = load_all()
SCRIPT_EXERCISES = sorted(i for i, s in SPECS.items() if s.kind == "script")
KINDS = ("bug_kept", "alone", "forged", "solution", "literal", "dropped")
FILES = sorted(p for p in CORPUS.glob("*/*.py"))


def test_every_script_exercise_has_a_cheat_and_another_correct_fix_and_every_kind_of_cheat_is_there():
    folders = {p.name for p in CORPUS.iterdir() if p.is_dir()}
    assert folders <= set(SCRIPT_EXERCISES), folders - set(SCRIPT_EXERCISES)
    for exercise_id in SCRIPT_EXERCISES:
        names = [p.stem for p in (CORPUS / exercise_id).glob("*.py")]
        assert any(n.startswith("correct_") for n in names), f"{exercise_id}: no other correct fix"
        assert any(n.startswith("cheat_") for n in names), f"{exercise_id}: no cheat"
    kinds = {p.stem[len("cheat_"):] for p in FILES if p.stem.startswith("cheat_")}
    assert kinds == set(KINDS), kinds ^ set(KINDS)


@pytest.fixture(scope="module")
def runs_of(tmp_path_factory):
    """One runs folder per exercise for the whole module: the solution's reference run is kept there."""
    folders: dict[str, Path] = {}

    def runs(exercise_id: str) -> Path:
        if exercise_id not in folders:
            folders[exercise_id] = tmp_path_factory.mktemp(f"runs-{exercise_id}")
        return folders[exercise_id]
    return runs


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_cheat_fails_and_another_correct_fix_passes(path, runs_of, monkeypatch):
    monkeypatch.setenv(VARIANT_SEED_ENV, "44")
    exercise_id = path.parent.name
    ex = tl.exercise(exercise_id, runs_of(exercise_id), timeout_s=120)
    ex.script.write_text(path.read_text())
    verdict = ex.check()
    if path.stem.startswith("correct_"):
        assert verdict.solved, f"{path.name}, a correct fix, fails {exercise_id}'s check:\n{verdict}"
    else:
        assert not verdict.solved, f"{path.name} games {exercise_id}'s check:\n{verdict}"
        assert verdict.differences or verdict.failure is not None or verdict.problem is not None, str(verdict)
