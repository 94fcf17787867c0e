"""A real two-node SLURM cluster on this machine, for the tests and for learners without a cluster.

Debian's ``slurm-wlm`` (22.05, munge included; ``apt-get install -y --no-install-recommends slurm-wlm``) starts no
service by itself. ``LocalCluster.up()`` writes a minimal ``slurm.conf`` on 127.0.0.1 into one state folder and
starts, each in the foreground in its own session and recorded in a PID file:

* ``munged -F`` with the folder's own key and socket (``AuthType=auth/munge``, ``AuthInfo=socket=...``);
* ``slurmctld -D -i``, the controller;
* two ``slurmd -D -N node<i>``: two nodes on one machine, each with its own ``Port`` (``NodeAddr=127.0.0.1``).

No accounting (``sacct`` is unavailable: read jobs with ``squeue``/``scontrol``), no cgroups
(``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``), no GPUs (no ``GresTypes``). Clients find the
cluster through ``SLURM_CONF`` (``export SLURM_CONF=<state folder>/slurm.conf``). ``down()`` cancels every job,
stops the daemons by their PIDs and checks that none of them, and no job step of this cluster, is left.

``up(owner_pid=PID)`` ties the cluster's life to that process (a kernel, a test run): a watchdog stops the cluster once
the owner is gone, however it ended (``tutorial_lib.slurm.owner``). Without an owner (``python -m tutorial_lib slurm
up``, ``make slurm``) it runs until ``down()``.

The daemons run as root (``slurmd`` starts each job as the user who submitted it); any user may then submit to
it. Sources: SLURM's "Quick Start Administrator Guide" and the slurm.conf(5), slurmd(8) (``-N``: several slurmd on
one host) and munged(8) man pages.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..errors import ConfigError, SlurmError, SlurmUnavailable
from ..probes.ports import free_ports
from .commands import INSTALL_HINT, cancel, node_states, queue, run_slurm
from .config import render_slurm_conf
from .owner import read_owner, record_owner, start_watchdog, stop_watchdog
from .processes import ProcessStamp, gone, terminate

logger = logging.getLogger(__name__)

STATE_DIR_ENV = "TUTORIAL_LIB_SLURM_DIR"
NODE_NAMES = ("node0", "node1")
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")  # slurmctld/slurmd/munged live there, often not on PATH
UNIX_PATH_MAX = 107  # bytes of an AF_UNIX socket path (108 with the terminating NUL)


def default_state_dir() -> Path:
    """``$TUTORIAL_LIB_SLURM_DIR`` if set, else ``$TMPDIR/tutorial_lib-slurm-<uid>`` (``/tmp`` by default).

    Not under the home folder: munged refuses a socket below a folder that others cannot search (``/root`` is
    ``drwx------``: "Socket is inaccessible: execute permissions for all required").
    """
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV])
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"tutorial_lib-slurm-{os.getuid()}"


def find_program(name: str) -> str | None:
    """The path of ``name`` on ``PATH`` or in the sbin folders (where Debian puts the daemons), else ``None``."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN_DIRS))


def check_can_run() -> dict[str, str]:
    """``{program: path}`` of the daemons and commands the local cluster needs.

    Raises:
        SlurmUnavailable: not root (the daemons start jobs as their users), or a program is missing; the message
            says what to run instead.
    """
    if os.geteuid() != 0:
        raise SlurmUnavailable(
            f"the local SLURM cluster runs its daemons as root (slurmd starts every job as the user who submitted "
            f"it), and this is uid {os.geteuid()}: start it with `sudo python -m tutorial_lib slurm up` (any user "
            "can then submit to it), or point SLURM_CONF at a real cluster")
    paths = {name: find_program(name) for name in PROGRAMS}
    missing = [name for name, path in paths.items() if path is None]
    if missing:
        raise SlurmUnavailable(f"SLURM is not installed ({', '.join(missing)} not found on PATH or in "
                               f"{', '.join(SBIN_DIRS)}): on Debian/Ubuntu run `{INSTALL_HINT}` (it starts no "
                               "service), then `python -m tutorial_lib slurm up`")
    return {name: str(path) for name, path in paths.items()}


