"""Keep the run directories of the workbook's failures as doctor test fixtures, one folder per torch version.

    .venv-torch2.8/bin/python scripts/run_workbook.py --output-dir /tmp/wb28 --only 01_ddp 02_data_and_accumulation \
        05_checkpointing 06_multi_node 07_troubleshooting 14_compile
    .venv-torch2.8/bin/python scripts/capture_doctor_runs.py /tmp/wb28/runs      # -> tests/fixtures/run_dirs/torch-2.8/

Each failure the notebooks make on purpose (``CASES``: name -> a regular expression over the run's
``command.txt``) is copied to ``tests/fixtures/run_dirs/torch-<major.minor>/<case>/`` with only what the doctor
reads: ``command.txt``, ``run.json``, ``output.log``, ``metrics/*.jsonl``, torchrun's ``error.json`` files and each
rank's ``stderr.log`` (which also keeps the per-rank folders of every attempt)
(no checkpoints, scripts or stdout copies). The error files' modification times, which the doctor uses to
order failures, do not survive git: ``mtimes.json`` keeps them (nanoseconds after the first) and
``tests/unit/test_doctor_versions.py`` restores them before diagnosing. The torch version is the one this
interpreter imports (run the script with the venv that ran the workbook).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "run_dirs"

# case -> the run's command.txt matches this (the notebook that makes the failure is the prefix)
CASES = {
    "01-unused-parameters": r"unused_params\.py --loss-uses a$",
    "02-uneven-inputs-without-join": r"uneven_inputs\.py --pg-timeout-s",
    "05-rank0-only-fsdp-save": r"--save-mode rank0-only",
    "05-rank-killed-during-save-then-restarted": r"--fail-mode kill",
    "06-missing-node": r"-missing-node/",
    "06-taken-port": r"-taken-port/",
    "07-hang-stall-timeout": r"--fail-mode hang --pg-timeout-s 600",
    "07-hang-collective-timeout": r"--fail-mode hang --pg-timeout-s \d$",
    "07-skipped-collective": r"--fail-mode skip-collective",
    "07-detail-mismatch": r"collective_mismatch\.py --fail-rank",
    "07-crashing-rank": r"--fail-mode raise",
    "07-out-of-memory": r"--fail-mode oom",
    "14-compile-bucket-split": r"compile_train\.py .*--bucket-cap-mb 0\.5",
    "14-compile-no-cxx": r"CXX=no-such-g\+\+ .*compile_train\.py",
    "14-compile-recompile-limit": r"compile_train\.py .*--recompile-limit",
    "14-compile-fullgraph-break": r"compile_train\.py .*--graph-break print --fullgraph",
}
KEEP = ("command.txt", "run.json", "output.log", "metrics/*.jsonl", "logs/**/error.json", "logs/**/stderr.log")


def find_runs(runs_dir: Path) -> dict[str, Path]:
    """``{case: run directory}``; the newest run wins where a case matches several."""
    found = {}
    for run_dir in sorted(p for p in runs_dir.iterdir() if (p / "command.txt").is_file()):
        command = (run_dir / "command.txt").read_text()
        for case, pattern in CASES.items():
            if re.search(pattern, command, re.M):
                found[case] = run_dir
    return found


def capture(run_dir: Path, dest: Path) -> int:
    """Copy what the doctor reads from ``run_dir`` into ``dest`` (replaced); returns the bytes copied."""
    if dest.exists():
        shutil.rmtree(dest)
    copied, mtimes = 0, {}
    for pattern in KEEP:
        for path in sorted(run_dir.glob(pattern)):
            relative = path.relative_to(run_dir)
            (dest / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / relative)
            copied += path.stat().st_size
            if path.name == "error.json":
                mtimes[str(relative)] = path.stat().st_mtime_ns
    first = min(mtimes.values(), default=0)
    (dest / "mtimes.json").write_text(json.dumps({k: v - first for k, v in sorted(mtimes.items())}, indent=1) + "\n")
    return copied


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs_dir", type=Path, help="the runs/ folder of a workbook execution")
    p.add_argument("--dest", type=Path, default=None, help="default: tests/fixtures/run_dirs/torch-<major.minor>")
    args = p.parse_args(argv)
    if not args.runs_dir.is_dir():
        print(f"runs_dir {str(args.runs_dir)!r} is not a folder: pass <output-dir>/runs of run_workbook.py",
              file=sys.stderr)
        return 2
    dest = args.dest or FIXTURES / ("torch-" + ".".join(version("torch").split(".")[:2]))
    found = find_runs(args.runs_dir)
    for case, run_dir in sorted(found.items()):
        size = capture(run_dir, dest / case)
        print(f"{case:45s} <- {run_dir.name} ({size / 1024:.0f} KiB)")
    missing = sorted(set(CASES) - set(found))
    if missing:
        print(f"no run found for {missing} in {args.runs_dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
