"""Checkpointing (issue 6): exact resume, resharding, crash during a save, elastic restart, the seed's FSDP save.

The resume path is exercised for real: new processes load what earlier ones saved, and the loss of
every resumed step is compared *bitwise* with an uninterrupted run. Bitwise equality holds on CPU
because every input of a step is restored (weights, AdamW moments and step counts, the LR scheduler's
step, the sampler's epoch and position, each rank's dropout RNG) and the computation is deterministic
(same kernels, one thread per rank, gloo sums two ranks in a fixed order).
Launching tests use ``run_root``, which fails the test if any process of its jobs survives.
"""

import json
import subprocess
import sys
import time

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.runs.rundir import LESSONS_DIR

SCRIPT = LESSONS_DIR / "checkpoint_train.py"


def launch(args, run_root, **spec):
    spec = {"device": "cpu", "nproc_per_node": 2, "timeout_s": 150, **spec}
    return tl.run_script("checkpoint_train", args, runs_dir=run_root, **spec)


def losses(metrics, after_step=0):
    """{(rank, step): loss_local} of the last attempt that ran each step, from ``after_step + 1`` on."""
    m = metrics[metrics["step"] > after_step].drop_duplicates(["rank", "step"], keep="last")
    return {(r, s): v for r, s, v in zip(m["rank"], m["step"], m["loss_local"])}


# --- without launching ---------------------------------------------------------------------------------

def make_step(folder, name, marker=True, files=("__0_0.distcp", "__1_0.distcp", ".metadata", "extra_rank1.pt")):
    path = folder / name
    path.mkdir(parents=True)
    for f in files:
        (path / f).write_bytes(b"x" * 10)
    if marker:
        (path / "checkpoint.json").write_text(json.dumps({"step": int(name.rsplit("-", 1)[1]), "world_size": 2,
                                                          "format": "dcp"}))
    return path


def test_only_renamed_folders_with_their_marker_count_as_checkpoints(tmp_path):
    make_step(tmp_path, "step-3")
    make_step(tmp_path, ".tmp-step-6")  # a crash after the marker but before the rename
    make_step(tmp_path, "step-9", marker=False)  # renamed by hand, or written by a careless tool
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    table = tl.runs.list_checkpoints(tmp_path)
    assert list(table["name"]) == ["step-3", ".tmp-step-6", "step-9"]
    assert list(table["complete"]) == [True, False, False]
    assert tl.runs.latest_checkpoint(tmp_path) == tmp_path / "step-3"
    files = tl.runs.checkpoint_files(tmp_path / "step-3").set_index("file")["rank"].to_dict()
    assert files == {"__0_0.distcp": 0, "__1_0.distcp": 1, ".metadata": 0, "extra_rank1.pt": 1, "checkpoint.json": 0}
    with pytest.raises(tl.ConfigError, match="not a complete checkpoint"):
        tl.runs.load_checkpoint_state(tmp_path / "step-9")
    with pytest.raises(tl.ConfigError, match="does not exist"):
        tl.runs.list_checkpoints(tmp_path / "missing")
    assert tl.runs.latest_checkpoint(tmp_path / "step-9") is None


def test_diff_state_dicts_is_bitwise_and_names_what_differs():
    a = {"model": {"w": torch.ones(2, 2), "b": torch.zeros(2)}, "optim": {"param_groups": [{"lr": 0.1}]}}
    b = {"model": {"w": torch.ones(2, 2), "b": torch.zeros(2)}, "optim": {"param_groups": [{"lr": 0.1}]}}
    assert tl.runs.diff_state_dicts(a, b) == []
    b["model"]["w"] = torch.ones(2, 2) + 1e-7  # one ulp-sized change is a difference
    b["optim"]["param_groups"][0]["lr"] = 0.2
    del b["model"]["b"]
    assert tl.runs.diff_state_dicts(a, b) == ["model.b (only in a)", "model.w", "optim.param_groups.0.lr"]


def test_plot_resume_draws_one_segment_per_attempt_and_marks_the_resume_step():
    import pandas as pd
    rows = [{"rank": 0, "step": s, "attempt": 0, "resumed_from_step": 0, "loss_global": 1 / s} for s in range(1, 6)]
    rows += [{"rank": 0, "step": s, "attempt": 1, "resumed_from_step": 3, "loss_global": 1 / s} for s in range(4, 9)]
    fig = tl.plots.plot_resume(pd.DataFrame(rows), reference=pd.DataFrame(rows[:5]))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "uninterrupted run", "attempt 0", "attempt 1, resumed from step 3"]
    assert any(list(line.get_xdata()) == [3, 3] for line in ax.lines), "a vertical line at the resume step"


