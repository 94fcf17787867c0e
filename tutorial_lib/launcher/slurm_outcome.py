"""How a launch on SLURM ended, as the launcher reports it: the ``SlurmJob`` a result or an error carries, which node
task srun says failed, and the error of a job that cannot start. Builders only: ``tutorial_lib.launcher.slurm_job``
decides when to draw, write and raise (as ``outcome`` does for local launches)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from ..errors import LaunchError
from ..runs.rundir import RunRecord, RunStatus
from ..slurm.commands import JobInfo
from ..slurm.target import CANNOT_START
from .live import Outcome

BATCH_PREFIX = "[batch] "  # the batch script's own lines in output.log
# The Chinese of slurm.target.CANNOT_START, for the summary a Chinese notebook shows (tl.language() == "zh").
CANNOT_START_ZH = {
    "PartitionNodeLimit": "它请求的节点数超过了分区拥有的节点数（或其中一些节点已 down 或 drain）",
    "PartitionTimeLimit": "它的时间限制超过了分区的上限（用更小的 time_limit，或换一个分区）",
    "InvalidAccount": "这个账户对当前用户无效（sacctmgr show assoc user=$USER）",
    "InvalidQOS": "这个 QOS 对当前用户或账户无效",
    "BadConstraints": "没有节点具备它请求的特性（--constraint）",
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
    """

    job_id: int
    state: str
    reason: str
    nodes: tuple[str, ...] = ()
    node_ranks: dict[int, list[int]] = field(default_factory=dict)
    exit_code: int | None = None
    signal: int | None = None
    waited_for: str = ""

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


def cannot_start_error(plan, info: JobInfo, elapsed: float, slurm_job: SlurmJob,
                       output_tail: list[str]) -> tuple[LaunchError, RunRecord, Outcome]:
    """The ``LaunchError`` of a job cancelled because it was pending for a reason that means it cannot start as
    submitted (``SlurmSpec.cancel_pending_reasons``), its run.json (not yet written) and its outcome."""
    why = CANNOT_START.get(info.reason, "SlurmSpec.cancel_pending_reasons names this reason")
    summary = (f"{plan.script.name} cannot start: SLURM job {slurm_job.job_id} was pending with reason {info.reason} "
               f"({why}); it was cancelled (scancel)")
    why_zh = CANNOT_START_ZH.get(info.reason, "SlurmSpec.cancel_pending_reasons 列出了这个原因")
    summary_zh = (f"{plan.script.name} 无法启动：SLURM 作业 {slurm_job.job_id} 一直在排队，原因 {info.reason}（{why_zh}）；"
                  "已取消（scancel）")
    error = LaunchError(summary, run_dir=plan.run_dir, command=plan.sbatch_argv, returncode=None,
                        output_tail=output_tail, job=slurm_job, summary_zh=summary_zh)
    record = RunRecord(RunStatus.FAILED, elapsed, **plan.shape("cold"), summary=summary, slurm_job=slurm_job.as_dict())
    return error, record, Outcome(RunStatus.FAILED, elapsed, f"cannot start: {info.reason}", f"无法启动：{info.reason}")


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
