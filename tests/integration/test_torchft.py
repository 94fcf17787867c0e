"""torchft replica groups on this machine (issue 47): one group SIGKILLed mid-run while the other keeps committing
steps, then restarted, healed from the live group, and bitwise equal to it; read from what each group recorded
(ft_train.py's metrics/group<G>.jsonl), never from what it printed. One run serves the tests of this file."""

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from tutorial_lib.errors import LaunchError
from tutorial_lib.launcher.failure_drill import commits_after_heal
from tutorial_lib.launcher.replicas import leftover_processes, start_lighthouse, start_replica_groups
from tutorial_lib.runs.replica_records import read_replica_records
from tutorial_lib.runs.rundir import LESSONS_DIR

pytestmark = pytest.mark.integration

MISSING = [name for name in ("torchft", "numpy") if importlib.util.find_spec(name) is None]
needs_torchft = pytest.mark.skipif(bool(MISSING), reason=f"{' and '.join(MISSING)} not importable in {sys.executable}: "
                                   "pip install torchft numpy (Linux x86_64 wheels; see pyproject.toml)")

HEARTBEAT_TIMEOUT_MS = 2000  # the lighthouse's (torchft's default is 5,000): how long the survivor stalls
STEPS_ALONE = 10  # commits the survivor makes alone before the killed group is restarted
STEPS_TOGETHER = 10  # commits both make after the heal
STATE_TIMEOUT_S = 120.0  # the longest wait for one state (a start on 2 busy cores takes 5-15 s)