def check_socket_folder(folder: Path) -> None:
    """munged's rules for the folder of its socket, checked before starting it.

    Raises:
        ConfigError: a folder above it cannot be searched by others (munged: "execute permissions for all
            required"), or the socket's path is longer than an AF_UNIX address allows.
    """
    folder = folder.resolve()
    for parent in [folder, *folder.parents]:
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            raise ConfigError(f"munged needs every folder above its socket to be searchable by all users, and "
                              f"{parent} is not (mode {stat.filemode(parent.stat().st_mode)}): choose a state "
                              f"folder under /tmp (--state-dir or {STATE_DIR_ENV})")
    if len(str(folder / "munge.socket").encode()) > UNIX_PATH_MAX:
        raise ConfigError(f"the munge socket path {folder / 'munge.socket'} is longer than {UNIX_PATH_MAX} bytes, "
                          f"the limit of a Unix socket: choose a shorter state folder (--state-dir or {STATE_DIR_ENV})")


@dataclass(frozen=True)
class Daemon:
    """One started daemon, as its PID file records it: ``name`` (``munged``, ``slurmctld``, ``slurmd-node0``...),
    ``pid``, ``create_time`` (psutil's, which tells it from a later process that reuses the PID) and ``argv``."""

    name: str
    pid: int
    create_time: float
    argv: tuple[str, ...]

    def process(self) -> psutil.Process | None:
        """The running process, or ``None`` if it has exited (a zombie counts as exited)."""
        return ProcessStamp(self.pid, self.create_time).process()


_STARTED: dict[int, subprocess.Popen] = {}  # daemons this process started: waited for (reaped) by down()


