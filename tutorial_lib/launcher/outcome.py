"""How a launch ended: the ``Outcome`` the live view draws, the ``LaunchError`` or ``LaunchTimeout`` the caller gets,
and the ``run.json`` record. Builders only: they take what the job left (its plan, its output pump, exit codes,
stacks) and return values; the launcher decides when to draw, write and raise (``tutorial_lib.launcher.run``).

Each builder takes ``told``, the job (``tutorial_lib.launcher.interface.Job``), and asks it what it knows beyond
torchrun's output before the error is made: its SLURM job, the node a rank ran on, how SLURM ended it. ``told=None``:
a local job's answers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..diagnosis.causes import CauseId, agent_failure
from ..diagnosis.doctor import examine
from ..errors import LaunchError, LaunchTimeout
from ..i18n import N_, Joined, Message, Nn_, joined
from ..runs.rundir import LOGS, RunRecord, RunStatus
from ..torchrun.root_cause import find_root_cause
from ..torchrun.noise import NoiseFilter
from ..torchrun.root_cause import FINISHED, SIGNAL, RankFailure
from ..torchrun.stacks import Place, learner_stack, places, stopped_ranks_stacks
from ..torchrun.output_lines import parse_line, torchrun_output
from .live import Outcome
from .output import OutputPump
from .plan import LOOPBACK, LaunchPlan, command_port
from .spec import LaunchSpec

log = logging.getLogger(__name__)


def explain_agent_failure(output: str, spec: LaunchSpec, started: Sequence[int], port: int | None = None) -> Message | None:
    """A sentence for failures of torchrun itself (no rank to blame), from its output, worded when shown (``str()``:
    English); ``None`` if unknown.

    Args:
        output: torchrun's output (every agent's).
        spec: the job.
        started: the node ranks this launch started.
        port: the rendezvous port the launch used (``spec.master_port``, or the free port picked for
            ``master_port=None``); ``None`` when not known.
    """
    cause = agent_failure(output)  # the doctor's table of causes: one classification for both
    kind = cause.id if cause is not None else None
    if kind == CauseId.RENDEZVOUS_TIMEOUT:
        missing = sorted(set(range(spec.nnodes)) - set(started))
        fields = {"timeout_s": f"{spec.rendezvous_timeout_s:g}", "nnodes": spec.nnodes, "joined": len(started),
                  "missing": missing}
        if missing:
            return Message(N_("the rendezvous timed out after {timeout_s} s (rendezvous_timeout_s) waiting for {nnodes} "
                              "nodes; {joined} joined, node(s) {missing} were never started. Start the same command on "
                              "every node"), fields)
        return Message(N_("the rendezvous timed out after {timeout_s} s (rendezvous_timeout_s) waiting for {nnodes} "
                          "nodes; {joined} joined. Start the same command on every node"), fields)
    if kind == CauseId.PORT_IN_USE:
        if spec.master_port is not None:
            return Message(N_("port {port} is already in use (EADDRINUSE) on {host}; pick another master_port, or leave "
                              "master_port=None for a free one"), {"port": spec.master_port, "host": LOOPBACK})
        if port is not None:
            return Message(N_("port {port}, picked as free for this launch (master_port=None), was taken by another "
                              "process before torchrun bound it (EADDRINUSE on {host}); launch again: each launch picks "
                              "a new free port"), {"port": port, "host": LOOPBACK})
        return Message(N_("the port, picked as free for this launch (master_port=None), was taken by another process "
                          "before torchrun bound it (EADDRINUSE on {host}); launch again: each launch picks a new free "
                          "port"), {"host": LOOPBACK})
    return None


def _waiting_ranks(failure: RankFailure) -> list[int]:
    """The ranks still waiting when ``failure``'s rank finished."""
    return sorted(e.rank for e in failure.ends if e.rank is not None and e.how != FINISHED)


def _other_signals(failure: RankFailure) -> dict[int, str]:
    """The other ranks a fatal signal ended: ``{rank: signal name}``."""
    return {r: name for r, name in failure.signals.items() if r != failure.rank}


