"""The doctor: say in a few lines what went wrong in a failed run, and what to do about it.

``diagnose(run_dir)`` (or ``diagnose(error)`` with the ``LaunchError`` a launch raised) reads what a run
left behind: torchrun's failure summary and the per-rank ``error.json`` files ``@record`` wrote (through the
launcher's own ``find_root_cause``), ``output.log`` (every rank's stdout and stderr), and the per-rank
metrics. It names the rank that failed first, its exit code (and the signal behind a negative one), the last
lines of its traceback, the last step every rank logged, and a suspected cause found by matching the known
messages of gloo, NCCL, torchrun, the allocators and DDP, each with a one-line fix and the notebook that
shows it.

The patterns are the messages these libraries print on torch 2.8 and 2.13 (both run in CI, each failure of
notebooks 02, 05, 06 and 07 is a test on each version); where a version drops a message the doctor also reads
what both leave (for a skipped collective on gloo: the abort, the stack in the collective, the enforce line).
A message torch changes makes the doctor fall back to "Python exception" or "killed by signal", never to a
wrong specific cause on purpose.
"""

from __future__ import annotations

import html
import os
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import (ConfigError, LaunchError, LaunchTimeout, MetricsError, RankFailure, innermost_frame,
                     last_meaningful_line, stopped_ranks_stacks)
from .metrics import read_metrics
from .output import NoiseFilter, ThrottledPrinter, rank_lines
from .run_record import RunRecord, RunStatus
from .torchrun_logs import AGENT_FAILED, FAILURE_ENTRY, ROOT_CAUSE, find_root_cause, read_error_file


@dataclass(frozen=True)
class Cause:
    """A known failure: its short name, the pattern of its messages, the fix, and where it is taught.

    ``describe``, if set, turns the matching line into the evidence shown (else the line itself is).
    """

    name: str
    pattern: re.Pattern
    fix: str
    describe: Callable[[str], str] | None = None


# A checkpoint loaded into a model of another shape: DCP's planner (dcp.load), set_state_dict's strict check, and
# nn.Module.load_state_dict (a full checkpoint), as torch 2.8 and 2.13 word them.
_SIZE_MISMATCH = (re.compile(r"Size mismatch between saved (?P<saved>torch\.Size\(\[[^\]]*\]\)) and current: "
                             r"(?P<current>torch\.Size\(\[[^\]]*\]\)) for (?P<key>[\w.]*\w)"),
                  re.compile(r"size mismatch for (?P<key>[\w.]*\w): copying a param with shape (?P<saved>torch\.Size\("
                             r"\[[^\]]*\]\)) from checkpoint, the shape in current model is (?P<current>torch\.Size\("
                             r"\[[^\]]*\]\))"))
_MISSING_KEY = re.compile(r"Missing key in checkpoint state_dict: (?P<key>[\w.]*\w)|Missing key: (?P<key2>[\w.]*\w)|"
                          r"Missing key\(s\) in state_dict: (?P<keys>.*?)\.?\s*$")
_UNEXPECTED_KEY = re.compile(r"Unexpected key\(s\) in state_dict: (?P<keys>.*?)\.?\s*$")


def describe_checkpoint_mismatch(line: str) -> str:
    """``"model.net.6.weight: saved [4, 128], this model [128, 128]"`` from a size mismatch message (or the key a
    missing/unexpected-key message names); the line itself when it is neither.

    Args:
        line: a line that ``CAUSES``' "checkpoint does not match the model" pattern matched.
    """
    for pattern in _SIZE_MISMATCH:
        m = pattern.search(line)
        if m:
            saved, current = (m[name].removeprefix("torch.Size(").removesuffix(")") for name in ("saved", "current"))
            return f"{m['key']}: saved {saved}, this model {current}"
    m = _MISSING_KEY.search(line)
    if m:
        return f"{m['key'] or m['key2'] or m['keys']}: in this model, not in the checkpoint"
    m = _UNEXPECTED_KEY.search(line)
    if m:
        return f"{m['keys']}: in the checkpoint, not in this model"
    return line


