"""Launch a training script with torchrun, stream its output, watch it, and always clean up.

``launch(LaunchSpec(...))`` runs ``python -m torch.distributed.run`` (torchrun) as a subprocess
in its own process group, never forking the kernel and never through a shell, on a free
loopback port. Every rank's output is streamed into the cell prefixed by rank; memory is
sampled; the live view shows progress and the loss/memory plot. On error, timeout or
KeyboardInterrupt (a kernel interrupt) the whole process tree is stopped and reaped.

Pure helpers (``build_command``, ``build_env``) are unit-tested without launching anything,
as accelerate does for its launchers.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pandas as pd
import psutil

from .devices import DevicePlan, build_env, check_positive_int, resolve_device
from .errors import ConfigError, LaunchError, LaunchTimeout, RankFailure, innermost_frame, stopped_ranks_stacks
from .live import LIVE_MODES, make_view
from .memory import MemorySampler, parse_visible_devices
from .metrics import METRICS_SUBDIR, JsonlTail, read_memory_notes, read_memory_samples, read_metrics
from . import warm
from .output import NoiseFilter, Redraws, TeeSplitter, ThrottledPrinter, split_rank_prefix
from .processes import ProcessTree, set_parent_death_signal
from .run_record import Outcome, RunRecord, RunStatus
from .warm_start import SOCKET_ENV
from .scripts import check_script_args, new_run_dir, write_script
from .torchrun_logs import find_root_cause, last_attempt_error_files

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


@dataclass
class LaunchSpec:
    """What to launch and how.

    Attributes:
        script: path of the training script (normally from ``write_script``).
        args: the script's own arguments, e.g. ``["--max-steps", 20]`` (converted with ``str``).
        nproc_per_node: ranks to start (``None``: the default of ``device``: 2 on CPU, one per GPU).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"`` (see ``resolve_device``). With ``"cpu"`` on a GPU
            machine the workers see no GPU (``CUDA_VISIBLE_DEVICES=""``).
        run_dir: where logs, metrics and ``command.txt`` go; defaults to the script's folder.
            It must not already hold a launch (nothing is overwritten).
        timeout_s: wall-clock limit for the whole job (seconds, > 0); past it the job is stopped
            and ``LaunchTimeout`` is raised.
        stall_timeout_s: a hang detector independent of start-up time (seconds, > 0, or ``None``: off):
            once a rank has logged its first metrics line, the job is stopped and ``LaunchTimeout``
            (``limit="stall_timeout_s"``) raised when no rank logs a new one for this long. For
            scripts that write per-step metrics (every training script here); choose it above the
            slowest step (and checkpoint save).
        env: extra environment variables for torchrun and the workers (the kernel's ``os.environ``
            is never modified).
        max_restarts: torchrun ``--max-restarts`` (elastic restarts of the whole group on failure).
        nnodes: simulated nodes on this host: one torchrun agent per node (``--nnodes``, c10d rendezvous
            on loopback, hosted by the launcher), each with ``nproc_per_node`` ranks; the rendezvous
            gives the agents their node ranks (``GROUP_RANK``). On CUDA each node gets its own GPUs.
        start_nodes: the node ranks this launch starts (``None``: all). Starting fewer than ``nnodes``
            simulates a node that never arrives: rendezvous fails after ``rendezvous_timeout_s``.
        rendezvous_timeout_s: how long an agent waits for the other nodes (``--rdzv-conf join_timeout=``,
            seconds; multi-node only).
        master_port: rendezvous port on 127.0.0.1 (1024-65535); ``None`` picks a free one.
        live: live view mode: ``"auto"``, ``"widgets"``, ``"text"`` or ``"off"`` (see ``tutorial_lib.live``).
        sample_memory_hz: memory samples per second (> 0).
        max_output_lines_per_s: lines per second shown in the cell; the rest go to ``output.log`` only.
        shutdown_grace_s: how long torchrun gets to stop its workers after SIGTERM before SIGKILL (s).
        warm: fork torchrun's agent and the ranks from this kernel's warm-start helper, which has imported
            torch once (``tutorial_lib.warm``; same processes, exit codes, error files and signals as cold
            starts, seconds faster); ``None``: ``$TUTORIAL_LIB_WARM`` (default on). Falls back to cold starts,
            saying why once, whenever the helper cannot serve the job.
    """

    script: str | os.PathLike
    args: Sequence[object] = ()
    nproc_per_node: int | None = None
    device: str = "auto"
    run_dir: str | os.PathLike | None = None
    timeout_s: float = 300.0
    stall_timeout_s: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    nnodes: int = 1
    start_nodes: Sequence[int] | None = None
    rendezvous_timeout_s: float = 60.0
    master_port: int | None = None
    live: str = "auto"
    sample_memory_hz: float = 5.0
    max_output_lines_per_s: float = 20.0
    shutdown_grace_s: float = 5.0
    warm: bool | None = None

    def validate(self, gpu_count: int | None = None) -> DevicePlan:
        """Check every field; return the device plan. Raises ``ConfigError`` naming the bad value."""
        script = Path(self.script)
        if not script.is_file():
            raise ConfigError(f"script {str(script)!r} does not exist; create it with write_script(name, run_dir)")
        for name in ("timeout_s", "sample_memory_hz", "max_output_lines_per_s", "shutdown_grace_s",
                     "rendezvous_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a number > 0, got {value!r}")
        stall = self.stall_timeout_s
        if stall is not None and (isinstance(stall, bool) or not isinstance(stall, (int, float)) or not stall > 0):
            raise ConfigError(f"stall_timeout_s must be a number > 0 (seconds) or None, got {stall!r}")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ConfigError(f"max_restarts must be an integer >= 0, got {self.max_restarts!r}")
        if self.master_port is not None and (
            isinstance(self.master_port, bool) or not isinstance(self.master_port, int)
            or not 1024 <= self.master_port <= 65535
        ):
            raise ConfigError(f"master_port must be an integer in 1024..65535 or None (free port), got {self.master_port!r}")
        if self.live not in LIVE_MODES:
            raise ConfigError(f"live must be one of {LIVE_MODES}, got {self.live!r}")
        if self.warm not in (None, True, False):
            raise ConfigError(f"warm must be True, False or None (${warm.WARM_ENV}, default on), got {self.warm!r}")
        warm.warm_enabled(self.warm)  # a bad $TUTORIAL_LIB_WARM fails here, before anything starts
        if isinstance(self.args, (str, bytes)):
            raise ConfigError(f"args must be a list of arguments, not one string: got {self.args!r}; "
                              f"use shlex.split({self.args!r})")
        for key, value in self.env.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ConfigError(f"env must map str to str, got {key!r}: {value!r}")
        run_dir = Path(self.run_dir) if self.run_dir is not None else script.parent
        if not run_dir.is_dir() or not _can_write_in(run_dir):
            raise ConfigError(f"run_dir {str(run_dir)!r} is not a writable directory")
        if (run_dir / "command.txt").exists():
            raise ConfigError(f"run_dir {str(run_dir)!r} already holds a launch (command.txt); "
                              "use a new run directory (new_run_dir) so nothing is overwritten")
        if self.nproc_per_node is not None:
            check_positive_int("nproc_per_node", self.nproc_per_node)
        check_positive_int("nnodes", self.nnodes)
        if self.start_nodes is not None:
            nodes = list(self.start_nodes)
            if not nodes or len(set(nodes)) != len(nodes) or not set(nodes) <= set(range(self.nnodes)):
                raise ConfigError(f"start_nodes must be distinct node ranks in 0..{self.nnodes - 1} (nnodes="
                                  f"{self.nnodes}), got {self.start_nodes!r}; None starts every node")
        plan = resolve_device(self.device, self.nproc_per_node, gpu_count=gpu_count)
        if self.nnodes > 1 and plan.device == "cuda" and self.nnodes * plan.nproc_per_node > plan.gpu_count:
            raise ConfigError(f"nnodes={self.nnodes} x nproc_per_node={plan.nproc_per_node} simulated GPU ranks "
                              f"need as many GPUs, this machine has {plan.gpu_count}; use device='cpu' to "
                              "simulate nodes, or fewer ranks")
        return plan


@dataclass
class LaunchResult:
    """A finished, successful launch.

    Attributes:
        run_dir: the run directory (``metrics/``, ``samples/``, ``logs/``, ``output.log``, ``command.txt``).
        command: the argv that ran.
        returncode: torchrun's exit code (0).
        wall_time_s: from start to exit, seconds.
        plan: device, backend and rank count used.
    """

    run_dir: Path
    command: list[str]
    returncode: int
    wall_time_s: float
    plan: DevicePlan

    def metrics(self) -> pd.DataFrame:
        """The per-rank step metrics (``read_metrics``), every rank required."""
        return read_metrics(self.run_dir, ranks=self.plan.nproc_per_node)

    def memory_samples(self, kind: str = "rss") -> pd.DataFrame:
        """Memory sampled during the run (``read_memory_samples``; its ``.attrs["notes"]`` as ``memory_notes``)."""
        return read_memory_samples(self.run_dir, kind)

    def memory_notes(self) -> list[str]:
        """What to know about the GPU memory samples (``read_memory_notes``): e.g. that no worker process
        matched NVML's process list, so GPU memory is known per device, not per process. Empty on CPU."""
        return read_memory_notes(self.run_dir)


