"""Which rank failed first, and how every rank of the failed attempt ended: one rule, for the launcher and the doctor,
on one node, on simulated nodes and on a SLURM job's nodes.

What a failed job leaves, read here:

* torchrun's failure summary at the end of each agent's output ("Root Cause (first observed failure)", then one
  entry per failed rank: ``rank : R (local_rank: L)``, ``exitcode``, ``error_file``) and its agent's line for every
  worker that failed (``failed (exitcode: -9) local_rank: 1``, also when it then restarts the group). torchrun
  reports only the failures it saw at its first look: a rank that died a moment later, or that exited 0, is not in
  them, and it orders them by timestamps of whole seconds;
* each rank's folder of the failed attempt (``attempts.py``): the error file ``@record`` writes, the rank's own
  ``stderr.log`` (its traceback when it wrote no error file, faulthandler's report of a fatal signal, the stack it
  printed when torchrun stopped it, torch's ``[rankR]:`` labels) and the rank runner's exit record.
  See https://pytorch.org/docs/stable/elastic/errors.html.

``find_root_cause`` sorts every rank into how it ended (``RankEnd.how``) and names the first that failed on its own
(raised, was killed by a fatal signal, exited with a code), whatever order its peers noticed it in; only when none
did, a rank that left no trace or finished while the others waited for it; only then one that lost its peer. Global
ranks come from the labels the ranks and torchrun leave (the exit record, ``[rankR]:``, the summaries' entries and
their error-file paths), never from folder numbers: c10d hands out node ranks by arrival order.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .attempts import Attempt, failed_attempt, read_error_file, read_exit_record, read_log_tail, read_rank_record
from .stacks import STACK_HEADER, fatal_report, fatal_signal, last_traceback, readable_tail
from .output_lines import attempt_lines, label_line, rank_lines, torchrun_output
from .tee import RankTails

# How a rank of the failed attempt ended (``RankEnd.how``). The first three are failures of the rank's own.
RAISED = "raised"  # an exception of its own (its error file, or the traceback in its log)
SIGNAL = "killed by a signal"  # a fatal signal (SIGSEGV, SIGKILL, SIGABRT, ...): exit code -N or faulthandler's report
EXITED = "exited"  # an exit code > 0 and no traceback (sys.exit(3), os._exit(3))
FINISHED = "finished"  # exit code 0: its script returned while the others were still at work
NO_TRACE = "no trace"  # neither an error, an exit code nor a stack: torchrun saw the others fail first
LOST_PEER = "lost its peer"  # its error is only the lost connection to a rank that was gone
STOPPED = "stopped"  # torchrun's SIGTERM after another rank failed
OWN_FAILURES = (RAISED, SIGNAL, EXITED)


@dataclass
class RankEnd:
    """How one rank of the failed attempt ended.

    Attributes:
        rank: global rank (``None``: no label said it).
        local_rank: its rank on its node (its folder under the attempt).
        node: the node's key in the log folders given (``None`` on one node).
        how: ``RAISED``, ``SIGNAL``, ``EXITED``, ``FINISHED``, ``NO_TRACE``, ``LOST_PEER`` or ``STOPPED``.
        exit_code: as torchrun reported it (negative: killed by that signal), else as the rank runner recorded it or
            faulthandler's report implies; ``None`` when nothing says.
        traceback: its Python traceback (error file, else its log), ``""`` if none.
        fatal_error: faulthandler's report of a fatal signal (``Fatal Python error: Segmentation fault`` and the
            stack, the workbook's runner frames left out), ``""`` if none.
        time_ns: when it ended, nanoseconds (its error file's, its log's or its exit record's time), ``None`` if unknown.
    """

    rank: int | None
    local_rank: int
    node: int | None
    how: str
    exit_code: int | None = None
    traceback: str = ""
    fatal_error: str = ""
    time_ns: int | None = None

    @property
    def signal(self) -> str | None:
        """``"SIGSEGV"`` for exit code -11; ``None`` for other exit codes."""
        return signal_name(self.exit_code)


@dataclass
class RankFailure:
    """The rank that failed first, and how every rank of the failed attempt ended.

    Attributes:
        rank: global rank of the failed worker (``RANK``), or ``None`` when it is unknown.
        exit_code: the worker's exit code as torchrun reported it (negative: killed by that signal),
            or ``None`` when unknown.
        traceback: the root-cause Python traceback from torchrun's error file (written by ``@record``) or from the
            rank's own log, or ``""`` when the worker left none (e.g. it was killed by a signal).
        log_tail: the last lines this rank printed (stdout and stderr).
        how: how it ended (``RankEnd.how``; ``""`` when not read from a run).
        fatal_error: faulthandler's report of the fatal signal that killed it (``RankEnd.fatal_error``), or ``""``.
        ends: how every rank of the failed attempt ended, by rank.
    """

    rank: int | None
    exit_code: int | None
    traceback: str = ""
    log_tail: list[str] = field(default_factory=list)
    how: str = ""
    fatal_error: str = ""
    ends: list[RankEnd] = field(default_factory=list)

    @property
    def signal(self) -> str | None:
        """The signal behind a negative exit code (``"SIGSEGV"``), else ``None``."""
        return signal_name(self.exit_code)

    @property
    def raised(self) -> list[int]:
        """Every rank that raised an exception of its own (not a lost connection), in rank order."""
        return sorted(e.rank for e in self.ends if e.how == RAISED and e.rank is not None)

    @property
    def signals(self) -> dict[int, str]:
        """``{rank: signal name}`` of every rank a fatal signal killed (``{1: "SIGSEGV"}``)."""
        return {e.rank: e.signal for e in sorted(self.ends, key=_by_rank)
                if e.how == SIGNAL and e.rank is not None and e.signal}

    @property
    def stopped(self) -> list[int]:
        """The ranks that failed for no reason of their own (stopped by torchrun, or left no trace): where they were
        when stopped says where a hang's culprit was."""
        return sorted(e.rank for e in self.ends if e.how in (STOPPED, NO_TRACE) and e.rank is not None)

    @property
    def finished(self) -> list[int]:
        """Every rank whose script returned (exit code 0) in the failed attempt."""
        return sorted(e.rank for e in self.ends if e.how == FINISHED and e.rank is not None)


def _by_rank(end: RankEnd) -> tuple[bool, int, int]:
    return end.rank is None, end.rank if end.rank is not None else 0, end.local_rank


# One failed rank's entry in torchrun's summary: "rank : 1 (local_rank: 1) ... exitcode : -9 (pid: 7) ...
# error_file: /run/logs/none_x/attempt_0/1/error.json" (or "<N/A>").
FAILURE_ENTRY = re.compile(r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local_rank>\d+)\)"
                           r"\s*exitcode\s*:\s*(?P<exitcode>-?\d+)"
                           r"(?:[^\n]*\n\s*error_file\s*:\s*(?P<error_file>\S+))?")
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?" + FAILURE_ENTRY.pattern, re.S)


