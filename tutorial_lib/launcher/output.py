"""The cell's side of a job's output: every rank's lines, rank-prefixed and throttled, and the pump that feeds them.

The launcher's reader threads put torchrun's output lines on the ``OutputPump``'s queue; the launching thread takes
them off and passes each through torchrun's readers (``tutorial_lib.torchrun``: the tee splitter, the redrawn
lines, the noise filter) into ``output.log``, the transcripts and the ``ThrottledPrinter``. All lines go to
``output.log`` in the run directory; the screen gets at most ``max_lines_per_s`` lines a second (a token bucket),
so a chatty script cannot flood the notebook or hit papermill's IOPub limits.
"""

from __future__ import annotations

import queue
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from ..runs.rundir import OUTPUT_LOG
from ..torchrun.formats import ERROR_LINE
from ..torchrun.noise import NoiseFilter
from ..torchrun.tee import RankTails, Redraws, TeeSplitter, split_rank_prefix

# The line that says what went wrong: shown even when the screen's line budget is spent.


class ThrottledPrinter:
    """Print lines with a rank prefix, at most ``max_lines_per_s`` per second (burst ``2 * max``).

    Keeps the last ``tail_lines`` lines of every rank for error reports, whether printed or not.
    ``keeps_full_tracebacks``: True where the lines land in a collapsible area (the widget view), so a rank's
    traceback frames are shown whole; False in a cell's stdout or a terminal, which show its exception line.
    """

    LAST_LINES = 5  # at the end, each rank's last lines the budget held back are shown, this many at most

    def __init__(self, stream: TextIO | None = None, max_lines_per_s: float = 20.0, tail_lines: int = 30,
                 log_name: str = OUTPUT_LOG, keeps_full_tracebacks: bool = False) -> None:
        self.stream = stream
        self.log_name = log_name  # where the suppressed lines can be read in full
        self.rate = float(max_lines_per_s)
        self.capacity = max(1.0, 2 * self.rate)
        self.tokens = self.capacity
        self.last_refill = time.monotonic()
        self.suppressed = 0
        self.tails = RankTails(tail_lines)  # what each rank said last, shown or not: the error reports' tails
        self.keeps_full_tracebacks = keeps_full_tracebacks
        self._recent = RankTails(self.LAST_LINES)  # each rank's last lines meant for the screen, shown or not
        self._behind: dict[int | None, int] = {}  # rank -> its lines held back since its last line shown

    def _stream(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stdout  # resolved late: ipykernel swaps it

    def emit(self, rank: int | None, text: str, show: bool = True, keep: bool = True, force: bool = False) -> None:
        """Record ``text`` from ``rank`` (unless not ``keep``) and, if ``show``, print it when the budget allows
        (always if ``force``: a traceback's frames in the widget view, finite and wanted whole)."""
        if keep:
            self.tails.add(rank, text)
        if not show:
            return
        self._recent.add(rank, text)
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.last_refill) * self.rate)
        self.last_refill = now
        if self.tokens < 1 and not force and not ERROR_LINE.match(text):  # an error line always gets through
            self.suppressed += 1
            self._behind[rank] = self._behind.get(rank, 0) + 1
            return
        self.tokens = max(0.0, self.tokens - 1)
        self.flush_suppressed()
        self._behind.pop(rank, None)
        self._write(rank, text)

    def _write(self, rank: int | None, text: str) -> None:
        label = "torchrun" if rank is None else f"rank {rank}"
        self._stream().write(f"[{label}] {text}\n")

    def show_last_lines(self) -> None:
        """At the job's end: say how many lines were not shown, then show each rank's last lines (``LAST_LINES`` at
        most) that the budget held back, whatever the budget: a long-printing rank's last lines are usually what
        matters (its final loss, where it stopped), and the cell would otherwise show only its first ones."""
        behind = {rank: count for rank, count in self._behind.items() if count}
        if not behind:
            self.flush_suppressed()
            return
        self._stream().write(f"[launcher] {self.suppressed} line(s) not shown to keep the output small; all lines are "
                             f"in {self.log_name}; the last lines of each rank:\n")
        self.suppressed = 0
        for rank in sorted(behind, key=lambda r: (r is None, r or 0)):
            for text in self._recent.tail(rank, min(behind[rank], self.LAST_LINES)):
                self._write(rank, text)
        self._behind.clear()

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
        return self.tails.tail(rank, n)


