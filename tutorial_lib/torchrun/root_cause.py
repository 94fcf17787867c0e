"""What torchrun leaves behind, read in one place for the launcher and the doctor.

torchrun (``torch.distributed.run``) reports a failed job three ways: its failure summary at the end of its
output ("Root Cause (first observed failure)" and one entry per failed rank with its exit code), the agent's
log line for every worker that failed ("failed (exitcode: -9) local_rank: 1 ..."), also when it restarts the
group, and the error file each rank's ``@record`` writes (``<log_dir>/<run>/attempt_<N>/<local_rank>/error.json``).
See https://pytorch.org/docs/stable/elastic/errors.html.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from ..errors import RankFailure, last_traceback
from ..launcher.output import ThrottledPrinter, rank_lines

# One failed rank's entry in torchrun's summary: "rank : 1 (local_rank: 1) ... exitcode : -9".
FAILURE_ENTRY = re.compile(r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local_rank>\d+)\)"
                      r"\s*exitcode\s*:\s*(?P<exitcode>-?\d+)")
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?" + FAILURE_ENTRY.pattern, re.S)


def read_error_file(path: Path) -> str:
    """The traceback (or message) in a torchrun error file written by ``@record``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return ""
    message = data.get("message", data)
    if isinstance(message, dict):
        extra = message.get("extraInfo", {})
        return extra.get("py_callstack") or message.get("message", "")
    return str(message)


def last_attempt_error_files(log_dir: Path, failed_attempt: bool = False) -> dict[int, Path]:
    """``{local_rank: error.json}`` of torchrun's last attempt (``<log_dir>/<run>/attempt_<N>/<local_rank>/``).

    ``failed_attempt``: the last attempt that left an error file instead (a run that restarted and finished).
    """
    attempts = [p for p in log_dir.glob("*/attempt_*") if p.name.removeprefix("attempt_").isdigit()]
    if failed_attempt:
        attempts = [p for p in attempts if any(p.glob("*/error.json"))]
    if not attempts:
        return {}
    last = max(attempts, key=lambda p: int(p.name.removeprefix("attempt_")))
    return {int(p.parent.name): p for p in last.glob("*/error.json") if p.parent.name.isdigit()}


# The agent's own line for every worker that failed, also when it then restarts the group (no summary follows):
# "failed (exitcode: -9) local_rank: 1 (pid: 5270) of binary: ..."
AGENT_FAILED = re.compile(r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+)")


# Signals that end a rank by themselves (their default action kills the process), unlike the SIGTERM torchrun sends
# to stop the others: the OOM killer's or a user's SIGKILL, native crashes (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP),
# aborts (SIGABRT), a forbidden system call (SIGSYS), resource limits (SIGXCPU, SIGXFSZ).
FATAL_SIGNAL_EXIT_CODES = {-int(s) for s in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS,
                                              signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS,
                                              signal.SIGXCPU, signal.SIGXFSZ)}
PEER_LOST = re.compile(r"Connection reset by peer|Connection closed by peer|Broken pipe|Connection refused|"
                        r"connectFullMesh|Socket closed|peer closed", re.I)


def _no_error_of_its_own(error_file: Path) -> bool:
    """The rank failed only because a peer went away (a lost connection), or left its error file empty."""
    text = read_error_file(error_file)
    return not text or bool(PEER_LOST.search(text))


