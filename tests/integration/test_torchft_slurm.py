"""torchft replica groups as SLURM jobs on the local two-node cluster (issue 47; torchft's own SLURM example,
pytorch/torchft examples/slurm, does this on real clusters): one sbatch job per group, group 1's job cancelled
(scancel) while group 0 keeps committing alone, then submitted again, healed from group 0 and bitwise equal to it.
Every wait is on what the groups recorded (ft_train.py's metrics/group<G>.jsonl), never on a clock; one run serves the
first tests of this file. The cluster is the session's ``slurm_cluster`` (tests/conftest.py): skipped where SLURM
cannot run here."""

import importlib.util
import sys
import time

import psutil
import pytest
from conftest import wait_no_job_processes

import tutorial_lib as tl
from tutorial_lib.errors import LaunchError
from tutorial_lib.launcher.failure_drill import FT_SCRIPT, run_failure_drill, wait_for_records
from tutorial_lib.launcher.replicas import start_lighthouse
from tutorial_lib.launcher.slurm_replicas import leftover_jobs, start_slurm_replica_groups
from tutorial_lib.runs.replica_records import read_replica_records
from tutorial_lib.slurm import JobState, queue

pytestmark = pytest.mark.integration

MISSING = [name for name in ("torchft", "numpy") if importlib.util.find_spec(name) is None]
needs_torchft = pytest.mark.skipif(bool(MISSING), reason=f"{' and '.join(MISSING)} not importable in {sys.executable}: "
                                   "pip install torchft numpy (Linux x86_64 wheels; see pyproject.toml)")

HEARTBEAT_TIMEOUT_MS = 2000  # the lighthouse's (torchft's default is 5,000)
STEPS_TOGETHER = 3  # commits each group makes with both in the quorum before group 1's job is cancelled
STEPS_ALONE = 10  # commits group 0 makes alone before group 1 is submitted again
STEPS_AFTER_HEAL = 10  # commits group 1 makes after its heal
STATE_TIMEOUT_S = 240.0  # the longest wait for one state (two jobs starting on 2 busy cores take 5-30 s)
# scancel's SIGTERM may land inside an all-reduce: ft_train.py's manager.allreduce lets the other group drop that step
# (torchft 0.2.0's DDP comm hook failed `assert fut._fut` there in 2 of 8 cancels while ft_train.py used it).
ARGS = ["--max-steps", 100000, "--step-delay-s", 0.05, "--log-every", 100000]


def on_cluster(cluster) -> tl.slurm.SlurmSpec:
    """The local cluster: its slurm.conf, gloo on loopback (every node is 127.0.0.1, so is the lighthouse)."""
    return tl.slurm.SlurmSpec(conf=cluster.conf, socket_ifname="lo")


@pytest.fixture(scope="module")
def slurm_ft_run(slurm_cluster, tmp_path_factory):
    """Two groups, two jobs; group 1's job cancelled once both committed STEPS_TOGETHER steps together, submitted
    again once group 0 committed STEPS_ALONE steps alone; all cancelled once group 1 committed STEPS_AFTER_HEAL steps
    after its heal."""
    if MISSING:
        pytest.skip(f"{' and '.join(MISSING)} not importable")
    run_dir = tmp_path_factory.mktemp("ft-slurm")
    started = time.monotonic()
    with start_lighthouse(run_dir / "lighthouse.log", heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS) as lighthouse:
        with start_slurm_replica_groups(FT_SCRIPT, lighthouse=lighthouse, num_groups=2, run_dir=run_dir,
                                        slurm=on_cluster(slurm_cluster), args=ARGS) as groups:
            wait_for_records(groups, f"{STEPS_TOGETHER} commits of both groups together", lambda r: all(
                sum(s.participants == 2 for s in r.committed(g)) >= STEPS_TOGETHER for g in (0, 1)), STATE_TIMEOUT_S)
            queued_together = {job.job_id: job.state for job in queue(conf=slurm_cluster.conf)}
            first_pid = read_replica_records(run_dir / "metrics").committed(1)[-1].pid
            killed_at_s = groups.kill(1)  # scancel, and wait until the job has left the queue
            gone_at_s = time.time()
            wait_for_records(groups, f"{STEPS_ALONE} commits of group 0 alone", lambda r: sum(
                s.time_s > killed_at_s and s.participants == 1 for s in r.committed(0)) >= STEPS_ALONE,
                STATE_TIMEOUT_S)
            resubmitted_at_s = time.time()
            groups.restart(1)

            def healed(r):
                heals = [h for h in r.heals if h.replica_group == 1 and h.time_s > resubmitted_at_s]
                return bool(heals) and sum(s.step > heals[0].step for s in r.committed(1)) >= STEPS_AFTER_HEAL

            wait_for_records(groups, f"group 1 healed and {STEPS_AFTER_HEAL} commits after it", healed,
                             STATE_TIMEOUT_S)
        lighthouse.stop()
    yield dict(records=read_replica_records(run_dir / "metrics"), groups=groups, lighthouse=lighthouse,
               run_dir=run_dir, cluster=slurm_cluster, queued_together=queued_together, first_pid=first_pid,
               killed_at_s=killed_at_s, gone_at_s=gone_at_s, resubmitted_at_s=resubmitted_at_s,
               run_s=time.monotonic() - started)