# In priority order: the first cause whose pattern occurs in any rank's traceback or output wins. Specific
# causes come first; the consequences they trigger on the peers ("Connection reset by peer", a timeout
# while a peer is already dead) come later or not at all.
CAUSES = (
    Cause("port in use", re.compile(r"EADDRINUSE|address already in use", re.I),
          "another process holds master_port: leave master_port=None (the launcher picks a free port) or choose "
          "another one (06, section 5 'A port that is already taken')"),
    Cause("rendezvous timeout", re.compile(r"RendezvousTimeoutError|waiting for clients|RendezvousClosedError"),
          "not every node joined in time: start every node's torchrun with the same --nnodes and rendezvous "
          "endpoint, and check that the port is reachable (06, section 4 'A node that never arrives')"),
    Cause("out of memory", re.compile(r"CUDA out of memory|OutOfMemoryError|can't allocate memory|"
                                      r"DefaultCPUAllocator|std::bad_alloc|Cannot allocate memory"),
          "the allocation does not fit: a smaller batch per rank with gradient accumulation (02, section 3), "
          "activation checkpointing or FSDP sharding (04, the OOM ladder) (07, section 4 'Out of memory')"),
    Cause("checkpoint does not match the model",
          re.compile(r"Size mismatch between saved .* for |size mismatch for \S+: copying a param with shape|"
                     r"Missing key in checkpoint state_dict: |Missing key: |Missing key\(s\) in state_dict|"
                     r"Unexpected key\(s\) in state_dict"),
          "the checkpoint was saved from a model of another shape: build the model with the arguments it was saved "
          "with (the same layer count and widths: the saving run's command.txt has them; checkpoint.json in the step "
          "folder records only the step, world size, format and strategy), or start without --resume "
          "(05, section 3 'Sharded checkpoints')", describe_checkpoint_mismatch),
    # gloo's size check: torch 2.13 prints "op.preamble.length <= op.nbytes. 84488 vs 4. Received data size
    # doesn't match expected size..."; torch 2.8's gloo stops after "84488 vs 4".
    Cause("collective mismatch", re.compile(r"mismatch between collectives|doesn't match expected size|"
                                            r"collective mismatch|op\.preamble\.length <= op\.nbytes", re.I),
          "the ranks called different collectives (one skipped or reordered a call): every rank must issue the "
          "same collectives in the same order; TORCH_DISTRIBUTED_DEBUG=DETAIL names each rank's call "
          "(07, section 1 'Hang')"),
    # A rank that finished its work and then died in the interpreter's teardown: a gloo thread aborts while the
    # process exits, even after destroy_process_group() (about 4-12% of CPU runs of a plain script).
    Cause("abort at interpreter exit", re.compile(r"terminate called without an active exception"),
          "the script had returned: gloo aborted the process during Python's teardown, not your code; the "
          "launcher's rank runner leaves with os._exit after flushing (tutorial_lib/rank_runner.py), do the same at "
          "the end of a script you run with plain torchrun (07, section 2 'A crashing rank')"),
    # dynamo's DDPOptimizer splits a compiled graph at DDP's bucket boundaries and insists that the first bucket is
    # no larger than the others; a small bucket_cap_mb breaks that (torch 2.8 and 2.13 alike).
    Cause("DDP + torch.compile bucket split", re.compile(r"First bucket should be smaller/equal to other buckets"),
          "torch.compile under DDP with a small bucket_cap_mb: dynamo's DDPOptimizer cannot split the graph at "
          "these buckets. Set torch._dynamo.config.optimize_ddp = False before compiling (train_lm.py "
          "--no-optimize-ddp: one graph, DDP's buckets still overlap backward) or use a larger bucket_cap_mb "
          "(11, section 9 'Notes')"),
    Cause("DDP unused parameters", re.compile(r"Expected to have finished reduction"),
          "a parameter got no gradient: use every module in the loss, or DDP(find_unused_parameters=True) "
          "(01, section 6 'A parameter without a gradient')"),
    Cause("collective timeout (hang)", re.compile(r"[Tt]imed out|[Ww]ait timeout|collective operation timeout|"
                                                  r"Socket Timeout"),
          "a rank waited in a collective that a peer never joined: compare the ranks' last steps and stacks to "
          "find the rank that is elsewhere; keep init_process_group(timeout=...) short so a hang becomes an "
          "error (07, section 1 'Hang'; uneven inputs: 02, section 4)"),
    Cause("NCCL error", re.compile(r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|"
                                   r"ncclInvalidUsage|ncclRemoteError|NCCL WARN"),
          "rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and check NCCL_SOCKET_IFNAME "
          "(07, section 3 'Debugging variables')"),
)

_EXCEPTION_FIX = ("rank {rank}'s traceback is the root cause: fix the code it points to; the other ranks failed "
                  "only because their peer was gone (07, section 2 'A crashing rank')")
