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
* ``faulthandler`` prints every thread's Python stack on SIGUSR1 (the launcher asks for it before it stops a
  job that hangs) and on SIGTERM (torchrun stops the other ranks with it when one fails), then SIGTERM
  terminates as before: after a collective timeout the rank that caused it shows where it was.
* On Linux the rank dies with torchrun (``PR_SET_PDEATHSIG``): a killed launcher leaves no orphan rank.

Standard library only, and it imports nothing of ``tutorial_lib`` (whose ``__init__`` would cost every rank
seconds): torchrun starts it by its path.
"""

import atexit
import ctypes
import faulthandler
import os
import runpy
import signal
import sys

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass
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


def _script_frames(tb):
    """The traceback from the script's first frame on: without this file's and runpy's, as ``python`` prints it."""
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        tb = tb.tb_next
    return tb


def run(argv: list[str]) -> int:
    """Run ``argv[0]`` as ``__main__`` with ``argv`` as ``sys.argv``; the exit status ``python`` would give."""
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt as e:
        sys.excepthook(type(e), e, _script_frames(e.__traceback__))
        code = -int(signal.SIGINT)
    except BaseException as e:  # noqa: BLE001 - what the interpreter prints for an uncaught exception
        sys.excepthook(type(e), e, _script_frames(e.__traceback__))  # torch.distributed's hook adds "[rankN]:"
        code = 1
    atexit._run_exitfuncs()  # what the interpreter runs before its teardown
    return code


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python rank_runner.py SCRIPT [ARGS...]", file=sys.stderr)
        os._exit(2)
    _die_with_parent()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    code = run(sys.argv[1:])
    _flush()
    if code == -int(signal.SIGINT):  # an uncaught KeyboardInterrupt ends the process by SIGINT, as python does
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
