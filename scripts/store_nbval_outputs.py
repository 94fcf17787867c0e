"""Execute the notebooks and store reference outputs for nbval, in place, for the checked cells only.

    python scripts/store_nbval_outputs.py              # every notebook in notebooks/
    python scripts/store_nbval_outputs.py 01_ddp       # one

nbval (``--nbval-lax``, as ``make test`` runs it) compares only cells tagged ``nbval-check-output``:
the asserted claims. Those keep their output and execution count; every other cell is stored
without outputs, so the notebooks in git stay small and diff cleanly (no images, no timings).
Run this after changing a claim's printed text, on the CPU default (2 ranks).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TAG = "nbval-check-output"  # nbval's cell tag for a checked cell


def checked(cell) -> bool:
    return cell.cell_type == "code" and TAG in cell.metadata.get("tags", [])


def store(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as runs:
        os.environ["TUTORIAL_LIB_RUNS_DIR"] = runs
        os.environ["TUTORIAL_LIB_LIVE"] = "text"
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}},
                       record_timing=False).execute()
    for cell in nb.cells:
        if cell.cell_type == "code" and not checked(cell):
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    print(f"stored reference outputs of {sum(map(checked, nb.cells))} checked cell(s) in {path.name}")


def main(names: list[str]) -> int:
    paths = [NOTEBOOKS / f"{n.removesuffix('.ipynb')}.ipynb" for n in names] or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        store(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
