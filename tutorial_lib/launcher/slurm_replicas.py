"""torchft's replica groups as SLURM jobs: one ``sbatch`` job per group; ``scancel`` one and the others train on; the
job submitted again heals from them.

torchft's own SLURM example (pytorch/torchft, ``torchft/examples/slurm``: ``runner.py`` submits one job per replica
group, named ``ft_<id>``, with ``TORCHFT_LIGHTHOUSE`` in its environment, and starts a new job for a group whose job
is gone; ``punisher.py`` cancels one job at a time) on the workbook's SLURM clusters, through the workbook's own SLURM
pieces: ``tl.slurm.slurm_script`` writes each group's batch script (one node, ``nproc_per_group`` ranks under torchrun,
each rank through the rank runner, as ``tl.launch`` on SLURM), ``tutorial_lib.slurm.submit`` submits it with the
environment torchft reads exported to the job (``replicas.group_env``: ``TORCHFT_LIGHTHOUSE``, ``REPLICA_GROUP_ID``,
``NUM_REPLICA_GROUPS``), ``tutorial_lib.slurm.cancel`` cancels it and waits until it has left the queue.

``start_slurm_replica_groups(script, lighthouse=..., num_groups=..., run_dir=..., slurm=SlurmSpec(...))`` returns
``SlurmReplicaGroups``, which answers as ``replicas.ReplicaGroups`` does (``groups``, ``history``, ``kill``,
``restart``, ``running``, ``stop``; ``failure_drill.wait_for_records`` waits on either): ``kill(g)`` is ``scancel``
of group g's job (SLURM sends SIGTERM to each of its processes, SIGKILL after ``KillWait``: a job preempted or
cancelled by an administrator), ``restart(g)`` submits group g again (a new job, the next attempt), ``stop()``
cancels every job still in the queue. Every job runs in ``run_dir`` (its ``--chdir``, on the filesystem every node
shares), where the script writes its own files (ft_train.py's ``metrics/``); each job's files are in
``group<G>/attempt<A>/``: ``job.sh``, SLURM's ``ft_<G>-<job id>.out`` (the batch script's output) and
``ft_<G>-<job id>-node0.out`` (torchrun's own lines), and torchrun's ``logs/node0/`` (each rank's stdout and stderr).

A cancel is SLURM's SIGTERM, which may land while the group is inside an all-reduce with the others: ft_train.py
averages gradients with ``manager.allreduce``, whose failure the Manager records, so the other groups drop that step
and go on. (torchft 0.2.0's own ``DistributedDataParallel`` fails them instead: ``_ManagedWork.wait`` swallows the
gloo error, then ``_comm_hook`` fails ``assert fut._fut``, torchft/ddp.py; 2 of 8 cancels on the local cluster
ended the healthy group that way while ft_train.py used it.)

Nothing is left: ``stop()`` cancels every job this object submitted that is not finished, and ``with`` calls it on any
exit, an error or a KeyboardInterrupt included; ``sbatch`` and each cancel run with a kernel interrupt held back
until they are done, so no job is submitted without its id being known. A kernel killed outright runs no clean-up:
on the local cluster it owns (``tl.slurm.connect_slurm()``) the cluster's watchdog cancels every job within seconds;
on any cluster the lighthouse dies with the kernel (its stdin closes), and each group's next quorum request fails after
torchft's quorum timeout (``Manager(quorum_timeout=...)``, 60 s by default), which ends its job (two jobs gone 65 s
after their kernel's SIGKILL on the local cluster, whose owner was not that kernel); at the latest at its ``--time``.

The lighthouse (``replicas.start_lighthouse``) listens on 127.0.0.1 of this machine: the local cluster's nodes are
all 127.0.0.1 (``NodeAddr``), so its jobs reach it. On a cluster of several machines run it where every node reaches
it (torchft's README: ``torchft_lighthouse`` on a head node, ``TORCHFT_LIGHTHOUSE=http://head:29510``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..notebook.parameters import check_positive_int
from ..slurm.batch import slurm_script
from ..slurm.commands import JobInfo, cancel, client_env, job_info, queue, submit
from ..slurm.target import SlurmSpec
from .environment import rank_env
from .job import sigint_deferred
from .plan import RANK_RUNNER
from .replicas import Lighthouse, group_env

JOB_SCRIPT = "job.sh"
JOB_NAME = "ft"  # torchft's example names each group's job ft_<id>
TIME_LIMIT = "01:00:00"  # --time when SlurmSpec.time_limit is None: SLURM ends a job whose kernel died
CANCEL_TIMEOUT_S = 120.0  # the longest wait for a cancelled job to leave the queue (KillWait is 30 s by default)


@dataclass
class SlurmReplicaGroup:
    """One start of one replica group: its SLURM job.

    Attributes:
        group_id: ``REPLICA_GROUP_ID``.
        attempt: 0 for the first job, 1 for the job submitted after the first cancel, ...
        job_id: SLURM's id of the job; job_name: its ``--job-name`` (``ft_<G>``).
        command: the sbatch argv (the batch script last).
        folder: ``<run_dir>/group<G>/attempt<A>``: ``job.sh``, SLURM's output files and torchrun's ``logs/``.
        conf: the ``slurm.conf`` the SLURM commands read (``None``: the environment's or the system's).
        poll_s: the least time between two looks at the job's state (``squeue``), in seconds.
        killed_at_s: ``time.time()`` when ``kill`` cancelled it (seconds since the epoch), else ``None``.
        info: the job as last seen (``None`` before the first look).
    """

    group_id: int
    attempt: int
    job_id: int
    job_name: str
    command: list[str]
    folder: Path
    conf: str | os.PathLike | None
    poll_s: float
    killed_at_s: float | None = None
    info: JobInfo | None = None
    looked_at: float = field(default=float("-inf"), repr=False)

    def look(self, max_age_s: float = 0.0) -> JobInfo | None:
        """The job's state (``job_info``), asked again only if the last answer is older than ``max_age_s`` seconds;
        ``None`` once slurmctld has forgotten the job (``MinJobAge`` after it ended).

        Raises:
            SlurmError: squeue failed (slurmctld not answering).
        """
        if time.monotonic() - self.looked_at >= max_age_s:
            self.info, self.looked_at = job_info(self.job_id, conf=self.conf), time.monotonic()
        return self.info

    def running(self) -> bool:
        """Whether the job is still in the queue (pending, running or completing): asks squeue now."""
        info = self.look()
        return info is not None and not info.state.finished

    def ended_on_its_own(self) -> bool:
        """Whether the job has finished without ``kill`` (a failure, the script's end, its ``--time``), or waits for
        a reason after which it never starts (``NeverStarts``): what a wait stops at. Asks squeue at most every
        ``poll_s`` seconds."""
        info = self.look(self.poll_s)
        if self.killed_at_s is not None:
            return False
        return info is None or info.state.finished or info.never_starts is not None

    def batch_output(self) -> Path:
        """The batch script's output (sbatch's ``--output``): srun's errors, SLURM's cancel notice."""
        return self.folder / f"{self.job_name}-{self.job_id}.out"

    def torchrun_output(self) -> Path:
        """The node's torchrun's own lines (srun's ``--output``; its ranks' are under ``logs/node0/``)."""
        return self.folder / f"{self.job_name}-{self.job_id}-node0.out"

    def output_tail(self, lines: int = 5) -> list[str]:
        """The job's state as last seen, then the last ``lines`` lines of torchrun's output and of the batch
        script's."""
        info = self.info
        state = (f"SLURM job {self.job_id}: " + (f"{info.state.value} (reason {info.reason}, exit code "
                                                  f"{info.exit_code}:{info.signal})" if info else "not known"))
        tails = [path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
                 for path in (self.torchrun_output(), self.batch_output())]
        return [state, *tails[0], *tails[1]]