def wait_for(what, state, groups, timeout_s=STATE_TIMEOUT_S):
    """Poll the records until ``state(records)`` holds; fail naming ``what`` if a group ended or time ran out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = read_replica_records(groups.run_dir / "metrics")
            if state(records):
                return records
        except Exception as e:  # noqa: BLE001 - no records yet, or a group's last line half written
            records = e
        if not isinstance(records, Exception):  # what each group did so far, for the message
            records = {g: (len(r.committed(g)), max((s.step for s in r.committed(g)), default=None))
                       for r in [records] for g in r.steps}
        ended = [g for g, group in groups.groups.items()
                 if group.popen.poll() is not None and group.killed_at_s is None]
        if ended or time.monotonic() > deadline:
            tails = {g: (groups.groups[g].folder / "torchrun.log").read_text()[-1500:] for g in groups.groups}
            pytest.fail(f"waiting for {what}: groups {ended} ended, or {timeout_s:g} s passed; (commits, last step) "
                        f"per group {records!r}; torchrun output {tails}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def ft_run(tmp_path_factory):
    """Two groups; group 1 SIGKILLed once both commit together, restarted once group 0 made STEPS_ALONE commits
    alone; stopped once both made STEPS_TOGETHER commits after the heal. Nothing may be left running."""
    run_dir = tmp_path_factory.mktemp("ft")
    started = time.monotonic()
    lighthouse = start_lighthouse(run_dir / "lighthouse.log", heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    try:
        with start_replica_groups(LESSONS_DIR / "ft_train.py", lighthouse=lighthouse, num_groups=2, run_dir=run_dir,
                                  args=["--max-steps", 100000, "--step-delay-s", 0.05, "--log-every", 100]) as groups:
            first_pid = {}

            def together(r):
                for g in (0, 1):
                    both = [s for s in r.committed(g) if s.participants == 2]
                    if not both:
                        return False
                    first_pid[g] = both[-1].pid
                return True

            wait_for("both groups committing together", together, groups)
            killed_at_s = groups.kill(1)
            def alone(r):
                return sum(s.time_s > killed_at_s and s.participants == 1 for s in r.committed(0)) >= STEPS_ALONE

            wait_for(f"{STEPS_ALONE} commits of group 0 alone", alone, groups)
            restarted_at_s = time.time()
            groups.restart(1)

            def healed_and_together(r):  # in both groups' files: each writes its record at its own pace
                return commits_after_heal(r, 1, restarted_at_s) >= STEPS_TOGETHER

            wait_for("the restarted group healed and committing", healed_and_together, groups)
        lighthouse.stop()
        records = read_replica_records(run_dir / "metrics")
        left = leftover_processes(groups)
        run_s = time.monotonic() - started
        yield dict(records=records, killed_at_s=killed_at_s, restarted_at_s=restarted_at_s, groups=groups,
                   lighthouse=lighthouse, left=left, first_pid=first_pid, run_s=run_s)
    finally:
        lighthouse.stop()


@needs_torchft
def test_a_killed_group_leaves_the_other_committing_one_batch_per_step_and_no_step_twice(ft_run):
    records, killed_at_s = ft_run["records"], ft_run["killed_at_s"]
    survivor = records.committed(0)
    before = [s for s in survivor if s.time_s <= killed_at_s]
    alone = [s for s in survivor if s.time_s > killed_at_s and s.participants == 1]
    assert before and len(alone) >= STEPS_ALONE
    # Every step commits once: the survivor's committed steps are 1, 2, 3, ... with no step repeated or skipped.
    assert [s.step for s in survivor] == list(range(survivor[0].step, survivor[0].step + len(survivor)))
    # Together each commit adds both groups' batches; alone, one: the dead group's samples are not trained on.
    for previous, current in zip(survivor, survivor[1:]):
        assert current.batches_committed - previous.batches_committed == current.participants, (previous, current)
    assert all(s.participants == 1 for s in alone)
    # The killed process committed nothing after its kill.
    assert all(s.time_s <= killed_at_s for s in records.committed(1, pid=ft_run["first_pid"][1]))
    stall_s = records.longest_commit_gap_s(0, killed_at_s)
    last_together = max(s.step for s in before)
    print(f"kill at step {last_together}: group 0 stalled {stall_s:.2f} s (heartbeat timeout "
          f"{HEARTBEAT_TIMEOUT_MS / 1000:g} s), then committed {len(alone)} steps alone; run {ft_run['run_s']:.1f} s")


@needs_torchft
def test_the_restarted_group_heals_from_the_live_one_and_holds_bitwise_equal_weights(ft_run):
    records, restarted_at_s = ft_run["records"], ft_run["restarted_at_s"]
    (heal,) = [h for h in records.heals if h.replica_group == 1 and h.time_s > restarted_at_s]
    assert heal.source_group == 0
    killed_pid_steps = [s.step for s in records.committed(1, pid=ft_run["first_pid"][1])]
    assert heal.step > max(killed_pid_steps), "it joined ahead of where it died: no step redone"
    assert heal.step in {s.step for s in records.committed(0)}, "at a step the live group had committed"
    after = {s.step: s for s in records.committed(1, pid=heal.pid)}
    assert min(after) == heal.step + 1, "its first commit is the step after the one it joined at"
    common = [(s, after[s.step]) for s in records.committed(0) if s.step in after]
    assert len(common) >= STEPS_TOGETHER
    for mine, theirs in common:
        assert mine.weights_sha256 == theirs.weights_sha256, f"step {mine.step}: weights differ"
        assert mine.batches_committed == theirs.batches_committed
    assert {s.participants for _, s in common[1:]} == {2}
    print(f"group 1 healed at step {heal.step} from group {heal.source_group}; weights equal at {len(common)} common "
          "steps")


@needs_torchft
def test_nothing_is_left_running_after_the_groups_and_the_lighthouse_stop(ft_run):
    assert ft_run["left"] == []
    assert not ft_run["lighthouse"].alive()
    assert ft_run["groups"].running() == []
    assert [(g.group_id, g.attempt) for g in ft_run["groups"].history] == [(0, 0), (1, 0), (1, 1)]


def test_a_lighthouse_that_cannot_start_is_an_error_with_its_log(tmp_path):
    """An interpreter that exits at once (``false``) stands for one without torchft: the error names the exit."""
    with pytest.raises(LaunchError, match="the lighthouse exited with code 1 before it was ready"):
        start_lighthouse(tmp_path / "lighthouse.log", python="false", ready_timeout_s=30)


def all_processes(groups, lighthouse):
    """Every process of the run now: the lighthouse, each group's torchrun and ranks."""
    import psutil
    found = [psutil.Process(lighthouse.process.pid)]
    for group in groups.history:
        group.tree.refresh()
        found += [psutil.Process(group.popen.pid)] + [w.process for w in group.tree.alive()]
    return found


@needs_torchft
def test_an_interrupt_while_the_groups_train_leaves_no_process_and_no_lighthouse(tmp_path):
    from tutorial_lib.launcher.processes import is_alive
    with pytest.raises(KeyboardInterrupt):
        with start_lighthouse(tmp_path / "lighthouse.log") as lighthouse, \
                start_replica_groups(LESSONS_DIR / "ft_train.py", lighthouse=lighthouse, num_groups=1, run_dir=tmp_path,
                                     args=["--max-steps", 100000, "--step-delay-s", 0.05]) as groups:
            wait_for("the group committing", lambda r: r.committed(0), groups)
            processes = all_processes(groups, lighthouse)
            assert len(processes) == 3, processes  # the lighthouse, the group's torchrun and its rank
            raise KeyboardInterrupt  # what a kernel's interrupt raises in the cell
    assert [p for p in processes if is_alive(p)] == []