def _can_write_in(folder: Path) -> bool:
    """True if a file can really be created in ``folder`` (``os.access`` says yes to root even for /proc)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# Every rank runs its script through this file (``python -u rank_runner.py SCRIPT ARGS``): exactly what
# ``python SCRIPT ARGS`` does, then a clean exit past gloo's teardown abort, stacks on SIGUSR1/SIGTERM, and
# death with torchrun. See its docstring.
RANK_RUNNER = Path(__file__).resolve().with_name("rank_runner.py")


def build_command(script: str | os.PathLike, args: Sequence[object], plan: DevicePlan, *, master_port: int,
                  log_dir: str | os.PathLike, max_restarts: int = 0, python: str | None = None,
                  nnodes: int = 1, rendezvous_id: str = "tutorial_lib", rendezvous_timeout_s: float = 60.0) -> list[str]:
    """The torchrun argv of one node on loopback; pure (launches nothing).

    ``--tee 3`` copies each worker's stdout and stderr to ``log_dir`` and to torchrun's stdout with a
    ``[default<local_rank>]:`` prefix, written a whole line at a time. Each worker runs ``RANK_RUNNER SCRIPT ARGS``
    (``tutorial_lib/rank_runner.py``: the script as ``python SCRIPT ARGS`` runs it, then a clean exit). The rendezvous:

    * one node, no restarts: static (``--master-addr``/``--master-port``);
    * one node with ``max_restarts > 0``: ``c10d`` on ``127.0.0.1:master_port``. The static rendezvous
      hands every attempt the same store keys, so a restarted group read the dead attempt's gloo
      addresses ("Gloo connectFullMesh failed ... Connection refused") or hung (torch 2.8 and 2.13: 1 and 2
      of 5 restarts recovered); c10d starts each attempt in a fresh round, with
      ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (``build_env``; pytorch/pytorch#135712);
    * ``nnodes > 1``: every agent joins the ``c10d`` rendezvous at ``127.0.0.1:master_port`` as a client
      (``is_host=false``: the launcher hosts that store, so it outlives every agent) and waits at most
      ``rendezvous_timeout_s`` for the others (``join_timeout``); node ranks follow arrival order.
    """
    if nnodes > 1:
        rendezvous = ["--nnodes", str(nnodes), "--rdzv-backend", "c10d",
                      "--rdzv-endpoint", f"{LOOPBACK}:{master_port}", "--rdzv-id", rendezvous_id,
                      "--rdzv-conf", f"is_host=false,join_timeout={rendezvous_timeout_s:g}"]
    elif max_restarts > 0:
        rendezvous = ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{LOOPBACK}:{master_port}",
                      "--rdzv-id", rendezvous_id]
    else:
        rendezvous = ["--nnodes", "1", "--master-addr", LOOPBACK, "--master-port", str(master_port)]
    return [
        python or sys.executable, "-m", "torch.distributed.run",
        *rendezvous,
        "--nproc-per-node", str(plan.nproc_per_node),
        "--max-restarts", str(max_restarts),
        "--log-dir", str(log_dir),
        "--tee", "3",
        str(RANK_RUNNER), str(script), *map(str, args),
    ]


def node_visible_devices(env: Mapping[str, str], node: int, nproc_per_node: int, gpu_count: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` of simulated node ``node``: its own slice of the job's GPUs; pure.

    Args:
        env: the job's environment; its ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs) lists the GPUs
            the job may use; unset: GPUs ``0..gpu_count-1``.
        node: the node rank (0-based).
        nproc_per_node: ranks, so GPUs, per node.
        gpu_count: GPUs visible to the launching process (used when ``CUDA_VISIBLE_DEVICES`` is unset).

    Returns:
        Entries ``node * nproc_per_node`` to ``(node + 1) * nproc_per_node - 1`` of the job's GPUs, comma
        separated: that node's ranks see them as ``cuda:0..nproc_per_node-1``. Slicing the job's list, not
        counting from GPU 0, keeps a node inside the GPUs the user allowed.
    """
    visible = parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    entries = [str(e) for e in visible] if visible is not None else [str(i) for i in range(gpu_count)]
    return ",".join(entries[node * nproc_per_node:(node + 1) * nproc_per_node])


def command_text(command: Sequence[str], env: Mapping[str, str], run_dir: Path, base: Mapping[str, str]) -> str:
    """A shell line that reruns the launch by hand: ``cd`` + the variables the launcher set + argv."""
    changed = {k: v for k, v in env.items() if base.get(k) != v}
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(changed.items()))
    return f"cd {shlex.quote(str(run_dir))} && {assignments} {shlex.join(command)}\n"


