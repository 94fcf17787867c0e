"""SLURM: the generated batch script and the client commands, against a real two-node cluster on this machine
(``python -m tutorial_lib slurm up``), started by the session's ``slurm_cluster`` fixture (tests/conftest.py)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import private_slurm_cluster, wait_no_job_processes

import tutorial_lib as tl
from tutorial_lib.__main__ import main
from tutorial_lib.errors import JobWaitTimeout, SlurmError, SlurmUnavailable
from tutorial_lib.slurm import (JobState, LocalCluster, cancel, job_info, job_nodes, queue, submit, wait_for_state,
                                wait_until_finished)
from tutorial_lib.slurm import local_cluster, processes
from tutorial_lib.slurm.commands import NeverStarts, parse_exit_code, parse_node_cpus, parse_squeue_line
from tutorial_lib.torchrun.attempts import last_attempt

JOB_TIMEOUT_S = 300  # the longest wait for a job's state; the jobs take 10-40 s on this 2-core machine
TORCHRUN = shlex.join([sys.executable, "-m", "torch.distributed.run"])  # this interpreter's torch on the nodes


# --- pure parts ------------------------------------------------------------------------------------------------

def test_slurm_conf_puts_two_nodes_on_loopback_each_with_its_own_port(tmp_path):
    text = local_cluster.render_slurm_conf(tmp_path, controller_port=7001, node_ports={"node0": 7002, "node1": 7003},
                                           cpus_per_node=2, munge_socket=tmp_path / "munge" / "munge.socket")
    for line in ("SlurmctldHost=localhost(127.0.0.1)", "SlurmctldPort=7001", "AuthType=auth/munge",
                 f"AuthInfo=socket={tmp_path}/munge/munge.socket", "ProctrackType=proctrack/linuxproc",
                 "TaskPlugin=task/none", "AccountingStorageType=accounting_storage/none",
                 "NodeName=node0 NodeAddr=127.0.0.1 Port=7002 CPUs=2 State=UNKNOWN",
                 "NodeName=node1 NodeAddr=127.0.0.1 Port=7003 CPUs=2 State=UNKNOWN",
                 "PartitionName=debug Nodes=node0,node1 Default=YES"):
        assert line in text.splitlines() or any(l.startswith(line) for l in text.splitlines()), line
    assert "cgroup" not in text.replace("No cgroups", "") and "Gres" not in text


def test_a_cpu_job_requests_no_gpu_and_a_gpu_job_one_rank_per_gpu():
    cpu = tl.slurm.slurm_script("ddp_train.py", ["--max-steps", 5], nnodes=2, nproc_per_node=2, partition="debug",
                          account="proj1", run_dir="/shared/runs/r1", socket_ifname="lo", rendezvous_port=None)
    assert "gpus-per-node" not in cpu and "NCCL_SOCKET_IFNAME" not in cpu.replace("# export NCCL", "")
    assert "--tee" not in cpu.replace("With --tee", "") and "LOG_LINE_PREFIX_TEMPLATE" not in cpu
    for line in ("#SBATCH --nodes=2", "#SBATCH --partition=debug", "#SBATCH --account=proj1",
                 "#SBATCH --chdir=/shared/runs/r1", "#SBATCH --output=%x-%j.out", "export GLOO_SOCKET_IFNAME=lo",
                 "srun --kill-on-bad-exit=1 --output=%x-%j-node%n.out \\\n"
                 # issue 48: this interpreter's torchrun, found without an activated venv (not `torchrun` by name)
                 f"""    bash -c 'trap "" USR1; exec {TORCHRUN} """
                 """--log-dir "logs/node$SLURM_NODEID" "$@"' torchrun \\\n""",
                 "    --nnodes 2 --nproc-per-node 2 --max-restarts 0 --rdzv-backend c10d \\\n",
                 '--rdzv-endpoint "$head_node:$rdzv_port" --redirects 3',  # issue 44: each rank's lines in its files
                 "export PYTHONUNBUFFERED=1",
                 "rdzv_port=$((29500 + SLURM_JOB_ID % 2000))"):
        assert line in cpu, line
    gpu = tl.slurm.slurm_script("train.py", nnodes=2, gpus_per_node=4, cpus_per_task=16, socket_ifname="ib0")
    assert "#SBATCH --gpus-per-node=4" in gpu and "--nproc-per-node 4" in gpu and "export OMP_NUM_THREADS=4" in gpu
    assert "export NCCL_SOCKET_IFNAME=ib0 GLOO_SOCKET_IFNAME=ib0" in gpu and "srun --kill-on-bad-exit=1 --cpus-per-task=16" in gpu
    assert "--partition" not in gpu and "--account" not in gpu and "--chdir" not in gpu and "--rdzv-conf" not in gpu
    timed = tl.slurm.slurm_script("train.py", nnodes=2, nproc_per_node=1, rendezvous_timeout_s=30,
                            torchrun="/venv/bin/python -m torch.distributed.run")
    assert "--rdzv-backend c10d --rdzv-conf join_timeout=30 \\\n" in timed
    assert """'trap "" USR1; exec /venv/bin/python -m torch.distributed.run --log-dir "logs/node$SLURM_NODEID" "$@"'""" in timed
    for text in (cpu, gpu, timed):
        syntax = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
        assert syntax.returncode == 0 and syntax.stderr == "", syntax.stderr


