"""Why a launch runs cold, per start-up variable: where the launch's value and the helper's came from (issue 45).

No helper process is started: ``subprocess.Popen`` is replaced by a process that never ends (and is never ready:
``warm_path(..., wait_s=0)`` claims the helper and returns at once), so the kernel's side of warm starts, the
helper's bookkeeping, runs as in a notebook without importing torch.
"""

import os
import sys

import pytest

import tutorial_lib as tl
from tutorial_lib import LaunchSpec
from tutorial_lib.child import protocol
from tutorial_lib.i18n import Message, render
from tutorial_lib.launcher import warm
from tutorial_lib.launcher.devices import DevicePlan
from tutorial_lib.launcher.environment import build_env, set_rank_env
from tutorial_lib.launcher.plan import plan_launch

MALLOC = "MALLOC_MMAP_THRESHOLD_"


class _NeverEnds:
    """A stand-in for the helper's process: running until killed, no output read here."""

    def __init__(self, *args, **kwargs):
        self.pid, self.stdin, self.stdout, self._code = 4242, None, None, None

    def poll(self):
        return self._code

    def kill(self):
        self._code = -9

    def wait(self, timeout=None):
        return self._code


@pytest.fixture
def fake_helper(monkeypatch):
    monkeypatch.setattr(warm.subprocess, "Popen", _NeverEnds)
    warm.shutdown()
    yield
    warm.shutdown()


def _cpu_env(**extra):
    return build_env(DevicePlan("cpu", "gloo", 2, 0), extra)


def test_each_start_up_variable_is_traced_to_the_launchs_env_the_rank_env_the_kernel_or_the_launcher(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "5")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    env = build_env(DevicePlan("cpu", "gloo", 2, 0), {MALLOC: "131072"},
                    base={**os.environ, "TORCH_SHOW_CPP_STACKTRACES": "1"})
    sources = warm.env_sources(env, {MALLOC: "131072"}, {"TORCH_SHOW_CPP_STACKTRACES": "1"})
    assert sources[MALLOC].msgid == warm.SOURCE_ENV_ARG
    assert sources["TORCH_SHOW_CPP_STACKTRACES"].msgid == warm.SOURCE_RANK_ENV
    assert sources["PYTHONHASHSEED"].msgid == warm.SOURCE_KERNEL
    assert sources["PYTHONUNBUFFERED"].msgid == warm.SOURCE_LAUNCHER  # build_env's default
    assert "OMP_NUM_THREADS" not in sources  # applied in each rank: never a reason to run cold


def test_a_variable_an_earlier_launch_set_is_named_as_the_helpers_with_that_launch_in_both_languages(
        fake_helper, tmp_path):
    """The friction of issue 45: 04's launches set MALLOC_MMAP_THRESHOLD_ with env=, the helper was restarted for the
    first of them, and a later launch without it read "the job sets start-up variables ...: MALLOC_MMAP_THRESHOLD_",
    a variable that launch never set."""
    env = _cpu_env()
    assert warm.prestart(env, sys.executable, sources=warm.env_sources(env))
    first = _cpu_env(**{MALLOC: "131072"})
    started_for = Message(warm.STARTED_FOR_LAUNCH, {"run_dir": tmp_path / "04-fsdp_train"})
    warm.warm_path(first, sys.executable, 0, warm.env_sources(first, {MALLOC: "131072"}), started_for)
    assert warm.current_helper().startup_env[MALLOC] == "131072", "an unused helper is restarted for the job"
    later = Message(warm.STARTED_FOR_LAUNCH, {"run_dir": tmp_path / "later"})
    socket_path, reason = warm.warm_path(env, sys.executable, 0, warm.env_sources(env), later)
    assert socket_path is None and isinstance(reason, Message)
    english = render(reason, "en")
    assert f"{MALLOC}=131072 is the helper's, from the launch's own env= when it was started for the launch in " \
           f"{tmp_path / '04-fsdp_train'}; this launch does not set it" in english
    assert "give every launch the same values" in english and "PYTHONUNBUFFERED" not in english
    chinese = render(reason, "zh")
    assert f"{MALLOC}=131072 是热启动辅助进程的" in chinese and "这次启动自己的 env=" in chinese
    assert str(tmp_path / "04-fsdp_train") in chinese and "这次启动没有设置它" in chinese