def command_port(command: Sequence[str]) -> int | None:
    """The rendezvous port of a torchrun command built by ``build_command`` (``--master-port`` or the port of
    ``--rdzv-endpoint``); ``None`` if it has neither."""
    for flag, value in zip(command, command[1:]):
        if flag == "--master-port":
            return int(value)
        if flag == "--rdzv-endpoint":
            return int(value.rsplit(":", 1)[1])
    return None


def explain_agent_failure(output: str, spec: LaunchSpec, started: Sequence[int], port: int | None = None) -> str:
    """A sentence for failures of torchrun itself (no rank to blame), from its output; "" if unknown.

    Args:
        output: torchrun's output (every agent's).
        spec: the job.
        started: the node ranks this launch started.
        port: the rendezvous port the launch used (``spec.master_port``, or the free port picked for
            ``master_port=None``); ``None`` when not known.
    """
    if "RendezvousTimeoutError" in output or "waiting for clients" in output:
        missing = sorted(set(range(spec.nnodes)) - set(started))
        return (f"the rendezvous timed out after {spec.rendezvous_timeout_s:g} s (rendezvous_timeout_s) waiting "
                f"for {spec.nnodes} nodes; {len(started)} joined" + (f", node(s) {missing} were never started" if missing
                                                                      else "") + ". Start the same command on every node")
    if "EADDRINUSE" in output or "address already in use" in output.lower():
        if spec.master_port is not None:
            return (f"port {spec.master_port} is already in use (EADDRINUSE) on {LOOPBACK}; pick another master_port, "
                    "or leave master_port=None for a free one")
        picked = f"port {port}" if port is not None else "the port"
        return (f"{picked}, picked as free for this launch (master_port=None), was taken by another process before "
                f"torchrun bound it (EADDRINUSE on {LOOPBACK}); launch again: each launch picks a new free port")
    return ""


def _reader(stream, out: queue.Queue, node: int = 0) -> None:
    for raw in iter(stream.readline, b""):
        out.put((node, raw.decode("utf-8", errors="replace").rstrip("\r\n")))
    out.put((node, None))


STACK_DUMP_SIGNAL = signal.SIGUSR1
STACK_DUMP_WAIT_S = 10.0  # the longest wait for every rank's stack; ends 0.5 s after the last rank answered
_STACK_LINE = re.compile(r'^(Current thread 0x|Thread 0x|\s+File "|\s*$)')


def catches_signal(pid: int, sig: int) -> bool:
    """Whether process ``pid`` installed a handler for ``sig`` (Linux ``/proc/<pid>/status`` ``SigCgt``).

    Sending SIGUSR1 to a process that does not catch it would kill it, so the stack dump asks first.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration, ValueError):
        return False
    return bool(mask >> (int(sig) - 1) & 1)


class _Timeout(Exception):
    """A limit of the job was reached; ``limit`` names it (``"timeout_s"`` or ``"stall_timeout_s"``)."""

    def __init__(self, limit: str = "timeout_s") -> None:
        super().__init__(limit)
        self.limit = limit


@contextlib.contextmanager
def sigint_deferred():
    """Hold back SIGINT (a kernel interrupt) while the job is being stopped; re-deliver it afterwards.

    Only the main thread can set signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


def safe_draw(draw, *args) -> None:
    """Call a live-view method; a drawing problem is logged, never allowed to fail or hide the job's outcome."""
    try:
        draw(*args)
    except Exception:  # noqa: BLE001
        log.warning("the live view could not draw", exc_info=True)


# --- plan: everything decided before a process starts ---------------------------------------------------------------

@dataclass
class _LaunchPlan:
    """What ``launch`` starts, worked out before anything runs: one torchrun command and environment per node."""

    spec: LaunchSpec
    plan: DevicePlan
    script: Path
    run_dir: Path
    nodes: list[int]  # the node ranks this launch starts
    job_env: dict[str, str]
    commands: dict[int, list[str]] = field(default_factory=dict)
    envs: dict[int, dict[str, str]] = field(default_factory=dict)
    store: object = None  # simulated nodes: the rendezvous store, hosted here until every agent is gone
    start: str = "cold"  # "warm" once the nodes were started from the warm-start helper

    @property
    def command(self) -> list[str]:
        return self.commands[self.nodes[0]]

    @property
    def shape(self) -> dict:
        """The job's shape, in every run.json (the doctor reads it)."""
        return dict(nnodes=self.spec.nnodes, nproc_per_node=self.plan.nproc_per_node, device=self.plan.device,
                    start=self.start)

    def node_log_dir(self, node: int) -> Path:
        return self.run_dir / "logs" / f"node{node}" if self.spec.nnodes > 1 else self.run_dir / "logs"


