"""Find, watch and stop the process tree of one torchrun job, leaving nothing behind.

torchrun starts each worker in a new session, so signalling torchrun's process group does not
reach the workers, and a SIGKILLed torchrun orphans them (they keep running and keep the output
pipe open). So the tree is recorded while it runs, and stopping it is done in three moves:
SIGTERM to torchrun (it forwards the signal to its workers), a grace period, then SIGKILL to
torchrun's group and to every worker recorded. See FACTS in the project notes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

import psutil

from ..child.protocol import SOCKET_ENV, forked_pid, is_warm_client

log = logging.getLogger(__name__)


def _environ_rank(proc: psutil.Process) -> int | None:
    try:
        value = proc.environ().get("RANK")
        return int(value) if value is not None else None
    except (psutil.Error, ValueError):
        return None


def is_alive(proc: psutil.Process) -> bool:
    """True if ``proc`` runs; a zombie (dead, not yet reaped: PID 1 here does not reap) counts as dead."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_dead(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until none of ``processes`` runs (``is_alive``), ``timeout_s`` seconds at most; return those still alive.

    Not ``psutil.wait_procs``: for a process that is not this one's child (a rank, whose parent was torchrun) it
    waits until the zombie is reaped, and PID 1 here reaps every ~2 s (a SIGKILLed group's kill took 1.85 s).
    """
    deadline = time.monotonic() + timeout_s
    alive = [p for p in processes if is_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if is_alive(p)]
    return alive


@dataclass
class Worker:
    """A process of the job: ``rank`` from its ``RANK`` variable (``None`` if it has none)."""

    process: psutil.Process
    rank: int | None


def warm_client_child(proc: psutil.Process) -> tuple[bool, int | None, int | None]:
    """Whether ``proc`` is a warm-start client (``python [-u] warm_start.py run ...``, see ``tutorial_lib.launcher.warm``),
    the pid the helper forked for it (``None`` until forked) and the client's ``RANK`` (``None`` if it has none).

    A warm job's agent and ranks are the helper's children, not torchrun's: each stands behind its client, which
    torchrun (or the launcher) started and which has the environment torchrun gave it.
    """
    try:
        if not is_warm_client(proc.cmdline()):
            return False, None, None
        env = proc.environ()
    except psutil.Error:
        return False, None, None
    try:
        rank = int(env["RANK"]) if "RANK" in env else None
    except ValueError:
        rank = None
    return True, forked_pid(env.get(SOCKET_ENV, ""), proc.pid), rank


class ProcessTree:
    """The processes below the roots (one torchrun agent per simulated node), recorded as they appear.

    Thread-safe: a sampler thread calls ``refresh`` while the launcher reads ``workers``.
    """

    def __init__(self, *root_pids: int) -> None:
        if not root_pids:
            raise ValueError("ProcessTree needs at least one root pid")
        self.roots = [psutil.Process(pid) for pid in root_pids]
        self._lock = threading.Lock()
        self._seen: dict[int, Worker] = {}
        self._parent: dict[int, int] = {}
        self._agents: set[int] = set()  # warm starts: the agents the roots (their clients) stand for

    def refresh(self) -> dict[int, Worker]:
        """Record any new descendants of the roots; return ``{pid: Worker}`` of all ever seen.

        Warm starts: the process a warm-start client stands for (forked by the helper) is recorded with the
        client's ``RANK`` and the client's parent as its parent, and its own descendants are followed; the
        client itself is recorded without a rank (it is killed with the rest, never sampled or asked for stacks).
        """
        found: dict[int, tuple[psutil.Process, int | None, int | None]] = {}  # pid -> (process, rank, parent)
        with self._lock:
            known = {pid for pid, w in self._seen.items() if w.rank is not None}
        pending = list(self.roots)
        while pending:
            top = pending.pop()
            try:
                below = top.children(recursive=True)
            except psutil.Error:
                below = []
            for proc in [top, *below]:
                if proc.pid in known:
                    continue
                is_client, child_pid, rank = warm_client_child(proc)
                if not is_client:
                    if proc is not top or top not in self.roots:
                        found.setdefault(proc.pid, (proc, _environ_rank(proc), None))
                    continue
                if proc is not top or top not in self.roots:
                    found[proc.pid] = (proc, None, None)
                if child_pid is not None and child_pid not in found:
                    with contextlib.suppress(psutil.Error):
                        child = psutil.Process(child_pid)
                        parent = None if proc in self.roots else proc.ppid()
                        found[child_pid] = (child, rank, parent)
                        if proc in self.roots:
                            self._agents.add(child_pid)
                        pending.append(child)
        with self._lock:
            for pid, (proc, rank, parent) in found.items():
                # A child seen between torchrun's fork and its exec still has torchrun's environment (no RANK):
                # read it again at the next refresh, or that rank would never be sampled or asked for its stack.
                if pid in self._seen and self._seen[pid].rank is not None:
                    continue
                self._seen[pid] = Worker(proc, rank)
                if parent is not None:
                    self._parent[pid] = parent
                else:
                    with contextlib.suppress(psutil.Error):
                        self._parent[pid] = proc.ppid()
            return dict(self._seen)

    def alive(self) -> list[Worker]:
        """Recorded descendants that still run (zombies excluded)."""
        with self._lock:
            workers = list(self._seen.values())
        return [w for w in workers if is_alive(w.process)]

    def rank_processes(self) -> dict[int, psutil.Process]:
        """``{rank: process}`` of the running training processes: the agents' direct children with a ``RANK``.

        A rank's own children (DataLoader workers) inherit ``RANK`` but are left out.
        """
        with self._lock:
            parents = dict(self._parent)
            roots = {root.pid for root in self.roots} | self._agents
        return {w.rank: w.process for w in self.alive()
                if w.rank is not None and parents.get(w.process.pid) in roots}

    def ranks_alive(self) -> list[int]:
        """Sorted ranks of worker processes (those with a ``RANK``) that still run."""
        return sorted({w.rank for w in self.alive() if w.rank is not None})

    def stop(self, popens, grace_s: float) -> int:
        """Stop the whole tree and reap the agents; return how many processes had to be killed.

        ``popens``: the torchrun ``Popen`` (or a list of them, one per simulated node). SIGTERM to each
        torchrun, wait up to ``grace_s`` for them to stop their workers and exit, then SIGKILL each
        torchrun's group and every recorded descendant still alive.
        """
        popens = list(popens) if isinstance(popens, (list, tuple)) else [popens]
        self.refresh()
        for popen in popens:
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in popens) and time.monotonic() < deadline:
            self.refresh()
            time.sleep(0.05)
        killed = 0
        for popen in popens:
            if popen.poll() is None:
                try:
                    os.killpg(popen.pid, signal.SIGKILL)  # torchrun runs in its own group (start_new_session)
                    killed += 1
                except (ProcessLookupError, PermissionError):
                    pass
        killed += self.kill_leftovers()
        for popen in popens:
            try:
                popen.wait(timeout=10)
            except Exception:  # noqa: BLE001 - never let cleanup raise over the real error
                log.warning("torchrun (pid %s) did not exit after SIGKILL", popen.pid)
        return killed

    def kill_leftovers(self) -> int:
        """SIGKILL every recorded descendant still alive (e.g. orphaned workers); return the count."""
        leftovers = self.alive()
        for w in leftovers:
            try:
                w.process.kill()
            except psutil.Error:
                pass
        wait_dead([w.process for w in leftovers], timeout_s=5)
        return len(leftovers)
