"""The launcher's pure parts: command, environment, validation, output parsing. Nothing is launched."""

import json
import os
import shlex
import sys
from pathlib import Path

import psutil
import pytest

from tutorial_lib import ConfigError, LaunchSpec, write_script
from tutorial_lib.launcher.devices import DevicePlan
from tutorial_lib.launcher.run import (build_command, build_env, command_text, find_root_cause, free_port,
                                   node_visible_devices)
from tutorial_lib.launcher.output import TeeSplitter, ThrottledPrinter, rank_lines, split_rank_prefix, split_tee_line

CPU2 = DevicePlan("cpu", "gloo", 2, 0)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_command_runs_torchrun_module_on_loopback_with_tee_and_script_args(tmp_path):
    cmd = build_command(tmp_path / "x.py", ["--max-steps", 5, "--lr", 0.1], CPU2, master_port=29555,
                        log_dir=tmp_path / "logs")
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    joined = shlex.join(cmd)
    for part in ["--nproc-per-node 2", "--master-addr 127.0.0.1", "--master-port 29555", "--max-restarts 0",
                 "--tee 3", f"--log-dir {tmp_path / 'logs'}", "--nnodes 1"]:
        assert part in joined
    assert cmd[-5:] == [str(tmp_path / "x.py"), "--max-steps", "5", "--lr", "0.1"]


def test_restarts_use_the_c10d_rendezvous_so_each_attempt_gets_fresh_store_keys(tmp_path):
    """Issue 6: with the static rendezvous a restarted group read the dead attempt's gloo addresses."""
    cmd = build_command(tmp_path / "x.py", [], CPU2, master_port=29555, log_dir=tmp_path / "logs", max_restarts=1)
    joined = shlex.join(cmd)
    for part in ["--rdzv-backend c10d", "--rdzv-endpoint 127.0.0.1:29555", "--max-restarts 1", "--tee 3"]:
        assert part in joined
    assert "--master-port" not in joined and "--master-addr" not in joined


def test_env_is_a_copy_with_defaults_and_never_touches_os_environ(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    before = dict(os.environ)
    env = build_env(CPU2, {"EXTRA": "1"}, max_restarts=2, shutdown_grace_s=4)
    assert dict(os.environ) == before
    assert env["OMP_NUM_THREADS"] == "3", "a user's own setting wins over the default"
    assert env["PYTHONUNBUFFERED"] == "1" and env["EXTRA"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "4"


def test_cpu_run_on_a_gpu_machine_hides_the_gpus():
    env = build_env(DevicePlan("cpu", "gloo", 2, gpu_count=4), base={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and "NCCL_SOCKET_IFNAME" not in env
    env = build_env(DevicePlan("cuda", "nccl", 2, gpu_count=4), base={})
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env


def test_gpu_runs_keep_gloo_and_nccl_on_loopback_too():
    """Issue 15 item 9: GPU jobs create gloo groups as well (sampler demo, DETAIL's helper group)."""
    env = build_env(DevicePlan("cuda", "nccl", 2, gpu_count=2), base={})
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["NCCL_SOCKET_IFNAME"] == "lo"
    # Simulated nodes (nnodes > 1) get this same environment per agent: they rendezvous on 127.0.0.1 as well.
    env = build_env(DevicePlan("cuda", "nccl", 1, gpu_count=8), base={"PATH": "/bin"}, max_restarts=1)
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["NCCL_SOCKET_IFNAME"] == "lo"


def test_a_users_own_interface_settings_win():
    base = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "^docker"}
    env = build_env(DevicePlan("cuda", "nccl", 2, gpu_count=2), base=base)
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("eth0", "^docker")
    env = build_env(DevicePlan("cuda", "nccl", 2, gpu_count=2), {"NCCL_SOCKET_IFNAME": "eth1"}, base={})
    assert env["NCCL_SOCKET_IFNAME"] == "eth1", "LaunchSpec.env wins over the default"


def test_simulated_nodes_split_the_gpus_the_job_may_use():
    """Node n gets its slice of CUDA_VISIBLE_DEVICES, not GPUs counted from 0 (issue 15 item 6)."""
    assert [node_visible_devices({}, n, 2, 4) for n in (0, 1)] == ["0,1", "2,3"]
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert [node_visible_devices(env, n, 2, 4) for n in (0, 1)] == ["4,5", "6,7"]
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}
    assert [node_visible_devices(env, n, 1, 2) for n in (0, 1)] == ["GPU-aa", "GPU-bb"]


def test_command_text_is_a_rerunnable_shell_line(tmp_path):
    base = {"PATH": "/bin"}
    env = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    text = command_text(["python", "-m", "torch.distributed.run", "my script.py"], env, tmp_path, base)
    assert text == f"cd {shlex.quote(str(tmp_path))} && OMP_NUM_THREADS=1 python -m torch.distributed.run 'my script.py'\n"


def test_free_port_is_bindable_on_loopback():
    import socket

    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@pytest.fixture
def script(tmp_path):
    return write_script("ddp_train", tmp_path)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"timeout_s": 0}, "timeout_s must be a number > 0, got 0"),
        ({"timeout_s": -5}, "timeout_s must be a number > 0, got -5"),
        ({"timeout_s": "60"}, "timeout_s must be a number > 0, got '60'"),
        ({"nproc_per_node": 0}, "nproc_per_node must be >= 1, got 0"),
        ({"nproc_per_node": "2"}, "nproc_per_node must be a positive integer, got '2'"),
        ({"master_port": 80}, "master_port must be an integer in 1024..65535"),
        ({"master_port": 70000}, "got 70000"),
        ({"max_restarts": -1}, "max_restarts must be an integer >= 0, got -1"),
        ({"live": "fancy"}, "live must be one of"),
        ({"args": "--max-steps 5"}, "not one string"),
        ({"env": {"A": 1}}, "env must map str to str"),
        ({"device": "cuda"}, "no usable CUDA GPU"),
        ({"sample_memory_hz": 0}, "sample_memory_hz must be a number > 0"),
    ],
)
def test_bad_spec_is_refused_before_launch(script, changes, match):
    spec = LaunchSpec(script, **changes)
    with pytest.raises(ConfigError, match=match):
        spec.validate(gpu_count=0)
    assert not (script.parent / "command.txt").exists(), "nothing was launched"


