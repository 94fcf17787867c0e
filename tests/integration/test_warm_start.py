"""Warm starts (``tutorial_lib.launcher.warm``): the same jobs, outcomes and clean-up as cold starts, and the fallbacks.

The launch tests in ``test_launch.py`` run on both paths too (their ``start_path`` fixture).
"""

import os
import signal
import time

import psutil
import pytest

import tutorial_lib as tl
from tutorial_lib.launcher import warm
from tutorial_lib.child import protocol
from tutorial_lib.launcher.environment import build_env
from tutorial_lib.launcher.plan import RANK_RUNNER
from tutorial_lib.runs.rundir import RunRecord

pytestmark = pytest.mark.integration

METRIC_COLUMNS = ["rank", "step", "loss_local", "loss_global", "grad_norm"]


def test_warm_command_wraps_the_agent_and_each_rank():
    cold = ["/py", "-m", "torch.distributed.run", "--nproc-per-node", "2", str(RANK_RUNNER), "train.py", "--x", "1"]
    hot = warm.warm_command(cold, RANK_RUNNER)
    start = str(warm.WARM_START)
    assert hot == ["/py", start, "run", "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   start, "run", str(RANK_RUNNER), "train.py", "--x", "1"]
    with pytest.raises(ValueError, match="not a torchrun command"):
        warm.warm_command(["/py", "train.py"], RANK_RUNNER)


def test_the_helper_preloads_what_a_ddp_rank_imports_and_counts_what_those_modules_read_at_import():
    import subprocess
    import sys

    code = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); import warm_start; "
            "[importlib.import_module(n) for n in warm_start.PRELOAD]; before = set(sys.modules); "
            "import torch, torch.distributed as dist; "
            "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1); "
            "torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2)); "
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('torch.'))[:10]); "
            "print([m for m in ('torch._inductor.config', 'torch._dynamo.config') if m in sys.modules]); "
            "print('torch.distributed.checkpoint' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(warm.WARM_START.parent)], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "[]", "a forked DDP rank imports nothing more of torch in DDP's constructor (torch._dynamo)"
    assert out[1] == "['torch._inductor.config', 'torch._dynamo.config']"
    assert {"TORCHDYNAMO_", "TORCHINDUCTOR_"} <= set(protocol.STARTUP_ENV_PREFIXES), "read by those configs"
    assert protocol.startup_env({"TORCHINDUCTOR_CACHE_DIR": "/tmp/x", "TORCHINDUCTOR_MAX_AUTOTUNE": "1"}) == {
        "TORCHINDUCTOR_MAX_AUTOTUNE": "1"}, "the cache folder is read when used (the kernel's inductor sets it)"
    assert out[2] == "False", "DCP only where a lesson imports it"


def test_the_preload_never_asks_cuda_anything():
    """A process that called into CUDA (even cudaGetDeviceCount, behind torch.cuda.is_available()) must not fork:
    the children's CUDA would be broken. The helper's imports, torch._dynamo's included, make no such call."""
    import subprocess
    import sys

    code = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); import torch; calls = []\n"
            "def spy(owner, name):\n"
            "    real = getattr(owner, name, None)\n"
            "    if real is not None:\n"
            "        setattr(owner, name, lambda *a, **k: calls.append(name) or real(*a, **k))\n"
            "for name in ('is_available', 'device_count', 'init', '_lazy_init', 'current_device'):\n"
            "    spy(torch.cuda, name)\n"
            "for name in ('_cuda_getDeviceCount', '_cuda_init', '_cuda_isDriverSufficient'):\n"  # CUDA builds
            "    spy(torch._C, name)\n"
            "if sys.argv[2:]: torch.cuda.is_available()\n"  # the probe: a preload that asked
            "import warm_start\n"
            "for n in warm_start.PRELOAD: importlib.import_module(n)\n"
            "print(calls, torch.cuda.is_initialized())")
    def preload(*probe):
        return subprocess.run([sys.executable, "-c", code, str(warm.WARM_START.parent), *probe], capture_output=True,
                              text=True, check=True).stdout.strip()

    assert preload() == "[] False"
    assert preload("probe").startswith("['is_available'"), "the spy sees a call"


def test_warm_starts_are_the_default_and_0_opts_out(monkeypatch):
    monkeypatch.delenv("TUTORIAL_LIB_WARM", raising=False)
    assert warm.warm_enabled(None) is True
    for value, expected in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("TUTORIAL_LIB_WARM", value)
        assert warm.warm_enabled(None) is expected, value
    assert warm.warm_enabled(False) is False and warm.warm_enabled(True) is True


