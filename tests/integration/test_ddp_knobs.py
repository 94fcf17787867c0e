"""ddp_knobs.py (notebook 10) on 2 CPU ranks: DDP's communication knobs, each outcome as measured on every rank.

One launch runs every lesson (a launch costs seconds here); the tests read its per-rank results.
"""

import os
import subprocess
import sys

import pytest
import torch

import tutorial_lib as tl
from conftest import wait_no_job_processes
from tutorial_lib.runs.rundir import LESSONS_DIR

pytestmark = pytest.mark.integration

CAPS_MB = [25, 1, 0.25, 0.05]
ARGS = ["--max-steps", 8, "--bucket-caps-mb", *CAPS_MB]  # the default model: 7 Linear layers of width 256 + a head


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp_knobs")
    result = tl.run_script("ddp_knobs", ARGS, runs_dir=root / "runs", device="cpu", nproc_per_node=2, timeout_s=180)
    assert not wait_no_job_processes(str(root)), "no process of the job is left"
    ranks = tl.runs.read_rank_json(result.run_dir, "ddp_knobs")
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["backend"] == "gloo" for r in ranks)
    ranks[0]["output_log"] = (result.run_dir / "output.log").read_text()
    return ranks


def test_rank_0_prints_a_summary_of_every_lesson_and_where_the_json_is(ranks):
    log = ranks[0]["output_log"]
    for line in ["rank 0 of 2, torch", "buckets: all-reduces per step by bucket_cap_mb (MiB): None (default): 2, 25: 1",
                 "bucket_view: gradient_as_bucket_view=False / True / True with zero_grad(set_to_none=False): grads "
                 "inside a bucket 0 of 16 / 16 of 16 / 16 of 16", "copies into / out of buckets per backward 16 / 16, "
                 "16 / 0, 0 / 0",
                 "static_graph: True vs False: the same losses", "fp16_compress_hook: 921602 (float16",
                 "head_b returned, not in the loss: fails at step 2", "ddp_knobs_rank<RANK>.json",
                 "expect DDP's warning (once per rank) that find_unused_parameters=True found no unused parameters"]:
        assert line in log, (line, log[-3000:])
    assert log.count("every rank's measurements") == 1, "rank 0 alone prints the summary"


def test_smaller_buckets_mean_more_allreduces_per_step(ranks):
    for r in ranks:
        rows = {row["label"]: row for row in r["buckets"]}
        assert list(rows) == ["None (default)", "25", "1", "0.25", "0.05"]
        calls = {label: row["all_reduce_calls_per_step"] for label, row in rows.items()}
        # 25 MiB holds the whole 1.8 MB model; the default caps the first bucket at 1 MiB; a bucket holds whole
        # tensors (a layer's bias opens it, its weight overflows it): never more than one per layer (7).
        assert calls == {"None (default)": 2, "25": 1, "1": 2, "0.25": 7, "0.05": 7}, calls
        for row in rows.values():
            assert row["buckets_per_step"] == row["all_reduce_tensors_per_step"] == row["all_reduce_calls_per_step"]
            assert sum(row["bucket_numels"]) * 4 == row["grad_bytes"] == row["all_reduced_bytes_per_step"]
            assert row["all_reduce_calls_first_step"] == 1 and len(row["bucket_numels_first_step"]) == 1, \
                "step 1: one bucket of everything, before DDP rebuilds its buckets in gradient-ready order"
        assert rows["None (default)"]["bucket_numels"] == rows["1"]["bucket_numels"] != rows["25"]["bucket_numels"]
        # Exactly as notebook 10 derives them: 7 Linear(256, 256) (65536 + 256 elements each) and the head (256 + 1),
        # in backward's order (the head first), a bucket closed once it reaches its cap.
        layer, head = 65536 + 256, 257
        assert rows["0.25"]["bucket_numels"] == rows["0.05"]["bucket_numels"] == [head + layer] + [layer] * 6
        assert rows["1"]["bucket_numels"] == [head + 4 * layer, 3 * layer] and rows["25"]["bucket_numels"] == [
            head + 7 * layer]
        assert rows["1"]["param_numels"] == [65536, 256] * 7 + [256, 1], "model.parameters() order"
        assert len({row["loss_last"] for row in rows.values()}) == 1, "bucketing changes nothing in the math"


def test_gradient_as_bucket_view_aliases_the_buckets_and_halves_gradient_storage(ranks):
    for r in ranks:
        off, on = r["bucket_view"]["False"], r["bucket_view"]["True"]
        kept = r["bucket_view"]["True, zero_grad(set_to_none=False)"]
        n = off["param_tensors"]
        assert (off["grads_inside_a_bucket"], on["grads_inside_a_bucket"], kept["grads_inside_a_bucket"]) == (0, n, n)
        assert (off["grad_storages"], on["grad_storages"]) == (n, on["buckets"])
        assert off["grad_and_bucket_storage_bytes"] == off["grad_bytes"] + off["bucket_bytes"] == 2 * on["grad_bytes"]
        assert on["grad_and_bucket_storage_bytes"] == on["grad_bytes"] == on["bucket_bytes"]
        assert off["losses"] == on["losses"] == kept["losses"]


