"""Run one rank's script exactly as ``python SCRIPT ARGS`` would, then leave the interpreter cleanly.

    python rank_runner.py SCRIPT [ARGS...]      # what torchrun starts for each rank of a tutorial_lib launch

The launcher puts this file in front of every script it launches (torchrun then runs ``python -u
rank_runner.py SCRIPT ARGS`` per rank), so a learner's own script gets what the lesson scripts would
otherwise each need to write themselves:

* The script runs as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]`` and the script's folder first on
  ``sys.path`` (``runpy.run_path``): the same as ``python SCRIPT ARGS``. Its exit status is the interpreter's: 0,
  the ``SystemExit`` code, or 1 with the traceback printed for an uncaught exception; ``atexit`` handlers run.
* Then it leaves with ``os._exit`` after flushing Python's and C's stdio buffers, skipping the interpreter's
  teardown: there a gloo thread can abort the process (``terminate called without an active exception``,
  SIGABRT) even after ``destroy_process_group()``, in about 4-12% of runs on CPU, and torchrun would report a
  failed job for a script that finished (measured on torch 2.13; see ``../shared/FACTS.md`` of the project).
  Until then what the script left (its namespace, an uncaught exception's frames) is not freed: freeing a DDP
  model there can deadlock in gloo's teardown on torch 2.13 (see ``run``).
* ``faulthandler`` prints every thread's Python stack on a fatal signal (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL:
  ``faulthandler.enable``, which ``@record`` also calls; the rank then dies of the signal as before), on SIGUSR1
  (the launcher asks for it before it stops a job that hangs) and on SIGTERM (torchrun stops the other ranks with
  it when one fails), then SIGTERM terminates as before: after a collective timeout the rank that caused it shows
  where it was, and a native crash shows the Python line that called into it.
* It records which rank it is (``protocol.RANK_RECORD``) in torchrun's folder for the rank before the script runs
  (on several nodes the launcher attributes the folder's logs by it), and how the script ended (its exit code;
  ``protocol.EXIT_RECORD``): torchrun reports no rank that exits 0, and only the failures it sees first.
* An uncaught exception's traceback starts at the script's first frame, as ``python`` prints it (the runner's
  own frames left out).
* With ``$TUTORIAL_LIB_OBSERVE`` set (``LaunchSpec(observe=True)``), the observer (``observer.py``) records what the
  rank did, from torch itself, into ``<that folder>/rank<R>.jsonl``: started before the script, ended after it and its
  ``atexit`` handlers (``run``). Unset, nothing of it is loaded.
* On Linux the rank dies with torchrun (``PR_SET_PDEATHSIG``): a killed launcher leaves no orphan rank.
* A line redrawn with carriage returns (``\\r`` not followed by ``\\n``: a tqdm progress bar) written through
  ``sys.stdout`` or ``sys.stderr`` reaches the rank's log with marks a terminal draws exactly as before (``cat``
  of the log included): each ``\\r`` as ``ESC[G`` + newline (cursor to column 1, next line), the next text
  written after it preceded by ``ESC[A`` (cursor up: back onto the line), and the newline that ends the line
  preceded by ``ESC[K`` (erase the rest of the line). The launcher reads the logs line by line as text, as
  torchrun's ``--tee`` does, where a bare ``\\r`` ends a line (``tutorial_lib.torchrun.rank_logs``), so without the
  marks it could not tell a redrawn line from 50 printed ones; with them, the cell shows each rank's latest state of
  the line (``tutorial_lib.torchrun.tee.Redraws``).
  A bar drawn one line below the cursor (tqdm's ``position=N``: newline, ``\\r``, the bar, cursor up ``ESC[A``) is
  such a line: the cursor-up and the newline that comes back down are left out.
  Bytes written to the streams' ``buffer`` or file descriptor pass unchanged.

Standard library only, and it imports nothing of ``tutorial_lib`` (whose ``__init__`` would cost every rank
seconds): torchrun starts it by its path.
"""

import atexit
import ctypes
import faulthandler
import functools
import importlib.abc
import importlib.util
import io
import json
import os
import re
import runpy
import signal
import sys
import threading
import time


