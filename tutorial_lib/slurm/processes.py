"""A process of the local SLURM cluster, told from a later one that reuses its PID, and how one is stopped."""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass

import psutil

from ..errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessStamp:
    """One process, told from a later one that reuses its PID: ``pid`` and ``create_time`` (psutil's start time,
    seconds since the epoch)."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> ProcessStamp:
        """The running process ``pid``.

        Raises:
            ConfigError: no process ``pid`` runs.
        """
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except psutil.NoSuchProcess as e:
            raise ConfigError(f"owner_pid {pid} names no running process: give the PID of the process whose end "
                              "should stop the local SLURM cluster (os.getpid()), or None for no owner") from e

    def process(self) -> psutil.Process | None:
        """The running process, or ``None`` if it has ended (a zombie, or its PID reused, counts as ended)."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.NoSuchProcess:
            return None

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process() is not None


def gone(proc: psutil.Process) -> bool:
    """Whether ``proc`` has exited: a zombie counts (a daemon started by an earlier command is a child of init, which
    may take seconds to reap it, or never: PID 1 of a container may reap nothing)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def terminate(proc: psutil.Process, *, timeout_s: float) -> None:
    """SIGTERM ``proc`` and wait until it has exited; SIGKILL it if it is still there after ``timeout_s`` seconds,
    and wait 10 s more (the caller checks for a process that survives even that: ``LocalCluster.leftovers``)."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            if sig == signal.SIGKILL:
                logger.warning("%s (pid %d) ignored SIGTERM for %g s: SIGKILL", proc.name(), proc.pid, timeout_s)
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            return
        deadline = time.monotonic() + wait_s
        while not gone(proc):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        else:
            return
