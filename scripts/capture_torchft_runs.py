"""Keep torchft replica-group runs that failed as doctor test fixtures (tests/fixtures/run_dirs/torchft/<case>/).

    PYTHONPATH=. .venv/bin/python scripts/capture_torchft_runs.py /tmp/ftexp/quorum quorum-timeout

A replica-group run (``tutorial_lib.launcher.replicas``) holds ``group<G>/attempt<A>/``, each a torchrun job's folder,
and the lighthouse's ``lighthouse.log``. Kept: each rank's ``error.json``, ``exit.json``, ``rank.json`` and
``stderr.log``/``stdout.log`` (what ``diagnose`` reads of a folder without ``output.log``), each log cut to its first
``HEAD_LINES`` and last ``TAIL_LINES`` lines (the middle of a long run is one INFO line per step, and a failure is
read from the end: the cut is marked by a line of its own), and the lighthouse log's last ``TAIL_LINES`` lines. No
metrics, checkpoints or torchrun.log (the doctor reads none of them).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "run_dirs" / "torchft"
KEEP = ("group*/attempt*/logs/**/error.json", "group*/attempt*/logs/**/exit.json", "group*/attempt*/logs/**/rank.json",
        "group*/attempt*/logs/**/stderr.log", "group*/attempt*/logs/**/stdout.log", "lighthouse.log")
HEAD_LINES, TAIL_LINES = 10, 60
CUT = "[... {count} lines cut by scripts/capture_torchft_runs.py ...]\n"


def cut_lines(text: str, head: int, tail: int) -> str:
    """``text`` with its middle lines replaced by one ``CUT`` line when it has more than ``head + tail`` lines."""
    lines = text.splitlines(keepends=True)
    if len(lines) <= head + tail:
        return text
    return "".join(lines[:head]) + CUT.format(count=len(lines) - head - tail) + "".join(lines[-tail:])


def capture(run_dir: Path, dest: Path) -> int:
    """Copy what the doctor reads of ``run_dir`` into ``dest`` (replaced); return the bytes written."""
    if dest.exists():
        shutil.rmtree(dest)
    written = 0
    for pattern in KEEP:
        for path in sorted(run_dir.glob(pattern)):
            target = dest / path.relative_to(run_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            text = path.read_text(errors="replace")
            if path.suffix == ".log":
                text = cut_lines(text, 0 if path.name == "lighthouse.log" else HEAD_LINES, TAIL_LINES)
            target.write_text(text)
            written += len(text.encode())
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path, help="the replica groups' run directory (start_replica_groups' run_dir)")
    p.add_argument("case", help="the fixture's name, e.g. quorum-timeout")
    args = p.parse_args(argv)
    if not any(args.run_dir.glob("group*/attempt*")):
        p.error(f"{args.run_dir} holds no group<G>/attempt<A>/")
    written = capture(args.run_dir, FIXTURES / args.case)
    print(f"{args.case}: {written} bytes -> {FIXTURES / args.case}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
