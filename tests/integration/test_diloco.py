"""DiLoCo beside DDP with torchft (issue 47, "DiLoCo / LocalSGD"): two replica groups of ft_train.py each way, on the
same data and seed, no failure. What crossed between the groups is counted at the Manager (every tensor handed to
``manager.allreduce``), read from each group's records (metrics/group<G>.jsonl), never from what it printed; the
expected bytes are derived from the lesson's own model. One run of each serves the tests of this file."""

import importlib.util
import sys

import psutil
import pytest

from tutorial_lib.errors import ConfigError, LaunchError
from tutorial_lib.launcher.replica_run import run_replica_groups
from tutorial_lib.notebook.script_source import import_script

pytestmark = pytest.mark.integration

MISSING = [name for name in ("torchft", "numpy") if importlib.util.find_spec(name) is None]
needs_torchft = pytest.mark.skipif(bool(MISSING), reason=f"{' and '.join(MISSING)} not importable in {sys.executable}: "
                                   "pip install torchft numpy (Linux x86_64 wheels; see pyproject.toml)")

MAX_STEPS = 40  # each group's optimizer steps, both ways
SYNC_EVERY = 5  # DiLoCo's H
STATE_TIMEOUT_S = 120.0  # the longest wait for the groups to exit (a start on 2 busy cores takes 5-15 s)


@pytest.fixture(scope="module")
def param_bytes():
    """The bytes of the lesson model's parameters, from the model itself: sum of numel * element_size (fp32)."""
    model = import_script("ft_train").make_model(seed=0)
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"ddp": ReplicaRun, "diloco": ReplicaRun}: the same arguments but --algorithm, one after the other."""
    root = tmp_path_factory.mktemp("diloco")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = {algorithm: run_replica_groups(["--algorithm", algorithm, "--sync-every", SYNC_EVERY, "--max-steps",
                                          MAX_STEPS], num_groups=2, runs_dir=root, label=algorithm,
                                         timeout_s=STATE_TIMEOUT_S) for algorithm in ("ddp", "diloco")}
    out["children_left"] = [p for p in psutil.Process().children(recursive=True)
                            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
    return out


def by_local_step(run, group):
    steps = run.records.steps[group]
    assert [s.local_step for s in steps] == list(range(1, MAX_STEPS + 1)), "one record per optimizer step, in order"
    return steps


@needs_torchft
def test_diloco_all_reduces_the_parameter_bytes_on_sync_steps_only_and_ddp_the_gradient_bytes_every_step(runs,
                                                                                                       param_bytes):
    sync_steps = list(range(SYNC_EVERY, MAX_STEPS + 1, SYNC_EVERY))
    for group in (0, 1):
        diloco = by_local_step(runs["diloco"], group)
        assert [s.local_step for s in diloco if s.sync_step] == sync_steps
        assert [s.local_step for s in diloco if s.allreduce_bytes] == sync_steps, "no byte between two syncs"
        # One pseudo-gradient per parameter: the parameters' shapes and dtype, so exactly the parameters' bytes.
        assert {s.allreduce_bytes for s in diloco if s.sync_step} == {param_bytes}
        # torchft commits (and counts a step) at a sync only; every sync had both groups in its quorum.
        assert [s.local_step for s in diloco if s.committed] == sync_steps
        assert [s.step for s in diloco if s.sync_step] == list(range(1, len(sync_steps) + 1))
        assert {s.participants for s in diloco if s.sync_step} == {2}
        ddp = by_local_step(runs["ddp"], group)
        # DDP's gradients have the parameters' shapes and dtype: the same bytes, at every step.
        assert all(s.sync_step and s.committed and s.allreduce_bytes == param_bytes for s in ddp), ddp
        assert {s.participants for s in ddp} == {2}
        assert sum(s.allreduce_bytes for s in ddp) == SYNC_EVERY * sum(s.allreduce_bytes for s in diloco)
    print(f"all-reduced per group: DDP {param_bytes:,} bytes every step; DiLoCo {param_bytes:,} bytes every "
          f"{SYNC_EVERY} steps ({param_bytes // SYNC_EVERY:,} bytes per step on average)")


@needs_torchft
def test_diloco_groups_hold_equal_weights_right_after_each_sync_and_different_ones_between(runs):
    diloco = runs["diloco"]
    pairs = list(zip(by_local_step(diloco, 0), by_local_step(diloco, 1)))
    at_sync = [(a, b) for a, b in pairs if a.sync_step]
    assert len(at_sync) == MAX_STEPS // SYNC_EVERY and all(b.sync_step for _, b in at_sync)
    assert all(a.weights_sha256 == b.weights_sha256 for a, b in at_sync), "a sync left the groups' weights apart"
    between = [(a, b) for a, b in pairs if not a.sync_step]
    differ = [a.local_step for a, b in between if a.weights_sha256 != b.weights_sha256]
    assert differ, "the control: between syncs each group trains alone on its own shard, so the hashes can differ"
    # DDP, on the same data: the groups apply the same averaged gradient at every step.
    ddp = list(zip(by_local_step(runs["ddp"], 0), by_local_step(runs["ddp"], 1)))
    assert all(a.weights_sha256 == b.weights_sha256 for a, b in ddp)
    print(f"DiLoCo: weights equal at all {len(at_sync)} syncs, different at {len(differ)} of {len(between)} steps "
          f"between; DDP: equal at all {len(ddp)} steps; runs {runs['ddp'].run_s:.1f} s and {diloco.run_s:.1f} s")


@needs_torchft
def test_nothing_is_left_running_after_either_run(runs):
    for algorithm in ("ddp", "diloco"):
        assert runs[algorithm].left_running == [], (algorithm, runs[algorithm].left_running)
        assert runs[algorithm].exit_codes == {0: 0, 1: 0}
    assert runs["children_left"] == [], [(p.pid, p.cmdline()) for p in runs["children_left"]]


@pytest.mark.parametrize("kwargs, message", [
    ({"num_groups": 0}, "num_groups must be an int >= 1, got 0"),
    ({"timeout_s": 0}, r"timeout_s must be > 0 \(seconds\), got 0"),
    ({"heartbeat_timeout_ms": 0}, "heartbeat_timeout_ms must be an int >= 1, got 0"),
    ({"args": ["--metrics-dir", "m"]}, "args must not set --metrics-dir")])
def test_a_bad_setting_is_refused_before_anything_starts(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        run_replica_groups(runs_dir=tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == [], "no run folder made, nothing started"


@needs_torchft
def test_a_group_that_exits_with_an_error_is_an_error_naming_its_code_and_leaves_nothing_running(tmp_path):
    """ft_train.py refuses --max-steps 7 with --sync-every 5 (argparse: its rank exits with 2, torchrun with 1): the
    error names the code and the groups' last torchrun lines, after everything was stopped."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(LaunchError, match=r"group\(s\) \[[01](, 1)?\] exited with code\(s\) \[1(, 1)?\].*exitcode  : 2"):
        run_replica_groups(["--algorithm", "diloco", "--max-steps", 7], runs_dir=tmp_path, timeout_s=STATE_TIMEOUT_S)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.status() != "zombie"]
    assert left == [], [(p.pid, p.cmdline()) for p in left]


@needs_torchft
def test_groups_still_running_at_the_timeout_are_stopped_before_the_error(tmp_path):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(LaunchError, match=r"group\(s\) \[0, 1\] still ran after 0\.5 s"):
        run_replica_groups(["--max-steps", 100000], runs_dir=tmp_path, timeout_s=0.5)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.status() != "zombie"]
    assert left == [], [(p.pid, p.cmdline()) for p in left]
