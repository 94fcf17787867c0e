"""A Chinese notebook gets the doctor's report in Chinese without a cell of its own (its code is the English twin's):
papermill runs the kernel in the notebook's folder, as ``scripts/run_workbook.py --notebooks-dir notebooks/zh`` and
nbval do (and JupyterLab: jupyter_server starts a notebook's kernel in its folder), and ``tl.setup_notebook`` reads
the folder's name."""

from __future__ import annotations

import shutil

import nbformat
import papermill as pm
import pytest

from conftest import FIXTURES

pytestmark = pytest.mark.integration

CASE = FIXTURES / "run_dirs" / "torch-2.13" / "07-crashing-rank"


def run_notebook(folder, run_dir, env_lang=None):
    """Execute the same two cells (a setup cell, the doctor's report) in ``folder``; the report's text/plain."""
    folder.mkdir(parents=True)
    setup = "import os\nimport tutorial_lib as tl\nos.environ['TUTORIAL_LIB_WARM'] = '0'\n"
    setup += f"os.environ['TUTORIAL_LIB_LANG'] = {env_lang!r}\n" if env_lang else ""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(setup + "tl.setup_notebook({})"),
                                         nbformat.v4.new_code_cell(f"tl.diagnose({str(run_dir)!r})")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "NN_x.ipynb")
    out = pm.execute_notebook(folder / "NN_x.ipynb", folder / "out.ipynb", kernel_name="python3", progress_bar=False,
                              cwd=str(folder))
    data = out.cells[1].outputs[0]["data"]
    return data["text/plain"], data["text/html"]


def test_a_notebook_in_a_zh_folder_gets_the_doctors_report_in_chinese(tmp_path, monkeypatch):
    monkeypatch.delenv("TUTORIAL_LIB_LANG", raising=False)
    run_dir = shutil.copytree(CASE, tmp_path / "run")
    text, table = run_notebook(tmp_path / "notebooks" / "zh", run_dir)
    assert "疑似原因" in text and "Python 异常（RuntimeError）" in text and "见 07 第 2 节" in text, text
    assert "suspected cause" not in text and "修复建议" in table
    text, _ = run_notebook(tmp_path / "notebooks" / "en", run_dir)
    assert "suspected cause  Python exception (RuntimeError)" in text and "疑似原因" not in text, text
    text, _ = run_notebook(tmp_path / "other" / "zh", run_dir, env_lang="en")
    assert "suspected cause" in text, "$TUTORIAL_LIB_LANG wins over the folder"