def test_missing_script_and_reused_run_dir_are_refused(tmp_path, script):
    with pytest.raises(ConfigError, match="does not exist"):
        LaunchSpec(tmp_path / "nope.py").validate(gpu_count=0)
    (script.parent / "command.txt").write_text("earlier launch")
    with pytest.raises(ConfigError, match="already holds a launch"):
        LaunchSpec(script).validate(gpu_count=0)
    assert (script.parent / "command.txt").read_text() == "earlier launch", "nothing a user made is overwritten"
    with pytest.raises(ConfigError, match="not a writable directory"):
        LaunchSpec(script, run_dir=tmp_path / "missing").validate(gpu_count=0)


def test_rank_prefix_is_split_and_torchrun_lines_have_no_rank():
    assert split_rank_prefix("[default1]:step 3/5 loss 0.1") == (1, "step 3/5 loss 0.1")
    assert split_rank_prefix("[trainer12]:x", rank_offset=4) == (16, "x")
    assert split_rank_prefix("[1]:") == (None, "[1]:"), "torchrun's failure summary is not a rank's line"
    assert split_rank_prefix("W1130 12:00 api.py:1] Sending process 7 closing signal SIGTERM")[0] is None


def test_a_line_where_torchrun_wrote_several_ranks_chunks_is_split_at_each_ranks_prefix():
    """torchrun's --tee copies an unfinished line of a rank (a ``\\r`` progress bar: its reader turns each ``\\r``
    into a line break) without a newline, so the next chunk of any rank continues the line (measured, torch 2.13)."""
    assert split_tee_line("[default0]:7/50[default1]:") == ["[default0]:7/50", "[default1]:"]
    assert split_tee_line("[default1]:10/50[default0]:8/50") == ["[default1]:10/50", "[default0]:8/50"]
    assert split_tee_line("[default1]:[rank1]: Traceback (most recent call last):") == [
        "[default1]:[rank1]: Traceback (most recent call last):"], "torch's own [rankN]: is no other rank's chunk"
    # several nodes: the launcher's prefix template is [rank<global rank>]:, torch's excepthook adds its own again
    assert split_tee_line("[rank3]:7/50[rank2]:[rank2]: Traceback") == ["[rank3]:7/50", "[rank2]:[rank2]: Traceback"]
    assert split_tee_line("W1130 12:00 api.py:1] [default0]: x") == ["W1130 12:00 api.py:1] [default0]: x"]

    # The lines of a real run (rank 0's and rank 1's bars, then rank 0's print on stdout): every piece to its rank;
    # the empty pieces that only end an unfinished chunk (the newline or next \r arriving alone) are dropped.
    tee = TeeSplitter()
    raw = ["[default0]:", "[default0]:6/50", "[default0]:7/50[default1]:", "[default1]:1/50",
           "[default1]:5/50[default1]:", "[default1]:6/50", "[default0]:", "[default1]:10/50[default0]:8/50",
           "[default0]:46/50[default0]:rank 0 done", "[default0]:"]
    pieces = [piece for line in raw for piece in tee.split(line)]
    assert [split_rank_prefix(p) for p in pieces] == [
        (0, ""), (0, "6/50"), (0, "7/50"), (1, ""), (1, "1/50"), (1, "5/50"), (1, "6/50"), (1, "10/50"), (0, "8/50"),
        (0, "46/50"), (0, "rank 0 done")]
    assert rank_lines("\n".join(raw))[-3:] == [(0, "8/50"), (0, "46/50"), (0, "rank 0 done")]


