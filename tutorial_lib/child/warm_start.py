"""Warm starts: a helper process that has imported torch once forks each process of a job on request.

    python warm_start.py serve SOCKET_PATH        # the helper (one per kernel; started by tutorial_lib)
    python warm_start.py run ARGV...              # a client: "run python ARGV", forked from the helper

Every process of a launch pays for ``import torch`` (1.7-2.7 s here, 3-6 s with ``torch.distributed.run``
and DDP, depending on the hour): torchrun's agent once, then every rank. accelerate's ``notebook_launcher``
avoids it by forking the kernel, and pays with a kernel that must never touch CUDA. Here the forking process is a
separate *helper* that the kernel starts once: it imports torch and the modules the lessons use, never
initialises CUDA, never starts a thread of its own, and from then on only forks.

torchrun stays the agent and sees ordinary processes: the launcher starts ``python warm_start.py run -m
torch.distributed.run ...`` instead of ``python -m torch.distributed.run ...``, and torchrun starts ``python
-u warm_start.py run rank_runner.py SCRIPT ARGS`` for each rank. Each client sends the helper its argv,
environment, working folder and stdio (the file descriptors themselves, ``SCM_RIGHTS``); the helper forks a
child that takes all of them and runs the argv as ``python`` would (``-m module`` or a script path). The client
relays the signals it gets to its child and leaves with the child's exit status (an exit code, or the same
signal), so torchrun's error files, exit codes and restarts behave as on the cold path. If the client dies, the
helper kills the child's process group; if the helper dies, its children die with it (``PR_SET_PDEATHSIG``). The
helper itself ends when its standard input reaches end of file: the kernel holds the pipe's other end, which a
process closes however it ends, SIGKILL included. Not a parent-death signal: that fires when the *thread* that
started the process ends, and a kernel may start its helper from a thread of a pool that ends long before the kernel
(the helper then died, and a job still running on it with it).

Any doubt falls back to the cold path: no helper, a refused request (a different Python, or an environment
variable that Python or torch read at start-up differs from the helper's), or an error before the fork; the
client then ``exec``s ``python ARGV`` itself and says nothing (the launcher says once why it went cold).

Standard library only in the client path (it must start in milliseconds); the helper imports torch.
"""

from __future__ import annotations

import array
import gc
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import sys


def load_sibling(name: str):
    """The program ``<name>.py`` of this folder as a module named ``_tutorial_lib_child_<name>``, loaded once per
    process: by its path, since this program runs where the package must not be imported, and under a private name,
    so it never shadows a learner's own module of that name. ``rank_runner.py`` has the same function (a test)."""
    module_name = f"_tutorial_lib_child_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            module_name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


protocol = load_sibling("protocol")  # what the kernel and the helper agree on (socket, pid registry, start-up env)
_HEADER = struct.Struct("!I")
# What the helper imports before it forks: what torchrun's agent and every DDP lesson script import anyway,
# torch._dynamo included: ``DistributedDataParallel.__init__`` imports it in every DDP rank
# (``get_optimize_ddp_mode``; with it DTensor and FSDP, torch 2.8 and 2.13): 0.8 s of each warm rank's start in
# one hour of 2026-12-01 here, 2.2 s of a 2.9 s warm job in a slower one.
# Not torch.distributed.checkpoint, which only the DCP lessons import. History: with torch._dynamo (or DTensor, FSDP
# and DCP) preloaded, a DDP script that frees its model as its ``main()`` returns hung in gloo's teardown deadlock
# in 19 of 40 warm runs (one busy core beside it), against 0 of 20 cold runs; cold runs that import those modules
# before ``init_process_group`` hung too (4 of 8, torch 2.13). The rank runner now keeps every group
# ``destroy_process_group`` destroys referenced until the exit (``rank_runner._keep_destroyed_groups``): 0 of 40
# (2026-12-01, same load). Once, in one CI run with this preload, a forked rank of notebook 01 (JupyterLab test)
# aborted with "malloc(): unsorted double linked list corrupted" in torch.profiler's result parsing. Not seen again
# (2026-12-01, torch 2.13): 370 warm launches of that script's profiled step (half of them beside a busy core),
# 12,000 profiled all-reduces in warm ranks, then, with the helper's garbage frozen and its seeds redrawn in each
# child (``_preload``, ``_child``), 15 runs of notebook 01 in make workbook's kernels and 4 of that JupyterLab test.
PRELOAD = ("torch", "torch.distributed", "torch.distributed.run", "torch.nn.parallel", "torch.utils.data",
           "torch.distributed.elastic.multiprocessing.errors", "torch._dynamo", "argparse", "json", "runpy")