def _rendezvous(spec: LaunchSpec) -> tuple[object, int]:
    """The rendezvous store (simulated nodes only, else ``None``) and port."""
    if spec.nnodes == 1:
        return None, spec.master_port or free_port()
    # The rendezvous store lives here, not in an agent: an agent hosting it would close it on exit
    # while the other agents still wait at torchrun's exit barrier (an error with a C++ trace).
    # It listens on a socket bound to 127.0.0.1 (TCPStore alone would listen on every interface).
    from torch.distributed import TCPStore
    listener = socket.create_server((LOOPBACK, spec.master_port or 0))
    port = listener.getsockname()[1]
    store = TCPStore(LOOPBACK, port, is_master=True, wait_for_workers=False, master_listen_fd=listener.detach(),
                     timeout=timedelta(seconds=spec.rendezvous_timeout_s))  # the store now owns the socket
    return store, port


def _plan_launch(spec: LaunchSpec) -> _LaunchPlan:
    """Validate ``spec``, resolve the device, host the rendezvous, build each node's command and environment,
    and write ``command.txt``; nothing is started."""
    plan = spec.validate()
    script = Path(spec.script).resolve()
    run_dir = Path(spec.run_dir).resolve() if spec.run_dir is not None else script.parent
    nodes = list(spec.start_nodes) if spec.start_nodes is not None else list(range(spec.nnodes))
    store, port = _rendezvous(spec)
    job_env = build_env(plan, spec.env, shutdown_grace_s=spec.shutdown_grace_s, max_restarts=spec.max_restarts)
    lp = _LaunchPlan(spec, plan, script, run_dir, nodes, job_env, store=store)
    for node in nodes:
        lp.commands[node] = build_command(script, spec.args, plan, master_port=port, log_dir=lp.node_log_dir(node),
                                          max_restarts=spec.max_restarts, nnodes=spec.nnodes,
                                          rendezvous_id=run_dir.name, rendezvous_timeout_s=spec.rendezvous_timeout_s)
        lp.envs[node] = dict(job_env)
        if spec.nnodes > 1:
            # Node ranks come from the rendezvous, so lines are labelled with the global rank.
            lp.envs[node].setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]:")
            if plan.device == "cuda":  # each simulated node its own GPUs
                lp.envs[node]["CUDA_VISIBLE_DEVICES"] = node_visible_devices(job_env, node, plan.nproc_per_node,
                                                                             plan.gpu_count)
    (run_dir / "command.txt").write_text("".join(
        (f"# node {node}\n" if spec.nnodes > 1 else "") + command_text(lp.commands[node], lp.envs[node], run_dir, os.environ)
        for node in nodes))
    return lp


# --- pump: every output line, from the reader threads to output.log, the transcripts and the cell --------------------

class _OutputPump:
    """What the job's output lines go through and into: the tee splitter, the noise filter, the throttled
    printer, ``output.log``, the whole transcript, each node's transcript, and the (rank, text) of every line.

    The reader threads put ``(node, line)`` on ``lines`` (``(node, None)`` when a node's stream ends); only the
    launching thread takes them off, with ``read_lines``.
    """

    def __init__(self, spec: LaunchSpec, run_dir: Path, nodes: Sequence[int], printer: ThrottledPrinter,
                 output_log) -> None:
        self.spec, self.run_dir, self.printer, self.output_log = spec, run_dir, printer, output_log
        self.lines: queue.Queue = queue.Queue()
        self.transcript: list[str] = []
        self.node_transcripts: dict[int, list[str]] = {node: [] for node in nodes}
        self.ranked: list[tuple[int | None, str]] = []  # (global rank or None, text) of every line
        self.open_streams = set(nodes)
        self.noise = NoiseFilter()  # what a torch version prints on every launch: in output.log, not on screen
        self.tee = TeeSplitter()  # one rank's piece per line, in output.log and on screen
        self.redraws = Redraws()  # lines a rank redraws with \r: their latest state
        self.torchrun_traceback = False

    def take(self, node: int, line: str) -> None:
        """Log, keep and (throttled) show one output line of ``node``'s agent, piece by piece: torchrun writes a
        rank's unfinished line (a ``\\r`` progress bar) and the next rank's chunk on one line (``split_tee_line``)."""
        for piece in self.tee.split(line):
            self.take_piece(node, piece)

    def take_piece(self, node: int, line: str) -> None:
        """One rank's piece (or torchrun's line): every state of a redrawn line is logged, and shown in place at most;
        its final state is shown as a line when the line ends (its marked newline, or the job's end: ``Redraws``)."""
        rank, marked = split_rank_prefix(line)  # global rank on several nodes (prefix template), else local
        text, redrawn, ended = self.redraws.take(rank, marked)
        if text is not None:  # else only marks: the end of a line already logged
            line = line[:len(line) - len(marked)] + text
            self.output_log.write(line + "\n")
            self.transcript.append(line)
            self.node_transcripts[node].append(line)
            self.ranked.append((rank, text))
        if ended is None and (redrawn or text is None):
            if text is not None:
                self.printer.redraw(rank, text)  # in place where the view can (widgets), else not shown
            return
        if ended is not None:  # the redrawn line's final state: from here on a line like any other
            self.printer.redraw(rank, None)
            text = ended
        if rank is None and self.spec.nnodes > 1:
            text = f"[node {node}] {text}"
        # torchrun's own traceback (ChildFailedError) repeats what the raised LaunchError says;
        # it stays in output.log and the error's output_tail, not on screen.
        self.torchrun_traceback = self.torchrun_traceback or (rank is None and "Traceback" in text)
        kind = self.noise.kind(rank, text)
        # A rank's traceback frames: in the widget view's collapsible output area (one click away), not in a
        # text-mode cell, where the exception line says the cause and output.log keeps every frame.
        frame = kind == NoiseFilter.TRACEBACK and self.printer.keeps_full_tracebacks
        self.printer.emit(rank, text, show=not (rank is None and self.torchrun_traceback) and (kind is None or frame),
                          keep=kind != NoiseFilter.VERSION, force=frame)  # version noise is no rank's last words

    def read_lines(self, wait_s: float) -> bool:
        """Take every line available within ``wait_s``; True if any arrived."""
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
        return got

    def dump_stacks(self, tree: ProcessTree) -> dict[int, str]:
        """Ask every rank that catches SIGUSR1 (faulthandler) for its Python stack; collect what they print."""
        targets = {rank: proc for rank, proc in tree.rank_processes().items()
                   if catches_signal(proc.pid, STACK_DUMP_SIGNAL)}
        mark = len(self.ranked)
        for proc in targets.values():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(STACK_DUMP_SIGNAL)
        deadline = time.monotonic() + (STACK_DUMP_WAIT_S if targets else 0)
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            if self.read_lines(0.1):
                quiet_since = time.monotonic()
            answered = {rank for rank, text in self.ranked[mark:]
                        if rank is not None and text.startswith(("Current", "Thread"))}
            if answered >= set(targets) and time.monotonic() - quiet_since > 0.5:
                break
        stacks: dict[int, list[str]] = {}
        for rank, text in self.ranked[mark:]:
            if rank in targets and _STACK_LINE.match(text):
                stacks.setdefault(rank, []).append(text)
        return {rank: "\n".join(text).strip("\n") for rank, text in sorted(stacks.items())}

    def finish(self) -> None:
        """After the output log is closed: show what was held back (the final state of every line still being redrawn,
        the count of lines not shown), and say how many traceback lines were not shown."""
        for rank, text in self.redraws.end_all().items():
            self.printer.emit(rank, text)
            self.printer.redraw(rank, None)
        self.printer.flush_suppressed()
        if self.noise.traceback_lines and not self.printer.keeps_full_tracebacks:
            self.printer.note(f"{self.noise.traceback_lines} traceback line(s) not shown (the exception line is); "
                              f"every line is in {self.run_dir / 'output.log'}")


