"""fsdp_train.py and model_parallel.py on 2 CPU ranks: what notebook 04 claims, checked on a small model.

The runs are launched once per module (each 2-rank launch costs seconds); the fixture fails the module if a
process of its jobs survives, as ``run_root`` does for single tests.
"""

import subprocess
import sys

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.runs.rundir import LESSONS_DIR

from conftest import wait_no_job_processes

pytestmark = pytest.mark.integration

# vocab 257 and dim 48 do not divide by 2 everywhere: FSDP2's uneven Shard(0) is exercised (rank 0 holds 129 rows
# of the embedding, rank 1 128).
SMALL = ["--vocab-size", 257, "--dim", 48, "--n-heads", 2, "--n-layers", 2, "--seq-len", 16, "--batch-size", 4,
         "--max-steps", 3]
CONFIGS = {
    "ddp": ["--strategy", "ddp"],
    "fsdp2": ["--strategy", "fsdp2"],
    "fsdp2_ac": ["--strategy", "fsdp2", "--activation-checkpointing"],
    "fsdp2_bf16_fine": ["--strategy", "fsdp2", "--precision", "bf16", "--wrap", "fine"],
    "fsdp2_offload_accum": ["--strategy", "fsdp2", "--cpu-offload", "--grad-accum-steps", 2, "--batch-size", 2],
    "fsdp1_fine_ac_bf16": ["--strategy", "fsdp1", "--wrap", "fine", "--activation-checkpointing",
                           "--precision", "bf16"],
}
OBSERVED = {"fsdp2_offload_accum"}  # launched with observe=True: what each rank issued, as torch saw it


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp-runs")
    cache = {}

    def get(name):
        if name not in cache:
            result = tl.run_script("fsdp_train", SMALL + CONFIGS[name], runs_dir=root, label=name, device="cpu",
                                   nproc_per_node=2, timeout_s=120, live="off", observe=name in OBSERVED)
            cache[name] = (result.metrics(), tl.runs.read_rank_json(result.run_dir, "model"),
                           result.observed() if name in OBSERVED else None)
        return cache[name][:2]

    def observed(name):  # the observer's records of an OBSERVED config
        get(name)
        return cache[name][2]

    get.observed = observed
    yield get
    left = wait_no_job_processes(str(root))
    assert not left, f"processes left behind: {[(p.pid, p.info['cmdline']) for p in left]}"


def state(metrics):
    last = metrics.sort_values("step").groupby("rank").last()
    return last["param_bytes"] + last["grad_bytes"] + last["optimizer_state_bytes"]


def test_fsdp2_holds_half_of_ddp_state_exactly_as_predicted_and_trains_identically(runs):
    ddp, ddp_model = runs("ddp")
    fsdp, fsdp_model = runs("fsdp2")
    shapes = fsdp_model[0]["shapes"]
    for rank in (0, 1):
        for name, metrics, strategy in (("ddp", ddp, "ddp"), ("fsdp2", fsdp, "fsdp2")):
            predicted = tl.planning.predict_state_bytes(shapes, strategy=strategy, world_size=2, rank=rank)
            last = metrics[metrics["rank"] == rank].iloc[-1]
            assert (last["param_bytes"], last["grad_bytes"], last["optimizer_state_bytes"]) == (
                predicted.param_bytes, predicted.grad_bytes, predicted.optimizer_state_bytes), (name, rank)
    ratio = state(fsdp) / state(ddp)
    assert ((ratio > 0.45) & (ratio < 0.55)).all(), ratio
    assert state(fsdp)[0] > state(fsdp)[1], "uneven dim 0: rank 0 holds the extra rows"
    assert fsdp_model[0]["fsdp_units"] == 2 + 1, "one unit per block plus the root"
    a, b = (m[m["rank"] == 0].set_index("step")["loss_global"] for m in (ddp, fsdp))
    assert (a - b).abs().max() < 1e-4 and a.iloc[-1] < a.iloc[0], (a, b)


def test_activation_checkpointing_saves_activation_bytes_without_changing_the_loss(runs):
    plain, _ = runs("fsdp2")
    ac, _ = runs("fsdp2_ac")
    assert (ac["activation_bytes"] < 0.5 * plain["activation_bytes"]).all()
    assert (plain["block_forwards"] == 2).all() and (ac["block_forwards"] == 4).all(), "recomputed in backward"
    assert (ac["loss_global"] - plain["loss_global"]).abs().max() < 1e-5
    assert (state(ac) == state(plain)).all(), "checkpointing touches activations only"


def test_bf16_policy_keeps_fp32_state_and_fine_wrapping_makes_a_unit_per_linear(runs):
    plain, _ = runs("fsdp2")
    bf16, model = runs("fsdp2_bf16_fine")
    assert (state(bf16) == state(plain)).all(), "fp32 shards, gradients and AdamW state under the bf16 policy"
    assert (bf16["activation_bytes"] < 0.8 * plain["activation_bytes"]).all()
    assert (bf16["loss_global"] - plain["loss_global"]).abs().max() < 0.05, "bf16 compute, close to fp32"
    assert model[0]["fsdp_units"] == 2 * 4 + 1 + 1, "4 Linears per block, the head, and the root"


