"""Execute every notebook of the workbook in order with papermill and print a summary table.

    python scripts/run_workbook.py                      # all notebooks, CPU default (2 ranks on gloo)
    python scripts/run_workbook.py -p NPROC 4 -p DEVICE cuda
    python scripts/run_workbook.py --only 01_ddp --output-dir outputs

Executed notebooks go to ``<output-dir>/<name>.ipynb``, run directories of the training jobs to
``<output-dir>/runs/``. Parameters (``-p NAME VALUE``, values parsed as YAML like papermill's CLI,
so ``2`` is an int) reach the notebooks' ``parameters`` cell and through it the training
subprocesses. Exits 1 if any notebook fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import papermill as pm
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output-dir", type=Path, default=ROOT / "outputs", help="executed notebooks and runs/ go here")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="notebook parameter, e.g. -p NPROC 2 (value parsed as YAML)")
    p.add_argument("--only", nargs="+", default=None, help="notebook names (without .ipynb) to run")
    p.add_argument("--timeout-s", type=int, default=600, help="limit per cell (seconds)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parameters = {name: yaml.safe_load(value) for name, value in args.parameter}
    notebooks = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if args.only:
        unknown = set(args.only) - {nb.stem for nb in notebooks}
        if unknown:
            print(f"unknown notebook(s) {sorted(unknown)}; available: {[nb.stem for nb in notebooks]}", file=sys.stderr)
            return 2
        notebooks = [nb for nb in notebooks if nb.stem in args.only]
    out_dir = args.output_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    # The kernels inherit these: run directories under the output folder; progress as text (no widgets in files).
    os.environ["TUTORIAL_LIB_RUNS_DIR"] = str(out_dir / "runs")
    os.environ.setdefault("TUTORIAL_LIB_LIVE", "text")
    rows = []
    for i, nb in enumerate(notebooks, 1):
        print(f"[{i}/{len(notebooks)}] {nb.name} ...", flush=True)
        start = time.monotonic()
        status = "ok"
        try:
            pm.execute_notebook(nb, out_dir / nb.name, parameters=parameters, cwd=str(NOTEBOOKS),
                                kernel_name="python3", progress_bar=False, execution_timeout=args.timeout_s)
        except pm.PapermillExecutionError as e:
            status = f"FAILED in cell {e.exec_count}: {e.ename}: {str(e.evalue).splitlines()[0][:100]}"
        except Exception as e:  # noqa: BLE001 - report and go on with the next notebook
            status = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
        seconds = time.monotonic() - start
        rows.append((nb.name, status, seconds))
        print(f"    {status} ({seconds:.1f} s)", flush=True)
    width = max(len(r[0]) for r in rows) if rows else 8
    print(f"\n{'notebook':<{width}}  {'seconds':>7}  status")
    for name, status, seconds in rows:
        print(f"{name:<{width}}  {seconds:7.1f}  {status}")
    failed = sum(1 for r in rows if r[1] != "ok")
    print(f"\n{len(rows) - failed} passed, {failed} failed; executed notebooks in {out_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
