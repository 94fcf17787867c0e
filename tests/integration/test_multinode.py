"""Simulated nodes (one torchrun agent each), a node that never arrives, stack dumps of a hung job, cluster text."""

import faulthandler
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from conftest import printed_before_stacks

import tutorial_lib as tl
from tutorial_lib.launcher.devices import DevicePlan
from tutorial_lib.torchrun.stacks import Frame, Place, innermost_frame
from tutorial_lib import LaunchSpec
from tutorial_lib.exercises.core import Context
from tutorial_lib.launcher.job import catches_signal
from tutorial_lib.launcher.outcome import explain_agent_failure
from tutorial_lib.launcher.plan import build_command, command_port
from tutorial_lib.launcher.processes import ProcessTree
from tutorial_lib.torchrun.output_lines import rank_lines

CPU2 = DevicePlan(device="cpu", backend="gloo", nproc_per_node=2, gpu_count=0)


# --- pure parts ------------------------------------------------------------------------------------------------

def test_several_nodes_join_a_c10d_rendezvous_the_launcher_hosts():
    argv = build_command("train.py", ["--x", 1], CPU2, master_port=29511, log_dir="logs", nnodes=2,
                         rendezvous_id="run-1", rendezvous_timeout_s=7)
    text = " ".join(argv)
    assert "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29511 --rdzv-id run-1" in text
    assert "--rdzv-conf is_host=false,join_timeout=7" in text
    assert "--master-addr" not in argv and argv[-3:] == ["train.py", "--x", "1"]
    one = build_command("train.py", [], CPU2, master_port=29511, log_dir="logs")
    assert one[one.index("--nnodes") + 1] == "1" and "--rdzv-backend" not in one


@pytest.mark.parametrize("fields, message", [
    ({"nnodes": 0}, "nnodes must be >= 1, got 0"),
    ({"nnodes": 2, "start_nodes": [2]}, r"start_nodes must be distinct node ranks in 0..1"),
    ({"nnodes": 2, "start_nodes": []}, "start_nodes must be distinct"),
    ({"nnodes": 2, "start_nodes": [0, 0]}, "start_nodes must be distinct"),
    ({"nnodes": 2, "rendezvous_timeout_s": 0}, "rendezvous_timeout_s must be a number > 0"),
])
def test_bad_node_settings_are_refused_before_launch(tmp_path, fields, message):
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(tl.ConfigError, match=message):
        LaunchSpec(script, device="cpu", **fields).validate()


def test_simulated_gpu_nodes_need_a_gpu_per_rank(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(tl.ConfigError, match="nnodes=2 x nproc_per_node=2 simulated GPU ranks need as many GPUs"):
        LaunchSpec(script, device="cuda", nproc_per_node=2, nnodes=2).validate(gpu_count=2)
    assert LaunchSpec(script, device="cuda", nproc_per_node=2, nnodes=2).validate(gpu_count=4).nproc_per_node == 2


def test_agent_failures_are_explained():
    spec = LaunchSpec("s.py", nnodes=3, rendezvous_timeout_s=5, master_port=29600)
    text = str(explain_agent_failure("... raise RendezvousTimeoutError", spec, [0]))  # English; worded when shown
    assert "timed out after 5 s" in text and "1 joined" in text and "node(s) [1, 2] were never started" in text
    assert "port 29600 is already in use" in str(explain_agent_failure("bind: EADDRINUSE", spec, [0, 1, 2]))
    assert explain_agent_failure("something else", spec, [0]) is None


def test_a_taken_free_port_is_explained_with_the_port_the_launch_picked():
    """master_port=None picks a free port; another process can take it before torchrun binds it (issue 17: the
    message said "port None")."""
    spec = LaunchSpec("s.py", nproc_per_node=2)
    command = build_command("s.py", [], CPU2, master_port=41234, log_dir=Path("logs"))
    assert command_port(command) == 41234
    text = str(explain_agent_failure("bind: EADDRINUSE", spec, [0], port=command_port(command)))
    assert "port 41234, picked as free for this launch (master_port=None)" in text and "None is" not in text
    assert "launch again" in text
    assert "port None" not in str(explain_agent_failure("bind: EADDRINUSE", spec, [0]))
    rdzv = build_command("s.py", [], CPU2, master_port=41235, log_dir=Path("logs"), max_restarts=1)
    assert command_port(rdzv) == 41235 and command_port(["torchrun", "s.py"]) is None


def test_innermost_frame_names_the_script_line_and_the_library_frame():
    stack = ('Thread 0x1 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 9 in wait\n'
             'Current thread 0x2 (most recent call first):\n'
             '  File "/v/lib/python3.11/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward\n'
             '  File "/runs/r/ddp_train.py", line 247 in train\n  File "/runs/r/ddp_train.py", line 204 in main\n')
    assert innermost_frame(stack) == Place(
        own=Frame("/runs/r/ddp_train.py", 247, "train"),
        innermost=Frame("/v/lib/python3.11/site-packages/torch/autograd/graph.py", 979, "_engine_run_backward"))
    assert str(innermost_frame(stack)) == "ddp_train.py:247 in train -> graph.py:979 in _engine_run_backward"
    assert str(innermost_frame('Current thread 0x2:\n  File "/r/x.py", line 3 in f\n')) == "x.py:3 in f"
    assert innermost_frame("no stack here") is None


def test_catches_signal_reads_the_handler_mask():
    assert not catches_signal(os.getpid(), signal.SIGUSR2)
    faulthandler.register(signal.SIGUSR2)
    try:
        assert catches_signal(os.getpid(), signal.SIGUSR2)
    finally:
        faulthandler.unregister(signal.SIGUSR2)
    assert not catches_signal(2**22 + 12345, signal.SIGUSR2), "no such process"


def test_process_tree_needs_a_root():
    with pytest.raises(ValueError, match="at least one root"):
        ProcessTree()


def test_node_commands_and_slurm_script_for_a_real_cluster():
    commands = tl.slurm.node_commands("train.py", ["--max-steps", 5], nnodes=2, nproc_per_node=4, master_addr="gpu-a")
    assert commands == [
        "torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr gpu-a --master-port 29500 train.py --max-steps 5",
        "torchrun --nnodes 2 --node-rank 1 --nproc-per-node 4 --master-addr gpu-a --master-port 29500 train.py --max-steps 5",
    ]
    job = tl.slurm.slurm_script("my train.py", ["--lr", 0.1], nnodes=3, gpus_per_node=8, cpus_per_task=32, max_restarts=2,
                          torchrun="torchrun")  # the nodes' own, found on their PATH (default: this interpreter's)
    for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)', "export OMP_NUM_THREADS=4",
                 "srun --kill-on-bad-exit=1 --cpus-per-task=32 --output=%x-%j-node%n.out \\\n"
                 """    bash -c 'trap "" USR1; exec torchrun --log-dir "logs/node$SLURM_NODEID" "$@"' torchrun \\\n"""
                 "    --nnodes 3 --nproc-per-node 8 --max-restarts 2 --rdzv-backend c10d",
                 '--rdzv-id "$SLURM_JOB_ID" --rdzv-endpoint "$head_node:29500"', "'my train.py' --lr 0.1"):
        assert line in job, line
    assert job.startswith("#!/bin/bash\n")