def test_a_variable_this_launch_sets_names_its_source_and_the_setup_call_the_helper_was_started_for(fake_helper):
    env = _cpu_env()
    warm.prestart(env, sys.executable, sources=warm.env_sources(env))
    warm.warm_path(env, sys.executable, 0, warm.env_sources(env))  # the first launch uses the prestarted helper
    set_rank_env({"PYTHONHASHSEED": "7"})
    try:
        job = _cpu_env(PYTHONHASHSEED="7")
        _, reason = warm.warm_path(job, sys.executable, 0, warm.env_sources(job, rank_env={"PYTHONHASHSEED": "7"}))
    finally:
        set_rank_env(None)
    assert ("PYTHONHASHSEED=7 comes from RANK_ENV (tl.setup_notebook or tl.launcher.environment.set_rank_env); the helper, started for "
            "the notebook's setup call (tl.setup_notebook), does not have it") in render(reason, "en")
    assert "来自RANK_ENV（tl.setup_notebook 或 tl.launcher.environment.set_rank_env）" in render(reason, "zh")


def test_a_differing_value_names_both_sources():
    reason = warm.startup_mismatch({MALLOC: "1"}, {MALLOC: Message(warm.SOURCE_ENV_ARG)}, {MALLOC: "2"},
                                   {MALLOC: Message(warm.SOURCE_KERNEL)}, Message(warm.STARTED_FOR_UNKNOWN))
    assert (f"{MALLOC}=1 comes from the launch's own env=; the helper has {MALLOC}=2, from the kernel's environment "
            "(os.environ) when it was started for an earlier launch") in render(reason, "en")


@pytest.mark.parametrize("shape", [{}, {"observe": True}, {"max_restarts": 2}, {"nnodes": 2},
                                   {"shutdown_grace_s": 1.0}, {"nproc_per_node": 4}])
def test_the_librarys_own_launches_set_no_start_up_variable_the_prestarted_helper_lacks(tmp_path, shape):
    """The setup call prestarts the helper with what a CPU launch of the library sets; a launch the library makes
    (an exercise's check: CPU ranks, observed, restarts, simulated nodes) adds nothing read at start-up, so a
    learner's own launch after it finds the helper as the setup call left it."""
    script = tmp_path / "x.py"
    script.write_text("print(1)\n")
    spec = {"nproc_per_node": 2, **shape}
    plan = plan_launch(LaunchSpec(script, device="cpu", run_dir=tmp_path, **spec))
    prestarted = protocol.startup_env(build_env(DevicePlan("cpu", "gloo", 1, 0)))
    assert all(protocol.startup_env(plan.node_envs[node]) == prestarted for node in plan.nodes)


def test_the_setup_call_prestarts_the_helper_knowing_which_variables_came_from_rank_env(fake_helper, monkeypatch):
    monkeypatch.setenv("TUTORIAL_LIB_WARM", "1")
    monkeypatch.setenv("TUTORIAL_LIB_LANG", "en")
    monkeypatch.setattr(warm.sys, "platform", "linux")
    try:
        tl.setup_notebook({"PYTHONHASHSEED": "3"})
    finally:
        set_rank_env(None)
    helper = warm.current_helper()
    assert helper.startup_env["PYTHONHASHSEED"] == "3"
    assert helper.sources["PYTHONHASHSEED"].msgid == warm.SOURCE_RANK_ENV
    assert helper.started_for.msgid == warm.STARTED_FOR_SETUP