@pytest.mark.parametrize("fields, message", [
    ({"nproc_per_node": None}, "nproc_per_node is required for a CPU job"),
    ({"gpus_per_node": 4, "nproc_per_node": 2}, "run one rank per GPU"),
    ({"gpus_per_node": -1}, "gpus_per_node must be an integer >= 0"),
    ({"partition": "gpu large"}, "partition must be a non-empty name without spaces"),
    ({"run_dir": "/home/my runs"}, "run_dir must be a non-empty name without spaces"),
    ({"time_limit": "90"}, "time_limit must look like HH:MM:SS"),
    ({"rendezvous_port": 80}, "rendezvous_port must be an integer in 1024..65535"),
    ({"torchrun": ""}, "torchrun must be the torchrun command on the nodes"),
    ({"rendezvous_timeout_s": 0}, "rendezvous_timeout_s must be a number of seconds > 0 or None"),
])
def test_bad_batch_script_values_are_refused(fields, message):
    with pytest.raises(tl.ConfigError, match=message):
        tl.slurm.slurm_script("train.py", nnodes=2, **{"nproc_per_node": 2, **fields})


def test_squeue_lines_and_exit_codes_are_parsed():
    info = parse_squeue_line("17|PENDING|JobHeldUser||2\n")
    assert (info.job_id, info.state, info.reason, info.nodes, info.node_count) == (17, JobState.PENDING, "JobHeldUser", "", 2)
    assert not info.state.finished and JobState.FAILED.finished and not JobState.COMPLETING.finished
    with pytest.raises(SlurmError, match="state 'WEIRD', which tutorial_lib does not know"):
        parse_squeue_line("17|WEIRD|None|node0|1")
    assert parse_exit_code("JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=1:0 RunTime=1") == (1, 0)
    assert parse_exit_code("JobState=RUNNING") is None


# squeue -h -o '%i|%T|%r|%N|%D' on the local cluster (slurm-wlm 22.05): job 1 asked --cpus-per-task=64 of 2-CPU nodes,
# 4 held both nodes, 5 waited for them; before its first scheduling pass a job is PENDING with reason None.
CAPTURED_SQUEUE = """1|PENDING|PartitionConfig||1
5|PENDING|Resources||2
4|RUNNING|None|node[0-1]|2
6|PENDING|None||2
7|PENDING|Priority||2
"""


def test_a_pending_reason_after_which_a_job_never_starts_is_parsed_into_a_typed_value():
    never, resources, running, unlooked, priority = map(parse_squeue_line, CAPTURED_SQUEUE.splitlines())
    assert (never.state, never.never_starts, never.waiting_for) == (JobState.PENDING, NeverStarts.PARTITION_CONFIG,
                                                                   "PartitionConfig")
    assert (resources.never_starts, resources.waiting_for) == (None, "Resources")
    assert (priority.never_starts, priority.waiting_for) == (None, "Priority")
    assert (running.state, running.never_starts, running.waiting_for) == (JobState.RUNNING, None, "")
    assert (unlooked.state, unlooked.waiting_for) == (JobState.PENDING, ""), "None: no reason given yet"
    # A finished job's reason is how it ended, never a reason to cancel it.
    assert parse_squeue_line("9|CANCELLED|PartitionConfig||1").never_starts is None
    assert {r.value for r in NeverStarts} >= {"PartitionConfig", "PartitionNodeLimit", "BadConstraints"}
    assert not {"Resources", "Priority", "ReqNodeNotAvail", "JobHeldUser"} & {r.value for r in NeverStarts}


