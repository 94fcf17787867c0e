"""``output.log``'s lines, each labelled with who wrote it: the format the launcher writes, and the one reader of it.

One line of ``output.log`` per line printed, its label first::

    [rank 3] step 1/6 loss 0.25        a line rank 3 wrote (stdout or stderr), read from its torchrun log file
    [rank 3 attempt 1] step 4/6 ...    a line rank 3 wrote after torchrun restarted the ranks (--max-restarts)
    [torchrun] W1130 ... api.py:...    torchrun's own line (one node)
    [torchrun node 1] W1130 ...        node 1's torchrun's own line (several nodes)
    [batch] srun: error: ...           a SLURM job's batch script's own line

The launcher knows who wrote a line before it writes it (each rank's lines come from that rank's own files,
``rank_logs``; torchrun's from its own stdout and stderr), and the text follows the label whole: a rank that prints
``[rank 1] x`` or ``[default1]:x`` is logged as ``[rank 0] [rank 1] x``, rank 0's line. A logged text holds no line
break: the launcher splits what it reads at ``\\r\\n``, ``\\r`` and ``\\n``, and ``rank_lines`` splits ``output.log`` at
``\\n`` only (``str.splitlines`` would also split at a form feed or U+2028 a rank printed, and read the rest as a line
of its own).

Run directories written before this format hold torchrun's ``--tee`` output instead: ``[default<local rank>]:`` (or,
on several nodes, ``[rank<global rank>]:``) before each chunk a rank wrote, where a rank's unfinished chunk was
continued on the same line by another rank's, and torchrun's own lines unlabelled. A line that does not start with
one of the labels above is read as that, by the old reader kept for it (``tee.TeeSplitter`` and
``tee.split_rank_prefix``): the recorded run directories of ``tests/fixtures/run_dirs`` read as they were written. In
that format a rank's text could pass for another rank's (the splitter cuts before any prefix inside a line); in this
one it cannot.
"""

from __future__ import annotations

import re

from .tee import TeeSplitter, split_rank_prefix, without_torch_label

# The labels, first on a line: "[rank 3] ", "[torchrun] ", "[torchrun node 1] ", "[batch] ".
LABEL = re.compile(r"^\[(?:rank (?P<rank>\d+)(?: attempt (?P<attempt>\d+))?|torchrun(?: node (?P<node>\d+))?|"
                   r"(?P<batch>batch))\] ")
BATCH_LABEL = "[batch] "  # a SLURM job's batch script's own lines
# A label only the current format writes (an old SLURM output.log has "[batch] " lines too).
_CURRENT_FORMAT = re.compile(r"^\[(?:rank \d+(?: attempt \d+)?|torchrun(?: node \d+)?)\] ", re.M)


def label_line(rank: int | None, text: str, node: int | None = None, attempt: int = 0) -> str:
    """The line of ``output.log`` (without its newline) for ``text``, written by ``rank`` (``None``: torchrun; ``node``:
    which node's torchrun, on several nodes) in torchrun's ``attempt`` (0: the first start; said from 1 on). ``text``
    holds no ``\\n`` or ``\\r`` (the caller split them off)."""
    if rank is not None:
        return f"[rank {rank}] {text}" if not attempt else f"[rank {rank} attempt {attempt}] {text}"
    return f"[torchrun] {text}" if node is None else f"[torchrun node {node}] {text}"


def parse_line(line: str) -> tuple[int | None, str] | None:
    """``(rank, text)`` of a labelled line of ``output.log`` (``rank`` ``None``: torchrun's or the batch script's own
    line; ``text`` without the rank's own ``[rank<R>]:`` torch puts before a traceback line, as
    ``tee.split_rank_prefix`` reads the older format); ``None`` when ``line`` has no label (the older ``--tee``
    format)."""
    m = LABEL.match(line)
    if m is None:
        return None
    if m["rank"] is None:
        return None, line[m.end():]
    return int(m["rank"]), without_torch_label(int(m["rank"]), line[m.end():])


def rank_lines(output: str) -> list[tuple[int | None, str]]:
    """``(rank, text)`` of every line of ``output`` (an ``output.log``, or the launcher's transcript joined by
    ``\\n``): a labelled line by its label, any other as the older ``--tee`` format (see the module). ``rank`` is
    ``None`` for torchrun's own lines (and a SLURM batch script's)."""
    splitter = TeeSplitter()
    found: list[tuple[int | None, str]] = []
    lines = output.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    for line in lines:
        labelled = parse_line(line)
        if labelled is not None:
            found.append(labelled)
        else:
            found += [split_rank_prefix(piece) for piece in splitter.split(line)]
    return found


def attempt_lines(output: str) -> list[tuple[int | None, int | None, str]]:
    """``(rank, attempt, text)`` of every line of ``output``, as ``rank_lines`` reads them: ``attempt`` is the torchrun
    attempt a rank's line came from (0 unless its label says another), ``None`` for torchrun's own lines and for the
    older ``--tee`` format (which does not say it)."""
    if _CURRENT_FORMAT.search(output) is None:
        return [(rank, None, text) for rank, text in rank_lines(output)]
    found = []
    for line in output.split("\n")[:-1] if output.endswith("\n") else output.split("\n"):
        m = LABEL.match(line)
        if m is not None and m["rank"] is not None:
            rank = int(m["rank"])
            found.append((rank, int(m["attempt"] or 0), without_torch_label(rank, line[m.end():])))
        else:
            found += [(rank, None, text) for rank, text in rank_lines(line)]
    return found


def torchrun_output(output: str) -> str:
    """torchrun's own lines in ``output`` (its failure summary, its agent's lines, its traceback), for the readers of
    what torchrun says: in the current format its labelled lines (and a SLURM batch script's), labels removed; in the
    older ``--tee`` format the whole output, as those readers always read it (its own lines stood unlabelled among the
    ranks')."""
    if _CURRENT_FORMAT.search(output) is None:
        return output
    return "\n".join(text for rank, text in rank_lines(output) if rank is None)
