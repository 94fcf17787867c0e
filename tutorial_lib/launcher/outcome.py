"""How a launch ended: the ``Outcome`` the live view draws, the ``LaunchError`` or ``LaunchTimeout`` the caller gets,
and the ``run.json`` record. Builders only: they take what the job left (its plan, its output pump, exit codes,
stacks) and return values; the launcher decides when to draw, write and raise (``tutorial_lib.launcher.run``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..causes import agent_failure
from ..errors import LaunchError, LaunchTimeout
from ..runs.rundir import LOGS, RunRecord, RunStatus
from ..torchrun.root_cause import find_root_cause
from ..torchrun.noise import NoiseFilter
from ..torchrun.root_cause import FINISHED, SIGNAL, RankFailure
from ..torchrun.stacks import innermost_frame, learner_stack, stopped_ranks_stacks
from ..torchrun.tee import split_rank_prefix
from .live import Outcome
from .output import OutputPump
from .plan import LOOPBACK, LaunchPlan, command_port
from .spec import LaunchSpec


def explain_agent_failure(output: str, spec: LaunchSpec, started: Sequence[int], port: int | None = None) -> str:
    """A sentence for failures of torchrun itself (no rank to blame), from its output; "" if unknown.

    Args:
        output: torchrun's output (every agent's).
        spec: the job.
        started: the node ranks this launch started.
        port: the rendezvous port the launch used (``spec.master_port``, or the free port picked for
            ``master_port=None``); ``None`` when not known.
    """
    cause = agent_failure(output)  # the doctor's table of causes: one classification for both
    kind = cause.name if cause is not None else ""
    if kind == "rendezvous timeout":
        missing = sorted(set(range(spec.nnodes)) - set(started))
        return (f"the rendezvous timed out after {spec.rendezvous_timeout_s:g} s (rendezvous_timeout_s) waiting "
                f"for {spec.nnodes} nodes; {len(started)} joined" + (f", node(s) {missing} were never started" if missing
                                                                      else "") + ". Start the same command on every node")
    if kind == "port in use":
        if spec.master_port is not None:
            return (f"port {spec.master_port} is already in use (EADDRINUSE) on {LOOPBACK}; pick another master_port, "
                    "or leave master_port=None for a free one")
        picked = f"port {port}" if port is not None else "the port"
        return (f"{picked}, picked as free for this launch (master_port=None), was taken by another process before "
                f"torchrun bound it (EADDRINUSE on {LOOPBACK}); launch again: each launch picks a new free port")
    return ""


def explain_agent_failure_zh(output: str, spec: LaunchSpec, started: Sequence[int], port: int | None = None) -> str:
    """The Chinese of ``explain_agent_failure`` (same arguments), for the live view of the Chinese edition."""
    cause = agent_failure(output)
    kind = cause.name if cause is not None else ""
    if kind == "rendezvous timeout":
        missing = sorted(set(range(spec.nnodes)) - set(started))
        return (f"rendezvous（汇合）在 {spec.rendezvous_timeout_s:g} s（rendezvous_timeout_s）后超时，一直在等待 {spec.nnodes} "
                f"个节点；{len(started)} 个已加入" + (f"，节点 {missing} 从未启动" if missing else "") +
                "。请在每个节点上启动同一条命令")
    if kind == "port in use":
        if spec.master_port is not None:
            return (f"{LOOPBACK} 上的端口 {spec.master_port} 已被占用（EADDRINUSE）；换一个 master_port，"
                    "或保持 master_port=None 以使用空闲端口")
        picked = f"端口 {port}" if port is not None else "该端口"
        return (f"{picked}是本次启动挑选的空闲端口（master_port=None），但在 torchrun 绑定之前被另一个进程占用"
                f"（{LOOPBACK} 上的 EADDRINUSE）；重新启动即可：每次启动都会挑选新的空闲端口")
    return ""


def _waiting_ranks(failure: RankFailure) -> str:
    """The ranks still waiting when ``failure``'s rank finished, as ``"0, 2"``."""
    return ", ".join(str(r) for r in sorted(e.rank for e in failure.ends if e.rank is not None and e.how != FINISHED))


def _other_signals(failure: RankFailure) -> dict[int, str]:
    """The other ranks a fatal signal ended: ``{rank: signal name}``."""
    return {r: name for r, name in failure.signals.items() if r != failure.rank}


