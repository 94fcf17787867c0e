"""Rank-prefixed, throttled streaming of torchrun's output into a cell or a terminal.

torchrun's ``--tee 3`` prefixes every worker line with ``[<role><local_rank>]:``; the launcher
splits a line where torchrun wrote the chunks of several ranks (``split_tee_line``: a ``\\r`` progress bar),
rewrites the prefix to ``[rank N]`` and marks torchrun's own lines ``[torchrun]``. A line a rank redraws with
carriage returns (marked by the rank runner, ``Redraws``) is shown once, in its final state, or in place in the
widget view; every state of it is a line of ``output.log``. All lines go to
``output.log`` in the run directory; the screen gets at most ``max_lines_per_s`` lines a second
(a token bucket), so a chatty script cannot flood the notebook or hit papermill's IOPub limits.
"""

from __future__ import annotations

import re
import sys
import time
from collections import deque
from typing import TextIO

from ..errors import CHAINED_HEADER, STACK_BODY, STACK_HEADER

_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]+?)(?P<local_rank>\d+)\]:(?P<text>.*)$")
# Lines a torch version prints that teach nothing and that the learner cannot act on. They stay in output.log;
# the cell does not show them. torch 2.8: gloo reports each rank's connections ("[Gloo] Rank 0 is connected to
# 1 peer ranks. Expected number of connected peer ranks is : 1"), and DCP's own filesystem.py warns about
# TypedStorage on every save (Python's warning line, then the source line it points at). torch.profiler (kineto):
# torch 2.13 logs "USDT:<time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start" (and _stop) at each
# start and stop; torch 2.8's CUDA wheel on a machine without a GPU logs "ERROR:<time> <pid>:<tid>
# DeviceProperties.cpp:47] gpuGetDeviceCount failed with code 35" when a profiler starts.
_VERSION_NOISE = re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks|"
                            r"torch/distributed/checkpoint/filesystem\.py:\d+: UserWarning: TypedStorage is deprecated|"
                            r"^USDT:.* SyncActivityProfilerHandler\.cpp:\d+\] profiler_(start|stop)$|"
                            r"^ERROR:.* DeviceProperties\.cpp:\d+\] gpuGetDeviceCount failed with code \d+$")


def is_noise(text: str) -> bool:
    """Whether a rank's output line is noise a torch version adds (kept in the log, not shown)."""
    return _VERSION_NOISE.search(text) is not None


# The line that says what went wrong: shown even when the screen's line budget is spent.
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*)?(Error|Exception|Interrupt)\b.*: |^Fatal Python error")


# torchrun's own log lines that repeat what the launcher says when it reports the failure (they stay in output.log).
_AGENT_REPEATS = re.compile(r"\] failed \(exitcode: -?\d+\) local_rank: \d+|no error file defined for parent|"
                            r"\] Sending process \d+ closing signal SIG")