@pytest.mark.parametrize("call, message", [
    (lambda: tl.slurm.node_commands("t.py", nnodes=0, nproc_per_node=1), "nnodes must be >= 1, got 0"),
    (lambda: tl.slurm.node_commands("t.py", nnodes=1, nproc_per_node=1, master_port=80), "master_port must be an integer in 1024"),
    (lambda: tl.slurm.node_commands("t.py", nnodes=1, nproc_per_node=1, master_addr=""), "master_addr is empty"),
    (lambda: tl.slurm.slurm_script("t.py", nnodes=1, gpus_per_node=1, time_limit="30min"), "time_limit must look like HH:MM:SS"),
    (lambda: tl.slurm.slurm_script("t.py", nnodes=1, gpus_per_node=1, max_restarts=-1), "max_restarts must be an integer >= 0"),
])
def test_cluster_text_refuses_bad_values(call, message):
    with pytest.raises(tl.ConfigError, match=message):
        call()


# --- real launches ---------------------------------------------------------------------------------------------



def run(name, args, run_root, **spec):
    spec.setdefault("timeout_s", 120)
    return tl.run_script(name, args, runs_dir=run_root, device="cpu", nproc_per_node=2, **spec)


@pytest.mark.integration
def test_two_simulated_nodes_make_one_world_of_four(run_root, capsys):
    result = run("collectives_check", ["--sizes-bytes", 4096, "--iters", 1], run_root, nnodes=2)
    ranks = tl.runs.read_collectives(result.run_dir)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["world_size"] for r in ranks} == {4}
    assert all(c["ok"] for r in ranks for c in r["checks"])
    by_node = {}
    for r in ranks:
        by_node.setdefault(r["env"]["GROUP_RANK"], []).append((int(r["env"]["RANK"]), int(r["env"]["LOCAL_RANK"])))
    assert by_node == {"0": [(0, 0), (1, 1)], "1": [(2, 0), (3, 1)]}, "LOCAL_RANK restarts at 0 on every node"
    out = capsys.readouterr().out
    assert "[rank 3]" in out and "Error waiting on exit barrier" not in out
    assert (result.run_dir / "command.txt").read_text().count("--rdzv-backend c10d") == 2