def find_root_cause(output: str, log_dir: Path, tails: ThrottledPrinter,
                    recovered: bool = False) -> RankFailure | None:
    """The first rank that failed, with its exit code, traceback and log tail.

    torchrun's summary names a "Root Cause", but it orders failures by the error files' timestamps,
    which have whole-second resolution: a rank that raises and a peer that fails on the broken
    connection within the same second tie, and the peer can be named. The error files' modification
    times (nanoseconds) give the true order, so the earliest error file wins, among the ranks that exited
    on their own if there are any (a rank torchrun SIGTERMed while it was already failing wrote its file
    but reports the signal); the summary decides only when its root cause left no error file (a rank
    killed by a signal). A rank whose error is a lost connection (``Connection closed by peer``, ...)
    is named only if no other rank has an error of its own: when every error file is such a loss, the rank that
    left none is the cause, whether a fatal signal killed it or it exited with a code of its own (``sys.exit(3)``,
    ``os._exit``; an exception in a script without ``@record``). Exit codes come from the summary.

    A rank that exited with a code and no error file gets the last traceback it printed (``last_traceback``), if any.

    ``recovered``: the run restarted and finished (``max_restarts``), so torchrun printed no summary: the
    attempt that failed is the last one with error files, exit codes come from the agent's ``failed
    (exitcode: N) local_rank: R`` lines (one node: rank = local rank).
    """
    exit_codes = {int(m["local_rank"]): (int(m["rank"]), int(m["exitcode"])) for m in FAILURE_ENTRY.finditer(output)}
    if recovered and not exit_codes:
        exit_codes = {int(m["local_rank"]): (int(m["local_rank"]), int(m["exitcode"]))
                      for m in AGENT_FAILED.finditer(output)}
    roots = list(ROOT_CAUSE.finditer(output))
    root_local_rank = int(roots[-1]["local_rank"]) if roots else None  # the last attempt's summary
    error_files = last_attempt_error_files(log_dir, failed_attempt=recovered)
    # A rank killed by a fatal signal (SIGKILL from the OOM killer or a user, SIGSEGV, SIGABRT, ...; not the
    # SIGTERM torchrun sends to stop the others) writes no error file, nor does one that exits with a code
    # (@record lets SystemExit through); its peers then fail on the lost connection and do write one. If every
    # error file is such a lost connection, the rank that left none is the cause (a killed one first).
    killed = sorted((r for r, (_, code) in exit_codes.items()
                     if r not in error_files and (code in FATAL_SIGNAL_EXIT_CODES or code > 0)),
                    key=lambda r: exit_codes[r][1] > 0)
    # An empty error file counts as a lost connection: that rank was stopped (torchrun's SIGTERM, after a peer died)
    # while @record wrote it; torchrun itself then crashes reading it (JSONDecodeError) and prints no summary.
    all_lost = all(_no_error_of_its_own(f) for f in error_files.values())
    if not killed and error_files and all_lost:
        # torchrun reports only the failures it saw first (one line when it restarts the group): a rank that left
        # neither an error file nor an exit code while every error file is a lost connection is the one that died.
        attempt_dir = next(iter(error_files.values())).parent.parent
        killed = sorted(int(p.name) for p in attempt_dir.iterdir()
                        if p.name.isdigit() and int(p.name) not in error_files and int(p.name) not in exit_codes)
    if killed and (error_files or root_local_rank is None) and all_lost:
        root_local_rank, error_files = killed[0], {}
    if error_files and (root_local_rank is None or root_local_rank in error_files):
        exited = [r for r in error_files if exit_codes.get(r, (r, 1))[1] > 0] or list(error_files)
        # A rank that failed on its own beats one that failed because that rank's exit broke the
        # connection: the latter can write its file first (e.g. while the other runs its cleanup).
        own = [r for r in exited if not _no_error_of_its_own(error_files[r])] or exited
        # Among those, ranks whose exit code torchrun reported come first: one it SIGTERMed while it was
        # failing (both ranks' collectives timed out in the same millisecond) has none.
        own = [r for r in own if r in exit_codes] or own
        local_rank = min(own, key=lambda r: error_files[r].stat().st_mtime_ns)
    elif root_local_rank is not None:
        local_rank = root_local_rank
    else:
        return None
    rank, exit_code = exit_codes.get(local_rank, (local_rank, None))
    traceback = read_error_file(error_files[local_rank]) if local_rank in error_files else ""
    if not traceback and (exit_code or 0) > 0:
        # It exited on its own without an error file, and may have printed its traceback: an exception @record
        # does not catch (DCP's CheckpointException is a BaseException), or a script without @record.
        traceback = last_traceback(text for r, text in rank_lines(output) if r == rank)
    return RankFailure(rank=rank, exit_code=exit_code, traceback=traceback, log_tail=tails.tail(rank))


# --- small readers for the notebooks: what a finished run's logs say, one named question each -----------------