# The agent's own line for every worker that failed, also when it then restarts the group (no summary follows):
# "failed (exitcode: -9) local_rank: 1 (pid: 5270) of binary: ..."
AGENT_FAILED = re.compile(r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+)")


def before_the_last_attempt(output: str) -> str:
    """What a run that finished after a restart printed before the attempt that finished (what the restarted attempt
    printed is not evidence of the failure): the ranks' lines of the earlier attempts (their labels say which,
    ``output_lines.attempt_lines``) and torchrun's own lines up to its last "failed (exitcode: ...)"; in the older
    ``--tee`` format, where nothing says the attempt, the output up to that line. ``output`` itself when torchrun
    reported no failure."""
    agent_failures = list(AGENT_FAILED.finditer(output))
    if not agent_failures:
        return output
    cut = output.find("\n", agent_failures[-1].end()) + 1 or len(output)
    lines = attempt_lines(output)
    last = max((attempt for rank, attempt, _ in lines if attempt is not None), default=None)
    if last is None:  # the older format
        return output[:cut]
    kept = [label_line(rank, text) for rank, _, text in attempt_lines(output[:cut]) if rank is None]
    # (a restarted attempt that printed nothing leaves every rank line in attempt 0: all of them are evidence)
    kept += [label_line(rank, text) for rank, attempt, text in lines
             if rank is not None and (attempt < last or not last)]
    return "\n".join(kept) + "\n"


