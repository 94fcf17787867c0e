"""What the kernel and the programs it runs in other processes (``rank_runner.py``, ``warm_start.py``) agree on.

One file for both sides, so the copies cannot drift: the package imports it as ``tutorial_lib.child.protocol``;
the programs in this folder run by their path, in processes that must not import the package (its ``__init__``
would cost every rank seconds), and load it by its path under a private module name (their ``load_sibling``, one
copy in each, held equal by a test). Standard library only.

* the parent-death signal (``set_parent_death_signal``);
* the marks the rank runner puts on a line a rank redraws with carriage returns (``REDRAWN_END``, ...), which the
  launcher's output reader turns back into the line's latest state;
* the record of which rank a torchrun rank folder holds (``RANK_RECORD``), which the launcher's output reader reads,
  and of how a rank's script ended (``EXIT_RECORD``), which the root-cause reader reads;
* the variable that turns the observer on (``OBSERVE_ENV``: ``observer.py`` records what each rank did);
* the warm-start helper's socket variable, its ``ready`` line, its pid registry and its folder;
* which environment variables Python or torch read at start-up (a child forked from the helper would not see a
  changed value: such a job goes cold).
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def _find_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


# Looked up once, here: ``set_parent_death_signal`` runs in a child between fork and exec (``preexec_fn``), where
# a ``dlopen`` could wait forever for a loader lock another thread of the kernel held at the fork.
_prctl = _find_prctl()


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent *thread* ends (``PR_SET_PDEATHSIG``).

    The thread, not the process: a process started from a thread that then ends gets ``sig`` while its parent
    process lives on. So it suits a child whose starter waits for it (torchrun waits for its ranks, the launching
    thread for torchrun, the warm-start helper for the children it forks); the helper itself, which outlives the
    thread that started it, watches a pipe instead (``tutorial_lib.launcher.warm``). A no-op without ``prctl``.
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


# A line a rank redraws with carriage returns (``\r`` not followed by ``\n``: a tqdm progress bar) reaches the rank's
# log, which the launcher reads as text line by line (as torchrun's ``--tee`` does), where a bare ``\r`` ends a line
# (``tutorial_lib.torchrun.rank_logs``): 50 updates would read as 50 printed lines. The rank runner
# writes each ``\r`` as ``REDRAWN_END`` + newline, starts the text written next with ``REDRAW_START`` and puts
# ``REDRAW_DONE`` before the newline that ends the line. A terminal draws them as it draws ``\r`` (column 1; next
# line, cursor up; erase the rest of the line); the launcher shows the line's latest state.
REDRAWN_END, REDRAW_START, REDRAW_DONE = "\x1b[G", "\x1b[A", "\x1b[K"

# How a rank's script ended, written by the rank runner as it leaves (``{"rank": 1, "local_rank": 1, "exit_code": 0,
# "time_ns": ...}``) next to torchrun's error file for that rank (the folder of ``$TORCHELASTIC_ERROR_FILE``): torchrun
# reports no rank that exits 0, and only the failures it saw first. A rank killed by a signal writes none.
EXIT_RECORD = "exit.json"

# Set by the launcher for a launch with ``observe=True``: the folder where each rank's observer (``observer.py``,
# started by the rank runner) writes its record. Unset (every other launch), the runner never loads the observer. Not
# a start-up variable: a warm-started rank reads it as it starts its script, so warm and cold starts observe alike.
OBSERVE_ENV = "TUTORIAL_LIB_OBSERVE"

# Which rank a torchrun rank folder holds (``{"rank": 3, "local_rank": 1}``), written by the rank runner before the
# script runs, in the same folder. torchrun names the folder by local rank; on several nodes the global rank comes
# from the rendezvous, and the launcher reads it here to attribute the lines of the folder's ``stdout.log`` and
# ``stderr.log`` (``tutorial_lib.torchrun.rank_logs``). Written before the script runs: its lines come after it.
RANK_RECORD = "rank.json"

# The warm-start helper: the kernel starts ``python warm_start.py serve SOCKET_PATH``, which prints ``READY_LINE``
# once it has imported torch; clients (``python warm_start.py run ARGV``) find it through ``SOCKET_ENV``.
SOCKET_ENV = "TUTORIAL_LIB_WARM_SOCKET"
READY_LINE = b"ready"
CLIENT_COMMAND = "run"

# Read by Python, the C libraries or torch when the interpreter or torch starts, so a child forked from the helper
# would not see a changed value: a request whose value differs from the helper's goes cold. ``TORCH_*`` counts
# unless known to be read later (RUNTIME_ENV_PREFIXES) or re-applied in the child (APPLIED_IN_CHILD).
# So do TORCHDYNAMO_* and TORCHINDUCTOR_*: the helper's preload imports torch._dynamo, which reads them into its
# configs at import; except TORCHINDUCTOR_CACHE_DIR, read each time inductor looks for its cache (the kernel's own
# inductor sets it in the kernel's environment the first time it compiles: 04 does). Those configs read a few
# more that no lesson sets and that are not compared (CXX, PT2_COMPILE_ID_PREFIX, AOT_*, INDUCTOR_*, ...).
STARTUP_ENV_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "MALLOC_", "TORCH_",
                        "PYTORCH_", "CUDA_MODULE_LOADING", "TORCHDYNAMO_", "TORCHINDUCTOR_")
RUNTIME_ENV_PREFIXES = ("TORCH_ELASTIC_", "TORCH_NCCL_", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
                        "TORCHINDUCTOR_CACHE_DIR")
# Read at start-up too, but applied in the child: torchrun sets OMP_NUM_THREADS=1 for every rank (torch's thread
# count), and ``import torch.distributed`` reads TORCH_DISTRIBUTED_DEBUG (c10d's debug level).
APPLIED_IN_CHILD = ("OMP_NUM_THREADS", "TORCH_DISTRIBUTED_DEBUG")


def startup_env(env) -> dict[str, str]:
    """The variables of ``env`` that Python or torch read at start-up (see ``STARTUP_ENV_PREFIXES``)."""
    return {k: v for k, v in env.items() if k.startswith(STARTUP_ENV_PREFIXES) and k not in APPLIED_IN_CHILD
            and not k.startswith(RUNTIME_ENV_PREFIXES)}


def is_warm_client(cmdline: list[str]) -> bool:
    """Whether ``cmdline`` is a warm-start client's: ``python [-u] .../warm_start.py run ...``."""
    return any(a.endswith("warm_start.py") and cmdline[i + 1:i + 2] == [CLIENT_COMMAND]
               for i, a in enumerate(cmdline[1:4], start=1))


def registry_path(socket_path: str, client_pid: int) -> str:
    """Where the helper records the pid it forked for client ``client_pid`` (the file holds that pid)."""
    return os.path.join(os.path.dirname(socket_path), "pids", str(client_pid))


def forked_pid(socket_path: str, client_pid: int) -> int | None:
    """The pid the helper at ``socket_path`` forked for the client ``client_pid``, if it did (and still runs)."""
    try:
        with open(registry_path(socket_path, client_pid)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def remove_folder(socket_path: str) -> None:
    """Remove the helper's folder: its socket, its pid registry, the folder itself (what is gone already is fine)."""
    folder = os.path.dirname(socket_path)
    pids = os.path.join(folder, "pids")
    for name in os.listdir(pids) if os.path.isdir(pids) else ():
        unlink(os.path.join(pids, name))
    unlink(socket_path)
    for target in (pids, folder):
        try:
            os.rmdir(target)
        except OSError:
            pass


def unlink(path: str) -> None:
    """Remove ``path``; a file that is gone already is fine."""
    try:
        os.unlink(path)
    except OSError:
        pass