def failure_text(failure: RankFailure) -> Message | Joined:
    """What the launch's error says of its root cause, after the script's name, worded when shown (``str()``:
    ``"failed on rank 1 (killed by SIGSEGV, exit code -11)"``, ``"failed on rank 0 (exit code 1); ranks 0, 1 each
    raised"``, or for a rank that finished while the others waited for it, ``"failed: rank 1 finished (exit code 0)
    while rank 0 waited for it (a collective it never called)"``)."""
    if failure.how == FINISHED:
        waiting = _waiting_ranks(failure)
        singular, plural = Nn_("failed: rank {rank} finished (exit code 0) while rank {waiting} waited for it (a "
                               "collective it never called)",
                               "failed: rank {rank} finished (exit code 0) while ranks {waiting} waited for it (a "
                               "collective it never called)")
        return Message(singular, {"rank": failure.rank, "waiting": ", ".join(map(str, waiting))}, plural,
                       max(len(waiting), 1))
    if failure.how == SIGNAL and failure.signal:
        parts = [Message(N_("failed on rank {rank} (killed by {signal}, exit code {code})"),
                         {"rank": failure.rank, "signal": failure.signal, "code": failure.exit_code})]
    else:
        parts = [Message(N_("failed on rank {rank} (exit code {code})"), {"rank": failure.rank, "code": failure.exit_code})]
    if len(failure.raised) > 1:
        parts.append(Message(N_("; ranks {ranks} each raised"), {"ranks": ", ".join(map(str, failure.raised))}))
    others = _other_signals(failure)
    if others:
        parts.append(Message(N_("; {killed}"), {"killed": joined(
            Message(N_("rank {rank} killed by {signal}"), {"rank": r, "signal": name}) for r, name in others.items())}))
    return parts[0] if len(parts) == 1 else joined(parts, "")


def when_stopped(where: dict[int, Place]) -> str:
    """The English tail of a failure's summary that says where each stopped rank was (``"; when stopped: rank 0 was
    in train.py:12 in main"``), ``""`` for none.

    Args:
        where: ``{rank: Place}`` (``LaunchError.where``).
    """
    if not where:
        return ""
    return "; when stopped: " + "; ".join(f"rank {rank} was in {place}" for rank, place in sorted(where.items()))


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
        rank, text = parse_line(line) or (None, line)  # a launch's transcript: labelled lines (output_lines)
        if noise.kind(rank, text) != NoiseFilter.STACK:
            kept.append(line)
    return kept[-n:]


