"""Python's tracebacks and ``faulthandler``'s stack dumps as they appear in a rank's output: recognise, cut, summarise.

Every rank the launcher starts prints its stack on SIGUSR1 (the launcher asks before it stops a job that hangs)
and on SIGTERM (torchrun stops the other ranks with it after a failure): ``faulthandler`` writes ``Current thread
0x... (most recent call first):`` and one ``  File "path", line N in function`` line per frame. A rank that raises
prints Python's traceback. These functions read both from ``(rank, line)`` pairs (``output_lines.rank_lines``) or
lists of lines; pure, except ``stacks_from_rank_logs``, which reads torchrun's per-rank logs.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path

from .attempts import last_attempt
from .formats import COMPILER_FRAME, FAULTHANDLER_FRAME

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
    for torchrun's own lines) that a live rank printed when asked (SIGUSR1, SIGTERM): ``{rank: text}``, headers and
    frames as printed (most recent call first). The report of a fatal error (``Fatal Python error: ...`` and the
    stack after it: the rank died there) is not such a dump: ``fatal_report`` reads it."""
    blocks: dict[int, list[str]] = {}
    open_block: dict[int, list[str]] = {}
    fatal: dict[int, bool] = {}  # the rank's last non-blank line was "Fatal Python error: ..."
    for rank, text in ranked_lines:
        if rank is None:
            continue
        if STACK_HEADER.match(text) and (rank in open_block or not fatal.get(rank)):
            if rank not in open_block:
                open_block[rank] = []
                blocks[rank] = open_block[rank]  # a new dump replaces the rank's previous one
            open_block[rank].append(text)
        elif rank in open_block and STACK_BODY.match(text):
            open_block[rank].append(text)
        else:
            open_block.pop(rank, None)
        if text.strip():
            fatal[rank] = FATAL_ERROR.match(text) is not None
    return {rank: "\n".join(lines).strip("\n") for rank, lines in sorted(blocks.items())}


# faulthandler's report of a fatal signal (``faulthandler.enable``: the rank runner's, and ``@record``'s), and the
# signal behind each: Python's faulthandler handles exactly these five.
FATAL_ERROR = re.compile(r"^Fatal Python error: (?P<what>Segmentation fault|Floating point exception|Aborted|"
                         r"Bus error|Illegal instruction)")
FATAL_SIGNALS = {"Segmentation fault": signal.SIGSEGV, "Floating point exception": signal.SIGFPE,
                 "Aborted": signal.SIGABRT, "Bus error": signal.SIGBUS, "Illegal instruction": signal.SIGILL}


def fatal_report(lines) -> str:
    """The last ``Fatal Python error: ...`` in ``lines`` (a rank's log) with the stack faulthandler printed after it,
    the workbook's runner frames left out (``learner_stack``); ``""`` if there is none."""
    lines = list(lines or [])
    starts = [i for i, line in enumerate(lines) if FATAL_ERROR.match(line)]
    if not starts:
        return ""
    report = [lines[starts[-1]].rstrip()]
    for line in lines[starts[-1] + 1:]:
        if not (STACK_HEADER.match(line) or STACK_BODY.match(line)):
            break
        report.append(line.rstrip())
    return learner_stack("\n".join(report)).strip("\n")


def fatal_signal(report: str) -> int | None:
    """The signal number behind a ``fatal_report`` (11 for ``Segmentation fault``), or ``None``."""
    match = FATAL_ERROR.match(report or "")
    return int(FATAL_SIGNALS[match["what"]]) if match else None


# The workbook's own frames under a learner's script: the rank runner and the warm-start helper (both run by path
# from tutorial_lib/child/), and the ``runpy`` frames through which they run the script.
_RUNNER_FRAME = re.compile(r'^\s*File "[^"]*/tutorial_lib/child/[^"/]+\.py", line \d+')
_RUNPY_FRAME = re.compile(r'^\s*File "(<frozen runpy>|[^"]*/runpy\.py)", line \d+')


def readable_tail(lines) -> list[str]:
    """A rank's last lines as a learner reads them: each ``faulthandler`` dump without the workbook's runner frames
    (``learner_stack``) and without its list of extension modules."""
    kept, dump = [], []
    for line in list(lines or []) + [None]:
        if line is not None and (STACK_HEADER.match(line) or (dump and STACK_BODY.match(line))):
            dump.append(line)
            continue
        if dump:
            kept += learner_stack("\n".join(dump)).splitlines()
            dump = []
        if line is not None and not line.startswith("Extension modules:"):
            kept.append(line)
    return kept