def test_sinfo_cpus_per_node_are_parsed():
    assert parse_node_cpus("node0|2\nnode1|2\n") == {"node0": 2, "node1": 2}
    assert parse_node_cpus("gpu7|128\nweird|N/A\n\n") == {"gpu7": 128}


def test_the_local_cluster_says_what_to_do_when_it_cannot_run(monkeypatch, tmp_path):
    monkeypatch.setattr(local_cluster.os, "geteuid", lambda: 1000)
    with pytest.raises(SlurmUnavailable, match=r"runs its daemons as root .* uid 1000: start it with `sudo python -m"):
        local_cluster.check_can_run()
    monkeypatch.setattr(local_cluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(local_cluster, "find_program", lambda name: None if name == "slurmd" else f"/usr/bin/{name}")
    with pytest.raises(SlurmUnavailable, match=r"slurmd not found .* `apt-get install -y --no-install-recommends slurm-wlm`"):
        local_cluster.check_can_run()
    private = tmp_path / "private"
    (private / "munge").mkdir(parents=True)
    private.chmod(0o700)
    with pytest.raises(tl.ConfigError, match=rf"{private} is not \(mode drwx------\): choose a state folder under /tmp"):
        local_cluster.check_socket_folder(private / "munge")
    deep = Path("/tmp") / ("x" * 100)
    with pytest.raises(tl.ConfigError, match="longer than 107 bytes"):
        local_cluster.check_socket_folder(deep)


def test_status_of_a_cluster_that_is_not_up(tmp_path, capsys):
    assert main(["slurm", "status", "--state-dir", str(tmp_path / "none")]) == 1
    out = capsys.readouterr().out
    assert "local SLURM cluster: down" in out and f"state folder: {tmp_path / 'none'}" in out
    assert "python -m tutorial_lib slurm up" in out


def test_a_malformed_owner_stamp_is_refused_by_the_command_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["slurm", "down", "--state-dir", "/tmp/none", "--if-owner", "1234"])
    assert e.value.code == 2
    assert "--if-owner: expected PID:CREATE_TIME (a PID and its psutil start time" in capsys.readouterr().err


def test_the_state_folder_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("TUTORIAL_LIB_SLURM_DIR", "/tmp/elsewhere")
    assert LocalCluster.default().conf == Path("/tmp/elsewhere/slurm.conf")
    assert LocalCluster.default("/tmp/flag").export_line() == "export SLURM_CONF=/tmp/flag/slurm.conf"
    monkeypatch.delenv("TUTORIAL_LIB_SLURM_DIR")
    assert LocalCluster.default().state_dir == Path(os.environ.get("TMPDIR") or "/tmp") / f"tutorial_lib-slurm-{os.getuid()}"


def test_a_daemon_that_ignores_sigterm_is_killed():
    ignores = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                "signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert ignores.stdout.readline() == "ready\n"
        processes.terminate(psutil.Process(ignores.pid), timeout_s=0.5)
        assert ignores.wait(timeout=10) == -9, "SIGKILL after the SIGTERM timeout"
    finally:
        ignores.kill()
        ignores.wait()
        ignores.stdout.close()


# --- the real cluster --------------------------------------------------------------------------------------------

def cluster_processes(cluster: LocalCluster) -> list[psutil.Process]:
    """Every live process that names the cluster's folder on its command line (munged, slurmctld, the slurmd's)."""
    marker = str(cluster.state_dir)
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


