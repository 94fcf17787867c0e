"""The torchft pieces that need no process (issue 47): the lighthouse's command, a replica group's environment, the
checks before anything starts, and the reader of what the groups recorded."""

import json
import sys

import pytest

from tutorial_lib.errors import ConfigError, MetricsError
from tutorial_lib.launcher.replicas import LIGHTHOUSE_PROGRAM, group_env, lighthouse_command, start_replica_groups
from tutorial_lib.launcher.failure_drill import run_failure_drill, run_hard_failure
from tutorial_lib.runs.replica_records import read_replica_records, steps_table
from tutorial_lib.runs.rundir import LESSONS_DIR


def test_the_lighthouse_command_runs_the_child_program_with_every_setting():
    assert lighthouse_command(min_replicas=2, heartbeat_timeout_ms=2000, join_timeout_ms=0, quorum_tick_ms=50) == [
        sys.executable, "-u", str(LIGHTHOUSE_PROGRAM), "--min-replicas", "2", "--heartbeat-timeout-ms", "2000",
        "--join-timeout-ms", "0", "--quorum-tick-ms", "50"]
    assert "127.0.0.1:0" in LIGHTHOUSE_PROGRAM.read_text(), "it binds loopback, a port the system picks"


@pytest.mark.parametrize("setting, value, allowed", [
    ("min_replicas", 0, "an int >= 1"), ("heartbeat_timeout_ms", 2.5, "an int >= 1"),
    ("join_timeout_ms", -1, "an int >= 0"), ("quorum_tick_ms", True, "an int >= 1")])
def test_a_lighthouse_setting_out_of_range_is_named_with_its_value(setting, value, allowed):
    with pytest.raises(ConfigError, match=rf"^{setting} must be {allowed}, got {value!r}$"):
        lighthouse_command(**{setting: value})


def test_a_group_gets_what_torchft_reads_and_the_launchers_loopback_settings():
    env = group_env("http://127.0.0.1:4321", 1, 3, base={"PATH": "/bin", "OMP_NUM_THREADS": "4"}, extra={"X": "1"})
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "4", "PYTHONUNBUFFERED": "1",
                   "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5", "GLOO_SOCKET_IFNAME": "lo",
                   "TORCHFT_LIGHTHOUSE": "http://127.0.0.1:4321", "REPLICA_GROUP_ID": "1", "NUM_REPLICA_GROUPS": "3",
                   "X": "1"}


@pytest.mark.parametrize("group_id, num_groups, message", [
    (2, 2, "group_id must be an int from 0 to 1, got 2"), (0, 0, "num_groups must be an int >= 1, got 0")])
def test_a_group_id_outside_the_groups_is_refused(group_id, num_groups, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        group_env("http://127.0.0.1:1", group_id, num_groups, base={})


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_groups=0), "num_groups must be an int >= 1, got 0"),
    (dict(num_groups=2, nproc_per_group=3), "nproc_per_group must be an int from 1 to 2, got 3"),
    (dict(num_groups=2, shutdown_grace_s=0), "shutdown_grace_s must be > 0 (seconds), got 0")])
