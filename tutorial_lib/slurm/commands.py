"""SLURM's own client commands, for a launcher: submit a batch script, read a job's state, its pending reason and
nodes, wait for a state, cancel. Each call runs one command (``sbatch``, ``squeue``, ``scontrol``, ``scancel``,
``sinfo``) as a subprocess without a shell, with ``SLURM_CONF`` passed explicitly when ``conf`` is given (the
local cluster's ``slurm.conf``; ``None``: the environment's ``SLURM_CONF``, else the system's configuration).

``sacct`` is not used: it needs SLURM's accounting database, which small clusters (and the local one) do not run.
A finished job stays visible to ``squeue --states=all`` and ``scontrol show job`` for ``MinJobAge`` (300 s by
default), which is when these functions read its final state.

Sources: the man pages of sbatch (``--parsable``), squeue (``--states``, ``-o`` fields and the JOB STATE CODES),
scontrol (``show job``, ``show hostnames``) and scancel: https://slurm.schedmd.com/man_index.html
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path

from ..errors import ConfigError, JobWaitTimeout, SlurmError, SlurmUnavailable
from ..i18n import N_, Message

INSTALL_HINT = "apt-get install -y --no-install-recommends slurm-wlm"


class JobState(str, Enum):
    """A job's state as ``squeue -o %T`` prints it (squeue(1), JOB STATE CODES)."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"  # the job ended and SLURM is still stopping its processes
    STAGE_OUT = "STAGE_OUT"
    SIGNALING = "SIGNALING"
    RESIZING = "RESIZING"
    REQUEUED = "REQUEUED"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STOPPED = "STOPPED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REVOKED = "REVOKED"

    @property
    def finished(self) -> bool:
        """Whether the job is over and its processes are gone (``COMPLETING`` is not: they are being stopped)."""
        return self in FINISHED_STATES


class NeverStarts(str, Enum):
    """A pending reason (squeue's ``%r``, squeue(1) JOB REASON CODES; ``PartitionConfig`` is in SLURM 22.05's
    ``job_reason_string`` but not its man page) after which the job does not start as it was submitted, whatever
    else the cluster runs: only a change of the request (or of the cluster's configuration) lets it start. SLURM keeps
    such a job ``PENDING`` until someone cancels it; the launcher does so at once (``scancel``).

    Reasons that clear by themselves are not members: ``Resources`` and ``Priority`` (other jobs hold the nodes),
    ``ReqNodeNotAvail`` (the node may be in use or reserved), ``NodeDown``, ``PartitionDown``, ``JobHeldUser``,
    ``Dependency``, ``BeginTime`` and the ``*Grp*Limit`` reasons (a running job ends, an administrator acts).
    """

    PARTITION_CONFIG = "PartitionConfig"  # no node of the partition can hold what it asks per node (CPUs, memory)
    PARTITION_NODE_LIMIT = "PartitionNodeLimit"  # more nodes than its partition has (or allows)
    PARTITION_TIME_LIMIT = "PartitionTimeLimit"  # a --time above the partition's MaxTime
    BAD_CONSTRAINTS = "BadConstraints"  # no node has the --constraint features
    INVALID_ACCOUNT = "InvalidAccount"
    INVALID_QOS = "InvalidQOS"
    DEPENDENCY_NEVER_SATISFIED = "DependencyNeverSatisfied"


NO_REASON_YET = "None"  # squeue's %r for a job the scheduler has not looked at yet (and for a running job)


FINISHED_STATES = frozenset({JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED, JobState.TIMEOUT,
                             JobState.NODE_FAIL, JobState.PREEMPTED, JobState.BOOT_FAIL, JobState.DEADLINE,
                             JobState.OUT_OF_MEMORY, JobState.REVOKED})


