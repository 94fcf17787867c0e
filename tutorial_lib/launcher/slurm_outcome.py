"""How a launch on SLURM ended, as the launcher reports it: the ``SlurmJob`` a result or an error carries, which node
task srun says failed, and the error of a job that cannot start. Builders only: ``tutorial_lib.launcher.slurm_job``
decides when to draw, write and raise (as ``outcome`` does for local launches)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from ..errors import LaunchError
from ..i18n import N_, Message
from ..runs.rundir import RunRecord, RunStatus
from ..slurm.commands import JobInfo, NeverStarts
from ..slurm.target import CANNOT_START
from ..torchrun.output_lines import BATCH_LABEL
from .live import Outcome
from .outcome import when_stopped

BATCH_PREFIX = BATCH_LABEL  # the batch script's own lines in output.log
_SRUN_TASK = re.compile(r"^srun: error: (?P<host>\S+): task (?P<task>\d+): (?P<what>.*)$")


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


def node_exit_codes(batch_lines: list[str], nodes: tuple[int, ...], job_exit_code: int | None) -> dict[int, int]:
    """Each node task's exit status from srun's ``srun: error: <host>: task <N>: Exited with exit code <C>`` lines
    (one task per node: task N is node N; another ending, e.g. a signal, counts as 1); a node srun says nothing of
    exited 0. If srun named none, every node gets the job's exit code (0 when unknown)."""
    codes = {node: 0 for node in nodes}
    named = False
    for line in batch_lines:
        m = _SRUN_TASK.match(line.removeprefix(BATCH_PREFIX))
        if m is not None and int(m["task"]) in codes:
            exit_code = re.match(r"Exited with exit code (\d+)", m["what"])
            codes[int(m["task"])], named = int(exit_code.group(1)) if exit_code else 1, True
    return codes if named else {node: job_exit_code or 0 for node in nodes}



def where_it_was(job: SlurmJob) -> Message:
    """What a cancelled job was doing, worded when shown: ``"it ran on node0, node1"``, ``"it waited in the queue
    (Resources)"``."""
    if job.nodes:
        return Message(N_("it ran on {nodes}"), {"nodes": ", ".join(job.nodes)})
    if job.waited_for:
        return Message(N_("it waited in the queue ({reason})"), {"reason": job.waited_for})
    return Message(N_("it waited in the queue"))


def attach_job(error: LaunchError, record: RunRecord, summary: str, slurm_job: SlurmJob,
               headline: Message | None = None) -> None:
    """Give a built error and its record (``outcome``'s builders) the SLURM summary (English), its headline (the
    first part, worded when the live view shows it; ``None``: the error's own) and job."""
    error.summary, error.args, error.job = summary, (summary,), slurm_job
    error.headline = headline if headline is not None else error.headline
    record.summary, record.slurm_job = summary, slurm_job.as_dict()


@dataclass(frozen=True)
class Request:
    """What a job asked of the cluster and what the cluster has, for ``what_to_change`` (the launcher fills it when
    it cancels a job that cannot start).

    Attributes:
        nnodes: nodes asked for (``LaunchSpec.nnodes``).
        cpus_per_task: CPUs per node asked for (``SlurmSpec.cpus_per_task``; ``None``: the cluster's default).
        node_cpus: ``{node name: CPUs}`` of the partition's nodes (``sinfo``); empty if unknown.
    """

    nnodes: int
    cpus_per_task: int | None = None
    node_cpus: dict[str, int] = field(default_factory=dict)


def what_to_change(reason: NeverStarts, request: Request) -> Message:
    """What to change so that a job pending for ``reason`` can start, worded when shown (``str()``: English); pure."""
    most_cpus = max(request.node_cpus.values(), default=None)
    n = len(request.node_cpus)
    partition = reason in (NeverStarts.PARTITION_CONFIG, NeverStarts.PARTITION_NODE_LIMIT)
    if partition and request.node_cpus and request.nnodes > n:  # SLURM says PartitionConfig first, then NodeLimit
        return Message(N_("ask for at most {n} nodes: nnodes={nnodes}, but sinfo lists {n}"),
                       {"n": n, "nnodes": request.nnodes})
    if reason == NeverStarts.PARTITION_CONFIG:
        asked = request.cpus_per_task
        if asked is not None and most_cpus is not None and asked > most_cpus:
            return Message(N_("ask for at most {most} CPUs per task: SlurmSpec.cpus_per_task={asked}, but the "
                              "partition's nodes have at most {most} CPUs"), {"most": most_cpus, "asked": asked})
        return Message(N_("ask for less per node than one node has (SlurmSpec.cpus_per_task, --mem or --gres in "
                          "SlurmSpec.sbatch_args; sinfo -N -o '%N %c %m %G' lists what each node has)"))
    return Message(WHAT_TO_CHANGE[reason])


