"""Every rank's output, read from torchrun's per-rank log files as they grow: which rank wrote a line is the file it is
in, never anything in its text.

With ``--log-dir LOG_DIR --redirects 3`` torchrun sends each worker's stdout and stderr only to its own files,
``LOG_DIR/<run id>_<random>/attempt_<N>/<local rank>/stdout.log`` and ``stderr.log``, and prints nothing of theirs
itself (torch 2.8 and 2.13: ``DefaultLogsSpecs.reify`` in ``torch/distributed/elastic/multiprocessing/api.py``): a
new ``attempt_<N>`` folder for each restart of the group (``--max-restarts``), its rank folders and files made before
the ranks start, the files opened by the ranks as their stdout and stderr. ``NodeLogs`` follows one agent's
``LOG_DIR`` (one per simulated or SLURM node) through ``attempts.attempts``, the one reader of those folders.

torch's own reader of these files (``torch.distributed.elastic.multiprocessing.tail_log``, what ``--tee`` runs) is not
used: it copies every file's lines into one text stream behind a ``[<role><local rank>]:`` header, which is where a
rank could write another rank's header (the ``--tee`` output the launcher used to split, ``tee.py``), it runs a thread
per file, and importing it imports torch into the launching process (seconds, on a launch that otherwise never
imports it). This reads the files as it does, as text where a bare ``\\r`` ends a line too (``readline`` with
universal newlines) and where what a rank has written of an unfinished line is seen at once, and keeps each file's
lines apart. A line of the rank runner's marks (a redrawn line, ``tee.Redraws``) reads the same either way.

Which global rank a folder holds: on one node its local rank (the folder's name); on several, the rendezvous decides
(node ranks by arrival order), and the rank runner records it in the folder before the script runs
(``child.protocol.RANK_RECORD``); a folder without a record takes it from a folder of the same attempt that has one
(torchrun numbers a node's ranks consecutively). Pure reading: no thread, no process; the caller polls ``read``.

What this guards against is text: whatever a rank prints, on either stream, through Python or past it, is its own
line. A script that sets out to open another rank's file and write into it is not stopped (the ranks run as one user
in one folder), and neither is one that overwrites its rank record.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from .attempts import attempts, read_rank_record
from .output_lines import label_line

STREAMS = ("stdout", "stderr")  # torchrun's files of a rank: <stream>.log
# A line ends at "\r\n", "\r" or "\n", as in a text file read with universal newlines (torch's own tail_log reader).
LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class RankLine:
    """A line of one rank's output, read from its log file.

    Attributes:
        rank: the global rank; ``None`` when nothing says it (several nodes, and no rank of the folder's attempt on
            that node ran the rank runner: only output from before the script, such as Python's own start-up error).
        local_rank: the rank on its node (the folder's name).
        attempt: torchrun's attempt (0: the first start, 1: the first restart, ...).
        stream: ``"stdout"`` or ``"stderr"``.
        text: the line, without its line ending.
        complete: ``False`` for what the rank has written so far of a line it has not ended (a progress bar's latest
            state, a ``print(..., end="")``): reported again, whole, when it ends.
    """

    rank: int | None
    local_rank: int
    attempt: int
    stream: str
    text: str
    complete: bool = True


class LogFile:
    """One log file read as it grows: its new complete lines, and what is written of its unfinished line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two reads
        self._rest = ""  # text read after the last line ending

    def read(self, final: bool = False) -> tuple[list[str], str]:
        """``(lines, rest)``: the lines completed since the last call and the unfinished line's text so far (``""``:
        none). ``final``: nothing more will be written; the rest is returned as a last line. A file not made yet
        reads as empty."""
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except FileNotFoundError:
                return [], ""
        text = self._rest + self._decoder.decode(self._file.read(), final=final)
        held = "\r" if text.endswith("\r") and not final else ""  # maybe half of "\r\n": decided by the next read
        lines = LINE_END.split(text[:len(text) - len(held)])
        rest = lines.pop()
        self._rest = rest + held
        if final:
            if rest:
                lines.append(rest)
            self._rest = rest = ""
        return lines, rest

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class NodeLogs:
    """One node's torchrun ``--log-dir``, followed as it grows: every rank's lines, file by file (see the module).

    Args:
        log_dir: the node's ``--log-dir`` (it may not exist yet).
        one_node: the job has one node: a folder's local rank is its global rank (no record needed).
    """

    def __init__(self, log_dir: str | Path, *, one_node: bool) -> None:
        self.log_dir, self.one_node = Path(log_dir), one_node
        self._files: dict[tuple[int, int, str], LogFile] = {}  # (attempt, local rank, stream) -> its file
        self._ranks: dict[tuple[int, int], int | None] = {}  # (attempt, local rank) -> global rank, once known
        self._held: dict[tuple[int, int], list[RankLine]] = {}  # lines of a folder whose global rank is not known yet
        self._shown_rest: dict[tuple[int, int, str], str] = {}  # each file's unfinished line as last reported
        self._ended: set[int] = set()  # attempts read to their end (a later one started)

    def ranks(self) -> set[int]:
        """The global ranks whose folders this node's log directory holds, as far as known (on several nodes, from the
        rank runner's records), over every attempt read so far."""
        return {rank for rank in self._ranks.values() if rank is not None}

    def read(self, final: bool = False) -> list[RankLine]:
        """The lines written since the last call, attempt after attempt, each rank's in order.

        ``final``: the node's agent has exited (its ranks are gone): every file is read to its end, unfinished lines
        included, and closed; a folder whose global rank is still unknown gives its lines with ``rank=None``. Until
        then the lines of a folder whose rank is not known yet are held back.
        """
        found = [a for a in attempts(self.log_dir) if a.number not in self._ended]
        lines: list[RankLine] = []
        for i, attempt in enumerate(found):
            # torchrun makes the next attempt's folder after it stopped this one's ranks: nothing more comes here
            last = final or i < len(found) - 1
            rank_dirs = attempt.rank_dirs()
            for local_rank, folder in sorted(rank_dirs.items()):
                lines += self._read_folder(attempt.number, local_rank, folder, rank_dirs, last)
            if last:
                self._end(attempt.number)
        return lines

    def _read_folder(self, attempt: int, local_rank: int, folder: Path, rank_dirs: dict[int, Path],
                     last: bool) -> list[RankLine]:
        """The new lines of one rank folder's two files, with their global rank once it is known (else held)."""
        key = (attempt, local_rank)
        rank = self._rank_of(attempt, local_rank, rank_dirs)
        held = self._held.setdefault(key, [])
        unfinished = []
        for stream in STREAMS:
            log = self._files.setdefault((*key, stream), LogFile(folder / f"{stream}.log"))
            complete, rest = log.read(final=last)
            held += [RankLine(None, local_rank, attempt, stream, text) for text in complete]
            if rest != self._shown_rest.get((*key, stream), ""):
                self._shown_rest[(*key, stream)] = rest
                if rest:
                    unfinished.append(RankLine(None, local_rank, attempt, stream, rest, complete=False))
        if not held and not unfinished:
            return []
        if rank is None and not last:
            return []  # what it has written of an unfinished line is reported again, whole, when it ends
        lines = [replace(line, rank=rank) for line in held + unfinished]
        held.clear()
        return lines

    def _rank_of(self, attempt: int, local_rank: int, rank_dirs: dict[int, Path]) -> int | None:
        """The global rank of an attempt's rank folder: its local rank on one node; else its own record's, else one
        from a folder of the same attempt that has a record (a node's ranks are numbered consecutively)."""
        if self.one_node:
            self._ranks[attempt, local_rank] = local_rank
            return local_rank
        for other in [local_rank, *sorted(set(rank_dirs) - {local_rank})]:
            if self._ranks.get((attempt, other)) is None:
                self._ranks[attempt, other] = read_rank_record(rank_dirs[other], other)
            if self._ranks[attempt, other] is not None:
                self._ranks[attempt, local_rank] = self._ranks[attempt, other] - other + local_rank
                return self._ranks[attempt, local_rank]
        return None

    def _end(self, attempt: int) -> None:
        """Close ``attempt``'s files: it is read to its end."""
        self._ended.add(attempt)
        for key in [k for k in self._files if k[0] == attempt]:
            self._files.pop(key).close()

    def close(self) -> None:
        """Close every file still open (the job ended without a final read: the launcher's own error)."""
        for log in self._files.values():
            log.close()
        self._files.clear()


def labelled_output(log_dir: str | Path) -> str:
    """Every rank's lines in a finished one-node job's ``--log-dir``, as ``output.log``'s labelled lines (rank by
    rank, attempt after attempt): what the doctor reads of a torchrun job that the launcher did not pump, such as a
    torchft replica group's attempt folder (``logs/`` and torchrun's own ``torchrun.log``). ``""`` when it holds none.
    """
    logs = NodeLogs(log_dir, one_node=True)
    try:
        return "".join(label_line(line.rank, line.text, attempt=line.attempt) + "\n" for line in logs.read(final=True))
    finally:
        logs.close()
