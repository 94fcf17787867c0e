"""tutorial_lib/child/rank_runner.py: every rank's script runs exactly as ``python SCRIPT ARGS`` would, then leaves cleanly.

Each case runs the same little script both ways, as plain ``python`` and through the runner, and compares exit
code, stdout and stderr. The rest: stacks on SIGTERM, death with the parent, and a learner's own DDP script
launched through the library.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

import tutorial_lib as tl
from tutorial_lib.launcher.plan import RANK_RUNNER

CASES = {
    "finishes": ("import sys, atexit\natexit.register(lambda: print('atexit ran'))\n"
                 "print(__name__, sys.argv[1:], sys.path[0] == __import__('os').path.dirname(__file__))\n", 0),
    "sys.exit(3)": ("import sys\nprint('before')\nsys.exit(3)\n", 3),
    "sys.exit(message)": ("import sys\nsys.exit('a message for stderr')\n", 1),
    "raises": ("def f():\n    raise ValueError('bad batch shape')\nf()\n", 1),
    # every lesson's ending: os._exit skips atexit handlers in both; the runner still records the code and leaves
    "os._exit(5)": ("import atexit, os, sys\natexit.register(lambda: print('atexit ran'))\nprint('before')\n"
                    "sys.stdout.flush()\nos._exit(5)\n", 5),
    "argparse error": ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--n', type=int)\n"
                       "p.parse_args()\n", 2),
}


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("case", CASES)
def test_the_runner_behaves_exactly_like_python(tmp_path, case):
    source, code = CASES[case]
    script = tmp_path / "learner.py"
    script.write_text(source)
    args = ["--n", "x"] if case == "argparse error" else ["a", "b"]
    plain = run([sys.executable, str(script), *args], cwd=tmp_path)
    ran = run([sys.executable, str(RANK_RUNNER), str(script), *args], cwd=tmp_path)
    assert plain.returncode == code
    assert (ran.returncode, ran.stdout) == (plain.returncode, plain.stdout)
    # Tracebacks name the runner's frames in between; the last line (the exception) is the same.
    assert ran.stderr.strip().splitlines()[-1:] == plain.stderr.strip().splitlines()[-1:]
    if case == "os._exit(5)":
        assert plain.stdout == "before\n"
    if case == "finishes":
        assert plain.stdout == "__main__ ['a', 'b'] True\natexit ran\n"


def test_what_the_script_leaves_is_not_freed_before_the_exit(tmp_path):
    """Its namespace and an uncaught exception's frames stay referenced until os._exit: freeing a DDP model after
    destroy_process_group() runs ~ProcessGroupGloo with the GIL held, which can deadlock with a gloo worker that
    needs the GIL (torch 2.13; see rank_runner.run). A finalizer shows whether the script's object was freed."""
    script = tmp_path / "leaves.py"
    script.write_text("import argparse, sys, weakref\nkept = argparse.Namespace()\n"
                      "weakref.finalize(kept, print, 'freed', flush=True).atexit = False\n"
                      "if sys.argv[1:] == ['raise']:\n    raise ValueError('at the end')\nprint('returned', flush=True)\n")
    ran = run([sys.executable, str(RANK_RUNNER), str(script)], cwd=tmp_path)
    assert (ran.returncode, ran.stdout) == (0, "returned\n")
    ran = run([sys.executable, str(RANK_RUNNER), str(script), "raise"], cwd=tmp_path)
    assert (ran.returncode, ran.stdout) == (1, "") and "ValueError: at the end" in ran.stderr


def test_a_program_running_a_lesson_inside_its_own_goes_on_after_the_lessons_os_exit(tmp_path):
    """Every lesson ends with os._exit(0); under the runner that ends the lesson as sys.exit(0) would, so a program
    that runs it with runpy (an exercise check's interrupted_once.py) goes on and ends with its own code. Plain
    python would end the whole process at the lesson's os._exit: the one place the runner differs, on purpose."""
    (tmp_path / "lesson.py").write_text("import os, sys\nprint('lesson done')\nsys.stdout.flush()\nos._exit(0)\n")
    (tmp_path / "wrapper.py").write_text("import runpy, sys\ntry:\n"
                                         "    runpy.run_path('lesson.py', run_name='__main__')\n"
                                         "except SystemExit as e:\n    print('lesson exit', e.code)\nsys.exit(75)\n")
    ran = run([sys.executable, str(RANK_RUNNER), str(tmp_path / "wrapper.py")], cwd=tmp_path)
    assert (ran.returncode, ran.stdout) == (75, "lesson done\nlesson exit 0\n"), ran.stderr
    plain = run([sys.executable, str(tmp_path / "wrapper.py")], cwd=tmp_path)
    assert (plain.returncode, plain.stdout) == (0, "lesson done\n")


