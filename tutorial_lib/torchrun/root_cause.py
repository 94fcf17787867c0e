"""Which rank failed first, and how: read from torchrun's failure summary, its agents' lines and its error files.

torchrun (``torch.distributed.run``) reports a failed job three ways: its failure summary at the end of its
output ("Root Cause (first observed failure)" and one entry per failed rank with its exit code), the agent's
log line for every worker that failed ("failed (exitcode: -9) local_rank: 1 ..."), also when it restarts the
group, and the error file each rank's ``@record`` writes (``attempts.py``).
See https://pytorch.org/docs/stable/elastic/errors.html.

One node: ``find_root_cause``, for the launcher and the doctor alike. Several (simulated) nodes: two rules stand
here side by side, the launcher's (``first_failure_of_nodes``: each node's ``find_root_cause``, then the earliest
error file among them) and the doctor's (``root_cause_from_logs``: the earliest error file over every node's last
attempt, else the summary's root cause). They agree on every fixture run; making them one is a change of this file.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .attempts import last_attempt, read_error_file
from .stacks import last_traceback
from .tee import RankTails, rank_lines


@dataclass
class RankFailure:
    """What one failed rank left behind.

    Attributes:
        rank: global rank of the failed worker (``RANK``), or ``None`` when it is unknown.
        exit_code: the worker's exit code as torchrun reported it (negative: killed by that signal),
            or ``None`` when unknown.
        traceback: the root-cause Python traceback from torchrun's error file (written by ``@record``),
            or ``""`` when the worker left none (e.g. it was killed by a signal).
        log_tail: the last lines this rank printed (stdout and stderr).
    """

    rank: int | None
    exit_code: int | None
    traceback: str = ""
    log_tail: list[str] = field(default_factory=list)


# One failed rank's entry in torchrun's summary: "rank : 1 (local_rank: 1) ... exitcode : -9".
FAILURE_ENTRY = re.compile(r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local_rank>\d+)\)"
                           r"\s*exitcode\s*:\s*(?P<exitcode>-?\d+)")
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?" + FAILURE_ENTRY.pattern, re.S)


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


def find_root_cause(output: str, log_dir: Path, tails: RankTails, recovered: bool = False) -> RankFailure | None:
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

    ``tails``: every rank's last lines (the launcher's printer keeps them as it shows the output; the doctor reads them
    from ``output.log``).

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
    attempt = last_attempt(log_dir, with_error_files=recovered)
    error_files = attempt.error_files() if attempt is not None else {}
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
        killed = sorted(r for r in attempt.rank_dirs() if r not in error_files and r not in exit_codes)
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


def first_failure_of_nodes(failures: Sequence[tuple[int, RankFailure]], node_log_dirs: Mapping[int, Path],
                           nproc_per_node: int) -> RankFailure | None:
    """The launcher's rule across simulated nodes: of each failed node's root cause (``find_root_cause``), the one
    whose rank wrote the earliest error file; one without a traceback (a rank killed by a signal, or an agent whose
    rendezvous failed) comes last. ``None`` when no node named a rank.

    Args:
        failures: ``(node, failure)`` of each node that named one.
        node_log_dirs: each node's torchrun ``--log-dir``.
        nproc_per_node: ranks per node (a global rank's local rank is ``rank % nproc_per_node``).
    """
    def first_failed(item: tuple[int, RankFailure]) -> tuple[bool, int]:
        node, failure = item
        attempt = last_attempt(node_log_dirs[node])
        error_file = attempt.error_files().get((failure.rank or 0) % nproc_per_node) if attempt else None
        return not failure.traceback, error_file.stat().st_mtime_ns if error_file else 2**63

    return min(failures, key=first_failed, default=(None, None))[1]


def root_cause_from_logs(output: str, log_dir: Path, node_log_dirs: Mapping[int, Path], tails: RankTails,
                         recovered: bool = False) -> RankFailure | None:
    """The doctor's rule: ``find_root_cause`` on one node; across simulated nodes (``node_log_dirs``), the earliest
    error file of every node's last attempt (ranks that exited on their own first), else the summary's root cause.

    On several nodes ``output.log`` interleaves the agents' summaries, which name global ranks; node ``N``'s first
    global rank is ``N * nproc_per_node``, its rank count that of its last attempt's rank folders.
    """
    if not node_log_dirs:
        return find_root_cause(output, log_dir, tails, recovered=recovered)
    exit_codes = {int(m["rank"]): int(m["exitcode"]) for m in FAILURE_ENTRY.finditer(output)}
    errors = []  # (exited on its own, mtime, global rank, path)
    for node, node_dir in sorted(node_log_dirs.items()):
        attempt = last_attempt(node_dir)
        if attempt is None:
            continue
        nproc = len(attempt.rank_dirs())
        for local_rank, path in attempt.error_files().items():
            rank = node * nproc + local_rank
            errors.append((exit_codes.get(rank, 1) <= 0, path.stat().st_mtime_ns, rank, path))
    if errors:
        _, _, rank, path = min(errors)
        traceback = read_error_file(path)
    else:
        roots = list(ROOT_CAUSE.finditer(output))
        if not roots:
            return None
        rank, traceback = int(roots[0]["rank"]), ""
    return RankFailure(rank=rank, exit_code=exit_codes.get(rank), traceback=traceback, log_tail=tails.tail(rank))


RENDEZVOUS_TIMEOUT, PORT_IN_USE = "rendezvous timeout", "port in use"


def agent_failure_kind(output: str) -> str | None:
    """What failed in torchrun itself (no rank to blame), from its output: ``RENDEZVOUS_TIMEOUT`` (an agent waited
    for nodes that never came), ``PORT_IN_USE`` (EADDRINUSE on the rendezvous port), or ``None``."""
    if "RendezvousTimeoutError" in output or "waiting for clients" in output:
        return RENDEZVOUS_TIMEOUT
    if "EADDRINUSE" in output or "address already in use" in output.lower():
        return PORT_IN_USE
    return None
