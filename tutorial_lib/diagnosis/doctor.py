"""The doctor: say in a few lines what went wrong in a failed run, and what to do about it.

``diagnose(run_dir)`` (or ``diagnose(error)`` with the ``LaunchError`` a launch raised) reads what a run
left behind: torchrun's failure summary and the per-rank ``error.json`` files ``@record`` wrote (read by
``tutorial_lib.torchrun``), ``output.log`` (every rank's stdout and stderr; of a launch's error, the lines the launcher
held, ``LaunchError.output``: the file is not read again), ``run.json`` and the per-rank metrics. It names the rank
that failed first, its exit code (and the signal behind a negative one), the last lines of its traceback, the last
step every rank logged, and a suspected cause: the first of the known messages (``tutorial_lib.diagnosis.causes``)
that the evidence holds, each with a one-line fix and the notebook that shows it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, LaunchError, LaunchTimeout, MetricsError, RankFailure
from ..i18n import Message, _
from ..runs.metrics import last_steps as logged_last_steps
from ..runs.printed_metrics import last_printed_steps
from ..runs.rundir import COMMAND_TXT, LOGS, OUTPUT_LOG, RunRecord, RunStatus, available_scripts, node_log_dirs
from ..torchrun.attempts import attempts, read_error_file
from ..torchrun.formats import (CHILD_FAILED, DOCTOR_NOISE, EXCEPTION_LINE, NPROC_PER_NODE_ARG, SYNTAX_ERROR_LINE,
                                SYNTAX_FILE_LINE, TRACEBACK_FRAME, TRACEBACK_START)
from ..torchrun.noise import NoiseFilter
from ..torchrun.root_cause import FINISHED, LOST_PEER, STOPPED, before_the_last_attempt, find_root_cause
from ..torchrun.stacks import (Place, all_frames, fatal_report, innermost_frame, last_meaningful_line, places,
                               stopped_ranks_stacks)
from ..torchrun.output_lines import rank_lines, torchrun_output
from ..torchrun.rank_logs import labelled_output
from ..torchrun.tee import RankTails
from .causes import (CAUSES, EVERY_RANK_RAISED_FIX, EXCEPTION_FIX, EXIT_FIX, FINISHED_FIX, HANG_FIX, INTERRUPTED_FIX,
                     NCCL_TIMEOUT, NEVER_STARTS_FIX, NO_ERROR_FIX, P2P_HINT, REFUSED_FIX, SIGNAL_FIX, SIGNAL_FIXES, STOPPED_FIX,
                     SYNTAX_FIX, UNKNOWN_FIX, CauseId, cause_by_id, exit_code_meaning, signal_name)
from .waiting import waiting_cause
from .report import Diagnosis, in_collective

# The launcher's helpers that run the learner's script (command.txt names them before the script itself).
_RUNNERS = ("rank_runner.py", "warm_start.py")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _frame_indent(line: str) -> int | None:
    """The indentation of a traceback frame line (``  File "x.py", line 3, in f``), else ``None``."""
    return _indent(line) if TRACEBACK_FRAME.match(line) else None


def _is_source(frame_indent: int | None, line: str) -> bool:
    """Whether ``line``, after a line whose ``_frame_indent`` is ``frame_indent``, is that frame's source code (indented
    deeper; a frame without source, ``File "<string>"``, is followed by the next frame or the exception line) or a
    ``^^^`` marker under it."""
    stripped = line.strip()
    return (frame_indent is not None and _indent(line) > frame_indent) or (stripped != "" and set(stripped) <= set("^~"))


def _without_source_lines(lines: list[str]) -> list[str]:
    """``lines`` (one rank's, in order) without the source lines of traceback frames and their ``^^^`` markers."""
    kept, frame_indent = [], None
    for line in lines:
        if not _is_source(frame_indent, line):
            kept.append(line)
        frame_indent = _frame_indent(line)
    return kept


def _script(run_dir: Path) -> str | None:
    """The lesson script the run ran (``"train_lm"``), from ``command.txt``; ``None`` for a script of your own (any
    other name) or when the folder does not say. A lesson's fix may name its flags and files; another script's may
    not."""
    try:
        text = (run_dir / COMMAND_TXT).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        script = next((Path(w) for w in words if w.endswith(".py") and Path(w).name not in _RUNNERS), None)
        if script is not None:
            return script.stem if script.stem in available_scripts() else None
    return None


def _error_files(run_dir: Path) -> dict[int | None, str]:
    """Tracebacks of every error file of every attempt (any node), keyed by local rank (a later attempt's wins)."""
    log_dirs = list(node_log_dirs(run_dir).values()) or [run_dir / LOGS]
    found = {}
    for attempt in (a for log_dir in log_dirs for a in attempts(log_dir)):
        for local_rank, path in sorted(attempt.error_files().items()):
            text = read_error_file(path)
            if text:
                found[local_rank] = text
    return found


def _exception_line(traceback: str) -> str:
    """The ``SomeError: message`` line of a traceback (the last one), or its last non-empty line."""
    lines = [line.strip() for line in traceback.splitlines() if line.strip()]
    exceptions = [line for line in lines if EXCEPTION_LINE.match(line)]
    return exceptions[-1] if exceptions else (lines[-1] if lines else "")


def _fatal_error(lines: list[str]) -> tuple[str, Place | None]:
    """``("Fatal Python error: Segmentation fault", place)``: the first fatal error in ``lines`` and where the crashing
    thread was (``None``: its stack names no frame); ``("", None)`` if there is none.

    Python's faulthandler (enabled in torchrun's workers) prints the fatal error, then the crashing thread's
    stack, innermost frame first; ``innermost_frame`` reads it as the launcher does for stacks on a timeout.
    """
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error:"):
            return line.strip(), innermost_frame("\n".join(lines[i + 1:i + 40]))
    return "", None


def _fatal_evidence(lines: list[str]) -> str:
    """``"Fatal Python error: Segmentation fault at train.py:12 in main -> distributed.py:1473 in _ddp_init_helper"``
    (``_fatal_error``, shown), or ``""``."""
    error, place = _fatal_error(lines)
    return error + (f" at {place}" if error and place is not None else "")


def _aborted_in_collective(signal_name_: str | None, lines: list[str]) -> bool:
    """A rank that gloo aborted (SIGABRT, ``gloo::EnforceNotMet``) while its main thread was in a collective."""
    if signal_name_ != "SIGABRT" or not any("gloo::EnforceNotMet" in line for line in lines):
        return False
    _error, place = _fatal_error(lines)
    return place is not None and in_collective(place)


def _last_steps(run_dir: Path) -> dict[int, int]:
    """Every rank's last step: from its metrics JSON, else (a script of your own) from the lines it printed."""
    try:
        printed = last_printed_steps(run_dir)
    except MetricsError:
        printed = {}
    try:
        return {**printed, **logged_last_steps(run_dir)}
    except MetricsError:
        return printed


def _check_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise ConfigError(f"run_dir {str(run_dir)!r} does not exist; pass the run directory of a launch "
                          "(LaunchError.run_dir, LaunchResult.run_dir) or the error itself")
    if not any((run_dir / name).exists() for name in (OUTPUT_LOG, COMMAND_TXT, LOGS)):
        raise ConfigError(f"{str(run_dir)!r} is not a run directory (no output.log, command.txt or logs/): "
                          "pass the folder a launch created")


def _ranks_on_this_machine(run_dir: Path, record: RunRecord | None) -> int | None:
    """How many ranks the launch ran on this machine: ``nnodes * nproc_per_node`` from ``run.json`` (simulated
    nodes share the machine), else the sum of ``--nproc-per-node`` over ``command.txt`` (one line per node).
    ``None`` when neither says."""
    if record is not None and isinstance(record.nproc_per_node, int):
        return record.nproc_per_node * int(record.nnodes or 1)
    try:
        counts = NPROC_PER_NODE_ARG.findall((run_dir / COMMAND_TXT).read_text())
    except OSError:
        return None
    return sum(map(int, counts)) if counts else None


@dataclass
class _RankOutput:
    """``output.log`` read rank by rank.

    Attributes:
        ranked: every ``(rank, line)`` in order (``rank`` is ``None`` for torchrun's own lines).
        by_rank: each rank's lines, without version noise (e.g. DCP's TypedStorage warning).
        lines: the lines that are evidence: no version noise, no C++ log lines or DETAIL fingerprints.
        tails: every rank's last lines, as the launcher keeps them (nothing printed).
    """

    ranked: list[tuple[int | None, str]] = field(default_factory=list)
    by_rank: dict[int | None, list[str]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    tails: RankTails = field(default_factory=RankTails)


def _read_output(run_dir: Path, error: LaunchError | None) -> str:
    """The run's ``output.log`` (``""`` if there is none), after checking that ``run_dir`` is a run directory; of an
    error the launcher raised, the lines it held (``error.output``), not the file.

    Raises:
        ConfigError: not a run directory, or (given a folder, not an error) one whose launch did not start.
    """
    _check_run_dir(run_dir)
    if error is not None and error.output:
        return "\n".join(error.output)  # the launcher's transcript: output.log's lines, as written
    log_path = run_dir / OUTPUT_LOG
    # No output.log: a torchrun job the launcher did not pump (a torchft replica group's attempt): the ranks' own logs
    output = log_path.read_text(errors="replace") if log_path.exists() else labelled_output(run_dir / LOGS)
    if error is None and output == "" and not (run_dir / LOGS).exists():
        what = "an empty output.log" if log_path.exists() else "no output.log"
        raise ConfigError(f"{str(run_dir)!r} holds {what} and no logs/: the launch did not start (and its run.json "
                          "does not say why)")
    return output


def _split_ranks(output: str) -> _RankOutput:
    """``output`` rank by rank (see ``_RankOutput``)."""
    ranks = _RankOutput()
    noise = NoiseFilter()
    frame_indent: dict[int | None, int | None] = {}  # each rank's previous line's _frame_indent
    for rank, text in rank_lines(output):  # either format (output_lines): labelled lines, or an older launch's --tee
        ranks.ranked.append((rank, text))
        if noise.kind(rank, text) == NoiseFilter.VERSION:
            continue  # e.g. DCP's TypedStorage warning: a rank's last words are what it printed before it
        ranks.tails.add(rank, text)
        ranks.by_rank.setdefault(rank, []).append(text)
        source, frame_indent[rank] = _is_source(frame_indent.get(rank), text), _frame_indent(text)
        if not DOCTOR_NOISE.search(text) and not source:  # a frame's source line is code, not evidence
            ranks.lines.append(text)
    return ranks


def _run_failed(error: LaunchError | None, timed_out: bool, failure: RankFailure | None,
                error_files: dict[int | None, str], output: str) -> bool:
    """Whether anything says the run failed: an error, a timeout, a root cause, an error file, torchrun's traceback
    (``output``: the run's output.log, either format)."""
    said = torchrun_output(output)
    return (error is not None or timed_out or failure is not None or bool(error_files)
            or CHILD_FAILED in said or TRACEBACK_START.search(said) is not None)


def _run_last_steps(run_dir: Path, error: LaunchError | None) -> dict[int, int]:
    """Every rank's last step (metrics JSON, else printed lines); a ``LaunchTimeout``'s own ``last_steps`` win."""
    last_steps = dict(error.last_steps) if isinstance(error, LaunchTimeout) and error.last_steps else {}
    return {**_last_steps(run_dir), **last_steps}


def _where(run_dir: Path, error: LaunchError | None, record: RunRecord | None, ranked: list[tuple[int | None, str]],
           failure: RankFailure, timed_out: bool) -> dict[int, Place]:
    """``{rank: Place}``: the error's or ``run.json``'s, else (not on a timeout) where the stacks the other ranks
    printed when torchrun stopped them (SIGTERM) say they were."""
    where = dict(getattr(error, "where", {}) or {})
    where = where or (dict(record.where) if record is not None else {})
    if not where and not timed_out:
        themselves = [e.rank for e in failure.ends if e.rank is not None and e.rank not in failure.stopped]
        stacks = stopped_ranks_stacks(ranked, run_dir / LOGS, one_node=not node_log_dirs(run_dir),
                                      failed_rank=failure.rank, failed_themselves=themselves)
        where = places(stacks)
    return where


def _error_line(failure: RankFailure, timed_out: bool, lines: list[str]) -> str:
    """The root cause's exception line; when no rank failed (torchrun itself did), torchrun's own last one."""
    error_line = _exception_line(failure.traceback) if failure.traceback else ""
    if not error_line and failure.rank is None and not timed_out:  # torchrun's own traceback is in the output
        torchrun_errors = [t for t in lines if EXCEPTION_LINE.match(t.strip()) and CHILD_FAILED not in t]
        error_line = torchrun_errors[-1].strip() if torchrun_errors else ""
    return error_line


def _limits(error: LaunchError | None, record: RunRecord | None, timed_out: bool) -> tuple[float | None, str]:
    """``(timeout_s, limit)`` of ``Diagnosis``: from a ``LaunchTimeout``, else from ``run.json``."""
    timeout_s = error.timeout_s if isinstance(error, LaunchTimeout) else record.timeout_s if record else None
    limit = (getattr(error, "limit", "timeout_s") if isinstance(error, LaunchTimeout)
             else (record.limit if record and record.limit else "timeout_s") if timed_out else "")
    return timeout_s, limit


def _failed_diagnosis(run_dir: Path, error: LaunchError | None, record: RunRecord | None, failure: RankFailure,
                      ranks: _RankOutput, timed_out: bool, recovered: bool, last_steps: dict[int, int]) -> Diagnosis:
    """The ``Diagnosis`` of a failed run before its cause is known: who failed, how, where every rank was."""
    tb_lines = [line for line in (failure.traceback or "").splitlines() if line.strip()]
    timeout_s, limit = _limits(error, record, timed_out)
    fatal = failure.fatal_error or fatal_report(ranks.by_rank.get(failure.rank, []))
    return Diagnosis(
        run_dir=run_dir, failed=not recovered, recovered=recovered, rank=failure.rank, exit_code=failure.exit_code,
        signal=signal_name(failure.exit_code), error=_error_line(failure, timed_out, ranks.lines),
        traceback_tail=tb_lines[-3:] or list(failure.log_tail[-3:]), last_steps=last_steps,
        where=_where(run_dir, error, record, ranks.ranked, failure, timed_out), timeout_s=timeout_s, limit=limit,
        raised=failure.raised, signals=failure.signals, finished=failure.finished,
        stack=all_frames(fatal.splitlines()),
    )


def _match_cause(diagnosis: Diagnosis, texts: list[str], timed_out: bool) -> bool:
    """Set the first of ``CAUSES`` whose pattern a line of ``texts`` matches (in ``texts``' order; never the source
    line of a traceback frame); ``False`` if none does. On a timeout, the causes from "collective timeout (hang)" on
    are not tried: the stacks say more. The fix is the one for the script the run ran (``Cause.fix_for``)."""
    for cause in CAUSES:
        if timed_out and cause.id in (CauseId.COLLECTIVE_TIMEOUT, CauseId.NCCL_ERROR):
            return False  # a wall-clock timeout is a hang; the stacks say more than a message
        if cause.requires is not None and not any(map(cause.requires.search, texts)):
            continue
        for text in texts:
            match = next((m for m in map(cause.pattern.search, _without_source_lines(text.splitlines())) if m), None)
            if match:
                line = match.string.strip()
                start = max(0, match.start() - len(match.string) + len(line) - 100)
                evidence = line if start == 0 else "..." + line[start:]
                evidence = cause.describe(line) if cause.describe else evidence
                diagnosis.cause_id, diagnosis.evidence = cause.id, evidence
                diagnosis.fix_text = Message(cause.fix_for(_script(diagnosis.run_dir)))
                nccl_timeout = cause.id == CauseId.COLLECTIVE_TIMEOUT and any(map(NCCL_TIMEOUT.search, texts))
                nccl = nccl_timeout or cause.id == CauseId.NCCL_ERROR
                if nccl and (_ranks_on_this_machine(diagnosis.run_dir, RunRecord.read(diagnosis.run_dir)) or 0) > 1:
                    # NCCL (so GPUs), several ranks on one machine: P2P between them can hang or fail a collective
                    diagnosis.fix_text = diagnosis.fix_text + Message(P2P_HINT)
                return True
    return False


def _last_words(failure: RankFailure, rank_lines_: list[str]) -> str:
    """A rank's faulthandler report, else the last line of its log tail (not faulthandler's module list)."""
    return _fatal_evidence(failure.fatal_error.splitlines()) or _fatal_evidence(rank_lines_) or next(
        (t for t in reversed(failure.log_tail) if t.strip() and not t.startswith("Extension modules")), "")


def _exception_fix(failure: RankFailure) -> Message:
    """The fix for a rank's own exception: the others lost their peer, or raised errors too."""
    if len(failure.raised) > 1:
        return Message(EVERY_RANK_RAISED_FIX, {"ranks": ", ".join(map(str, failure.raised)), "rank": failure.rank})
    return Message(EXCEPTION_FIX, {"rank": failure.rank})


def _finished_cause(diagnosis: Diagnosis, failure: RankFailure) -> None:
    """The cause of a run whose first "failure" is a rank that returned while the others waited in a collective."""
    waiting = sorted(e.rank for e in failure.ends if e.rank is not None and e.how in (LOST_PEER, STOPPED))
    diagnosis.cause_id = CauseId.RANK_FINISHED
    diagnosis.fix_text = Message(FINISHED_FIX[0], {"rank": failure.rank, "waiting": ", ".join(map(str, waiting)) or "?"},
                                 FINISHED_FIX[1], max(len(waiting), 1))
    peer = next((e for e in failure.ends if e.how == LOST_PEER and e.traceback), None)
    diagnosis.evidence = (_("rank {rank}, waiting: {error}", rank=peer.rank, error=_exception_line(peer.traceback))
                          if peer else _("rank {rank} exited 0", rank=failure.rank))


def _syntax_cause(diagnosis: Diagnosis, failure: RankFailure) -> bool:
    """Set the cause "syntax error" (file, line and Python's message) when the failed rank's last words are Python's
    report of a file it could not parse: its traceback's exception (a module the script imports), else (the script
    itself: Python prints no traceback, so @record writes no error file) the last line of its log."""
    lines = (failure.traceback or "").splitlines() or list(failure.log_tail)
    last = _exception_line("\n".join(lines)) if failure.traceback else last_meaningful_line(lines)
    if not SYNTAX_ERROR_LINE.match(last):
        return False
    end = max(i for i, line in enumerate(lines) if line.strip() == last)
    where = next((m for m in map(SYNTAX_FILE_LINE.match, reversed(lines[:end])) if m), None)
    if where is None:
        return False
    diagnosis.cause_id, diagnosis.evidence = CauseId.SYNTAX_ERROR, f"{where['path']}, line {where['line']}"
    diagnosis.error = diagnosis.error or last
    diagnosis.fix_text = Message(SYNTAX_FIX, {"path": where["path"], "line": where["line"]})
    return True


def _fallback_cause(diagnosis: Diagnosis, failure: RankFailure, rank_lines_: list[str], timed_out: bool) -> None:
    """Set the cause when no message of ``CAUSES`` matched: from the timeout, the exception, the signal or the
    exit code. ``rank_lines_``: the failed rank's lines of output."""
    if timed_out:
        diagnosis.cause_id = (CauseId.HANG_NO_PROGRESS if diagnosis.limit == "stall_timeout_s"
                              else CauseId.HANG_WALL_CLOCK)
        diagnosis.fix_text = Message(HANG_FIX)
        diagnosis.evidence = f"last step per rank {diagnosis.last_steps}" if diagnosis.last_steps else ""
    elif diagnosis.error and diagnosis.signal is None:
        name = diagnosis.error.split(":", 1)[0]
        diagnosis.cause_id, diagnosis.cause_fields = CauseId.PYTHON_EXCEPTION, {"name": name}
        diagnosis.evidence = diagnosis.error
        diagnosis.fix_text = _exception_fix(failure)
    elif _aborted_in_collective(diagnosis.signal, rank_lines_):
        diagnosis.cause_id = CauseId.COLLECTIVE_MISMATCH
        diagnosis.fix_text = Message(cause_by_id(CauseId.COLLECTIVE_MISMATCH).fix)
        diagnosis.evidence = _fatal_evidence(rank_lines_)
    elif diagnosis.signal is not None:
        diagnosis.cause_id, diagnosis.cause_fields = CauseId.KILLED_BY_SIGNAL, {"signal": diagnosis.signal}
        diagnosis.fix_text = Message(SIGNAL_FIXES.get(diagnosis.signal, SIGNAL_FIX))
        diagnosis.evidence = _last_words(failure, rank_lines_)
    elif failure.rank is not None and not failure.traceback and (failure.exit_code or 0) > 0:
        # No error file: @record lets SystemExit through (sys.exit(3)); os._exit skips it altogether.
        code = failure.exit_code
        diagnosis.cause_id, diagnosis.cause_fields = CauseId.EXITED_WITHOUT_TRACEBACK, {"code": code}
        diagnosis.fix_text = Message(EXIT_FIX, {"rank": failure.rank, "code": code, "meaning": exit_code_meaning(code)})
        last = last_meaningful_line(failure.log_tail)
        diagnosis.evidence = f"the rank's last line was {last!r}" if last else "the rank printed nothing"
    elif failure.rank is not None and not failure.traceback and failure.exit_code is None:
        # No error file and no exit code from torchrun (it reports only the failures it saw first), while the
        # peers failed on the lost connection: the rank died outside Python.
        diagnosis.cause_id = CauseId.DIED_WITHOUT_ERROR
        diagnosis.fix_text = Message(NO_ERROR_FIX)
        diagnosis.evidence = _last_words(failure, rank_lines_)
    else:
        diagnosis.fix_text = Message(UNKNOWN_FIX)


def _stopped_diagnosis(run_dir: Path, record: RunRecord, ranks: _RankOutput, last_steps: dict[int, int]) -> Diagnosis:
    """The report of a run the launcher stopped on request (run.json's status ``interrupted``: Ctrl-C, a kernel
    interrupt) or because the launching process raised (``stopped``): no rank failed; where each rank was, from the
    stacks faulthandler printed when torchrun stopped them (SIGTERM)."""
    interrupted = record.status == RunStatus.INTERRUPTED
    stacks = stopped_ranks_stacks(ranks.ranked, run_dir / LOGS, one_node=not node_log_dirs(run_dir), failed_rank=None)
    where = dict(record.where) or places(stacks)
    evidence = f"run.json: status {record.status.value} after {record.wall_time_s:.1f} s"
    if interrupted:
        fix = Message(INTERRUPTED_FIX)
    else:
        fix = Message(STOPPED_FIX, {"error": record.stopped_by or "an error"})
    cause = CauseId.INTERRUPTED if interrupted else CauseId.STOPPED
    return Diagnosis(run_dir=run_dir, failed=False, last_steps=last_steps, where=where, cause_id=cause,
                     evidence=evidence, fix_text=fix)


def _refused_diagnosis(run_dir: Path, record: RunRecord) -> Diagnosis:
    """The report of a launch whose job the batch system refused (run.json's status ``refused``): nothing ran;
    sbatch's message (``record.submit_error``) is the evidence."""
    return Diagnosis(run_dir=run_dir, failed=True, submitted=False, cause_id=CauseId.SBATCH_REFUSED,
                     evidence=record.submit_error, fix_text=Message(REFUSED_FIX))


def _never_started_diagnosis(run_dir: Path, reason: str, summary: str) -> Diagnosis:
    """The report of a SLURM job the launcher cancelled because it was pending for a reason after which it can never
    start (run.json's ``slurm_job.never_starts``): no rank ran; the launcher's summary, which names what to change, is
    the evidence."""
    return Diagnosis(run_dir=run_dir, failed=True, cause_id=CauseId.SLURM_NEVER_STARTS,
                     cause_fields={"reason": reason}, evidence=summary, fix_text=Message(NEVER_STARTS_FIX))


def diagnose(run: str | os.PathLike | LaunchError) -> Diagnosis:
    """Summarise a failed run: who failed first, how, where every rank was, the suspected cause and the fix.

    Args:
        run: a run directory (``LaunchError.run_dir``; any folder a launch created), or the ``LaunchError`` /
            ``LaunchTimeout`` itself: the report the launcher made when it raised it (``error.diagnosis``) is
            returned as it is, without reading the run directory; an error without one is examined as below (its
            root cause, last steps and stacks are used as they are).

    Returns:
        A ``Diagnosis`` (``print(d)`` for a few lines; a notebook shows it as a table). A run that finished
        gives ``failed=False`` and cause ``"none"``; one that run.json says was interrupted (Ctrl-C, a kernel
        interrupt) or stopped by the launching process, ``failed=False`` and cause ``"interrupted"`` or ``"stopped by
        the launching process"``, whatever its ranks printed as they were stopped. One whose job sbatch refused
        (run.json: ``"refused"``), ``submitted=False``, cause ``"sbatch refused the job"`` and sbatch's message as
        the evidence. A run stopped at its ``timeout_s`` or ``stall_timeout_s`` (run.json: ``"timeout"``) is a hang:
        cause ``"hang (...)"``.

    Raises:
        ConfigError: the folder does not exist or is not a run directory.

    Sources: torchrun's error files and failure summary (torch.distributed.elastic ``@record``,
    https://pytorch.org/docs/stable/elastic/errors.html); the messages matched are listed in ``CAUSES``.
    """
    if isinstance(run, LaunchError) and run.diagnosis is not None:
        return run.diagnosis
    return examine(run)


def examine(run: str | os.PathLike | LaunchError) -> Diagnosis:
    """The doctor's work behind ``diagnose``: read what the run left (and the error's own evidence) into a
    ``Diagnosis``. The launcher calls it once when a launch fails (``error.diagnosis``); same arguments and errors as
    ``diagnose``."""
    error = run if isinstance(run, LaunchError) else None
    run_dir = Path(error.run_dir if error is not None else run)
    if error is None:
        _check_run_dir(run_dir)
        refused = RunRecord.read(run_dir)
        if refused is not None and refused.status == RunStatus.REFUSED:
            return _refused_diagnosis(run_dir, refused)
        if refused is not None and (refused.slurm_job or {}).get("never_starts"):
            return _never_started_diagnosis(run_dir, refused.slurm_job["never_starts"], refused.summary)
    elif getattr(getattr(error, "job", None), "never_starts", None) is not None:
        return _never_started_diagnosis(run_dir, error.job.never_starts.value, error.summary)
    output = _read_output(run_dir, error)
    # run.json: a timeout is diagnosed from the folder alone, a run finished after a restart by what it recovered from
    record = RunRecord.read(run_dir) if error is None else None
    recovered = record is not None and record.status == RunStatus.FINISHED and record.returncode == 0
    ranks = _split_ranks(before_the_last_attempt(output) if recovered else output)  # the restart is no evidence
    if record is not None and record.status in (RunStatus.INTERRUPTED, RunStatus.STOPPED):
        return _stopped_diagnosis(run_dir, record, ranks, _run_last_steps(run_dir, None))
    failure = error.failure if error is not None else find_root_cause(
        output, node_log_dirs(run_dir) or {None: run_dir / LOGS}, ranks.tails, recovered=recovered)
    error_files = _error_files(run_dir)
    timed_out = isinstance(error, LaunchTimeout) or (record is not None and record.status == RunStatus.TIMEOUT)
    last_steps = _run_last_steps(run_dir, error)
    if not _run_failed(error, timed_out, failure, error_files, output):
        return Diagnosis(run_dir=run_dir, failed=False, last_steps=last_steps, cause_id=CauseId.NONE)

    failure = failure or RankFailure(rank=None, exit_code=None)
    diagnosis = _failed_diagnosis(run_dir, error, record, failure, ranks, timed_out, recovered, last_steps)
    # Evidence: the root cause's traceback first, then every rank's error file, then everything printed.
    texts = [failure.traceback or "", *error_files.values(), *(getattr(error, "output_tail", None) or []),
             *ranks.lines]
    if failure.how == FINISHED and not timed_out:
        _finished_cause(diagnosis, failure)
    elif (timed_out or not _syntax_cause(diagnosis, failure)) and not _match_cause(diagnosis, texts, timed_out):
        _fallback_cause(diagnosis, failure, failure.fatal_error.splitlines() + ranks.by_rank.get(failure.rank, []),
                        timed_out)
    if diagnosis.cause_id in (CauseId.COLLECTIVE_TIMEOUT, CauseId.RANK_FINISHED):  # a message naming a mismatch stays
        waiting_cause(diagnosis, failure, ranks.ranked)
    return diagnosis