def failure_error(plan: LaunchPlan, pump: OutputPump, returncodes: dict[int, int], wall_time_s: float, *,
                  command: list[str], start: str = "cold", told=None) -> tuple[LaunchError, RunRecord, Outcome]:
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
        told: the job (``interface.Job``: its ``said_failure`` words the headline and summary, its ``slurm_job`` goes
            into the error and run.json); ``None``: a local job's words, no SLURM job.
    """
    spec, script = plan.spec, plan.script
    failed = [node for node in plan.nodes if returncodes[node] != 0]
    returncode = returncodes[failed[0]]
    # The rule the doctor uses too, over every node's output and log folder.
    log_dirs = {node: plan.node_log_dir(node) for node in plan.nodes} if spec.nnodes > 1 else {None: plan.node_log_dir(0)}
    failure = find_root_cause("\n".join(pump.transcript), log_dirs, pump.printer.tails)
    if failure is not None and failure.rank is not None:
        headline = Message(N_("{script} {failed}"), {"script": script.name, "failed": failure_text(failure)})
    else:
        fields = {"script": script.name, "code": returncode, "node": failed[0]}
        headline = (Message(N_("{script} failed: torchrun (node {node}) exited with code {code}"), fields)
                    if spec.nnodes > 1 else Message(N_("{script} failed: torchrun exited with code {code}"), fields))
        reason = explain_agent_failure(torchrun_output("\n".join(pump.transcript)), spec, plan.nodes,
                                       command_port(command))
        if reason is not None:
            headline = Message(N_("{failed}: {reason}"), {"failed": headline, "reason": reason})
    # The other ranks' stacks, printed when torchrun stopped them (faulthandler on SIGTERM): after a
    # collective timeout the failing rank is the one that waited, and these show where the culprit was.
    stacks = stopped_ranks_stacks(pump.ranked, plan.run_dir / LOGS, one_node=spec.nnodes == 1,
                                  failed_rank=failure.rank if failure else None,
                                  failed_themselves=_failed_themselves(failure))
    stacks = {rank: learner_stack(stack) for rank, stack in stacks.items()}  # the runner's frames stay in the log
    where = places(stacks)
    headline, summary = (told.said_failure(headline, where, failure) if told is not None
                         else (headline, f"{headline}{when_stopped(where)}"))
    job = told.slurm_job() if told is not None else None
    record = RunRecord(RunStatus.FAILED, wall_time_s, **plan.shape(start), returncode=returncode, summary=summary,
                       where=where, slurm_job=job.as_dict() if job is not None else None)
    error = LaunchError(summary, run_dir=plan.run_dir, command=command, returncode=returncode, failure=failure,
                        output_tail=output_tail(pump.transcript), stacks=stacks, headline=headline, job=job,
                        output=pump.transcript)
    return error, record, Outcome(RunStatus.FAILED, wall_time_s, headline)


def limit_text(spec: LaunchSpec, limit: str) -> tuple[float, str, Message]:
    """The value of ``limit`` in ``spec``, what the job did to reach it (English, for the error), and the same in a few
    words, worded when shown (the live view's)."""
    if limit == "stall_timeout_s":
        short = Message(N_("made no progress for {timeout_s} s"), {"timeout_s": f"{spec.stall_timeout_s:g}"})
        # The stall clock starts at the first step a rank logs (or prints): the ranks did log steps, then none for
        # this long (the summary goes on with each rank's last step).
        return (spec.stall_timeout_s, f"{short} (no rank logged a new step for {spec.stall_timeout_s:g} s; "
                                      "limit stall_timeout_s)", short)
    short = Message(N_("timed out after {timeout_s} s"), {"timeout_s": f"{spec.timeout_s:g}"})
    return spec.timeout_s, f"{short} (limit timeout_s)", short


def timeout_error(plan: LaunchPlan, pump: OutputPump, limit: str, elapsed: float, ranks_running: list[int],
                  last_steps: dict[int, int], stacks: dict[int, str], returncode: int | None, *,
                  command: list[str], start: str = "cold", told=None) -> tuple[LaunchTimeout, RunRecord, Outcome]:
    """The ``LaunchTimeout`` of a job stopped at ``limit``, its run.json (not yet written) and its outcome; ``told``:
    the job (``interface.Job``: its ``said_stopped`` adds what it knows, its ``slurm_job`` is carried), ``None``: a
    local job."""
    limit_s, what, short = limit_text(plan.spec, limit)
    stacks = {rank: learner_stack(stack) for rank, stack in stacks.items()}  # the runner's frames stay in the log
    summary = (f"{plan.script.name} {what} and was stopped; "
               f"ranks still running: {ranks_running or 'none'}; last step per rank: {last_steps or 'none'}")
    where = places(stacks)
    if stacks:
        summary += "; where each rank was: " + "; ".join(
            f"rank {rank} in {where.get(rank, '')}" for rank in sorted(stacks))
    headline = Message(N_("{script} {what} and was stopped"), {"script": plan.script.name, "what": short})
    if told is not None:
        headline, summary = told.said_stopped(headline, summary)
    job = told.slurm_job() if told is not None else None
    error = LaunchTimeout(summary, timeout_s=limit_s, limit=limit, last_steps=last_steps, stacks=stacks,
                          run_dir=plan.run_dir, command=command, returncode=returncode,
                          output_tail=output_tail(pump.transcript), output=pump.transcript, headline=headline, job=job)
    record = RunRecord(RunStatus.TIMEOUT, elapsed, **plan.shape(start), summary=summary, timeout_s=limit_s, limit=limit,
                       where=where, slurm_job=job.as_dict() if job is not None else None)
    return error, record, Outcome(RunStatus.TIMEOUT, elapsed, short)


def stopped_outcome(plan: LaunchPlan, exc: BaseException, elapsed: float, *,
                    start: str = "cold", told=None) -> tuple[RunRecord, Outcome]:
    """The run.json and outcome of a job stopped by an interrupt (``KeyboardInterrupt``) or another exception
    (``told``: the job, whose ``slurm_job`` run.json records; ``None``: none)."""
    interrupted = isinstance(exc, KeyboardInterrupt)
    what = (Message(N_("interrupted")) if interrupted
            else Message(N_("stopped by {error}"), {"error": type(exc).__name__}))
    status = RunStatus.INTERRUPTED if interrupted else RunStatus.STOPPED
    stopped_by = "" if interrupted else type(exc).__name__
    job = told.slurm_job() if told is not None else None
    return (RunRecord(status, elapsed, **plan.shape(start), summary=str(what), stopped_by=stopped_by,
                      slurm_job=job.as_dict() if job is not None else None),
            Outcome(status, elapsed, what))



def with_diagnosis(error: LaunchError) -> LaunchError:
    """``error`` with the doctor's report made now, once, from the run's evidence (``error.diagnosis``: what
    ``tl.diagnose(error)`` returns without reading the run directory again): the output the launcher held
    (``error.output``, the lines it wrote to ``output.log``: the file is not read again), its root cause and stacks.
    Call it after run.json is written. A doctor that cannot read the run is logged and leaves ``diagnosis`` ``None``:
    it never hides the launch's error."""
    try:
        error.diagnosis = examine(error)
    except Exception:  # noqa: BLE001
        log.warning("the doctor could not examine %s", error.run_dir, exc_info=True)
    return error