_SIGNAL_FIXES = {
    "SIGKILL": "killed with SIGKILL: most likely the Linux OOM killer (compare the peak RSS with the machine's "
               "memory; dmesg says 'Out of memory: Killed process') or a manual kill (07, section 4 'Out of memory')",
    "SIGSEGV": "a crash in native code (C++/CUDA): the faulthandler stack in the rank's log shows the Python line "
               "that called it (07, section 1d: DDP under TORCH_DISTRIBUTED_DEBUG=DETAIL on gloo crashes so)",
    "SIGABRT": "a native abort: often gloo or NCCL aborting on a broken collective, or a C++ exception; read the "
               "rank's stderr in logs/ (07, section 1 'Hang')",
    "SIGTERM": "stopped from outside (torchrun stops the other ranks when one fails; the launcher on a timeout or "
               "interrupt): look for the rank that failed first",
    "SIGFPE": "no traceback: an arithmetic fault in native code, most often an integer division by zero in C/C++ (an "
              "extension, a custom op); Python and torch raise ZeroDivisionError or give inf/nan instead. The "
              "faulthandler stack in the rank's log names the Python line that called it (07, section 2 'A crashing "
              "rank')",
    "SIGBUS": "no traceback: a bad memory access in native code, typically a memory-mapped file (a dataset, a "
              "checkpoint) truncated or deleted while in use, or /dev/shm full (DataLoader workers pass tensors "
              "through it: df -h /dev/shm; in Docker raise --shm-size) (07, section 2 'A crashing rank')",
    "SIGILL": "no traceback: the CPU met an instruction it does not have: a binary (torch, numpy, an extension) "
              "built for a newer CPU (AVX-512, ...) than this machine's, or a corrupt install; reinstall the wheels "
              "for this machine (07, section 2 'A crashing rank')",
    "SIGTRAP": "no traceback: a native breakpoint or assertion trap (__builtin_trap) in C/C++ code, or a debugger "
               "attached to the rank; the faulthandler stack in the rank's log shows the Python line (07, section 2 "
               "'A crashing rank')",
    "SIGSYS": "no traceback: a system call the sandbox forbids (seccomp in a container); run with the container's "
              "default profile or allow the call (07, section 2 'A crashing rank')",
    "SIGXCPU": "no traceback: the rank used up its CPU-time limit (ulimit -t, or the batch scheduler's); raise the "
               "limit or ask for more time (07, section 2 'A crashing rank')",
    "SIGXFSZ": "no traceback: a write went past the file-size limit (ulimit -f), e.g. a checkpoint or log; raise the "
               "limit (07, section 2 'A crashing rank')",
    "SIGPIPE": "no traceback: the rank wrote to a pipe or socket whose reader was gone (output piped into a command "
               "that exited, such as head) (07, section 2 'A crashing rank')",
    "SIGINT": "interrupted (Ctrl-C in a terminal, a kernel interrupt in Jupyter): nothing failed by itself",
    "SIGHUP": "its terminal or session closed (an ssh session ended): start long runs under nohup, tmux or a "
              "batch scheduler",
}
_EXIT_FIX = ("rank {rank} ended itself with exit code {code} and left no traceback: sys.exit({code}), exit({code}) or "
             "os._exit({code}) in its script or in a library it calls ({meaning}); search the code for sys.exit, "
             "exit( and os._exit, and raise an exception there instead so @record keeps the traceback (07, section 2 "
             "'A crashing rank')")
# NCCL's watchdog on a timed-out collective ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(...)").
_NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|WorkNCCL\(.*\) ran for")
_P2P_HINT = ("; with several consumer GPUs in one machine (no NVLink, e.g. RTX 4090) a broken peer-to-peer path hangs "
             "NCCL's collectives the same way: rerun with env={\"NCCL_P2P_DISABLE\": \"1\"} (run_script / LaunchSpec "
             "env=); `python -m tutorial_lib env` lists the GPU pairs without peer access")
_NO_ERROR_FIX = ("the rank left no traceback and torchrun reported no exit code for it while its peers lost the "
                 "connection: most likely killed by a signal (SIGKILL from the OOM killer or kill -9); its last log "
                 "lines say what it was doing (07, section 4 'Out of memory')")
_HANG_FIX = ("no rank finished within its limit: the stacks show where each rank waits; the rank that is not in a "
             "collective is the culprit; set init_process_group(timeout=...) so a hang becomes an error "
             "(07, section 1 'Hang')")

# C++ log lines (TORCH_CPP_LOG_LEVEL=INFO: "[I1130 03:28:12.47 file.cpp:887] ..."), the fingerprints
# TORCH_DISTRIBUTED_DEBUG=DETAIL logs for every collective and gloo's connection report (torch 2.8) are noise
# for the doctor, not evidence.
_NOISE = re.compile(r"^(\[rank\d+\]:)?\[[IWV]\d{4} |Running collective: CollectiveFingerPrint|"
                    r"^\[Gloo\] Rank \d+ is connected to")