class NoiseFilter:
    """``hide(rank, text)``: True for lines the screen does without (``output.log`` keeps them all).

    Version noise; the source line Python prints under a noisy warning; ``faulthandler`` stack dumps (the ranks
    print them when the launcher asks at a timeout and when torchrun stops them after a failure): the error the
    launch raises, its failure box and the doctor say where each rank was, in one line per rank; the body of a
    rank's Python traceback (the cell shows its exception line, the cause; the frames are in ``output.log`` and
    in the raised error); torchrun's own "failed (exitcode ...)" lines, which the launcher's failure line repeats.
    ``kind(rank, text)`` says which a hidden line is: version noise is no evidence of anything, so the error
    reports' per-rank tails leave it out too (a DCP warning printed after a rank's last words must not become
    "what the rank was doing"); the other kinds stay in the tails.
    """

    VERSION, STACK, TRACEBACK, AGENT = "version", "stack", "traceback", "agent"

    def __init__(self) -> None:
        self._after_warning: set[int | None] = set()
        self._in_dump: set[int | None] = set()
        self._in_traceback: set[int | None] = set()
        self._after_exception: set[int | None] = set()
        self.traceback_lines = 0  # hidden so far: the launcher says where they are

    def kind(self, rank: int | None, text: str) -> str | None:
        """``"version"``, ``"stack"``, ``"traceback"``, ``"agent"`` or ``None`` (a line to show). Call once per
        line, in order."""
        if rank is not None and text.startswith("Extension modules: "):  # faulthandler's list after a fatal error
            return self.STACK
        if rank is not None and STACK_HEADER.match(text):
            self._in_dump.add(rank)
            return self.STACK
        if rank in self._in_dump:
            if STACK_BODY.match(text):
                return self.STACK
            self._in_dump.discard(rank)
        if rank is not None and text.startswith("Traceback (most recent call last):"):
            self._in_traceback.add(rank)
            self.traceback_lines += 1
            return self.TRACEBACK
        if rank in self._in_traceback:
            if not text.strip() or text[0].isspace() or CHAINED_HEADER.match(text):
                self.traceback_lines += 1
                return self.TRACEBACK  # a frame, its source line, its ^^^ marker, or a chained exception's header
            self._in_traceback.discard(rank)  # the exception line: the cause, shown
            self._after_exception.add(rank)
            return None
        if rank in self._after_exception:
            if not text.strip() or CHAINED_HEADER.match(text):  # a chained exception's header, before its traceback
                self.traceback_lines += 1
                return self.TRACEBACK
            self._after_exception.discard(rank)
        if rank in self._after_warning:
            self._after_warning.discard(rank)
            if text.startswith("  "):
                return self.VERSION
        if is_noise(text):
            if "Warning:" in text:
                self._after_warning.add(rank)
            return self.VERSION
        if rank is None and _AGENT_REPEATS.search(text):
            return self.AGENT
        return None

    def hide(self, rank: int | None, text: str) -> bool:
        """Whether the screen leaves this line out (``kind`` is not ``None``)."""
        return self.kind(rank, text) is not None


def split_rank_prefix(line: str, rank_offset: int = 0) -> tuple[int | None, str]:
    """Split a torchrun ``--tee`` line into ``(rank, text)``; ``rank`` is ``None`` for torchrun's own lines.

    ``rank_offset`` is added to the local rank (the node's first global rank; 0 on one node). The ``[rankN]:``
    that torch.distributed's ``sys.excepthook`` puts before each traceback line of rank N is dropped.
    """
    m = _PREFIX.match(line)
    if m is None:
        return None, line
    rank, text = int(m.group("local_rank")) + rank_offset, m.group("text")
    # torch.distributed's excepthook prefixes every traceback line with "[rankN]:" itself: said once is enough.
    torch_prefix = f"[rank{rank}]:"
    if text.startswith(torch_prefix):
        text = text[len(torch_prefix):]
        text = text[1:] if text.startswith(" ") else text
    return rank, text


def split_tee_line(line: str) -> list[str]:
    """The pieces of one line of torchrun's ``--tee`` output, each with its own ``[<role><local_rank>]:`` prefix.

    torchrun copies a rank's log to its own output one chunk at a time, prefix first; a chunk is a line of the
    rank's log, or what the rank has written of its current line so far (a ``print`` caught between its text and
    its newline; a progress bar that redraws itself with ``\\r``, each update of which torchrun's text-mode reader
    turns into a line break). Such an unfinished chunk has no newline, so the next chunk of any rank continues the
    same line: ``[default1]:7/50[default0]:step 3``. This splits ``line`` before every later prefix of the same
    role as its first one (``default`` on one node; ``rank`` with the launcher's multi-node prefix template),
    except a prefix right after a prefix (torch's ``[rankN]:`` in front of each traceback line). A line that does
    not start with a prefix (torchrun's own) is returned whole.

    Args:
        line: one line of torchrun's output, without its newline.

    Returns:
        The pieces in order; every piece but the last is an unfinished chunk of its rank.
    """
    m = _PREFIX.match(line)
    if m is None:
        return [line]
    pieces, start, prefix_end = [], 0, m.start("text")
    for embedded in re.finditer(rf"\[{re.escape(m['role'])}\d+\]:", line):
        if embedded.start() == 0 or embedded.start() == prefix_end:
            prefix_end = embedded.end()  # the line's own prefix, or a prefix right after one
            continue
        pieces.append(line[start:embedded.start()])
        start, prefix_end = embedded.start(), embedded.end()
    return pieces + [line[start:]]


