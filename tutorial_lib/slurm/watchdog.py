"""The watchdog of a local SLURM cluster: stops the cluster once the process that owns it is gone.

    python watchdog.py STATE_DIR OWNER_PID OWNER_CREATE_TIME [--poll-s 1.0]

Started by ``tutorial_lib.slurm.owner.start_watchdog`` in its own session, next to the daemons of the cluster in
``STATE_DIR``, for a cluster that a process owns (a notebook's kernel through ``tl.slurm.connect_slurm()``, a test run
through the ``slurm_cluster`` fixture). Every ``--poll-s`` seconds it looks at the owner: the process ``OWNER_PID``
whose start time (psutil's ``create_time``, seconds since the epoch) is ``OWNER_CREATE_TIME``. A later process that
reuses the PID has another start time, and a zombie has ended: both count as gone. Once the owner is gone, however it
ended (SIGKILL and SIGTERM included, which run none of its clean-up), the watchdog removes its own record
(``watchdog.json``: the stop must not stop the watchdog that runs it) and runs ``python -m tutorial_lib slurm down
--state-dir STATE_DIR --if-owner PID:CREATE_TIME``, the same stop as a user's (every job cancelled, the daemons
stopped by their PIDs, none left), unless the cluster was started afresh by another owner meanwhile. If that fails,
it SIGKILLs the daemons of the PID files (``run/*.json``) itself. It writes to ``log/watchdog.log`` and removes
nothing else: the state folder, its munge key and the logs stay. A SIGTERM (what ``down`` sends when the owner stops
the cluster itself) ends it.

Standard library and psutil only: it runs by path and imports nothing of the package (the package's ``__init__``
costs seconds and memory, and the watchdog waits for hours), nor any module beside it in ``slurm/`` (run by path, this
folder is the first entry of its ``sys.path``; no module here shares a name with one of the standard library's).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

DOWN_TIMEOUT_S = 45.0  # the longest wait for `slurm down` (it gives each daemon 20 s after SIGTERM)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds tutorial_lib/


def alive(pid: int, create_time: float) -> bool:
    """Whether the process ``pid`` that started at ``create_time`` (seconds since the epoch) still runs; a zombie, a
    missing PID or a PID reused by a later process (another start time) count as ended."""
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - create_time) <= 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def log(text: str) -> None:
    """One time-stamped line on stderr, which is the cluster's ``log/watchdog.log``."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} slurm_watchdog[{os.getpid()}]: {text}", file=sys.stderr, flush=True)


def run_down(state_dir: Path, owner_pid: int, owner_create_time: float) -> bool:
    """``python -m tutorial_lib slurm down`` on ``state_dir`` with this interpreter, only if the cluster still belongs
    to the owner (``--if-owner``: one started afresh meanwhile by another process is left alone); whether it
    succeeded."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTHONWARNINGS", None)  # the owner's (the tests make warnings errors for their kernels): not the stop's
    argv = [sys.executable, "-m", "tutorial_lib", "slurm", "down", "--state-dir", str(state_dir), "--timeout-s", "20",
            "--if-owner", f"{owner_pid}:{owner_create_time!r}"]
    try:
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr,
                              timeout=DOWN_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"`slurm down` did not finish: {e}")
        return False
    if done.returncode != 0:
        log(f"`slurm down` exited with {done.returncode}")
    return done.returncode == 0


def kill_recorded_daemons(state_dir: Path) -> None:
    """The last resort: SIGKILL every daemon of the PID files that still runs (its start time checked)."""
    for path in sorted((state_dir / "run").glob("*.json")):
        try:
            record = json.loads(path.read_text())
            if alive(int(record["pid"]), float(record["create_time"])):
                os.kill(int(record["pid"]), signal.SIGKILL)
                log(f"SIGKILL {record['name']} (pid {record['pid']})")
        except (OSError, ValueError, KeyError) as e:
            log(f"could not stop the daemon of {path.name}: {e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("state_dir", type=Path, help="the cluster's state folder (slurm.conf, run/*.json, log/)")
    parser.add_argument("owner_pid", type=int, help="the PID of the process that owns the cluster")
    parser.add_argument("owner_create_time", type=float, help="the owner's start time (psutil), seconds since epoch")
    parser.add_argument("--poll-s", type=float, default=1.0, help="seconds between two looks at the owner (> 0)")
    args = parser.parse_args(argv)
    while alive(args.owner_pid, args.owner_create_time):
        if not args.state_dir.is_dir():  # the folder was removed: nothing left to stop
            return 0
        time.sleep(args.poll_s)
    log(f"the owner (pid {args.owner_pid}) is gone: stopping the cluster in {args.state_dir}")
    record = args.state_dir / "watchdog.json"
    try:
        if json.loads(record.read_text()).get("pid") == os.getpid():
            record.unlink()
    except (OSError, ValueError):
        pass
    if not run_down(args.state_dir, args.owner_pid, args.owner_create_time):
        kill_recorded_daemons(args.state_dir)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
