"""The learner's working copy of the notebooks (scripts/working_copy.py, issue 45): `make lab` opens it, so JupyterLab
never writes into notebooks/, and a new version of the workbook never overwrites the learner's work."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("working_copy", ROOT / "scripts" / "working_copy.py")
working_copy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(working_copy)


def notebook(*sources: str) -> str:
    return json.dumps({"cells": [{"id": f"c{i}", "cell_type": "code", "source": s, "outputs": [], "metadata": {}}
                                 for i, s in enumerate(sources)], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_first_use_copies_every_notebook_and_a_second_run_changes_nothing(tmp_path):
    source, copy = tmp_path / "notebooks", tmp_path / "my-notebooks"
    source.mkdir()
    (source / "01_a.ipynb").write_text(notebook("x = 1"))
    (source / "02_b.ipynb").write_text(notebook("y = 2"))
    said = working_copy.update(source, copy)
    assert [line.split()[0] for line in said] == ["copied", "copied"]
    assert (copy / "01_a.ipynb").read_text() == (source / "01_a.ipynb").read_text()
    assert working_copy.update(source, copy) == []


def test_a_new_version_replaces_an_untouched_copy_and_waits_beside_an_edited_one(tmp_path):
    source, copy = tmp_path / "notebooks", tmp_path / "my-notebooks"
    source.mkdir()
    (source / "01_a.ipynb").write_text(notebook("x = 1", "print(x)"))
    (source / "02_b.ipynb").write_text(notebook("y = 2"))
    working_copy.update(source, copy)
    mine = notebook("x = 10  # my change", "print(x)")
    (copy / "01_a.ipynb").write_text(mine)  # the learner's work
    (source / "01_a.ipynb").write_text(notebook("x = 1", "print(x)", "print('new cell')"))  # a new version of both
    (source / "02_b.ipynb").write_text(notebook("y = 3"))
    (source / "03_c.ipynb").write_text(notebook("z = 3"))  # and a new notebook
    said = {line.split()[1]: line for line in working_copy.update(source, copy)}
    assert (copy / "01_a.ipynb").read_text() == mine, "the learner's edited copy is never overwritten"
    assert (copy / "updates" / "01_a.ipynb").read_text() == (source / "01_a.ipynb").read_text()
    assert "2 cells differ from yours" in said[str(copy / "01_a.ipynb") + ":"]
    assert (copy / "02_b.ipynb").read_text() == (source / "02_b.ipynb").read_text(), "untouched: updated in place"
    assert said[str(copy / "02_b.ipynb")].startswith("updated")
    assert said[str(copy / "03_c.ipynb")].startswith("copied")
    (copy / "01_a.ipynb").unlink()  # the learner takes the new version whole
    assert working_copy.update(source, copy)[0].startswith("copied")
    assert (copy / "01_a.ipynb").read_text() == (source / "01_a.ipynb").read_text()


def test_the_chinese_edition_keeps_its_folder_name_and_an_empty_source_is_refused(tmp_path, capsys):
    assert working_copy.main(["--edition", "zh", "--to", str(tmp_path / "copy")]) == 0
    assert sorted(p.name for p in (tmp_path / "copy" / "zh").glob("*.ipynb")) == \
        sorted(p.name for p in (ROOT / "notebooks" / "zh").glob("*.ipynb"))
    assert "zh" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="no notebook in"):
        working_copy.update(tmp_path / "empty", tmp_path / "copy2")


def test_make_lab_opens_the_working_copy_and_git_ignores_it():
    makefile = (ROOT / "Makefile").read_text()
    assert "LAB_DIR ?= my-notebooks" in makefile and "cd $(LAB_EDITION_DIR) &&" in makefile
    assert "scripts/working_copy.py --edition $(EDITION) --to $(LAB_DIR)" in makefile
    assert "-m jupyterlab" in makefile and "/jupyter lab" not in makefile, "JupyterLab as a module of the venv's Python"
    assert "my-notebooks/" in (ROOT / ".gitignore").read_text().splitlines()