@pytest.mark.integration
def test_up_status_down_leaves_no_process(capsys):
    cluster = private_slurm_cluster()
    args = ["--state-dir", str(cluster.state_dir)]
    try:
        start = time.monotonic()
        assert main(["slurm", "up", *args]) == 0
        up_s = time.monotonic() - start
        started = capsys.readouterr().out
        assert "local SLURM cluster started" in started and "owner: nobody" in started, started
        assert main(["slurm", "up", *args]) == 0, "a second up is a no-op"
        assert f"already up in {cluster.state_dir}" in capsys.readouterr().out
        assert {d.name for d in cluster.daemons()} == {"munged", "slurmctld", "slurmd-node0", "slurmd-node1"}
        assert main(["slurm", "status", *args]) == 0
        status = capsys.readouterr().out
        assert f"export SLURM_CONF={cluster.conf}" in status and f"state folder: {cluster.state_dir}" in status
        assert "owner: nobody (started by `python -m tutorial_lib slurm up`): it runs until `slurm down`" in status
        assert cluster.owner() is None and not (cluster.state_dir / "watchdog.json").exists()
        assert re.search(r"^node0 +debug\* +idle", status, re.M) and re.search(r"^node1 +debug\* +idle", status, re.M)
        assert len(cluster_processes(cluster)) == 4  # munged, slurmctld, 2 x slurmd
        pids = {d.pid for d in cluster.daemons()}
    finally:
        start = time.monotonic()
        assert main(["slurm", "down", *args]) == 0
        down_s = time.monotonic() - start
    assert "stopped munged" in capsys.readouterr().out
    assert cluster.leftovers() == [] and cluster_processes(cluster) == []
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    assert main(["slurm", "down", *args]) == 0 and "was not running" in capsys.readouterr().out
    shutil.rmtree(cluster.state_dir)
    print(f"local cluster: up {up_s:.1f} s, down {down_s:.1f} s")


def submit_ddp(cluster, run_dir: Path, args, **script) -> int:
    """``ddp_train.py`` and its batch script in ``run_dir``, submitted with sbatch as a learner would."""
    script_path = tl.write_script("ddp_train", run_dir)
    job = tl.slurm.slurm_script(script_path.name, args, nnodes=2, nproc_per_node=2, run_dir=run_dir, socket_ifname="lo",
                          rendezvous_port=None, torchrun=TORCHRUN, time_limit="00:10:00", **script)
    (run_dir / "job.sh").write_text(job)
    return submit(run_dir / "job.sh", conf=cluster.conf, cwd=run_dir)


def rank_folders(run_dir: Path) -> dict[int, list[Path]]:
    """``{SLURM node index: its ranks' torchrun folders}`` (``logs/node<N>/``, the last attempt)."""
    return {int(node_dir.name.removeprefix("node")): sorted(last_attempt(node_dir).rank_dirs().values())
            for node_dir in sorted((run_dir / "logs").glob("node*"))}


def ranks_by_node(run_dir: Path) -> dict[int, set[int]]:
    """``{SLURM node index: global ranks it ran}``. A learner's batch script runs ddp_train.py without the workbook's
    rank runner, so no record names a folder's rank: each folder's is the rank whose metrics hold the local losses its
    step lines printed (``--log-every 1``; the 4 shards give 4 different local losses)."""
    metrics = tl.runs.read_metrics(run_dir)
    losses = {int(rank): {f"{loss:.5f}" for loss in group["loss_local"]} for rank, group in metrics.groupby("rank")}
    found = {}
    for node, folders in rank_folders(run_dir).items():
        printed = [set(re.findall(r"\(this rank's (\S+)\)", (folder / "stdout.log").read_text())) for folder in folders]
        found[node] = {rank for lines in printed for rank, logged in losses.items() if lines and lines <= logged}
    return found


@pytest.mark.integration
def test_a_two_node_ddp_job_runs_two_ranks_per_node_with_one_global_loss(slurm_cluster, run_root):
    run_dir = tl.new_run_dir("slurm-ddp", run_root)
    start = time.monotonic()
    job_id = submit_ddp(slurm_cluster, run_dir, ["--max-steps", 6, "--log-every", 1])
    info = wait_until_finished(job_id, conf=slurm_cluster.conf, timeout_s=JOB_TIMEOUT_S)
    elapsed_s = time.monotonic() - start
    assert (info.state, info.exit_code) == (JobState.COMPLETED, 0), (info, (run_dir / f"ddp-{job_id}.out").read_text())
    assert job_nodes(job_id, conf=slurm_cluster.conf) == ["node0", "node1"]
    metrics = tl.runs.read_metrics(run_dir, ranks=4)
    assert sorted(metrics["rank"].unique()) == [0, 1, 2, 3] and set(metrics["world_size"]) == {4}
    by_node = ranks_by_node(run_dir)
    assert set(by_node) == {0, 1} and sorted(by_node.values(), key=min) == [{0, 1}, {2, 3}], by_node
    local = dict(zip(metrics["rank"], metrics["local_rank"]))
    assert all({local[r] for r in ranks} == {0, 1} for ranks in by_node.values()), "LOCAL_RANK 0..1 on each node"
    per_step = metrics.groupby("step")["loss_global"].agg(["min", "max", "count"])
    assert list(per_step.index) == [1, 2, 3, 4, 5, 6] and (per_step["count"] == 4).all()
    assert (per_step["min"] == per_step["max"]).all(), "every rank holds the same all-reduced loss"
    assert metrics.groupby("step")["loss_local"].nunique().min() > 1, "the local losses differ: 4 shards of data"
    print(f"2 nodes x 2 ranks on the local cluster: {elapsed_s:.1f} s from sbatch to COMPLETED")