def failure_text_zh(failure: RankFailure) -> str:
    """The Chinese of ``failure_text``: ``"在 rank 1 上失败（被 SIGSEGV 终止，退出码 -11）"``."""
    if failure.how == FINISHED:
        waiting = _waiting_ranks(failure)
        return (f"失败：rank {failure.rank} 已结束（退出码 0），而 rank {waiting} 还在等它"
                "（一个它从未调用的集合通信）")
    how = f"被 {failure.signal} 终止，" if failure.how == SIGNAL and failure.signal else ""
    text = f"在 rank {failure.rank} 上失败（{how}退出码 {failure.exit_code}）"
    if len(failure.raised) > 1:
        text += f"；rank {', '.join(map(str, failure.raised))} 各自抛出了错误"
    others = _other_signals(failure)
    if others:
        text += "；" + "，".join(f"rank {r} 被 {name} 终止" for r, name in others.items())
    return text


def failure_text(failure: RankFailure) -> str:
    """What the launch's error says of its root cause, after the script's name: ``"failed on rank 1 (killed by
    SIGSEGV, exit code -11)"``, ``"failed on rank 0 (exit code 1); ranks 0, 1 each raised"``, or for a rank that
    finished while the others waited for it, ``"failed: rank 1 finished (exit code 0) while rank 0 waited for it"``."""
    if failure.how == FINISHED:
        return (f"failed: rank {failure.rank} finished (exit code 0) while rank(s) {_waiting_ranks(failure)} "
                "waited for it (a collective it never called)")
    how = f"killed by {failure.signal}, " if failure.how == SIGNAL and failure.signal else ""
    text = f"failed on rank {failure.rank} ({how}exit code {failure.exit_code})"
    if len(failure.raised) > 1:
        text += f"; ranks {', '.join(map(str, failure.raised))} each raised"
    others = _other_signals(failure)
    if others:
        text += "; " + ", ".join(f"rank {r} killed by {name}" for r, name in others.items())
    return text


def _failed_themselves(failure: RankFailure | None) -> list[int]:
    """The ranks whose own end (an error, a lost peer, a signal, an exit) explains them, not where they were stopped."""
    if failure is None or not failure.ends:
        return []
    return [e.rank for e in failure.ends if e.rank is not None and e.rank not in failure.stopped]


def output_tail(transcript: Sequence[str], n: int = 30) -> list[str]:
    """The last ``n`` lines of the job's output without the ranks' ``faulthandler`` dumps (each rank's stack is in the
    error's ``stacks``, its runner frames left out; the dumps stay in ``output.log``)."""
    noise, kept = NoiseFilter(), []
    for line in transcript:
        if noise.kind(split_rank_prefix(line)[0], split_rank_prefix(line)[1]) != NoiseFilter.STACK:
            kept.append(line)
    return kept[-n:]


def failure_error(plan: LaunchPlan, pump: OutputPump, returncodes: dict[int, int], wall_time_s: float, *,
                  command: list[str], start: str = "cold") -> tuple[LaunchError, RunRecord, Outcome]:
    """The ``LaunchError`` of a job where some agent exited non-zero, its run.json (not yet written) and its outcome
    for the live view: the rank that failed first (or torchrun's own failure, explained), and where the stopped
    ranks were (in the error and run.json; the view's box says it in its own lines).

    Args:
        plan: the launch's plan.
        pump: the job's output pump (its transcripts and every rank's last lines).
        returncodes: each started node's agent exit code.
        wall_time_s: seconds from the launch to its end.
        command: the first node's torchrun argv (its rendezvous port is named if the port was taken).
        start: ``"warm"`` or ``"cold"``, for run.json.
    """
    spec, script = plan.spec, plan.script
    failed = [node for node in plan.nodes if returncodes[node] != 0]
    returncode = returncodes[failed[0]]
    # The rule the doctor uses too, over every node's output and log folder.
    log_dirs = {node: plan.node_log_dir(node) for node in plan.nodes} if spec.nnodes > 1 else {None: plan.node_log_dir(0)}
    failure = find_root_cause("\n".join(pump.transcript), log_dirs, pump.printer.tails)
    if failure is not None and failure.rank is not None:
        summary, summary_zh = f"{script.name} {failure_text(failure)}", f"{script.name} {failure_text_zh(failure)}"
    else:
        where, where_zh = (f" (node {failed[0]})", f"（节点 {failed[0]}）") if spec.nnodes > 1 else ("", "")
        summary = f"{script.name} failed: torchrun{where} exited with code {returncode}"
        summary_zh = f"{script.name} 失败：torchrun{where_zh} 以退出码 {returncode} 退出"
        facts = ("\n".join(pump.transcript), spec, plan.nodes, command_port(command))
        reason, reason_zh = explain_agent_failure(*facts), explain_agent_failure_zh(*facts)
        summary += f": {reason}" if reason else ""
        summary_zh += f"：{reason_zh}" if reason_zh else ""
    outcome = Outcome(RunStatus.FAILED, wall_time_s, summary, summary_zh)
    # The other ranks' stacks, printed when torchrun stopped them (faulthandler on SIGTERM): after a
    # collective timeout the failing rank is the one that waited, and these show where the culprit was.
    stacks = stopped_ranks_stacks(pump.ranked, plan.run_dir / LOGS, one_node=spec.nnodes == 1,
                                  failed_rank=failure.rank if failure else None,
                                  failed_themselves=_failed_themselves(failure))
    stacks = {rank: learner_stack(stack) for rank, stack in stacks.items()}  # the runner's frames stay in the log
    where = {rank: innermost_frame(stack) for rank, stack in stacks.items()}
    if where:
        summary += "; when stopped: " + "; ".join(f"rank {rank} was in {place}" for rank, place in sorted(where.items()))
    record = RunRecord(RunStatus.FAILED, wall_time_s, **plan.shape(start), returncode=returncode, summary=summary,
                       where=where)
    error = LaunchError(summary, run_dir=plan.run_dir, command=command, returncode=returncode, failure=failure,
                        output_tail=output_tail(pump.transcript), stacks=stacks, summary_zh=summary_zh)
    return error, record, outcome


