"""``tl.launch`` on SLURM (``LaunchSpec(slurm=SlurmSpec(...))``), against the local two-node cluster the session's
``slurm_cluster`` fixture starts (tests/conftest.py): a 2-node x 2-rank DDP job, a failing node, a kernel-style
interrupt, a stalled job stopped with every rank's stack, a job that can never start; each leaves an empty queue and
no process."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import private_slurm_cluster, wait_no_job_processes

import tutorial_lib as tl
from tutorial_lib.diagnosis.cause_ids import CauseId
from tutorial_lib.exercises.core import Context
from tutorial_lib.slurm import JobState, NeverStarts, cancel, queue, submit, wait_for_state
from tutorial_lib.torchrun.attempts import last_attempt
from tutorial_lib.torchrun.output_lines import rank_lines

JOB_TIMEOUT_S = 300  # each launch's limit; the jobs take 10-60 s on this 2-core machine, depending on its load
CANCEL_S = 120  # the longest wait for a cancelled job to leave the queue (KillWait is 30 s by default)


def on_cluster(cluster, **fields) -> tl.slurm.SlurmSpec:
    """A ``SlurmSpec`` for the local cluster: its slurm.conf, gloo on loopback."""
    return tl.slurm.SlurmSpec(conf=cluster.conf, socket_ifname="lo", **fields)


def assert_nothing_left(cluster, run_dir: Path) -> None:
    """The queue is empty, no process of the run (torchrun, ranks) and no job step of the cluster is left."""
    assert queue(conf=cluster.conf) == []
    assert wait_no_job_processes(str(run_dir)) == []
    deadline = time.monotonic() + 60
    while cluster.job_steps() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cluster.job_steps() == []


def node_of(job: tl.launcher.slurm_job.SlurmJob, rank: int) -> int:
    return next(node for node, ranks in job.node_ranks.items() if rank in ranks)


@pytest.mark.integration
def test_a_two_node_ddp_launch_streams_every_rank_and_leaves_a_run_directory_like_a_local_one(slurm_cluster, run_root,
                                                                                             capsys):
    result = tl.run_script("ddp_train", ["--max-steps", 6, "--log-every", 1], runs_dir=run_root, nnodes=2,
                           nproc_per_node=2, timeout_s=JOB_TIMEOUT_S, slurm=on_cluster(slurm_cluster), live="text")
    shown = capsys.readouterr().out
    job, run_dir = result.job, result.run_dir
    assert isinstance(result, tl.LaunchResult) and result.returncode == 0
    assert (job.state, job.exit_code, job.nodes) == ("COMPLETED", 0, ("node0", "node1"))
    # Each node ran a block of 2 consecutive global ranks (which block is the c10d rendezvous' choice).
    assert sorted(job.node_ranks.values()) == [[0, 1], [2, 3]] and set(job.node_ranks) == {0, 1}
    metrics = result.metrics()
    assert sorted(metrics["rank"].unique()) == [0, 1, 2, 3] and set(metrics["world_size"]) == {4}
    local = metrics.groupby("rank")["local_rank"].first()
    assert all(sorted(local[r] for r in ranks) == [0, 1] for ranks in job.node_ranks.values())
    per_step = metrics.groupby("step")["loss_global"].agg(["nunique", "count"])
    assert list(per_step.index) == [1, 2, 3, 4, 5, 6] and (per_step["nunique"] == 1).all() and (per_step["count"] == 4).all()
    assert metrics.groupby("step")["loss_local"].nunique().min() == 4, "4 shards of data: 4 local losses"
    # The cell saw the job's state and every rank's lines, rank-prefixed, streamed from the nodes' files.
    assert f"SLURM job {job.job_id}: RUNNING on node[0-1]" in shown and f"SLURM job {job.job_id}: COMPLETED" in shown
    for rank in range(4):
        assert re.search(rf"^\[rank {rank}\] step 6/6: ", shown, re.M), shown[-2000:]
    log = (run_dir / "output.log").read_text()
    assert {int(r) for r in re.findall(r"^\[rank (\d+)\] step 6/6", log, re.M)} == {0, 1, 2, 3}
    # The run directory: the sbatch command and the batch script, per-node logs in the local layout, run.json.
    command = (run_dir / "command.txt").read_text()
    assert re.search(r"^cd \S+ && .*SLURM_CONF=\S+ sbatch --parsable job\.sh$", command, re.M), command[:500]
    assert command.split("\n", 1)[1].split("\n", 1)[1] == (run_dir / "job.sh").read_text()
    assert subprocess.run(["bash", "-n", str(run_dir / "job.sh")]).returncode == 0
    for node in (0, 1):
        assert sorted(last_attempt(run_dir / "logs" / f"node{node}").rank_dirs()) == [0, 1]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and (record["nnodes"], record["nproc_per_node"]) == (2, 2)
    assert record["slurm_job"]["job_id"] == job.job_id and record["slurm_job"]["nodes"] == ["node0", "node1"]
    assert "cannot sample" in result.memory_notes()[0]
    with pytest.raises(tl.errors.MetricsError, match="cannot sample their memory"):
        result.memory_samples()
    assert_nothing_left(slurm_cluster, run_dir)


@pytest.mark.integration
def test_on_slurm_a_rank_cannot_write_another_ranks_lines(slurm_cluster, run_root, capsys):
    """Issue 44 on SLURM, where the launcher reads each rank's files under logs/node<N>/ and each node's torchrun
    output from SLURM's file: rank 0's forged prefixes stay rank 0's, in the cell, in output.log read back and in the
    exercise checks' records; torchrun's file holds none of the ranks' lines."""
    folder = tl.new_run_dir("prefixes", run_root)
    script = Path(shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "forged_prefixes.py", folder))
    result = tl.launch(tl.LaunchSpec(script, nnodes=2, nproc_per_node=2, timeout_s=JOB_TIMEOUT_S, live="text",
                                     slurm=on_cluster(slurm_cluster)))
    shown = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("[launcher]")]
    assert len([line for line in shown if "forged" in line]) == 7
    assert all(line.startswith("[rank 0] ") for line in shown if "forged" in line), shown
    assert [line for line in shown if line.startswith("[rank 1]")] == ['[rank 1] check {"rank": 1}'], shown
    lines = rank_lines(tl.runs.read_output_log(result.run_dir))
    assert len([text for rank, text in lines if rank == 0 and "forged" in text]) == 7
    assert {rank: [text for r, text in lines if r == rank] for rank in (1, 2, 3)} == {
        rank: [f'check {{"rank": {rank}}}'] for rank in (1, 2, 3)}, lines
    assert Context.records(result) == {rank: [{"rank": rank}] for rank in range(4)}
    assert sorted(result.job.node_ranks.values()) == [[0, 1], [2, 3]]
    for node in (0, 1):
        assert "forged" not in (result.run_dir / f"forged_prefixes-{result.job.job_id}-node{node}.out").read_text()
    assert_nothing_left(slurm_cluster, result.run_dir)