def test_bad_warm_settings_are_refused_before_launch(run_root, monkeypatch):
    script = tl.write_script("ddp_train", tl.new_run_dir("bad", run_root))
    with pytest.raises(tl.ConfigError, match="warm must be True, False or None"):
        tl.launch(tl.LaunchSpec(script, device="cpu", warm="yes"))
    monkeypatch.setenv("TUTORIAL_LIB_WARM", "maybe")
    with pytest.raises(tl.ConfigError, match="TUTORIAL_LIB_WARM='maybe'"):
        tl.launch(tl.LaunchSpec(script, device="cpu"))
    assert not (script.parent / "output.log").exists(), "nothing was started"


def _metrics(result):
    m = result.metrics()
    return m[[c for c in METRIC_COLUMNS if c in m]].sort_values(["rank", "step"]).reset_index(drop=True)


def test_warm_and_cold_runs_give_bitwise_equal_metrics_and_the_warm_one_is_forked(run_root):
    args = ["--max-steps", 8, "--log-every", 4]
    cold = tl.run_script("ddp_train", args, runs_dir=run_root, device="cpu", live="off", warm=False)
    hot = tl.run_script("ddp_train", args, runs_dir=run_root, device="cpu", live="off", warm=True)
    assert RunRecord.read(cold.run_dir).start == "cold" and RunRecord.read(hot.run_dir).start == "warm"
    assert _metrics(hot).equals(_metrics(cold)), "the same losses and gradient norms, bit for bit"
    # The forked ranks are sampled under their ranks: test_memory_sampling (a job this short can end unsampled).
    helper = psutil.Process(warm.current_helper().pid)
    assert helper.is_running() and "serve" in helper.cmdline()


def test_the_helper_runs_one_thread_and_each_forked_rank_draws_its_own_seeds(run_root, monkeypatch, request):
    """The helper starts no thread pool (numpy's OpenBLAS would size one by the core count, where a cold rank's is
    one thread) and none survives a fork; the ranks it forks do not share the random state it had, and none walks
    the objects it inherits (``gc.freeze``). An empty OPENBLAS_NUM_THREADS is a value like any other."""
    warm.shutdown()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "")
    request.addfinalizer(warm.shutdown)  # a helper started with it would send every later test's jobs cold
    assert warm.prestart(build_env(tl.resolve_device("cpu", 2))) and warm.current_helper().wait_ready() is None
    helper = psutil.Process(warm.current_helper().pid)
    assert helper.num_threads() == 1, "before its first fork"
    draws = {}
    for start in ("warm", "cold"):
        script = tl.new_run_dir("draws", run_root) / "draws.py"
        script.write_text("import gc, os, random, numpy, torch\n"
                          "print('DRAWS', os.environ['RANK'], random.random(), numpy.random.random(), "
                          "gc.get_freeze_count() > 0, torch.initial_seed(), flush=True)\n")
        result = tl.launch(tl.LaunchSpec(script, device="cpu", live="off", timeout_s=120, warm=start == "warm"))
        output = (result.run_dir / "output.log").read_text()
        assert RunRecord.read(result.run_dir).start == start and "refused" not in output, output
        lines = [line.split("DRAWS ", 1)[1].split() for line in output.splitlines() if "DRAWS " in line]
        draws[start] = {rank: rest for rank, *rest in lines}
        assert sorted(draws[start]) == ["0", "1"]
    assert warm.current_helper().pid == helper.pid and helper.num_threads() == 1, "after its forks"
    for start, ranks in draws.items():
        assert ranks["0"][0] != ranks["1"][0] and ranks["0"][1] != ranks["1"][1], f"{start}: same random draws"
        assert ranks["0"][3] != ranks["1"][3], f"{start}: torch seeds its CPU generator from the OS in each process"
        assert {r[2] for r in ranks.values()} == {"True" if start == "warm" else "False"}


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_a_rank_killed_by_a_signal_and_a_raising_rank_end_the_same_on_both_paths(run_root, start):
    args = ["--max-steps", 20, "--log-every", 1, "--fail-rank", 1, "--fail-step", 2]
    with pytest.raises(tl.LaunchError) as info:
        tl.run_script("ddp_train", [*args, "--fail-mode", "raise"], runs_dir=run_root, device="cpu",
                      live="off", warm=start == "warm", timeout_s=120)
    e = info.value
    assert (e.rank, e.exit_code) == (1, 1) and RunRecord.read(e.run_dir).start == start
    assert "RuntimeError: injected failure on rank 1 at step 2" in e.failure.traceback
    assert tl.diagnose(e).rank == 1