# A native abort inside a collective (or inside backward, where DDP's all-reduces run), thrown by gloo's own
# checks: a mismatched collective even where the message is gone (torch 2.8 prints no "doesn't match").
_COLLECTIVE_FRAME = re.compile(r"in (all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|all_to_all\w*|"
                               r"reduce|gather|scatter|_engine_run_backward|run_backward)$")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|[\w.]*(Error|Exception)):")


@dataclass
class Diagnosis:
    """What went wrong in a run, in a few lines (``str(d)``; a table in a notebook).

    Attributes:
        run_dir: the run directory.
        failed: whether the run failed (False for a run that finished).
        rank: global rank that failed first (``None``: no rank is to blame, e.g. torchrun itself failed).
        exit_code: that rank's exit code (negative: killed by signal ``-exit_code``), or ``None``.
        signal: the signal's name for a negative exit code (``"SIGKILL"``), else ``None``.
        error: the exception line of the root-cause traceback (``"RuntimeError: ..."``), or ``""``.
        traceback_tail: the last lines of the root-cause traceback (or of the rank's log).
        last_steps: ``{rank: last metrics step}`` (ranks that logged nothing are absent).
        where: ``{rank: "file:line in function"}`` from the stacks of a ``LaunchTimeout`` (else empty).
        cause: the suspected cause (one of ``CAUSES``' names, ``"Python exception"``, ``"killed by SIGKILL"``,
            ``"exited with code 3 without a traceback"`` (``sys.exit(3)``, ``os._exit(3)``),
            ``"died without a Python error"`` (no traceback, no exit code: its peers lost the connection),
            ``"hang (wall-clock timeout)"``, ``"hang (no progress)"`` (``stall_timeout_s``), ``"unknown"``,
            or ``"none"`` for a run that finished).
        evidence: the line that points to the cause.
        fix: one line on what to do, with the notebook section that shows it.
        timeout_s: the limit a ``LaunchTimeout`` exceeded, seconds (``None`` for other runs).
        limit: which one, ``"timeout_s"`` or ``"stall_timeout_s"`` (``""`` for other runs).
        recovered: the run finished (``failed`` is False) after torchrun restarted the group
            (``max_restarts``); the other fields then describe the failure it recovered from.
    """

    run_dir: Path
    failed: bool
    rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    error: str = ""
    traceback_tail: list[str] = field(default_factory=list)
    last_steps: dict[int, int] = field(default_factory=dict)
    where: dict[int, str] = field(default_factory=dict)
    cause: str = "unknown"
    evidence: str = ""
    fix: str = ""
    timeout_s: float | None = None
    limit: str = ""
    recovered: bool = False

    def rows(self) -> list[tuple[str, str]]:
        """The report as (label, text) rows."""
        if not self.failed and not self.recovered:
            steps = ", ".join(f"rank {r}: {s}" for r, s in sorted(self.last_steps.items())) or "none"
            return [("run", f"{self.run_dir.name} finished without error"), ("last step", steps)]
        who = f"rank {self.rank}" if self.rank is not None else "no rank (torchrun or the launch itself)"
        code = "" if self.exit_code is None else f", exit code {self.exit_code}"
        code += f" ({self.signal})" if self.signal else ""
        if self.recovered:
            rows = [("recovered", f"{self.run_dir.name} finished after torchrun restarted the group"),
                    ("failed", f"before the restart: {who} first{code}")]
        elif self.timeout_s is not None:
            which = "no-progress limit, stall_timeout_s" if self.limit == "stall_timeout_s" else "wall-clock limit"
            rows = [("failed", f"{self.run_dir.name}: stopped at the {which} ({self.timeout_s:g} s), "
                               "no rank had failed")]
        else:
            rows = [("failed", f"{self.run_dir.name}: {who} first{code}")]
        if self.error:
            rows.append(("error", _clip(self.error)))
        rows.append(("last step", ", ".join(f"rank {r}: {s}" for r, s in sorted(self.last_steps.items())) or
                     "no rank logged a step"))
        for r, w in sorted(self.where.items()):
            elsewhere = (self.cause == "collective timeout (hang)" and r != self.rank
                         and not _COLLECTIVE_FRAME.search(w) and "distributed" not in w)
            rows.append((f"rank {r} was in", w + (": never reached the collective the others waited in"
                                                  if elsewhere else "")))
        shown = self.evidence and self.evidence != self.error  # the error line is shown once, above
        rows.append(("suspected cause", self.cause + (f": {_clip(self.evidence)}" if shown else "")))
        rows.append(("fix", self.fix))
        return rows

    def __str__(self) -> str:
        rows = self.rows()
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label:<{width}}  {text}" for label, text in rows)

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython's text form: the rows, not a dataclass repr
        printer.text(str(self))

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
                       f"<td style='text-align:left'>{html.escape(text)}</td></tr>" for label, text in self.rows())
        return f"<table>{body}</table>"