@dataclass(frozen=True)
class JobInfo:
    """One job as SLURM reports it.

    Attributes:
        job_id: SLURM's job id.
        state: its ``JobState``.
        reason: why it waits or ended (squeue's ``%r``: ``None``, ``Resources``, ``JobHeldUser``,
            ``NonZeroExitCode``, ...).
        nodes: its node list in SLURM's compressed form (``node[0-1]``; ``""`` while pending); ``job_nodes`` expands it.
        node_count: nodes allocated (or requested, while pending).
        exit_code, signal: the batch script's exit status and the signal that ended it, from ``scontrol show job``'s
            ``ExitCode=code:signal``, once the job has finished; ``None`` before.
        never_starts: the ``NeverStarts`` member of a ``PENDING`` job's reason (it cannot start as submitted), else
            ``None``.
    """

    job_id: int
    state: JobState
    reason: str
    nodes: str
    node_count: int
    exit_code: int | None = None
    signal: int | None = None
    never_starts: NeverStarts | None = None

    @property
    def waiting_for(self) -> str:
        """Why a ``PENDING`` job waits (``"Resources"``, ``"Priority"``, ``"PartitionConfig"``, ...); ``""`` while
        the scheduler has given no reason yet, and for a job that is not pending."""
        return self.reason if self.state == JobState.PENDING and self.reason != NO_REASON_YET else ""


@dataclass(frozen=True)
class SlurmJob:
    """A launch's SLURM job as the launcher last saw it.

    Attributes:
        job_id: SLURM's job id.
        state: its last ``JobState`` value (``"COMPLETED"``, ``"FAILED"``, ``"CANCELLED"``, ...).
        reason: squeue's reason (why it waited, or how it ended: ``"None"``, ``"NonZeroExitCode"``,
            ``"PartitionNodeLimit"``, ...).
        nodes: the allocated nodes' names in SLURM's order (``()`` if it never ran): node ``N`` (``$SLURM_NODEID``)
            is ``nodes[N]``, its torchrun's output ``<job>-<id>-node<N>.out``, its ranks' logs ``logs/node<N>/``.
        node_ranks: ``{N: global ranks}`` whose folders node N's torchrun log directory holds (``logs/node<N>/``,
            each named by the rank runner's record): the ranks it ran.
        exit_code, signal: the batch script's ``ExitCode=code:signal`` once finished (``None`` before).
        waited_for: the last reason squeue gave while the job was pending (``"Resources"``, ``"Priority"``,
            ``"PartitionNodeLimit"``: more nodes than the partition has, ...); ``""`` if it gave none.
        never_starts: the ``NeverStarts`` reason for which the launcher cancelled the pending job (it could not
            start as submitted), else ``None``.
    """

    job_id: int
    state: str
    reason: str
    nodes: tuple[str, ...] = ()
    node_ranks: dict[int, list[int]] = field(default_factory=dict)
    exit_code: int | None = None
    signal: int | None = None
    waited_for: str = ""
    never_starts: NeverStarts | None = None

    @property
    def node_count(self) -> int:
        """Nodes the job ran on."""
        return len(self.nodes)

    def as_dict(self) -> dict:
        """The job as ``run.json``'s ``slurm_job``."""
        return asdict(self) | {"nodes": list(self.nodes)}

    def where_it_was(self) -> Message:
        """What the job was doing when it was cancelled, worded when shown: ``"it ran on node0, node1"``, ``"it waited
        in the queue (Resources)"``."""
        if self.nodes:
            return Message(N_("it ran on {nodes}"), {"nodes": ", ".join(self.nodes)})
        if self.waited_for:
            return Message(N_("it waited in the queue ({reason})"), {"reason": self.waited_for})
        return Message(N_("it waited in the queue"))


