"""Notebook 02's evaluation lesson (issue 18): DistributedSampler pads, so a naive all-reduced metric counts some
samples twice and depends on the world size; summing losses and counts (or gathering by index) gives exactly the
single-process metric. ``distributed_eval.py`` on 2, 3 and 5 CPU ranks, 11 samples.

Every launch uses ``run_root``, which fails the test if any process of its jobs survives.
"""

import subprocess
import sys

import pytest
import torch.distributed as dist

import tutorial_lib as tl
from tutorial_lib.runs.rundir import LESSONS_DIR

N = 11  # samples: on 2, 3 and 5 ranks DistributedSampler pads to 12, 12 and 15


def launch(run_root, nproc):
    result = tl.run_script("distributed_eval", ["--dataset-size", N], runs_dir=run_root, device="cpu",
                           nproc_per_node=nproc, timeout_s=120)
    return tl.runs.read_rank_json(result.run_dir, "eval"), (result.run_dir / "output.log").read_text()


@pytest.fixture
def single(run_root):
    """One process in this one, as ``python distributed_eval.py`` (the reference the notebook uses)."""
    record = tl.runs.read_rank_json(tl.run_in_process("distributed_eval", ["--dataset-size", N], runs_dir=run_root).run_dir,
                               "eval")[0]
    assert not dist.is_initialized(), "a world of one joins no process group"
    return record


def test_one_process_is_the_reference_where_the_three_ways_agree(single):
    assert single["world_size"] == 1 and single["padded_indices"] == single["shard_indices"] == list(range(N))
    assert single["seen_twice"] == [] and single["naive"]["samples"] == single["exact"]["samples"] == N
    assert single["naive"] == single["exact"] == single["gathered"]
    assert 0 < single["exact"]["accuracy"] < 1, "neither all right nor all wrong: padding can move the accuracy"


@pytest.mark.integration
def test_two_ranks_count_index_0_twice_and_the_exact_metric_is_one_process(run_root, single):
    ranks, log = launch(run_root, 2)
    assert [r["padded_indices"] for r in ranks] == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 0]], "index 0 repeated"
    assert [r["shard_indices"] for r in ranks] == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9]]
    assert "rank 1: DistributedSampler gave indices [1, 3, 5, 7, 9, 0]" in log and "indices [0]" in log
    first = ranks[0]
    assert all(r[way] == first[way] for r in ranks for way in ("naive", "exact", "gathered")), "all-reduced: same"
    assert first["seen_twice"] == [0] and first["naive"]["samples"] == 12 and first["exact"]["samples"] == N
    # naive: the mean over the padded list of 12 (sample 0 twice), not over the 11 samples
    loss, correct = first["per_sample_loss"], first["per_sample_correct"]
    assert first["naive"]["loss"] == pytest.approx((sum(loss) + loss[0]) / 12, abs=1e-12)
    assert first["naive"]["accuracy"] == pytest.approx((sum(correct) + correct[0]) / 12, abs=1e-12)
    assert abs(first["naive"]["loss"] - single["exact"]["loss"]) > 1e-3
    assert first["naive"]["accuracy"] != single["exact"]["accuracy"]
    for way in ("exact", "gathered"):  # each sample once: one process's accuracy exactly, its loss to float32 sums
        assert first[way]["accuracy"] == single["exact"]["accuracy"]
        assert first[way]["loss"] == pytest.approx(single["exact"]["loss"], abs=1e-6)
    assert first["per_sample_loss"] == pytest.approx(single["per_sample_loss"], abs=1e-6)


@pytest.mark.integration
def test_the_naive_metric_depends_on_the_world_size_the_exact_one_does_not(run_root, single):
    two, _ = launch(run_root, 2)
    three, _ = launch(run_root, 3)
    five, log = launch(run_root, 5)
    assert three[0]["seen_twice"] == [0] and three[0]["naive"]["samples"] == 12
    assert three[0]["naive"]["loss"] == pytest.approx(two[0]["naive"]["loss"], abs=1e-12), "12 on 3 ranks too"
    assert five[0]["seen_twice"] == [0, 1, 2, 3] and five[0]["naive"]["samples"] == 15
    assert sorted(i for r in five for i in r["padded_indices"]) == sorted([*range(N), 0, 1, 2, 3])
    assert "rank 4: the shard sampler gave indices [4, 9]" in log, "no padding: shards of 3 and 2 samples"
    assert abs(five[0]["naive"]["loss"] - two[0]["naive"]["loss"]) > 1e-3
    assert five[0]["naive"]["accuracy"] != two[0]["naive"]["accuracy"]
    for ranks in (two, three, five):
        assert ranks[0]["exact"]["samples"] == ranks[0]["gathered"]["samples"] == N
        assert ranks[0]["exact"]["accuracy"] == ranks[0]["gathered"]["accuracy"] == single["exact"]["accuracy"]
        assert ranks[0]["exact"]["loss"] == pytest.approx(single["exact"]["loss"], abs=1e-6)
        assert ranks[0]["gathered"]["loss"] == pytest.approx(single["exact"]["loss"], abs=1e-6)


def test_a_bad_dataset_size_fails_fast_with_the_value_named(tmp_path):
    out = subprocess.run([sys.executable, str(LESSONS_DIR / "distributed_eval.py"), "--dataset-size", "0"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--dataset-size must be > 0, got 0" in out.stderr
    assert not (tmp_path / "metrics").exists()
