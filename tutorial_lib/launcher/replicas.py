"""torchft's lighthouse and replica groups, started from the kernel on this machine, killed and restarted on purpose.

torchft (https://pytorch.org/torchft/) trains through failures: each *replica group* is a torchrun job of its own,
and the groups find each other through a *lighthouse*, a small server that forms a quorum of the groups alive at each
step (a group whose heartbeats stop for ``heartbeat_timeout_ms`` is left out of the next quorum). Here:

* ``start_lighthouse(...)`` runs torchft's own server (``torchft.coordination.LighthouseServer``) in a process of
  its own (``tutorial_lib/child/lighthouse.py``) on 127.0.0.1 and a port the system picked, and returns once it accepts
  connections. ``torchft_lighthouse`` alone binds every interface (``[::]:29510``).
* ``start_replica_groups(script, lighthouse=..., num_groups=...)`` starts one torchrun job per group (the launcher's
  own torchrun command, ``plan.build_command``; each rank runs through the rank runner) with the environment torchft
  reads: ``TORCHFT_LIGHTHOUSE``, ``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS``. ``groups.kill(g)`` SIGKILLs every
  process of group ``g`` (its torchrun agent and its ranks, as a machine dying would), ``groups.restart(g)`` starts
  it again, ``groups.stop()`` stops them all.

Nothing is left behind: ``stop()`` on both, and both are context managers that stop on any exit, an error or a
KeyboardInterrupt included. A kernel that dies takes them along: each torchrun dies with the thread that started it
(``PR_SET_PDEATHSIG``, as ``launch`` does; so start groups from a thread that stays, such as the kernel's), each rank
with its torchrun (the rank runner), and the lighthouse exits when its stdin, a pipe from the kernel, closes.
Each group writes into ``<run_dir>/group<G>/attempt<A>/``: torchrun's own output (``torchrun.log``) and its
``--log-dir`` (``logs/``, each rank's stdout and stderr), and with ``observe=True`` what the observer saw each rank do
(``observed/``); the groups run in ``run_dir``, where the script writes its own files (ft_train.py's ``metrics/``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..child.protocol import set_parent_death_signal
from ..errors import ConfigError, LaunchError
from ..runs.replica_records import write_kill_record
from ..runs.rundir import observed_dir
from .devices import DevicePlan
from .environment import build_env, with_observer
from ..probes.ports import free_port
from .plan import LOOPBACK, build_command
from .processes import ProcessTree, is_alive, wait_dead

log = logging.getLogger(__name__)

LIGHTHOUSE_PROGRAM = Path(__file__).resolve().parent.parent / "child" / "lighthouse.py"
MAX_RANKS_PER_GROUP = 2  # this machine's cores; ft_train.py shards the model over 2 (HSDP)
TORCHRUN_LOG = "torchrun.log"


def _positive_int(name: str, value: object, *, low: int = 1, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        allowed = f"an int >= {low}" if high is None else f"an int from {low} to {high}"
        raise ConfigError(f"{name} must be {allowed}, got {value!r}")
    return value


@dataclass
class Lighthouse:
    """A running torchft lighthouse (``start_lighthouse``).

    Attributes:
        address: what the groups are given as ``TORCHFT_LIGHTHOUSE``, ``http://127.0.0.1:PORT``.
        port: its TCP port on 127.0.0.1.
        process: its process (``child/lighthouse.py``); its stdin is the pipe whose closing stops it.
        heartbeat_timeout_ms: how long a group may stay silent before the next quorum leaves it out (milliseconds).
        log_path: the file its own log lines go to (torchft's ``[INFO]`` quorum lines).
    """

    address: str
    port: int
    process: subprocess.Popen
    heartbeat_timeout_ms: int
    log_path: Path

    def alive(self) -> bool:
        """Whether the lighthouse process still runs."""
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the lighthouse, as a machine that dies would (the groups lose their quorum), and reap it."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()

    def stop(self, grace_s: float = 5.0) -> None:
        """Close its stdin (it shuts the server down and exits), then SIGKILL it after ``grace_s`` seconds; reap it.
        A no-op once it has exited."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> Lighthouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def lighthouse_command(*, min_replicas: int = 1, heartbeat_timeout_ms: int = 5000, join_timeout_ms: int = 1000,
                       quorum_tick_ms: int = 100, python: str | None = None) -> list[str]:
    """The argv of a lighthouse on 127.0.0.1 (``child/lighthouse.py``); pure.

    Args:
        min_replicas: replica groups a quorum needs (count, >= 1); 1 lets a lone group train on.
        heartbeat_timeout_ms: a group silent this long is left out of the next quorum (milliseconds, >= 1;
            torchft's default 5,000): how long the healthy groups stall after one dies.
        join_timeout_ms: how long a quorum waits for groups that heartbeat but have not asked to join (milliseconds,
            >= 0; torchft's default 60,000 suits clusters where a group takes a minute to start).
        quorum_tick_ms: how often a pending quorum is checked (milliseconds, >= 1).
        python: the interpreter (default: this one).

    Raises:
        ConfigError: a value out of range, naming it.
    """
    _positive_int("min_replicas", min_replicas)
    _positive_int("heartbeat_timeout_ms", heartbeat_timeout_ms)
    _positive_int("join_timeout_ms", join_timeout_ms, low=0)
    _positive_int("quorum_tick_ms", quorum_tick_ms)
    return [python or sys.executable, "-u", str(LIGHTHOUSE_PROGRAM), "--min-replicas", str(min_replicas),
            "--heartbeat-timeout-ms", str(heartbeat_timeout_ms), "--join-timeout-ms", str(join_timeout_ms),
            "--quorum-tick-ms", str(quorum_tick_ms)]