def test_a_script_without_arguments_is_a_usage_error():
    ran = run([sys.executable, str(RANK_RUNNER)])
    assert ran.returncode == 2 and "usage: python rank_runner.py SCRIPT" in ran.stderr


def test_sigterm_prints_the_stack_then_terminates_as_before(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(textwrap.dedent("""
        import time
        def inject_failure():
            print("asleep", flush=True)
            time.sleep(600)
        inject_failure()
    """))
    proc = subprocess.Popen([sys.executable, str(RANK_RUNNER), str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "asleep\n"  # the state we need, not a number of seconds
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, "the default action still ends the process"
    assert "Current thread 0x" in stderr and "in inject_failure" in stderr  # line 4 or 5: print or sleep


def test_a_rank_dies_with_its_parent(tmp_path):
    """torchrun killed outright (SIGKILL, no chance to stop its workers): the runner's rank dies too."""
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, {str(RANK_RUNNER)!r}, {str(script)!r}], stdout=sys.stdout)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    rank = psutil.Process(int(parent.stdout.readline()))
    parent.kill()
    parent.wait(timeout=30)
    gone, alive = psutil.wait_procs([rank], timeout=30)
    assert rank in gone or rank.status() == psutil.STATUS_ZOMBIE, "the rank outlived its parent"


@pytest.mark.integration
def test_a_learners_plain_ddp_script_runs_through_the_launcher(run_root):
    """A script as a learner writes it (the seeds' ending: destroy_process_group() and return): no workaround."""
    run_dir = tl.new_run_dir("learner", run_root)
    script = run_dir / "learner_ddp.py"
    script.write_text(textwrap.dedent("""
        import os, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(20):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"rank {dist.get_rank()} done", flush=True)
        dist.destroy_process_group()
    """))
    result = tl.launch(tl.LaunchSpec(script, device="cpu", live="off", timeout_s=120))
    log = (result.run_dir / "output.log").read_text()
    assert result.returncode == 0 and "[rank 0] rank 0 done" in log and "[rank 1] rank 1 done" in log
    assert "rank_runner.py" in (result.run_dir / "command.txt").read_text(), "command.txt reruns it the same way"


def test_destroyed_process_groups_stay_referenced_until_the_exit(tmp_path):
    """destroy_process_group() keeps the group object (its backend shut down as usual) until os._exit, so no
    ~ProcessGroupGloo runs when a script's main() frees its DDP model (the deadlock in rank_runner.run). The runner
    imports no torch itself: the patch lands when the script imports torch.distributed, whichever way it names it."""
    script = tmp_path / "groups.py"
    script.write_text(textwrap.dedent("""
        import sys
        print("torch" in sys.modules, flush=True)
        import torch.distributed as dist
        from torch.distributed import destroy_process_group
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        world = dist.group.WORLD
        destroy_process_group()
        print(dist.is_initialized(), destroy_process_group is dist.destroy_process_group, flush=True)
        kept = destroy_process_group.__globals__["_KEPT"]  # the runner's list (its module runs as __main__)
        print(any(g is world for g in kept), flush=True)
    """))
    ran = run([sys.executable, str(RANK_RUNNER), str(script)], cwd=tmp_path)
    assert (ran.returncode, ran.stdout) == (0, "False\nFalse True\nTrue\n"), ran.stderr


@pytest.mark.integration
@pytest.mark.parametrize("start", ["warm", "cold"])
def test_a_ddp_script_that_frees_its_model_as_main_returns_does_not_hang(run_root, start):
    """torch 2.13's gloo teardown deadlock (rank_runner.run): warm, with torch._dynamo preloaded as it is now, this
    script hung in 19 of 40 runs before destroyed groups were kept; 10 warm launches here, none may time out. Cold
    (the same runner, no preloaded modules) it was never seen to hang: 4 launches, a guard for the runner's cold path
    (10 took 74 s of CI's 46 minutes)."""
    source = textwrap.dedent("""
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main():
            dist.init_process_group("gloo")
            model = DDP(torch.nn.Linear(64, 64))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(5):
                optimizer.zero_grad()
                model(torch.randn(8, 64)).sum().backward()
                optimizer.step()
            dist.destroy_process_group()

        main()
    """)
    for _ in range(10 if start == "warm" else 4):
        script = tl.new_run_dir("frees-model", run_root) / "main_ddp.py"
        script.write_text(source)
        tl.launch(tl.LaunchSpec(script, device="cpu", live="off", timeout_s=120, warm=start == "warm"))