def limit_reached(spec: LaunchSpec, elapsed: float, progress_at: float | None) -> str | None:
    """The limit the job has gone past ``elapsed`` s after its start (``"timeout_s"`` or ``"stall_timeout_s"``), or
    ``None``; ``progress_at``: when a rank last logged a metrics line (``None``: none yet, no stall possible)."""
    if elapsed > spec.timeout_s:
        return "timeout_s"
    if spec.stall_timeout_s and progress_at is not None and elapsed - progress_at > spec.stall_timeout_s:
        return "stall_timeout_s"
    return None


# --- start and watch: the node processes, their readers, the memory sampler, the live view ---------------------------

def _start_commands(lp: _LaunchPlan, printer: ThrottledPrinter) -> dict[int, tuple[list[str], dict[str, str]]]:
    """Each node's command and environment as started: warm (forked from the kernel's helper) or cold.

    ``command.txt`` keeps the cold form, the one to copy to a cluster."""
    cold = {node: (lp.commands[node], lp.envs[node]) for node in lp.nodes}
    if not warm.warm_enabled(lp.spec.warm):
        return cold
    socket_path, reason = warm.warm_path(lp.envs[lp.nodes[0]])
    if socket_path is None:
        if warm.say_once(reason):
            printer.note(f"warm start off ({reason}): torchrun and the ranks start cold, importing torch each")
        return cold
    lp.start = "warm"
    return {node: (warm.warm_command(lp.commands[node], RANK_RUNNER), {**lp.envs[node], SOCKET_ENV: socket_path})
            for node in lp.nodes}


class _RunningJob:
    """The started torchrun agents (one per node), their process tree, output readers and memory sampler."""

    def __init__(self, lp: _LaunchPlan, pump: _OutputPump, view) -> None:
        self.lp, self.pump, self.view = lp, pump, view
        self.metrics_tail = JsonlTail(lp.run_dir / METRICS_SUBDIR, "rank*.jsonl")
        self.start = time.monotonic()
        safe_draw(view.start)
        self.procs: dict[int, subprocess.Popen] = {}
        starts = _start_commands(lp, pump.printer)
        try:
            for node in lp.nodes:
                self.procs[node] = subprocess.Popen(
                    starts[node][0], cwd=lp.run_dir, env=starts[node][1], stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                    # The kernel killed outright: SIGKILL, not SIGTERM. Seen here: torchrun SIGTERMed while its
                    # kernel died stopped its ranks, then hung at exit joining its tee threads (never told to stop),
                    # an orphan for good. Its ranks die with it all the same (the rank runner's own PDEATHSIG).
                    preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL),
                )
        except BaseException:
            for proc in self.procs.values():
                ProcessTree(proc.pid).stop(proc, lp.spec.shutdown_grace_s)
            pump.output_log.close()
            raise
        self.tree = ProcessTree(*(proc.pid for proc in self.procs.values()))
        # The job's GPUs, numbered as its ranks see them (simulated nodes: node n's cuda:i is the job's n * nproc + i).
        self.sampler = MemorySampler(self.tree, lp.run_dir, hz=lp.spec.sample_memory_hz,
                                     sample_gpus=lp.plan.device == "cuda", env=lp.job_env)
        self.sampler.start()
        self.readers = [threading.Thread(target=_reader, args=(proc.stdout, pump.lines, node),
                                         name=f"tutorial_lib-reader-{node}", daemon=True)
                        for node, proc in self.procs.items()]
        for reader in self.readers:
            reader.start()
        log.info("launched %s (pids %s) in %s", shlex.join(lp.command), [p.pid for p in self.procs.values()],
                 lp.run_dir)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def wait(self) -> dict[int, int]:
        """Pump output and update the view until every agent exited and its output is read; the return codes.

        Raises ``_Timeout`` past a limit (``limit_reached``)."""
        last_view, progress_at, exited_at = 0.0, None, None
        while self.pump.open_streams or any(proc.poll() is None for proc in self.procs.values()):
            self.pump.read_lines(0.1)
            elapsed = self.elapsed()
            if elapsed - last_view >= 0.25:
                last_view = elapsed
                new_records = self.metrics_tail.read_new()
                if new_records:
                    progress_at = elapsed
                self.view.add(new_records)
                safe_draw(self.view.update, elapsed, self.sampler.rss_samples)
            if limit := limit_reached(self.lp.spec, elapsed, progress_at):
                raise _Timeout(limit)
            if self.pump.open_streams and all(proc.poll() is not None for proc in self.procs.values()):
                exited_at = exited_at or elapsed
                if elapsed - exited_at > 2.0:  # torchrun is gone but orphans still hold the pipe open
                    self.tree.kill_leftovers()
        return {node: proc.wait() for node, proc in self.procs.items()}

    def close(self) -> None:
        """On every path: stop sampling, kill leftovers, read the last lines, close the log and the pipes."""
        self.sampler.stop()
        self.tree.kill_leftovers()  # e.g. a worker's own child processes orphaned by a crash
        for reader in self.readers:
            reader.join(timeout=5)
        self.pump.read_lines(0)  # lines that arrived after the loop ended
        self.pump.output_log.close()
        for proc in self.procs.values():
            if proc.stdout:
                proc.stdout.close()
        self.pump.finish()