def test_printer_throttles_a_flood_but_keeps_every_rank_tail(monkeypatch):
    import io

    import tutorial_lib.launcher.output as output

    clock = [100.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    printer = ThrottledPrinter(out, max_lines_per_s=10, tail_lines=5)
    for i in range(1000):
        printer.emit(i % 2, f"line {i}")
    shown = out.getvalue().splitlines()
    assert len(shown) == 20, "burst of 2 x 10 lines, then nothing until time passes"
    assert shown[0] == "[rank 0] line 0" and shown[1] == "[rank 1] line 1"
    clock[0] += 1.0  # one second later: 10 more lines may pass, preceded by the suppressed count
    printer.emit(None, "torchrun says hi")
    lines = out.getvalue().splitlines()
    assert "980 line(s) not shown" in lines[-2] and lines[-1] == "[torchrun] torchrun says hi"
    assert printer.tail(1) == [f"line {i}" for i in range(991, 1000, 2)]


def test_root_cause_is_read_from_the_summary_and_the_error_file(tmp_path):
    summary = (FIXTURES / "torchrun_failure_summary.txt").read_text()
    error_dir = tmp_path / "logs" / "none_abc" / "attempt_0" / "1"
    error_dir.mkdir(parents=True)
    (error_dir / "error.json").write_text((FIXTURES / "error.json").read_text())
    printer = ThrottledPrinter(open(os.devnull, "w"))
    printer.emit(1, "last words of rank 1")
    failure = find_root_cause(summary, tmp_path / "logs", printer)
    assert failure.rank == 1 and failure.exit_code == 1
    assert "ValueError: boom on rank 1" in failure.traceback
    assert failure.log_tail == ["last words of rank 1"]


def test_root_cause_without_summary_or_error_file_is_unknown(tmp_path):
    assert find_root_cause("torchrun: killed", tmp_path, ThrottledPrinter(open(os.devnull, "w"))) is None


def test_sigint_during_cleanup_is_held_back_then_raised():
    import signal

    from tutorial_lib.launcher.run import sigint_deferred

    finished = []
    with pytest.raises(KeyboardInterrupt):
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            finished.append("cleanup ran to the end")
    assert finished == ["cleanup ran to the end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _summary(root_rank, root_exit, other_rank, other_exit):
    block = "  time      : 2026-11-30_00:28:30\n  host      : localhost\n  rank      : {r} (local_rank: {r})\n  exitcode  : {e} (pid: 1)\n"
    return ("Failures:\n[1]:\n" + block.format(r=other_rank, e=other_exit)
            + "------\nRoot Cause (first observed failure):\n[0]:\n" + block.format(r=root_rank, e=root_exit))


def _error_file(log_dir, local_rank, message, mtime_ns):
    path = log_dir / "none_x" / "attempt_0" / str(local_rank) / "error.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": message}}}))
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_same_second_tie_in_torchruns_summary_is_broken_by_error_file_times(tmp_path):
    """torchrun's timestamps have 1 s resolution: the peer that failed second can be named root cause."""
    _error_file(tmp_path, 1, "RuntimeError: injected failure on rank 1", 1_000_000_000_000)
    _error_file(tmp_path, 0, "RuntimeError: Connection closed by peer", 1_000_000_000_500)
    printer = ThrottledPrinter(open(os.devnull, "w"))
    failure = find_root_cause(_summary(root_rank=0, root_exit=1, other_rank=1, other_exit=1), tmp_path, printer)
    assert failure.rank == 1 and failure.exit_code == 1 and "injected failure" in failure.traceback