# Signals that end a rank by themselves (their default action kills the process), unlike the SIGTERM torchrun sends
# to stop the others: the OOM killer's or a user's SIGKILL, native crashes (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP),
# aborts (SIGABRT), a forbidden system call (SIGSYS), resource limits (SIGXCPU, SIGXFSZ).
FATAL_SIGNAL_EXIT_CODES = {-int(s) for s in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS,
                                              signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS,
                                              signal.SIGXCPU, signal.SIGXFSZ)}
PEER_LOST = re.compile(r"Connection reset by peer|Connection closed by peer|Broken pipe|Connection refused|"
                        r"connectFullMesh|Socket closed|peer closed", re.I)
_TORCH_LABEL = re.compile(r"^\[rank(?P<rank>\d+)\]: ?")  # torch.distributed's excepthook labels traceback lines


def signal_name(exit_code: int | None) -> str | None:
    """``"SIGKILL"`` for exit code -9 (torchrun reports a worker killed by signal N as -N); else ``None``."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


@dataclass(frozen=True)
class _Entry:
    """One failed rank in a torchrun summary."""

    rank: int
    local_rank: int
    exit_code: int
    error_file: str


def _summary_entries(output: str) -> tuple[list[_Entry], int | None]:
    """Every summary entry of ``output`` (a later one for the same rank wins) and the last summary's root-cause rank."""
    entries = {int(m["rank"]): _Entry(int(m["rank"]), int(m["local_rank"]), int(m["exitcode"]), m["error_file"] or "")
               for m in FAILURE_ENTRY.finditer(output)}
    roots = list(ROOT_CAUSE.finditer(output))
    return list(entries.values()), int(roots[-1]["rank"]) if roots else None


def _rank_label(folder: Path, log: list[str], entries: list[_Entry]) -> int | None:
    """The global rank of a rank folder, from what the rank or torchrun labelled it with: the rank runner's records
    (written before the script ran, and as it left), torch's ``[rankR]:`` labels in its log, a summary entry naming
    its error file."""
    recorded = read_rank_record(folder, int(folder.name))
    if recorded is not None:
        return recorded
    record = read_exit_record(folder)
    if record and isinstance(record.get("rank"), int):
        return record["rank"]
    labels = [int(m["rank"]) for line in log if (m := _TORCH_LABEL.match(line))]
    if labels:
        return labels[-1]
    return next((e.rank for e in entries if e.error_file and Path(e.error_file).parent == folder), None)


def _rank_end(node: int | None, local_rank: int, rank: int | None, folder: Path | None, log: list[str],
              output_lines: list[str], entry: _Entry | None, agent_code: int | None) -> RankEnd:
    """How one rank ended: from its folder of the failed attempt (``None``: it has none), its log's last lines
    (``log``), what it printed in torchrun's output, its summary entry and its agent line."""
    error_file = folder / "error.json" if folder is not None else None
    has_error_file = error_file is not None and error_file.is_file()
    traceback = read_error_file(error_file) if has_error_file else ""
    record = read_exit_record(folder) if folder is not None else None
    fatal = fatal_report(log) or fatal_report(output_lines)
    exit_code = entry.exit_code if entry else agent_code
    if exit_code is None and record is not None:
        exit_code = record["exit_code"]
    if exit_code is None and fatal:
        exit_code = -fatal_signal(fatal)  # faulthandler re-raises the signal: the rank died of it
    if not has_error_file:  # no @record, or an exception it lets through: the traceback the rank printed
        traceback = last_traceback(log) or last_traceback(output_lines)
    log_path = folder / "stderr.log" if folder is not None else None
    if has_error_file:
        time_ns = error_file.stat().st_mtime_ns
    elif record is not None and isinstance(record.get("time_ns"), int):
        time_ns = record["time_ns"]
    elif (traceback or fatal) and log_path is not None and log_path.is_file():
        time_ns = log_path.stat().st_mtime_ns  # a dead rank writes no more: its log's last write is its end
    else:
        time_ns = None
    lost = bool(traceback) and PEER_LOST.search(traceback) is not None
    # gloo's own threads abort the process on a lost connection too ("terminate called ... what(): ... Connection
    # reset by peer", SIGABRT): that is losing the peer, not a crash of its own.
    lines = log or output_lines
    aborted_on_loss = exit_code == -signal.SIGABRT and any("what():" in t and PEER_LOST.search(t) for t in lines)
    stopped_dump = not fatal and any(STACK_HEADER.match(t) for t in lines)
    if exit_code == 0:
        how = FINISHED
    elif aborted_on_loss:
        how = LOST_PEER
    elif fatal or exit_code in FATAL_SIGNAL_EXIT_CODES:
        how = SIGNAL
    elif traceback:
        how = LOST_PEER if lost else RAISED
    elif has_error_file or exit_code == -signal.SIGTERM:
        how = STOPPED  # an empty error file: torchrun's SIGTERM came while @record wrote it
    elif exit_code is not None and exit_code > 0:
        how = EXITED
    elif stopped_dump:
        how = STOPPED
    else:
        how = NO_TRACE
    return RankEnd(rank, local_rank, node, how, exit_code, traceback, fatal, time_ns)


