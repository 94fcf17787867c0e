"""The lesson scripts of notebooks 02 and 01 (ddp_train.py's proof, its DDP pitfalls) on 2 CPU ranks: what each
shows, and its intended failures.

Every test uses ``run_root``, which fails the test if any process of its jobs survives.
"""

import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import tutorial_lib as tl
from tutorial_lib.runs.rundir import LESSONS_DIR

pytestmark = pytest.mark.integration


def run(name, args, run_root, **spec):
    return tl.run_script(name, args, runs_dir=run_root, device="cpu", nproc_per_node=2, timeout_s=120, **spec)


def test_sampler_shards_pads_and_reshuffles_only_with_set_epoch(run_root):
    ranks = tl.runs.read_rank_json((result := run("sampler_demo", ["--dataset-size", 7], run_root)).run_dir, "sampler")
    assert [r["rank"] for r in ranks] == [0, 1]
    good, bad = [r["set_epoch"] for r in ranks], [r["no_set_epoch"] for r in ranks]
    for records in (good, bad):
        for epoch in (0, 1):
            padded = [i for r in records for i in r["padded"]["epochs"][epoch]]
            assert sorted(set(padded)) == list(range(7)) and len(padded) == 8, "one index repeated as padding"
            dropped = [i for r in records for i in r["drop_last"]["epochs"][epoch]]
            assert len(dropped) == len(set(dropped)) == 6, "drop_last: 3 per rank, no overlap"
    assert all(r["padded"]["epochs"][0] == r["padded"]["epochs"][1] for r in bad)
    assert any(r["padded"]["epochs"][0] != r["padded"]["epochs"][1] for r in good)
    log = (result.run_dir / "output.log").read_text()
    assert "with set_epoch, epoch 1" in log and "without set_epoch (the mistake), epoch 1" in log, "lines say which loop"


def test_dataloader_bench_measures_every_configuration_on_every_rank(run_root):
    result = run("dataloader_bench", ["--dataset-size", 32, "--epochs", 1, "--num-workers", 0, 1,
                                      "--sample-delay-ms", 0], run_root)
    ranks = tl.runs.read_rank_json(result.run_dir, "loader")
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert [(row["num_workers"], row["persistent_workers"]) for row in r["rows"]] == [(0, False), (1, False), (1, True)]
        assert all(row["samples"] == 16 and row["samples_per_s"] > 0 for row in r["rows"])
        assert not any(row["pin_memory"] for row in r["rows"]), "pin_memory only with CUDA"


def test_dataloader_bench_one_knob_at_a_time_counts_worker_starts_prefetch_and_pinning(run_root):
    # 96 samples, 2 ranks, batches of 4: 12 batches per rank and epoch, more than 4 prefetched x 2 workers.
    result = run("dataloader_bench", ["--dataset-size", 96, "--batch-size", 4, "--epochs", 2, "--num-workers", 2,
                                      "--sample-delay-ms", 0, "--one-knob-at-a-time"], run_root)
    for r in tl.runs.read_rank_json(result.run_dir, "loader"):
        rows = {row["changed"]: row for row in r["rows"]}
        assert list(rows) == ["num_workers=0", "baseline", "persistent_workers=True", "prefetch_factor=4",
                              "pin_memory=True"]
        assert [row["worker_starts"] for row in rows.values()] == [0, 4, 2, 4, 4], "2 per epoch, 2 once if persistent"
        assert [row["batches_requested_at_start"] for row in rows.values()] == [0, 4, 4, 8, 4], "prefetch x workers"
        assert [row["batch_is_pinned"] for row in rows.values()] == [False] * 4 + [torch.cuda.is_available()]
        assert all(row["samples"] == 96 for row in rows.values()), "2 epochs of the rank's 48 samples"
        assert [row["loading_processes"] for row in rows.values()] == [1, 4, 2, 4, 4], "who loaded: the workers"


def test_dataloader_bench_counts_loads_that_overlap_in_time(run_root):
    """Issue 26: notebooks 02 and 08 assert that workers load in parallel (not that they are faster): from every
    sample's load times, 1 load at a time without workers, 2 at once with 2 workers (sleeping 5 ms per sample)."""
    result = run("dataloader_bench", ["--dataset-size", 64, "--batch-size", 4, "--epochs", 1, "--num-workers", 0, 2,
                                      "--sample-delay-ms", 5], run_root)
    for r in tl.runs.read_rank_json(result.run_dir, "loader"):
        rows = [(row["num_workers"], row["persistent_workers"], row["max_concurrent_loads"]) for row in r["rows"]]
        assert rows == [(0, False, 1), (2, False, 2), (2, True, 2)], rows
        assert all(row["first_batch_s"] > 0 for row in r["rows"])


def test_max_concurrent_loads_counts_only_loads_in_progress_at_one_instant():
    bench = tl.import_script(LESSONS_DIR / "dataloader_bench.py")
    assert bench.max_concurrent([]) == 0
    assert bench.max_concurrent([(1, 0.0, 1.0), (1, 1.0, 2.0), (1, 2.0, 3.0)]) == 1, "back to back: never two"
    assert bench.max_concurrent([(1, 0.0, 2.0), (2, 1.0, 3.0)]) == 2
    assert bench.max_concurrent([(1, 0.0, 9.0), (2, 1.0, 2.0), (3, 1.5, 2.5), (2, 3.0, 4.0)]) == 3