def test_a_rank_killed_by_a_signal_stays_root_cause_though_a_peer_wrote_an_error_file(tmp_path):
    _error_file(tmp_path, 0, "RuntimeError: Connection closed by peer", 1_000_000_000_500)
    printer = ThrottledPrinter(open(os.devnull, "w"))
    failure = find_root_cause(_summary(root_rank=1, root_exit=-9, other_rank=0, other_exit=1), tmp_path, printer)
    assert failure.rank == 1 and failure.exit_code == -9 and failure.traceback == ""


def test_an_empty_error_file_and_a_crashed_torchrun_still_name_the_killed_rank(tmp_path):
    """Rank 1 SIGKILLed; rank 0, stopped by torchrun's SIGTERM while @record wrote its error file, left it empty;
    torchrun crashed reading it (JSONDecodeError, no summary: seen once under load, torch 2.13)."""
    _error_file(tmp_path, 0, "x", 1_000_000_000_500)
    (tmp_path / "none_x" / "attempt_0" / "0" / "error.json").write_text("")
    (tmp_path / "none_x" / "attempt_0" / "1").mkdir()
    printer = ThrottledPrinter(open(os.devnull, "w"))
    failure = find_root_cause("json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)", tmp_path,
                              printer)
    assert failure.rank == 1 and failure.exit_code is None and failure.traceback == ""


def test_a_rank_sigtermed_while_failing_is_not_preferred_over_one_that_exited_itself(tmp_path):
    """Both ranks hit the collective timeout; torchrun SIGTERMs the slower one, which already wrote its error file."""
    _error_file(tmp_path, 1, "RuntimeError: Timed out (rank 1)", 1_000_000_000_000)
    _error_file(tmp_path, 0, "RuntimeError: Timed out (rank 0)", 1_000_000_000_500)
    printer = ThrottledPrinter(open(os.devnull, "w"))
    failure = find_root_cause(_summary(root_rank=0, root_exit=1, other_rank=1, other_exit=-15), tmp_path, printer)
    assert failure.rank == 0 and failure.exit_code == 1 and "rank 0" in failure.traceback


def test_a_rank_killed_by_a_signal_is_the_cause_when_torchrun_names_the_peer_that_lost_it(tmp_path):
    """Reliability trials: rank 1 SIGKILLed in a save, rank 0 failed on the lost connection and torchrun named rank 0."""
    _error_file(tmp_path, 0, "RuntimeError: [gloo] Read error [127.0.0.1]:5: Connection reset by peer", 1_000_000_000_500)
    printer = ThrottledPrinter(open(os.devnull, "w"))
    failure = find_root_cause(_summary(root_rank=0, root_exit=1, other_rank=1, other_exit=-9), tmp_path, printer)
    assert failure.rank == 1 and failure.exit_code == -9 and failure.traceback == ""
    # a rank that failed for its own reason stays the cause
    _error_file(tmp_path / "own", 0, "RuntimeError: injected failure on rank 0", 1_000_000_000_000)
    failure = find_root_cause(_summary(root_rank=0, root_exit=1, other_rank=1, other_exit=-9), tmp_path / "own", printer)
    assert failure.rank == 0 and "injected failure" in failure.traceback


def test_a_rank_with_its_own_error_beats_an_earlier_lost_connection(tmp_path):
    """Notebook 05's rank-0-only save: the peer's "Connection closed" file can be written before the timed-out rank's."""
    _error_file(tmp_path, 1, "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:4", 1_000_000_000_000)
    _error_file(tmp_path, 0, "RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 3000ms",
                1_000_000_000_500)
    printer = ThrottledPrinter(open(os.devnull, "w"))
    failure = find_root_cause(_summary(root_rank=1, root_exit=1, other_rank=0, other_exit=1), tmp_path, printer)
    assert failure.rank == 0 and "Timed out" in failure.traceback