@pytest.mark.integration
def test_on_two_nodes_a_rank_cannot_write_another_ranks_lines(run_root, capsys):
    """Issue 44 on simulated nodes, where each node's ranks get their global ranks from the rendezvous (the rank
    runner records them in torchrun's folders): rank 0's forged prefixes stay rank 0's, in the cell, in output.log
    read back and in the exercise checks' records."""
    folder = tl.new_run_dir("prefixes", run_root)
    script = Path(shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "forged_prefixes.py", folder))
    result = tl.launch(tl.LaunchSpec(script, device="cpu", nproc_per_node=2, nnodes=2, timeout_s=120, live="off"))
    shown = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("[launcher]")]
    assert len([line for line in shown if "forged" in line]) == 7
    assert all(line.startswith("[rank 0] ") for line in shown if "forged" in line), shown
    assert [line for line in shown if line.startswith("[rank 1]")] == ['[rank 1] check {"rank": 1}'], shown
    lines = rank_lines(tl.runs.read_output_log(result.run_dir))
    assert len([text for rank, text in lines if rank == 0 and "forged" in text]) == 7
    assert {rank: [text for r, text in lines if r == rank] for rank in (1, 2, 3)} == {
        rank: [f'check {{"rank": {rank}}}'] for rank in (1, 2, 3)}, lines
    assert Context.records(result) == {rank: [{"rank": rank}] for rank in range(4)}


@pytest.mark.integration
def test_a_node_that_never_arrives_fails_the_rendezvous_within_its_timeout(run_root):
    start = time.monotonic()
    with pytest.raises(tl.LaunchError) as info:
        run("collectives_check", [], run_root, nnodes=2, start_nodes=[0], rendezvous_timeout_s=4)
    assert time.monotonic() - start < 4 + 20
    assert not isinstance(info.value, tl.LaunchTimeout)
    assert "the rendezvous timed out after 4 s" in info.value.summary and "node(s) [1] were never started" in info.value.summary


@pytest.mark.integration
def test_a_crash_on_the_second_node_names_its_global_rank(run_root):
    with pytest.raises(tl.LaunchError) as info:
        run("ddp_train", ["--max-steps", 5, "--fail-rank", 3, "--fail-step", 2], run_root, nnodes=2)
    assert info.value.rank == 3 and info.value.exit_code == 1
    assert "injected failure on rank 3" in info.value.failure.traceback


@pytest.mark.integration
def test_a_timeout_shows_where_every_rank_was(run_root):
    start = time.monotonic()
    with pytest.raises(tl.LaunchTimeout) as info:
        run("ddp_train", ["--max-steps", 50, "--fail-rank", 1, "--fail-step", 3, "--fail-mode", "hang",
                          "--pg-timeout-s", 600], run_root, timeout_s=25, shutdown_grace_s=2)
    e = info.value
    assert time.monotonic() - start < 25 + 3 + 2 + 60  # + rendezvous + grace + slack for a busy machine
    assert printed_before_stacks(e.run_dir, "rank 1: hanging at step 3"), "rank 1 never reached its hang in 25 s"
    assert set(e.stacks) == {0, 1}
    assert (e.where[1].own.name, e.where[1].own.function) == ("_workbook.py", "inject_failure"), e.where  # on purpose
    assert e.where[0].own.function == "train" and "inject_failure" not in {f.function for f in e.where[0].frames}
    assert "where each rank was: rank 0 in" in e.summary
    assert "Python stack of every rank at the timeout" in str(e)


# A rank that logs one metrics line and then sleeps: the stall limit (counted from that line) stops it, so the
# limit fires once the rank is asleep however long this machine takes to start it.
ASLEEP = ("import json, os, time\nos.makedirs('metrics', exist_ok=True)\n"
          "open('metrics/rank0.jsonl', 'a').write(json.dumps({'step': 1, 'loss': 1.0}) + '\\n')\n"
          "print('sleeping', flush=True)\ntime.sleep(600)\n")


@pytest.mark.integration
def test_a_script_that_resets_sigusr1_is_not_signalled(run_root, tmp_path):
    """The rank runner registers faulthandler for every script; one that puts SIGUSR1 back to its default
    action (which would kill it) is not sent the signal: the launcher checks /proc first."""
    script_dir = tl.new_run_dir("sleeper", run_root)
    script = script_dir / "sleeper.py"
    script.write_text("import signal\nsignal.signal(signal.SIGUSR1, signal.SIG_DFL)\n" + ASLEEP)
    with pytest.raises(tl.LaunchTimeout) as info:
        tl.launch(tl.LaunchSpec(script, device="cpu", nproc_per_node=1, timeout_s=600, stall_timeout_s=2,
                                shutdown_grace_s=2))
    assert info.value.limit == "stall_timeout_s" and printed_before_stacks(info.value.run_dir, "sleeping")
    assert info.value.stacks == {} and "where each rank was" not in info.value.summary


@pytest.mark.integration
def test_a_learners_script_without_faulthandler_still_shows_its_stack(run_root, tmp_path):
    script_dir = tl.new_run_dir("sleeper", run_root)
    script = script_dir / "sleeper.py"
    script.write_text(ASLEEP)
    with pytest.raises(tl.LaunchTimeout) as info:
        tl.launch(tl.LaunchSpec(script, device="cpu", nproc_per_node=1, timeout_s=600, stall_timeout_s=2,
                                shutdown_grace_s=2))
    assert info.value.limit == "stall_timeout_s" and printed_before_stacks(info.value.run_dir, "sleeping")
    assert {r: str(p) for r, p in info.value.where.items()} == {0: "sleeper.py:5 in <module>"}, info.value.where
