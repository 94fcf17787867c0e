"""torchrun's ``--tee`` output as older run directories hold it, and what every rank's output goes through: the
latest state of a redrawn line, and each rank's last lines.

Until the launcher read each rank's lines from its own torchrun log files (``rank_logs``), it ran torchrun with
``--tee 3``, which copies every rank's stdout and stderr to its own output with a ``[<role><local_rank>]:`` prefix
(``[default0]:``; with the launcher's multi-node prefix template ``[rank<global rank>]:``), a chunk at a time: a chunk
may be an unfinished line, which the next rank's chunk continues (``split_tee_line``). ``output.log`` of those run
directories is that output; ``output_lines.rank_lines`` reads it with ``TeeSplitter`` and ``split_rank_prefix``, kept
here for them (a rank's text could pass for another rank's there: see ``split_tee_line``). A line a rank redraws with
carriage returns reaches the launcher with the rank runner's marks (``tutorial_lib/child/protocol.py``), read back by
``Redraws``. Pure: these read lines, they print nothing.
"""

from __future__ import annotations

import re
from collections import deque

from ..child.protocol import REDRAW_DONE, REDRAW_START, REDRAWN_END

_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]+?)(?P<local_rank>\d+)\]:(?P<text>.*)$")


def split_rank_prefix(line: str, rank_offset: int = 0) -> tuple[int | None, str]:
    """Split a torchrun ``--tee`` line into ``(rank, text)``; ``rank`` is ``None`` for torchrun's own lines.

    ``rank_offset`` is added to the local rank (the node's first global rank; 0 on one node). The ``[rankN]:``
    that torch.distributed's ``sys.excepthook`` puts before each traceback line of rank N is dropped.
    """
    m = _PREFIX.match(line)
    if m is None:
        return None, line
    rank = int(m.group("local_rank")) + rank_offset
    return rank, without_torch_label(rank, m.group("text"))


def without_torch_label(rank: int, text: str) -> str:
    """``text``, a line of rank ``rank``, without the ``[rank<rank>]:`` (and the space after it) that
    torch.distributed's ``sys.excepthook`` puts before each traceback line of that rank: the line is known to be
    rank ``rank``'s, said once is enough. A label naming another rank stays: it is part of what the rank printed."""
    torch_prefix = f"[rank{rank}]:"
    if text.startswith(torch_prefix):
        text = text[len(torch_prefix):]
        text = text[1:] if text.startswith(" ") else text
    return text


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

    @staticmethod
    def peek(text: str) -> str | None:
        """What an unfinished piece of a rank's line shows, if it is a state of a redrawn line (it starts with the
        rank runner's mark), without the mark; else ``None``. Nothing is kept: the piece comes again, whole, when the
        rank ends it (``take``)."""
        if not text.startswith(REDRAW_START):
            return None
        return text[len(REDRAW_START):] or None

    def end_all(self) -> dict[int | None, str]:
        """The final state of every line still being redrawn (the job ended); forgets them."""
        ended, self._latest = self._latest, {}
        return ended


class RankTails:
    """The last ``max_lines`` lines of every rank (``None``: torchrun's own lines), for error reports and the doctor."""

    def __init__(self, max_lines: int = 30) -> None:
        self.max_lines = max_lines
        self._tails: dict[int | None, deque[str]] = {}

    def add(self, rank: int | None, text: str) -> None:
        """Keep ``text`` as ``rank``'s latest line."""
        self._tails.setdefault(rank, deque(maxlen=self.max_lines)).append(text)

    def tail(self, rank: int | None, n: int = 20) -> list[str]:
        """The last ``n`` lines of ``rank`` (``None``: torchrun's own lines)."""
        return list(self._tails.get(rank, ()))[-n:]