def test_cpu_offload_and_accumulation_keep_the_state_and_the_loss(runs):
    plain, _ = runs("fsdp2")
    offload, _ = runs("fsdp2_offload_accum")
    assert (offload["param_device"] == "cpu").all() and (state(offload) == state(plain)).all()
    assert (offload["activation_bytes"] < 0.6 * plain["activation_bytes"]).all(), "half the micro-batch"
    # two micro-batches of 2 are the same samples as one batch of 4: the same mean loss
    assert (offload["loss_global"] - plain["loss_global"]).abs().max() < 1e-4
    # 3 units (2 blocks + root), as the launch's observer saw each rank issue them: per micro-step 2 * 3 - 1
    # all-gathers (the root stays gathered between its forward and backward) and 3 reduce-scatters, in every step
    observed = runs.observed("fsdp2_offload_accum")
    counts = observed.per_step_counts("all_gather", "reduce_scatter", "all_reduce")
    assert [(c["rank"], c["step"]) for c in counts] == [(r, s) for r in (0, 1) for s in (1, 2, 3)], counts
    assert all(c["all_gather"] == 2 * 5 and c["reduce_scatter"] == 2 * 3 for c in counts), counts
    # the one all-reduce: the script's loss all-reduce after each optimizer step, counted in the next step's
    assert [c["all_reduce"] for c in counts] == [0, 1, 1] * 2, counts


def test_fsdp1_with_the_auto_wrap_policy_bound_by_partial_and_its_mixed_precision(runs):
    ddp, _ = runs("ddp")
    fsdp1, model = runs("fsdp1_fine_ac_bf16")
    # >= 100 parameters each: the 8 Linears, the embedding, the head, then each block (its two LayerNorms, 2 x 96
    # parameters, are what remains unwrapped in it); plus the root
    assert model[0]["fsdp_units"] == 8 + 1 + 1 + 2 + 1, "min_num_params=100 wraps nearly every layer"
    for rank in (0, 1):
        predicted = tl.planning.predict_state_bytes(model[0]["shapes"], strategy="fsdp1", world_size=2, rank=rank,
                                           fsdp1_units=model[0]["fsdp_units"]).state_bytes
        assert abs(predicted / state(fsdp1)[rank] - 1) < 0.10
    ratio = state(fsdp1) / state(ddp)
    assert ((ratio > 0.45) & (ratio < 0.55)).all(), ratio
    assert (fsdp1["loss_global"] - ddp["loss_global"]).abs().max() < 0.05, "bf16 MixedPrecision, close to fp32"


def test_ddp_with_bf16_autocast_keeps_fp32_state_in_a_world_of_one(runs, tmp_path):
    ddp, _ = runs("ddp")
    args = [*SMALL, "--strategy", "ddp", "--precision", "bf16", "--max-steps", 1, "--metrics-dir", "metrics"]
    out = subprocess.run([sys.executable, LESSONS_DIR / "fsdp_train.py", *map(str, args)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = tl.runs.read_metrics(tmp_path).to_dict("records")
    assert row["world_size"] == 1 and row["param_bytes"] == ddp["param_bytes"].iloc[0], "a full fp32 replica"
    # Same batch per rank as the DDP run. Less, not half: autocast keeps fp32 where it must (layer norm, the loss),
    # and the bf16 weight copies it saves for backward count as saved tensors (they are not parameters).
    assert row["activation_bytes"] < ddp["activation_bytes"].iloc[0]


def test_the_seeds_direct_policy_call_raises_type_error():
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
    with pytest.raises(TypeError, match="module"):
        size_based_auto_wrap_policy(min_num_params=100)


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp16", "--device", "cpu"], "--precision fp16 needs CUDA"),
    (["--strategy", "ddp", "--cpu-offload"], "--cpu-offload is implemented for --strategy fsdp2 only"),
    (["--dim", 30, "--n-heads", 4], "--n-heads must divide --dim, got --dim 30 --n-heads 4"),
])
def test_bad_flags_are_refused_with_the_value_named(tmp_path, args, message):
    out = subprocess.run([sys.executable, LESSONS_DIR / "fsdp_train.py", *map(str, args)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "metrics").exists()


def test_model_parallel_matches_one_device_and_says_where_the_halves_are(run_root):
    result = tl.run_script("model_parallel", ["--max-steps", 2], runs_dir=run_root, device="cpu", nproc_per_node=1,
                           timeout_s=120, live="off")
    (mp,) = tl.runs.read_rank_json(result.run_dir, "mp")
    assert mp["max_abs_diff_vs_one_device"] < 1e-6
    assert mp["split_across_devices"] is False and "both halves on cpu" in mp["note"]
    assert mp["param_bytes_per_device"] == {"cpu": (1000 * 2000 + 2000 + 2000 * 1000 + 1000) * 4}


def test_fsdp2_with_torch_amp_grad_scaler_skips_the_step_on_every_rank_when_one_shard_overflows(run_root):
    """Notebook 03's checklist (e): with fully_shard, torch.amp.GradScaler needs no sharding-aware subclass.

    Rank 1 puts an inf into its own shard of one gradient; the scaler's inf check on DTensor gradients is
    reduced across the shards, so rank 0, whose shard is finite, skips the step and halves the scale too.
    (Measured on torch 2.8 and 2.13.)
    """
    import json
    import shutil
    from pathlib import Path

    run_dir = tl.new_run_dir("fsdp2-grad-scaler", run_root)
    script = shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "fsdp2_grad_scaler_inf.py", run_dir)
    result = tl.launch(tl.LaunchSpec(script, device="cpu", live="off", timeout_s=120))
    log = (result.run_dir / "output.log").read_text().splitlines()
    reports = sorted((json.loads(line.split("] ", 1)[1]) for line in log if '"stepped"' in line),
                     key=lambda r: r["rank"])
    assert reports == [{"rank": 0, "stepped": False, "scale": 512.0}, {"rank": 1, "stepped": False, "scale": 512.0}]