def _match_entries(entries: list[_Entry], labels: dict[tuple, int | None], folders: dict[tuple, Path],
                   logs: dict[tuple, list[str]]) -> None:
    """Label the folders of the summary entries that name no error file (``rank : 3 (local_rank: 1)``, ``<N/A>``):
    the one unlabelled folder of that local rank, or else the one of them that shows a failure (an error file, a
    traceback, faulthandler's report)."""
    for entry in entries:
        if entry.rank in labels.values():
            continue
        same = [key for key in labels if key[1] == entry.local_rank and labels[key] is None]
        failed = [key for key in same if (folders[key] / "error.json").is_file() or last_traceback(logs[key])
                  or fatal_report(logs[key])]
        for candidates in (same, failed):
            if len(candidates) == 1:
                labels[candidates[0]] = entry.rank
                break


def _assign_global_ranks(labels: dict[tuple, int | None], node_sizes: Mapping[int | None, int]) -> None:
    """Fill in the global rank of the ``(node, local_rank)`` folders no label named, from the other ranks of their
    node: torchrun numbers a node's ranks consecutively (``base + local_rank``), and the nodes' bases are ``0, n, 2n,
    ...`` for ``n`` ranks per node. A node with no labelled rank gets the one base left, if exactly one is; else its
    ranks stay unknown (``None``)."""
    bases = {node: rank - local_rank for (node, local_rank), rank in labels.items() if rank is not None}
    sizes = set(node_sizes.values())
    unknown = [node for node in node_sizes if node not in bases]
    if len(sizes) == 1 and len(unknown) == 1:
        size = sizes.pop()
        free = sorted({k * size for k in range(len(node_sizes))} - set(bases.values()))
        if len(free) == 1:
            bases[unknown[0]] = free[0]
    for (node, local_rank), rank in labels.items():
        if rank is None and node in bases:
            labels[node, local_rank] = bases[node] + local_rank


def _first(ends: list[RankEnd], root_rank: int | None) -> RankEnd | None:
    """The rank that failed first (see ``find_root_cause``)."""
    def order(e: RankEnd) -> tuple:
        reported = e.exit_code is not None and e.exit_code != -signal.SIGTERM
        return (not reported, e.time_ns is None, e.time_ns or 0, e.rank != root_rank, *_by_rank(e))

    for group in (OWN_FAILURES, (NO_TRACE,), (FINISHED,), (LOST_PEER,), (STOPPED,)):
        found = [e for e in ends if e.how in group]
        if found and (group[0] != FINISHED or len(found) < len(ends)):
            return min(found, key=order)
    return None


