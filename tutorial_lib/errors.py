"""Every exception the library raises, under one base class.

Modelled on papermill's ``exceptions.py``: structured attributes for programs, a readable
``__str__`` for people. ``ConfigError`` is raised *before* anything is launched;
``LaunchError`` and its subclasses describe a job that ran and failed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


class TutorialError(Exception):
    """Base class of every error raised by ``tutorial_lib``."""


class ConfigError(TutorialError, ValueError):
    """Bad input, detected before any process is started.

    The message names the parameter, the bad value and what to do instead.
    """


class MetricsError(TutorialError):
    """Metrics or memory samples that a run should have written are missing or unreadable."""


class SlurmError(TutorialError):
    """A SLURM command failed, or the local SLURM cluster could not be started or stopped.

    Attributes:
        command: the argv that failed (``[]`` when no command is to blame).
        returncode: its exit status, or ``None``.
        stderr: what it printed on stderr (or the daemon's last log lines), stripped.
    """

    def __init__(self, message: str, *, command: list[str] | None = None, returncode: int | None = None,
                 stderr: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.command = list(command or [])
        self.returncode = returncode
        self.stderr = stderr

    def __str__(self) -> str:
        lines = [self.message]
        if self.stderr and self.stderr not in self.message:
            lines += ["", *("  " + line for line in self.stderr.splitlines()[-15:])]
        return "\n".join(lines)


class SlurmUnavailable(SlurmError):
    """The local SLURM cluster cannot run on this machine (not root, or slurm-wlm is not installed); the message
    says what to install or run instead."""


class JobWaitTimeout(SlurmError):
    """A SLURM job did not reach the awaited state in time.

    Attributes (besides ``SlurmError``'s): job_id; last_state: the job's state at the last look (a ``JobState``
    value, or ``None`` if the job was gone); reason: its pending reason then; timeout_s: the limit, in seconds.
    """

    def __init__(self, message: str, *, job_id: int, last_state: str | None, reason: str, timeout_s: float) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.last_state = last_state
        self.reason = reason
        self.timeout_s = timeout_s


@dataclass
class RankFailure:
    """What one failed rank left behind.

    Attributes:
        rank: global rank of the failed worker (``RANK``), or ``None`` when it is unknown.
        exit_code: the worker's exit code as torchrun reported it (negative: killed by that signal),
            or ``None`` when unknown.
        traceback: the root-cause Python traceback from torchrun's error file (written by ``@record``),
            or ``""`` when the worker left none (e.g. it was killed by a signal).
        log_tail: the last lines this rank printed (stdout and stderr).
    """

    rank: int | None
    exit_code: int | None
    traceback: str = ""
    log_tail: list[str] = field(default_factory=list)


class LaunchError(TutorialError):
    """A launched job failed: a rank raised, crashed, or torchrun itself failed.

    Attributes:
        run_dir: the run directory with the logs (``logs/``), metrics and ``command.txt``.
        command: the argv that was run.
        returncode: torchrun's exit code.
        failure: the root-cause ``RankFailure`` (first rank that failed), if one could be found.
        output_tail: the last lines of the combined output, for when no rank is to blame.
        stacks: ``{rank: text}``: the Python stack of every other rank that was still running when it was
            stopped (torchrun's SIGTERM after the failure; every rank prints it with ``faulthandler``, set up by
            ``tutorial_lib/rank_runner.py``, which runs each rank's script).
            After a collective timeout the rank that timed out is the *waiting* one: the culprit is the rank
            whose stack is not in a collective.
        where: ``{rank: "file:line in function"}``: the innermost frame of each of those stacks.
    """

    def __init__(
        self,
        summary: str,
        *,
        run_dir: Path,
        command: list[str],
        returncode: int | None,
        failure: RankFailure | None = None,
        output_tail: list[str] | None = None,
        stacks: dict[int, str] | None = None,
    ) -> None:
        super().__init__(summary)
        self.summary = summary
        self.run_dir = Path(run_dir)
        self.command = list(command)
        self.returncode = returncode
        self.failure = failure
        self.output_tail = list(output_tail or [])
        self.stacks = dict(stacks or {})
        self.where = {rank: innermost_frame(text) for rank, text in self.stacks.items()}

    @property
    def rank(self) -> int | None:
        """Global rank of the root-cause failure, or ``None``."""
        return self.failure.rank if self.failure else None

    @property
    def exit_code(self) -> int | None:
        """Exit code of the root-cause rank, or ``None``."""
        return self.failure.exit_code if self.failure else None

    @property
    def cause(self) -> str:
        """One line that says what went wrong, for a cell or a status line; ``""`` when the run left nothing.

        The exception line of the root-cause traceback; else, for a rank that exited with a code of its own and
        no traceback (``sys.exit(3)``), ``"exited with code 3 without a traceback"`` and its last line; else (a rank
        killed by a signal writes no traceback: NCCL's watchdog abort, the OOM killer) the last meaningful line of
        that rank's log; else of torchrun's output. Faulthandler's frame lines and its "Extension modules" list are
        skipped. Never raises, whatever is empty.
        """
        failure = self.failure
        if failure is not None and not (failure.traceback or "").strip() and (failure.exit_code or 0) > 0:
            last = last_meaningful_line(failure.log_tail)
            said = f"; its last line was {last!r}" if last else ""
            return f"exited with code {failure.exit_code} without a traceback{said}"
        for lines in ((failure.traceback or "").splitlines() if failure else [], failure.log_tail if failure else [],
                      self.output_tail):
            line = last_meaningful_line(lines)
            if line:
                return line
        return ""

    def __str__(self) -> str:
        lines = [self.summary]
        if self.failure is not None:
            if self.failure.traceback:
                lines += ["", f"Root-cause traceback (rank {self.failure.rank}):", self.failure.traceback.rstrip()]
            # What the rank printed, less any traceback (the root-cause one is printed in full above).
            tail = list(self.failure.log_tail)
            if self.failure.traceback:
                tail = without_tracebacks(tail, inside=bool(tail) and tail[0][:1].isspace())
            while tail and not tail[-1].strip():
                tail.pop()  # the tail ends with what the rank said last
            if tail:
                lines += ["", f"Last lines of rank {self.failure.rank}'s log" +
                          (" (before its traceback):" if self.failure.traceback else ":")]
                lines += ["  " + line for line in tail[-10:]]
        elif self.output_tail:
            lines += ["", "Last lines of output:"] + ["  " + line for line in self.output_tail]
        if self.where and not isinstance(self, LaunchTimeout):
            lines += ["", "Where the other ranks were when they were stopped:"]
            lines += [f"  rank {rank}: {place}" for rank, place in sorted(self.where.items())]
        lines += ["", f"Run directory (full logs in logs/, rerun with command.txt): {self.run_dir}"]
        return "\n".join(lines)


class LaunchTimeout(LaunchError):
    """The job ran past its wall-clock ``timeout_s``, or made no progress for ``stall_timeout_s``, and was stopped.

    Attributes (besides ``LaunchError``'s):
        timeout_s: the limit that was exceeded, in seconds.
        limit: which one: ``"timeout_s"`` (wall clock since the launch) or ``"stall_timeout_s"``
            (no rank logged a new step for that long).
        last_steps: the last metric step each rank reported, ``{rank: step}`` (ranks that reported
            nothing are absent), which shows which rank stopped making progress.
        stacks: ``{rank: text}``: each rank's Python stack at the timeout, as ``faulthandler`` prints it
            (most recent call first), for ranks that catch SIGUSR1 (every rank the launcher starts: its runner
            registers ``faulthandler`` before the script runs); empty where none answered.
        where: ``{rank: "file:line in function"}``: the innermost frame of each rank's main thread.
    """

    def __init__(self, summary: str, *, timeout_s: float, last_steps: dict[int, int],
                 stacks: dict[int, str] | None = None, limit: str = "timeout_s", **kwargs) -> None:
        super().__init__(summary, stacks=stacks, **kwargs)
        self.timeout_s = timeout_s
        self.limit = limit
        self.last_steps = dict(last_steps)

    def __str__(self) -> str:
        text = super().__str__()
        if not self.stacks:
            return text
        lines = ["", "Python stack of every rank at the timeout (most recent call first):"]
        for rank, stack in sorted(self.stacks.items()):
            lines += [f"rank {rank}:"] + ["  " + line for line in stack.splitlines()]
        return text + "\n" + "\n".join(lines)


CHAINED_HEADER = re.compile(r"^(During handling of the above exception|The above exception was the direct cause)")


def without_tracebacks(lines: list[str], inside: bool = False) -> list[str]:
    """``lines`` less every Python traceback in them: header, frames, the exception line, and the blank lines
    and header that chain it to the next one. ``inside``: the lines start within a traceback (a log's tail that
    begins with a frame)."""
    kept, after = [], False
    for line in lines:
        if line.startswith("Traceback (most recent call last):"):
            inside, after = True, False
        elif inside and line.strip() and not line[0].isspace() and not CHAINED_HEADER.match(line):
            inside, after = False, True  # the exception line ends it
            continue
        elif after and (not line.strip() or CHAINED_HEADER.match(line)):
            continue
        else:
            after = False
        if not inside:
            kept.append(line)
    return kept


STACK_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")
STACK_BODY = re.compile(r'^(\s+File "|\s*$)')


def stacks_by_rank(ranked_lines) -> dict[int, str]:
    """The last ``faulthandler`` dump of every rank in ``ranked_lines`` (``(rank, text)`` pairs, rank ``None``
    for torchrun's own lines): ``{rank: text}``, headers and frames as printed (most recent call first)."""
    blocks: dict[int, list[str]] = {}
    open_block: dict[int, list[str]] = {}
    for rank, text in ranked_lines:
        if rank is None:
            continue
        if STACK_HEADER.match(text):
            if rank not in open_block:
                open_block[rank] = []
                blocks[rank] = open_block[rank]  # a new dump replaces the rank's previous one
            open_block[rank].append(text)
        elif rank in open_block and STACK_BODY.match(text):
            open_block[rank].append(text)
        else:
            open_block.pop(rank, None)
    return {rank: "\n".join(lines).strip("\n") for rank, lines in sorted(blocks.items())}


def stacks_from_rank_logs(log_dir: Path) -> dict[int, str]:
    """``stacks_by_rank`` over torchrun's per-rank ``stderr.log`` files of its last attempt (one node: local rank
    = rank), for dumps that reached the file but not torchrun's ``--tee`` copy before it exited."""
    attempts = [p for p in Path(log_dir).glob("*/attempt_*") if p.name.removeprefix("attempt_").isdigit()]
    if not attempts:
        return {}
    last = max(attempts, key=lambda p: int(p.name.removeprefix("attempt_")))
    ranked = []
    for path in sorted(last.glob("*/stderr.log")):
        if path.parent.name.isdigit():
            rank = int(path.parent.name)
            ranked += [(rank, line) for line in path.read_text(errors="replace").splitlines()]
    return stacks_by_rank(ranked)


def stopped_ranks_stacks(ranked_lines, log_dir: Path, *, one_node: bool, failed_rank: int | None) -> dict[int, str]:
    """The stacks of every rank but ``failed_rank``, as printed when torchrun stopped them (faulthandler on SIGTERM):
    from the output (``ranked_lines``), and on one node also from the ranks' own ``stderr.log`` files, which keep a
    dump that reached the file after torchrun's ``--tee`` copy stopped."""
    found = stacks_by_rank(ranked_lines)
    if one_node:
        found = {**stacks_from_rank_logs(log_dir), **found}
    return {rank: stack for rank, stack in sorted(found.items()) if rank != failed_rank}


_NOT_A_CAUSE = re.compile(r'^(\s*File "|Extension modules:|Current thread 0x|Thread 0x|\s*\^+\s*$|Traceback \(most recent)')


def last_meaningful_line(lines) -> str:
    """The last line of ``lines`` that is not blank, a stack frame or faulthandler's boilerplate; ``""`` if none."""
    for line in reversed(list(lines or [])):
        if line.strip() and not _NOT_A_CAUSE.match(line):
            return line.strip()
    return ""


_TRACEBACK_START = "Traceback (most recent call last):"
_CHAINED = re.compile(r"^(During handling of the above exception, another exception occurred|"
                      r"The above exception was the direct cause of the following exception):$")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(: |:?$)")  # "ValueError: ...", "pkg.mod.SomeError: ...", "KeyboardInterrupt"


def last_traceback(lines) -> str:
    """The last Python traceback printed in ``lines`` (a rank's log), from its ``Traceback (most recent call last):``
    (the first of a chain of exceptions) to its exception line; ``""`` if there is none.

    For a rank that left no error file but printed its traceback: an exception ``@record`` does not catch (DCP's
    ``CheckpointException`` is a ``BaseException``), or a script without ``@record``. The traceback ends at the last
    exception line before the first line that is no part of it (a later print, a C++ warning); nested tracebacks
    inside an exception's message (DCP's ``Traceback (most recent call last): (RANK 1)``) are kept.
    """
    lines = [line.rstrip() for line in lines or []]
    starts = [i for i, line in enumerate(lines) if line == _TRACEBACK_START]
    if not starts:
        return ""
    start = starts[-1]
    while True:  # back over "During handling of the above exception ..." to the first traceback of the chain
        earlier = [i for i in starts if i < start]
        between = [line for line in lines[earlier[-1]:start] if line.strip()] if earlier else []
        if not earlier or not any(_CHAINED.match(line) for line in between[-1:]):
            break
        start = earlier[-1]
    end = None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.startswith(_TRACEBACK_START) or _CHAINED.match(line):
            continue
        if not line.strip() or line[0] in " \t":
            continue  # frames, source lines, carets, an indented message
        if not _EXCEPTION.match(line):
            break  # output printed after the traceback
        end = i
    return "\n".join(lines[start:end + 1]) if end is not None else ""


def innermost_frame(stack: str) -> str:
    """Where the main thread of a ``faulthandler`` dump is: ``"file:line in function"``.

    faulthandler prints ``Current thread 0x... (most recent call first):`` (or ``Thread 0x...``)
    followed by ``  File "path", line N in name`` lines. The answer is the innermost frame of the
    script itself, followed by the innermost frame overall when that is inside a library, e.g.
    ``"ddp_train.py:247 in train -> graph.py:979 in _engine_run_backward"``.
    """
    lines = stack.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), 0)
    frames = []
    for line in lines[start:]:
        match = _FRAME.match(line)
        if match:
            frames.append(match)
        elif frames:
            break  # the next thread
    if not frames:
        return ""
    text = [f"{Path(m['path']).name}:{m['line']} in {m['function']}" for m in frames]
    own = next((i for i, m in enumerate(frames) if not _LIBRARY.search(m["path"])), 0)
    return text[own] if own == 0 else f"{text[own]} -> {text[0]}"


_LIBRARY = re.compile(r"/(site-packages|dist-packages|lib/python\d[\d.]*)/")
_FRAME = re.compile(r'\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
