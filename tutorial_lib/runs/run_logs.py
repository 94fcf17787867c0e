"""What a finished run's logs say, one named question each: the small readers the notebooks call.

``tl.runs.read_output_log``, ``tl.runs.rank_errors``, ``tl.runs.agent_failures``, ``tl.runs.fatal_errors``,
``tl.runs.collective_fingerprints``, ``tl.runs.count_log_matches``, ``tl.runs.lost_connection`` and
``tl.runs.workers_started`` read a run directory's ``output.log`` (every line the ranks and torchrun printed) and
torchrun's folders and error files, through ``tutorial_lib.torchrun``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from ..errors import ConfigError
from .rundir import LOGS, OUTPUT_LOG, node_log_dirs
from ..torchrun.attempts import attempts, last_attempt_error_files, read_error_file
from ..torchrun.formats import COLLECTIVE_FINGERPRINT, FAULTHANDLER_FRAME
from ..torchrun.root_cause import AGENT_FAILED, PEER_LOST
from ..torchrun.output_lines import rank_lines


def read_output_log(run_dir: str | os.PathLike) -> str:
    """Every line torchrun and the ranks printed during a launch (``<run_dir>/output.log``), also those the cell did not
    show (each rank's lines prefixed ``[rankN]:``). A run in the notebook's process (``run_in_process``) has what the
    script printed.

    Raises:
        ConfigError: the run directory holds no ``output.log`` (not a run directory, or its launch never started).
    """
    path = Path(run_dir) / OUTPUT_LOG
    try:
        return path.read_text(errors="replace")
    except OSError as e:
        raise ConfigError(f"no {OUTPUT_LOG} in {str(run_dir)!r} ({e.strerror}): pass the folder a launch created") from e


def workers_started(run_dir: str | os.PathLike) -> int:
    """How many worker processes torchrun started in a launch: one folder per rank per attempt in its logs, over every
    (simulated) node. 0 when torchrun failed before starting any, e.g. in the rendezvous (a taken port, a node that
    never came); a run that restarted once counts every rank twice."""
    log_dirs = list(node_log_dirs(run_dir).values()) or [Path(run_dir) / LOGS]
    return sum(len(a.rank_dirs()) for log_dir in log_dirs for a in attempts(log_dir))


def rank_errors(run_dir: str | os.PathLike, attempt: int | None = None) -> dict[int, str]:
    """``{local_rank: traceback}`` from the error files the ranks' ``@record`` wrote in one torchrun attempt.

    Args:
        run_dir: a one-node run directory (torchrun's logs in ``<run_dir>/logs``).
        attempt: the attempt (0 = the first start, 1 = the first restart, ...); ``None``: the last one.

    Returns:
        The traceback (or message) of each rank that wrote an error file; a rank killed by a signal, or stopped
        by torchrun with SIGTERM, writes none. Empty when no rank wrote one.
    """
    log_dir = Path(run_dir) / LOGS
    if attempt is None:
        files = last_attempt_error_files(log_dir)
    else:
        files = {rank: path for a in attempts(log_dir) if a.number == int(attempt)
                 for rank, path in a.error_files().items()}
    return {local_rank: read_error_file(path) for local_rank, path in sorted(files.items())}


def lost_connection(error: str) -> bool:
    """Whether a rank's error is only the loss of its peer (``Connection reset by peer``, ``Connection closed by
    peer``, ...): the rank failed because another one died, not on its own."""
    return bool(PEER_LOST.search(error))


def agent_failures(run_dir: str | os.PathLike) -> list[tuple[int, int]]:
    """``[(local_rank, exit_code), ...]`` from torchrun's agent lines ``failed (exitcode: N) local_rank: R`` in
    ``<run_dir>/output.log``, in order: one per failed worker per attempt, also when torchrun then restarted the
    group. A negative exit code is the signal that killed the worker (-9: SIGKILL)."""
    text = read_output_log(run_dir)
    return [(int(m["local_rank"]), int(m["exitcode"])) for m in AGENT_FAILED.finditer(text)]


class FatalError(NamedTuple):
    """A ``Fatal Python error`` a rank printed (faulthandler, on SIGABRT, SIGSEGV, ...) and where it was."""

    rank: int | None
    error: str  # "Aborted", "Segmentation fault", ...
    function: str  # the innermost Python function on the stack ("" if none was printed)




def fatal_errors(run_dir: str | os.PathLike) -> list[FatalError]:
    """Every ``Fatal Python error: ...`` in ``<run_dir>/output.log``, with its rank and the innermost Python
    function of the stack printed after it (faulthandler prints the most recent call first)."""
    found: list[FatalError] = []
    pending: dict[int | None, int] = {}  # rank -> index in found still waiting for its first frame
    for rank, text in rank_lines(read_output_log(run_dir)):
        if text.startswith("Fatal Python error: "):
            pending[rank] = len(found)
            found.append(FatalError(rank, text.removeprefix("Fatal Python error: ").strip(), ""))
        elif rank in pending and (frame := FAULTHANDLER_FRAME.match(text)):
            index = pending.pop(rank)
            found[index] = found[index]._replace(function=frame["function"])
    return found




def collective_fingerprints(run_dir: str | os.PathLike) -> list[tuple[int, str, tuple[int, ...]]]:
    """``[(rank, op, shape), ...]``, sorted and without repeats: the collective each rank reported running when
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` found a mismatch (``<run_dir>/output.log``); a scalar's shape is ``()``."""
    text = read_output_log(run_dir)
    return sorted({(int(m["rank"]), m["op"], tuple(int(n) for n in m["shape"].split(",") if n.strip()))
                   for m in COLLECTIVE_FINGERPRINT.finditer(text)})


def count_log_matches(run_dir: str | os.PathLike, patterns: Mapping[str, str]) -> dict[str, int]:
    """``{name: number of matches}`` of each regular expression in ``patterns`` over ``<run_dir>/output.log``
    (every line the ranks and torchrun printed, also those the cell did not show)."""
    text = read_output_log(run_dir)
    return {name: len(re.findall(pattern, text)) for name, pattern in patterns.items()}