DOCS_SLURM = Path(__file__).resolve().parents[2] / "docs" / "slurm.md"


def docs_batch_example() -> str:
    """The Python block of docs/slurm.md that writes and submits a batch script (``tl.slurm.slurm_script``)."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS_SLURM.read_text(), re.S)
    (block,) = [b for b in blocks if "tl.slurm.slurm_script(" in b and '"sbatch"' in b]
    return block


def run_docs_example(cluster, cwd: Path, runs: Path, code: str) -> tuple[Path, object]:
    """Run ``code`` as a learner would, ``.venv/bin/python`` with no venv activated (``PATH`` holds no torchrun);
    wait for the job it submitted. Returns its run directory and its ``JobInfo``."""
    path = "/usr/bin:/bin"
    assert shutil.which("torchrun", path=path) is None, "the control needs a PATH without torchrun"
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "SLURM_CONF": str(cluster.conf),
           "TUTORIAL_LIB_RUNS_DIR": str(runs), "PYTHONPATH": str(DOCS_SLURM.parents[1])}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    job_id = int(re.fullmatch(r"Submitted batch job (\d+)\s*", done.stdout).group(1))
    (run_dir,) = runs.iterdir()
    return run_dir, wait_until_finished(job_id, conf=cluster.conf, timeout_s=JOB_TIMEOUT_S)


@pytest.mark.integration
def test_the_docs_batch_script_example_runs_as_written(slurm_cluster, tmp_path):
    """Issue 48: docs/slurm.md's example, run as written by ``.venv/bin/python`` with no venv activated, failed with
    ``torchrun: not found`` (exit 127): the batch script called torchrun by name. Now it calls this interpreter's
    torchrun: the job completes, 2 nodes x 2 ranks with one all-reduced loss. The control, the same example with
    ``torchrun="torchrun"`` (the old default), still fails that way."""
    code = docs_batch_example()
    assert 'socket_ifname="lo")' in code
    run_dir, info = run_docs_example(slurm_cluster, tmp_path, tmp_path / "runs", code)
    assert (info.state, info.exit_code) == (JobState.COMPLETED, 0), (info, sorted(p.name for p in run_dir.iterdir()))
    metrics = tl.runs.read_metrics(run_dir, ranks=4)
    assert sorted(metrics["rank"].unique()) == [0, 1, 2, 3] and set(metrics["world_size"]) == {4}
    assert metrics.groupby("step")["loss_global"].nunique().max() == 1, "every rank holds the same all-reduced loss"
    assert sorted(metrics["step"].unique()) == [1, 2, 3, 4, 5]
    named = code.replace('socket_ifname="lo")', 'socket_ifname="lo", torchrun="torchrun")')
    run_dir, info = run_docs_example(slurm_cluster, tmp_path, tmp_path / "runs-named", named)
    assert (info.state, info.exit_code) == (JobState.FAILED, 127), info
    said = "".join(p.read_text() for p in run_dir.glob("*.out"))
    assert "torchrun: not found" in said, said
    assert not (run_dir / "metrics").exists(), "no rank ran"


@pytest.mark.integration
def test_a_failing_rank_ends_the_job_failed_with_its_error_in_its_nodes_output(slurm_cluster, run_root):
    run_dir = tl.new_run_dir("slurm-fail", run_root)
    job_id = submit_ddp(slurm_cluster, run_dir, ["--max-steps", 500, "--fail-rank", 3, "--fail-step", 2,
                                                 "--pg-timeout-s", 600])
    info = wait_until_finished(job_id, conf=slurm_cluster.conf, timeout_s=JOB_TIMEOUT_S)
    assert info.state == JobState.FAILED and info.exit_code != 0, info
    # rank 3's traceback is in its own stderr.log under logs/node<N>/ (--redirects 3)
    raised = {node: folder for node, folders in rank_folders(run_dir).items() for folder in folders
              if "RuntimeError: injected failure on rank 3 at step 2" in (folder / "stderr.log").read_text()}
    assert len(raised) == 1, rank_folders(run_dir)
    node_of_rank3 = next(iter(raised))
    output = (run_dir / f"ddp-{job_id}-node{node_of_rank3}.out").read_text()  # torchrun's own lines only
    assert re.search(r"Root Cause.*\n.*\n.*\n.*\n\s+rank\s+: 3 \(local_rank: 1\)", output), "torchrun's summary names it"
    assert not re.search(r"^\[rank\d+\]:", output, re.M), "no rank's line copied into torchrun's output (--tee)"
    batch = (run_dir / f"ddp-{job_id}.out").read_text()
    assert f"srun: error: node{node_of_rank3}: task {node_of_rank3}: Exited with exit code 1" in batch, batch
    assert wait_no_job_processes(str(run_dir)) == []


@pytest.mark.integration
def test_scancel_of_a_running_job_leaves_an_empty_queue_and_no_process(slurm_cluster, run_root):
    run_dir = tl.new_run_dir("slurm-cancel", run_root)
    job_id = submit_ddp(slurm_cluster, run_dir, ["--max-steps", 100000, "--step-delay-s", 0.05])
    wait_for_state(job_id, {JobState.RUNNING}, conf=slurm_cluster.conf, timeout_s=JOB_TIMEOUT_S)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while len(list((run_dir / "metrics").glob("rank*.jsonl"))) < 4:  # every rank is training
        assert time.monotonic() < deadline, f"ranks did not start: {(run_dir / f'ddp-{job_id}.out').read_text()}"
        assert job_info(job_id, conf=slurm_cluster.conf).state == JobState.RUNNING
        time.sleep(0.5)
    final = cancel(job_id, conf=slurm_cluster.conf, timeout_s=JOB_TIMEOUT_S)
    assert final is not None and final.state == JobState.CANCELLED, final
    assert [j.job_id for j in queue(conf=slurm_cluster.conf)] == []
    assert wait_no_job_processes(str(run_dir)) == [], "the ranks and torchruns are gone"
    deadline = time.monotonic() + 60
    while slurm_cluster.job_steps() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm_cluster.job_steps() == [], "no slurmstepd of the job is left"


@pytest.mark.integration
def test_a_held_job_shows_its_pending_reason_and_a_wait_names_it(slurm_cluster, tmp_path):
    job = tmp_path / "held.sh"
    job.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --output=/dev/null\nsrun true\n")
    job_id = submit(job, ["--hold"], conf=slurm_cluster.conf, cwd=tmp_path)
    try:
        info = wait_for_state(job_id, {"PENDING"}, conf=slurm_cluster.conf, timeout_s=JOB_TIMEOUT_S)
        assert (info.reason, info.nodes, info.node_count) == ("JobHeldUser", "", 2)
        assert job_nodes(job_id, conf=slurm_cluster.conf) == []
        with pytest.raises(JobWaitTimeout) as e:
            wait_for_state(job_id, {JobState.RUNNING}, conf=slurm_cluster.conf, timeout_s=1.5, poll_s=0.5)
        assert (e.value.job_id, e.value.last_state, e.value.reason) == (job_id, "PENDING", "JobHeldUser")
        assert f"job {job_id} was still PENDING (reason JobHeldUser) after 1.5 s of waiting for RUNNING" in str(e.value)
    finally:
        final = cancel(job_id, conf=slurm_cluster.conf, timeout_s=JOB_TIMEOUT_S)
    assert final.state == JobState.CANCELLED and job_id not in [j.job_id for j in queue(conf=slurm_cluster.conf)]
    with pytest.raises(SlurmError, match=f"job {job_id} ended CANCELLED .* while waiting for RUNNING"):
        wait_for_state(job_id, {JobState.RUNNING}, conf=slurm_cluster.conf, timeout_s=JOB_TIMEOUT_S)
    with pytest.raises(tl.ConfigError, match="no batch script at"):
        submit(tmp_path / "missing.sh", conf=slurm_cluster.conf)
