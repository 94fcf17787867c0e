"""Command line: ``python -m tutorial_lib env`` prints the environment report; ``scripts`` lists the scripts;
``doctor RUN_DIR`` says what went wrong in a failed run."""

from __future__ import annotations

import argparse
import sys

from .doctor import diagnose
from .env import environment_report
from .errors import ConfigError
from .rundir import available_scripts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tutorial_lib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="print torch/CUDA/NCCL versions, backends, GPUs, CPU, RAM and disk")
    env.add_argument("--disk-path", default=".", help="folder whose free disk space is reported")
    sub.add_parser("scripts", help="list the training scripts shipped with the package")
    doctor = sub.add_parser("doctor", help="what went wrong in a run: first failing rank, exit code, cause, fix")
    doctor.add_argument("run_dir", help="the run directory a launch created (it holds output.log and logs/)")
    args = parser.parse_args(argv)
    if args.command == "env":
        print(environment_report(args.disk_path).to_text())
    elif args.command == "doctor":
        try:
            diagnosis = diagnose(args.run_dir)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(diagnosis)
        return 1 if diagnosis.failed else 0
    else:
        print("\n".join(available_scripts()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