@dataclass
class SlurmReplicaGroups:
    """The replica groups of one run, one SLURM job each (``start_slurm_replica_groups``): ``groups[g]`` is group
    ``g``'s latest job, ``history`` every job in order of submission."""

    script: Path
    args: list[str]
    lighthouse: Lighthouse
    num_groups: int
    nproc_per_group: int
    run_dir: Path
    env: dict[str, str]
    slurm: SlurmSpec
    groups: dict[int, SlurmReplicaGroup] = field(default_factory=dict)
    history: list[SlurmReplicaGroup] = field(default_factory=list)

    def _submit(self, group_id: int) -> SlurmReplicaGroup:
        slurm = self.slurm
        attempt = sum(g.group_id == group_id for g in self.history)
        folder = self.run_dir / f"group{group_id}" / f"attempt{attempt}"
        folder.mkdir(parents=True, exist_ok=False)  # SLURM does not create the folder of its --output files
        job_name = f"{slurm.job_name or JOB_NAME}_{group_id}"
        batch = slurm_script(str(RANK_RUNNER), [str(self.script), *self.args], nnodes=1,
                             nproc_per_node=self.nproc_per_group, gpus_per_node=slurm.gpus_per_node,
                             partition=slurm.partition, account=slurm.account,
                             time_limit=slurm.time_limit or TIME_LIMIT, cpus_per_task=slurm.cpus_per_task,
                             job_name=job_name, run_dir=self.run_dir, rendezvous_port=None,
                             socket_ifname=slurm.socket_ifname, torchrun=slurm.torchrun_command(),
                             output_dir=folder.relative_to(self.run_dir).as_posix())
        (folder / JOB_SCRIPT).write_text(batch)
        env = client_env(slurm.conf, job_env(self.lighthouse.address, group_id, self.num_groups,
                                             self.nproc_per_group, self.env, slurm.socket_ifname))
        with sigint_deferred():  # an interrupt after sbatch submitted the job, before its id is known, would lose it
            job_id = submit(folder / JOB_SCRIPT, slurm.sbatch_args, conf=slurm.conf, env=env, cwd=self.run_dir)
            group = SlurmReplicaGroup(group_id, attempt, job_id, job_name,
                                      ["sbatch", "--parsable", *slurm.sbatch_args, str(folder / JOB_SCRIPT)], folder,
                                      slurm.conf, slurm.poll_s)
            self.groups[group_id] = group
            self.history.append(group)
        return group

    def _group(self, group_id: int) -> SlurmReplicaGroup:
        if group_id not in self.groups:
            raise ConfigError(f"group_id must be one of {sorted(self.groups)}, got {group_id!r}")
        return self.groups[group_id]

    def kill(self, group_id: int) -> float:
        """``scancel`` group ``group_id``'s job (SIGTERM to its torchrun and ranks, SIGKILL after ``KillWait``) and
        wait until it has left the queue; return the time of the cancel (``time.time()``, seconds since the epoch).

        Raises:
            ConfigError: no such group.
            JobWaitTimeout: the job was still in the queue ``CANCEL_TIMEOUT_S`` seconds later.
            SlurmError: scancel failed (slurmctld not answering).
        """
        group = self._group(group_id)
        group.killed_at_s = time.time()
        with sigint_deferred():  # a kernel interrupt waits until the job has left the queue
            self._cancel(group)
        return group.killed_at_s

    @staticmethod
    def _cancel(group: SlurmReplicaGroup) -> None:
        group.info = cancel(group.job_id, conf=group.conf, timeout_s=CANCEL_TIMEOUT_S)
        group.looked_at = time.monotonic()

    def restart(self, group_id: int) -> SlurmReplicaGroup:
        """Submit group ``group_id`` again (a new job, the next attempt folder); it rejoins through the lighthouse and
        heals from a live group. A job of it still in the queue is cancelled first.

        Raises:
            ConfigError: no such group.
            SlurmError: sbatch refused the job, or the cancel failed.
        """
        group = self._group(group_id)
        if group.running():
            with sigint_deferred():
                self._cancel(group)
        return self._submit(group_id)

    def running(self) -> list[int]:
        """The ids of the groups whose latest job is still in the queue, sorted (asks squeue)."""
        return sorted(g for g, group in self.groups.items() if group.running())

    def stop(self) -> list[int]:
        """Cancel every job of every group that is not known to be finished and wait until each has left the queue;
        return their job ids. A kernel interrupt meanwhile is held back until every job is cancelled. The lighthouse is
        the caller's to stop.

        Raises:
            SlurmError: a cancel failed (slurmctld not answering; the message names the job); the other jobs are
                cancelled first.
        """
        cancelled, errors = [], []
        with sigint_deferred():
            for group in self.history:
                if group.info is not None and group.info.state.finished:
                    continue
                try:
                    self._cancel(group)
                    cancelled.append(group.job_id)
                except Exception as e:  # the other jobs are cancelled all the same
                    errors.append(e)
        if errors:
            raise errors[0]
        return cancelled

    def __enter__(self) -> SlurmReplicaGroups:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def job_env(lighthouse_address: str, group_id: int, num_groups: int, nproc: int, extra: Mapping[str, str],
            socket_ifname: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment ``sbatch`` exports to one group's job; pure (``os.environ`` is only read).

    ``replicas.group_env``'s, except that the network interface is the cluster's: ``GLOO_SOCKET_IFNAME`` is kept
    only where ``base`` or ``extra`` sets it (the batch script exports ``socket_ifname`` when it is given), not the
    local launcher's loopback default, which would keep a group's gloo from reaching the other nodes.

    Args:
        lighthouse_address, group_id, num_groups, nproc: as ``group_env``.
        extra: more variables (they win).
        socket_ifname: ``SlurmSpec.socket_ifname``.
        base: the environment to start from (``None``: this process's with the rank environment, ``set_rank_env``).
    """
    base = {**os.environ, **rank_env()} if base is None else dict(base)
    env = group_env(lighthouse_address, group_id, num_groups, nproc, base=base, extra=extra)
    if "GLOO_SOCKET_IFNAME" not in base and "GLOO_SOCKET_IFNAME" not in extra:
        env.pop("GLOO_SOCKET_IFNAME", None)
    if socket_ifname:
        env["GLOO_SOCKET_IFNAME"] = socket_ifname
    return env


def start_slurm_replica_groups(script: str | os.PathLike, *, lighthouse: Lighthouse, num_groups: int,
                               run_dir: str | os.PathLike, slurm: SlurmSpec, args: Sequence[object] = (),
                               nproc_per_group: int = 1, env: Mapping[str, str] | None = None) -> SlurmReplicaGroups:
    """Submit ``num_groups`` replica groups of ``script``, one SLURM job each (one node, ``nproc_per_group`` gloo
    ranks under torchrun), all reporting to ``lighthouse``; return once every job is submitted (``kill``,
    ``restart``, ``stop``; ``with`` cancels them all on leaving the block however it is left).

    Args:
        script: the training script, at a path every node can read (torchft's ``Manager`` reads the environment
            ``group_env`` sets).
        lighthouse: a running lighthouse (``start_lighthouse``) that every node reaches (see the module docstring).
        num_groups: replica groups (count, >= 1).
        run_dir: the jobs' working folder (``--chdir``) and where their files go (``group<G>/attempt<A>/``), on the
            filesystem every node shares; created if missing.
        slurm: the cluster and the job options (``SlurmSpec``; ``tl.slurm.connect_slurm().spec()`` for the local
            cluster).
            ``job_name`` is the prefix of the jobs' names (``<job_name>_<G>``; default ``ft``, torchft's example's);
            ``time_limit`` defaults to ``TIME_LIMIT``; ``poll_s`` is the least time between two squeue looks at one
            job while waiting (seconds).
        args: the script's arguments.
        nproc_per_group: ranks per group (>= 1; torchft's DDP needs 1: it averages across groups only).
        env: extra variables for every job (exported by sbatch to torchrun and the ranks).

    Raises:
        ConfigError: a bad value, naming it; the script is missing; the lighthouse is not running.
        SlurmError: sbatch refused a job (its message says why); the jobs already submitted are cancelled first.
    """
    check_positive_int("num_groups", num_groups)
    check_positive_int("nproc_per_group", nproc_per_group)
    if not isinstance(slurm, SlurmSpec):
        raise ConfigError(f"slurm must be a SlurmSpec (tl.slurm.connect_slurm().spec() on the local cluster), "
                          f"got {slurm!r}")
    slurm.validate()
    script = Path(script).resolve()
    if not script.is_file():
        raise ConfigError(f"script {str(script)!r} does not exist")
    if not lighthouse.alive():
        raise ConfigError(f"the lighthouse at {lighthouse.address} has exited (code {lighthouse.process.returncode}): "
                          "start_lighthouse() starts a new one")
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    groups = SlurmReplicaGroups(script, [str(a) for a in args], lighthouse, num_groups, nproc_per_group, run_dir,
                                dict(env or {}), slurm)
    try:
        for group_id in range(num_groups):
            groups._submit(group_id)
    except BaseException:
        groups.stop()
        raise
    return groups


def leftover_jobs(groups: SlurmReplicaGroups) -> list[int]:
    """The ids of the jobs of ``groups`` (every start of every group) still in the queue (pending, running,
    completing), asked of squeue now: empty after ``stop``.

    Raises:
        SlurmError: squeue failed (slurmctld not answering).
    """
    ids = {g.job_id for g in groups.history}
    return sorted(job.job_id for job in queue(conf=groups.slurm.conf) if job.job_id in ids)