# The change that lets a job pending for each other NeverStarts reason start (gettext messages).
WHAT_TO_CHANGE = {
    NeverStarts.PARTITION_NODE_LIMIT: N_("ask for fewer nodes (nnodes; sinfo lists the partition's)"),
    NeverStarts.PARTITION_TIME_LIMIT: N_("a smaller SlurmSpec.time_limit (or timeout_s), or another partition"),
    NeverStarts.INVALID_ACCOUNT: N_("another SlurmSpec.account (sacctmgr show assoc user=$USER lists yours)"),
    NeverStarts.INVALID_QOS: N_("another --qos in SlurmSpec.sbatch_args (sacctmgr show assoc user=$USER)"),
    NeverStarts.BAD_CONSTRAINTS: N_("a --constraint some node has (sinfo -N -o '%N %f' lists the features)"),
    NeverStarts.DEPENDENCY_NEVER_SATISFIED: N_("drop the --dependency from SlurmSpec.sbatch_args, or depend on a job "
                                               "that can still satisfy it"),
}


def cannot_start_error(plan, reason: NeverStarts, request: Request, elapsed: float, slurm_job: SlurmJob,
                       output_tail: list[str]) -> tuple[LaunchError, RunRecord, Outcome]:
    """The ``LaunchError`` of a job cancelled because it was pending for ``reason`` (it cannot start as submitted:
    ``SlurmSpec.cancel_pending_reasons``), naming the job, the reason, what it means and what to change
    (``what_to_change`` of ``request``); its run.json (not yet written) and its outcome.

    Args:
        plan: the launch's ``SlurmPlan``; reason: the pending reason; request: what the job asked and the nodes have;
        elapsed: seconds from the submission to the cancellation; slurm_job: the job as last seen (cancelled);
        output_tail: the last lines of ``output.log``.
    """
    headline = Message(N_("{script} cannot start: SLURM job {job_id} was pending with reason {reason} ({why}); it was "
                          "cancelled (scancel); to start it, {change}"),
                       {"script": plan.script.name, "job_id": slurm_job.job_id, "reason": reason.value,
                        "why": Message(CANNOT_START[reason]), "change": what_to_change(reason, request)})
    summary = str(headline)
    error = LaunchError(summary, run_dir=plan.run_dir, command=plan.sbatch_argv, returncode=None,
                        output_tail=output_tail, job=slurm_job, headline=headline)
    record = RunRecord(RunStatus.FAILED, elapsed, **plan.shape("cold"), summary=summary, slurm_job=slurm_job.as_dict())
    short = Message(N_("cannot start: {reason}"), {"reason": reason.value})
    return error, record, Outcome(RunStatus.FAILED, elapsed, short)


def failure_summary(plan, error: LaunchError, info: JobInfo, slurm_job: SlurmJob,
                    srun_named: bool) -> tuple[str, Message]:
    """The summary of a failed job (English) and its headline (worded when shown): ``failure_error``'s (the rank, now
    with its node) and how SLURM ended it."""
    ended = Message(N_("SLURM job {job_id} ended {state} (reason {reason}, exit code {code})"),
                    {"job_id": slurm_job.job_id, "state": info.state.value, "reason": info.reason,
                     "code": info.exit_code})
    failure = error.failure
    if failure is not None and failure.rank is not None:
        node = next((n for n, ranks in slurm_job.node_ranks.items() if failure.rank in ranks), None)
        headline = error.headline
        if node is not None and node < len(slurm_job.nodes):
            headline = Message(N_("{failed} on node {node} ({host})"),
                               {"failed": headline, "node": node, "host": slurm_job.nodes[node]})
        return f"{headline}{when_stopped(error.where)}; {ended}", headline
    if srun_named:  # torchrun itself failed on a node (its rendezvous, a bad command): failure_error says which
        return f"{error.headline}{when_stopped(error.where)}; {ended}", error.headline
    headline = Message(N_("{script} failed: {ended}"), {"script": plan.script.name, "ended": ended})
    return str(headline), headline
