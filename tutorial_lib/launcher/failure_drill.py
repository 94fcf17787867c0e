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
from ..runs.replica_records import HealRecord, ReplicaRecords, read_replica_records
from ..runs.rundir import LESSONS_DIR, new_run_dir
from ..slurm.target import SlurmSpec
from .replicas import Lighthouse, ReplicaGroups, leftover_processes, start_lighthouse, start_replica_groups
from .slurm_job import time_limit
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


def wait_for_records(groups: ReplicaGroups | SlurmReplicaGroups, what: str, state: Callable[[ReplicaRecords], bool],
                     timeout_s: float, poll_s: float = 0.1) -> ReplicaRecords:
    """Read the groups' records every ``poll_s`` seconds until ``state(records)`` is true; return those records.

    Raises:
        LaunchError: a group's torchrun (on SLURM: its job) ended that was not killed on purpose, or ``timeout_s``
            passed; the message names ``what`` was awaited, each group's commits so far, and the last lines of each
            torchrun's output.
    """
    deadline = time.monotonic() + timeout_s
    metrics = groups.run_dir / "metrics"
    while True:
        try:
            records = read_replica_records(metrics)
            if state(records):
                return records
            so_far = {g: len(records.committed(g)) for g in sorted(records.steps)}
        except MetricsError as e:  # no group has written yet
            so_far = str(e)
        ended = [g for g, group in groups.groups.items() if group.ended_on_its_own()]
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
                  script_args: list, timeout_s: float) -> ReplicaGroups | SlurmReplicaGroups:
    """The drill's groups: torchrun jobs on this machine, or (``slurm``) SLURM jobs whose ``--time`` outlasts the
    drill's three phases unless ``slurm.time_limit`` says otherwise, each leaving between two steps when ``scancel``
    sends it SIGTERM (``ft_train.py --leave-on-sigterm``: a group that dies inside an all-reduce fails the other
    groups' all-reduce in torchft 0.2.0's DDP, ``assert fut._fut`` in torchft/ddp.py; 2 of 8 cancels without it)."""
    if slurm is None:
        return start_replica_groups(FT_SCRIPT, lighthouse=lighthouse, num_groups=num_groups, run_dir=run_dir,
                                    args=script_args)
    slurm = replace(slurm, time_limit=slurm.time_limit or time_limit(3 * timeout_s))
    return start_slurm_replica_groups(FT_SCRIPT, lighthouse=lighthouse, num_groups=num_groups, run_dir=run_dir,
                                      slurm=slurm, args=[*script_args, "--leave-on-sigterm"])


def run_failure_drill(*, runs_dir: str | os.PathLike | None = None, label: str = "ft-drill", num_groups: int = 2,
                      kill_group: int = 1, steps_together: int = 5, steps_alone: int = 10, steps_after_heal: int = 10,
                      heartbeat_timeout_ms: int = 2000, step_delay_s: float = 0.05, timeout_s: float = 120.0,
                      args: Sequence[object] = (), slurm: SlurmSpec | None = None) -> FailureDrill:
    """Run ``ft_train.py`` as ``num_groups`` replica groups and put one through a failure and a return.

    1. every group commits ``steps_together`` steps with all groups in the quorum;
    2. group ``kill_group`` is SIGKILLed (torchrun and rank: its machine dying; on SLURM its job is cancelled, and
       the group leaves at the end of its current step); the others must commit ``steps_alone`` steps without it;
    3. it is started again (on SLURM: submitted again); it must heal (take its state from a live group) and commit
       ``steps_after_heal`` steps;
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
        slurm: run each group as a job of this SLURM cluster (``SlurmSpec``; ``tl.connect_slurm().spec()``: the local
            two-node cluster, whose nodes reach the lighthouse on 127.0.0.1), ``run_dir`` being on the filesystem its
            nodes share (``slurm_replicas``); ``None``: torchrun jobs on this machine.

    Raises:
        ConfigError: a value out of range, naming it.
        LaunchError: the lighthouse did not start, or a phase did not happen (``wait_for_records``); everything is
            stopped (on SLURM: every job cancelled) first.
        SlurmError: sbatch refused a job, or a cancel failed (slurmctld not answering).
    """
    _check("num_groups", num_groups, 2)
    if _check("kill_group", kill_group, 0) >= num_groups:
        raise ConfigError(f"kill_group must be one of 0..{num_groups - 1}, got {kill_group}")
    for name, value in (("steps_together", steps_together), ("steps_alone", steps_alone),
                        ("steps_after_heal", steps_after_heal)):
        _check(name, value, 1)
    started = time.monotonic()
    run_dir = new_run_dir(label, runs_dir)
    script_args = ["--max-steps", 1_000_000, "--step-delay-s", step_delay_s, "--log-every", 1_000_000, *args]
    with start_lighthouse(run_dir / "lighthouse.log", heartbeat_timeout_ms=heartbeat_timeout_ms) as lighthouse:
        with _start_groups(slurm, lighthouse, num_groups, run_dir, script_args, timeout_s) as groups:
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

            def healed(r: ReplicaRecords) -> bool:
                heals = [h for h in r.heals if h.replica_group == kill_group and h.time_s > restarted_at_s]
                return bool(heals) and sum(s.step > heals[0].step for s in r.committed(kill_group)) >= steps_after_heal

            wait_for_records(groups, f"group {kill_group} healed and {steps_after_heal} commits after it", healed,
                             timeout_s)
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