def test_stacks_by_rank_keeps_each_ranks_last_faulthandler_dump():
    from tutorial_lib.errors import innermost_frame, stacks_by_rank
    ranked = [
        (0, "step 1"), (1, "Current thread 0x01 (most recent call first):"), (1, '  File "/r/a.py", line 3 in old'),
        (1, "step 2"),  # other output closes a dump
        (1, "Thread 0x02 (most recent call first):"), (1, '  File "/lib/python3.11/threading.py", line 9 in wait'),
        (1, ""), (0, "interleaved line of rank 0"),
        (1, "Current thread 0x01 (most recent call first):"), (1, '  File "/r/ddp_train.py", line 210 in inject_failure'),
        (1, '  File "/r/ddp_train.py", line 300 in train'), (None, "torchrun: Sending process 2 closing signal SIGTERM"),
    ]
    stacks = stacks_by_rank(ranked)
    assert set(stacks) == {1} and "in old" not in stacks[1] and "threading.py" in stacks[1]
    assert innermost_frame(stacks[1]) == "ddp_train.py:210 in inject_failure"
    assert stacks_by_rank([]) == {} and stacks_by_rank([(None, "Current thread 0x1 (most recent call first):")]) == {}


def test_a_rank_first_seen_between_fork_and_exec_is_recognised_after_its_exec(tmp_path):
    """Under load the tree can see torchrun's child before it execs (no RANK yet): it must not stay rank-less,
    or that rank is never sampled and never asked for its stack (both seen in CI)."""
    import subprocess
    import sys
    import time

    from tutorial_lib.launcher.processes import ProcessTree
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


def test_the_screen_skips_stack_dumps_and_always_shows_the_error_line():
    """The dumps stay in output.log (the error says where each rank was); an exception line beats the line budget."""
    import io

    from tutorial_lib.launcher.output import NoiseFilter
    noise = NoiseFilter()
    lines = [(0, "step 1"), (0, "Current thread 0x01 (most recent call first):"), (0, '  File "a.py", line 3 in f'),
             (0, ""), (0, "Thread 0x02 (most recent call first):"), (0, '  File "b.py", line 1 in g'), (0, "step 2")]
    assert [t for r, t in lines if not noise.hide(r, t)] == ["step 1", "step 2"]
    out = io.StringIO()
    printer = ThrottledPrinter(out, max_lines_per_s=1)  # a budget of 2 lines
    for i in range(10):
        printer.emit(0, f"line {i}")
    printer.emit(1, "RuntimeError: injected failure on rank 1 at step 2")
    shown = out.getvalue()
    assert "line 9" not in shown and "[rank 1] RuntimeError: injected failure on rank 1 at step 2" in shown


def test_version_noise_is_kept_out_of_a_ranks_last_lines_but_a_stack_dump_is_not():
    """A DCP warning that reaches output.log after a rank's last words is not what the rank was doing."""
    from tutorial_lib.launcher.output import NoiseFilter
    noise, printer = NoiseFilter(), ThrottledPrinter(open(os.devnull, "w"))
    warning = ("/x/torch/distributed/checkpoint/filesystem.py:131: UserWarning: TypedStorage is deprecated. It will "
               "be removed in the future")
    for text in ["step 3", "rank 1: killed by SIGKILL in the middle of the step-6 save", warning,
                 "  if tensor.storage().size() != tensor.numel():", "Current thread 0x01 (most recent call first):",
                 '  File "a.py", line 3 in f']:
        kind = noise.kind(1, text)
        printer.emit(1, text, show=kind is None, keep=kind != NoiseFilter.VERSION)
    assert printer.tail(1) == ["step 3", "rank 1: killed by SIGKILL in the middle of the step-6 save",
                               "Current thread 0x01 (most recent call first):", '  File "a.py", line 3 in f']


