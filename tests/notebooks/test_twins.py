"""Every English notebook has its Chinese twin (``notebooks/zh/``), in step: ``scripts/twins.py``'s check.

A twin has the English notebook's cells in the same order with the same ids, its code cells equal to the English
ones (source and tags), and every markdown cell a translation of the current English text (issue 31). One test
per English notebook names what drifted and the command that fixes it; the controls build a pair in a temporary
folder that passes the same check, then change it the ways a twin drifts (English code edited, cells reordered, an
id changed, English prose edited, a twin missing or orphaned) and require the check to fail each time.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("twins", ROOT / "scripts" / "twins.py")
twins = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(twins)

ENGLISH = twins.english_notebooks()
CONTROL_NOTEBOOK = "00_environment_check.ipynb"  # the smallest English notebook: the controls' pair is built from it


def test_the_workbook_has_english_notebooks_to_pair():
    assert len(ENGLISH) >= 13 and ENGLISH[0].name == CONTROL_NOTEBOOK, [p.name for p in ENGLISH]


@pytest.mark.parametrize("english", ENGLISH, ids=lambda p: p.stem)
def test_english_notebook_has_its_chinese_twin_in_step(english):
    problems = twins.drift(english)
    assert not problems, "\n".join(problems)


def test_no_chinese_twin_without_an_english_notebook():
    assert not twins.orphans(), "\n".join(twins.orphans())


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A workbook in ``tmp_path`` with one English notebook and a twin that passes the check: the English cells
    synced by ``twins.sync``, every markdown cell given a (placeholder) translation of its current English text.
    Returns the English notebook's path; the module's folders point at ``tmp_path`` for the test's duration."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    monkeypatch.setattr(twins, "ROOT", tmp_path)
    monkeypatch.setattr(twins, "NOTEBOOKS", notebooks)
    monkeypatch.setattr(twins, "TWINS", notebooks / twins.EDITION)
    english = Path(shutil.copy(ROOT / "notebooks" / CONTROL_NOTEBOOK, notebooks / CONTROL_NOTEBOOK))
    twin = twins.sync(english)
    zh = nbformat.read(twin, as_version=4)
    en_by_id = {c.get("id"): c for c in nbformat.read(english, as_version=4).cells}
    for cell in zh.cells:
        if cell.cell_type == "markdown":
            cell.source = f"译文 {cell.get('id')}"
            cell.metadata["translation"] = {"source_sha1": twins.sha1(en_by_id[cell.get("id")].source)}
    nbformat.write(zh, twin)
    assert twins.main(["check"]) == 0, "the control pair is in step before it is changed"
    return english


def edit(path: Path, change) -> None:
    nb = nbformat.read(path, as_version=4)
    change(nb)
    nbformat.write(nb, path)


def nth(nb, cell_type: str, n: int):
    return [c for c in nb.cells if c.cell_type == cell_type][n]


def test_check_fails_when_an_english_code_cell_changes_until_sync(pair, capsys):
    def change(nb):
        nth(nb, "code", 2).source += "\nprint('changed in English only')"
    edit(pair, change)
    assert twins.main(["check"]) == 1
    out = capsys.readouterr().out
    cell_id = nth(nbformat.read(pair, as_version=4), "code", 2).get("id")
    assert f"{pair.name}: code cells differ from the English notebook's from code cell 3 (id {cell_id}; " in out, out
    assert f"python scripts/twins.py sync {pair.stem}" in out, out
    twins.sync(pair)  # the fix the message names: the twin follows, its translations kept
    assert twins.main(["check"]) == 0
    assert nth(nbformat.read(twins.twin_path(pair), as_version=4), "markdown", 0).source.startswith("译文 ")


def test_check_fails_when_a_code_cells_tags_change(pair):
    edit(pair, lambda nb: nth(nb, "code", 3).metadata.setdefault("tags", []).append("raises-exception"))
    assert any("code cells differ" in p for p in twins.drift(pair))


def test_check_fails_when_the_twins_code_cells_are_reordered(pair):
    def swap(nb):
        code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        a, b = code[2], code[3]
        nb.cells[a], nb.cells[b] = nb.cells[b], nb.cells[a]
    edit(twins.twin_path(pair), swap)
    problems = twins.drift(pair)
    assert any("code cells differ" in p for p in problems) and any("same order" in p for p in problems), problems


def test_check_fails_when_a_cell_id_differs(pair):
    edit(twins.twin_path(pair), lambda nb: setattr(nth(nb, "code", 4), "id", "not-the-english-id"))
    english_id = nth(nbformat.read(pair, as_version=4), "code", 4).get("id")
    problems = twins.drift(pair)
    assert any(f"from code cell 5 (id {english_id} / not-the-english-id; " in p for p in problems), problems


def test_check_fails_when_the_english_prose_changes_since_its_translation(pair):
    def change(nb):
        nth(nb, "markdown", 1).source += "\n\nA new English sentence."
    edit(pair, change)
    problems = twins.drift(pair)
    assert len(problems) == 1 and "changed in English since it was translated" in problems[0], problems


def test_check_fails_when_a_markdown_cell_is_untranslated(pair):
    edit(twins.twin_path(pair), lambda nb: nth(nb, "markdown", 0).metadata.update(translation={"source_sha1": ""}))
    assert any("is not translated" in p for p in twins.drift(pair))


def test_check_fails_without_a_twin_and_with_an_orphan(pair):
    twin = twins.twin_path(pair)
    twin.rename(twin.with_name("99_gone.ipynb"))
    assert twins.main(["check"]) == 1
    assert any("no Chinese twin" in p for p in twins.drift(pair))
    assert twins.orphans() == ["notebooks/zh/99_gone.ipynb: no English notebook of that name"]


def checked_outputs_differing(english: Path, twin: Path) -> list[str]:
    """The twin's code cells whose output nbval compares (``# NBVAL_CHECK_OUTPUT`` or the ``nbval-check-output`` tag,
    under ``--nbval-lax``) and whose stored output differs from the English notebook's, by cell id."""
    en = {c.get("id"): c for c in nbformat.read(english, as_version=4).cells}
    found = []
    for cell in nbformat.read(twin, as_version=4).cells:
        checked = "NBVAL_CHECK_OUTPUT" in cell.source or "nbval-check-output" in cell.metadata.get("tags", [])
        if cell.cell_type == "code" and checked and cell.get("outputs") != en[cell.get("id")].get("outputs"):
            found.append(f"{twin.name} cell id {cell.get('id')}")
    return found