def rank_errors(run_dir: str | os.PathLike, attempt: int | None = None) -> dict[int, str]:
    """``{local_rank: traceback}`` from the error files the ranks' ``@record`` wrote in one torchrun attempt.

    Args:
        run_dir: a one-node run directory (torchrun's logs in ``<run_dir>/logs``).
        attempt: the attempt (0 = the first start, 1 = the first restart, ...); ``None``: the last one.

    Returns:
        The traceback (or message) of each rank that wrote an error file; a rank killed by a signal, or stopped
        by torchrun with SIGTERM, writes none. Empty when no rank wrote one.
    """
    log_dir = Path(run_dir) / "logs"
    if attempt is None:
        files = last_attempt_error_files(log_dir)
    else:
        files = {int(p.parent.name): p for p in log_dir.glob(f"*/attempt_{int(attempt)}/*/error.json")
                 if p.parent.name.isdigit()}
    return {local_rank: read_error_file(path) for local_rank, path in sorted(files.items())}


def lost_connection(error: str) -> bool:
    """Whether a rank's error is only the loss of its peer (``Connection reset by peer``, ``Connection closed by
    peer``, ...): the rank failed because another one died, not on its own."""
    return bool(PEER_LOST.search(error))


def agent_failures(run_dir: str | os.PathLike) -> list[tuple[int, int]]:
    """``[(local_rank, exit_code), ...]`` from torchrun's agent lines ``failed (exitcode: N) local_rank: R`` in
    ``<run_dir>/output.log``, in order: one per failed worker per attempt, also when torchrun then restarted the
    group. A negative exit code is the signal that killed the worker (-9: SIGKILL)."""
    text = (Path(run_dir) / "output.log").read_text()
    return [(int(m["local_rank"]), int(m["exitcode"])) for m in AGENT_FAILED.finditer(text)]


class FatalError(NamedTuple):
    """A ``Fatal Python error`` a rank printed (faulthandler, on SIGABRT, SIGSEGV, ...) and where it was."""

    rank: int | None
    error: str  # "Aborted", "Segmentation fault", ...
    function: str  # the innermost Python function on the stack ("" if none was printed)


_FRAME = re.compile(r'^\s*File ".*", line \d+ in (?P<function>\S+)')


def fatal_errors(run_dir: str | os.PathLike) -> list[FatalError]:
    """Every ``Fatal Python error: ...`` in ``<run_dir>/output.log``, with its rank and the innermost Python
    function of the stack printed after it (faulthandler prints the most recent call first)."""
    found: list[FatalError] = []
    pending: dict[int | None, int] = {}  # rank -> index in found still waiting for its first frame
    for rank, text in rank_lines((Path(run_dir) / "output.log").read_text()):
        if text.startswith("Fatal Python error: "):
            pending[rank] = len(found)
            found.append(FatalError(rank, text.removeprefix("Fatal Python error: ").strip(), ""))
        elif rank in pending and (frame := _FRAME.match(text)):
            index = pending.pop(rank)
            found[index] = found[index]._replace(function=frame["function"])
    return found


# TORCH_DISTRIBUTED_DEBUG=DETAIL's error: "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=9,
# OpType=ALLREDUCE, TensorShape=[64, 64], ..." (what it decodes of the peer's call can be garbled: not read here).
_FINGERPRINT = re.compile(r"Rank (?P<rank>\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, "
                          r"OpType=(?P<op>\w+), TensorShape=\[(?P<shape>[\d, ]*)\]")


def collective_fingerprints(run_dir: str | os.PathLike) -> list[tuple[int, str, tuple[int, ...]]]:
    """``[(rank, op, shape), ...]``, sorted and without repeats: the collective each rank reported running when
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` found a mismatch (``<run_dir>/output.log``); a scalar's shape is ``()``."""
    text = (Path(run_dir) / "output.log").read_text()
    return sorted({(int(m["rank"]), m["op"], tuple(int(n) for n in m["shape"].split(",") if n.strip()))
                   for m in _FINGERPRINT.finditer(text)})


def count_log_matches(run_dir: str | os.PathLike, patterns: Mapping[str, str]) -> dict[str, int]:
    """``{name: number of matches}`` of each regular expression in ``patterns`` over ``<run_dir>/output.log``
    (every line the ranks and torchrun printed, also those the cell did not show)."""
    text = (Path(run_dir) / "output.log").read_text()
    return {name: len(re.findall(pattern, text)) for name, pattern in patterns.items()}