def test_the_screen_shows_a_tracebacks_exception_line_not_its_frames():
    """A failed run's cell shows the cause (the exception line) per rank; frames stay in output.log and the error."""
    from tutorial_lib.errors import without_tracebacks
    from tutorial_lib.launcher.output import NoiseFilter
    noise = NoiseFilter()
    lines = [(1, "step 1"), (1, "Traceback (most recent call last):"), (1, '  File "t.py", line 3, in main'),
             (1, "    raise KeyError('x')"), (1, "KeyError: 'x'"), (1, ""),
             (1, "During handling of the above exception, another exception occurred:"), (1, ""),
             (1, "Traceback (most recent call last):"), (1, '  File "t.py", line 5, in main'),
             (1, "           ^^^^^^"), (1, "RuntimeError: injected failure"), (1, "after"),
             (None, "E1130 20:31:20.15 123 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 9) of binary: x"),
             (None, "W1130 20:31:20.15 123 api.py:1028] Sending process 7 closing signal SIGTERM"),
             (0, "Fatal Python error: Aborted"), (0, "Extension modules: numpy._core, torch._C (total: 2)"),
             (None, "W1130 20:31:21.00 123 api.py:900] the agent's own warning")]
    shown = [t for r, t in lines if noise.kind(r, t) is None]
    assert shown == ["step 1", "KeyError: 'x'", "RuntimeError: injected failure", "after", "Fatal Python error: Aborted",
                     "W1130 20:31:21.00 123 api.py:900] the agent's own warning"]
    assert noise.traceback_lines == 9
    assert without_tracebacks([t for r, t in lines if r == 1]) == ["step 1", "after"]


def test_run_json_has_one_schema_and_reads_back(tmp_path):
    """run.json is written by RunRecord only; an older or partial record still reads (unknown shape: None)."""
    import json

    from tutorial_lib.rundir import RunRecord, RunStatus
    RunRecord(RunStatus.TIMEOUT, 12.5, nnodes=2, nproc_per_node=2, device="cpu", summary="t.py timed out",
              timeout_s=5, limit="stall_timeout_s", where={1: "t.py:3 in main"}).write(tmp_path)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["status"] == "timeout" and data["where"] == {"1": "t.py:3 in main"} and data["in_process"] is False
    assert set(data) == set(RunRecord.__dataclass_fields__)
    back = RunRecord.read(tmp_path)
    assert back.status == RunStatus.TIMEOUT == "timeout" and back.where == {1: "t.py:3 in main"} and back.timeout_s == 5
    (tmp_path / "run.json").write_text(json.dumps({"status": "failed", "returncode": 1}))
    old = RunRecord.read(tmp_path)
    assert old.status == RunStatus.FAILED and old.returncode == 1 and old.nproc_per_node is None
    (tmp_path / "run.json").write_text("{not json")
    assert RunRecord.read(tmp_path) is None


# --- launch()'s parts, each without launching: plan, output pump, limits, outcome -------------------------------------

def _pump_for(tmp_path, nodes=(0,), nnodes=1):
    import io

    from tutorial_lib.launcher.run import _OutputPump
    script = tmp_path / "t.py"
    script.write_text("")
    spec = LaunchSpec(script, nnodes=nnodes, device="cpu")
    log = io.StringIO()
    return _OutputPump(spec, tmp_path, list(nodes), ThrottledPrinter(io.StringIO()), log), log


def test_the_plan_builds_each_nodes_command_and_writes_command_txt_but_starts_nothing(tmp_path):
    from tutorial_lib.launcher.run import _plan_launch
    script = tmp_path / "t.py"
    script.write_text("")
    lp = _plan_launch(LaunchSpec(script, args=["--x", 1], nproc_per_node=2, device="cpu", master_port=29511))
    assert lp.nodes == [0] and lp.store is None and lp.command == lp.commands[0]
    assert lp.command[lp.command.index("--master-port") + 1] == "29511" and lp.command[-2:] == ["--x", "1"]
    assert lp.node_log_dir(0) == tmp_path.resolve() / "logs" and lp.envs[0]["OMP_NUM_THREADS"] == "1"
    assert lp.shape == {"nnodes": 1, "nproc_per_node": 2, "device": "cpu", "start": "cold"}, "warm once started so"
    assert shlex.join(lp.command) in (tmp_path / "command.txt").read_text()
    assert not (tmp_path / "output.log").exists() and not (tmp_path / "run.json").exists()