# A kernel that dies at once (SIGKILL: "Shut down kernel now") runs no clean-up: what it started must die with it.
KERNEL = """
import json, sys, time
from tutorial_lib.launcher.replicas import start_lighthouse, start_replica_groups
from tutorial_lib.runs.replica_records import read_replica_records
from tutorial_lib.runs.rundir import LESSONS_DIR
run_dir = sys.argv[1]
lighthouse = start_lighthouse(run_dir + "/lighthouse.log")
groups = start_replica_groups(LESSONS_DIR / "ft_train.py", lighthouse=lighthouse, num_groups=1, run_dir=run_dir,
                              args=["--max-steps", 100000, "--step-delay-s", 0.05])
while True:
    try:
        if read_replica_records(run_dir + "/metrics").committed(0):
            break
    except Exception:
        pass
    time.sleep(0.1)
pids = [lighthouse.process.pid]
for group in groups.history:
    group.tree.refresh()
    pids += [group.popen.pid] + [w.process.pid for w in group.tree.alive()]
print(json.dumps(pids), flush=True)
time.sleep(600)
"""


@needs_torchft
def test_a_kernel_killed_outright_takes_its_lighthouse_and_groups_along(tmp_path):
    import json
    import subprocess

    import psutil
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(kernel.stdout.readline())
        processes = [psutil.Process(pid) for pid in pids]
        assert len(processes) == 3, pids  # the lighthouse, the group's torchrun and its rank
    finally:
        kernel.kill()
        kernel.wait()
    gone, alive = psutil.wait_procs(processes, timeout=30)  # until every one has ended
    from tutorial_lib.launcher.processes import is_alive
    assert [p for p in alive if is_alive(p)] == [], "left running after the kernel died"


def test_a_drill_phase_that_cannot_happen_is_an_error_naming_the_wait_and_the_groups_output(tmp_path):
    """run_failure_drill's waits (notebook 15): a group that exits (here ft_train.py refusing --max-steps 0, exit code 2) ends the
    wait at once with what was awaited and the group's last torchrun lines, not after the phase's timeout."""
    from tutorial_lib.launcher.failure_drill import wait_for_records
    started = time.monotonic()
    with start_lighthouse(tmp_path / "lighthouse.log") as lighthouse, \
            start_replica_groups(LESSONS_DIR / "ft_train.py", lighthouse=lighthouse, num_groups=1, run_dir=tmp_path,
                                 args=["--max-steps", 0]) as groups:
        with pytest.raises(LaunchError, match=r"waiting for a first commit: group\(s\) \[0\] ended;.*exitcode  : 2"):
            wait_for_records(groups, "a first commit", lambda r: bool(r.committed(0)), timeout_s=120)
    assert time.monotonic() - started < 100, "it did not wait for the timeout"
    assert leftover_processes(groups) == [] and not lighthouse.alive()


@needs_torchft
def test_a_drill_that_times_out_stops_its_lighthouse_and_groups_before_it_raises(tmp_path):
    """Notebook 15's cell fails (a phase longer than its timeout): the error comes after everything it started ended."""
    import psutil

    from tutorial_lib.launcher.failure_drill import run_failure_drill
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(LaunchError, match=r"waiting for 5 commits of every group together: 0\.5 s passed"):
        run_failure_drill(runs_dir=tmp_path, timeout_s=0.5)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.status() != "zombie"]
    assert left == [], [(p.pid, p.cmdline()) for p in left]


@needs_torchft
def test_hsdp_groups_shard_the_model_and_each_rank_heals_its_shard_from_the_same_rank(tmp_path):
    """Issue 47's item 6, on CPU ranks: 2 groups x 2 ranks, FSDP2 inside a group, torchft across groups (FSDP2's
    all-reduce hook). Each rank holds and sends half the model; group 1 killed, restarted, healed per rank."""
    import tutorial_lib as tl
    from tutorial_lib.launcher.failure_drill import FT_SCRIPT, run_failure_drill
    n_params = sum(p.numel() for p in tl.import_script(FT_SCRIPT).make_model(0).parameters())
    drill = run_failure_drill(runs_dir=tmp_path, label="hsdp", nproc_per_group=2, steps_alone=3, steps_after_heal=5)
    shards = {r: drill.records_of(r) for r in (0, 1)}
    hashes = {}
    for r, records in shards.items():
        steps = [s for g in records.steps for s in records.steps[g]]
        assert {s.params_local for s in steps} == {n_params // 2}, "each rank holds half of every (even) layer"
        assert {s.allreduce_bytes for s in steps} == {4 * n_params // 2}, "and all-reduces its fp32 shard's gradient"
        (heal,) = [h for h in records.heals if h.replica_group == 1 and h.time_s > drill.restarted_at_s]
        assert heal.source_group == 0
        live = {s.step: s.weights_sha256 for s in records.committed(0)}
        back = [s for s in records.committed(1, pid=heal.pid) if s.step in live]
        assert len(back) >= 5 and all(live[s.step] == s.weights_sha256 for s in back), r
        hashes[r] = set(live.values())
    assert not hashes[0] & hashes[1], "the control: the two ranks' shards differ, so equal hashes mean one shard"
    assert drill.left_running == [] and drill.starts == [(0, 0), (1, 0), (1, 1)]
