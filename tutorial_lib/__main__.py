"""Command line: ``python -m tutorial_lib env`` prints the environment report; ``scripts`` lists the scripts."""

from __future__ import annotations

import argparse
import sys

from .env import environment_report
from .scripts import available_scripts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tutorial_lib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="print torch/CUDA/NCCL versions, backends, GPUs, CPU, RAM and disk")
    env.add_argument("--disk-path", default=".", help="folder whose free disk space is reported")
    sub.add_parser("scripts", help="list the training scripts shipped with the package")
    args = parser.parse_args(argv)
    if args.command == "env":
        print(environment_report(args.disk_path).to_text())
    else:
        print("\n".join(available_scripts()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