def test_the_limit_check_names_the_limit_and_a_stall_needs_a_first_metrics_line(tmp_path):
    from tutorial_lib.launcher.run import limit_reached
    script = tmp_path / "t.py"
    script.write_text("")
    spec = LaunchSpec(script, timeout_s=10, stall_timeout_s=3)
    assert limit_reached(spec, 9.0, None) is None
    assert limit_reached(spec, 10.5, 9.0) == "timeout_s"
    assert limit_reached(spec, 8.0, None) is None, "no metrics line yet: start-up is not a stall"
    assert limit_reached(spec, 8.0, 4.5) == "stall_timeout_s" and limit_reached(spec, 8.0, 5.5) is None
    assert limit_reached(LaunchSpec(script, timeout_s=10), 9.9, 0.0) is None, "stall_timeout_s=None: off"


def test_the_pump_logs_every_piece_keeps_transcripts_and_labels_a_nodes_agent_lines(tmp_path):
    pump, log = _pump_for(tmp_path, nodes=(0, 1), nnodes=2)
    pump.lines.put((1, "[rank2]:step 1"))
    pump.lines.put((0, "I1130 agent line"))
    pump.lines.put((0, None))
    assert pump.read_lines(0.01) and pump.open_streams == {1}
    assert log.getvalue() == "[rank2]:step 1\nI1130 agent line\n"
    assert pump.node_transcripts == {0: ["I1130 agent line"], 1: ["[rank2]:step 1"]}
    assert pump.ranked == [(2, "step 1"), (None, "I1130 agent line")]
    assert not pump.read_lines(0.01), "nothing more arrived"


def test_the_failure_outcome_explains_torchruns_own_failure_from_the_transcript(tmp_path):
    from tutorial_lib.launcher.run import _failure_error, _LaunchPlan
    from tutorial_lib.rundir import RunStatus
    pump, _ = _pump_for(tmp_path)
    for line in ["torch.distributed.DistNetworkError: address already in use (EADDRINUSE)"]:
        pump.take(0, line)
    lp = _LaunchPlan(pump.spec, CPU2, tmp_path / "t.py", tmp_path, [0], {}, commands={0: ["torchrun"]})
    error, record, outcome = _failure_error(lp, pump, {0: 1}, 2.5)
    assert str(error).startswith("t.py failed: torchrun exited with code 1: the port, picked as free for this launch")
    assert outcome.status == RunStatus.FAILED and outcome.elapsed_s == 2.5 and outcome.cause == record.summary
    assert error.returncode == 1 and error.failure is None and error.output_tail == pump.transcript
    assert record.status == RunStatus.FAILED and record.returncode == 1 and record.summary == error.summary
    assert not (tmp_path / "run.json").exists(), "launch writes the record after the view's last word"


def test_the_failure_outcome_names_the_rank_whose_error_file_torchrun_summarised(tmp_path):
    from tutorial_lib.launcher.run import _failure_error, _LaunchPlan
    pump, _ = _pump_for(tmp_path)
    for line in (FIXTURES / "torchrun_failure_summary.txt").read_text().splitlines():
        pump.take(0, line)
    error_dir = tmp_path / "logs" / "none_abc" / "attempt_0" / "1"
    error_dir.mkdir(parents=True)
    (error_dir / "error.json").write_text((FIXTURES / "error.json").read_text())
    lp = _LaunchPlan(pump.spec, CPU2, tmp_path / "t.py", tmp_path, [0], {}, commands={0: ["torchrun"]})
    error, record, outcome = _failure_error(lp, pump, {0: 1}, 2.5)
    assert record.summary.startswith("t.py failed on rank 1 (exit code 1)")
    assert outcome.text == "failed: t.py failed on rank 1 (exit code 1)", "the view's status: without where ranks were"
    assert "ValueError: boom on rank 1" in error.failure.traceback


def _terminal(text: str) -> list[str]:
    """What a terminal shows for ``text``: ``\\r``, ``\\n`` and the rank runner's ESC[G, ESC[A, ESC[K (a tiny emulator)."""
    import re as _re

    rows, row, col = [""], 0, 0
    for token in _re.findall(r"\x1b\[[GAK]|\r|\n|[^\x1b\r\n]+", text):
        if token in ("\r", "\x1b[G"):
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            rows += [""] * (row + 1 - len(rows))
        elif token == "\x1b[A":
            row = max(0, row - 1)
        elif token == "\x1b[K":
            rows[row] = rows[row][:col]
        else:
            line = rows[row].ljust(col)
            rows[row], col = line[:col] + token + line[col + len(token):], col + len(token)
    return rows