@pytest.fixture(scope="module")
def failed_node_run(slurm_cluster, tmp_path_factory):
    """A 2 x 2 job in which rank 3 raises at step 2 (the others' collective timeout 600 s): its ``LaunchError``."""
    root = tmp_path_factory.mktemp("slurm-fail")
    with pytest.raises(tl.LaunchError) as info:
        tl.run_script("ddp_train", ["--max-steps", 500, "--fail-rank", 3, "--fail-step", 2, "--pg-timeout-s", 600],
                      runs_dir=root, nnodes=2, nproc_per_node=2, timeout_s=JOB_TIMEOUT_S,
                      slurm=on_cluster(slurm_cluster), live="off")
    return info.value


@pytest.mark.integration
def test_a_failing_rank_fails_the_launch_naming_the_rank_its_error_and_its_node(slurm_cluster, failed_node_run):
    error, job = failed_node_run, failed_node_run.job
    # It ended by itself (srun --kill-on-bad-exit=1), long before the 600 s collective timeout and the launch's limit.
    assert not isinstance(error, tl.LaunchTimeout) and job.state == "FAILED" and job.reason == "NonZeroExitCode"
    assert error.rank == 3 and error.exit_code == 1
    assert "RuntimeError: injected failure on rank 3 at step 2" in error.failure.traceback
    node = node_of(job, 3)
    # A peer still running when the job was stopped adds where it was ("when stopped: rank 0 was in ..."), or not:
    # which one depends on how fast srun stops the other ranks.
    assert re.match(rf"ddp_train\.py failed on rank 3 \(exit code 1\) on node {node} \(node{node}\); "
                    rf"(when stopped: (rank \d+ was in [^;]+; )+)?SLURM job {job.job_id} ended FAILED",
                    error.summary), error.summary
    assert error.headline.render("zh") == f"ddp_train.py 在 rank 3 上失败（退出码 1），在节点 {node}（node{node}）上", \
        error.headline.render("zh")  # what a zh notebook's live view shows
    record = json.loads((error.run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["summary"] == error.summary
    assert record["slurm_job"]["node_ranks"] == {str(n): ranks for n, ranks in job.node_ranks.items()}
    assert_nothing_left(slurm_cluster, error.run_dir)


@pytest.mark.integration
def test_the_doctor_reads_a_failed_slurm_run_directory(failed_node_run):
    run_dir, job = failed_node_run.run_dir, failed_node_run.job
    d = tl.diagnose(run_dir)
    assert d.failed and d.error == "RuntimeError: injected failure on rank 3 at step 2 (--fail-rank/--fail-step)"
    assert (d.cause_id, d.cause_fields) == (CauseId.PYTHON_EXCEPTION, {"name": "RuntimeError"})
    node = node_of(job, 3)
    if d.rank != 3 and node != 1:
        # Known gap, reported for the lead to reconcile with the doctor's multi-node rule: it numbers the error file
        # of logs/node<N>/.../<local rank>/ as rank N * nproc_per_node + local rank, taking the folder's N for
        # torchrun's node rank. On SLURM, N is $SLURM_NODEID, and the c10d rendezvous (which sorts the agents by host
        # and pid) gave this run's SLURM node 1 the ranks 0 and 1.
        pytest.xfail(f"the doctor named rank {d.rank}: SLURM node {node} ran ranks {job.node_ranks[node]} "
                     f"(run.json's slurm_job.node_ranks {job.node_ranks}), read as node {node}'s ranks "
                     f"{[node * 2, node * 2 + 1]}")
    assert d.rank == 3 and d.exit_code == 1


@pytest.mark.integration
def test_a_stalled_job_is_cancelled_after_every_ranks_stack(slurm_cluster, run_root):
    with pytest.raises(tl.LaunchTimeout) as info:
        tl.run_script("ddp_train", ["--max-steps", 500, "--fail-rank", 1, "--fail-step", 3, "--fail-mode", "hang",
                                    "--pg-timeout-s", 600], runs_dir=run_root, nnodes=2, nproc_per_node=2,
                      timeout_s=JOB_TIMEOUT_S, stall_timeout_s=5, slurm=on_cluster(slurm_cluster), live="off")
    error = info.value
    assert error.limit == "stall_timeout_s" and error.job.state == "CANCELLED"
    # scancel --signal=USR1 reached every rank (torchrun ignores it): four stacks, the culprit in inject_failure.
    assert sorted(error.stacks) == [0, 1, 2, 3], error.stacks
    assert error.where[1].own.function == "inject_failure"
    assert all(error.where[r].own.function != "inject_failure" for r in (0, 2, 3)), error.where
    assert error.last_steps == {0: 2, 1: 2, 2: 2, 3: 2}
    assert f"SLURM job {error.job.job_id} was cancelled (scancel) while it ran on node0, node1" in error.summary
    assert json.loads((error.run_dir / "run.json").read_text())["status"] == "timeout"
    assert_nothing_left(slurm_cluster, error.run_dir)


@pytest.mark.integration
def test_a_job_that_asks_for_more_nodes_than_exist_shows_its_reason_and_is_cancelled(slurm_cluster, run_root, capsys):
    with pytest.raises(tl.LaunchError) as info:
        tl.run_script("ddp_train", ["--max-steps", 5], runs_dir=run_root, nnodes=3, nproc_per_node=2,
                      timeout_s=JOB_TIMEOUT_S, slurm=on_cluster(slurm_cluster), live="off")
    error, job = info.value, info.value.job
    assert not isinstance(error, tl.LaunchTimeout), "cancelled for its reason, not at the launch's limit"
    # SLURM 22.05's first scheduling pass says PartitionConfig, a later one PartitionNodeLimit: either never starts.
    reason = job.never_starts
    assert reason in (NeverStarts.PARTITION_CONFIG, NeverStarts.PARTITION_NODE_LIMIT), job
    assert (job.state, job.waited_for, job.nodes) == ("CANCELLED", reason.value, ())
    assert f"SLURM job {job.job_id}: PENDING, waiting: {reason.value}" in capsys.readouterr().out
    assert error.summary.startswith(f"ddp_train.py cannot start: SLURM job {job.job_id} was pending with reason "
                                    f"{reason.value} ("), error.summary
    assert error.summary.endswith("; it was cancelled (scancel); to start it, ask for at most 2 nodes: nnodes=3, but "
                                  "sinfo lists 2"), error.summary
    zh = error.headline.render("zh")
    assert zh.startswith(f"ddp_train.py 无法启动：SLURM 作业 {job.job_id} 一直在排队，原因 {reason.value}（"), zh
    assert zh.endswith("要让它启动：最多请求 2 个节点：nnodes=3，而 sinfo 只列出 2 个"), zh
    assert json.loads((error.run_dir / "run.json").read_text())["status"] == "failed"
    assert_nothing_left(slurm_cluster, error.run_dir)


@pytest.mark.integration
def test_a_job_asking_more_cpus_per_task_than_a_node_has_is_cancelled_within_seconds_naming_what_to_change(
        slurm_cluster, run_root):
    """Issue 34: 64 CPUs per task on 2-CPU nodes: SLURM keeps it PENDING (PartitionConfig) for ever; the launch
    cancels it at the first look that sees the reason, far below its timeout_s."""
    started = time.monotonic()
    with pytest.raises(tl.LaunchError) as info:
        tl.run_script("ddp_train", ["--max-steps", 5], runs_dir=run_root, nnodes=1, nproc_per_node=1,
                      timeout_s=JOB_TIMEOUT_S, slurm=on_cluster(slurm_cluster, cpus_per_task=64), live="off")
    took_s = time.monotonic() - started
    error, job = info.value, info.value.job
    assert not isinstance(error, tl.LaunchTimeout)
    assert (job.state, job.never_starts, job.waited_for, job.nodes) == ("CANCELLED", NeverStarts.PARTITION_CONFIG,
                                                                         "PartitionConfig", ())
    record = json.loads((error.run_dir / "run.json").read_text())
    print(f"submit to cancellation: {record['wall_time_s']:.2f} s; the whole call {took_s:.2f} s")
    assert record["wall_time_s"] < 30 and took_s < 60, (record["wall_time_s"], took_s)  # timeout_s is 300
    assert record["status"] == "failed" and record["slurm_job"]["never_starts"] == "PartitionConfig"
    assert error.summary == (f"ddp_train.py cannot start: SLURM job {job.job_id} was pending with reason "
                             "PartitionConfig (no node of its partition has what it asks for per node (CPUs, memory, "
                             "GPUs)); it was cancelled (scancel); to start it, ask for at most 2 CPUs per task: "
                             "SlurmSpec.cpus_per_task=64, but the partition's nodes have at most 2 CPUs")
    assert error.headline.render("zh").endswith("要让它启动：每个任务最多请求 2 个 CPU：SlurmSpec.cpus_per_task=64，而分区中的"
                                                 "节点最多只有 2 个 CPU"), error.headline.render("zh")
    from tutorial_lib.diagnosis.causes import CauseId  # the doctor names it, from the error and from the folder alike

    assert tl.diagnose(error).cause_id == tl.diagnose(error.run_dir).cause_id == CauseId.SLURM_NEVER_STARTS
    assert_nothing_left(slurm_cluster, error.run_dir)


@pytest.mark.integration
def test_after_sbatch_refuses_a_job_the_doctor_says_so_with_sbatchs_message(slurm_cluster, run_root, capsys):
    """Issue 34: the doctor said the run directory "holds no output.log" beside an empty output.log."""
    with pytest.raises(tl.SlurmError) as info:
        tl.run_script("ddp_train", ["--max-steps", 5], runs_dir=run_root, nnodes=1, nproc_per_node=1,
                      timeout_s=JOB_TIMEOUT_S, slurm=on_cluster(slurm_cluster, sbatch_args=["--mem=999999"]),
                      live="text")
    assert "Requested node configuration is not available" in info.value.stderr
    assert "[launcher] failed: ddp_train.py was not submitted: sbatch refused the job (sbatch: error: Batch job " \
           "submission failed: Requested node configuration is not available)" in capsys.readouterr().out
    (run_dir,) = run_root.iterdir()
    assert (run_dir / "output.log").read_text() == "" and not (run_dir / "logs").exists()
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["status"], record["submit_error"]) == ("refused", info.value.stderr)
    d = tl.diagnose(run_dir)
    assert (d.failed, d.submitted, d.cause_id, d.evidence) == (True, False, CauseId.SBATCH_REFUSED, info.value.stderr)
    text = str(d)
    assert "sbatch refused the job, so no SLURM job ran" in text and "holds no output.log" not in text, text
    assert "empty: no step ran" in text and "Memory specification can not be satisfied" in text, text
    assert queue(conf=slurm_cluster.conf) == []


PENDING_LAUNCHER = textwrap.dedent("""
    import sys
    import tutorial_lib as tl
    spec = tl.slurm.SlurmSpec(conf=sys.argv[2], socket_ifname="lo")
    tl.run_script("ddp_train", ["--max-steps", 2], runs_dir=sys.argv[1], nnodes=1, nproc_per_node=1, timeout_s=600,
                  slurm=spec, live="text")
""")


@pytest.mark.integration
def test_a_job_waiting_for_nodes_another_job_holds_is_shown_pending_with_its_reason(slurm_cluster, run_root,
                                                                                    tmp_path):
    """Issue 34: while another job holds both nodes the launch's view says "pending" and SLURM's reason (it said
    "running, no step reported yet"); once the nodes are free the job runs and finishes."""
    blocker_script = tmp_path / "hold.sh"
    blocker_script.write_text("#!/bin/bash\nsleep 600\n")
    blocker = submit(blocker_script, ["-N2", "--exclusive", "--time=00:15:00", f"--output={tmp_path}/hold-%j.out"],
                     conf=slurm_cluster.conf, cwd=tmp_path)
    lines: list[str] = []
    try:
        wait_for_state(blocker, {JobState.RUNNING}, timeout_s=JOB_TIMEOUT_S, conf=slurm_cluster.conf)
        proc = subprocess.Popen([sys.executable, "-u", "-c", PENDING_LAUNCHER, str(run_root), str(slurm_cluster.conf)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + JOB_TIMEOUT_S
            # The terminal view's progress line while the job waits (every 3 s): a state to wait for, not seconds.
            while not any("] pending: SLURM job" in line for line in lines):
                assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
                time.sleep(0.2)
            cancel(blocker, conf=slurm_cluster.conf, timeout_s=CANCEL_S)
            assert proc.wait(timeout=JOB_TIMEOUT_S) == 0, "".join(lines)[-3000:]
            reader.join(timeout=10)
        finally:
            proc.kill()
            proc.wait()
    finally:
        cancel(blocker, conf=slurm_cluster.conf, timeout_s=CANCEL_S)
    out = "".join(lines)
    job_id = int(re.search(r"submitted SLURM job (\d+)", out).group(1))
    waited = re.search(rf"SLURM job {job_id}: PENDING, waiting: (\w+)", out)
    assert waited and waited.group(1) in ("Resources", "Priority"), out[-3000:]
    assert re.search(rf"^\[progress +[\d.]+ s\] pending: SLURM job {job_id} waits in the queue \((Resources|Priority)\), "
                     r"no rank started yet \(\d+ s\)$", out, re.M), out[-3000:]
    assert "running, no step reported yet" not in out.split(f"SLURM job {job_id}: RUNNING")[0], out[-3000:]
    (run_dir,) = run_root.iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and record["slurm_job"]["waited_for"] in ("Resources", "Priority")
    assert_nothing_left(slurm_cluster, run_dir)


@pytest.mark.integration
def test_with_no_reason_to_cancel_a_pending_job_waits_until_the_launchs_limit(slurm_cluster, run_root):
    with pytest.raises(tl.LaunchTimeout) as info:
        tl.run_script("ddp_train", ["--max-steps", 5], runs_dir=run_root, nnodes=3, nproc_per_node=2, timeout_s=2,
                      slurm=on_cluster(slurm_cluster, cancel_pending_reasons=()), live="off")
    assert info.value.job.state == "CANCELLED" and info.value.job.nodes == () and info.value.limit == "timeout_s"
    assert f"SLURM job {info.value.job.job_id} was cancelled (scancel) while it waited in the queue" in info.value.summary
    assert_nothing_left(slurm_cluster, info.value.run_dir)


LAUNCHER = textwrap.dedent("""
    import sys
    import tutorial_lib as tl
    spec = tl.slurm.SlurmSpec(conf=sys.argv[2], socket_ifname="lo")
    tl.run_script("ddp_train", ["--max-steps", 100000, "--step-delay-s", 0.05], runs_dir=sys.argv[1], nnodes=2,
                  nproc_per_node=2, timeout_s=600, slurm=spec, live="off")
""")


@pytest.mark.integration
def test_an_interrupt_cancels_the_job_and_leaves_nothing(slurm_cluster, run_root):
    """SIGINT to the launching process, as a kernel interrupt sends it, once every rank trains."""
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(run_root), str(slurm_cluster.conf)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while len(list(run_root.glob("*/metrics/rank*.jsonl"))) < 4:  # every rank has logged a step
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
    (run_dir,) = run_root.iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "interrupted" and record["slurm_job"]["state"] == JobState.CANCELLED.value
    assert re.search(r"\[launcher\] interrupted: SLURM job \d+ was cancelled \(scancel\) while it ran on node0, node1; "
                     r"it has left the queue", out), out[-2000:]
    assert_nothing_left(slurm_cluster, run_dir)


def test_a_slurm_conf_that_does_not_answer_is_reported_not_raised(monkeypatch, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=1\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    target = tl.slurm.connect_slurm()
    if "not installed" in target.reason:
        pytest.skip(target.reason)
    assert target.kind == "unavailable" and target.conf == conf and "(SLURM_CONF)" in target.reason, target


@pytest.mark.integration
def test_connect_slurm_starts_the_local_cluster_and_stops_only_the_one_it_started(slurm_cluster, tmp_path, monkeypatch):
    """The notebook's call: a cluster found up is left running; one started here is stopped by close()."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr("tutorial_lib.slurm.target.SYSTEM_CONFS", ())
    found = tl.slurm.connect_slurm(state_dir=slurm_cluster.state_dir)
    assert (found.kind, found.started, found.conf) == ("local", False, slurm_cluster.conf)
    assert found.spec(partition="debug") == tl.slurm.SlurmSpec(conf=slurm_cluster.conf, socket_ifname="lo", partition="debug")
    assert found.close() is False and slurm_cluster.is_up(), "a cluster found up is left running"
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))  # make slurm's export line: that local cluster
    assert tl.slurm.connect_slurm().kind == "local"
    monkeypatch.delenv("SLURM_CONF")
    private = private_slurm_cluster()
    try:
        started = tl.slurm.connect_slurm(state_dir=private.state_dir)
        assert (started.kind, started.started) == ("local, started here", True) and private.is_up()
        assert set(started.nodes) == {"node0", "node1"}
    finally:
        assert started.close() is True
    assert private.leftovers() == [] and not private.is_up() and started.close() is False
    shutil.rmtree(private.state_dir)