def load_sibling(name: str):
    """The program ``<name>.py`` of this folder as a module named ``_tutorial_lib_child_<name>``, loaded once per
    process: by its path, since this program runs where the package must not be imported, and under a private name,
    so it never shadows a learner's own module of that name. ``warm_start.py`` has the same function (a test)."""
    module_name = f"_tutorial_lib_child_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            module_name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


protocol = load_sibling("protocol")  # what the launcher and this runner agree on: the redraw marks, the death signal
_BREAKS = re.compile(r"(\r\n|\r|\n|\x1b\[A)")
_CURSOR_UP = "\x1b[A"


class RedrawMarkingStream(io.TextIOWrapper):
    """A text stream that marks the lines redrawn with ``\\r`` (see the module docstring)."""

    _redrawing = False  # a \r was written since the last newline
    _start_pending = False  # the next text written starts a redraw
    _up = False  # the cursor went up from the redrawn line (ESC[A), to come back down with the next newline

    def write(self, text):
        if not isinstance(text, str) or not (self._redrawing or "\r" in text):
            return super().write(text)
        out = []
        for part in _BREAKS.split(text):
            if part == _CURSOR_UP:  # tqdm's position=N: down a line (\n), \r, the bar, back up (ESC[A)
                self._up = True
            elif part in ("\n", "\r\n") and self._up:
                self._up = False  # back down onto the redrawn line: the next \r redraws it
            elif part == "\r":
                self._up = False
                out.append(protocol.REDRAWN_END + "\n")
                self._redrawing = self._start_pending = True
            elif part in ("\n", "\r\n"):
                out.append((protocol.REDRAW_DONE if self._redrawing else "") + part)
                self._redrawing = self._start_pending = False
            elif part:
                self._up = False
                out.append((protocol.REDRAW_START if self._start_pending else "") + part)
                self._start_pending = False
        super().write("".join(out))
        return len(text)


def _mark_redraws(stream):
    """``stream`` (``sys.stdout`` or ``sys.stderr``) as a ``RedrawMarkingStream`` on the same buffer; unchanged
    if it has no buffer. The original stays referenced as ``sys.__stdout__``/``sys.__stderr__`` (its buffer open)."""
    if not isinstance(stream, io.TextIOWrapper):
        return stream
    return RedrawMarkingStream(stream.buffer, encoding=stream.encoding, errors=stream.errors, newline="\n",
                                line_buffering=stream.line_buffering, write_through=stream.write_through)


def _die_with_parent() -> None:
    protocol.set_parent_death_signal(signal.SIGKILL)  # its parent is torchrun's agent, which waits for it
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # C stdio too (NCCL's INFO lines, block-buffered into a file)
    except (OSError, AttributeError):
        pass


def _cut(e: BaseException):
    """``(exception, traceback)`` for ``sys.excepthook``, both from the script's first frame (``_script_frames``):
    the default hook prints the exception's own ``__traceback__``, torch.distributed's the one it is given."""
    tb = _script_frames(e.__traceback__)
    return e.with_traceback(tb), tb


def _script_frames(tb):
    """The traceback from the script's first frame on: without this file's and runpy's, as ``python`` prints it."""
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        tb = tb.tb_next
    return tb


# What the script left behind (its namespace; an uncaught exception with its frames) and every process group
# ``destroy_process_group`` let go of, referenced until os._exit.
_KEPT: list = []
_C10D = "torch.distributed.distributed_c10d"


def _keep_destroyed_groups(c10d) -> None:
    """Make ``destroy_process_group()`` (every group: a script's end) keep a reference to the groups it destroys,
    until ``os._exit``.

    The groups are destroyed as before (removed from torch's maps, their backends shut down); only the objects
    stay referenced, so no ``~ProcessGroupGloo`` runs before the exit, wherever the script frees its model:
    freeing a DDP model (its ``Reducer`` holds the group) after ``destroy_process_group()`` can otherwise deadlock
    on torch 2.13 (see ``run``), in a script's own ``def main()`` too. A kept gloo group holds about 3 threads and
    5 file descriptors, so ``destroy_process_group(group)`` of one group (a script that makes and drops many
    subgroups) frees it as usual."""
    if getattr(c10d.destroy_process_group, "_keeps_groups", False):
        return
    destroy = c10d.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(group=None):
        if group is None or group is c10d.GroupMember.WORLD:  # a script's end: every group now, the default too
            _KEPT.extend(c10d._world.pg_map)
        return destroy(group)

    destroy_process_group._keeps_groups = True
    c10d.destroy_process_group = destroy_process_group
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "destroy_process_group", None) is destroy:
        dist.destroy_process_group = destroy_process_group