def start_lighthouse(log_path: str | os.PathLike, *, min_replicas: int = 1, heartbeat_timeout_ms: int = 5000,
                     join_timeout_ms: int = 1000, quorum_tick_ms: int = 100, ready_timeout_s: float = 30.0,
                     python: str | None = None) -> Lighthouse:
    """Start torchft's lighthouse on 127.0.0.1 and return once it accepts TCP connections.

    The settings are ``lighthouse_command``'s (torchft: ``torchft_lighthouse --help``). Its log lines go to
    ``log_path`` (created with its folder).

    Raises:
        ConfigError: a setting out of range, or ``ready_timeout_s`` not > 0.
        LaunchError: it exited before it was ready (torchft missing, say: its log's last lines are in the error), or
            was not ready within ``ready_timeout_s`` seconds (then it is stopped first).
    """
    command = lighthouse_command(min_replicas=min_replicas, heartbeat_timeout_ms=heartbeat_timeout_ms,
                                 join_timeout_ms=join_timeout_ms, quorum_tick_ms=quorum_tick_ms, python=python)
    if not ready_timeout_s > 0:
        raise ConfigError(f"ready_timeout_s must be > 0 (seconds), got {ready_timeout_s!r}")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        address = _read_address(process, command, log_path, time.monotonic() + ready_timeout_s)
        port = int(address.rsplit(":", 1)[1])
        _wait_accepting(process, port, command, log_path, time.monotonic() + ready_timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()
        raise
    process.stdout.close()
    return Lighthouse(address, port, process, heartbeat_timeout_ms, log_path)


def _lighthouse_failed(why: str, process: subprocess.Popen, command: list[str], log_path: Path) -> LaunchError:
    tail = log_path.read_text(errors="replace").splitlines()[-20:] if log_path.exists() else []
    return LaunchError(f"the lighthouse {why}; its log {log_path} ends: " + " | ".join(tail[-3:]),
                       run_dir=log_path.parent, command=command, returncode=process.poll(), output_tail=tail)


def _read_address(process: subprocess.Popen, command: list[str], log_path: Path, deadline: float) -> str:
    """The first line the lighthouse prints: its address."""
    fd = process.stdout.fileno()
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise _lighthouse_failed("printed no address in time", process, command, log_path)
        readable, _, _ = select.select([fd], [], [], min(left, 0.5))
        if readable:
            chunk = os.read(fd, 256)
            if not chunk:  # end of file: it exited
                process.wait()
                raise _lighthouse_failed(f"exited with code {process.returncode} before it was ready",
                                         process, command, log_path)
            line += chunk
    return line.decode().strip()


def _wait_accepting(process: subprocess.Popen, port: int, command: list[str], log_path: Path, deadline: float) -> None:
    """Until 127.0.0.1:``port`` accepts a connection (the state the groups need), or the deadline."""
    while True:
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=1.0):
            return
        if process.poll() is not None:
            raise _lighthouse_failed(f"exited with code {process.returncode} before it accepted connections",
                                     process, command, log_path)
        if time.monotonic() >= deadline:
            raise _lighthouse_failed(f"did not accept connections on port {port} in time", process, command, log_path)
        time.sleep(0.05)