# --- outcome: the error or result, run.json, and the live view's last word ------------------------------------------

def _timeout_error(lp: _LaunchPlan, pump: _OutputPump, limit: str, elapsed: float, ranks_running: list[int],
                   last_steps: dict[int, int], stacks: dict[int, str], returncode: int | None) -> LaunchTimeout:
    """The ``LaunchTimeout`` of a job stopped at ``limit``; writes its run.json."""
    limit_s, what, _ = _limit_text(lp.spec, limit)
    summary = (f"{lp.script.name} {what} and was stopped; "
               f"ranks still running: {ranks_running or 'none'}; last step per rank: {last_steps or 'none'}")
    if stacks:
        summary += "; where each rank was: " + "; ".join(
            f"rank {rank} in {innermost_frame(stack)}" for rank, stack in sorted(stacks.items()))
    error = LaunchTimeout(summary, timeout_s=limit_s, limit=limit, last_steps=last_steps, stacks=stacks,
                          run_dir=lp.run_dir, command=lp.command, returncode=returncode,
                          output_tail=pump.transcript[-30:])
    RunRecord(RunStatus.TIMEOUT, elapsed, **lp.shape, summary=summary, timeout_s=limit_s, limit=limit,
              where={r: innermost_frame(s_) for r, s_ in stacks.items()}).write(lp.run_dir)
    return error


def _limit_text(spec: LaunchSpec, limit: str) -> tuple[float, str, str]:
    """The value of ``limit`` in ``spec``, what the job did to reach it, and the same in a few words (the live view's)."""
    if limit == "stall_timeout_s":
        what = f"made no progress for {spec.stall_timeout_s:g} s"
        return spec.stall_timeout_s, f"{what} (no rank logged a step; limit stall_timeout_s)", what
    what = f"timed out after {spec.timeout_s:g} s"
    return spec.timeout_s, f"{what} (limit timeout_s)", what


def _stop_job(job: _RunningJob, exc: BaseException) -> LaunchTimeout | None:
    """Stop the job (after asking its ranks for their stacks on a timeout) and report why: the ``LaunchTimeout``
    to raise, or ``None`` after saying that an interrupt or another exception stopped it (it is re-raised)."""
    lp, pump, view = job.lp, job.pump, job.view
    ranks_running = job.tree.ranks_alive()
    stacks = {}
    if isinstance(exc, _Timeout):
        with sigint_deferred():
            stacks = pump.dump_stacks(job.tree)
    with sigint_deferred():  # a second interrupt must not cut the cleanup short
        killed = job.tree.stop(list(job.procs.values()), lp.spec.shutdown_grace_s)
    elapsed = job.elapsed()
    view.add(job.metrics_tail.read_new())
    if isinstance(exc, _Timeout):
        last_steps = {rank: r["step"] for rank, r in view.latest.items()}
        error = _timeout_error(lp, pump, exc.limit, elapsed, ranks_running, last_steps, stacks,
                               job.procs[lp.nodes[0]].returncode)
        outcome = Outcome(RunStatus.TIMEOUT, elapsed, _limit_text(lp.spec, exc.limit)[2])
        safe_draw(view.finish, job.sampler.rss_samples, outcome)
        safe_draw(view.fail, error)  # the live view says where each rank was
        return error
    what = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"stopped by {type(exc).__name__}"
    status = RunStatus.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else RunStatus.STOPPED
    RunRecord(status, elapsed, **lp.shape, summary=what).write(lp.run_dir)
    safe_draw(view.finish, job.sampler.rss_samples, Outcome(status, elapsed, what))
    sys.stdout.write(f"[launcher] {what}: stopped torchrun and its workers "
                     f"({killed} needed SIGKILL); nothing is left running. Logs: {lp.run_dir}\n")
    return None