def run_plain(args, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--save-every", 3, "--fail-rank", 0, "--fail-step", 4, "--fail-mode", "kill-during-save"],
     "--fail-step 4 must be a multiple of --save-every 3"),
    (["--dropout", 1], "--dropout must be in [0, 1), got 1.0"),
])
def test_bad_flags_fail_fast_with_the_value_named(tmp_path, args, message):
    out = run_plain(args, tmp_path)
    assert out.returncode == 2 and message in out.stderr


def test_a_resume_path_without_its_marker_is_refused(tmp_path):
    (tmp_path / "checkpoints" / "step-2").mkdir(parents=True)
    out = run_plain(["--resume", "checkpoints/step-2"], tmp_path)
    assert out.returncode == 1 and "is not a complete checkpoint folder (no checkpoint.json)" in out.stderr


def test_one_process_stopped_at_half_and_resumed_is_bitwise_exact(tmp_path):
    straight, stopped, resumed = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (straight, stopped, resumed):
        d.mkdir()
    assert run_plain(["--max-steps", 6], straight).returncode == 0
    assert run_plain(["--max-steps", 6, "--stop-at-step", 3, "--save-every", 10, "--format", "full"],
                     stopped).returncode == 0
    assert [c["name"] for _, c in tl.runs.list_checkpoints(stopped / "checkpoints").iterrows()] == ["step-3"], \
        "a stopped job saves at its last step"
    out = run_plain(["--max-steps", 6, "--resume", stopped / "checkpoints" / "step-3"], resumed)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "resumed from step-3 (step 3)" in out.stdout
    a, b, c = (tl.runs.read_metrics(d) for d in (straight, stopped, resumed))
    assert list(b["step"]) == [1, 2, 3] and list(c["step"]) == [4, 5, 6] and (c["resumed_from_step"] == 3).all()
    assert {**losses(b), **losses(c)} == losses(a)


# --- real 2-rank jobs ----------------------------------------------------------------------------------



@pytest.mark.integration
def test_sharded_fsdp2_checkpoint_resumes_bitwise_on_two_ranks_and_loads_on_one(run_root):
    saved = launch(["--strategy", "fsdp2", "--format", "dcp", "--max-steps", 6, "--save-every", 3], run_root)
    step3 = saved.run_dir / "checkpoints" / "step-3"
    files = tl.runs.checkpoint_files(step3)
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(files["file"]), "each rank wrote its own shard"
    two = launch(["--strategy", "fsdp2", "--max-steps", 6, "--resume", step3, "--dump-loaded-state"], run_root)
    assert losses(two.metrics()) == losses(saved.metrics(), after_step=3)  # bitwise, every rank, steps 4-6
    one = launch(["--strategy", "fsdp2", "--max-steps", 4, "--resume", step3, "--dump-loaded-state"], run_root,
                 nproc_per_node=1)
    reference = tl.runs.load_checkpoint_state(step3)  # dcp_to_torch_save, no process group
    for run in (two, one):
        loaded = torch.load(run.run_dir / "metrics" / "loaded_state.pt", weights_only=False)
        assert tl.runs.diff_state_dicts(loaded, reference) == [], "model and optimizer round-trip bitwise"
    load = [e for e in tl.runs.read_rank_json(one.run_dir, "checkpoint")[0]["events"] if e["event"] == "load"]
    assert load[0]["saved_world_size"] == 2 and one.metrics()["world_size"].eq(1).all()