class TeeSplitter:
    """``split(line)``: ``split_tee_line`` over torchrun's output, line after line, less the empty pieces that only
    end a rank's unfinished chunk (its newline, or the ``\\r`` of a progress bar's next update, arrived as a chunk
    of its own). Keeps which ranks have an unfinished chunk; one splitter per output, fed its lines in order."""

    def __init__(self) -> None:
        self._unfinished: set[str] = set()  # prefixes whose last piece was an unfinished chunk

    def split(self, line: str) -> list[str]:
        """The pieces of ``line`` to log and show (see ``split_tee_line``); may be empty."""
        pieces = split_tee_line(line)
        kept = []
        for i, piece in enumerate(pieces):
            m = _PREFIX.match(piece)
            if m is None:
                kept.append(piece)
                continue
            prefix = piece[:m.start("text")]
            if m["text"] == "" and prefix in self._unfinished:
                self._unfinished.discard(prefix)  # the end of that rank's earlier unfinished chunk: nothing to show
                continue
            if i < len(pieces) - 1:
                self._unfinished.add(prefix)
            # A finished chunk of the same prefix may be the rest of that chunk, or a line of the rank's other
            # stream (stdout and stderr share the prefix): the mark stays; at worst an empty line goes unshown.
            kept.append(piece)
        return kept


# The marks the rank runner puts on a line a rank redraws with carriage returns (``\r`` not followed by ``\n``): each
# ``\r`` becomes ``REDRAWN_END`` + newline (torchrun's --tee would make a line break of a bare ``\r`` anyway), the
# text written next starts with ``REDRAW_START``, and the newline that ends the line follows ``REDRAW_DONE``. A
# terminal draws them as it draws ``\r`` (column 1; next line, cursor up; erase the rest of the line).
REDRAWN_END, REDRAW_START, REDRAW_DONE = "\x1b[G", "\x1b[A", "\x1b[K"


class Redraws:
    """Each rank's latest state of a line it redraws with carriage returns (a tqdm progress bar), from the pieces of
    its output the rank runner marked; one per output, fed every rank's pieces in order.

    A redraw ends only at its own marked newline (or with the job, ``end_all``): a line of the rank's other stream
    may arrive in between (torchrun tails a rank's stdout and stderr in separate threads) and is a line like any
    other.
    """

    def __init__(self) -> None:
        self._latest: dict[int | None, str] = {}  # rank -> the state its redrawn line shows now

    def take(self, rank: int | None, text: str) -> tuple[str | None, bool, str | None]:
        """One piece of ``rank``'s output: ``(text, redrawn, ended)``. ``text``: without the marks, ``None`` for a
        piece that is only marks (nothing to log); ``redrawn``: the piece is (part of) a state of a redrawn line, to be
        logged and at most shown in place; ``ended``: the final state of the rank's redrawn line when this piece ends
        it (to show as a line), else ``None``."""
        starts, done = text.startswith(REDRAW_START), text.endswith(REDRAW_DONE)
        ends = not done and text.endswith(REDRAWN_END)
        if not (starts or ends or done):
            return text, False, None
        end_mark = REDRAW_DONE if done else REDRAWN_END if ends else ""
        core = text[len(REDRAW_START) if starts else 0:len(text) - len(end_mark)]
        if core:  # a new state (a terminal would show it over the previous one); an empty piece changes nothing
            self._latest[rank] = core
        return core or None, True, self._latest.pop(rank, None) if done else None

    def end_all(self) -> dict[int | None, str]:
        """The final state of every line still being redrawn (the job ended); forgets them."""
        ended, self._latest = self._latest, {}
        return ended