def _failure_error(lp: _LaunchPlan, pump: _OutputPump, returncodes: dict[int, int],
                   wall_time_s: float) -> tuple[LaunchError, RunRecord, Outcome]:
    """The ``LaunchError`` of a job where some agent exited non-zero, its run.json (not yet written) and its outcome
    for the live view: the rank that failed first (or torchrun's own failure, explained), and where the stopped
    ranks were (in the error and run.json; the view's box says it in its own lines)."""
    spec, script, nproc = lp.spec, lp.script, lp.plan.nproc_per_node
    failed = [node for node in lp.nodes if returncodes[node] != 0]
    returncode = returncodes[failed[0]]
    failures = [(node, f) for node in failed if (f := find_root_cause(
        "\n".join(pump.node_transcripts[node]), lp.node_log_dir(node), pump.printer)) is not None]

    def first_failed(item: tuple[int, RankFailure]) -> tuple[bool, int]:
        # Across nodes the rank that failed first wrote the earliest error file; one without a
        # traceback (a rank killed by a signal, or an agent whose rendezvous failed) comes last.
        node, f = item
        error_file = last_attempt_error_files(lp.node_log_dir(node)).get((f.rank or 0) % nproc)
        return not f.traceback, error_file.stat().st_mtime_ns if error_file else 2**63

    failure = min(failures, key=first_failed, default=(None, None))[1]
    if failure is not None and failure.rank is not None:
        summary = f"{script.name} failed on rank {failure.rank} (exit code {failure.exit_code})"
    else:
        where = f" (node {failed[0]})" if spec.nnodes > 1 else ""
        summary = f"{script.name} failed: torchrun{where} exited with code {returncode}"
        reason = explain_agent_failure("\n".join(pump.transcript), spec, lp.nodes, port=command_port(lp.command))
        summary += f": {reason}" if reason else ""
    outcome = Outcome(RunStatus.FAILED, wall_time_s, summary)
    # The other ranks' stacks, printed when torchrun stopped them (faulthandler on SIGTERM): after a
    # collective timeout the failing rank is the one that waited, and these show where the culprit was.
    stacks = stopped_ranks_stacks(pump.ranked, lp.run_dir / "logs", one_node=spec.nnodes == 1,
                                  failed_rank=failure.rank if failure else None)
    where = {rank: innermost_frame(stack) for rank, stack in stacks.items()}
    if where:
        summary += "; when stopped: " + "; ".join(f"rank {rank} was in {place}" for rank, place in sorted(where.items()))
    record = RunRecord(RunStatus.FAILED, wall_time_s, **lp.shape, returncode=returncode, summary=summary, where=where)
    error = LaunchError(summary, run_dir=lp.run_dir, command=lp.command, returncode=returncode, failure=failure,
                        output_tail=pump.transcript[-30:], stacks=stacks)
    return error, record, outcome


def _outcome(job: _RunningJob, returncodes: dict[int, int], wall_time_s: float) -> LaunchResult:
    """The ``LaunchResult`` of a job that exited; raises its ``LaunchError`` if an agent failed."""
    lp, view = job.lp, job.view
    view.add(job.metrics_tail.read_new())
    if any(returncodes[node] != 0 for node in lp.nodes):
        error, record, outcome = _failure_error(lp, job.pump, returncodes, wall_time_s)
        safe_draw(view.finish, job.sampler.rss_samples, outcome)
        record.write(lp.run_dir)
        safe_draw(view.fail, error)  # the live view names the rank, the cause and the logs
        raise error
    safe_draw(view.finish, job.sampler.rss_samples, Outcome(RunStatus.FINISHED, wall_time_s))
    RunRecord(RunStatus.FINISHED, wall_time_s, **lp.shape, returncode=0).write(lp.run_dir)
    return LaunchResult(run_dir=lp.run_dir, command=lp.command, returncode=0, wall_time_s=wall_time_s, plan=lp.plan)


def launch(spec: LaunchSpec) -> LaunchResult:
    """Run ``spec.script`` under torchrun and wait for it, streaming output and a live view.

    Args:
        spec: the ``LaunchSpec``.

    Returns:
        ``LaunchResult`` of the successful run.

    Raises:
        ConfigError: bad spec, before anything is started.
        LaunchError: a rank failed (``.rank``, ``.exit_code``, ``.failure.traceback`` from torchrun's
            error file, ``.failure.log_tail``) or torchrun failed.
        LaunchTimeout: the job exceeded ``spec.timeout_s``; it names the last step of every rank and,
            before stopping the job, asks every rank for its Python stack (``.stacks``, ``.where``).
        KeyboardInterrupt: re-raised after the job was stopped (a kernel interrupt).
        In every case no process of the job survives.
    """
    lp = _plan_launch(spec)
    view = make_view(spec.live, run_dir=lp.run_dir)
    printer = ThrottledPrinter(stream=view.log_stream, max_lines_per_s=spec.max_output_lines_per_s,
                               log_name=str(lp.run_dir / "output.log"),
                               keeps_full_tracebacks=view.log_stream is not None)  # the widget view's output area
    pump = _OutputPump(spec, lp.run_dir, lp.nodes, printer, open(lp.run_dir / "output.log", "w"))
    job = _RunningJob(lp, pump, view)
    try:
        returncodes = job.wait()
    except BaseException as exc:
        error = _stop_job(job, exc)
        if error is not None:
            raise error from None
        raise
    finally:
        job.close()
        lp.store = None  # closes the rendezvous store (and its socket) once every agent is gone
    return _outcome(job, returncodes, job.elapsed())


def run_script(name: str, args: Sequence[object] = (), *, runs_dir: str | os.PathLike | None = None,
               label: str | None = None, **spec: object) -> LaunchResult:
    """Write the shipped script ``name`` into a fresh run directory and launch it: the notebooks' one-liner.

    Args:
        name: a script from ``available_scripts()``.
        args: the script's arguments.
        runs_dir: parent of the run directory (``None``: ``default_runs_root()``).
        label: run directory label (default: ``name``).
        **spec: any other ``LaunchSpec`` field (``nproc_per_node``, ``device``, ``timeout_s``, ``env``, ...).

    Returns and raises as ``launch``; a bad spec, or arguments the script's own ``parse_args`` rejects,
    raise ``ConfigError`` before anything is started (the new run directory then holds only the script).
    """
    run_dir = new_run_dir(label or name, runs_dir)
    script = write_script(name, run_dir)
    launch_spec = LaunchSpec(script, args=args, **spec)
    launch_spec.validate()
    check_script_args(script, launch_spec.args)
    return launch(launch_spec)