@dataclass(frozen=True)
class LocalCluster:
    """The local cluster whose state lives in ``state_dir`` (``slurm.conf``, munge key and socket, PID files, logs).

    ``up()`` starts it (or says it is already up), ``down()`` stops it, ``status()`` describes it; ``conf`` is
    the ``SLURM_CONF`` its clients need.
    """

    state_dir: Path

    @classmethod
    def default(cls, state_dir: str | os.PathLike | None = None) -> LocalCluster:
        """The cluster in ``state_dir``, else in ``default_state_dir()``."""
        return cls(Path(state_dir or default_state_dir()).absolute())

    @property
    def conf(self) -> Path:
        """The generated ``slurm.conf``: what ``SLURM_CONF`` must point at."""
        return self.state_dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        """This cluster's munged socket (``AuthInfo=socket=...`` in ``slurm.conf``)."""
        return self.state_dir / "munge" / "munge.socket"

    @property
    def log_dir(self) -> Path:
        """The daemons' logs (their stdout and stderr): ``munged.log``, ``slurmctld.log``, ``slurmd-node0.log``..."""
        return self.state_dir / "log"

    def export_line(self) -> str:
        """The shell line that points SLURM's commands (sbatch, squeue, srun...) at this cluster."""
        return f"export SLURM_CONF={self.conf}"

    # --- PID files ---------------------------------------------------------------------------------------------

    def daemons(self) -> list[Daemon]:
        """The daemons recorded in the PID files (``run/*.json``), alive or not."""
        found = []
        for path in sorted((self.state_dir / "run").glob("*.json")):
            try:
                record = json.loads(path.read_text())
                found.append(Daemon(record["name"], int(record["pid"]), float(record["create_time"]),
                                    tuple(record["argv"])))
            except (OSError, ValueError, KeyError) as e:
                logger.warning("ignoring unreadable PID file %s: %s", path, e)
        return found

    def _record(self, name: str, proc: subprocess.Popen, argv: Sequence[str]) -> Daemon:
        try:
            create_time = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:  # exited (and reaped) at once: _wait reports it, with its log
            create_time = 0.0
        daemon = Daemon(name, proc.pid, create_time, tuple(argv))
        (self.state_dir / "run" / f"{name}.json").write_text(json.dumps(
            {"name": name, "pid": daemon.pid, "create_time": daemon.create_time, "argv": list(argv)}))
        _STARTED[proc.pid] = proc
        return daemon

    def is_up(self) -> bool:
        """Whether every daemon of the PID files runs (munged, slurmctld and one slurmd per node) and slurmctld
        answers."""
        names = {d.name for d in self.daemons() if d.process() is not None}
        if names != {"munged", "slurmctld", *(f"slurmd-{n}" for n in NODE_NAMES)}:
            return False
        try:
            node_states(conf=self.conf)
            return True
        except SlurmError:
            return False

    @contextmanager
    def _locked(self):
        """Hold the state folder's lock: one ``up`` or ``down`` at a time (two test sessions, a notebook)."""
        if not self.state_dir.exists():
            self.state_dir.mkdir(parents=True)
            os.chmod(self.state_dir, 0o755)  # munged: others must be able to search the folders above its socket
        with open(self.state_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # --- up ----------------------------------------------------------------------------------------------------

    def owner(self) -> ProcessStamp | None:
        """The process whose end stops this cluster (``up``'s ``owner_pid``), alive or not; ``None``: nobody's."""
        return read_owner(self.state_dir)

    def owner_gone(self) -> bool:
        """Whether this cluster has an owner and it has ended (its watchdog is stopping the cluster, or was killed)."""
        owner = self.owner()
        return owner is not None and not owner.alive()

    def owner_line(self) -> str:
        """One line: whose the cluster is, and what stops it."""
        owner = self.owner()
        if owner is None:
            return "owner: nobody (started by `python -m tutorial_lib slurm up`): it runs until `slurm down`"
        if not owner.alive():
            return (f"owner: pid {owner.pid}, which has ended: its watchdog stops the cluster, else the next "
                    "connect_slurm() or `slurm up` starts it afresh")
        return f"owner: pid {owner.pid}: a watchdog stops the cluster once that process ends"

    def up(self, *, timeout_s: float = 120.0, owner_pid: int | None = None) -> bool:
        """Start the cluster and wait until both nodes are idle; ``False`` if it was already up (nothing started).

        A partly running cluster (a daemon died), or one whose owner has ended, is stopped first (its jobs
        cancelled), then started again.

        Args:
            timeout_s: the longest wait for the daemons to answer and the nodes to register, in seconds.
            owner_pid: the process whose end stops the cluster (``os.getpid()``: this one): a watchdog started with
                the daemons stops them within seconds once that process is gone, SIGKILL included. ``None``: nobody's,
                it runs until ``down()``. A cluster already up keeps its owner.

        Raises:
            SlurmUnavailable: not root, or SLURM is not installed (the message says what to do).
            ConfigError: the state folder breaks munged's rules (see ``check_socket_folder``), or ``owner_pid``
                names no running process.
            SlurmError: a daemon exited or the nodes did not become idle in time; everything started is stopped
                again and the daemons' last log lines are in the message.
        """
        programs = check_can_run()
        owner = ProcessStamp.of(owner_pid) if owner_pid is not None else None
        with self._locked():
            if self.is_up() and not self.owner_gone():
                return False
            if self.owner_gone():
                logger.warning("the local SLURM cluster in %s belonged to pid %d, which has ended: stopping what is "
                               "left of it and starting it afresh", self.state_dir, self.owner().pid)
                self._cancel_jobs(timeout_s=30.0)
            self._stop_all(timeout_s=30.0)  # leftovers of a partial start, a crash or an owner that ended
            self._prepare()
            record_owner(self.state_dir, owner)
            try:
                if owner is not None:  # before the daemons: an owner killed during the start is covered too
                    start_watchdog(self.state_dir, owner)
                self._start(programs, timeout_s=timeout_s)
            except BaseException:
                self._stop_all(timeout_s=30.0)
                raise
            return True

    def _prepare(self) -> None:
        """Folders, the munge key (kept across ups) and a fresh ``slurm.conf`` with free ports."""
        for sub in ("munge", "log", "ctld", "spool", "run"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir / "munge", 0o755)  # munged: the socket's folder searchable by all, not writable
        check_socket_folder(self.state_dir / "munge")
        for stale in ("munge.socket", "munge.socket.lock"):  # left by a munged that was killed: not a live one
            (self.state_dir / "munge" / stale).unlink(missing_ok=True)
        key = self.state_dir / "munge" / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # munged refuses a key others can read
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
        for node in NODE_NAMES:
            (self.state_dir / "spool" / node).mkdir(exist_ok=True)
        ports = free_ports(1 + len(NODE_NAMES))
        self.conf.write_text(render_slurm_conf(
            self.state_dir, controller_port=ports[0], node_ports=dict(zip(NODE_NAMES, ports[1:])),
            cpus_per_node=os.cpu_count() or 1, munge_socket=self.munge_socket))
        os.chmod(self.conf, 0o644)

    def _spawn(self, name: str, argv: list[str]) -> Daemon:
        """Start one daemon in the foreground, in its own session, its output in ``log/<name>.log``."""
        env = {**os.environ, "SLURM_CONF": str(self.conf)}  # slurmstepd inherits it: how down() finds job steps
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, close_fds=True)
        return self._record(name, proc, argv)

    def _start(self, programs: dict[str, str], *, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        munge = self.state_dir / "munge"
        munged = self._spawn("munged", [
            programs["munged"], "-F", f"--key-file={munge / 'munge.key'}", f"--socket={self.munge_socket}",
            f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged to create its socket", [munged], deadline)
        controller = self._spawn("slurmctld", [programs["slurmctld"], "-D", "-i", "-f", str(self.conf)])
        self._wait(self._answers, "slurmctld to answer", [munged, controller], deadline)
        nodes = [self._spawn(f"slurmd-{node}", [programs["slurmd"], "-D", "-f", str(self.conf), "-N", node])
                 for node in NODE_NAMES]
        self._wait(self._nodes_idle, f"nodes {', '.join(NODE_NAMES)} to be idle", [munged, controller, *nodes],
                   deadline)

    def _answers(self) -> bool:
        if not self.conf.is_file():  # scontrol would retry for 60 s ("cannot stat file ... retrying in 1sec")
            return False
        try:
            run_slurm(["scontrol", "ping"], conf=self.conf, timeout_s=10)
            return True
        except SlurmError:
            return False

    def _nodes_idle(self) -> bool:
        try:
            states = node_states(conf=self.conf)
        except SlurmError:
            return False
        return all(states.get(node) == "idle" for node in NODE_NAMES)

    def _wait(self, ready, what: str, daemons: list[Daemon], deadline: float) -> None:
        """Poll ``ready()`` until true; raise naming ``what`` if a daemon exits or the deadline passes."""
        delay_s = 0.05
        while not ready():
            dead = [d for d in daemons if d.process() is None]
            if dead or time.monotonic() > deadline:
                cause = (f"{', '.join(d.name for d in dead)} exited" if dead else
                         "the time ran out" + (f" (nodes: {self._node_states_text()})" if "nodes" in what else ""))
                names = [d.name for d in dead] or [d.name for d in daemons]
                raise SlurmError(f"the local SLURM cluster in {self.state_dir} did not start: waiting for {what}, "
                                 f"{cause}. Logs: {self.log_dir}", stderr=self._log_tails(names))
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.5)

    def _node_states_text(self) -> str:
        try:
            return ", ".join(f"{k} {v}" for k, v in node_states(conf=self.conf).items())
        except SlurmError as e:
            return f"sinfo failed: {e}"

    def _log_tails(self, names: Sequence[str], lines: int = 8) -> str:
        out = []
        for name in names:
            path = self.log_dir / f"{name}.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out += [f"{path.name}:", *("  " + line for line in tail)]
        return "\n".join(out)

    # --- down --------------------------------------------------------------------------------------------------

    def down(self, *, timeout_s: float = 60.0, if_owner: ProcessStamp | None = None) -> list[Daemon]:
        """Cancel every job, stop the daemons by their PIDs and the watchdog, forget the owner, and return the
        daemons that were running.

        Args:
            timeout_s: the longest wait for each job to end and each daemon to exit after SIGTERM, in seconds
                (then SIGKILL).
            if_owner: stop only if the cluster still belongs to this process (the watchdog's stop: a cluster started
                afresh meanwhile by another owner is left alone, and ``[]`` returned).

        Raises:
            SlurmUnavailable: daemons run and this is not root (they run as root).
            SlurmError: a daemon or job step of this cluster is still alive afterwards (listed by PID).
        """
        if not self.state_dir.is_dir():
            return []
        if os.geteuid() != 0 and any(d.process() is not None for d in self.daemons()):
            raise SlurmUnavailable(f"the local SLURM cluster in {self.state_dir} runs as root: stop it with "
                                   "`sudo python -m tutorial_lib slurm down`")
        with self._locked():
            if if_owner is not None and self.owner() != if_owner:
                return []
            self._cancel_jobs(timeout_s=timeout_s)
            return self._stop_all(timeout_s=timeout_s)

    def _cancel_jobs(self, *, timeout_s: float) -> None:
        if self._answers():
            for job in queue(conf=self.conf):
                cancel(job.job_id, conf=self.conf, timeout_s=timeout_s)

    def _stop_all(self, *, timeout_s: float) -> list[Daemon]:
        """The daemons (``_stop_daemons``), then the watchdog; the owner forgotten. Returns the running daemons."""
        try:
            return self._stop_daemons(timeout_s=timeout_s)
        finally:
            stop_watchdog(self.state_dir)
            record_owner(self.state_dir, None)

    def job_steps(self) -> list[psutil.Process]:
        """The ``slurmstepd`` processes of this cluster's jobs (they carry its ``SLURM_CONF`` in their environment)
        and the processes below them."""
        found = []
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] != "slurmstepd":
                continue
            try:
                if proc.environ().get("SLURM_CONF") == str(self.conf):
                    found += [proc, *proc.children(recursive=True)]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def leftovers(self) -> list[psutil.Process]:
        """Processes of this cluster still alive: the recorded daemons, processes of their sessions (slurmctld's
        ``slurmscriptd``) and job steps. ``[]`` after a clean ``down``."""
        daemons = [d for d in self.daemons() if d.process() is not None]
        sessions = {d.pid for d in self.daemons()}
        found = {p.pid: p for d in daemons for p in [d.process()] if p is not None}
        for proc in psutil.process_iter(["status", "name"]):
            try:  # by name too: a later, unrelated session may reuse a dead daemon's PID as its id
                if (proc.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(proc.pid) in sessions
                        and proc.info["name"].startswith(("slurm", "munge"))):
                    found.setdefault(proc.pid, proc)
            except (OSError, psutil.Error):
                continue
        for proc in self.job_steps():
            found.setdefault(proc.pid, proc)
        return list(found.values())

    def _stop_daemons(self, *, timeout_s: float) -> list[Daemon]:
        """SIGTERM the job steps, the slurmd's, slurmctld and munged (in that order), SIGKILL what is left after
        ``timeout_s``, reap the ones this process started, and remove the PID files."""
        recorded = self.daemons()
        running = [d for d in recorded if d.process() is not None]
        order = [*self.job_steps(), *(p for d in sorted(running, key=_stop_rank) for p in [d.process()] if p)]
        for proc in order:
            terminate(proc, timeout_s=timeout_s)
        survivors = self.leftovers()
        for proc in survivors:  # a session's other processes (slurmscriptd), or steps started meanwhile
            terminate(proc, timeout_s=timeout_s)
        for d in recorded:
            popen = _STARTED.pop(d.pid, None)
            if popen is not None:
                popen.poll()
            (self.state_dir / "run" / f"{d.name}.json").unlink(missing_ok=True)
        left = [p for p in survivors if not gone(p)]
        if left:
            raise SlurmError(f"processes of the local SLURM cluster in {self.state_dir} are still alive after "
                             f"SIGKILL: {[(p.pid, p.name()) for p in left]}")
        return running

    # --- status ------------------------------------------------------------------------------------------------

    def status(self) -> str:
        """What ``python -m tutorial_lib slurm status`` prints: up or down, the state folder, the ``SLURM_CONF``
        line, the daemons' PIDs, whose the cluster is (``owner_line``) and ``sinfo``'s view of the nodes."""
        lines = [f"state folder: {self.state_dir}"]
        if not self.is_up():
            running = [d for d in self.daemons() if d.process() is not None]
            lines.insert(0, "local SLURM cluster: down" + (
                f" (partly running: {', '.join(f'{d.name} {d.pid}' for d in running)}; "
                "`python -m tutorial_lib slurm down` stops them)" if running else ""))
            lines.append("start it: python -m tutorial_lib slurm up (or make slurm)")
            return "\n".join(lines)
        lines.insert(0, "local SLURM cluster: up")
        lines.append("daemons: " + ", ".join(f"{d.name} (pid {d.pid})" for d in self.daemons()))
        lines.append(self.owner_line())
        lines.append(self.export_line())
        lines.append(run_slurm(["sinfo", "-N", "-o", "%N %P %T %c %O"], conf=self.conf).rstrip())
        return "\n".join(lines)


def _stop_rank(daemon: Daemon) -> int:
    """Stop order: the nodes first (their jobs end), then the controller, munged last (the others use it)."""
    return 0 if daemon.name.startswith("slurmd") else 1 if daemon.name == "slurmctld" else 2
