"""``torch.multiprocessing`` spawn from the notebook's process, under a wall-clock limit, leaving no process behind.

What a notebook learns from it: ``mp.spawn(worker, nprocs=2)`` starts each child as a fresh Python interpreter (the
``spawn`` start method: CUDA cannot be used in a forked child) that *unpickles* the function it is to run, and
``pickle`` stores a function by reference, as its module and name (``__main__``, ``worker``), never its code. A child
finds ``worker`` by importing that module. In Jupyter the kernel's ``__main__`` is IPython's namespace, which no other
process can import, so every child fails before it runs a line of ``worker``, with ``AttributeError: Can't get
attribute 'worker' on <module '__main__' (built-in)>`` on its stderr (the kernel's: the terminal that started Jupyter,
or, with ipykernel >= 6, the cell), while the notebook gets ``ProcessExitedException: process 0 terminated with exit
code 1``. A script launched by path (``tl.launch``, ``tl.run_script``, ``torchrun``) has a real ``__main__``;
accelerate's ``notebook_launcher`` forks the kernel instead, which CUDA forbids once the kernel has touched it.

``spawn_with_timeout`` runs ``torch.multiprocessing.start_processes`` (what ``mp.spawn`` calls) with ``join=False``
and joins under a limit: whether the children fail, hang or finish, they and their own children are stopped
(SIGTERM, a grace period, SIGKILL) and reaped before it returns, also on a kernel interrupt.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psutil

from ..errors import ConfigError
from ..torchrun.formats import EXCEPTION_LINES
from .processes import is_alive


@dataclass
class SpawnOutcome:
    """What ``spawn_with_timeout`` saw.

    Attributes:
        pids: each child's process id, by process index (``mp.spawn``'s first argument to ``fn``).
        exit_codes: each child's exit code after the cleanup (negative: the signal that ended it, -15 SIGTERM and -9
            SIGKILL being the cleanup's own).
        error: the exception ``torch.multiprocessing`` raised when a child failed (type and message; ``""``: none).
        timed_out: whether the limit was reached with a child still running (it was then stopped).
        left_running: pids of the children and their descendants still alive after the cleanup (``[]`` unless a
            process could not be killed).
        wall_time_s: seconds from the start to the end of the cleanup.
        child_errors: the exception line of each traceback the children printed (``"AttributeError: Can't get
            attribute 'worker' on <module '__main__' (built-in)>"``), in the order they printed them.
        stderr: everything the children wrote to their stderr (kept here, not sent to the kernel's stderr, i.e. the
            terminal that started Jupyter).
    """

    pids: list[int]
    exit_codes: dict[int, int | None]
    error: str = ""
    timed_out: bool = False
    left_running: list[int] = field(default_factory=list)
    wall_time_s: float = 0.0
    child_errors: list[str] = field(default_factory=list)
    stderr: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        """Every child finished with exit code 0 within the limit."""
        return not self.timed_out and not self.error and all(code == 0 for code in self.exit_codes.values())


def spawn_with_timeout(fn: Callable, args: Sequence[object] = (), nprocs: int = 2, timeout_s: float = 60.0,
                       grace_s: float = 3.0) -> SpawnOutcome:
    """``torch.multiprocessing.start_processes(fn, args, nprocs, start_method="spawn")`` joined within ``timeout_s``.

    Each child runs ``fn(i, *args)`` for its index ``i`` (``torch.multiprocessing.spawn``'s contract:
    https://pytorch.org/docs/stable/multiprocessing.html#spawning-subprocesses). When a child fails, torch stops the
    others (and the failure is in ``error``); past ``timeout_s`` every child still running is stopped. Either way every
    child, and every process a child started, is gone when this returns (or raises ``KeyboardInterrupt``).

    Args:
        fn: the function each child runs; it must be picklable by reference (a module-level function of an importable
            module: one defined in a notebook pickles, but no child can find it, which is what a notebook shows).
        args: more arguments for ``fn`` (picklable).
        nprocs: children to start (>= 1).
        timeout_s: wall-clock limit for all of them (seconds, > 0).
        grace_s: how long a child gets between SIGTERM and SIGKILL (seconds, > 0).

    Returns:
        ``SpawnOutcome``: pids, exit codes, the error, whether the limit stopped them, what was left running.

    Raises:
        ConfigError: a bad number, or ``fn``/``args`` that cannot be pickled (checked before any child starts).
    """
    import torch.multiprocessing as mp

    for name, value in (("timeout_s", timeout_s), ("grace_s", grace_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{name} must be a number > 0 (seconds), got {value!r}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ConfigError(f"nprocs must be an integer >= 1, got {nprocs!r}")
    try:  # every child gets the same pickle: a failure here would leave the children started before it running
        pickle.dumps((fn, tuple(args)))
    except Exception as e:  # noqa: BLE001  (pickle raises PicklingError, AttributeError, TypeError, ...)
        raise ConfigError(f"spawn needs a picklable function and arguments: {type(e).__name__}: {e}") from None
    captured = tempfile.TemporaryFile()  # the children's stderr: each inherits this as its fd 2 when it starts
    started = time.monotonic()
    sys.stderr.flush()
    kernel_stderr = os.dup(2)
    os.dup2(captured.fileno(), 2)
    try:
        context = mp.start_processes(fn, args=tuple(args), nprocs=nprocs, join=False, start_method="spawn")
    except BaseException:
        captured.close()
        raise
    finally:
        os.dup2(kernel_stderr, 2)
        os.close(kernel_stderr)
    error, timed_out = "", False
    try:
        while True:
            left = started + timeout_s - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if context.join(timeout=min(left, 0.5), grace_period=grace_s):  # True: all finished with 0
                break
    except Exception as e:  # noqa: BLE001  ProcessExitedException, ProcessRaisedException: a child failed
        error = f"{type(e).__name__}: {e}"
    finally:
        left_running = stop_processes(context.processes, grace_s)
        with captured:
            captured.seek(0)
            stderr = captured.read().decode(errors="replace")
    return SpawnOutcome(pids=[p.pid for p in context.processes],
                        exit_codes={i: p.exitcode for i, p in enumerate(context.processes)}, error=error,
                        timed_out=timed_out, left_running=left_running, wall_time_s=time.monotonic() - started,
                        child_errors=EXCEPTION_LINES.findall(stderr),
                        stderr=stderr)


def stop_processes(processes: Sequence, grace_s: float) -> list[int]:
    """Stop ``multiprocessing`` children and everything they started: SIGTERM, ``grace_s``, SIGKILL, reap.

    Returns the pids still alive afterwards (``[]`` when all are gone)."""
    tree: list[psutil.Process] = []
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(proc.pid)
            tree += parent.children(recursive=True)  # before the parent dies and they are re-parented
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    deadline = time.monotonic() + grace_s
    for proc in processes:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in processes:
        if proc.is_alive():
            proc.kill()
        proc.join()
    _, alive = psutil.wait_procs(tree, timeout=max(0.0, deadline - time.monotonic()))
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return sorted(p.pid for p in tree if is_alive(p)) + [proc.pid for proc in processes if proc.is_alive()]
