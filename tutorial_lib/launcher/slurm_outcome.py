"""How a launch on SLURM ended, as the launcher reports it: the ``SlurmJob`` a result or an error carries, which node
task srun says failed, and the error of a job that cannot start. Builders only: ``tutorial_lib.launcher.slurm_job``
decides when to draw, write and raise (as ``outcome`` does for local launches)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from ..errors import LaunchError
from ..rundir import RunRecord, RunStatus
from ..slurm.commands import JobInfo, NeverStarts
from ..slurm.target import CANNOT_START
from .live import Outcome

BATCH_PREFIX = "[batch] "  # the batch script's own lines in output.log
# The Chinese of slurm.target.CANNOT_START, for the summary a Chinese notebook shows (tl.language() == "zh").
CANNOT_START_ZH = {
    NeverStarts.PARTITION_CONFIG: "分区中没有任何节点具备它对每个节点的请求（CPU、内存、GPU）",
    NeverStarts.PARTITION_NODE_LIMIT: "它请求的节点数超过了分区拥有的节点数（或其中一些节点已 down 或 drain）",
    NeverStarts.PARTITION_TIME_LIMIT: "它的时间限制超过了分区的上限（用更小的 time_limit，或换一个分区）",
    NeverStarts.INVALID_ACCOUNT: "这个账户对当前用户无效（sacctmgr show assoc user=$USER）",
    NeverStarts.INVALID_QOS: "这个 QOS 对当前用户或账户无效",
    NeverStarts.BAD_CONSTRAINTS: "没有节点具备它请求的特性（--constraint）",
    NeverStarts.DEPENDENCY_NEVER_SATISFIED: "它依赖的作业（--dependency）的结束方式使这个依赖条件永远无法满足",
}
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
            is ``nodes[N]``, its output ``<job>-<id>-node<N>.out``, its torchrun's logs ``logs/node<N>/``.
        node_ranks: ``{N: global ranks}`` whose labelled lines node N's output file holds: the ranks it ran.
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



def where_it_was(job: SlurmJob) -> str:
    """What a cancelled job was doing: ``"it ran on node0, node1"``, ``"it waited in the queue (Resources)"``."""
    if job.nodes:
        return f"it ran on {', '.join(job.nodes)}"
    return f"it waited in the queue ({job.waited_for})" if job.waited_for else "it waited in the queue"


def where_it_was_zh(job: SlurmJob) -> str:
    """The Chinese of ``where_it_was``."""
    if job.nodes:
        return f"它在 {', '.join(job.nodes)} 上运行"
    return f"它在队列中等待（{job.waited_for}）" if job.waited_for else "它在队列中等待"


def attach_job(error: LaunchError, record: RunRecord, summary: str, slurm_job: SlurmJob, summary_zh: str = "") -> None:
    """Give a built error and its record (``outcome``'s builders) the SLURM summary (and its Chinese, which the live
    view shows when ``tl.language()`` is ``"zh"``) and job."""
    error.summary, error.args, error.job = summary, (summary,), slurm_job
    error.summary_zh = summary_zh or error.summary_zh
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


def what_to_change(reason: NeverStarts, request: Request) -> tuple[str, str]:
    """What to change so that a job pending for ``reason`` can start, in English and Chinese; pure."""
    most_cpus = max(request.node_cpus.values(), default=None)
    n = len(request.node_cpus)
    partition = reason in (NeverStarts.PARTITION_CONFIG, NeverStarts.PARTITION_NODE_LIMIT)
    if partition and request.node_cpus and request.nnodes > n:  # SLURM says PartitionConfig first, then NodeLimit
        return (f"ask for at most {n} nodes: nnodes={request.nnodes}, but sinfo lists {n}",
                f"最多请求 {n} 个节点：nnodes={request.nnodes}，而 sinfo 只列出 {n} 个")
    if reason == NeverStarts.PARTITION_CONFIG:
        asked = request.cpus_per_task
        if asked is not None and most_cpus is not None and asked > most_cpus:
            return (f"ask for at most {most_cpus} CPUs per task: SlurmSpec.cpus_per_task={asked}, but the partition's "
                    f"nodes have at most {most_cpus} CPUs",
                    f"每个任务最多请求 {most_cpus} 个 CPU：SlurmSpec.cpus_per_task={asked}，而分区中的节点最多只有 "
                    f"{most_cpus} 个 CPU")
        return ("ask for less per node than one node has (SlurmSpec.cpus_per_task, --mem or --gres in "
                "SlurmSpec.sbatch_args; sinfo -N -o '%N %c %m %G' lists what each node has)",
                "每个节点的请求不要超过单个节点拥有的资源（SlurmSpec.cpus_per_task，或 SlurmSpec.sbatch_args 中的 --mem、"
                "--gres；sinfo -N -o '%N %c %m %G' 列出每个节点拥有的资源）")
    return {
        NeverStarts.PARTITION_NODE_LIMIT: ("ask for fewer nodes (nnodes; sinfo lists the partition's)",
                                           "请求更少的节点（nnodes；sinfo 列出分区的节点）"),
        NeverStarts.PARTITION_TIME_LIMIT: ("a smaller SlurmSpec.time_limit (or timeout_s), or another partition",
                                           "用更小的 SlurmSpec.time_limit（或 timeout_s），或换一个分区"),
        NeverStarts.INVALID_ACCOUNT: ("another SlurmSpec.account (sacctmgr show assoc user=$USER lists yours)",
                                      "换一个 SlurmSpec.account（sacctmgr show assoc user=$USER 列出你的账户）"),
        NeverStarts.INVALID_QOS: ("another --qos in SlurmSpec.sbatch_args (sacctmgr show assoc user=$USER)",
                                  "在 SlurmSpec.sbatch_args 中换一个 --qos（sacctmgr show assoc user=$USER）"),
        NeverStarts.BAD_CONSTRAINTS: ("a --constraint some node has (sinfo -N -o '%N %f' lists the features)",
                                      "换一个某些节点具备的 --constraint（sinfo -N -o '%N %f' 列出各节点的特性）"),
        NeverStarts.DEPENDENCY_NEVER_SATISFIED: ("drop the --dependency from SlurmSpec.sbatch_args, or depend on a job "
                                                 "that can still satisfy it",
                                                 "从 SlurmSpec.sbatch_args 中去掉 --dependency，或依赖一个仍能满足条件的作业"),
    }[reason]


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
    change, change_zh = what_to_change(reason, request)
    summary = (f"{plan.script.name} cannot start: SLURM job {slurm_job.job_id} was pending with reason "
               f"{reason.value} ({CANNOT_START[reason]}); it was cancelled (scancel); to start it, {change}")
    summary_zh = (f"{plan.script.name} 无法启动：SLURM 作业 {slurm_job.job_id} 一直在排队，原因 {reason.value}"
                  f"（{CANNOT_START_ZH[reason]}）；已取消（scancel）；要让它启动：{change_zh}")
    error = LaunchError(summary, run_dir=plan.run_dir, command=plan.sbatch_argv, returncode=None,
                        output_tail=output_tail, job=slurm_job, summary_zh=summary_zh)
    record = RunRecord(RunStatus.FAILED, elapsed, **plan.shape("cold"), summary=summary, slurm_job=slurm_job.as_dict())
    return error, record, Outcome(RunStatus.FAILED, elapsed, f"cannot start: {reason.value}",
                                  f"无法启动：{reason.value}")


def failure_summary(plan, error: LaunchError, info: JobInfo, slurm_job: SlurmJob,
                    srun_named: bool) -> tuple[str, str]:
    """The summary of a failed job, in English and Chinese: ``failure_error``'s (the rank, now with its node) and how
    SLURM ended it."""
    ended = f"SLURM job {slurm_job.job_id} ended {info.state.value} (reason {info.reason}, exit code {info.exit_code})"
    ended_zh = f"SLURM 作业 {slurm_job.job_id} 以 {info.state.value} 结束（原因 {info.reason}，退出码 {info.exit_code}）"
    failure = error.failure
    if failure is not None and failure.rank is not None:
        node = next((n for n, ranks in slurm_job.node_ranks.items() if failure.rank in ranks), None)
        known = node is not None and node < len(slurm_job.nodes)
        where = f" on node {node} ({slurm_job.nodes[node]})" if known else ""
        where_zh = f"，在节点 {node}（{slurm_job.nodes[node]}）上" if known else ""
        code, code_zh = f" (exit code {failure.exit_code})", f"退出码 {failure.exit_code}）"
        return (error.summary.replace(code, code + where, 1) + f"; {ended}",
                error.summary_zh.replace(code_zh, code_zh + where_zh, 1) + f"；{ended_zh}")
    if srun_named:  # torchrun itself failed on a node (its rendezvous, a bad command): failure_error says which
        return f"{error.summary}; {ended}", f"{error.summary_zh}；{ended_zh}"
    return f"{plan.script.name} failed: {ended}", f"{plan.script.name} 失败：{ended_zh}"