def test_bad_replica_group_settings_are_refused_before_anything_starts(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
        start_replica_groups(LESSONS_DIR / "ft_train.py", lighthouse=None, run_dir=tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_script_is_named(tmp_path):
    with pytest.raises(ConfigError, match="script '.*nope.py' does not exist"):
        start_replica_groups(tmp_path / "nope.py", lighthouse=None, num_groups=1, run_dir=tmp_path / "run")


def step(group, step, t, pid=10, committed=True, participants=2, batches=0):
    return {"event": "step", "replica_group": group, "pid": pid, "time_s": t, "step": step, "committed": committed,
            "batches_committed": batches, "participants": participants, "loss_local": 0.5, "weights_sha256": "ab",
            "local_step": step, "sync_step": True, "allreduce_bytes": 4}


def write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_the_records_read_back_per_group_with_a_half_written_last_line_skipped(tmp_path):
    write(tmp_path / "group0.jsonl", [{"event": "start", "replica_group": 0, "pid": 10, "time_s": 0.0},
                                      step(0, 1, 1.0), step(0, 1, 1.1, committed=False), step(0, 2, 4.0)])
    write(tmp_path / "group1.jsonl", [{"event": "start", "replica_group": 1, "pid": 11, "time_s": 0.0},
                                      {"event": "heal", "replica_group": 1, "pid": 11, "time_s": 3.0, "step": 1,
                                       "source_group": 0}, step(1, 2, 4.0, pid=11)], tail='{"event": "st')
    records = read_replica_records(tmp_path)
    assert [s.step for s in records.committed(0)] == [1, 2] and len(records.steps[0]) == 3
    assert records.starts == {0: [10], 1: [11]}
    assert [(h.replica_group, h.step, h.source_group) for h in records.heals] == [(1, 1, 0)]
    assert records.committed(1, pid=12) == []
    assert records.longest_commit_gap_s(0, after_s=2.0) == 3.0
    with pytest.raises(MetricsError, match="group 0 committed 2 step.s. before and 0 after time 5.000"):
        records.longest_commit_gap_s(0, after_s=5.0)


def test_a_broken_line_before_the_last_is_an_error_naming_the_file_and_line(tmp_path):
    write(tmp_path / "group0.jsonl", [step(0, 1, 1.0)], tail="not json\n" + json.dumps(step(0, 2, 2.0)) + "\n")
    with pytest.raises(MetricsError, match=r"group0.jsonl:2 is not a record"):
        read_replica_records(tmp_path)
    with pytest.raises(MetricsError, match="no group.*jsonl in"):
        read_replica_records(tmp_path / "empty")


def test_the_step_table_has_a_row_per_step_record_of_every_group_in_order(tmp_path):
    write(tmp_path / "group0.jsonl", [step(0, 1, 1.0), step(0, 1, 1.1, committed=False), step(0, 2, 4.0)])
    write(tmp_path / "group1.jsonl", [step(1, 2, 4.0, pid=11)])
    table = steps_table(read_replica_records(tmp_path))
    assert list(table[["replica_group", "step", "committed"]].itertuples(index=False, name=None)) == [
        (0, 1, True), (0, 1, False), (0, 2, True), (1, 2, True)]
    assert list(table.columns) == ["replica_group", "pid", "time_s", "step", "committed", "batches_committed",
                                   "participants", "loss_local", "weights_sha256", "local_step", "sync_step",
                                   "allreduce_bytes", "params_local"]


def test_an_hsdp_groups_ranks_are_read_apart_each_from_its_own_file(tmp_path):
    """ft_train.py with 2 ranks per group: rank 0 writes group<G>.jsonl, rank 1 group<G>.rank1.jsonl; neither
    reading mixes the other's records in."""
    write(tmp_path / "group0.jsonl", [step(0, 1, 1.0), step(0, 2, 2.0)])
    write(tmp_path / "group0.rank1.jsonl", [step(0, 1, 1.0, pid=20)])
    write(tmp_path / "group1.rank1.jsonl", [step(1, 1, 1.0, pid=21)])
    rank0, rank1 = read_replica_records(tmp_path), read_replica_records(tmp_path, group_rank=1)
    assert {g: [s.pid for s in r] for g, r in rank0.steps.items()} == {0: [10, 10]}
    assert {g: [s.pid for s in r] for g, r in rank1.steps.items()} == {0: [20], 1: [21]}
    with pytest.raises(MetricsError, match=r"no group<G>.rank2.jsonl in .*with more than 2 rank\(s\) each\?"):
        read_replica_records(tmp_path, group_rank=2)
    with pytest.raises(ConfigError, match="group_rank must be an int >= 0, got -1"):
        read_replica_records(tmp_path, group_rank=-1)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_groups": 1}, "num_groups must be an int >= 2, got 1"),
    ({"kill_group": 2}, "kill_group must be one of 0..1, got 2"),
    ({"kill_group": -1}, "kill_group must be an int >= 0, got -1"),
    ({"steps_alone": 0}, "steps_alone must be an int >= 1, got 0"),
    ({"steps_after_heal": 1.5}, "steps_after_heal must be an int >= 1, got 1.5"),
    ({"nproc_per_group": 3}, "nproc_per_group must be 1 or 2 .ranks per group on this machine., got 3"),
    ({"nproc_per_group": 2, "slurm": object()}, "nproc_per_group must be 1 on SLURM .the SLURM drill runs one rank")])