@pytest.mark.integration
def test_kill_during_save_keeps_the_previous_checkpoint_and_an_elastic_restart_resumes(run_root):
    common = ["--strategy", "ddp", "--max-steps", 6, "--save-every", 2]
    # 1. rank 1 is SIGKILLed inside the step-4 save, after writing part of it (steps 1-4 did run)
    with pytest.raises(tl.LaunchError) as info:
        launch([*common, "--fail-rank", 1, "--fail-step", 4, "--fail-mode", "kill-during-save"], run_root)
    assert not isinstance(info.value, tl.LaunchTimeout)
    assert (info.value.rank, info.value.failure.exit_code) == (1, -9), str(info.value)
    killed = tl.runs.read_metrics(info.value.run_dir)
    assert sorted(set(killed["step"])) == [1, 2, 3, 4]
    folder = info.value.run_dir / "checkpoints"
    table = tl.runs.list_checkpoints(folder)
    assert table[["name", "complete"]].values.tolist() == [["step-2", True], [".tmp-step-4", False]]
    assert (folder / ".tmp-step-4" / "extra_rank1.pt").exists(), "part of the save reached the disk"
    # 2. new processes resume from the newest complete checkpoint, redo steps 3-4 identically, and
    #    replace the leftover folder
    resumed = launch([*common, "--checkpoint-dir", folder, "--resume", "latest"], run_root)
    assert (resumed.metrics()["resumed_from_step"] == 2).all()
    redone = losses(resumed.metrics())
    assert {k: v for k, v in redone.items() if k[1] <= 4} == losses(killed, after_step=2)
    assert tl.runs.list_checkpoints(folder)[["name", "complete"]].values.tolist() == [
        ["step-2", True], ["step-4", True], ["step-6", True]]
    uninterrupted = {**losses(killed), **redone}  # steps 1-6, shown above to continue exactly
    # 3. an elastic restart: rank 0 raises before step 5 on the first attempt; torchrun restarts both ranks
    restarted = launch([*common, "--format", "full", "--fail-rank", 0, "--fail-step", 5, "--resume", "latest"],
                       run_root, max_restarts=1)
    m = restarted.metrics()
    assert sorted(set(zip(m["attempt"], m["resumed_from_step"]))) == [(0, 0), (1, 4)]
    assert m.groupby("attempt")["step"].agg(["min", "max"]).values.tolist() == [[1, 4], [5, 6]]
    assert losses(m) == uninterrupted
    assert "resumed from step-4" in (restarted.run_dir / "output.log").read_text()


@pytest.mark.integration
def test_the_seeds_rank0_only_fsdp_save_times_out_and_the_all_rank_gather_round_trips(run_root):
    start = time.monotonic()
    with pytest.raises(tl.LaunchError) as info:
        launch(["--strategy", "fsdp2", "--format", "full", "--save-mode", "rank0-only", "--max-steps", 1,
                "--save-every", 1, "--pg-timeout-s", 3], run_root)
    assert not isinstance(info.value, tl.LaunchTimeout), "the process group's timeout fired, not the launcher's"
    assert "Timed out" in info.value.failure.traceback
    assert time.monotonic() - start < 3 + 60
    assert tl.runs.list_checkpoints(info.value.run_dir / "checkpoints")["complete"].tolist() == [False]
    saved = launch(["--strategy", "fsdp2", "--format", "full", "--max-steps", 4, "--save-every", 2], run_root)
    step2 = saved.run_dir / "checkpoints" / "step-2"
    assert {f for f, r in tl.runs.checkpoint_files(step2)[["file", "rank"]].values if r == 1} == {"extra_rank1.pt"}
    state = tl.runs.load_checkpoint_state(step2)
    assert state["model"]["net.0.weight"].shape == (128, 32), "gathered: whole tensors, no module. prefix"
    resumed = launch(["--strategy", "fsdp2", "--max-steps", 4, "--resume", step2, "--dump-loaded-state"], run_root)
    assert losses(resumed.metrics()) == losses(saved.metrics(), after_step=2)
    loaded = torch.load(resumed.run_dir / "metrics" / "loaded_state.pt", weights_only=False)
    assert tl.runs.diff_state_dicts(loaded, state) == []


def test_the_scheduler_built_after_the_optimizer_load_runs_the_first_resumed_step_at_the_warmup_rate(tmp_path):
    """Issue 18 (resuming the LR scheduler): built with its defaults, then load_state_dict, the resumed run's learning
    rate and loss equal the uninterrupted run's step for step; built after the optimizer's state was loaded, its
    constructor's step overwrites the restored rate (one process, so it runs as plain python)."""
    def train(name, *args):
        argv = ["--max-steps", 8, "--save-every", 4, "--metrics-dir", name, "--checkpoint-dir", f"{name}-ckpt", *args]
        out = subprocess.run([sys.executable, str(SCRIPT), *map(str, argv)], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return {r["step"]: (r["lr"], r["loss_local"]) for r in map(json.loads, (tmp_path / name / "rank0.jsonl").open())}

    ref = train("ref")
    resume = ["--resume", tmp_path / "ref-ckpt" / "step-4"]
    right, wrong = train("right", *resume), train("wrong", *resume, "--scheduler-order", "built-after-load")
    assert right == {s: ref[s] for s in range(5, 9)}
    assert wrong[5] == (ref[1][0], ref[5][1]) and ref[1][0] < ref[5][0], "step 5 ran at step 1's warmup rate"
    assert all(wrong[s][0] == ref[s][0] and wrong[s][1] != ref[s][1] for s in range(6, 9))