def client_env(conf: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a SLURM client command: ``env`` (default: this process's) with ``SLURM_CONF`` set to
    ``conf`` when given; the caller's ``os.environ`` is never changed."""
    result = dict(os.environ if env is None else env)
    if conf is not None:
        result["SLURM_CONF"] = str(conf)
    return result


def run_slurm(argv: Sequence[str], *, conf: str | os.PathLike | None = None, env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike | None = None, timeout_s: float = 60.0) -> str:
    """Run one SLURM client command (no shell) and return its stdout.

    Args:
        argv: the command, e.g. ``["squeue", "-h"]``.
        conf: the ``slurm.conf`` the command reads (``SLURM_CONF``); ``None``: the environment's or the system's.
        env: the environment to start from (default: this process's).
        cwd: its working directory.
        timeout_s: how long to wait for an answer, in seconds.

    Raises:
        SlurmUnavailable: the command is not installed.
        SlurmError: it exited with a non-zero status (its command, status and stderr attached), or did not answer
            within ``timeout_s``.
    """
    argv = [str(a) for a in argv]
    where = f" (SLURM_CONF={conf})" if conf is not None else ""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=client_env(conf, env), cwd=cwd,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError as e:
        raise SlurmUnavailable(f"{argv[0]!r} is not installed: install SLURM's commands ({INSTALL_HINT} on "
                               "Debian/Ubuntu) or run on a machine that has them", command=argv) from e
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"{shlex.join(argv)} did not answer within {timeout_s:g} s{where}: is slurmctld running? "
                         "(python -m tutorial_lib slurm status)", command=argv) from e
    if proc.returncode != 0:
        raise SlurmError(f"{shlex.join(argv)} failed with exit status {proc.returncode}{where}: "
                         f"{proc.stderr.strip() or proc.stdout.strip()}", command=argv, returncode=proc.returncode,
                         stderr=proc.stderr.strip())
    return proc.stdout


def submit(script: str | os.PathLike, sbatch_args: Sequence[object] = (), *, conf: str | os.PathLike | None = None,
           env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None) -> int:
    """Submit a batch script with ``sbatch --parsable`` and return its job id.

    Args:
        script: the batch script (its ``#SBATCH`` lines are its options).
        sbatch_args: more sbatch options, before the script (they override its ``#SBATCH`` lines).
        conf, env: as ``run_slurm``. sbatch copies the submitting environment into the job (``--export=ALL``,
            its default), so ``PATH`` must find the nodes' ``torchrun``.
        cwd: where sbatch runs: the job's working folder unless the script sets ``--chdir``.

    Raises:
        ConfigError: ``script`` is not a file.
        SlurmError: sbatch refused the job (its message says why: a bad option, more nodes than exist, ...).
    """
    if not Path(script).is_file():
        raise ConfigError(f"no batch script at {str(script)!r}: write it first (tl.slurm.slurm_script)")
    out = run_slurm(["sbatch", "--parsable", *map(str, sbatch_args), str(script)], conf=conf, env=env, cwd=cwd)
    first = out.strip().split(";")[0]  # "<id>" or "<id>;<cluster>"
    if not first.isdigit():
        raise SlurmError(f"sbatch --parsable printed {out.strip()!r}, not a job id", command=["sbatch", str(script)])
    return int(first)


SQUEUE_FORMAT = "%i|%T|%r|%N|%D"  # job id | state | reason | node list | node count


def parse_squeue_line(line: str) -> JobInfo:
    """One ``squeue -o SQUEUE_FORMAT`` line as a ``JobInfo``; pure.

    Raises:
        SlurmError: the line does not have the five fields, or names a state this module does not know.
    """
    fields = line.strip().split("|")
    if len(fields) != 5 or not fields[0].isdigit():
        raise SlurmError(f"unexpected squeue line {line!r} (format {SQUEUE_FORMAT!r})")
    job_id, state, reason, nodes, count = fields
    try:
        job_state = JobState(state)
    except ValueError as e:
        raise SlurmError(f"job {job_id} is in state {state!r}, which tutorial_lib does not know "
                         f"(known: {', '.join(s.value for s in JobState)})") from e
    never = NeverStarts(reason) if job_state == JobState.PENDING and reason in _NEVER_STARTS else None
    return JobInfo(int(job_id), job_state, reason, nodes, int(count) if count.isdigit() else 0, never_starts=never)


_NEVER_STARTS = frozenset(r.value for r in NeverStarts)


def parse_exit_code(scontrol_text: str) -> tuple[int, int] | None:
    """``(exit_code, signal)`` from ``scontrol show job``'s ``ExitCode=1:0``; ``None`` if absent; pure."""
    match = re.search(r"\bExitCode=(\d+):(\d+)", scontrol_text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def job_info(job_id: int, *, conf: str | os.PathLike | None = None) -> JobInfo | None:
    """The job's state, pending reason and nodes (``squeue --states=all -j ID``), with its exit code once finished
    (``scontrol show job``); ``None`` if slurmctld does not know the job (never submitted, or purged
    ``MinJobAge`` seconds after it ended).

    Raises:
        SlurmError: squeue failed for another reason (slurmctld not answering, ...).
    """
    try:
        out = run_slurm(["squeue", "-h", "--states=all", "-j", str(int(job_id)), "-o", SQUEUE_FORMAT], conf=conf)
    except SlurmError as e:
        if "Invalid job id" in e.stderr:
            return None
        raise
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        return None
    info = parse_squeue_line(lines[0])
    if info.state.finished:
        code = parse_exit_code(run_slurm(["scontrol", "show", "job", "-o", str(info.job_id)], conf=conf))
        if code is not None:
            info = replace(info, exit_code=code[0], signal=code[1])
    return info


def queue(*, conf: str | os.PathLike | None = None) -> list[JobInfo]:
    """Every job in the queue as ``squeue`` lists it by default: pending, running, completing (all users)."""
    out = run_slurm(["squeue", "-h", "-o", SQUEUE_FORMAT], conf=conf)
    return [parse_squeue_line(line) for line in out.splitlines() if line.strip()]


def expand_hostlist(hostlist: str, *, conf: str | os.PathLike | None = None) -> list[str]:
    """``node[0-1]`` -> ``["node0", "node1"]``, with ``scontrol show hostnames`` (SLURM's own hostlist syntax)."""
    if not hostlist:
        return []
    return run_slurm(["scontrol", "show", "hostnames", hostlist], conf=conf).split()


def job_nodes(job_id: int, *, conf: str | os.PathLike | None = None) -> list[str]:
    """The names of the job's nodes, in SLURM's order (the first hosts the batch script and the rendezvous);
    ``[]`` while it is pending.

    Raises:
        SlurmError: slurmctld does not know the job.
    """
    info = job_info(job_id, conf=conf)
    if info is None:
        raise SlurmError(f"job {job_id} is not known to slurmctld (never submitted, or purged after it ended)")
    return expand_hostlist(info.nodes, conf=conf)


def node_cpus(*, conf: str | os.PathLike | None = None, partition: str | None = None) -> dict[str, int]:
    """``{node name: CPUs}`` of the nodes of ``partition`` (``None``: every partition), from ``sinfo -N -o %N|%c``:
    what each node offers to ``--cpus-per-task``.

    Raises:
        SlurmError: sinfo failed (slurmctld not answering, an unknown partition, ...).
    """
    out = run_slurm(["sinfo", "-h", "-N", *(["-p", partition] if partition else []), "-o", "%N|%c"], conf=conf)
    return parse_node_cpus(out)


def parse_node_cpus(sinfo_text: str) -> dict[str, int]:
    """``{node name: CPUs}`` from ``sinfo -h -N -o %N|%c`` output (``node0|2`` per line; a node listed in several
    partitions appears once); pure."""
    return {name: int(cpus) for name, cpus in (line.split("|", 1) for line in sinfo_text.splitlines() if "|" in line)
            if cpus.strip().isdigit()}


def node_states(*, conf: str | os.PathLike | None = None) -> dict[str, str]:
    """``{node name: state}`` from ``sinfo -N`` (``idle``, ``allocated``, ``mixed``, ``down*``, ...)."""
    out = run_slurm(["sinfo", "-h", "-N", "-o", "%N|%T"], conf=conf)
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def _states(states: Iterable[JobState | str]) -> frozenset[JobState]:
    try:
        return frozenset(JobState(s) for s in states)
    except ValueError as e:
        raise ConfigError(f"{e}: states must be JobState values ({', '.join(s.value for s in JobState)})") from e


def wait_for_state(job_id: int, states: Iterable[JobState | str], *, timeout_s: float,
                   conf: str | os.PathLike | None = None, poll_s: float = 1.0) -> JobInfo:
    """Poll ``squeue`` until the job is in one of ``states``; return what it reported then.

    Polls every ``poll_s`` seconds (the first few looks sooner), so a long wait costs slurmctld one query a second.

    Args:
        job_id: the job.
        states: the states to wait for, e.g. ``{JobState.RUNNING}`` or ``FINISHED_STATES``.
        timeout_s: the longest wait, in seconds (> 0).
        conf: as ``run_slurm``.
        poll_s: seconds between looks (> 0).

    Raises:
        JobWaitTimeout: the job was not in ``states`` after ``timeout_s``; names the job, its last state and reason.
        SlurmError: the job finished in another state (it can never reach ``states``), or slurmctld does not
            know it.
    """
    wanted = _states(states)
    for name, value in (("timeout_s", timeout_s), ("poll_s", poll_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
    names = "/".join(sorted(s.value for s in wanted))
    deadline = time.monotonic() + timeout_s
    delay_s = min(0.2, poll_s)
    while True:
        info = job_info(job_id, conf=conf)
        if info is None:
            raise SlurmError(f"job {job_id} is not known to slurmctld while waiting for {names} "
                             "(never submitted, or purged after it ended)")
        if info.state in wanted:
            return info
        if info.state.finished:
            raise SlurmError(f"job {job_id} ended {info.state.value} (reason {info.reason}, exit code "
                             f"{info.exit_code}:{info.signal}) while waiting for {names}")
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise JobWaitTimeout(f"job {job_id} was still {info.state.value} (reason {info.reason}) after "
                                 f"{timeout_s:g} s of waiting for {names}", job_id=job_id,
                                 last_state=info.state.value, reason=info.reason, timeout_s=timeout_s)
        time.sleep(min(delay_s, remaining_s))
        delay_s = min(delay_s * 2, poll_s)


def wait_until_finished(job_id: int, *, timeout_s: float, conf: str | os.PathLike | None = None,
                        poll_s: float = 1.0) -> JobInfo:
    """``wait_for_state`` for any finished state (``FINISHED_STATES``): the final ``JobInfo``, exit code included."""
    return wait_for_state(job_id, FINISHED_STATES, timeout_s=timeout_s, conf=conf, poll_s=poll_s)


def cancel(job_id: int, *, conf: str | os.PathLike | None = None, timeout_s: float = 60.0,
           poll_s: float = 1.0) -> JobInfo | None:
    """``scancel`` the job and wait until it has left the queue: SLURM sends its processes SIGTERM, then SIGKILL
    after ``KillWait`` seconds, and the job leaves ``COMPLETING`` once they are gone.

    Returns:
        The job's final ``JobInfo`` (``CANCELLED``, or the state it had already finished in), or ``None`` if
        slurmctld no longer knows it.

    Raises:
        JobWaitTimeout: it was still in the queue after ``timeout_s`` seconds.
        SlurmError: scancel failed (slurmctld not answering, not your job, ...).
    """
    try:
        run_slurm(["scancel", str(int(job_id))], conf=conf)
    except SlurmError as e:
        info = job_info(job_id, conf=conf)
        if info is None or info.state.finished:  # it ended (or was purged) before scancel reached it
            return info
        raise e
    try:
        return wait_until_finished(job_id, timeout_s=timeout_s, conf=conf, poll_s=poll_s)
    except SlurmError as e:
        if isinstance(e, JobWaitTimeout) or "not known" not in str(e):
            raise
        return None
