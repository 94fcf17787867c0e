"""What torchrun leaves behind, read in one place for the launcher and the doctor.

torchrun (``torch.distributed.run``) reports a failed job three ways: its failure summary at the end of its
output ("Root Cause (first observed failure)" and one entry per failed rank with its exit code), the agent's
log line for every worker that failed ("failed (exitcode: -9) local_rank: 1 ..."), also when it restarts the
group, and the error file each rank's ``@record`` writes (``<log_dir>/<run>/attempt_<N>/<local_rank>/error.json``).
See https://pytorch.org/docs/stable/elastic/errors.html.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

from .errors import RankFailure, last_traceback
from .output import ThrottledPrinter, rank_lines

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
    all_lost = all(PEER_LOST.search(read_error_file(f)) for f in error_files.values())
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
        own = [r for r in exited if not PEER_LOST.search(read_error_file(error_files[r]))] or exited
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