def _clip(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def signal_name(exit_code: int | None) -> str | None:
    """``"SIGKILL"`` for exit code -9 (torchrun reports a worker killed by signal N as -N); else ``None``."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def exit_code_meaning(code: int) -> str:
    """What a positive exit code usually means when a process leaves no traceback, in a few words.

    Args:
        code: the exit code (1..255) torchrun reported for the rank.
    """
    if code == 1:
        return "1 is also what sys.exit('message') gives: the message is then the rank's last line"
    if code == 2:
        return "2 is argparse's code for bad command-line arguments: look for 'usage:' and 'error:' in its log"
    if code in (126, 127):
        return f"{code} is a shell's 'command {'not executable' if code == 126 else 'not found'}': a wrapper script"
    if 128 < code < 128 + 65:
        name = signal_name(128 - code)
        return f"{code} = 128 + {code - 128}: a shell's way of saying its child was killed by {name}"
    if code == 255:
        return "255 is sys.exit(-1) or os._exit(-1) (exit codes are taken modulo 256)"
    return f"no library here exits with {code} on its own: it is most likely the script's own number"


def _error_files(run_dir: Path) -> dict[int | None, str]:
    """Tracebacks of every error file under ``logs/`` (any attempt, any node), keyed by local rank."""
    found = {}
    for path in sorted((run_dir / "logs").rglob("attempt_*/*/error.json")):
        text = read_error_file(path)
        if text:
            found[int(path.parent.name) if path.parent.name.isdigit() else None] = text
    return found


def _exception_line(traceback: str) -> str:
    """The ``SomeError: message`` line of a traceback (the last one), or its last non-empty line."""
    lines = [line.strip() for line in traceback.splitlines() if line.strip()]
    exceptions = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return exceptions[-1] if exceptions else (lines[-1] if lines else "")


def _fatal_error(lines: list[str]) -> str:
    """``"Fatal Python error: Segmentation fault at train.py:12 in main -> distributed.py:1473 in _ddp_init_helper"``.

    Python's faulthandler (enabled in torchrun's workers) prints the fatal error, then the crashing thread's
    stack, innermost frame first; ``innermost_frame`` reads it as the launcher does for stacks on a timeout.
    """
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error:"):
            where = innermost_frame("\n".join(lines[i + 1:i + 40]))
            return line.strip() + (f" at {where}" if where else "")
    return ""


def _aborted_in_collective(signal_name_: str | None, lines: list[str]) -> bool:
    """A rank that gloo aborted (SIGABRT, ``gloo::EnforceNotMet``) while its main thread was in a collective."""
    if signal_name_ != "SIGABRT" or not any("gloo::EnforceNotMet" in line for line in lines):
        return False
    where = _fatal_error(lines)
    return bool(where) and _COLLECTIVE_FRAME.search(where) is not None


def _root_cause(run_dir: Path, output: str, tails: ThrottledPrinter, recovered: bool = False) -> RankFailure | None:
    """The launcher's root cause for one node; across simulated nodes (``logs/node<N>/``), the earliest error file.

    On several nodes ``output.log`` interleaves the agents' summaries, which name global ranks; a node's error
    files are under ``logs/node<N>/<id>/attempt_<k>/<local_rank>/`` and its first global rank is
    ``N * nproc_per_node``.
    """
    node_dirs = sorted((p for p in (run_dir / "logs").glob("node*") if p.name[4:].isdigit()),
                       key=lambda p: int(p.name[4:]))
    if not node_dirs:
        return find_root_cause(output, run_dir / "logs", tails, recovered=recovered)
    exit_codes = {int(m["rank"]): int(m["exitcode"]) for m in FAILURE_ENTRY.finditer(output)}
    errors = []  # (exited on its own, mtime, global rank, path)
    for node_dir in node_dirs:
        attempts = [p for p in node_dir.glob("*/attempt_*") if p.name.removeprefix("attempt_").isdigit()]
        if not attempts:
            continue
        last = max(attempts, key=lambda p: int(p.name.removeprefix("attempt_")))
        nproc = sum(1 for p in last.iterdir() if p.name.isdigit())
        for path in last.glob("*/error.json"):
            if path.parent.name.isdigit():
                rank = int(node_dir.name[4:]) * nproc + int(path.parent.name)
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


def _last_steps(run_dir: Path) -> dict[int, int]:
    try:
        metrics = read_metrics(run_dir)
    except MetricsError:
        return {}
    return {int(r): int(s) for r, s in metrics.groupby("rank")["step"].max().items()}


def _check_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise ConfigError(f"run_dir {str(run_dir)!r} does not exist; pass the run directory of a launch "
                          "(LaunchError.run_dir, LaunchResult.run_dir) or the error itself")
    if not any((run_dir / name).exists() for name in ("output.log", "command.txt", "logs")):
        raise ConfigError(f"{str(run_dir)!r} is not a run directory (no output.log, command.txt or logs/): "
                          "pass the folder a launch created")


def _ranks_on_this_machine(run_dir: Path, record: RunRecord | None) -> int | None:
    """How many ranks the launch ran on this machine: ``nnodes * nproc_per_node`` from ``run.json`` (simulated
    nodes share the machine), else the sum of ``--nproc-per-node`` over ``command.txt`` (one line per node).
    ``None`` when neither says."""
    if record is not None and isinstance(record.nproc_per_node, int):
        return record.nproc_per_node * int(record.nnodes or 1)
    try:
        counts = re.findall(r"--nproc[-_]per[-_]node[ =](\d+)", (run_dir / "command.txt").read_text())
    except OSError:
        return None
    return sum(map(int, counts)) if counts else None


@dataclass
class _RankOutput:
    """``output.log`` read rank by rank.

    Attributes:
        ranked: every ``(rank, line)`` in order (``rank`` is ``None`` for torchrun's own lines).
        by_rank: each rank's lines, without version noise (e.g. DCP's TypedStorage warning).
        lines: the lines that are evidence: no version noise, no C++ log lines or DETAIL fingerprints.
        tails: every rank's last lines, as the launcher keeps them (nothing printed).
    """

    ranked: list[tuple[int | None, str]] = field(default_factory=list)
    by_rank: dict[int | None, list[str]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    tails: ThrottledPrinter = field(default_factory=ThrottledPrinter)


def _read_output(run_dir: Path, error: LaunchError | None) -> str:
    """The run's ``output.log`` (``""`` if there is none), after checking that ``run_dir`` is a run directory.

    Raises:
        ConfigError: not a run directory, or (given a folder, not an error) one whose launch did not start.
    """
    _check_run_dir(run_dir)
    log_path = run_dir / "output.log"
    output = log_path.read_text(errors="replace") if log_path.exists() else ""
    if error is None and output == "" and not (run_dir / "logs").exists():
        raise ConfigError(f"{str(run_dir)!r} holds no output.log or logs/: the launch did not start")
    return output


def _evidence_output(output: str, recovered: bool) -> str:
    """The output that is evidence: all of it, or for a run that finished after a restart, the output up to the
    agent's last "failed (exitcode: ...)" line (what the restarted attempt printed is not evidence)."""
    agent_failures = list(AGENT_FAILED.finditer(output)) if recovered else []
    return output[:output.find("\n", agent_failures[-1].end()) + 1 or None] if agent_failures else output


