"""A launch on SLURM, planned without submitting anything: the batch script and sbatch command it will use, the
values it refuses before anything starts, and how srun's and squeue's lines are read."""

import shlex
import sys

import pytest

import tutorial_lib as tl
from tutorial_lib.launcher.plan import RANK_RUNNER
from tutorial_lib.launcher.slurm_job import node_exit_codes, plan_slurm_launch
from tutorial_lib.slurm.batch import time_limit
from tutorial_lib.slurm.target import SlurmTarget, connect_slurm
from tutorial_lib.slurm import local_cluster


@pytest.fixture
def script(tmp_path):
    return tl.write_script("ddp_train", tmp_path)


def test_the_plan_is_the_learners_batch_script_with_the_rank_runner_in_front(script, tmp_path):
    spec = tl.LaunchSpec(script, args=["--max-steps", 5], nnodes=2, timeout_s=600, env={"MY_FLAG": "1"},
                         slurm=tl.slurm.SlurmSpec(partition="gpu", account="proj1", sbatch_args=["--qos=debug"]))
    plan = plan_slurm_launch(spec)
    assert (plan.device_plan.device, plan.device_plan.backend, plan.device_plan.nproc_per_node) == ("cpu", "gloo", 2)
    assert plan.job_name == "ddp_train" and plan.nodes == (0, 1)
    assert plan.sbatch_argv == ["sbatch", "--parsable", "--qos=debug", "job.sh"]
    torchrun = shlex.join([sys.executable, "-m", "torch.distributed.run"])
    for line in ("#SBATCH --nodes=2", "#SBATCH --partition=gpu", "#SBATCH --account=proj1", "#SBATCH --time=00:15:00",
                 f"#SBATCH --chdir={tmp_path}", f'exec {torchrun} --log-dir "logs/node$SLURM_NODEID"',
                 "--rdzv-conf join_timeout=60", f"{RANK_RUNNER} {script} --max-steps 5\n"):
        assert line in plan.batch_script, line
    assert "gpus-per-node" not in plan.batch_script and "\nexport GLOO_SOCKET_IFNAME" not in plan.batch_script
    assert plan.job_env["MY_FLAG"] == "1" and plan.node_log_dir(1) == tmp_path / "logs" / "node1"
    text = plan.command_txt()
    assert text.startswith(f"cd {tmp_path} && MY_FLAG=1 sbatch --parsable --qos=debug job.sh\n# job.sh, submitted")
    assert text.endswith(plan.batch_script)
    assert not (tmp_path / "command.txt").exists() and not (tmp_path / "job.sh").exists(), "planning writes nothing"


def test_a_gpu_job_requests_one_gpu_per_rank_on_the_nodes_not_here(script):
    plan = plan_slurm_launch(tl.LaunchSpec(script, nnodes=2, slurm=tl.slurm.SlurmSpec(gpus_per_node=4, conf=None)))
    assert (plan.device_plan.device, plan.device_plan.backend, plan.device_plan.nproc_per_node) == ("cuda", "nccl", 4)
    assert "#SBATCH --gpus-per-node=4" in plan.batch_script and "--nproc-per-node 4" in plan.batch_script


@pytest.mark.parametrize("fields, message", [
    ({"start_nodes": [0]}, "start_nodes=\\[0\\] does not apply to a launch on SLURM"),
    ({"master_port": 29500}, "master_port=29500 does not apply to a launch on SLURM"),
    ({"warm": True}, "warm=True does not apply to a launch on SLURM"),
    ({"device": "cuda"}, "a CUDA job asks for GPUs"),
    ({"nproc_per_node": 2, "slurm": tl.slurm.SlurmSpec(gpus_per_node=4)}, "one rank per GPU"),
    ({"slurm": tl.slurm.SlurmSpec(gpus_per_node=-1)}, "gpus_per_node must be an integer >= 0"),
    ({"slurm": tl.slurm.SlurmSpec(poll_s=0)}, "poll_s must be a number of seconds > 0"),
    ({"slurm": tl.slurm.SlurmSpec(sbatch_args="--qos=debug")}, "sbatch_args must be a list of sbatch options"),
    ({"slurm": tl.slurm.SlurmSpec(conf="/nonexistent/slurm.conf")}, "is not a file"),
    ({"slurm": tl.slurm.SlurmSpec(job_name="my job")}, "job_name must be 1-64 letters"),
    ({"slurm": tl.slurm.SlurmSpec(partition="a b")}, "partition must be a non-empty name without spaces"),
    ({"slurm": tl.slurm.SlurmSpec(time_limit="1h")}, "time_limit must look like HH:MM:SS"),
    ({"slurm": "debug"}, "slurm must be a SlurmSpec or None"),
    ({"slurm": tl.slurm.SlurmSpec(cancel_pending_reasons="Resources")}, "cancel_pending_reasons must be a list"),
    ({"slurm": tl.slurm.SlurmSpec(cancel_pending_reasons=["PartitionConfig", "Resources"])},
     r"cancel_pending_reasons holds \['Resources'\], which can clear by themselves"),
])
def test_bad_values_are_refused_before_anything_is_submitted(script, fields, message):
    with pytest.raises(tl.ConfigError, match=message):
        plan_slurm_launch(tl.LaunchSpec(script, **{"slurm": tl.slurm.SlurmSpec(), **fields}))