RELAYED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _apply_in_child(env) -> None:
    """What a fresh process would have read at start-up from ``APPLIED_IN_CHILD``: torch's thread count from
    ``OMP_NUM_THREADS`` (as OpenMP would), c10d's debug level from ``TORCH_DISTRIBUTED_DEBUG``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    value = env.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))
    if torch.distributed.is_available():
        torch.distributed.set_debug_level_from_env()


def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(payload)


def _recv(sock: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message (``None`` at end of stream) and the file descriptors that came with it."""
    fds = array.array("i")
    buf = b""
    while len(buf) < _HEADER.size:
        if with_fds and not fds:
            chunk, ancdata, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(with_fds * fds.itemsize))
            for level, kind, data in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        else:
            chunk = sock.recv(4096)
        if not chunk:
            return None, list(fds)
        buf += chunk
    (size,) = _HEADER.unpack(buf[: _HEADER.size])
    buf = buf[_HEADER.size:]
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            return None, list(fds)
        buf += chunk
    return json.loads(buf[:size]), list(fds)


# ---------------------------------------------------------------------------------------------------- client


def _exec_cold(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def _leave_like(status: int) -> None:
    """Exit as a process whose wait status is ``status`` did: the same code, or killed by the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def client(argv: list[str]) -> None:
    """Run ``python ARGV`` forked from the helper at ``$TUTORIAL_LIB_WARM_SOCKET``, else exec it cold."""
    # Its parent waits for it (torchrun's agent for a rank's client; the launching thread, for as long as the job
    # runs, for the agent's client), so the parent thread's death is the parent's.
    protocol.set_parent_death_signal(signal.SIGKILL)
    path = os.environ.get(protocol.SOCKET_ENV)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path or "")
        _send(sock, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "python": sys.executable,
                     "client_pid": os.getpid()}, [0, 1, 2])
        reply, _ = _recv(sock)
    except OSError:
        reply = None
    if not reply or "pid" not in reply:
        sock.close()
        if reply and reply.get("refused"):
            print(f"[warm start] refused ({reply['refused']}): starting cold", file=sys.stderr, flush=True)
        _exec_cold(argv)
    child = reply["pid"]

    def relay(sig, _frame):
        try:
            if sig in (signal.SIGUSR1, signal.SIGUSR2):
                os.kill(child, sig)
            else:  # as torchrun's killpg of a cold worker would: the child's DataLoader workers too
                os.killpg(child, sig)
        except ProcessLookupError:
            pass

    for sig in RELAYED_SIGNALS:
        signal.signal(sig, relay)
    while True:
        try:
            reply, _ = _recv(sock)
            break
        except InterruptedError:
            continue
    if reply is None:  # the helper died; its children died with it
        _leave_like(signal.SIGKILL)
    _leave_like(reply["status"])


# ---------------------------------------------------------------------------------------------------- helper


def _run_as_python(argv: list[str]) -> int:
    """Run ``argv`` as ``python ARGV`` would (``[-u] -m module ...`` or ``[-u] script ...``); the exit status
    (``rank_runner.run``: the runner's own rules, shared)."""
    argv = list(argv)
    while argv and argv[0] == "-u":  # the helper's stdio is already unbuffered
        argv.pop(0)
    return load_sibling("rank_runner").run(argv)


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the requested process, run it, and exit with its status."""
    import random

    os.setsid()
    protocol.set_parent_death_signal(signal.SIGKILL)  # the helper: one thread, which lives as long as it does
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # A fresh process draws its own seeds: Python's, numpy's global generator and torch's default CPU generator
    # (torch seeds it from the OS at start-up; not the CUDA generators, which take a fixed seed when CUDA starts).
    # Python's string hashes cannot be redrawn: every forked process shares the helper's PYTHONHASHSEED.
    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    if "torch" in sys.modules:
        sys.modules["torch"].default_generator.seed()
    _apply_in_child(os.environ)
    load_sibling("rank_runner").leave(_run_as_python(request["argv"]))


def _register(path: str, client_pid: int, pid: int | None) -> None:
    target = protocol.registry_path(path, client_pid)
    if pid is None:
        protocol.unlink(target)
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target + ".tmp", "w") as f:
        f.write(str(pid))
    os.replace(target + ".tmp", target)


def _refusal(request: dict) -> str | None:
    if request.get("python") != sys.executable:
        return f"the job's Python is {request.get('python')}, the helper's {sys.executable}"
    mine, theirs = protocol.startup_env(os.environ), protocol.startup_env(request.get("env", {}))
    changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if changed:
        return "start-up environment differs: " + ", ".join(changed)
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        return "CUDA is initialised in the helper"
    return None


def _end_on_sigterm(path: str) -> None:
    """SIGTERM removes the helper's folder and ends it (its children die with it: their parent-death signal)."""
    helper_pid = os.getpid()

    def leave(sig, _frame):
        if os.getpid() != helper_pid:  # a child forked a moment ago, before it reset the handler: die as it would
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        protocol.remove_folder(path)
        os._exit(128 + sig)

    signal.signal(signal.SIGTERM, leave)


def _preload() -> None:
    """Import ``PRELOAD`` (and the rank runner) in the helper, and leave it ready to fork."""
    import importlib

    # numpy (which ``import torch`` imports when it is installed) sizes OpenBLAS's thread pool once, when it loads,
    # from OPENBLAS_NUM_THREADS or else OMP_NUM_THREADS, and starts it. The helper runs without OMP_NUM_THREADS (a
    # job's is applied in each child), so its children would size their BLAS pool by the core count where a cold
    # rank uses one thread (build_env's, or torchrun's, OMP_NUM_THREADS=1). One, then, and no pool in the helper
    # (OpenBLAS would stop it before each fork anyway). Only while importing: a request is compared with the
    # helper's environment as it was started.
    saved = os.environ.get("OPENBLAS_NUM_THREADS")
    if not saved:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        if saved is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = saved
    load_sibling("rank_runner")  # the children's run and exit
    # What the imports left as garbage is freed here, in the process that made it; what remains is frozen: a
    # child's garbage collector never walks (nor writes the pages of) the ~300,000 objects it inherits (torch 2.13).
    # https://docs.python.org/3/library/gc.html#gc.freeze
    gc.collect()
    gc.freeze()


def _say_ready(path: str) -> None:
    """Print the ready line the kernel waits for; if the kernel ended during the preload (a notebook that failed at
    once), the pipe is closed: remove the folder and end, as on the kernel's end of file."""
    try:
        print(protocol.READY_LINE.decode(), flush=True)
    except BrokenPipeError:
        protocol.remove_folder(path)
        os._exit(0)


def serve(path: str) -> None:
    """The helper: import ``PRELOAD``, listen on the Unix socket ``path``, fork one child per request.

    It ends, removing its folder, on SIGTERM or when its stdin reaches end of file (the kernel is gone: see the module
    docstring); its children die with it (their parent-death signal, SIGKILL: the helper is one thread)."""
    _end_on_sigterm(path)
    _preload()  # a kernel that dies meanwhile is noticed right after (its pipe's end of file waits)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "kernel")
    children: dict[int, socket.socket] = {}  # pid -> client connection
    clients: dict[int, int] = {}  # pid -> client pid
    _say_ready(path)
    while True:
        for key, _ in sel.select():
            if key.data == "accept":
                conn, _ = listener.accept()
                request, fds = _recv(conn, with_fds=3)
                reason = _refusal(request) if request else "empty request"
                if reason or len(fds) != 3:
                    _send(conn, {"refused": reason or "no stdio received"})
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:
                    for fd in (sel, listener, conn, *children.values()):
                        fd.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    _child(request, fds)
                for fd in fds:
                    os.close(fd)
                clients[pid] = int(request.get("client_pid", 0))
                _register(path, clients[pid], pid)
                _send(conn, {"pid": pid})
                children[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
            elif key.data == "wake":
                os.read(wake_r, 4096)
            elif key.data == "kernel":
                if not os.read(key.fd, 4096):  # end of file: the kernel is gone
                    protocol.remove_folder(path)
                    os._exit(0)
            else:  # a client's connection is readable: it died (or closed): kill its child's group
                try:
                    os.killpg(key.data, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                sel.unregister(key.fileobj)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            _register(path, clients.pop(pid, 0), None)
            if conn is not None:
                try:
                    _send(conn, {"status": status})
                except OSError:
                    pass
                try:
                    sel.unregister(conn)
                except (KeyError, ValueError):
                    pass
                conn.close()


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        client(sys.argv[2:])
    else:
        sys.exit("usage: warm_start.py serve SOCKET_PATH | run ARGV...")