def test_a_job_stopped_by_its_timeout_leaves_nothing_and_the_stacks_come_from_the_forked_ranks(run_root):
    args = ["--max-steps", 20, "--log-every", 1, "--fail-rank", 1, "--fail-step", 2, "--fail-mode", "hang",
            "--pg-timeout-s", 600]
    with pytest.raises(tl.LaunchTimeout) as info:
        tl.run_script("ddp_train", args, runs_dir=run_root, device="cpu", live="off", warm=True, stall_timeout_s=5)
    e = info.value
    assert RunRecord.read(e.run_dir).start == "warm"
    assert set(e.stacks) == {0, 1}, "SIGUSR1 reached both forked ranks"
    assert "inject_failure" in e.stacks[1] or "sleep" in e.stacks[1]
    # run_root's fixture asserts that no process working in the run folder is left (forked ones included)


def test_a_start_up_variable_the_helper_lacks_runs_cold_and_says_so_once(run_root, capsys):
    env = {"PYTHONHASHSEED": "123"}
    for _ in range(2):
        result = tl.run_script("ddp_train", ["--max-steps", 2], runs_dir=run_root, device="cpu", live="text",
                               warm=True, env=env)
        assert RunRecord.read(result.run_dir).start == "cold"
    out = capsys.readouterr().out
    assert out.count("warm start off") == 1 and "PYTHONHASHSEED" in out


def test_a_variable_only_an_earlier_launchs_env_set_is_named_as_the_helpers_with_that_launch(run_root, capsys):
    """Issue 45: 04's launches set MALLOC_MMAP_THRESHOLD_ with env=; a launch without it ran cold saying it *set*
    that variable. It now says the helper has it, from which launch's env=, and that this launch does not set it."""
    warm.shutdown()
    env = {"MALLOC_MMAP_THRESHOLD_": "131072"}
    first = tl.run_script("ddp_train", ["--max-steps", 1], runs_dir=run_root, device="cpu", live="off", warm=True,
                          env=env)
    second = tl.run_script("ddp_train", ["--max-steps", 1], runs_dir=run_root, device="cpu", live="text", warm=True)
    assert [RunRecord.read(r.run_dir).start for r in (first, second)] == ["warm", "cold"]
    out = capsys.readouterr().out
    assert ("MALLOC_MMAP_THRESHOLD_=131072 is the helper's, from the launch's own env= when it was started for the "
            f"launch in {first.run_dir}; this launch does not set it") in out
    assert "the job sets start-up variables" not in out


def test_a_dead_helper_is_restarted(run_root):
    tl.run_script("ddp_train", ["--max-steps", 1], runs_dir=run_root, device="cpu", live="off", warm=True)
    old = warm.current_helper().pid
    os.kill(old, signal.SIGKILL)
    psutil.Process(old).wait(timeout=10) if psutil.pid_exists(old) else None
    result = tl.run_script("ddp_train", ["--max-steps", 1], runs_dir=run_root, device="cpu", live="off", warm=True)
    assert RunRecord.read(result.run_dir).start == "warm" and warm.current_helper().pid != old


def test_a_prestarted_helper_is_the_one_the_first_launch_uses(run_root):
    warm.shutdown()
    env = build_env(tl.resolve_device("cpu", 2))
    assert warm.prestart(env) and not warm.prestart(env), "one helper per process"
    pid = warm.current_helper().pid
    result = tl.run_script("ddp_train", ["--max-steps", 1], runs_dir=run_root, device="cpu", live="off", warm=True)
    assert RunRecord.read(result.run_dir).start == "warm" and warm.current_helper().pid == pid


def test_an_unused_helper_with_another_start_up_environment_is_restarted_and_a_used_one_goes_cold(run_root):
    """A guess at import time (say the notebook's RANK_ENV then sets a TORCH_* variable) costs a restart, no more."""
    warm.shutdown()
    warm.prestart({**build_env(tl.resolve_device("cpu", 2)), "PYTHONHASHSEED": "7"})
    guessed = warm.current_helper().pid
    result = tl.run_script("ddp_train", ["--max-steps", 1], runs_dir=run_root, device="cpu", live="off", warm=True)
    assert RunRecord.read(result.run_dir).start == "warm" and warm.current_helper().pid != guessed
    assert not psutil.pid_exists(guessed) or psutil.Process(guessed).status() == psutil.STATUS_ZOMBIE
    used = warm.current_helper().pid
    result = tl.run_script("ddp_train", ["--max-steps", 1], runs_dir=run_root, device="cpu", live="off", warm=True,
                           env={"PYTHONHASHSEED": "7"})
    assert RunRecord.read(result.run_dir).start == "cold" and warm.current_helper().pid == used


