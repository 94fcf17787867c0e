"""The cell's side of a job's output: every rank's lines, rank-prefixed and throttled, and the pump that feeds them.

Each rank's lines come from its own torchrun log files (``tutorial_lib.torchrun.rank_logs``: which rank wrote a line is
the file it is in, so no text a rank prints passes for another rank's); torchrun's own lines from its stdout and
stderr, which the launcher's reader threads put on the ``OutputPump``'s queue. The launching thread takes both and
passes each line through torchrun's readers (``tutorial_lib.torchrun``: the redrawn lines, the noise filter) into
``output.log`` (one labelled line each: ``tutorial_lib.torchrun.output_lines``), the transcript and the
``ThrottledPrinter``. All lines go to ``output.log`` in the run directory; the screen gets at most ``max_lines_per_s``
lines a second (a token bucket), so a chatty script cannot flood the notebook or hit papermill's IOPub limits. The
order of lines across ranks is the order they were read in; each rank's lines of a stream keep their order.
"""

from __future__ import annotations

import os
import queue
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from ..i18n import _
from ..runs.rundir import OUTPUT_LOG
from ..torchrun.formats import ERROR_LINE
from ..torchrun.noise import NoiseFilter
from ..torchrun.output_lines import label_line
from ..torchrun.rank_logs import LINE_END, NodeLogs, RankLine
from ..torchrun.tee import RankTails, Redraws, without_torch_label

# The line that says what went wrong: shown even when the screen's line budget is spent.


class ThrottledPrinter:
    """Print lines with a rank prefix, at most ``max_lines_per_s`` per second (burst ``2 * max``).

    Keeps the last ``tail_lines`` lines of every rank for error reports, whether printed or not.
    ``keeps_full_tracebacks``: True where the lines land in a collapsible area (the widget view), so a rank's
    traceback frames are shown whole; False in a cell's stdout or a terminal, which show its exception line.
    """

    LAST_LINES = 3  # at the end, each rank's last lines the budget held back are shown, this many at most
    LINE_CHARS = 240  # a longer line is cut here in a cell's stdout (``output.log`` keeps it whole)

    def __init__(self, stream: TextIO | None = None, max_lines_per_s: float = 20.0, tail_lines: int = 30,
                 log_name: str = OUTPUT_LOG, keeps_full_tracebacks: bool = False) -> None:
        self.stream = stream
        self.log_name = log_name  # where the suppressed lines can be read in full
        self.rate = float(max_lines_per_s)
        self.capacity = max(1.0, 2 * self.rate)
        self.tokens = self.capacity
        self.last_refill = time.monotonic()
        self.suppressed = 0
        self._log_named = False  # whether a note has named log_name yet (once per launch)
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
        self._stream().write(f"[{label}] {self.fitted(text)}\n")

    def fitted(self, text: str) -> str:
        """``text`` as the screen shows it: whole in the widget view (its lines wrap in a scrolling area); in a cell's
        stdout or a terminal, cut after ``LINE_CHARS`` characters with the count of the rest (a DETAIL collective
        fingerprint or a gloo error can run to 600 characters; ``output.log`` and the doctor read the whole line)."""
        if self.keeps_full_tracebacks or len(text) <= self.LINE_CHARS:
            return text
        return _("{start} ... ({n} more characters in the log)", start=text[:self.LINE_CHARS],
                 n=len(text) - self.LINE_CHARS)

    def show_last_lines(self) -> None:
        """At the job's end: say how many lines were not shown, then show each rank's last lines (``LAST_LINES`` at
        most) that the budget held back, whatever the budget: a long-printing rank's last lines are usually what
        matters (its final loss, where it stopped), and the cell would otherwise show only its first ones. torchrun's
        own held-back lines are only counted (its last ones are its shutdown; an error line of it was shown anyway)."""
        self._behind.pop(None, None)  # its held-back lines stay counted in ``suppressed``
        behind = {rank: count for rank, count in self._behind.items() if count}
        if not behind:
            self.flush_suppressed()
            return
        if self.suppressed or not self._log_named:
            text = self.naming_log(_("{n} line(s) not shown to keep the output small; all lines are in {log}; the "
                                      "last lines of each rank:", n=self.suppressed, log=self.log_name),
                                    _("{n} more line(s) not shown; the last lines of each rank:", n=self.suppressed))
        else:  # every held-back line was counted above already
            text = _("the last lines of each rank, held back above:")
        self.note(text)
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
            self.note(self.naming_log(_("{n} line(s) not shown to keep the output small; all lines are in {log}",
                                         n=self.suppressed, log=self.log_name),
                                       _("{n} more line(s) not shown", n=self.suppressed)))
            self.suppressed = 0

    def naming_log(self, first: str, later: str) -> str:
        """``first`` (a note that names ``log_name``) the first time a note of this launch names it, else ``later``
        (the same without the path): the full log is named once."""
        text = later if self._log_named else first
        self._log_named = True
        return text

    def tail(self, rank: int | None, n: int = 20) -> list[str]:
        """The last ``n`` lines of ``rank`` (``None``: torchrun's own lines)."""
        return self.tails.tail(rank, n)