@pytest.mark.parametrize("english", ENGLISH, ids=lambda p: p.stem)
def test_a_twin_nbval_does_not_execute_has_no_language_dependent_checked_output(english):
    """CI executes only the twins in ``conftest.EXECUTED_TWINS`` (issue 34): the others' code is the English code
    (the test above) and their checked outputs must be the English ones, so executing them proves nothing the
    English run does not. A twin that gains a checked output of its own must be executed (added there)."""
    from conftest import EXECUTED_TWINS

    if english.name in EXECUTED_TWINS:
        pytest.skip("nbval executes this twin")
    differing = checked_outputs_differing(english, twins.TWINS / english.name)
    assert not differing, f"checked outputs that differ from English: {differing}; add the twin to EXECUTED_TWINS"


def test_a_twin_with_its_own_checked_output_is_found(pair):
    """The control of the test above: a checked output changed in the twin alone is named by its cell id."""
    twin = twins.TWINS / pair.name
    assert checked_outputs_differing(pair, twin) == []

    def change(nb):
        cell = next(c for c in nb.cells if c.cell_type == "code" and c.get("outputs"))
        cell.source = "# NBVAL_CHECK_OUTPUT\n" + cell.source
        cell.outputs[0]["text"] = "输出不同\n"
    edit(twin, change)
    zh = nbformat.read(twin, as_version=4)
    changed = next(c for c in zh.cells if c.cell_type == "code" and "NBVAL_CHECK_OUTPUT" in c.source)
    assert checked_outputs_differing(pair, twin) == [f"{pair.name} cell id {changed.get('id')}"]