class OutputPump:
    """What the job's output lines go through and into: the tee splitter, the noise filter, the throttled
    printer, ``output.log``, the whole transcript, each node's transcript, and the (rank, text) of every line.

    The reader threads put ``(node, line)`` on ``lines`` (``(node, None)`` when a node's stream ends); only the
    launching thread takes them off, with ``read_lines``. ``nnodes``: the launch's node count (on several, torchrun's
    own lines are labelled with their node); ``nodes``: the nodes it started; ``output_log``: ``output.log``, open.
    """

    def __init__(self, nnodes: int, run_dir: Path, nodes: Sequence[int], printer: ThrottledPrinter,
                 output_log: TextIO) -> None:
        self.nnodes, self.run_dir, self.printer, self.output_log = nnodes, run_dir, printer, output_log
        self.lines: queue.Queue = queue.Queue()
        self.transcript: list[str] = []
        self.node_transcripts: dict[int, list[str]] = {node: [] for node in nodes}
        self.ranked: list[tuple[int | None, str]] = []  # (global rank or None, text) of every line
        self.open_streams = set(nodes)
        self.noise = NoiseFilter()  # what a torch version prints on every launch: in output.log, not on screen
        self.tee = TeeSplitter()  # one rank's piece per line, in output.log and on screen
        self.redraws = Redraws()  # lines a rank redraws with \r: their latest state
        self.torchrun_traceback = False

    def take(self, node: int, line: str) -> None:
        """Log, keep and (throttled) show one output line of ``node``'s agent, piece by piece: torchrun writes a
        rank's unfinished line (a ``\\r`` progress bar) and the next rank's chunk on one line (``split_tee_line``)."""
        for piece in self.tee.split(line):
            self.take_piece(node, piece)

    def take_piece(self, node: int, line: str) -> None:
        """One rank's piece (or torchrun's line): every state of a redrawn line is logged, and shown in place at most;
        its final state is shown as a line when the line ends (its marked newline, or the job's end: ``Redraws``)."""
        rank, marked = split_rank_prefix(line)  # global rank on several nodes (prefix template), else local
        text, redrawn, ended = self.redraws.take(rank, marked)
        if text is not None:  # else only marks: the end of a line already logged
            line = line[:len(line) - len(marked)] + text
            self.output_log.write(line + "\n")
            self.transcript.append(line)
            self.node_transcripts[node].append(line)
            self.ranked.append((rank, text))
        if ended is None and (redrawn or text is None):
            if text is not None:
                self.printer.redraw(rank, text)  # in place where the view can (widgets), else not shown
            return
        if ended is not None:  # the redrawn line's final state: from here on a line like any other
            self.printer.redraw(rank, None)
            text = ended
        if rank is None and self.nnodes > 1:
            text = f"[node {node}] {text}"
        # torchrun's own traceback (ChildFailedError) repeats what the raised LaunchError says;
        # it stays in output.log and the error's output_tail, not on screen.
        self.torchrun_traceback = self.torchrun_traceback or (rank is None and "Traceback" in text)
        kind = self.noise.kind(rank, text)
        # A rank's traceback frames: in the widget view's collapsible output area (one click away), not in a
        # text-mode cell, where the exception line says the cause and output.log keeps every frame.
        frame = kind == NoiseFilter.TRACEBACK and self.printer.keeps_full_tracebacks
        self.printer.emit(rank, text, show=not (rank is None and self.torchrun_traceback) and (kind is None or frame),
                          keep=kind != NoiseFilter.VERSION, force=frame)  # version noise is no rank's last words

    def read_lines(self, wait_s: float) -> bool:
        """Take every line available within ``wait_s``; True if any arrived."""
        got = False
        try:
            item = self.lines.get(timeout=wait_s)
            while True:
                node, line = item
                if line is None:
                    self.open_streams.discard(node)
                else:
                    self.take(node, line)
                    got = True
                item = self.lines.get_nowait()
        except queue.Empty:
            pass
        return got

    def finish(self) -> None:
        """After the output log is closed: show what was held back (the final state of every line still being redrawn,
        the count of lines not shown and each rank's last lines), and say how many traceback lines were not shown."""
        for rank, text in self.redraws.end_all().items():
            self.printer.emit(rank, text)
            self.printer.redraw(rank, None)
        self.printer.show_last_lines()
        if self.noise.traceback_lines and not self.printer.keeps_full_tracebacks:
            self.printer.note(f"{self.noise.traceback_lines} traceback line(s) not shown (the exception line is); "
                              f"every line is in {self.run_dir / OUTPUT_LOG}")
