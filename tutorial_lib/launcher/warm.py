"""The kernel's side of warm starts: one warm-start helper per kernel, and the warm form of a torchrun command.

``launch`` asks ``warm_path(job_env)`` before it starts a job. The answer is the helper's socket (the job then
runs warm: see ``tutorial_lib/child/warm_start.py`` for how) or the reason it runs cold, which the launcher prints
once per kernel and reason. The helper imports torch and torch._dynamo (3.5-3.9 s here, in a slow hour of
2026-12-01) and lives as long as the kernel (it dies with it, and removes its folder). In a Jupyter kernel ``import
tutorial_lib`` starts it (``prestart``), so it imports torch while the notebook's first cells run; elsewhere
(a script, pytest) the first warm launch does. A helper no job has used yet is restarted, not given up, when
the first job's start-up environment differs from its own (say ``RANK_ENV`` set a ``TORCH_*`` variable).
Cold when:

* ``TUTORIAL_LIB_WARM=0`` (or ``LaunchSpec(warm=False)``);
* not Linux (the client passes file descriptors over a Unix socket and relies on ``PR_SET_PDEATHSIG``);
* the job's start-up environment (``child.protocol.STARTUP_ENV_PREFIXES``: ``PYTHON*``, ``LD_*``, ``OMP_*``
  except ``OMP_NUM_THREADS``, ``TORCH_CPP_*``, ...) differs from the helper's: those are read when Python
  or torch start, so a forked child would not see them;
* torch changed on disk since the helper started (a reinstall): the helper is restarted;
* the helper died or did not become ready in time: restarted once, else cold.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..child import protocol
from ..errors import ConfigError
from .devices import DevicePlan
from .environment import build_env

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
    """One running ``warm_start.py serve`` process, started with ``python`` and a start-up environment."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        self.python = python
        self.startup_env = protocol.startup_env(env)
        self.torch_stamp = _torch_stamp()
        self.folder = tempfile.mkdtemp(prefix="tutorial_lib-warm-")
        self.socket_path = os.path.join(self.folder, "helper.sock")
        # It ends when its stdin reaches end of file: this process holds the pipe's other end, which closes
        # however this process ends (warm_start.serve). Not a parent-death signal: that fires when the thread that
        # started the helper ends, and a launch from a thread pool's thread starts it (the helper then died, and with
        # it another thread's job, when the first thread ended).
        self.proc = subprocess.Popen(
            [python, "-u", str(WARM_START), "serve", self.socket_path], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.ready = False
        self.used = False  # a job was forked from it: from then on a different start-up environment runs cold

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str | None:
        """Wait for the helper's ``ready`` line; ``None`` when ready, else why not (the helper is then stopped)."""
        if self.ready:
            return None
        deadline = time.monotonic() + timeout_s
        line = b""
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    break
                line = self.proc.stdout.readline()
                if line.strip() == protocol.READY_LINE:
                    self.ready = True
                    return None
                if not line:
                    break
        self.close()
        return f"the warm-start helper did not start ({line.decode(errors='replace').strip() or 'no output'})"

    def usable_for(self, python: str, env: dict[str, str]) -> str | None:
        """``None`` if a job with this ``python`` and environment can be forked from this helper, else why not."""
        if self.proc.poll() is not None:
            return "the warm-start helper exited"
        if python != self.python:
            return f"the job's Python ({python}) is not the helper's ({self.python})"
        theirs = protocol.startup_env(env)
        changed = sorted(k for k in set(theirs) | set(self.startup_env) if theirs.get(k) != self.startup_env.get(k))
        if changed:
            return "the job sets start-up variables the helper was not started with: " + ", ".join(changed)
        if _torch_stamp() != self.torch_stamp:
            return "torch changed on disk since the helper started"
        return None

    def close(self) -> None:
        """Stop the helper (its forked children die with it) and remove its folder."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe:
                pipe.close()
        protocol.remove_folder(self.socket_path)


_helper: WarmHelper | None = None
_said: set[str] = set()


def warm_path(env: dict[str, str], python: str | None = None, wait_s: float = READY_TIMEOUT_S
              ) -> tuple[str | None, str | None]:
    """The helper's socket for a job with environment ``env`` (started or restarted as needed), or ``None`` and
    why the job runs cold. Linux only."""
    global _helper
    python = python or sys.executable
    if not sys.platform.startswith("linux"):
        return None, "warm starts need Linux"
    reason = _helper.usable_for(python, env) if _helper is not None else None
    if _helper is not None and reason is not None:
        restartable = not _helper.used or reason.startswith(("the warm-start helper exited", "torch changed"))
        if not restartable:
            return None, reason
        _helper.close()
        _helper = None
    if _helper is None:
        _helper = _start_helper(python, env)
    reason = _helper.wait_ready(min(wait_s, READY_TIMEOUT_S))
    if reason is not None:
        _helper = None
        return None, reason
    _helper.used = True
    return _helper.socket_path, None


def _start_helper(python: str, env: dict[str, str]) -> WarmHelper:
    """A new helper for jobs with environment ``env``: this process's environment with ``env``'s start-up
    variables (and none of this process's own that ``env`` lacks)."""
    helper_env = {k: v for k, v in os.environ.items() if not k.startswith(protocol.STARTUP_ENV_PREFIXES)}
    helper_env.update(protocol.startup_env(env))
    return WarmHelper(python, helper_env)


def prestart(env: dict[str, str], python: str | None = None) -> bool:
    """Start the helper for jobs with environment ``env`` now, without waiting for it; whether one was started.

    Linux only, and only when there is none yet. The first launch then waits for whatever is left of its start
    (``warm_path``), or restarts it if that job's start-up environment turns out different. Never raises: a
    helper that cannot start is the first launch's to report.
    """
    global _helper
    if _helper is not None or not sys.platform.startswith("linux"):
        return False
    try:
        _helper = _start_helper(python or sys.executable, env)
    except OSError as e:
        log.info("warm-start helper not prestarted: %s", e)
        return False
    return True


def prestart_in_kernel() -> bool:
    """In a Jupyter kernel with warm starts on (the default), start the kernel's helper now; whether one was started.

    ``import tutorial_lib`` calls it first thing, so the helper imports torch while the rest of the library and
    the notebook's first cells load, instead of during the first launch. Its start-up environment is what
    ``build_env`` makes of this process's environment (``set_rank_env`` may still change that: the first launch
    then restarts the unused helper). Outside a kernel, with ``$TUTORIAL_LIB_WARM=0`` or a bad value (the first
    launch reports it), or not on Linux: nothing.
    """
    if "ipykernel" not in sys.modules:  # a script or pytest; checked first: importing IPython costs 0.2 s
        return False
    from IPython import get_ipython

    if not hasattr(get_ipython(), "kernel"):  # a terminal IPython
        return False
    try:
        if not warm_enabled(None):
            return False
    except ConfigError:
        return False
    return prestart(build_env(DevicePlan("cpu", "gloo", 1, 0)))


def say_once(reason: str) -> str | None:
    """``reason`` the first time it is given in this kernel, else ``None`` (the launcher prints it once)."""
    if reason in _said:
        return None
    _said.add(reason)
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
    return [command[0], str(WARM_START), "run", *command[1:at], str(WARM_START), "run", *command[at:]]


def shutdown() -> None:
    """Stop this kernel's helper (tests; it otherwise dies with the kernel)."""
    global _helper
    if _helper is not None:
        _helper.close()
        _helper = None