class OutputPump:
    """What the job's output goes through and into: the redrawn lines, the noise filter, the throttled printer,
    ``output.log``, the transcript (its lines, as written) and the (rank, text) of every line.

    torchrun's reader threads put ``(node, line)`` on ``lines`` (``(node, None)`` when a node's stream ends); only the
    launching thread takes them off, and reads the ranks' files, with ``read_lines``. ``nnodes``: the launch's node
    count (on several, torchrun's own lines are labelled with their node and a rank's global rank comes from the rank
    runner's record); ``nodes``: the nodes it started; ``output_log``: ``output.log``, open; ``log_dirs``: ``{node:
    torchrun's --log-dir}`` of the nodes whose ranks' files to read (``None``: none, torchrun's lines only).
    """

    def __init__(self, nnodes: int, run_dir: Path, nodes: Sequence[int], printer: ThrottledPrinter,
                 output_log: TextIO, log_dirs: Mapping[int, str | os.PathLike] | None = None) -> None:
        self.nnodes, self.run_dir, self.printer, self.output_log = nnodes, run_dir, printer, output_log
        self.lines: queue.Queue = queue.Queue()
        self.transcript: list[str] = []  # output.log's lines
        self.ranked: list[tuple[int | None, str]] = []  # (global rank or None, text) of every line
        self.open_streams = set(nodes)
        self.rank_logs = {node: NodeLogs(log_dir, one_node=nnodes == 1) for node, log_dir in (log_dirs or {}).items()}
        self.noise = NoiseFilter()  # what a torch version prints on every launch: in output.log, not on screen
        self.redraws = Redraws()  # lines a rank redraws with \r: their latest state
        self.torchrun_traceback = False

    def _log(self, rank: int | None, text: str, node: int | None = None, attempt: int = 0) -> None:
        line = label_line(rank, text, node if self.nnodes > 1 and rank is None else None, attempt)
        self.output_log.write(line + "\n")
        self.transcript.append(line)

    def take(self, node: int, line: str) -> None:
        """Log, keep and (throttled) show one line of ``node``'s torchrun's own output (its stdout and stderr hold
        nothing of the ranks': ``--redirects 3``). A ``\\r`` in it ends a line too, as in the ranks' files."""
        for text in LINE_END.split(line):
            self._log(None, text, node)
            self.ranked.append((None, text))
            # torchrun's own traceback (ChildFailedError) repeats what the raised LaunchError says;
            # it stays in output.log and the error's output_tail, not on screen.
            self.torchrun_traceback = self.torchrun_traceback or "Traceback" in text
            self._show(None, f"[node {node}] {text}" if self.nnodes > 1 else text)

    def take_rank(self, node: int, line: RankLine) -> None:
        """Log, keep and (throttled) show one line of a rank, read from its torchrun log file: every state of a
        redrawn line is logged, and shown in place at most; its final state is shown as a line when the line ends
        (its marked newline, or the job's end: ``Redraws``). An unfinished line (``line.complete`` false) is only
        shown in place, if it is a state of a redrawn line: it comes again, whole, when it ends."""
        rank = line.rank
        if rank is None:  # several nodes, and no rank runner ran in that attempt on that node: see RankLine.rank
            self.take(node, f"[local rank {line.local_rank}] {line.text}")
            return
        if not line.complete:
            state = self.redraws.peek(without_torch_label(rank, line.text))
            if state is not None:
                self.printer.redraw(rank, state)
            return
        marked = without_torch_label(rank, line.text)  # torch's own [rankR]: stays in output.log, not on screen
        text, redrawn, ended = self.redraws.take(rank, marked)
        if text is not None:  # else only marks: the end of a line already logged
            self._log(rank, line.text[:len(line.text) - len(marked)] + text, attempt=line.attempt)
            self.ranked.append((rank, text))
        if ended is None and (redrawn or text is None):
            if text is not None:
                self.printer.redraw(rank, text)  # in place where the view can (widgets), else not shown
            return
        if ended is not None:  # the redrawn line's final state: from here on a line like any other
            self.printer.redraw(rank, None)
            text = ended
        self._show(rank, text)

    def _show(self, rank: int | None, text: str) -> None:
        kind = self.noise.kind(rank, text)
        # A rank's traceback frames: in the widget view's collapsible output area (one click away), not in a
        # text-mode cell, where the exception line says the cause and output.log keeps every frame.
        frame = kind == NoiseFilter.TRACEBACK and self.printer.keeps_full_tracebacks
        self.printer.emit(rank, text, show=not (rank is None and self.torchrun_traceback) and (kind is None or frame),
                          keep=kind != NoiseFilter.VERSION, force=frame)  # version noise is no rank's last words

    def read_rank_logs(self, final: bool = False) -> bool:
        """Take the lines the ranks wrote to their files since the last call; True if any arrived. ``final``: every
        agent has exited and nothing is left running: the files are read to their end (``NodeLogs.read``)."""
        got = False
        for node, logs in self.rank_logs.items():
            for line in logs.read(final=final):
                self.take_rank(node, line)
                got = got or line.complete
        return got

    def read_lines(self, wait_s: float) -> bool:
        """Take torchrun's lines available within ``wait_s``, then the ranks' new lines; True if any arrived."""
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
        return self.read_rank_logs() or got

    def close(self) -> None:
        """After the last read: close ``output.log`` and the ranks' files (the final read closed them, unless the job
        ended on the launcher's own error)."""
        self.output_log.close()
        for logs in self.rank_logs.values():
            logs.close()

    def finish(self) -> None:
        """After the output log is closed: show what was held back (the final state of every line still being redrawn,
        the count of lines not shown and each rank's last lines), and say how many traceback lines were not shown."""
        for rank, text in self.redraws.end_all().items():
            self.printer.emit(rank, text)
            self.printer.redraw(rank, None)
        self.printer.show_last_lines()
        if self.noise.traceback_lines and not self.printer.keeps_full_tracebacks:
            n = self.noise.traceback_lines
            self.printer.note(self.printer.naming_log(
                _("{n} traceback line(s) not shown (the exception line is); every line is in {path}", n=n,
                  path=self.run_dir / OUTPUT_LOG),
                _("{n} traceback line(s) not shown (the exception line is), in the same log", n=n)))