def rank_ends(output: str, log_dirs: Mapping[int | None, Path], *, recovered: bool = False) -> list[RankEnd]:
    """How every rank of the failed attempt ended, read from torchrun's ``output`` and each node's log folder.

    Args:
        output: the job's output, every node's (``output.log``: torchrun's summaries and agent lines, the ranks'
            labelled lines; ``output_lines`` reads both its formats).
        log_dirs: ``{node: torchrun --log-dir}``; one node: ``{None: log_dir}``.
        recovered: the run finished after torchrun restarted the group: the attempt before the last failed.

    A rank in a summary without a folder (torchrun failed before it wrote one) is read from the summary and the
    output alone.
    """
    said = torchrun_output(output)  # its summaries and agent lines: no rank's line can pass for one of them
    entries, _ = _summary_entries(said)
    one_node = len(log_dirs) <= 1
    agent_codes = {int(m["local_rank"]): int(m["exitcode"]) for m in AGENT_FAILED.finditer(said)} if one_node else {}
    printed: dict[int | None, list[str]] = {}
    for rank, text in rank_lines(output):
        printed.setdefault(rank, []).append(_TORCH_LABEL.sub("", text))
    folders, logs, labels, sizes = {}, {}, {}, {}
    for node, log_dir in log_dirs.items():
        attempt: Attempt | None = failed_attempt(log_dir, recovered=recovered)
        if attempt is None:
            continue
        rank_dirs = attempt.rank_dirs()
        sizes[node] = len(rank_dirs)
        for local_rank, folder in rank_dirs.items():
            log = read_log_tail(folder / "stderr.log")
            folders[node, local_rank] = folder
            labels[node, local_rank] = local_rank if one_node else _rank_label(folder, log, entries)
            logs[node, local_rank] = [_TORCH_LABEL.sub("", line) for line in log]
    _match_entries(entries, labels, folders, logs)
    _assign_global_ranks(labels, sizes)
    ends = []
    for (node, local_rank), rank in labels.items():
        folder = folders[node, local_rank]
        entry = next((e for e in entries if e.error_file and Path(e.error_file).parent == folder), None) or \
            next((e for e in entries if rank is not None and e.rank == rank), None)
        ends.append(_rank_end(node, local_rank, rank, folder, logs[node, local_rank], printed.get(rank, []), entry,
                              agent_codes.get(local_rank) if one_node else None))
    for entry in entries:
        if entry.rank not in labels.values():
            ends.append(_rank_end(None, entry.local_rank, entry.rank, None, [], printed.get(entry.rank, []), entry,
                                  None))
    return sorted(ends, key=_by_rank)


def find_root_cause(output: str, log_dirs: Path | Mapping[int | None, Path], tails: RankTails | None = None, *,
                    recovered: bool = False) -> RankFailure | None:
    """The rank that failed first, with its exit code, traceback and log tail, and how every rank ended: the launcher's
    ``LaunchError`` and the doctor's ``Diagnosis`` both come from here.

    The first rank that failed on its own (raised, was killed by a fatal signal, exited with a code) is named, not a
    peer that failed on the broken connection, however torchrun ordered them (its summary orders by whole seconds and
    lists only the failures it saw first). Among several, a rank whose exit code torchrun reported comes before one it
    did not (a rank it stopped with SIGTERM while that rank was failing too), then the earliest (error files and logs
    have nanosecond times). When no rank failed on its own: a rank that left no trace at all (killed by SIGKILL before
    torchrun looked), then one that finished while the others waited for it (the exit record says exit code 0), then
    the first that lost its peer, then one torchrun stopped. Without any rank folder (torchrun itself failed),
    the summary's root cause, else ``None``.

    Args:
        output: the job's output, one node's or every node's (``output.log``, either format: ``output_lines``).
        log_dirs: torchrun's ``--log-dir`` (one node), or ``{node: log dir}`` (simulated nodes' ``logs/node<N>``,
            a SLURM job's nodes).
        tails: every rank's last lines, by global rank (the launcher's printer keeps them; the doctor reads them from
            ``output.log``); ``None``: no tails.
        recovered: the run finished after torchrun restarted the group (``max_restarts``): the attempt before the last
            failed, and no summary was printed (exit codes come from the agent's ``failed (exitcode: N)`` lines).
    """
    log_dirs = {None: Path(log_dirs)} if isinstance(log_dirs, (str, Path)) else dict(log_dirs)
    ends = rank_ends(output, log_dirs, recovered=recovered)
    _, root_rank = _summary_entries(torchrun_output(output))
    first = _first(ends, root_rank)
    if first is None:
        return None
    return RankFailure(rank=first.rank, exit_code=first.exit_code, traceback=first.traceback,
                       log_tail=readable_tail((tails or RankTails()).tail(first.rank, 1000))[-20:], how=first.how, fatal_error=first.fatal_error,
                       ends=ends)