def _split_ranks(output: str) -> _RankOutput:
    """``output`` rank by rank (see ``_RankOutput``)."""
    ranks = _RankOutput()
    noise = NoiseFilter()
    for rank, text in rank_lines(output):  # output.log of an older launch has ranks' chunks on one line
        ranks.ranked.append((rank, text))
        if noise.kind(rank, text) == NoiseFilter.VERSION:
            continue  # e.g. DCP's TypedStorage warning: a rank's last words are what it printed before it
        ranks.tails.emit(rank, text, show=False)
        ranks.by_rank.setdefault(rank, []).append(text)
        if not _NOISE.search(text):
            ranks.lines.append(text)
    return ranks


def _run_failed(error: LaunchError | None, timed_out: bool, failure: RankFailure | None,
                error_files: dict[int | None, str], output: str) -> bool:
    """Whether anything says the run failed: an error, a timeout, a root cause, an error file, a traceback."""
    return (error is not None or timed_out or failure is not None or bool(error_files)
            or "ChildFailedError" in output or re.search(r"^Traceback", output, re.M) is not None)


def _run_last_steps(run_dir: Path, error: LaunchError | None) -> dict[int, int]:
    """Every rank's last metrics step; a ``LaunchTimeout``'s own ``last_steps`` win over the metrics files."""
    last_steps = dict(error.last_steps) if isinstance(error, LaunchTimeout) and error.last_steps else {}
    return {**_last_steps(run_dir), **last_steps}