@pytest.mark.parametrize("mode, per_step", [("every_micro_step", 3), ("no_sync", 1)])
def test_grad_accum_counts_one_all_reduce_round_per_micro_step_or_per_step(run_root, mode, per_step):
    result = run("grad_accum", ["--grad-accum-steps", 3, "--max-steps", 2, "--accumulation", mode], run_root)
    calls = result.metrics().groupby(["rank", "step"])["all_reduce_calls"].first()
    assert (calls == per_step).all(), calls  # this small model fits one gradient bucket
    p0, p1 = (torch.load(result.run_dir / "metrics" / f"params_rank{r}.pt") for r in (0, 1))
    assert all(torch.equal(p0[k], p1[k]) for k in p0), "replicas stay identical"
    # The reference as notebook 02 computes it: one process on the whole batch, in this process.
    single = tl.run_in_process("grad_accum", ["--grad-accum-steps", 1, "--batch-size", 3 * 2 * 8, "--max-steps", 2],
                               runs_dir=run_root)
    assert not dist.is_initialized(), "the in-process run joins no process group"
    ref = torch.load(single.run_dir / "metrics" / "params_rank0.pt")
    assert max((p0[k] - ref[k]).abs().max().item() for k in ref) < 1e-6, "same as one process on the whole batch"


def test_uneven_inputs_hang_becomes_an_error_within_the_group_timeout_and_join_fixes_it(run_root):
    start = time.monotonic()
    with pytest.raises(tl.LaunchError) as info:
        run("uneven_inputs", ["--pg-timeout-s", 3], run_root)
    assert not isinstance(info.value, tl.LaunchTimeout), "the process group's timeout fired, not the launcher's"
    assert info.value.rank in (0, 1) and info.value.exit_code == 1
    assert "Timed out" in info.value.failure.traceback
    assert time.monotonic() - start < 3 + 20
    steps = run("uneven_inputs", ["--join", "--pg-timeout-s", 3], run_root).metrics().groupby("rank")["step"].max()
    assert steps.to_dict() == {0: 4, 1: 6}


def test_ddp_on_two_ranks_equals_one_process_with_the_union_of_their_batches(run_root):
    """Notebook 01's proof, over two epochs. DistributedSampler with the same seed, shuffle and drop_last: rank r takes
    every 2nd index of the epoch's permutation from r on, so the ranks' step-k batches together are exactly the
    step-k batch of one process with twice the batch; DDP averages the ranks' gradients, so only the order of the
    floating-point sums differs: allclose with a tight tolerance, not bitwise."""
    common = ["--dataset-size", 96, "--max-steps", 5, "--optimizer", "sgd", "--lr", 0.05, "--save-grads-dir", "grads"]
    ddp = run("ddp_train", common + ["--batch-size", 16], run_root)
    single = tl.run_in_process("ddp_train", common + ["--batch-size", 32], runs_dir=run_root, label="single")
    grads = [torch.load(ddp.run_dir / "grads" / f"grads_rank{r}.pt") for r in (0, 1)]
    ref = torch.load(single.run_dir / "grads" / "grads_rank0.pt")
    assert set(grads[0]) == set(ref) and all(torch.equal(grads[0][k], grads[1][k]) for k in ref), "ranks agree bitwise"
    assert max((grads[0][k] - ref[k]).abs().max().item() for k in ref) < 1e-6
    assert all(torch.allclose(grads[0][k], ref[k], rtol=1e-5, atol=1e-7) for k in ref)
    # 96 samples, 32 a step: 3 steps an epoch, so steps 4 and 5 come from the second epoch's shuffle (set_epoch).
    losses = ddp.metrics().query("rank == 0").sort_values("step")["loss_global"].to_numpy()
    reference = single.metrics().sort_values("step")["loss_global"].to_numpy()
    assert len(losses) == len(reference) == 5
    assert abs(losses - reference).max() < 1e-5 * reference.max(), (losses, reference)
    assert "epoch 1" in (ddp.run_dir / "output.log").read_text()


def test_unused_parameter_fails_with_ddp_reduction_error_and_the_flag_fixes_it(run_root):
    with pytest.raises(tl.LaunchError) as info:
        run("unused_params", ["--loss-uses", "a", "--max-steps", 3], run_root)
    assert info.value.rank in (0, 1)
    assert "Expected to have finished reduction in the prior iteration" in info.value.failure.traceback
    assert "rank" in str(info.value) and "unused_params.py failed on rank" in str(info.value)
    ok = run("unused_params", ["--loss-uses", "a", "--max-steps", 3, "--find-unused-parameters"], run_root)
    assert ok.metrics()["step"].max() == 3
    assert "did not find any unused parameters" not in (ok.run_dir / "output.log").read_text(), \
        "head b is really unused in the forward, so DDP's search finds it"
    assert "ResourceWarning" not in (ok.run_dir / "output.log").read_text()


def test_sync_batchnorm_refuses_cpu_with_a_clear_message(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the notebook runs SyncBatchNorm for real")
    out = subprocess.run([sys.executable, str(LESSONS_DIR / "sync_batchnorm.py")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "needs CUDA GPUs: SyncBatchNorm does not run on CPU" in out.stderr
