"""Command line: ``python -m tutorial_lib env`` prints the environment report; ``scripts`` lists the scripts;
``doctor RUN_DIR`` says what went wrong in a failed run; ``slurm up|down|status`` starts, stops or describes a
two-node SLURM cluster on this machine (``tutorial_lib/slurm/local_cluster.py``)."""

from __future__ import annotations

import argparse
import sys
import time

from .doctor import diagnose
from .errors import ConfigError, SlurmError, SlurmUnavailable
from .probes.env import environment_report
from .runs.rundir import available_scripts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tutorial_lib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="print torch/CUDA/NCCL versions, backends, GPUs, CPU, RAM and disk")
    env.add_argument("--disk-path", default=".", help="folder whose free disk space is reported")
    sub.add_parser("scripts", help="list the training scripts shipped with the package")
    doctor = sub.add_parser("doctor", help="what went wrong in a run: first failing rank, exit code, cause, fix")
    doctor.add_argument("run_dir", help="the run directory a launch created (it holds output.log and logs/)")
    slurm = sub.add_parser("slurm", help="a two-node SLURM cluster on this machine (needs root and slurm-wlm)")
    slurm.add_argument("action", choices=["up", "down", "status"], help="start it, stop it, or show its nodes")
    slurm.add_argument("--state-dir", default=None,
                       help="its folder (slurm.conf, munge key and socket, PID files, logs); default: "
                            "$TUTORIAL_LIB_SLURM_DIR, else $TMPDIR/tutorial_lib-slurm-<uid>")
    slurm.add_argument("--timeout-s", type=float, default=120.0,
                       help="longest wait for the daemons to start or stop (seconds)")
    args = parser.parse_args(argv)
    if args.command == "slurm":
        return slurm_command(args.action, args.state_dir, args.timeout_s)
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


def slurm_command(action: str, state_dir: str | None, timeout_s: float) -> int:
    """``python -m tutorial_lib slurm up|down|status``: 0 on success, 1 if it failed, 2 if it cannot run here."""
    from .slurm import LocalCluster  # imported here: the other commands do not need it

    cluster = LocalCluster.default(state_dir)
    start = time.monotonic()
    try:
        if action == "up":
            started = cluster.up(timeout_s=timeout_s)
            print(f"local SLURM cluster {'started' if started else 'already up'} in {cluster.state_dir} "
                  f"({time.monotonic() - start:.1f} s). Point SLURM's commands at it with:")
            print(cluster.export_line())
        elif action == "down":
            stopped = cluster.down(timeout_s=timeout_s)
            print(f"local SLURM cluster in {cluster.state_dir}: " + (
                f"stopped {', '.join(f'{d.name} (pid {d.pid})' for d in stopped)} "
                f"({time.monotonic() - start:.1f} s)" if stopped else "was not running"))
        else:
            print(cluster.status())
            return 0 if cluster.is_up() else 1
    except SlurmUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (SlurmError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
