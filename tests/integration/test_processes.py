"""The job's process tree, followed through forks and execs (real processes, no launch)."""

import psutil

from tutorial_lib.launcher.processes import ProcessTree


def test_a_rank_first_seen_between_fork_and_exec_is_recognised_after_its_exec(tmp_path):
    """Under load the tree can see torchrun's child before it execs (no RANK yet): it must not stay rank-less,
    or that rank is never sampled and never asked for its stack (both seen in CI)."""
    import subprocess
    import sys
    import time

    go, execd = tmp_path / "go", tmp_path / "execd"
    after_exec = f"import pathlib, time; pathlib.Path({str(execd)!r}).touch(); time.sleep(60)"
    code = (f"import os, sys, time\npid = os.fork()\nif pid == 0:\n    while not os.path.exists({str(go)!r}):\n"
            f"        time.sleep(0.05)\n    os.execve(sys.executable, [sys.executable, '-c', {after_exec!r}], "
            "dict(os.environ, RANK='3'))\nos.waitpid(pid, 0)\n")
    root = subprocess.Popen([sys.executable, "-c", code])
    try:
        tree = ProcessTree(root.pid)
        guard = time.monotonic() + 120  # against a broken fixture only, not a speed assumption
        while not tree.refresh():  # the forked child, before its exec: the state we need
            assert root.poll() is None and time.monotonic() < guard
            time.sleep(0.05)
        assert [w.rank for w in tree.refresh().values()] == [None]
        go.touch()
        while not execd.exists():
            assert root.poll() is None and time.monotonic() < guard
            time.sleep(0.05)
        assert [w.rank for w in tree.refresh().values()] == [3]
        assert list(tree.rank_processes()) == [3]
    finally:
        for child in psutil.Process(root.pid).children(recursive=True):
            child.kill()
        root.kill()
        root.wait()


