"""Who a local SLURM cluster belongs to, and the watchdog that stops it once its owner is gone.

A cluster that a process starts for itself (a notebook's kernel through ``tl.slurm.connect_slurm()``, a test run through
the ``slurm_cluster`` fixture) belongs to that process: ``owner.json`` in the state folder records the owner's PID and
start time (psutil's ``create_time``, which tells it from a later process that reuses the PID), and a watchdog
(``tutorial_lib/slurm/watchdog.py``, run by path in its own session, recorded in ``watchdog.json``) looks at the
owner every second and, once it is gone however it ended (SIGKILL and SIGTERM included), runs ``python -m tutorial_lib
slurm down`` on the folder. ``LocalCluster.up`` finding a cluster whose owner is gone (its watchdog killed too) stops
it and starts afresh. A cluster started by ``python -m tutorial_lib slurm up`` (``make slurm``) belongs to nobody: no
owner file, no watchdog; it runs until ``slurm down``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from .processes import ProcessStamp, terminate

logger = logging.getLogger(__name__)

OWNER_FILE = "owner.json"
WATCHDOG_FILE = "watchdog.json"
WATCHDOG = Path(__file__).resolve().parent / "watchdog.py"  # run by path: it imports nothing of the package
WATCHDOG_POLL_S = 1.0  # seconds between two looks at the owner: the owner's end is noticed within this

_WATCHDOGS: dict[int, subprocess.Popen] = {}  # watchdogs this process started: reaped by stop_watchdog


def _read(path: Path) -> ProcessStamp | None:
    try:
        record = json.loads(path.read_text())
        return ProcessStamp(int(record["pid"]), float(record["create_time"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as e:
        logger.warning("ignoring unreadable %s: %s", path, e)
        return None


def _write(path: Path, stamp: ProcessStamp) -> None:
    path.write_text(json.dumps({"pid": stamp.pid, "create_time": stamp.create_time}))


def read_owner(state_dir: Path) -> ProcessStamp | None:
    """The owner recorded in ``state_dir`` (``owner.json``), alive or not; ``None``: the cluster belongs to nobody."""
    return _read(state_dir / OWNER_FILE)


def record_owner(state_dir: Path, owner: ProcessStamp | None) -> None:
    """Record ``owner`` as the owner of the cluster in ``state_dir``; ``None`` removes the record (nobody's)."""
    if owner is None:
        (state_dir / OWNER_FILE).unlink(missing_ok=True)
    else:
        _write(state_dir / OWNER_FILE, owner)


def start_watchdog(state_dir: Path, owner: ProcessStamp, *, poll_s: float = WATCHDOG_POLL_S) -> ProcessStamp:
    """Start the watchdog of the cluster in ``state_dir`` for ``owner`` and record it in ``watchdog.json``.

    Args:
        state_dir: the cluster's state folder (its ``log/`` folder receives ``watchdog.log``).
        owner: the process whose end stops the cluster.
        poll_s: seconds between two looks at the owner, > 0.

    Raises:
        OSError: the watchdog could not be started (this interpreter could not run).
    """
    (state_dir / "log").mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(WATCHDOG), str(state_dir), str(owner.pid), repr(owner.create_time),
            "--poll-s", str(poll_s)]
    with open(state_dir / "log" / "watchdog.log", "ab") as log:
        # Its own session: a signal to the owner's process group (a terminal's Ctrl-C, a CI's kill) spares it.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                                start_new_session=True, close_fds=True)  # cwd: it holds none of the owner's folders
    _WATCHDOGS[proc.pid] = proc
    stamp = ProcessStamp.of(proc.pid)
    _write(state_dir / WATCHDOG_FILE, stamp)
    return stamp


def stop_watchdog(state_dir: Path, *, timeout_s: float = 10.0) -> None:
    """Stop the watchdog recorded in ``state_dir`` (SIGTERM, SIGKILL after ``timeout_s`` seconds) and remove its
    record. Nothing to do when none is recorded (a watchdog removes its record before it stops the cluster itself)."""
    stamp = _read(state_dir / WATCHDOG_FILE)
    proc = stamp.process() if stamp is not None else None
    if proc is not None:
        terminate(proc, timeout_s=timeout_s)
    if stamp is not None and stamp.pid in _WATCHDOGS:
        _WATCHDOGS.pop(stamp.pid).poll()  # reap it (a zombie already counts as ended)
    (state_dir / WATCHDOG_FILE).unlink(missing_ok=True)