def _where(run_dir: Path, error: LaunchError | None, record: RunRecord | None, ranked: list[tuple[int | None, str]],
           failed_rank: int | None, timed_out: bool) -> dict[int, str]:
    """``{rank: "file:line in function"}``: the error's or ``run.json``'s stacks, else (not on a timeout) those
    the other ranks printed when torchrun stopped them (SIGTERM)."""
    where = dict(getattr(error, "where", {}) or {})
    where = where or (dict(record.where) if record is not None else {})
    if not where and not timed_out:
        stacks = stopped_ranks_stacks(ranked, run_dir / "logs", one_node=not any((run_dir / "logs").glob("node*")),
                                      failed_rank=failed_rank)
        where = {rank: innermost_frame(stack) for rank, stack in stacks.items()}
    return where


def _error_line(failure: RankFailure, timed_out: bool, lines: list[str]) -> str:
    """The root cause's exception line; when no rank failed (torchrun itself did), torchrun's own last one."""
    error_line = _exception_line(failure.traceback) if failure.traceback else ""
    if not error_line and failure.rank is None and not timed_out:  # torchrun's own traceback is in the output
        torchrun_errors = [t for t in lines if _EXCEPTION_LINE.match(t.strip()) and "ChildFailedError" not in t]
        error_line = torchrun_errors[-1].strip() if torchrun_errors else ""
    return error_line


def _limits(error: LaunchError | None, record: RunRecord | None, timed_out: bool) -> tuple[float | None, str]:
    """``(timeout_s, limit)`` of ``Diagnosis``: from a ``LaunchTimeout``, else from ``run.json``."""
    timeout_s = error.timeout_s if isinstance(error, LaunchTimeout) else record.timeout_s if record else None
    limit = (getattr(error, "limit", "timeout_s") if isinstance(error, LaunchTimeout)
             else (record.limit if record and record.limit else "timeout_s") if timed_out else "")
    return timeout_s, limit


def _failed_diagnosis(run_dir: Path, error: LaunchError | None, record: RunRecord | None, failure: RankFailure,
                      ranks: _RankOutput, timed_out: bool, recovered: bool, last_steps: dict[int, int]) -> Diagnosis:
    """The ``Diagnosis`` of a failed run before its cause is known: who failed, how, where every rank was."""
    tb_lines = [line for line in (failure.traceback or "").splitlines() if line.strip()]
    timeout_s, limit = _limits(error, record, timed_out)
    return Diagnosis(
        run_dir=run_dir, failed=not recovered, recovered=recovered, rank=failure.rank, exit_code=failure.exit_code,
        signal=signal_name(failure.exit_code), error=_error_line(failure, timed_out, ranks.lines),
        traceback_tail=tb_lines[-3:] or list(failure.log_tail[-3:]), last_steps=last_steps,
        where=_where(run_dir, error, record, ranks.ranked, failure.rank, timed_out), timeout_s=timeout_s, limit=limit,
    )


def _match_cause(diagnosis: Diagnosis, texts: list[str], timed_out: bool) -> bool:
    """Set the first of ``CAUSES`` whose pattern a line of ``texts`` matches (in ``texts``' order); ``False`` if
    none does. On a timeout, the causes from "collective timeout (hang)" on are not tried: the stacks say more."""
    for cause in CAUSES:
        if timed_out and cause.name in ("collective timeout (hang)", "NCCL error"):
            return False  # a wall-clock timeout is a hang; the stacks say more than a message
        for text in texts:
            match = next((m for m in map(cause.pattern.search, text.splitlines()) if m), None)
            if match:
                line = match.string.strip()
                start = max(0, match.start() - len(match.string) + len(line) - 100)
                evidence = line if start == 0 else "..." + line[start:]
                evidence = cause.describe(line) if cause.describe else evidence
                diagnosis.cause, diagnosis.evidence, diagnosis.fix = cause.name, evidence, cause.fix
                nccl_timeout = cause.name == "collective timeout (hang)" and any(map(_NCCL_TIMEOUT.search, texts))
                if nccl_timeout and (_ranks_on_this_machine(diagnosis.run_dir, RunRecord.read(diagnosis.run_dir))
                                     or 0) > 1:
                    diagnosis.fix += _P2P_HINT  # NCCL (so GPUs), several ranks on one machine: P2P between them
                return True
    return False


def _last_words(failure: RankFailure, rank_lines_: list[str]) -> str:
    """A rank's faulthandler report, else the last line of its log tail (not faulthandler's module list)."""
    return _fatal_error(rank_lines_) or next(
        (t for t in reversed(failure.log_tail) if t.strip() and not t.startswith("Extension modules")), "")