def test_a_failure_drill_with_a_bad_setting_is_refused_before_anything_starts(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        run_failure_drill(runs_dir=tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == [], "no run folder made, nothing started"


@pytest.mark.parametrize("what, kwargs, message", [
    ("the lighthouse", {}, r"what must be one of \('lighthouse', 'sender_mid_heal'\), got 'the lighthouse'"),
    ("lighthouse", {"steps_together": 0}, "steps_together must be an int >= 1, got 0"),
    ("sender_mid_heal", {"steps_after": True}, "steps_after must be an int >= 1, got True"),
    ("lighthouse", {"quorum_timeout_s": 0}, r"quorum_timeout_s must be > 0 \(seconds\), got 0")])
def test_a_hard_failure_with_a_bad_setting_is_refused_before_anything_starts(tmp_path, what, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        run_hard_failure(what, runs_dir=tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == [], "no run folder made, nothing started"


def test_runs_side_by_side_are_refused_before_anything_starts_when_one_sets_the_metrics_dir(tmp_path):
    from tutorial_lib.launcher.replica_run import run_replica_groups
    with pytest.raises(ConfigError, match=r"args must not set --metrics-dir .* got \['--metrics-dir', 'm'\]"):
        run_replica_groups({"ddp": ["--max-steps", 5], "diloco": ["--metrics-dir", "m"]}, runs_dir=tmp_path)
    assert list(tmp_path.iterdir()) == [], "no run folder made, nothing started"


def test_the_lighthouse_program_loads_torchfts_server_without_importing_torch():
    """child/lighthouse.py loads the Rust extension alone: a lighthouse starts in well under a second instead of
    importing torch (1.5 s of a 2-core machine) for a server that needs none of it."""
    import subprocess
    probe = (f"import sys; sys.path.insert(0, {str(LIGHTHOUSE_PROGRAM.parent)!r}); import lighthouse; "
             "server = lighthouse.lighthouse_server_class(); print(server.__name__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["LighthouseServer", "False"], out


def test_a_commit_after_the_heal_counts_once_every_group_has_recorded_it(tmp_path):
    """The drill's last phase (the race CI hit on torch 2.8): the healed group wrote its record of step 4 before
    the live group wrote its own, so the drill stopped with a step only one side held; only steps both files hold
    count, and only those after the heal of the restart, not the killed process's."""
    from tutorial_lib.launcher.failure_drill import commits_after_heal
    heal = {"event": "heal", "replica_group": 1, "pid": 12, "time_s": 5.0, "step": 2, "source_group": 0}
    write(tmp_path / "group0.jsonl", [step(0, s, float(s)) for s in (1, 2, 3)])
    write(tmp_path / "group1.jsonl", [step(1, 1, 1.0, pid=11), heal, step(1, 3, 6.0, pid=12),
                                      step(1, 4, 7.0, pid=12)])
    records = read_replica_records(tmp_path)
    assert commits_after_heal(records, 1, after_s=4.0) == 1  # step 3: step 4 is in group 1's file only
    assert commits_after_heal(records, 1, after_s=5.0) == 0  # no heal after the restart yet
    write(tmp_path / "group0.jsonl", [step(0, s, float(s)) for s in (1, 2, 3, 4)])
    assert commits_after_heal(read_replica_records(tmp_path), 1, after_s=4.0) == 2