class _OnC10dImport(importlib.abc.MetaPathFinder):
    """Applies ``_keep_destroyed_groups`` as soon as the script's ``import torch.distributed`` has executed
    ``distributed_c10d`` (before ``torch.distributed`` copies its names), so this runner imports no torch itself."""

    def find_spec(self, name, path=None, target=None):
        if name != _C10D:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                _keep_destroyed_groups(module)

            spec.loader.exec_module = exec_module
        return spec


def _watch_process_groups() -> None:
    """``_keep_destroyed_groups`` now if torch.distributed is imported (the warm-start helper preloads it), else
    once the script imports it."""
    if _C10D in sys.modules:
        _keep_destroyed_groups(sys.modules[_C10D])
    elif not any(isinstance(f, _OnC10dImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnC10dImport())


class _ScriptLeft(SystemExit):
    """The script called ``os._exit(code)`` in its main thread (``_exit_for_the_script``): a ``SystemExit``, so a
    program that runs a script inside its own (``runpy``, as exercise checks do) goes on after it as after
    ``sys.exit(code)``."""


def _exit_for_the_script(exit_process):
    """``os._exit`` as the script sees it: in this process's main thread it ends the script with its code, as
    ``python`` would (no ``atexit`` handlers), and ``run`` returns that code, so the runner still records how the
    script ended and leaves itself; elsewhere (another thread, a forked child) it is ``exit_process``, unchanged.
    Every lesson script ends with ``os._exit(0)`` after its last flush (the gloo abort at teardown, above)."""
    pid, thread = os.getpid(), threading.get_ident()

    @functools.wraps(exit_process)
    def _exit(code):
        if os.getpid() == pid and threading.get_ident() == thread:
            raise _ScriptLeft(code)
        exit_process(code)

    return _exit


def run(argv: list[str], observer=None) -> int:
    """Run ``argv`` as ``python ARGV`` would: ``[SCRIPT, *ARGS]`` or ``["-m", MODULE, *ARGS]`` as ``__main__``.

    The exit status ``python`` would give: 0, the ``SystemExit`` code (1 with the message on stderr for a
    non-integer one), 1 with the traceback printed for an uncaught exception, ``-SIGINT`` for an uncaught
    ``KeyboardInterrupt``; ``atexit`` handlers run, except after the script's own ``os._exit(code)`` (as in
    ``python``; ``_exit_for_the_script``). Shared by this runner and the warm-start helper's children.
    ``observer``: the rank's observer (``_start_observer``), told how the script ended after its ``atexit`` handlers.

    What the script leaves is not freed: its namespace (and an uncaught exception's frames) stays referenced
    until the caller's ``os._exit``. Freeing a DDP model there after ``destroy_process_group()`` drops the last
    reference to the gloo process group inside ``~Reducer``, with the GIL held, and ``~ProcessGroupGloo`` joins
    gloo's worker threads; on torch 2.13 a worker may still be destroying the last backward's all-reduce, whose
    captured thread-local state holds a Python object (autograd's ``context``, stashed for the backward since
    torch 2.13) and waits for the GIL: a deadlock, the rank hangs after its last line (py-spy's native stacks in
    the commit that added this). ``python`` itself frees them only in the teardown this runner skips. A script
    that frees its DDP model itself (``def main(): ...`` returning) would still meet it, so every process group
    ``destroy_process_group`` destroys stays referenced too (``_keep_destroyed_groups``): the last reference to a
    group is then never dropped before ``os._exit``.
    """
    argv = list(argv)
    _watch_process_groups()
    exit_process, os._exit = os._exit, _exit_for_the_script(os._exit)
    run_atexit = True
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            sys.modules.pop(argv[1], None)  # preloaded by the warm-start helper for its imports: run it afresh
            _KEPT.append(runpy.run_module(argv[1], run_name="__main__", alter_sys=True))
        else:
            script = os.path.abspath(argv[0])
            sys.argv = argv
            sys.path[0] = os.path.dirname(script)
            _KEPT.append(runpy.run_path(script, run_name="__main__"))
        code = 0
    except _ScriptLeft as e:  # os._exit(code): no atexit handlers, as in python
        _KEPT.append(e)
        code, run_atexit = e.code, False
    except SystemExit as e:
        _KEPT.append(e)
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt as e:
        _KEPT.append(e)
        sys.excepthook(type(e), *_cut(e))
        code = -int(signal.SIGINT)
    except BaseException as e:  # noqa: BLE001 - what the interpreter prints for an uncaught exception
        _KEPT.append(e)
        # torch.distributed's hook adds "[rankN]:"
        sys.excepthook(type(e), *_cut(e))
        code = 1
    finally:
        os._exit = exit_process
    if run_atexit:
        atexit._run_exitfuncs()  # what the interpreter runs before its teardown
    if observer is not None:
        observer.finish(code)
    return code


def _start_observer(argv: list[str]):
    """The observer of this rank when ``$TUTORIAL_LIB_OBSERVE`` names its folder (``observer.start``), else ``None``.

    Started by ``main`` only, the rank: a warm start runs torchrun's agent through ``run`` too, and its ranks inherit
    the agent's environment. The variable is then taken out of the environment, so the processes the script starts do
    not observe. A record that cannot be opened is said on stderr; the script then runs unobserved (the reader finds
    no record)."""
    folder = os.environ.pop(protocol.OBSERVE_ENV, "")
    if not folder:
        return None
    try:
        return load_sibling("observer").start(folder, argv)
    except (OSError, ValueError) as e:
        print(f"[observer] not observing this rank: no record in {folder} ({e})", file=sys.stderr)
        return None


def leave(code: int) -> None:
    """Flush Python's and C's stdio and end the process with ``run``'s status ``code``, skipping the teardown
    (an uncaught ``KeyboardInterrupt``, ``-SIGINT``, ends it by SIGINT, as ``python`` does)."""
    _flush()
    if code == -int(signal.SIGINT):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _write_record(name: str, **fields) -> None:
    """Write ``{"rank", "local_rank", **fields}`` as ``name`` next to torchrun's error file for this rank (the folder
    of ``$TORCHELASTIC_ERROR_FILE``), whole or not at all (a temporary file, then a rename); nothing outside torchrun
    or without its folder."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    folder = os.path.dirname(error_file)
    if not error_file or not os.path.isdir(folder):
        return
    path = os.path.join(folder, name)
    try:
        record = {"rank": int(os.environ["RANK"]), "local_rank": int(os.environ["LOCAL_RANK"]), **fields}
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
    except (KeyError, ValueError, OSError):
        pass


def record_rank() -> None:
    """Write which rank torchrun's folder for this rank holds (``protocol.RANK_RECORD``: global and local rank), before
    the script runs: on several nodes the launcher reads the global rank of the folder's logs there."""
    _write_record(protocol.RANK_RECORD)


def record_exit(code: int) -> None:
    """Write how the script ended (``protocol.EXIT_RECORD``: global and local rank, exit code, time) next to torchrun's
    error file for this rank, so a rank that finished (torchrun reports none that exit 0) or that torchrun did not
    report is known."""
    _write_record(protocol.EXIT_RECORD, exit_code=code, time_ns=time.time_ns())


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python rank_runner.py SCRIPT [ARGS...]", file=sys.stderr)
        os._exit(2)
    _die_with_parent()
    faulthandler.enable(all_threads=True)  # a fatal signal (SIGSEGV, SIGFPE, SIGABRT, ...) prints the Python stack
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    sys.stdout, sys.stderr = _mark_redraws(sys.stdout), _mark_redraws(sys.stderr)
    record_rank()
    code = run(sys.argv[1:], observer=_start_observer(sys.argv[1:]))
    record_exit(code)
    leave(code)


if __name__ == "__main__":
    main()