def test_the_time_limit_leaves_the_launcher_five_minutes_to_stop_the_job_first():
    assert [time_limit(s) for s in (1, 60, 300, 3600, 86400)] == ["00:06:00", "00:06:00", "00:10:00", "01:05:00",
                                                                  "1-00:05:00"]


def test_srun_says_which_node_task_failed():
    lines = ["[batch] srun: error: node1: task 1: Exited with exit code 3",
             "[batch] srun: launch/slurm: _step_signal: Terminating StepId=5.0",
             "[batch] srun: error: node0: task 0: Killed"]
    assert node_exit_codes(lines, (0, 1), job_exit_code=3) == {0: 1, 1: 3}
    assert node_exit_codes(["[batch] slurmstepd: error: *** JOB 5 CANCELLED ***"], (0, 1), 0) == {0: 0, 1: 0}
    assert node_exit_codes([], (0, 1), 2) == {0: 2, 1: 2}, "srun named none: the job's exit code for every node"


def test_connect_slurm_says_why_it_cannot_start_the_local_cluster(monkeypatch, tmp_path):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr("tutorial_lib.slurm.target.SYSTEM_CONFS", ())
    monkeypatch.setattr(local_cluster.os, "geteuid", lambda: 1000)
    target = connect_slurm(state_dir=tmp_path / "cluster")
    assert isinstance(target, SlurmTarget) and not target.available and not target.started
    assert "runs its daemons as root" in target.reason and target.describe().startswith("SLURM unavailable: ")
    with pytest.raises(tl.errors.SlurmUnavailable, match="no SLURM cluster to submit to: the local SLURM cluster runs"):
        target.spec()
    assert target.close() is False



def test_a_queued_job_is_shown_pending_with_its_reason_until_it_runs():
    """Issue 34: a PENDING job was shown as "running, no step reported yet"."""
    from tutorial_lib.launcher.live import LiveView, Queued

    view = LiveView()
    view.set_queued(Queued(7, "Resources"))
    assert view.progress_lines(12.4) == ["pending: SLURM job 7 waits in the queue (Resources), no rank started yet (12 s)"]
    try:
        tl.set_language("zh")
        assert view.progress_lines(12.4) == ["排队中：SLURM 作业 7 在队列中等待（Resources），尚无 rank 启动（12 s）"]
    finally:
        tl.set_language("en")
    view.set_queued(Queued(7))  # PENDING before the scheduler's first pass: no reason yet
    assert view.progress_lines(1) == ["pending: SLURM job 7 waits in the queue, no rank started yet (1 s)"]
    view.set_queued(None)
    assert view.progress_lines(20) == ["running, no step reported yet (20 s)"]


def test_what_to_change_names_the_request_and_what_the_nodes_have():
    from tutorial_lib.slurm.target import Request, what_to_change
    from tutorial_lib.slurm import NeverStarts

    nodes = {"node0": 2, "node1": 2}
    change = what_to_change(NeverStarts.PARTITION_CONFIG, Request(1, 64, nodes))
    assert (str(change), change.render("zh")) == (
        "ask for at most 2 CPUs per task: SlurmSpec.cpus_per_task=64, but the partition's nodes have at most 2 CPUs",
        "每个任务最多请求 2 个 CPU：SlurmSpec.cpus_per_task=64，而分区中的节点最多只有 2 个 CPU")
    for reason in (NeverStarts.PARTITION_CONFIG, NeverStarts.PARTITION_NODE_LIMIT):
        assert str(what_to_change(reason, Request(3, None, nodes))) == "ask for at most 2 nodes: nnodes=3, but sinfo lists 2"
    assert str(what_to_change(NeverStarts.PARTITION_CONFIG, Request(1, None, {}))).startswith("ask for less per node")
    for reason in NeverStarts:  # every reason says what to change, in both languages
        change = what_to_change(reason, Request(1))
        en, zh = str(change), change.render("zh")
        assert en and zh and en != zh, reason