def group_env(lighthouse_address: str, group_id: int, num_groups: int, nproc: int = 1,
              base: Mapping[str, str] | None = None, extra: Mapping[str, str] = ()) -> dict[str, str]:
    """The environment of one replica group's torchrun and ranks; pure (``os.environ`` is only read).

    ``build_env``'s (one thread per rank, loopback sockets) plus what torchft reads: ``TORCHFT_LIGHTHOUSE`` (the
    lighthouse's address), ``REPLICA_GROUP_ID`` and ``NUM_REPLICA_GROUPS`` (torchft's train_ddp.py reads these two
    to shard the data over the groups), then ``extra``.

    Raises:
        ConfigError: ``group_id`` outside ``0..num_groups-1``, or ``num_groups`` < 1.
    """
    _positive_int("num_groups", num_groups)
    _positive_int("group_id", group_id, low=0, high=num_groups - 1)
    env = build_env(DevicePlan("cpu", "gloo", nproc, 0), base=base)
    env.update(TORCHFT_LIGHTHOUSE=lighthouse_address, REPLICA_GROUP_ID=str(group_id),
               NUM_REPLICA_GROUPS=str(num_groups))
    env.update(extra)
    return env


@dataclass
class ReplicaGroup:
    """One start of one replica group: its torchrun job.

    Attributes:
        group_id: ``REPLICA_GROUP_ID``.
        attempt: 0 for the first start, 1 after the first restart, ...
        command: torchrun's argv.
        folder: ``<run_dir>/group<G>/attempt<A>``: ``torchrun.log`` and ``logs/``.
        popen: the torchrun process.
        tree: its processes, recorded as they appear (``ProcessTree``).
        killed_at_s: ``time.time()`` when ``kill`` SIGKILLed it (seconds since the epoch), else ``None``.
    """

    group_id: int
    attempt: int
    command: list[str]
    folder: Path
    popen: subprocess.Popen
    tree: ProcessTree
    killed_at_s: float | None = None

    def running(self) -> bool:
        """Whether torchrun or any rank of this start still runs (a zombie counts as ended)."""
        self.tree.refresh()
        return self.popen.poll() is None or bool(self.tree.alive())

    def ended_on_its_own(self) -> bool:
        """Whether its torchrun has exited without ``kill`` (a failure, or the script's end): what a wait stops at."""
        return self.popen.poll() is not None and self.killed_at_s is None

    def output_tail(self, lines: int = 5) -> list[str]:
        """The last ``lines`` lines of torchrun's own output (``torchrun.log``)."""
        path = self.folder / TORCHRUN_LOG
        return path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []


@dataclass
class ReplicaGroups:
    """The replica groups of one run (``start_replica_groups``): ``groups[g]`` is group ``g``'s latest start,
    ``history`` every start in order."""

    script: Path
    args: list[str]
    lighthouse: Lighthouse
    num_groups: int
    nproc_per_group: int
    run_dir: Path
    env: dict[str, str]
    shutdown_grace_s: float
    observe: bool = False
    groups: dict[int, ReplicaGroup] = field(default_factory=dict)
    history: list[ReplicaGroup] = field(default_factory=list)

    def _start(self, group_id: int) -> ReplicaGroup:
        attempt = sum(g.group_id == group_id for g in self.history)
        folder = self.run_dir / f"group{group_id}" / f"attempt{attempt}"
        folder.mkdir(parents=True, exist_ok=False)
        command = build_command(self.script, self.args, DevicePlan("cpu", "gloo", self.nproc_per_group, 0),
                                master_port=free_port(), log_dir=folder / "logs",
                                rendezvous_id=f"group{group_id}")
        env = group_env(self.lighthouse.address, group_id, self.num_groups, self.nproc_per_group,
                        extra={**self.env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": f"{self.shutdown_grace_s:g}"})
        env = with_observer(env, observed_dir(folder) if self.observe else None)  # each start's records of its own
        with open(folder / TORCHRUN_LOG, "wb") as out:  # a file, not a pipe: a SIGKILLed agent leaves no reader hanging
            popen = subprocess.Popen(command, cwd=self.run_dir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL))
        group = ReplicaGroup(group_id, attempt, command, folder, popen, ProcessTree(popen.pid))
        self.groups[group_id] = group
        self.history.append(group)
        return group

    def _group(self, group_id: int) -> ReplicaGroup:
        if group_id not in self.groups:
            raise ConfigError(f"group_id must be one of {sorted(self.groups)}, got {group_id!r}")
        return self.groups[group_id]

    def kill(self, group_id: int) -> float:
        """SIGKILL every process of group ``group_id`` at once (its torchrun and its ranks: no clean-up runs, as when
        its machine dies), reap them, and return the time of the kill (``time.time()``, seconds since the epoch).
        The start's folder gets a kill record (``runs.replica_records.KILL_RECORD``): the doctor names the kill.

        Raises:
            ConfigError: no such group.
        """
        group = self._group(group_id)
        group.tree.refresh()
        processes = [w.process for w in group.tree.alive()]
        with contextlib.suppress(psutil.Error):
            processes.append(psutil.Process(group.popen.pid))
        group.killed_at_s = time.time()
        write_kill_record(group.folder, "ReplicaGroups.kill", group.killed_at_s)
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.kill()
        wait_dead(processes, timeout_s=10)
        group.popen.wait(timeout=10)
        return group.killed_at_s

    def restart(self, group_id: int) -> ReplicaGroup:
        """Start group ``group_id`` again (a new torchrun job, the next attempt folder); it rejoins through the
        lighthouse and heals from a live group. A start still running is stopped first.

        Raises:
            ConfigError: no such group.
        """
        group = self._group(group_id)
        if group.running():
            group.tree.stop(group.popen, self.shutdown_grace_s)
        return self._start(group_id)

    def running(self) -> list[int]:
        """The ids of the groups whose latest start still runs, sorted."""
        return sorted(g for g, group in self.groups.items() if group.running())

    def wait(self, timeout_s: float, group_ids: Iterable[int] | None = None) -> dict[int, int | None]:
        """Wait until the latest start of every group in ``group_ids`` (default: all) has ended (``timeout_s`` seconds
        at most); return each group's torchrun exit code (``None``: a group not waited for that still runs).

        Raises:
            LaunchError: still running after ``timeout_s`` (nothing is stopped: call ``stop``).
        """
        deadline = time.monotonic() + timeout_s
        for group in (self.groups[g] for g in (self.groups if group_ids is None else group_ids)):
            try:
                group.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise LaunchError(f"replica group {group.group_id} still runs after {timeout_s:g} s",
                                  run_dir=self.run_dir, command=group.command, returncode=None) from None
        return {g: group.popen.poll() for g, group in self.groups.items()}

    def stop(self) -> int:
        """Stop every start of every group (SIGTERM to torchrun, ``shutdown_grace_s``, then SIGKILL to whatever
        remains); return how many processes had to be killed. The lighthouse is the caller's to stop."""
        running = [group for group in self.history if group.running()]
        for group in running:  # every torchrun stops its ranks at once, not one group after the other
            with contextlib.suppress(ProcessLookupError):
                group.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.shutdown_grace_s
        while any(g.popen.poll() is None for g in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        # what is left: each tree's SIGKILL (and a torchrun that ignored the SIGTERM gets another, then its grace)
        return sum(group.tree.stop(group.popen, self.shutdown_grace_s) for group in running)

    def __enter__(self) -> ReplicaGroups:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_replica_groups(script: str | os.PathLike, *, lighthouse: Lighthouse, num_groups: int,
                         run_dir: str | os.PathLike, args: Sequence[object] = (), nproc_per_group: int = 1,
                         env: Mapping[str, str] | None = None, shutdown_grace_s: float = 2.0,
                         observe: bool = False) -> ReplicaGroups:
    """Start ``num_groups`` replica groups of ``script``, each a torchrun job of ``nproc_per_group`` gloo ranks on this
    machine, all reporting to ``lighthouse``; return at once (they run in the background: ``kill``, ``restart``,
    ``wait``, ``stop``; ``with`` stops them on leaving the block however it is left).

    Args:
        script: the training script (torchft's ``Manager`` reads the environment ``group_env`` sets).
        lighthouse: a running lighthouse (``start_lighthouse``).
        num_groups: replica groups (count, >= 1).
        run_dir: the groups' working folder and where their logs go (``group<G>/attempt<A>/``), created if missing.
        args: the script's arguments.
        nproc_per_group: ranks per group (1 or 2 here; ft_train.py shards its model over 2: HSDP).
        env: extra variables for every group's torchrun and ranks.
        shutdown_grace_s: torchrun's SIGTERM-to-SIGKILL grace when a group is stopped (seconds, > 0).
        observe: run each rank with the observer (``run_script``'s ``observe=True``): every start writes what torch
            saw its ranks do into its own ``group<G>/attempt<A>/observed/`` (``read_observed(folder)``).

    Raises:
        ConfigError: a bad value, naming it; the script is missing; the lighthouse is not running.
    """
    _positive_int("num_groups", num_groups)
    _positive_int("nproc_per_group", nproc_per_group, high=MAX_RANKS_PER_GROUP)
    if not shutdown_grace_s > 0:
        raise ConfigError(f"shutdown_grace_s must be > 0 (seconds), got {shutdown_grace_s!r}")
    script = Path(script).resolve()
    if not script.is_file():
        raise ConfigError(f"script {str(script)!r} does not exist")
    if not lighthouse.alive():
        raise ConfigError(f"the lighthouse at {lighthouse.address} has exited (code {lighthouse.process.returncode}): "
                          "start_lighthouse() starts a new one")
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    groups = ReplicaGroups(script, [str(a) for a in args], lighthouse, num_groups, nproc_per_group, run_dir,
                           dict(env or {}), shutdown_grace_s, bool(observe))
    try:
        for group_id in range(num_groups):
            groups._start(group_id)
    except BaseException:
        groups.stop()
        raise
    return groups


def leftover_processes(groups: ReplicaGroups) -> list[psutil.Process]:
    """Every process any start of ``groups`` ever had that still runs (zombies excluded): empty after ``stop``."""
    left = []
    for group in groups.history:
        group.tree.refresh()
        left += [w.process for w in group.tree.alive()]
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(group.popen.pid)
            if is_alive(process):
                left.append(process)
    return left