def test_gradient_as_bucket_view_saves_one_copy_and_zero_grad_without_none_saves_the_other(ranks):
    """Issue 26: "no copies" was wrong. Counted in a backward (TorchDispatchMode, copy_ and mul.out between a .grad and
    a bucket): without views in and out; with views and zero_grad's default set_to_none=True, in once; with views
    and set_to_none=False, none (backward accumulates into the bucket)."""
    for r in ranks:
        copies = {label: (v["copies_into_buckets"], v["copies_out_of_buckets"])
                  for label, v in r["bucket_view"].items()}
        assert copies == {"False": (16, 16), "True": (16, 0), "True, zero_grad(set_to_none=False)": (0, 0)}, copies


def test_static_graph_trains_identically(ranks):
    for r in ranks:
        s = r["static_graph"]
        assert s["True"]["losses"] == s["False"]["losses"] and s["max_param_diff"] == 0.0
        assert s["True"]["all_reduce_calls_per_step"] == s["False"]["all_reduce_calls_per_step"] == 2
        assert s["True"]["all_reduce_calls_first_step"] == s["False"]["all_reduce_calls_first_step"] == 1, \
            "step 1: one bucket either way (static_graph all-reduces it after backward, DDP after the last gradient)"
        assert s["True"]["bucket_numels"] == s["False"]["bucket_numels"]


def test_compression_hooks_halve_the_bytes_and_stay_close_to_fp32(ranks):
    for r in ranks:
        hooks = r["comm_hook"]
        fp32 = hooks["fp32 (no hook)"]
        assert fp32["all_reduce_dtypes"] == ["float32"]
        for label, dtype in [("fp16_compress_hook", "float16"), ("bf16_hook (hand-written)", "bfloat16")]:
            h = hooks[label]
            assert h["all_reduce_dtypes"] == [dtype] and h["all_reduce_calls_per_step"] == fp32["all_reduce_calls_per_step"]
            assert 2 * h["all_reduced_bytes_per_step"] == fp32["all_reduced_bytes_per_step"]
            assert 0 < h["max_loss_diff_vs_fp32"] < 1e-3 and 0 < h["max_param_diff_vs_fp32"] < 1e-3, h
        bf16 = hooks["bf16_compress_hook"]
        if torch.version.cuda is None:  # a CPU build: DDP refuses the built-in bf16 hook (torch 2.13 here)
            assert not bf16["registered"] and "NCCL" in bf16["error"]
        else:  # a CUDA build accepts it, also on gloo (torch 2.8's wheel here): the same numbers as the hand-written one
            assert bf16["registered"] and bf16["losses"] == hooks["bf16_hook (hand-written)"]["losses"]


def test_a_returned_but_unused_head_fails_plain_and_static_graph_ddp_and_the_fixes_train(ranks):
    expected = "Expected to have finished reduction in the prior iteration"
    for r in ranks:
        v = r["unused_head"]
        plain = v["head_b returned, not in the loss"]
        static = v["static_graph=True, head_b returned, not in the loss"]
        assert (plain["ok"], plain["failed_at_step"]) == (False, 2) and expected in plain["error"]
        assert "parameters that were not used in producing loss" in plain["error"]
        # static_graph gets one step further; for DDP the graph did change: head_b's hooks fired in step 1 only (an
        # undefined gradient through _DDPSink, .grad stays None), find_unused_parameters=True's in every step
        assert (static["ok"], static["failed_at_step"]) == (False, 3) and expected in static["error"]
        assert "training graph has changed" in static["error"]
        assert plain["head_b_grad"] == ["none"] and static["head_b_grad"] == ["none", "none"]
        found = v["find_unused_parameters=True, head_b returned, not in the loss"]
        assert [u["head_b_hooks_fired_in_steps"] for u in (plain, static, found)] == [[], [1], list(range(1, 9))]
        assert v["static_graph=True, head_b computed, not returned"]["head_b_hooks_fired_in_steps"] == []
        for label in ("find_unused_parameters=True, head_b returned, not in the loss",
                      "static_graph=True, head_b computed, not returned"):
            assert v[label]["ok"] and v[label]["trunk_max_param_diff_vs_reference"] == 0.0, label
            assert not v[label]["head_b_trained"], label
        in_loss = v["static_graph=True, head_b in the loss"]
        assert in_loss["ok"] and in_loss["head_b_trained"] and in_loss["trunk_max_param_diff_vs_reference"] > 0


def test_device_cuda_without_cuda_fails_naming_the_flag(tmp_path):
    out = subprocess.run([sys.executable, LESSONS_DIR / "ddp_knobs.py", "--device", "cuda"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # no GPU visible, on any machine
    assert out.returncode == 1, out.stderr[-500:]
    assert "--device cuda" in out.stderr and "torch.cuda.is_available() is False" in out.stderr, out.stderr[-500:]
    assert "AttributeError" not in out.stderr, out.stderr[-500:]


def test_help_shows_the_whole_first_paragraph_of_the_docstring(tmp_path, forked_python):
    python, env = forked_python  # the script's output is the point, not its start-up: torch imported once
    out = subprocess.run([*python, LESSONS_DIR / "ddp_knobs.py", "--help"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0 and "left out of the loss." in " ".join(out.stdout.split()), out.stdout[:800]


def test_ddp_knobs_refuses_bad_flags_naming_the_value(tmp_path, forked_python):
    python, env = forked_python
    for args, message in [(["--max-steps", "2"], "--max-steps must be >= 3"),
                          (["--bucket-caps-mb", "1", "0"], "--bucket-caps-mb must all be > 0"),
                          (["--lessons", "zero"], "invalid choice: 'zero'")]:
        out = subprocess.run([*python, LESSONS_DIR / "ddp_knobs.py", *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120, env=env)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr[-500:])