KNOBS_SMALL = ["--dim", 16, "--n-layers", 2, "--batch-size", 2]


def test_fsdp_knobs_counts_and_gradients_on_two_ranks(tmp_path):
    result = tl.run_script("fsdp_knobs", [*KNOBS_SMALL, "--lessons", "reshard", "averaging", "accumulation", "clipping"],
                           runs_dir=tmp_path, device="cpu", nproc_per_node=2, timeout_s=120, live="off")
    units = 2 + 1
    for r in tl.runs.read_rank_json(result.run_dir, "knobs"):
        reshard = r["reshard"]
        assert [reshard[k]["all_gather"] for k in ("default (None)", "True", "False")] == [2 * units - 1, 2 * units, units]
        assert reshard["False"]["param_bytes_after_forward"] == r["param_bytes_unsharded"]
        assert reshard["True"]["param_bytes_after_forward"] == r["param_bytes_unsharded"] / 2
        assert "1" not in reshard, "an int reshard needs 4 ranks or more"
        assert r["averaging"]["sum, then divide"]["max_grad_diff_vs_one_process"] < 1e-6
        assert r["averaging"]["ReduceOp.AVG (the default)"]["grad_norm_ratio_vs_one_process"] == pytest.approx(
            2.0 if torch.__version__.startswith("2.8") else 1.0, rel=1e-5), "pytorch#162338 on torch 2.8's gloo"
        every, once = r["accumulation"].values()
        assert (every["reduce_scatter"], once["reduce_scatter"]) == (4 * units, units)
        assert once["max_grad_diff_vs_one_process"] < 1e-6
        clip = r["clipping"]
        assert clip["norm_full"] == pytest.approx(clip["ddp_norm"], rel=1e-5) and clip["max_clipped_grad_diff_vs_ddp"] < 1e-6


def test_fsdp_knobs_refuses_hsdp_without_four_ranks(tmp_path, forked_python):
    python, env = forked_python  # the script's output is the point, not its start-up: torch imported once
    out = subprocess.run([*python, LESSONS_DIR / "fsdp_knobs.py", *map(str, KNOBS_SMALL), "--lessons", "hsdp"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1 and "--lessons hsdp needs an even world of at least 4 ranks, got WORLD_SIZE=1" in out.stderr


def test_fsdp_knobs_checks_the_world_before_the_first_lesson_and_says_what_it_skips(tmp_path, forked_python):
    python, env = forked_python
    script = [*python, LESSONS_DIR / "fsdp_knobs.py", *map(str, KNOBS_SMALL)]
    out = subprocess.run([*script, "--lessons", "reshard", "hsdp"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 1 and "WORLD_SIZE=1 (--lessons reshard hsdp" in out.stderr, out.stderr[-2000:]
    assert "reshard (rank 0" not in out.stdout, "reshard ran before the refusal"
    out = subprocess.run([*script, "--lessons", "reshard", "averaging"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "reshard: the int variant (reshard_after_forward=WORLD_SIZE // 2) is skipped: WORLD_SIZE=1" in out.stdout
    assert "reshard (rank 0 of 1): reshard_after_forward=True: 0 all-gathers" in out.stdout
    assert "averaging (rank 0 of 1): sum, then divide: gradients x1.000" in out.stdout
    assert f"every number in {tmp_path / 'metrics' / 'knobs_rank0.json'}" in out.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_fsdp_knobs_refuses_device_cuda_without_cuda(tmp_path, forked_python):
    python, env = forked_python
    out = subprocess.run([*python, LESSONS_DIR / "fsdp_knobs.py", "--device", "cuda"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "--device cuda, but torch.cuda.is_available() is False" in out.stderr, out.stderr