def rank_lines(output: str) -> list[tuple[int | None, str]]:
    """``(rank, text)`` of every piece of torchrun's ``output`` (``TeeSplitter``, then ``split_rank_prefix``)."""
    splitter = TeeSplitter()
    return [split_rank_prefix(piece) for line in output.splitlines() for piece in splitter.split(line)]


class ThrottledPrinter:
    """Print lines with a rank prefix, at most ``max_lines_per_s`` per second (burst ``2 * max``).

    Keeps the last ``tail_lines`` lines of every rank for error reports, whether printed or not.
    ``keeps_full_tracebacks``: True where the lines land in a collapsible area (the widget view), so a rank's
    traceback frames are shown whole; False in a cell's stdout or a terminal, which show its exception line.
    """

    def __init__(self, stream: TextIO | None = None, max_lines_per_s: float = 20.0, tail_lines: int = 30,
                 log_name: str = "output.log", keeps_full_tracebacks: bool = False) -> None:
        self.stream = stream
        self.log_name = log_name  # where the suppressed lines can be read in full
        self.rate = float(max_lines_per_s)
        self.capacity = max(1.0, 2 * self.rate)
        self.tokens = self.capacity
        self.last_refill = time.monotonic()
        self.suppressed = 0
        self.tails: dict[int | None, deque[str]] = {}
        self.keeps_full_tracebacks = keeps_full_tracebacks
        self.tail_lines = tail_lines

    def _stream(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stdout  # resolved late: ipykernel swaps it

    def emit(self, rank: int | None, text: str, show: bool = True, keep: bool = True, force: bool = False) -> None:
        """Record ``text`` from ``rank`` (unless not ``keep``) and, if ``show``, print it when the budget allows
        (always if ``force``: a traceback's frames in the widget view, finite and wanted whole)."""
        if keep:
            self.tails.setdefault(rank, deque(maxlen=self.tail_lines)).append(text)
        if not show:
            return
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.last_refill) * self.rate)
        self.last_refill = now
        if self.tokens < 1 and not force and not _ERROR_LINE.match(text):  # an error line always gets through
            self.suppressed += 1
            return
        self.tokens = max(0.0, self.tokens - 1)
        self.flush_suppressed()
        label = "torchrun" if rank is None else f"rank {rank}"
        self._stream().write(f"[{label}] {text}\n")

    def redraw(self, rank: int | None, text: str | None) -> None:
        """Show ``text`` as ``rank``'s line being redrawn (a progress bar's latest state), in place, where the stream
        can (the widget view's ``LogBuffer.redraw``); elsewhere nothing: its final state comes as a line. ``None``
        removes it (its final state was just emitted). Not throttled: it replaces, never adds."""
        redraw = getattr(self._stream(), "redraw", None)
        if redraw is not None:
            redraw("torchrun" if rank is None else f"rank {rank}", text)

    def note(self, text: str) -> None:
        """Print one ``[launcher]`` line (not throttled, not kept in a rank's tail)."""
        self._stream().write(f"[launcher] {text}\n")

    def flush_suppressed(self) -> None:
        """Say how many lines were not shown, if any, and reset the count."""
        if self.suppressed:
            self._stream().write(f"[launcher] {self.suppressed} line(s) not shown to keep the output small; "
                                 f"all lines are in {self.log_name}\n")
            self.suppressed = 0

    def tail(self, rank: int | None, n: int = 20) -> list[str]:
        """The last ``n`` lines of ``rank`` (``None``: torchrun's own lines)."""
        return list(self.tails.get(rank, ()))[-n:]
