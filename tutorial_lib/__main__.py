"""Command line: ``python -m tutorial_lib env`` prints the environment report; ``scripts`` lists the scripts;
``doctor RUN_DIR`` says what went wrong in a failed run (in each replica group's start, for a torchft run); ``slurm up|down|status`` starts, stops or describes a
two-node SLURM cluster on this machine (``tutorial_lib/slurm/local_cluster.py``)."""

from __future__ import annotations

import argparse
import sys
import time

from .diagnosis.doctor import diagnose
from .diagnosis.groups import diagnose_groups
from .errors import ConfigError, SlurmError, SlurmUnavailable
from .probes.env import environment_report
from .runs.replica_records import replica_attempt_dirs
from .runs.rundir import available_scripts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tutorial_lib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="print torch/CUDA/NCCL versions, backends, GPUs, CPU, RAM and disk")
    env.add_argument("--disk-path", default=".", help="folder whose free disk space is reported")
    sub.add_parser("scripts", help="list the training scripts shipped with the package")
    doctor = sub.add_parser("doctor", help="what went wrong in a run: first failing rank, exit code, cause, fix")
    doctor.add_argument("run_dir", help="the run directory a launch created (it holds output.log and logs/), or "
                                        "start_replica_groups' run_dir (group<G>/attempt<A>/)")
    slurm = sub.add_parser("slurm", help="a two-node SLURM cluster on this machine (needs root and slurm-wlm)")
    slurm.add_argument("action", choices=["up", "down", "status"], help="start it, stop it, or show its nodes")
    slurm.add_argument("--state-dir", default=None,
                       help="its folder (slurm.conf, munge key and socket, PID files, logs); default: "
                            "$TUTORIAL_LIB_SLURM_DIR, else $TMPDIR/tutorial_lib-slurm-<uid>")
    slurm.add_argument("--timeout-s", type=float, default=120.0,
                       help="longest wait for the daemons to start or stop (seconds)")
    slurm.add_argument("--owner-pid", type=int, default=None,
                       help="up: the process whose end stops the cluster (a watchdog stops it within seconds); "
                            "default: nobody's, it runs until `slurm down`")
    slurm.add_argument("--if-owner", type=owner_stamp, default=None, metavar="PID:CREATE_TIME",
                       help="down: only if the cluster still belongs to this process (its psutil start time, in "
                            "seconds since the epoch): the watchdog's stop")
    args = parser.parse_args(argv)
    if args.command == "slurm":
        return slurm_command(args.action, args.state_dir, args.timeout_s, owner_pid=args.owner_pid,
                             if_owner=args.if_owner)
    if args.command == "env":
        print(environment_report(args.disk_path).to_text())
    elif args.command == "doctor":
        try:
            reports = (diagnose_groups(args.run_dir) if replica_attempt_dirs(args.run_dir)
                       else [diagnose(args.run_dir)])
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print("\n\n".join(map(str, reports)))
        return 1 if any(report.failed for report in reports) else 0
    else:
        print("\n".join(available_scripts()))
    return 0


def owner_stamp(text: str):
    """``--if-owner``'s ``PID:CREATE_TIME`` as a ``ProcessStamp``; ``argparse.ArgumentTypeError`` if malformed."""
    from .slurm.processes import ProcessStamp  # imported here: the other commands do not need it

    pid, _, create_time = text.partition(":")
    try:
        return ProcessStamp(int(pid), float(create_time))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PID:CREATE_TIME (a PID and its psutil start time in seconds "
                                         f"since the epoch, e.g. 1234:1764650000.25), got {text!r}") from None


def slurm_command(action: str, state_dir: str | None, timeout_s: float, *, owner_pid: int | None = None,
                  if_owner=None) -> int:
    """``python -m tutorial_lib slurm up|down|status``: 0 on success, 1 if it failed, 2 if it cannot run here.

    ``owner_pid`` (up) and ``if_owner`` (down, a ``ProcessStamp``) are ``LocalCluster.up``'s ``owner_pid`` and
    ``down``'s ``if_owner``."""
    from .slurm import LocalCluster  # imported here: the other commands do not need it

    cluster = LocalCluster.default(state_dir)
    start = time.monotonic()
    try:
        if action == "up":
            started = cluster.up(timeout_s=timeout_s, owner_pid=owner_pid)
            print(f"local SLURM cluster {'started' if started else 'already up'} in {cluster.state_dir} "
                  f"({time.monotonic() - start:.1f} s). Point SLURM's commands at it with:")
            print(cluster.export_line())
            print(cluster.owner_line())
        elif action == "down":
            stopped = cluster.down(timeout_s=timeout_s, if_owner=if_owner)
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
