"""A failure drill with torchft's replica groups, run from a notebook cell: kill a group, let the others train on,
restart it, let it heal, stop everything; return what every group recorded.

``run_failure_drill`` is ``tests/integration/test_torchft.py``'s scenario as one library call (notebook 15): the
lighthouse on 127.0.0.1 and the groups as torchrun jobs (``replicas``), each phase waiting on what the groups wrote
(``ft_train.py``'s ``metrics/group<G>.jsonl``, read by ``runs.replica_records``), never on a sleep. Both the
lighthouse and the groups are context managers here: an error, a timeout or an interrupt of the cell stops them
before it propagates, and ``FailureDrill.left_running`` says what was still alive after the stop (nothing, if the
clean-up worked).

``run_failure_drill(slurm=SlurmSpec(...))`` runs the same drill with each group as a SLURM job
(``slurm_replicas``, ``tests/integration/test_torchft_slurm.py``'s scenario): the kill is ``scancel`` of the group's
job, the restart a new ``sbatch``, and ``FailureDrill.left_jobs`` says which of its jobs were still in the queue after
the stop (none, if the clean-up worked). The phases and their waits are the same code for both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ConfigError, LaunchError, MetricsError
from ..runs.replica_records import HealRecord, ReplicaRecords, read_replica_records, write_kill_record
from ..runs.rundir import LESSONS_DIR, new_run_dir
from ..slurm.batch import time_limit
from ..slurm.target import SlurmSpec
from .replicas import Lighthouse, ReplicaGroups, leftover_processes, start_lighthouse, start_replica_groups
from .slurm_replicas import SlurmReplicaGroups, leftover_jobs, start_slurm_replica_groups

FT_SCRIPT = LESSONS_DIR / "ft_train.py"


@dataclass(frozen=True)
class FailureDrill:
    """What one drill did and what the groups recorded (``run_failure_drill``).

    Attributes:
        run_dir: the run's folder (``lighthouse.log``, ``group<G>/attempt<A>/``, ``metrics/``).
        records: every group's steps, commits and heals.
        num_groups: replica groups started.
        killed_group: the group SIGKILLed (on SLURM: its job cancelled) and restarted (resubmitted).
        killed_pid: the pid of its rank that was killed (its records before the kill carry it).
        killed_at_s: when it was killed (``time.time()``, seconds since the epoch; on SLURM when ``scancel`` ran).
        restarted_at_s: when it was started again (seconds since the epoch).
        heal: its heal after the restart: the step it joined at and the group its state came from.
        heartbeat_timeout_ms: the lighthouse's: how long a silent group stays in the quorum (milliseconds).
        starts: ``(group, attempt)`` of every torchrun job, in start order.
        left_running: pids of the drill's processes (lighthouse, torchruns, ranks) alive after it stopped them (on
            SLURM: the lighthouse's only; the jobs' processes are SLURM's, see ``left_jobs``).
        run_s: the drill's wall time (seconds; printed, never a claim).
        script: the lesson every group ran (``lessons/ft_train.py``), to show.
        job_ids: on SLURM, the job id of each start of ``starts``, in the same order; else empty.
        left_jobs: on SLURM, the ids of its jobs still in the queue after it cancelled them; else empty.
    """

    run_dir: Path
    records: ReplicaRecords
    num_groups: int
    killed_group: int
    killed_pid: int
    killed_at_s: float
    restarted_at_s: float
    heal: HealRecord
    heartbeat_timeout_ms: int
    starts: list[tuple[int, int]]
    left_running: list[int]
    run_s: float
    script: Path = FT_SCRIPT
    job_ids: list[int] = field(default_factory=list)
    left_jobs: list[int] = field(default_factory=list)

    def records_of(self, group_rank: int) -> ReplicaRecords:
        """What rank ``group_rank`` of every group recorded (``records`` are rank 0's; with ``nproc_per_group=2``,
        rank 1 recorded its own shard's steps and heals).

        Raises:
            MetricsError: no group had that many ranks.
        """
        return read_replica_records(self.run_dir / "metrics", group_rank=group_rank)


def commits_after_heal(records: ReplicaRecords, group: int, after_s: float) -> int:
    """The steps ``group`` committed after its first heal since ``after_s`` (seconds since the epoch) that every
    group has recorded as committed: the steps on which a drill can compare the healed group's weights with a live
    group's. A commit is one quorum's, but each group writes its record of it at its own pace, so a step the healed
    group recorded may not be in a live group's file yet; 0 when it has not healed since ``after_s``.
    """
    heals = [h for h in records.heals if h.replica_group == group and h.time_s > after_s]
    if not heals:
        return 0
    everywhere = set.intersection(*({s.step for s in records.committed(g)} for g in records.steps))
    return sum(s.step > heals[0].step and s.step in everywhere for s in records.committed(group))


def wait_for_records(groups: ReplicaGroups | SlurmReplicaGroups, what: str,
                     state: Callable[[ReplicaRecords], bool], timeout_s: float, poll_s: float = 0.1,
                     expected_ends: Sequence[int] = (), group_rank: int = 0) -> ReplicaRecords:
    """Read the groups' records every ``poll_s`` seconds until ``state(records)`` is true; return those records.
    ``group_rank``: whose records (each group's rank 0, or its rank 1 in an HSDP group: ``read_replica_records``).

    Raises:
        LaunchError: a group's torchrun (on SLURM: its job) ended that was neither killed on purpose nor in
            ``expected_ends`` (groups whose end is the awaited state), or ``timeout_s`` passed; the message names
            ``what`` was awaited, each group's commits so far, and the last lines of each torchrun's output.
    """
    deadline = time.monotonic() + timeout_s
    metrics = groups.run_dir / "metrics"
    while True:
        try:
            records = read_replica_records(metrics, group_rank=group_rank)
            if state(records):
                return records
            so_far = {g: len(records.committed(g)) for g in sorted(records.steps)}
        except MetricsError as e:  # no group has written yet
            so_far = str(e)
        ended = [g for g, group in groups.groups.items() if group.ended_on_its_own() and g not in expected_ends]
        if ended or time.monotonic() > deadline:
            why = f"group(s) {ended} ended" if ended else f"{timeout_s:g} s passed"
            tails = {g: group.output_tail(5) for g, group in groups.groups.items()}
            raise LaunchError(f"waiting for {what}: {why}; commits per group so far: {so_far}; the last lines of "
                              f"each group's torchrun: {tails}", run_dir=groups.run_dir,
                              command=next(iter(groups.groups.values())).command, returncode=None)
        time.sleep(poll_s)


def _check(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _start_groups(slurm: SlurmSpec | None, lighthouse: Lighthouse, num_groups: int, run_dir: Path,
                  script_args: list, timeout_s: float, nproc_per_group: int) -> ReplicaGroups | SlurmReplicaGroups:
    """The drill's groups: torchrun jobs on this machine, or (``slurm``) SLURM jobs whose ``--time`` outlasts the
    drill's three phases unless ``slurm.time_limit`` says otherwise. ``scancel``'s SIGTERM may land inside an
    all-reduce: ft_train.py's ``manager.allreduce`` records that failure and the other groups drop the step
    (torchft 0.2.0's own DDP comm hook fails ``assert fut._fut`` instead: 2 of 8 cancels ended the healthy group)."""
    if slurm is None:
        return start_replica_groups(FT_SCRIPT, lighthouse=lighthouse, num_groups=num_groups, run_dir=run_dir,
                                    args=script_args, nproc_per_group=nproc_per_group)
    slurm = replace(slurm, time_limit=slurm.time_limit or time_limit(3 * timeout_s))
    return start_slurm_replica_groups(FT_SCRIPT, lighthouse=lighthouse, num_groups=num_groups, run_dir=run_dir,
                                      slurm=slurm, args=script_args)


def run_failure_drill(*, runs_dir: str | os.PathLike | None = None, label: str = "ft-drill", num_groups: int = 2,
                      kill_group: int = 1, steps_together: int = 5, steps_alone: int = 10, steps_after_heal: int = 10,
                      heartbeat_timeout_ms: int = 2000, step_delay_s: float = 0.05, timeout_s: float = 120.0,
                      args: Sequence[object] = (), nproc_per_group: int = 1,
                      slurm: SlurmSpec | None = None) -> FailureDrill:
    """Run ``ft_train.py`` as ``num_groups`` replica groups and put one through a failure and a return.

    1. every group commits ``steps_together`` steps with all groups in the quorum;
    2. group ``kill_group`` is SIGKILLed (torchrun and rank: its machine dying; on SLURM its job is cancelled, and
       the group leaves at the end of its current step); the others must commit ``steps_alone`` steps without it;
    3. it is started again (on SLURM: submitted again); it must heal (take its state from a live group) and commit
       ``steps_after_heal`` steps that every group has recorded as committed (``commits_after_heal``), on each rank
       of a group of 2;
    4. everything is stopped (groups, then the lighthouse) and the records read.

    Args:
        runs_dir: the runs folder (``None``: ``$TUTORIAL_LIB_RUNS_DIR`` or ``./runs``); the drill gets a new folder.
        label: the run folder's name before its time stamp.
        num_groups: replica groups (count, >= 2: one must survive).
        kill_group: the group killed and restarted (``0..num_groups-1``).
        steps_together, steps_alone, steps_after_heal: commits awaited in each phase (count, >= 1).
        heartbeat_timeout_ms: the lighthouse's (milliseconds; torchft's default 5,000).
        step_delay_s: ``ft_train.py --step-delay-s``: a pause after each step, so the phases span several steps.
        timeout_s: the longest wait for one phase (seconds).
        args: more arguments for ``ft_train.py``.
        nproc_per_group: ranks per group (1 or 2): with 2, each group shards the model over its ranks (fault-tolerant
            HSDP); phases 1 and 2 wait on each group's rank 0, phase 3 on both ranks (``records``: rank 0's; rank
            1's: ``FailureDrill.records_of(1)``). Local groups only.
        slurm: run each group as a job of this SLURM cluster (``SlurmSpec``; ``tl.slurm.connect_slurm().spec()``: the
            local two-node cluster, whose nodes reach the lighthouse on 127.0.0.1), ``run_dir`` being on the filesystem
            its nodes share (``slurm_replicas``); ``None``: torchrun jobs on this machine.

    Raises:
        ConfigError: a value out of range, naming it.
        LaunchError: the lighthouse did not start, or a phase did not happen (``wait_for_records``); everything is
            stopped (on SLURM: every job cancelled) first.
        SlurmError: sbatch refused a job, or a cancel failed (slurmctld not answering).
    """
    _check("num_groups", num_groups, 2)
    if _check("nproc_per_group", nproc_per_group, 1) > (2 if slurm is None else 1):
        raise ConfigError("nproc_per_group must be " + ("1 or 2 (ranks per group on this machine)" if slurm is None else
                          "1 on SLURM (the SLURM drill runs one rank per group)") + f", got {nproc_per_group}")
    if _check("kill_group", kill_group, 0) >= num_groups:
        raise ConfigError(f"kill_group must be one of 0..{num_groups - 1}, got {kill_group}")
    for name, value in (("steps_together", steps_together), ("steps_alone", steps_alone),
                        ("steps_after_heal", steps_after_heal)):
        _check(name, value, 1)
    started = time.monotonic()
    run_dir = new_run_dir(label, runs_dir)
    script_args = ["--max-steps", 1_000_000, "--step-delay-s", step_delay_s, "--log-every", 1_000_000, *args]
    with start_lighthouse(run_dir / "lighthouse.log", heartbeat_timeout_ms=heartbeat_timeout_ms) as lighthouse:
        with _start_groups(slurm, lighthouse, num_groups, run_dir, script_args, timeout_s,
                           nproc_per_group) as groups:
            full = [g for g in range(num_groups)]
            records = wait_for_records(groups, f"{steps_together} commits of every group together", lambda r: all(
                sum(s.participants == num_groups for s in r.committed(g)) >= steps_together for g in full), timeout_s)
            killed_pid = records.committed(kill_group)[-1].pid
            killed_at_s = groups.kill(kill_group)
            others = [g for g in full if g != kill_group]
            wait_for_records(groups, f"{steps_alone} commits of the other groups without group {kill_group}",
                             lambda r: all(sum(s.time_s > killed_at_s and s.participants == num_groups - 1
                                               for s in r.committed(g)) >= steps_alone for g in others), timeout_s)
            restarted_at_s = time.time()
            groups.restart(kill_group)
            for group_rank in range(nproc_per_group):  # each rank writes its own records, each at its own pace
                wait_for_records(groups, f"group {kill_group} healed and {steps_after_heal} commits after it, "
                                 f"recorded by every group's rank {group_rank}",
                                 lambda r: commits_after_heal(r, kill_group, restarted_at_s) >= steps_after_heal,
                                 timeout_s, group_rank=group_rank)
        lighthouse.stop()
    records = read_replica_records(run_dir / "metrics")
    heal = next(h for h in records.heals if h.replica_group == kill_group and h.time_s > restarted_at_s)
    on_slurm = isinstance(groups, SlurmReplicaGroups)
    left = ([] if on_slurm else [p.pid for p in leftover_processes(groups)]) + (
        [lighthouse.process.pid] if lighthouse.alive() else [])
    return FailureDrill(run_dir, records, num_groups, kill_group, killed_pid, killed_at_s, restarted_at_s, heal,
                        heartbeat_timeout_ms, [(g.group_id, g.attempt) for g in groups.history], left,
                        time.monotonic() - started, job_ids=[g.job_id for g in groups.history] if on_slurm else [],
                        left_jobs=leftover_jobs(groups) if on_slurm else [])


LOSSES = ("lighthouse", "sender_mid_heal")  # run_hard_failure's ``what``


@dataclass(frozen=True)
class HardFailure:
    """A failure torchft cannot heal, as it happened (``run_hard_failure``).

    Attributes:
        what: ``"lighthouse"`` (the lighthouse SIGKILLed while every group trains) or ``"sender_mid_heal"`` (the only
            live group dies while it sends its state to the group that rejoined).
        run_dir: the run's folder (``lighthouse.log``, ``group<G>/attempt<A>/``, ``metrics/``).
        records: every group's steps, commits, heals and state sends.
        killed_at_s: when the failure happened (``time.time()``: the lighthouse's kill, or the sender's own record
            of its death; seconds since the epoch).
        ended_at_s: when every group's torchrun had ended (``"lighthouse"``), or when the drill stopped them
            (``"sender_mid_heal"``) (seconds since the epoch).
        exit_codes: each group's latest torchrun exit code before the drill stopped anything (group -> code;
            ``None``: it was still running).
        reports: the doctor's report on every start of every group (``diagnose_groups``).
        quorum_timeout_s: ``TORCHFT_QUORUM_TIMEOUT_SEC`` the groups ran with (seconds).
        left_running: pids of the run's processes alive after it stopped them.
        run_s: the wall time (seconds; printed, never a claim).
    """

    what: str
    run_dir: Path
    records: ReplicaRecords
    killed_at_s: float
    ended_at_s: float
    exit_codes: dict[int, int]
    reports: list
    quorum_timeout_s: float
    left_running: list[int]
    run_s: float


def run_hard_failure(what: str, *, runs_dir: str | os.PathLike | None = None, steps_together: int = 5,
                     steps_alone: int = 5, steps_after: int = 5, heartbeat_timeout_ms: int = 2000,
                     quorum_timeout_s: float = 3.0, step_delay_s: float = 0.05,
                     timeout_s: float = 120.0) -> HardFailure:
    """Put two replica groups of ``ft_train.py`` through a failure torchft cannot heal, and diagnose every start.

    * ``"lighthouse"``: both groups commit ``steps_together`` steps together, then the lighthouse is SIGKILLed. No
      new quorum can form: each group fails its next quorum within ``quorum_timeout_s`` (torchft's
      ``TORCHFT_QUORUM_TIMEOUT_SEC``, 60 s by default) and exits.
    * ``"sender_mid_heal"``: both commit ``steps_together`` steps together; group 1 is SIGKILLed; group 0 commits
      ``steps_alone`` steps alone; a trigger file is created and group 1 started again. It is behind, so group 0 is
      asked for its state, and SIGKILLs itself there (``ft_train.py --die-sending-state-if``): the heal fails, no
      live group holds the model any more, and torchft forms a quorum of group 1 alone, which trains on from its
      own step 0. The run waits for ``steps_after`` of those commits, then stops the groups.

    Each wait reads the groups' records. The self-killed start gets a kill record; the doctor runs on every start
    (``diagnose_groups``).

    Args:
        what: one of ``LOSSES``.
        runs_dir: the runs folder (``None``: ``$TUTORIAL_LIB_RUNS_DIR`` or ``./runs``); the run gets a new folder.
        steps_together, steps_alone: commits awaited before the failure (count, >= 1).
        steps_after: ``"sender_mid_heal"``: group 1's commits awaited after the failed heal (count, >= 1).
        heartbeat_timeout_ms: the lighthouse's (milliseconds).
        quorum_timeout_s: how long a group waits for a quorum before it raises (seconds, > 0).
        step_delay_s: ``ft_train.py --step-delay-s`` (seconds).
        timeout_s: the longest wait for one phase, the groups' ends included (seconds).

    Raises:
        ConfigError: ``what`` is not one of ``LOSSES``, or a value out of range, naming it.
        LaunchError: a phase did not happen in ``timeout_s`` (everything is stopped first).

    torchft's lighthouse and heal: https://github.com/pytorch/torchft (``torchft/manager.py``, ``_async_quorum``).
    """
    if what not in LOSSES:
        raise ConfigError(f"what must be one of {LOSSES}, got {what!r}")
    _check("steps_together", steps_together, 1)
    _check("steps_alone", steps_alone, 1)
    _check("steps_after", steps_after, 1)
    if not quorum_timeout_s > 0:
        raise ConfigError(f"quorum_timeout_s must be > 0 (seconds), got {quorum_timeout_s!r}")
    from ..diagnosis.groups import diagnose_groups  # the doctor imports the launcher's modules

    started = time.monotonic()
    run_dir = new_run_dir(f"ft-{what.replace('_', '-')}", runs_dir)
    trigger = run_dir / "die-sending-state"
    script_args = ["--max-steps", 1_000_000, "--step-delay-s", step_delay_s, "--log-every", 1_000_000,
                   "--die-sending-state-if", trigger]
    with start_lighthouse(run_dir / "lighthouse.log", heartbeat_timeout_ms=heartbeat_timeout_ms) as lighthouse:
        with start_replica_groups(FT_SCRIPT, lighthouse=lighthouse, num_groups=2, run_dir=run_dir, args=script_args,
                                  env={"TORCHFT_QUORUM_TIMEOUT_SEC": f"{quorum_timeout_s:g}"}) as groups:
            wait_for_records(groups, f"{steps_together} commits of both groups together", lambda r: all(
                sum(s.participants == 2 for s in r.committed(g)) >= steps_together for g in (0, 1)), timeout_s)
            if what == "lighthouse":
                killed_at_s = time.time()
                lighthouse.kill()
            else:
                lost_at_s = groups.kill(1)
                wait_for_records(groups, f"{steps_alone} commits of group 0 without group 1", lambda r: sum(
                    s.time_s > lost_at_s and s.participants == 1 for s in r.committed(0)) >= steps_alone, timeout_s)
                trigger.touch()
                groups.restart(1)
                records = wait_for_records(groups, "group 0's death while sending its state", lambda r: any(
                    s.killed_itself for s in r.sends), timeout_s, expected_ends=(0, 1))
                killed_at_s = records.sends[-1].time_s
                write_kill_record(groups.groups[0].folder, "ft_train.py --die-sending-state-if", killed_at_s)
                rejoined = records.starts[1][-1]
                wait_for_records(groups, f"{steps_after} commits of group 1 after the failed heal", lambda r: len(
                    r.committed(1, pid=rejoined)) >= steps_after, timeout_s, expected_ends=(0,))
            # sender_mid_heal: group 0's torchrun sees its rank's death within its monitor interval: wait for it
            exit_codes = groups.wait(timeout_s, None if what == "lighthouse" else (0,))
            ended_at_s = time.time()
        lighthouse.stop()
    left = [p.pid for p in leftover_processes(groups)] + ([lighthouse.process.pid] if lighthouse.alive() else [])
    return HardFailure(what, run_dir, read_replica_records(run_dir / "metrics"), killed_at_s, ended_at_s,
                        exit_codes, diagnose_groups(run_dir), quorum_timeout_s, left, time.monotonic() - started)
