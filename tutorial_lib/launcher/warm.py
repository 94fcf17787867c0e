"""The kernel's side of warm starts: one warm-start helper per kernel, and the warm form of a torchrun command.

``launch`` asks ``warm_path(job_env)`` before it starts a job. The answer is the helper's socket (the job then
runs warm: see ``tutorial_lib/child/warm_start.py`` for how) or the reason it runs cold, which the launcher prints
once per kernel and reason. The helper imports torch and torch._dynamo (3.5-3.9 s here, in a slow hour of
2026-12-01) and lives as long as the kernel (it dies with it, and removes its folder). Importing ``tutorial_lib``
starts nothing: the notebooks' setup call (``tl.setup_notebook``) starts the helper (``prestart``), so it imports
torch while the notebook's next cells run; elsewhere the first warm launch does. A helper no job has used yet is
restarted, not given up, when the first job's start-up environment differs from its own (say ``RANK_ENV`` set a
``TORCH_*`` variable). Cold when:

* ``TUTORIAL_LIB_WARM=0`` (or ``LaunchSpec(warm=False)``);
* not Linux (the client passes file descriptors over a Unix socket and relies on ``PR_SET_PDEATHSIG``);
* the job's start-up environment (``child.protocol.STARTUP_ENV_PREFIXES``: ``PYTHON*``, ``LD_*``, ``OMP_*``
  except ``OMP_NUM_THREADS``, ``TORCH_CPP_*``, ...) differs from the helper's: those are read when Python
  or torch start, so a forked child would not see them. The reason printed (``startup_mismatch``) names, per
  variable, where each side's value came from (the launch's own ``env=``, ``RANK_ENV``, the kernel's environment,
  the launcher's defaults: ``env_sources``) and the launch (or setup call) the helper was started for;
* torch changed on disk since the helper started (a reinstall): the helper is restarted;
* the helper died or did not become ready in time: restarted once, else cold; the job's own ``timeout_s`` also
  bounds its wait.

Launches from several threads share the one helper: starting it, restarting it and handing it out happen under
one lock; any number of them may wait for its ``ready`` line at once, each at most until its own deadline.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from ..child import protocol
from ..errors import ConfigError
from ..i18n import N_, Message, joined

log = logging.getLogger(__name__)

WARM_ENV = "TUTORIAL_LIB_WARM"
WARM_START = Path(__file__).resolve().parent.parent / "child" / "warm_start.py"
READY_TIMEOUT_S = 120.0  # importing torch on a loaded 2-core machine; a cold launch pays the same import


def warm_enabled(requested: bool | None) -> bool:
    """Whether a launch should try the warm path: ``requested`` if given, else ``$TUTORIAL_LIB_WARM`` (default on).

    Raises:
        ConfigError: ``$TUTORIAL_LIB_WARM`` is not ``0``/``1``.
    """
    if requested is not None:
        return bool(requested)
    value = os.environ.get(WARM_ENV, "1").strip().lower()
    if value not in ("0", "1", "false", "true", "off", "on", ""):
        raise ConfigError(f"{WARM_ENV}={value!r}: use 1 (warm starts, the default) or 0 (every launch cold)")
    return value not in ("0", "false", "off")


def _torch_stamp() -> tuple[str, float]:
    spec = importlib.util.find_spec("torch")
    origin = spec.origin if spec and spec.origin else ""
    try:
        return origin, os.stat(origin).st_mtime
    except OSError:
        return origin, 0.0


class WarmHelper:
    """One running ``warm_start.py serve`` process, started with ``python`` and a start-up environment.

    Attributes:
        pid: the helper's process id.
        folder: its folder in the temporary directory (its socket and pid registry), removed when it ends.
        failure: why it failed (it exited, or was not ready within ``READY_TIMEOUT_S``); ``None`` otherwise.
    """

    def __init__(self, python: str, env: dict[str, str], sources: dict[str, Message] | None = None,
                 started_for: Message | None = None) -> None:
        self.python = python
        self.startup_env = protocol.startup_env(env)
        self.sources = dict(sources or {})  # start-up variable -> where it came from (env_sources)
        self.started_for = started_for or Message(STARTED_FOR_UNKNOWN)
        self.torch_stamp = _torch_stamp()
        self.folder = tempfile.mkdtemp(prefix="tutorial_lib-warm-")
        self.socket_path = os.path.join(self.folder, "helper.sock")
        # It ends when its stdin reaches end of file: this process holds the pipe's other end, which closes however
        # this process ends (warm_start.serve). Not a parent-death signal, which fires when the *thread* that started
        # the helper ends: a launch from a thread pool's thread may start it, and the helper (with every job forked
        # from it, another thread's too) then died when that thread ended.
        self.proc = subprocess.Popen(
            [python, "-u", str(WARM_START), "serve", self.socket_path], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid
        self.started_at = time.monotonic()
        self.used = False  # a job was handed it: from then on a different start-up environment runs cold
        self.failure: str | None = None
        self._ready = threading.Event()
        self._reading = threading.RLock()  # one thread reads the helper's output at a time
        self._output = b""

    @property
    def ready(self) -> bool:
        """Whether the helper printed its ``ready`` line (it has imported torch and listens)."""
        return self._ready.is_set()

    def wait_ready(self, wait_s: float = READY_TIMEOUT_S) -> str | None:
        """Wait at most ``wait_s`` for the helper's ``ready`` line; ``None`` once ready, else why not.

        Any number of threads may wait at once: one reads the helper's output (never blocking past its own deadline),
        the others wait for it or for their deadline, whichever comes first. A wait that ends before the helper is
        ready leaves it running for the others; the helper is stopped only when it failed (``failure``: it exited,
        or ``READY_TIMEOUT_S`` passed since it started).
        """
        deadline = time.monotonic() + wait_s
        while not self.ready and self.failure is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._reading.acquire(timeout=remaining):
                break
            try:
                self._read_output(until=min(deadline, self.started_at + READY_TIMEOUT_S))
            finally:
                self._reading.release()
        if self.ready:
            return None
        return self.failure or f"the warm-start helper was not ready within the job's {wait_s:g} s"

    def _read_output(self, until: float) -> None:
        """Read what the helper printed until its ``ready`` line, its end, or ``until``; the caller holds
        ``_reading``. Past the helper's own ``READY_TIMEOUT_S`` it has failed."""
        if self.ready or self.failure is not None:
            return
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while not self.ready:
                timeout = until - time.monotonic()
                if timeout <= 0 or not sel.select(timeout=timeout):
                    break
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                self._output += chunk
                if protocol.READY_LINE in self._output.splitlines():
                    self._ready.set()
                elif not chunk:  # end of file: it exited
                    last = (self._output.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
                    self._fail(f"the warm-start helper did not start ({last})")
                    return
        if not self.ready and time.monotonic() >= self.started_at + READY_TIMEOUT_S:
            self._fail(f"the warm-start helper was not ready after {READY_TIMEOUT_S:g} s")

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self.close()

    def usable_for(self, python: str, env: dict[str, str], sources: dict[str, Message] | None = None
                   ) -> str | Message | None:
        """``None`` if a job with this ``python`` and environment can be forked from this helper, else why not: a
        ``Message`` (``startup_mismatch``) when their start-up variables differ, naming where each came from
        (``sources``: the job's, from ``env_sources``), else a line of text."""
        if self.failure is not None or self.proc.poll() is not None:
            return "the warm-start helper exited"
        if python != self.python:
            return f"the job's Python ({python}) is not the helper's ({self.python})"
        theirs = protocol.startup_env(env)
        if theirs != self.startup_env:
            return startup_mismatch(theirs, sources or {}, self.startup_env, self.sources, self.started_for)
        if _torch_stamp() != self.torch_stamp:
            return "torch changed on disk since the helper started"
        return None

    def close(self) -> None:
        """Stop the helper (its forked children die with it) and remove its folder."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        with self._reading:  # a thread reading its output now sees the end of file and lets go
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe and not pipe.closed:
                    pipe.close()
        protocol.remove_folder(self.socket_path)


# Where a start-up variable of a launch came from (env_sources), and what the helper was started for.
SOURCE_ENV_ARG = N_("the launch's own env=")
SOURCE_RANK_ENV = N_("RANK_ENV (tl.setup_notebook or tl.launcher.environment.set_rank_env)")
SOURCE_KERNEL = N_("the kernel's environment (os.environ)")
SOURCE_LAUNCHER = N_("the launcher's defaults for the device plan")
STARTED_FOR_SETUP = N_("the notebook's setup call (tl.setup_notebook)")
STARTED_FOR_LAUNCH = N_("the launch in {run_dir}")
STARTED_FOR_UNKNOWN = N_("an earlier launch")


def env_sources(env: Mapping[str, str], spec_env: Mapping[str, str] = (), rank_env: Mapping[str, str] = (),
                environ: Mapping[str, str] | None = None) -> dict[str, Message]:
    """Where each start-up variable of a launch's environment ``env`` (``build_env``'s) came from; pure.

    The order is ``build_env``'s, the last that set it wins: the launch's own ``env=`` (``spec_env``), else
    ``RANK_ENV`` (``rank_env``, when its value is the one in ``env``), else the kernel's environment (``environ``,
    default ``os.environ``, same value), else the launcher's defaults for the device plan.

    Returns:
        variable name -> a ``Message`` naming its source (``SOURCE_*``), for the start-up variables of ``env`` only
        (``protocol.startup_env``).
    """
    environ = os.environ if environ is None else environ
    spec_env, rank_env = dict(spec_env), dict(rank_env)
    sources = {}
    for name, value in protocol.startup_env(env).items():
        if name in spec_env:
            sources[name] = Message(SOURCE_ENV_ARG)
        elif rank_env.get(name) == value:
            sources[name] = Message(SOURCE_RANK_ENV)
        elif environ.get(name) == value:
            sources[name] = Message(SOURCE_KERNEL)
        else:
            sources[name] = Message(SOURCE_LAUNCHER)
    return sources


def startup_mismatch(job_env: Mapping[str, str], job_sources: Mapping[str, Message], helper_env: Mapping[str, str],
                     helper_sources: Mapping[str, Message], started_for: Message) -> Message:
    """Why a job runs cold when its start-up variables (``job_env``) differ from a used helper's (``helper_env``):
    per variable, which side set it, from where (``*_sources``, from ``env_sources``; a variable without one is from
    an unknown source), and what to do. Pure; ``started_for``: the launch (or setup call) the helper was started for.
    """
    unknown = Message(STARTED_FOR_UNKNOWN)
    lines = []
    for name in sorted(set(job_env) | set(helper_env)):
        mine, theirs = job_env.get(name), helper_env.get(name)
        if mine == theirs:
            continue
        fields = {"name": name, "value": mine, "helper_value": theirs, "started_for": started_for,
                  "source": job_sources.get(name, unknown), "helper_source": helper_sources.get(name, unknown)}
        if theirs is None:
            lines.append(Message("{name}={value} comes from {source}; the helper, started for {started_for}, "
                                 "does not have it", fields))
        elif mine is None:
            lines.append(Message("{name}={helper_value} is the helper's, from {helper_source} when it was started for "
                                 "{started_for}; this launch does not set it", fields))
        else:
            lines.append(Message("{name}={value} comes from {source}; the helper has {name}={helper_value}, from "
                                 "{helper_source} when it was started for {started_for}", fields))
    return Message("this launch's start-up variables differ from those of the warm-start helper, which an earlier "
                   "launch already uses: {variables}. Python and torch read them when they start, so a rank forked "
                   "from the helper would not see this launch's values. To run warm, give every launch the same "
                   "values (the same env=, e.g. one dict passed to each launch), or restart the kernel",
                   {"variables": joined(lines, "; ")})


_lock = threading.Lock()  # guards _helper and _said: launches from several threads share them
_helper: WarmHelper | None = None
_said: set[str] = set()


def warm_path(env: dict[str, str], python: str | None = None, wait_s: float = READY_TIMEOUT_S,
              sources: Mapping[str, Message] | None = None, started_for: Message | None = None
              ) -> tuple[str | None, str | Message | None]:
    """The helper's socket for a job with environment ``env`` (started or restarted as needed), or ``None`` and
    why the job runs cold. Waits for the helper at most ``wait_s`` (the job's ``timeout_s``; it runs cold after
    that). ``sources``: where each of ``env``'s start-up variables came from (``env_sources``), named when they
    differ from the helper's; ``started_for``: the job, as a helper (re)started for it will name it
    (``STARTED_FOR_LAUNCH``). Linux only; safe to call from several threads at once."""
    python = python or sys.executable
    if not sys.platform.startswith("linux"):
        return None, "warm starts need Linux"
    with _lock:
        helper, reason = _claim(python, env, dict(sources or {}), started_for)
    if helper is None:
        return None, reason
    reason = helper.wait_ready(min(wait_s, READY_TIMEOUT_S))
    if reason is not None:
        return None, reason
    return helper.socket_path, None


def _claim(python: str, env: dict[str, str], sources: dict[str, Message], started_for: Message | None
           ) -> tuple[WarmHelper | None, str | Message | None]:
    """The helper a job with ``python`` and ``env`` is to use, started or restarted as needed, and marked used; or
    ``None`` and why not. The caller holds ``_lock``."""
    global _helper
    if _helper is not None:
        reason = _helper.usable_for(python, env, sources)
        if reason is None:
            _helper.used = True
            return _helper, None
        restart = isinstance(reason, str) and reason.startswith(("the warm-start helper exited", "torch changed"))
        if _helper.used and not restart:
            return None, reason
        _helper.close()
        _helper = None
    try:
        _helper = _start_helper(python, env, sources, started_for)
    except OSError as e:
        return None, f"the warm-start helper could not start ({e})"
    _helper.used = True
    return _helper, None


def _start_helper(python: str, env: dict[str, str], sources: Mapping[str, Message] | None = None,
                  started_for: Message | None = None) -> WarmHelper:
    """A new helper for jobs with environment ``env``: this process's environment with ``env``'s start-up
    variables (and none of this process's own that ``env`` lacks)."""
    helper_env = {k: v for k, v in os.environ.items() if not k.startswith(protocol.STARTUP_ENV_PREFIXES)}
    helper_env.update(protocol.startup_env(env))
    return WarmHelper(python, helper_env, dict(sources or {}), started_for)


def prestart(env: dict[str, str], python: str | None = None, sources: Mapping[str, Message] | None = None) -> bool:
    """Start the helper for jobs with environment ``env`` now, without waiting for it; whether one was started.

    Linux only, and only when there is none yet. The first launch then waits for whatever is left of its start
    (``warm_path``), or restarts it if that job's start-up environment turns out different. ``sources``: where
    each start-up variable of ``env`` came from (``env_sources``; a later cold start names them). Never raises: a
    helper that cannot start is the first launch's to report.
    """
    global _helper
    if not sys.platform.startswith("linux"):
        return False
    with _lock:
        if _helper is not None:
            return False
        try:
            _helper = _start_helper(python or sys.executable, env, sources, Message(STARTED_FOR_SETUP))
        except OSError as e:
            log.info("warm-start helper not prestarted: %s", e)
            return False
    return True


def current_helper() -> WarmHelper | None:
    """This process's warm-start helper, if one was started (and not stopped since)."""
    return _helper


def say_once(reason: str | Message) -> str | Message | None:
    """``reason`` the first time it is given in this kernel (the same English), else ``None`` (the launcher prints
    it once)."""
    with _lock:
        if str(reason) in _said:
            return None
        _said.add(str(reason))
    return reason


def warm_command(command: list[str], rank_runner: str | os.PathLike) -> list[str]:
    """The warm form of a torchrun ``command`` from ``build_command``; pure.

    ``python -m torch.distributed.run ... RANK_RUNNER SCRIPT ARGS`` becomes ``python WARM_START run -m
    torch.distributed.run ... WARM_START run RANK_RUNNER SCRIPT ARGS``: the agent and each rank are forked from
    the helper (torchrun runs ``python -u WARM_START run RANK_RUNNER SCRIPT ARGS`` for each rank).

    Raises:
        ValueError: ``command`` is not of that form.
    """
    rank_runner = str(rank_runner)
    if command[1:3] != ["-m", "torch.distributed.run"] or rank_runner not in command:
        raise ValueError(f"not a torchrun command of build_command: {command[:3]} ... (no {rank_runner})")
    at = command.index(rank_runner)
    return [command[0], str(WARM_START), protocol.CLIENT_COMMAND, *command[1:at], str(WARM_START),
            protocol.CLIENT_COMMAND, *command[at:]]


def shutdown() -> None:
    """Stop this process's helper (tests; it otherwise dies with the process)."""
    global _helper
    with _lock:
        if _helper is not None:
            _helper.close()
            _helper = None