@pytest.mark.parametrize("setting", ["1", "0"])
def test_the_notebooks_setup_call_in_a_jupyter_kernel_starts_the_helper_unless_warm_starts_are_off(
        run_root, monkeypatch, setting):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TUTORIAL_LIB_WARM", setting)
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell(
        "import tutorial_lib as tl\n"
        "from tutorial_lib.launcher import warm\n"
        "imported = warm.current_helper()\n"
        "tl.setup_notebook({})\n"
        "prestarted = warm.current_helper().pid if warm.current_helper() else None\n"
        f"result = tl.run_script('ddp_train', ['--max-steps', 1], runs_dir={str(run_root)!r}, device='cpu', "
        "live='off')\n"
        "from tutorial_lib.runs.rundir import RunRecord\n"
        "helper = warm.current_helper()\n"
        "print(imported is None, prestarted is not None, RunRecord.read(result.run_dir).start, "
        "helper is not None and helper.pid == prestarted)")]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    printed = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.output_type == "stream").split()[-4:]
    expected = ["True", "True", "warm", "True"] if setting == "1" else ["True", "False", "cold", "False"]
    assert printed == expected, "import starts nothing; the setup call starts the helper the first launch uses"


def test_the_helper_outlives_the_thread_that_started_it(run_root):
    """A launch from a thread (a sweep, a thread pool) may start the helper; the helper must not end with that thread
    (a parent-death signal would fire then: the helper and every job forked from it were killed)."""
    import threading

    warm.shutdown()
    starter = threading.Thread(target=warm.prestart, args=(build_env(tl.resolve_device("cpu", 2)),))
    starter.start()
    starter.join()
    helper = warm.current_helper()
    assert helper.wait_ready() is None, "the helper ended with the thread that started it"
    result = tl.run_script("ddp_train", ["--max-steps", 1], runs_dir=run_root, device="cpu", live="off", warm=True)
    assert RunRecord.read(result.run_dir).start == "warm" and warm.current_helper().pid == helper.pid


def test_the_helper_dies_with_the_process_that_started_it_and_removes_its_folder(tmp_path):
    import subprocess
    import sys

    code = ("import tutorial_lib as tl, sys; "
            f"tl.run_script('ddp_train', ['--max-steps', 1], runs_dir={str(tmp_path)!r}, device='cpu', live='off', warm=True); "
            "from tutorial_lib.launcher import warm; helper = warm.current_helper(); "
            "print('HELPER', helper.folder, helper.pid, flush=True); "
            "sys.stdin.read()")
    kernel = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__))))
    line = ""
    while not line.startswith("HELPER"):
        line = kernel.stdout.readline()
        assert line, "the child kernel ended before it printed the helper's pid"
    helper = int(line.split()[-1])
    assert psutil.pid_exists(helper)
    kernel.kill()
    kernel.wait()
    deadline = time.monotonic() + 30
    while psutil.pid_exists(helper) and psutil.Process(helper).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the warm-start helper outlived its kernel"
        time.sleep(0.1)
    folder = line.split()[1]
    while os.path.exists(folder):  # the helper removes it as it goes (its parent-death signal is SIGTERM)
        assert time.monotonic() < deadline, f"the warm-start helper left {folder} behind"
        time.sleep(0.1)


def test_a_helper_whose_kernel_ended_during_its_preload_removes_its_folder(tmp_path):
    """A notebook that fails seconds after its setup call ends its kernel while the helper still imports torch: the
    helper's ready line then meets a closed pipe (BrokenPipeError), and it must still remove its folder."""
    import subprocess
    import sys
    import tempfile

    folder = tempfile.mkdtemp(prefix="tutorial_lib-warm-", dir=tmp_path)
    helper = subprocess.Popen([sys.executable, "-u", str(warm.WARM_START), "serve", os.path.join(folder, "helper.sock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    helper.stdout.close()  # the kernel is gone: nobody reads the ready line
    helper.stdin.close()
    try:
        helper.wait(timeout=120)
    finally:
        if helper.poll() is None:
            helper.kill()
    assert not os.path.exists(folder), f"the helper left {sorted(os.listdir(folder))} in its folder"