def limit_text(spec: LaunchSpec, limit: str) -> tuple[float, str, str, str]:
    """The value of ``limit`` in ``spec``, what the job did to reach it, and the same in a few words (the live view's),
    in English and in Chinese."""
    if limit == "stall_timeout_s":
        what = f"made no progress for {spec.stall_timeout_s:g} s"
        # The stall clock starts at the first step a rank logs (or prints): the ranks did log steps, then none for
        # this long (the summary goes on with each rank's last step).
        return (spec.stall_timeout_s, f"{what} (no rank logged a new step for {spec.stall_timeout_s:g} s; "
                                      "limit stall_timeout_s)", what,
                f"{spec.stall_timeout_s:g} s 内没有进展（stall_timeout_s）")
    what = f"timed out after {spec.timeout_s:g} s"
    return spec.timeout_s, f"{what} (limit timeout_s)", what, f"运行超过 {spec.timeout_s:g} s 后超时（timeout_s）"


def timeout_error(plan: LaunchPlan, pump: OutputPump, limit: str, elapsed: float, ranks_running: list[int],
                  last_steps: dict[int, int], stacks: dict[int, str], returncode: int | None, *,
                  command: list[str], start: str = "cold") -> tuple[LaunchTimeout, RunRecord, Outcome]:
    """The ``LaunchTimeout`` of a job stopped at ``limit``, its run.json (not yet written) and its outcome."""
    limit_s, what, short, short_zh = limit_text(plan.spec, limit)
    stacks = {rank: learner_stack(stack) for rank, stack in stacks.items()}  # the runner's frames stay in the log
    summary = (f"{plan.script.name} {what} and was stopped; "
               f"ranks still running: {ranks_running or 'none'}; last step per rank: {last_steps or 'none'}")
    if stacks:
        summary += "; where each rank was: " + "; ".join(
            f"rank {rank} in {innermost_frame(stack)}" for rank, stack in sorted(stacks.items()))
    error = LaunchTimeout(summary, timeout_s=limit_s, limit=limit, last_steps=last_steps, stacks=stacks,
                          run_dir=plan.run_dir, command=command, returncode=returncode,
                          output_tail=output_tail(pump.transcript), summary_zh=f"{plan.script.name} {short_zh}，已被停止")
    record = RunRecord(RunStatus.TIMEOUT, elapsed, **plan.shape(start), summary=summary, timeout_s=limit_s, limit=limit,
                       where={rank: innermost_frame(stack) for rank, stack in stacks.items()})
    return error, record, Outcome(RunStatus.TIMEOUT, elapsed, short, short_zh)


def stopped_outcome(plan: LaunchPlan, exc: BaseException, elapsed: float, *,
                    start: str = "cold") -> tuple[RunRecord, Outcome]:
    """The run.json and outcome of a job stopped by an interrupt (``KeyboardInterrupt``) or another exception."""
    interrupted = isinstance(exc, KeyboardInterrupt)
    what = "interrupted" if interrupted else f"stopped by {type(exc).__name__}"
    what_zh = "已中断" if interrupted else f"被 {type(exc).__name__} 停止"
    status = RunStatus.INTERRUPTED if interrupted else RunStatus.STOPPED
    return RunRecord(status, elapsed, **plan.shape(start), summary=what), Outcome(status, elapsed, what, what_zh)

