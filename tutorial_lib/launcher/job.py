"""Start a planned launch and watch it: the rendezvous, ``command.txt``, the torchrun agents, their output readers,
the memory sampler, the limits, the stack dump, and the stop that leaves no process behind.

``RunningJob(plan, view, printer)`` is a local launch as the one run loop drives it (``interface.Job``); its
``start`` is the start step: everything a ``LaunchPlan`` leaves undone (it picks the port, hosts the rendezvous store
for simulated nodes, writes ``command.txt``, asks the warm-start helper, starts each node's agent) happens there and
nowhere before. Everything a job holds is its own: launches from several threads at once each
get their own run directory, port, output and limits.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import shlex
import signal
import socket
import subprocess
import threading
import time
from datetime import timedelta

import psutil

from ..child.protocol import SOCKET_ENV, set_parent_death_signal
from ..diagnosis.causes import CauseId, agent_failure
from ..errors import ConfigError
from ..i18n import Message, _, render
from ..probes.ports import free_port
from ..runs.metrics import JsonlTail
from ..runs.printed_metrics import PrintedMetricsWriter, compile_loss_pattern
from ..runs.rundir import COMMAND_TXT, METRICS_SUBDIR, OUTPUT_LOG
from ..torchrun.formats import STACK_LINE
from ..torchrun.output_lines import torchrun_output
from . import warm
from .environment import rank_env
from .interface import Job, LimitReached, Stopped
from .live import safe_draw
from .output import OutputPump, ThrottledPrinter
from .plan import LOOPBACK, RANK_RUNNER, LaunchPlan, command_port
from .processes import ProcessTree
from .sampler import MemorySampler
from .spec import already_launched

log = logging.getLogger(__name__)

STACK_DUMP_SIGNAL = signal.SIGUSR1
STACK_DUMP_WAIT_S = 10.0  # the longest wait for every rank's stack; ends 0.5 s after the last rank answered
PORT_RETRIES = 2  # new ports a launch tries when the one it picked was taken before torchrun bound it


def host_rendezvous(plan: LaunchPlan) -> tuple[object, int]:
    """The rendezvous store (simulated nodes only, else ``None``) and its port: ``spec.master_port``, or a free one."""
    spec = plan.spec
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


def write_command_txt(plan: LaunchPlan, commands: dict[int, list[str]], again: bool = False) -> None:
    """Write ``command.txt``, never over one that exists (a second launch into the same run directory is refused),
    unless ``again``: this launch's own, rewritten when it starts again on a new port (``RunningJob.wait``).

    Raises:
        ConfigError: the run directory already holds a launch, or cannot be written.
    """
    try:
        with open(plan.run_dir / COMMAND_TXT, "w" if again else "x") as f:
            f.write(plan.command_txt(commands))
    except FileExistsError:
        raise ConfigError(already_launched(plan.run_dir)) from None
    except OSError as e:
        raise ConfigError(f"run_dir {str(plan.run_dir)!r} is not a writable directory ({e.strerror})") from None


def start_commands(plan: LaunchPlan, commands: dict[int, list[str]], printer: ThrottledPrinter,
                   wait_s: float) -> tuple[dict[int, tuple[list[str], dict[str, str]]], str]:
    """Each node's command and environment as started, and how: ``"warm"`` (forked from this process's warm-start
    helper, waiting for it at most ``wait_s``) or ``"cold"``. ``command.txt`` keeps the cold form, the one to copy
    to a cluster."""
    cold = {node: (commands[node], dict(plan.node_envs[node])) for node in plan.nodes}
    if not plan.warm:
        return cold, "cold"
    env = plan.node_envs[plan.nodes[0]]
    sources = warm.env_sources(env, plan.spec.env, rank_env())
    started_for = Message(warm.STARTED_FOR_LAUNCH, {"run_dir": plan.run_dir})
    socket_path, reason = warm.warm_path(env, wait_s=wait_s, sources=sources, started_for=started_for)
    if socket_path is None:
        if warm.say_once(reason):
            printer.note(render(Message("warm start off ({reason}): torchrun and the ranks start cold, importing "
                                        "torch each", {"reason": reason})))
        return cold, "cold"
    return {node: (warm.warm_command(commands[node], RANK_RUNNER), {**plan.node_envs[node], SOCKET_ENV: socket_path})
            for node in plan.nodes}, "warm"


def _reader(stream, out: queue.Queue, node: int = 0) -> None:
    """Put each line of ``node``'s torchrun output (its own lines: the ranks' are in their files) on ``out``."""
    for raw in iter(stream.readline, b""):
        out.put((node, raw.decode("utf-8", errors="replace").rstrip("\r\n")))
    out.put((node, None))


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


def limit_reached(spec, elapsed: float, progress_at: float | None) -> str | None:
    """The limit the job has gone past ``elapsed`` s after its start (``"timeout_s"`` or ``"stall_timeout_s"``), or
    ``None``; ``progress_at``: when a rank last logged a metrics line (``None``: none yet, no stall possible)."""
    if elapsed > spec.timeout_s:
        return "timeout_s"
    if spec.stall_timeout_s and progress_at is not None and elapsed - progress_at > spec.stall_timeout_s:
        return "stall_timeout_s"
    return None


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


class RunningJob(Job):
    """A launch on this machine (``interface.Job``): the torchrun agents (one per node), their process tree, output
    readers and memory sampler.

    Attributes:
        plan: the ``LaunchPlan``.
        pump: the job's ``OutputPump`` (once started).
        commands: each node's torchrun argv (cold form); ``command``: the first node's.
        started_as: ``"warm"`` or ``"cold"``: how the agents and ranks were started.
    """

    def __init__(self, plan: LaunchPlan, view, printer: ThrottledPrinter) -> None:
        self.plan, self.view, self.printer = plan, view, printer
        self.procs: dict[int, subprocess.Popen] = {}
        self.started_at = time.monotonic()

    def start(self) -> None:
        """The start step: host the rendezvous, write ``command.txt``, open ``output.log``, and start every node's
        agent (warm or cold) with its output readers and the memory sampler.

        Raises:
            ConfigError: ``command.txt`` could not be written (nothing was started).
        """
        self.started_at, self.port_retries = time.monotonic(), 0
        self._start_agents(again=False)

    def _start_agents(self, again: bool) -> None:
        """Pick the port and start every node's agent; ``again``: a relaunch of this same launch on a new port
        (``wait``), which rewrites ``command.txt`` with it and goes on writing ``output.log``."""
        plan = self.plan
        store, port = host_rendezvous(plan)
        commands = plan.commands(port)
        write_command_txt(plan, commands, again=again)
        pump = OutputPump(plan.spec.nnodes, plan.run_dir, plan.nodes, self.printer,
                          open(plan.run_dir / OUTPUT_LOG, "a" if again else "w"),
                          log_dirs={node: plan.node_log_dir(node) for node in plan.nodes})
        if not again:
            safe_draw(self.view.start)
        procs: dict[int, subprocess.Popen] = {}
        try:
            starts, start = start_commands(plan, commands, self.printer, wait_s=plan.spec.timeout_s)
            for node in plan.nodes:
                procs[node] = subprocess.Popen(
                    starts[node][0], cwd=plan.cwd, env=starts[node][1], stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                    # The kernel killed outright: SIGKILL, not SIGTERM. Seen here: torchrun SIGTERMed while its kernel
                    # died stopped its ranks, then hung at exit joining its tee threads (never told to stop; it ran
                    # with --tee 3 then), an orphan for good. Its ranks die with it all the same (the rank runner's own
                    # PDEATHSIG). The signal fires when the thread that starts the agent ends: this one, which waits
                    # for the job until every agent is gone (launch returns, or raises, only then), so never while it
                    # runs.
                    preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL),
                )
        except BaseException:
            for proc in procs.values():
                ProcessTree(proc.pid).stop(proc, plan.spec.shutdown_grace_s)
            pump.close()
            raise
        self._watch(pump, procs, commands, start, store)

    def _watch(self, pump: OutputPump, procs: dict[int, subprocess.Popen], commands: dict[int, list[str]],
               start: str, store: object) -> None:
        """Hold what ``start`` started and start watching it: the readers of each agent's output, the sampler."""
        plan = self.plan
        self.pump = pump
        self.commands, self.command, self.started_as = commands, commands[plan.nodes[0]], start
        self.store = store  # simulated nodes: the rendezvous store, hosted here until every agent is gone
        self.metrics_tail = JsonlTail(plan.run_dir / METRICS_SUBDIR, "rank*.jsonl")
        # Loss points from the ranks' printed lines (a script of your own): drawn while no metrics JSON has come.
        self.printed = PrintedMetricsWriter(plan.run_dir, compile_loss_pattern(plan.spec.loss_pattern))
        self.printed_from = 0  # pump.ranked[printed_from:] is not read for losses yet
        self.wrote_json = False
        self.tree = ProcessTree(*(proc.pid for proc in procs.values()))
        # The job's GPUs, numbered as its ranks see them (simulated nodes: node n's cuda:i is the job's n * nproc + i).
        self.sampler = MemorySampler(self.tree, plan.run_dir, hz=plan.spec.sample_memory_hz,
                                     sample_gpus=plan.device_plan.device == "cuda", env=plan.job_env)
        self.sampler.start()
        self.readers = [threading.Thread(target=_reader, args=(proc.stdout, pump.lines, node),
                                         name=f"tutorial_lib-reader-{node}", daemon=True)
                        for node, proc in procs.items()]
        for reader in self.readers:
            reader.start()
        self.procs = procs  # started: from here on the loop stops and closes it
        log.info("launched %s (pids %s) in %s", shlex.join(self.command), [p.pid for p in procs.values()],
                 plan.run_dir)

    @property
    def started(self) -> bool:
        """Whether every node's agent was started."""
        return bool(self.procs)

    @property
    def rss_samples(self) -> list:
        """The memory sampler's RSS samples (the view's last figure)."""
        return self.sampler.rss_samples

    @property
    def loss_pattern(self):
        """The ``loss_pattern`` the ranks' printed lines were read with."""
        return self.plan.spec.loss_pattern

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def read_records(self) -> list[dict]:
        """The step records that arrived since the last call: the metrics JSON the ranks wrote, or, for a script that
        has written none, the loss points read from the lines they printed (``PrintedMetricsWriter``; both kinds are
        kept in ``metrics/``)."""
        records = self.metrics_tail.read_new()
        self.wrote_json = self.wrote_json or bool(records)
        ranked, elapsed = self.pump.ranked, self.elapsed()
        printed = [r for rank, text in ranked[self.printed_from:]
                   if (r := self.printed.take(rank, text, elapsed)) is not None]
        self.printed_from = len(ranked)
        return records if self.wrote_json else printed

    def wait(self) -> dict[int, int]:
        """Pump output and update the view until every agent exited and its output is read; the return codes.

        A port the launcher picked (``master_port=None``) can be taken by another process between the pick and
        torchrun's bind of it (``free_port``): torchrun then exits with EADDRINUSE before any rank started. That
        launch is started again on a new free port, at most ``PORT_RETRIES`` times (``port_taken_before_start``);
        a port the caller named is never replaced. torch's own distributed tests do the same
        (``torch.testing._internal.common_utils.retry_on_connect_failures``); torchrun's static rendezvous takes no
        socket bound in advance, which would close the gap instead.

        Raises ``LimitReached`` past a limit (``limit_reached``)."""
        while True:
            returncodes = self._wait_agents()
            if not self.port_taken_before_start(returncodes):
                return returncodes
            taken = command_port(self.command)
            self._release_attempt()
            self.procs, self.port_retries = {}, self.port_retries + 1
            self._start_agents(again=True)
            note = _("port {taken}, picked as free, was taken by another process before torchrun bound it "
                     "(EADDRINUSE): torchrun started again on port {port} (retry {n} of {most}), before any rank ran",
                     taken=taken, port=command_port(self.command), n=self.port_retries, most=PORT_RETRIES)
            self.printer.note(note)
            self.pump.output_log.write(f"[launcher] {note}\n")  # not in the transcript: the doctor reads torchrun's

    def port_taken_before_start(self, returncodes: dict[int, int]) -> bool:
        """Whether the attempt that just ended is one ``wait`` starts again: one node, its port picked here (not the
        caller's ``master_port``), retries left, every agent failed, no rank wrote a line, and torchrun's own
        output says the port was in use (the doctor's ``CauseId.PORT_IN_USE``)."""
        spec = self.plan.spec
        if spec.master_port is not None or spec.nnodes > 1 or self.port_retries >= PORT_RETRIES:
            return False
        if any(code == 0 for code in returncodes.values()) or any(rank is not None for rank, text in self.pump.ranked):
            return False
        cause = agent_failure(torchrun_output("\n".join(self.pump.transcript)))
        return cause is not None and cause.id == CauseId.PORT_IN_USE

    def _release_attempt(self) -> None:
        """Stop sampling, kill leftovers, read the attempt's last lines (torchrun's, and the ranks' files to their
        end), close its log, files and pipes: the end of every attempt (``close``, and ``wait`` before it starts
        again)."""
        self.sampler.stop()
        self.tree.kill_leftovers()  # e.g. a worker's own child processes orphaned by a crash
        for reader in self.readers:
            reader.join(timeout=5)
        self.pump.read_lines(0)  # lines that arrived after the loop ended
        self.pump.read_rank_logs(final=True)  # nothing of the job runs any more: the ranks' files are complete
        self.pump.close()
        for proc in self.procs.values():
            if proc.stdout:
                proc.stdout.close()

    def _wait_agents(self) -> dict[int, int]:
        """``wait`` for one attempt: until its agents exited and their output is read."""
        last_view, progress_at, exited_at = 0.0, None, None
        while self.pump.open_streams or any(proc.poll() is None for proc in self.procs.values()):
            self.pump.read_lines(0.1)
            elapsed = self.elapsed()
            if elapsed - last_view >= 0.25:
                last_view = elapsed
                new_records = self.read_records()
                if new_records:
                    progress_at = elapsed
                self.view.add(new_records)
                safe_draw(self.view.update, elapsed, self.sampler.rss_samples)
            if limit := limit_reached(self.plan.spec, elapsed, progress_at):
                raise LimitReached(limit)
            if self.pump.open_streams and all(proc.poll() is not None for proc in self.procs.values()):
                exited_at = exited_at or elapsed
                if elapsed - exited_at > 2.0:  # torchrun is gone but orphans still hold the pipe open
                    self.tree.kill_leftovers()
        return {node: proc.wait() for node, proc in self.procs.items()}

    def dump_stacks(self) -> dict[int, str]:
        """Ask every rank that catches SIGUSR1 (faulthandler) for its Python stack; collect what they print."""
        targets = {rank: proc for rank, proc in self.tree.rank_processes().items()
                   if catches_signal(proc.pid, STACK_DUMP_SIGNAL)}
        ranked = self.pump.ranked
        mark = len(ranked)
        for proc in targets.values():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(STACK_DUMP_SIGNAL)
        deadline = time.monotonic() + (STACK_DUMP_WAIT_S if targets else 0)
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            if self.pump.read_lines(0.1):
                quiet_since = time.monotonic()
            answered = {rank for rank, text in ranked[mark:]
                        if rank is not None and text.startswith(("Current", "Thread"))}
            if answered >= set(targets) and time.monotonic() - quiet_since > 0.5:
                break
        stacks: dict[int, list[str]] = {}
        for rank, text in ranked[mark:]:
            if rank in targets and STACK_LINE.match(text):
                stacks.setdefault(rank, []).append(text)
        return {rank: "\n".join(text).strip("\n") for rank, text in sorted(stacks.items())}

    def stop(self, ask_for_stacks: bool) -> Stopped:
        """Stop the whole job (after asking its ranks for their stacks if ``ask_for_stacks``): the ranks that were
        still running, their stacks, the first agent's exit code and how many processes needed SIGKILL. A second
        interrupt waits until the end."""
        ranks_running = self.tree.ranks_alive()
        stacks = {}
        if ask_for_stacks:
            with sigint_deferred():
                stacks = self.dump_stacks()
        with sigint_deferred():  # a second interrupt must not cut the cleanup short
            killed = self.tree.stop(list(self.procs.values()), self.plan.spec.shutdown_grace_s)
            self.pump.read_rank_logs(final=True)  # every rank is gone: what they printed as they stopped, to the end
        return Stopped(ranks_running, stacks, self.procs[self.plan.nodes[0]].returncode,
                       f"stopped torchrun and its workers ({killed} needed SIGKILL); nothing is left running")

    def close(self) -> None:
        """On every path: stop sampling, kill leftovers, read the last lines (torchrun's, and the ranks' files to their
        end), close the log, the files, the pipes and the rendezvous store. Nothing to do if it never started."""
        if not self.procs:
            return
        self._release_attempt()
        self.pump.finish()
        self.store = None  # closes the rendezvous store (and its socket) once every agent is gone