def learner_stack(stack: str) -> str:
    """A ``faulthandler`` dump (most recent call first) without the workbook's runner frames: in each thread, the
    first frame of ``tutorial_lib/child/`` and every frame after it (the outer ones), and the ``runpy`` frames right
    above it, through which the runner ran the script. The log keeps the whole dump."""
    kept: list[str] = []
    cutting = False
    for line in stack.splitlines():
        if STACK_HEADER.match(line) or not line.strip():
            cutting = False
        elif cutting or _RUNNER_FRAME.match(line):
            cutting = True
            while kept and _RUNPY_FRAME.match(kept[-1]):
                kept.pop()
            continue
        kept.append(line)
    return "\n".join(kept)


def stacks_from_rank_logs(log_dir: Path) -> dict[int, str]:
    """``stacks_by_rank`` over torchrun's per-rank ``stderr.log`` files of its last attempt (one node: local rank
    = rank), for a run directory whose output.log lacks them (an older one: dumps that reached the file after
    torchrun's ``--tee`` copy stopped)."""
    attempt = last_attempt(log_dir)
    if attempt is None:
        return {}
    ranked = []
    for rank, path in sorted(attempt.stderr_logs().items()):
        ranked += [(rank, line) for line in path.read_text(errors="replace").splitlines()]
    return stacks_by_rank(ranked)


def stopped_ranks_stacks(ranked_lines, log_dir: Path, *, one_node: bool, failed_rank: int | None,
                         failed_themselves=()) -> dict[int, str]:
    """The stacks of every rank but ``failed_rank``, as printed when torchrun stopped them (faulthandler on SIGTERM):
    from the output (``ranked_lines``), and on one node also from the ranks' own ``stderr.log`` files (an older run's
    output.log can lack a dump that reached the file after torchrun's ``--tee`` copy stopped; the launcher now reads
    the files to their end). Not of the ranks in ``failed_themselves``
    (they raised, lost their peer, died): a dump they printed while leaving says nothing of where they were."""
    found = stacks_by_rank(ranked_lines)
    if one_node:
        found = {**stacks_from_rank_logs(log_dir), **found}
    return {rank: stack for rank, stack in sorted(found.items())
            if rank != failed_rank and rank not in set(failed_themselves)}


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


@dataclass(frozen=True)
class Frame:
    """One frame of a Python stack, as a traceback or a ``faulthandler`` dump names it.

    Attributes:
        file: the file's path, as printed (``"/home/me/train.py"``; a frozen module's ``"<frozen runpy>"``).
        line: the line number in it (1-based).
        function: the function's name (``"<module>"`` for a script's top level).

    ``str(frame)``: ``"train.py:12 in main"`` (the file's name only).
    """

    file: str
    line: int
    function: str

    @property
    def name(self) -> str:
        """The file's name without its folder: ``"train.py"``."""
        return Path(self.file).name

    def __str__(self) -> str:
        return f"{self.name}:{self.line} in {self.function}"

    def as_dict(self) -> dict[str, object]:
        """``{"file": ..., "line": ..., "function": ...}``, for ``run.json``."""
        return {"file": self.file, "line": self.line, "function": self.function}

    @classmethod
    def from_dict(cls, data: dict) -> "Frame":
        """The frame ``as_dict`` wrote."""
        return cls(str(data["file"]), int(data["line"]), str(data["function"]))