def run_in_process(name: str, args: Sequence[object] = (), *, runs_dir: str | os.PathLike | None = None,
                   label: str | None = None, device: str = "cpu", num_threads: int | None = 1) -> LaunchResult:
    """Run the shipped script ``name`` as one process, inside this Python process, without torchrun.

    What ``python NAME.py ARGS`` would do (a world of one: the scripts join no process group when
    ``RANK`` is unset), minus the ~5 s a launch spends starting torchrun and importing torch in new
    processes. Use it for per-process effects measured on many variants (fp16 underflow, a loss
    scaler's skipped steps, the speed of a matmul in bf16); use ``run_script`` for anything that
    involves ranks. The script runs with the run directory as working directory, so its
    ``metrics/`` land there exactly as in a launch; its printed lines go to ``output.log`` and to
    this cell; ``command.txt`` holds the equivalent ``python NAME.py ...`` command.

    This process outlives the run, so two things differ from a fresh ``python`` process. A script that
    makes a world of one (FSDP needs a process group even alone) gets ``--backend gloo``, also on
    CUDA (gloo moves CUDA tensors through host memory): NCCL would start its communicators and
    watchdog thread inside the notebook's kernel and keep them after the run, and a hang or abort
    there takes the kernel with it. And this process's CUDA context stays, with the allocator's
    cache and peak statistics: before each run, when CUDA is initialised here, the cache is
    emptied and the peak statistics are reset, so ``torch.cuda.max_memory_allocated`` /
    ``max_memory_reserved`` measure this run only.

    Args:
        name: a script from ``available_scripts()``.
        args: the script's arguments (checked by the script's ``parse_args`` first).
        runs_dir: parent of the run directory (``None``: ``default_runs_root()``).
        label: run directory label (default: ``name``).
        device: ``"cpu"`` or ``"cuda"``; passed as the script's ``--device`` when it has that flag and
            ``args`` do not set it (``cuda`` runs on GPU 0). Scripts with a ``--backend`` flag get
            ``--backend gloo`` on either device.
        num_threads: torch's intra-op CPU threads while the script runs (``torch.set_num_threads``);
            1, like every rank under torchrun (``OMP_NUM_THREADS=1``); ``None`` keeps this process's.

    Returns:
        A ``LaunchResult`` with ``plan.nproc_per_node == 1`` and ``plan.backend == "gloo"``;
        ``metrics()`` reads rank 0's lines.

    Raises:
        ConfigError: unknown script, bad arguments, ``device`` not ``cpu``/``cuda`` (or ``cuda``
            without a GPU), ``args`` asking for ``--backend nccl``, or this process is itself a rank
            of a job (``RANK`` set, or a process group already initialised): the script would then
            try to join it.
        Exception: whatever the script raises (its traceback is the script's own).
    """
    argv = _in_process_argv(name, args, device, num_threads)
    plan = resolve_device(device, 1, backend="gloo")
    run_dir = new_run_dir(label or name, runs_dir)
    script = write_script(name, run_dir)
    source = script.read_text()
    if "--device" not in argv and '"--device"' in source:  # scripts that pick their device
        argv += ["--device", plan.device]
    if not any(a.startswith("--backend") for a in argv) and '"--backend"' in source:  # scripts that make a world of one
        argv += ["--backend", plan.backend]
    module = check_script_args(script, argv)  # the script, imported once: checked here, run below
    command = [sys.executable, script.name, *argv]
    (run_dir / "command.txt").write_text(f"# run in the notebook's process, equivalent to:\ncd {shlex.quote(str(run_dir))}\n"
                                         + shlex.join(["python", *command[1:]]) + "\n")
    wall_time_s = _run_main_here(module, [str(script), *argv], run_dir, plan, num_threads)
    return LaunchResult(run_dir=run_dir, command=command, returncode=0, wall_time_s=wall_time_s, plan=plan)


def _in_process_argv(name: str, args: Sequence[object], device: str, num_threads: int | None) -> list[str]:
    """``args`` as strings, once this process may run ``name`` (``run_in_process``'s checks); raises ``ConfigError``."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}: use 'cpu' or 'cuda'")
    if "RANK" in os.environ:
        raise ConfigError(f"RANK={os.environ['RANK']!r} is set in this process: run_in_process would make {name}.py "
                          "join that job's process group; use run_script, or unset RANK")
    import torch.distributed as dist  # only here: launching alone never imports torch in this process

    if dist.is_available() and dist.is_initialized():
        raise ConfigError("this process already has a torch.distributed process group; the script would use it. "
                          "Use run_script, or call dist.destroy_process_group() first")
    if num_threads is not None:
        check_positive_int("num_threads", num_threads)
    argv = [str(a) for a in args]
    if "--backend=nccl" in argv or any(a == "--backend" and b == "nccl" for a, b in zip(argv, argv[1:])):
        raise ConfigError(f"{name}: --backend nccl inside this process: run_in_process runs no NCCL in the notebook's "
                          "kernel (its communicators and watchdog would outlive the run); drop the flag (gloo is "
                          "used), or launch the script with run_script")
    return argv


def _run_main_here(module, argv: list[str], run_dir: Path, plan: DevicePlan, num_threads: int | None) -> float:
    """Run ``module.main()`` with ``sys.argv = argv`` in ``run_dir``, its printed lines in ``output.log`` and then this
    cell; write run.json and restore argv, working directory and threads. Returns the wall time; raises
    ``ConfigError`` if the script exited with an error code, or what the script raised."""
    import torch

    output = io.StringIO()
    if torch.cuda.is_initialized():  # an earlier run's cached blocks and peaks would count in this run's numbers
        torch.cuda.empty_cache()
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
    saved_argv, saved_cwd, saved_threads = sys.argv, os.getcwd(), torch.get_num_threads()
    start = time.monotonic()
    status, error = RunStatus.FAILED, None
    try:
        sys.argv = argv
        os.chdir(run_dir)
        torch.set_num_threads(num_threads or saved_threads)
        with contextlib.redirect_stdout(output), warnings.catch_warnings():
            # @record enables faulthandler on sys.stderr, which in some hosts (pytest's capture) has no file
            # descriptor: torch then warns; the run itself is unaffected.
            warnings.filterwarnings("ignore", "Unable to enable fault handler", UserWarning)
            module.main()
        status = RunStatus.FINISHED
    except SystemExit as e:  # a script's own usage error or message
        if e.code not in (0, None):
            error = ConfigError(f"{Path(argv[0]).name} exited with {e.code!r}")
        else:
            status = RunStatus.FINISHED
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        torch.set_num_threads(saved_threads)
        wall_time_s = time.monotonic() - start
        (run_dir / "output.log").write_text(output.getvalue())
        RunRecord(status, wall_time_s, device=plan.device, returncode=0 if status == RunStatus.FINISHED else None,
                  in_process=True).write(run_dir)
        sys.stdout.write(output.getvalue())
    if error is not None:
        raise error
    return wall_time_s