def _fallback_cause(diagnosis: Diagnosis, failure: RankFailure, rank_lines_: list[str], timed_out: bool) -> None:
    """Set the cause when no message of ``CAUSES`` matched: from the timeout, the exception, the signal or the
    exit code. ``rank_lines_``: the failed rank's lines of output."""
    if timed_out:
        diagnosis.cause = "hang (no progress)" if diagnosis.limit == "stall_timeout_s" else "hang (wall-clock timeout)"
        diagnosis.fix = _HANG_FIX
        diagnosis.evidence = f"last step per rank {diagnosis.last_steps}" if diagnosis.last_steps else ""
    elif diagnosis.error and diagnosis.signal is None:
        name = diagnosis.error.split(":", 1)[0]
        diagnosis.cause, diagnosis.evidence = f"Python exception ({name})", diagnosis.error
        diagnosis.fix = _EXCEPTION_FIX.format(rank=failure.rank)
    elif _aborted_in_collective(diagnosis.signal, rank_lines_):
        mismatch = next(c for c in CAUSES if c.name == "collective mismatch")
        diagnosis.cause, diagnosis.fix = mismatch.name, mismatch.fix
        diagnosis.evidence = _fatal_error(rank_lines_)
    elif diagnosis.signal is not None:
        diagnosis.cause = f"killed by {diagnosis.signal}"
        diagnosis.fix = _SIGNAL_FIXES.get(diagnosis.signal, "the rank was killed by a signal: read its log in logs/")
        diagnosis.evidence = _last_words(failure, rank_lines_)
    elif failure.rank is not None and not failure.traceback and (failure.exit_code or 0) > 0:
        # No error file: @record lets SystemExit through (sys.exit(3)); os._exit skips it altogether.
        code = failure.exit_code
        diagnosis.cause = f"exited with code {code} without a traceback"
        diagnosis.fix = _EXIT_FIX.format(rank=failure.rank, code=code, meaning=exit_code_meaning(code))
        last = last_meaningful_line(failure.log_tail)
        diagnosis.evidence = f"the rank's last line was {last!r}" if last else "the rank printed nothing"
    elif failure.rank is not None and not failure.traceback and failure.exit_code is None:
        # No error file and no exit code from torchrun (it reports only the failures it saw first), while the
        # peers failed on the lost connection: the rank died outside Python.
        diagnosis.cause = "died without a Python error"
        diagnosis.fix = _NO_ERROR_FIX
        diagnosis.evidence = _last_words(failure, rank_lines_)
    else:
        diagnosis.fix = "no known pattern: read output.log and logs/*/attempt_*/<local_rank>/ in the run directory"


def diagnose(run: str | os.PathLike | LaunchError) -> Diagnosis:
    """Summarise a failed run: who failed first, how, where every rank was, the suspected cause and the fix.

    Args:
        run: a run directory (``LaunchError.run_dir``; any folder a launch created), or the ``LaunchError`` /
            ``LaunchTimeout`` itself (its root cause, last steps and stacks are used as they are).

    Returns:
        A ``Diagnosis`` (``print(d)`` for a few lines; a notebook shows it as a table). A run that finished
        gives ``failed=False`` and cause ``"none"``.

    Raises:
        ConfigError: the folder does not exist or is not a run directory.

    Sources: torchrun's error files and failure summary (torch.distributed.elastic ``@record``,
    https://pytorch.org/docs/stable/elastic/errors.html); the messages matched are listed in ``CAUSES``.
    """
    error = run if isinstance(run, LaunchError) else None
    run_dir = Path(error.run_dir if error is not None else run)
    output = _read_output(run_dir, error)
    # run.json: a timeout is diagnosed from the folder alone, a run finished after a restart by what it recovered from
    record = RunRecord.read(run_dir) if error is None else None
    recovered = record is not None and record.status == RunStatus.FINISHED and record.returncode == 0
    ranks = _split_ranks(_evidence_output(output, recovered))
    failure = error.failure if error is not None else _root_cause(run_dir, output, ranks.tails, recovered=recovered)
    error_files = _error_files(run_dir)
    timed_out = isinstance(error, LaunchTimeout) or (record is not None and record.status == RunStatus.TIMEOUT)
    last_steps = _run_last_steps(run_dir, error)
    if not _run_failed(error, timed_out, failure, error_files, output):
        return Diagnosis(run_dir=run_dir, failed=False, last_steps=last_steps, cause="none")

    failure = failure or RankFailure(rank=None, exit_code=None)
    diagnosis = _failed_diagnosis(run_dir, error, record, failure, ranks, timed_out, recovered, last_steps)
    # Evidence: the root cause's traceback first, then every rank's error file, then everything printed.
    texts = [failure.traceback or "", *error_files.values(), *(getattr(error, "output_tail", None) or []),
             *ranks.lines]
    if not _match_cause(diagnosis, texts, timed_out):
        _fallback_cause(diagnosis, failure, ranks.by_rank.get(failure.rank, []), timed_out)
    return diagnosis