@dataclass(frozen=True)
class Place:
    """Where a rank's main thread was when it printed its stack: the innermost frame of the script's own code
    (``own``), and the innermost frame overall (``innermost``: the same frame, unless the script had called into a
    library: torch's ``all_reduce``, Python's ``time.sleep`` wrapper).

    ``str(place)``: ``"ddp_train.py:247 in train -> graph.py:979 in _engine_run_backward"``, or ``"train.py:12 in
    main"`` when the two are one frame.
    """

    own: Frame
    innermost: Frame

    @property
    def frames(self) -> tuple[Frame, ...]:
        """``(own, innermost)``, or ``(own,)`` when they are one frame."""
        return (self.own,) if self.own == self.innermost else (self.own, self.innermost)

    def __str__(self) -> str:
        return " -> ".join(map(str, self.frames))

    def as_dict(self) -> dict[str, object]:
        """``{"own": frame, "innermost": frame}`` (``Frame.as_dict``), for ``run.json``."""
        return {"own": self.own.as_dict(), "innermost": self.innermost.as_dict()}

    @classmethod
    def read(cls, data: dict | str) -> "Place | None":
        """The place ``as_dict`` wrote into ``run.json``; from a ``run.json`` written before places were values, its
        text (``str(place)``, file names only); ``None`` for anything else."""
        if isinstance(data, dict):
            try:
                return cls(Frame.from_dict(data["own"]), Frame.from_dict(data["innermost"]))
            except (KeyError, TypeError, ValueError):
                return None
        frames = []
        for part in str(data).split(" -> "):
            head, said_in, function = part.rpartition(" in ")
            file, colon, line = head.rpartition(":")
            if not (said_in and colon and line.isdigit() and function):
                return None
            frames.append(Frame(file, int(line), function))
        return cls(frames[0], frames[-1]) if len(frames) in (1, 2) else None


def dump_frames(lines) -> list[Frame]:
    """The frames of the first thread of a ``faulthandler`` dump in ``lines`` (most recent call first, as printed),
    up to the next thread; ``[]`` if there is none."""
    frames: list[Frame] = []
    for line in lines:
        match = FAULTHANDLER_FRAME.match(line)
        if match:
            frames.append(Frame(match["path"], int(match["line"]), match["function"]))
        elif frames:
            break  # the next thread
    return frames


def all_frames(lines) -> list[Frame]:
    """Every ``faulthandler`` frame in ``lines``, every thread's, in their order."""
    return [Frame(m["path"], int(m["line"]), m["function"]) for m in map(FAULTHANDLER_FRAME.match, lines) if m]


def innermost_frame(stack: str) -> Place | None:
    """Where the main thread of a ``faulthandler`` dump is (a ``Place``), ``None`` if the dump names no frame.

    faulthandler prints ``Current thread 0x... (most recent call first):`` (or ``Thread 0x...``)
    followed by ``  File "path", line N in name`` lines. The answer is the innermost frame of the
    script itself, and the innermost frame overall, which is inside a library when the script called one
    (``str()``: ``"ddp_train.py:247 in train -> graph.py:979 in _engine_run_backward"``). The workbook's runner frames
    (``learner_stack``) are never the answer.
    """
    lines = stack.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), 0)
    frames = dump_frames(lines[start:])
    if not frames:
        return None
    learner = [f for f in frames if not _RUNNER_FILE.search(f.file) and not _RUNPY_FILE.match(f.file)]
    frames = learner or frames
    own = next((f for f in frames if not _LIBRARY.search(f.file)), frames[0])
    return Place(own=own, innermost=frames[0])


def places(stacks: dict[int, str]) -> dict[int, Place]:
    """``{rank: Place}`` of ``{rank: faulthandler dump}`` (``innermost_frame``); a rank whose dump names no frame is
    left out."""
    found = {rank: innermost_frame(stack) for rank, stack in sorted(stacks.items())}
    return {rank: place for rank, place in found.items() if place is not None}


_LIBRARY = re.compile(r"/(site-packages|dist-packages|lib/python\d[\d.]*)/")
_RUNNER_FILE = re.compile(r"/tutorial_lib/child/[^/]+\.py$")
_RUNPY_FILE = re.compile(r"^(<frozen runpy>|.*/runpy\.py)$")


def compiling_ranks(stacks: dict[int, str]) -> list[int]:
    """The ranks whose faulthandler dump (``{rank: dump}``) shows the main thread inside torch.compile: a frame of
    dynamo or inductor (``COMPILER_FRAME``) between its ``Current thread ...`` header and the next thread or blank
    line. Other threads (inductor's compile workers, tqdm's monitor) do not count."""
    found = []
    for rank, stack in sorted(stacks.items()):
        lines = stack.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), len(lines))
        for line in lines[start + 1:]:
            if not line.strip() or line.startswith("Thread "):
                break
            if COMPILER_FRAME.search(line):
                found.append(rank)
                break
    return found