@needs_torchft
def test_each_group_is_a_slurm_job_of_its_own_and_the_cancelled_one_leaves_the_other_committing_alone(slurm_ft_run):
    records, groups = slurm_ft_run["records"], slurm_ft_run["groups"]
    jobs = [(g.group_id, g.attempt, g.job_name) for g in groups.history]
    assert jobs == [(0, 0, "ft_0"), (1, 0, "ft_1"), (1, 1, "ft_1")]
    assert len({g.job_id for g in groups.history}) == 3, "one job per start of a group"
    # While both trained together, both jobs ran at once.
    assert {g.job_id: slurm_ft_run["queued_together"].get(g.job_id) for g in groups.history[:2]} == {
        g.job_id: JobState.RUNNING for g in groups.history[:2]}
    assert groups.history[1].info.state == JobState.CANCELLED
    survivor = records.committed(0)
    killed_at_s = slurm_ft_run["killed_at_s"]
    alone = [s for s in survivor if s.time_s > killed_at_s and s.participants == 1]
    assert len(alone) >= STEPS_ALONE
    # Every step commits once: the survivor's committed steps are consecutive, none repeated or skipped.
    assert [s.step for s in survivor] == list(range(survivor[0].step, survivor[0].step + len(survivor)))
    for previous, current in zip(survivor, survivor[1:]):
        assert current.batches_committed - previous.batches_committed == current.participants, (previous, current)
    # SLURM stopped the cancelled job's rank: it wrote nothing after its job left the queue.
    assert all(r.time_s <= slurm_ft_run["gone_at_s"] for r in records.steps[1] if r.pid == slurm_ft_run["first_pid"])
    print(f"jobs {[g.job_id for g in groups.history]}: group 0 committed {len(alone)} steps alone after the scancel; "
          f"run {slurm_ft_run['run_s']:.1f} s")


@needs_torchft
def test_the_resubmitted_job_heals_from_group_0_and_holds_bitwise_equal_weights(slurm_ft_run):
    records = slurm_ft_run["records"]
    (heal,) = [h for h in records.heals if h.replica_group == 1 and h.time_s > slurm_ft_run["resubmitted_at_s"]]
    assert heal.source_group == 0
    assert heal.pid != slurm_ft_run["first_pid"] and records.starts[1][-1] == heal.pid
    assert heal.step in {s.step for s in records.committed(0)}, "at a step the live group had committed"
    after = {s.step: s for s in records.committed(1, pid=heal.pid)}
    common = [(s, after[s.step]) for s in records.committed(0) if s.step in after]
    assert len(common) >= STEPS_AFTER_HEAL - 1
    for mine, theirs in common:
        assert mine.weights_sha256 == theirs.weights_sha256, f"step {mine.step}: weights differ"
        assert mine.batches_committed == theirs.batches_committed
    print(f"group 1 (job {slurm_ft_run['groups'].groups[1].job_id}) healed at step {heal.step} from group "
          f"{heal.source_group}; weights equal at {len(common)} common steps")


@needs_torchft
def test_no_job_lighthouse_torchrun_or_rank_is_left(slurm_ft_run):
    groups, cluster, run_dir = slurm_ft_run["groups"], slurm_ft_run["cluster"], slurm_ft_run["run_dir"]
    ids = {g.job_id for g in groups.history}
    assert leftover_jobs(groups) == [] and [j for j in queue(conf=cluster.conf) if j.job_id in ids] == []
    assert groups.running() == []
    assert not slurm_ft_run["lighthouse"].alive()
    assert wait_no_job_processes(str(run_dir)) == [], "a torchrun or rank of the jobs (working in run_dir) is left"
    deadline = time.monotonic() + 60
    while cluster.job_steps() and time.monotonic() < deadline:  # slurmstepd ends right after its job leaves the queue
        time.sleep(0.2)
    assert cluster.job_steps() == []


def new_children(before):
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.status() != "zombie"]


@needs_torchft
def test_an_interrupt_while_the_jobs_run_cancels_every_job_and_stops_the_lighthouse(slurm_cluster, tmp_path):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(KeyboardInterrupt):
        with start_lighthouse(tmp_path / "lighthouse.log") as lighthouse, \
                start_slurm_replica_groups(FT_SCRIPT, lighthouse=lighthouse, num_groups=2, run_dir=tmp_path,
                                           slurm=on_cluster(slurm_cluster), args=ARGS) as groups:
            wait_for_records(groups, "a first commit of group 0", lambda r: bool(r.committed(0)), STATE_TIMEOUT_S)
            raise KeyboardInterrupt  # what a kernel's interrupt raises in the cell
    assert leftover_jobs(groups) == [] and not lighthouse.alive()
    assert [g.info.state for g in groups.history] == [JobState.CANCELLED, JobState.CANCELLED]
    assert wait_no_job_processes(str(tmp_path)) == [] and new_children(before) == []


@needs_torchft
def test_a_slurm_drill_that_times_out_cancels_its_jobs_before_it_raises(slurm_cluster, tmp_path):
    """run_failure_drill(slurm=...): a phase longer than its timeout is an error raised after every job it submitted
    has left the queue and its lighthouse has ended."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(LaunchError, match=r"waiting for 5 commits of every group together: 0\.5 s passed"):
        run_failure_drill(runs_dir=tmp_path, timeout_s=0.5, slurm=on_cluster(slurm_cluster))
    assert queue(conf=slurm_cluster.conf) == []
    assert wait_no_job_processes(str(tmp_path)) == [] and new_children(before) == []