def test_the_rank_runner_marks_a_line_redrawn_with_carriage_returns_as_a_terminal_draws_it():
    """torchrun's --tee turns a bare ``\\r`` into a line break, so the rank runner marks redrawn lines (issue 17, input
    1); a terminal (``cat`` of a rank's log) shows the marked bytes exactly as it shows the script's own."""
    import io

    from tutorial_lib.child.rank_runner import _RedrawMarkingStream
    buffer = io.BytesIO()
    stream = _RedrawMarkingStream(buffer, encoding="utf-8", newline="\n", write_through=True)
    writes = ["epoch 1\n", "\r  0%|", "\r 50%|#####", "\r100%|##########|", "\n", "done\n", "a\r\n", "\r", "b", "\n"]
    for text in writes:
        assert stream.write(text) == len(text)
    marked = buffer.getvalue().decode()
    assert marked == ("epoch 1\n\x1b[G\n\x1b[A  0%|\x1b[G\n\x1b[A 50%|#####\x1b[G\n\x1b[A100%|##########|\x1b[K\n"
                      "done\na\r\n\x1b[G\n\x1b[Ab\x1b[K\n")
    assert _terminal(marked) == _terminal("".join(writes)) == ["epoch 1", "100%|##########|", "done", "a", "b", ""]
    assert "\r" not in marked.replace("\r\n", ""), "no bare \\r left for torchrun's reader to turn into a line break"


def test_a_redrawn_line_is_shown_once_in_its_final_state_and_in_place_in_the_widget_view(tmp_path):
    """What torchrun's --tee passes on from two ranks' marked progress bars (an unfinished chunk, its end mark arriving
    later, a line of the rank's stdout in between): the printer shows each rank's final state once, attributed to its
    rank; the widget view's output area shows the latest state in place meanwhile; output.log keeps every state."""
    import io

    from tutorial_lib.launcher.run import _OutputPump
    from tutorial_lib.launcher.live import LogBuffer
    script = tmp_path / "t.py"
    script.write_text("")
    buffer, log = LogBuffer(), io.StringIO()
    pump = _OutputPump(LaunchSpec(script, device="cpu"), tmp_path, [0], ThrottledPrinter(buffer), log)
    raw = ["[default0]:\x1b[G", "[default0]:\x1b[Ar0 1/50\x1b[G", "[default0]:\x1b[Ar0 2/50[default1]:\x1b[G",
           "[default1]:\x1b[Ar1 1/50\x1b[G", "[default0]:\x1b[G", "[default0]:rank 0 done", "[default1]:\x1b[Ar1 2/50"]
    for line in raw:
        pump.take(0, line)
    assert buffer.lines() == ["[rank 0] rank 0 done", "[rank 0] r0 2/50", "[rank 1] r1 2/50"], "latest states, in place"
    pump.take(0, "[default0]:\x1b[Ar0 3/50\x1b[K")  # rank 0's bar ends: its final state becomes a line
    assert buffer.lines() == ["[rank 0] rank 0 done", "[rank 0] r0 3/50", "[rank 1] r1 2/50"]
    pump.finish()  # the job ended while rank 1 was still redrawing: its latest state is its last word
    assert buffer.lines() == ["[rank 0] rank 0 done", "[rank 0] r0 3/50", "[rank 1] r1 2/50"]
    assert pump.printer.tail(1) == ["r1 2/50"] and pump.printer.tail(0) == ["rank 0 done", "r0 3/50"]
    assert log.getvalue().splitlines() == ["[default0]:r0 1/50", "[default0]:r0 2/50", "[default1]:r1 1/50",
                                           "[default0]:rank 0 done", "[default1]:r1 2/50", "[default0]:r0 3/50"]

    # A text-mode cell (stdout): no line in place, only the final states, as lines.
    out = io.StringIO()
    pump = _OutputPump(LaunchSpec(script, device="cpu"), tmp_path, [0], ThrottledPrinter(out), io.StringIO())
    for line in raw + ["[default0]:\x1b[Ar0 3/50\x1b[K"]:
        pump.take(0, line)
    assert out.getvalue() == "[rank 0] rank 0 done\n[rank 0] r0 3/50\n"
    pump.finish()
    assert out.getvalue() == "[rank 0] rank 0 done\n[rank 0] r0 3/50\n[rank 1] r1 2/50\n"
