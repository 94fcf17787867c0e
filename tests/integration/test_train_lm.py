"""train_lm.py (issue 28): one process, DDP, FSDP2 and HSDP from one seed checkpoint; exact resume; the memory plan
against real runs; the DDP + compile bucket failure and its fix; the planner's and the script's input checks.

The layout runs are launched once per module (each 2- or 4-rank launch costs seconds here); the fixture fails the
module if a process of its jobs survives, as ``run_root`` does for single tests.
"""

import json
import subprocess
import sys

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.diagnosis.cause_ids import CauseId
from tutorial_lib.planning import memory_plan
from tutorial_lib.errors import ConfigError, LaunchError, MetricsError
from tutorial_lib.runs.rundir import LESSONS_DIR

from conftest import wait_no_job_processes

SMALL = ["--n-layers", 2, "--d-model", 32, "--n-heads", 2, "--block-size", 32, "--corpus-bytes", 1 << 17,
         "--max-steps", 6, "--eval-windows", 16, "--eval-every", 3, "--precision", "fp32", "--log-every", 1]
GLOBAL_BATCH = 8
FP32_TOLERANCE = 64 * torch.finfo(torch.float32).eps  # relative to the loss: reduction order only (notebook 11)


def launch(root, label, args, nproc):
    return tl.run_script("train_lm", args, runs_dir=root, label=label, device="cpu", nproc_per_node=nproc,
                         timeout_s=300, live="off")


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """{label: LaunchResult} of the same training in every layout, from one seed checkpoint (FSDP2 from a full .pt
    file of the same weights, broadcast from rank 0), plus the seed folder and the .pt file."""
    root = tmp_path_factory.mktemp("lm-runs")
    seed = tl.run_in_process("train_lm", [*SMALL, "--create-seed-checkpoint", "seed"], runs_dir=root, label="seed")
    seed_dir = seed.run_dir / "seed"
    lm = tl.import_script("train_lm")
    model = lm.GPT(lm.model_config(lm.parse_args([str(a) for a in SMALL])))
    model.init_weights(0)
    torch.save(model.state_dict(), root / "full.pt")
    common = [*SMALL, "--init-from", seed_dir]
    runs = {"one process": tl.run_in_process("train_lm", [*common, "--parallel", "none", "--batch-size", GLOBAL_BATCH],
                                             runs_dir=root, label="none"),
            "DDP": launch(root, "ddp", [*common, "--parallel", "ddp", "--batch-size", 4, "--track-memory"], 2),
            "FSDP2": launch(root, "fsdp", [*SMALL, "--init-from", root / "full.pt", "--parallel", "fsdp",
                                           "--batch-size", 4, "--track-memory"], 2),
            "HSDP": launch(root, "hsdp", [*common, "--parallel", "hsdp", "--batch-size", 2], 4)}
    yield runs, seed_dir
    left = wait_no_job_processes(str(root))
    assert not left, f"processes left behind: {[(p.pid, p.info['cmdline']) for p in left]}"


@pytest.mark.integration
def test_one_process_as_plain_python_learns_and_logs_the_schema(tmp_path):
    proc = subprocess.run([sys.executable, str(LESSONS_DIR / "train_lm.py"), *map(str, SMALL), "--parallel", "none",
                           "--max-steps", "8", "--sample-tokens", "20"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9)) and {r["world_size"] for r in rows} == {1}
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert len(evals) == 3 and evals[-1] < evals[0] < 5.6, evals  # steps 3, 6, 8; ln 256 = 5.55 at the start
    assert all(tl.runs.metrics.check_step_record(r, "train_lm") == [] for r in rows)
    sample = json.loads((tmp_path / "metrics" / "sample_rank0.json").read_text())
    assert sample["text"].startswith("def ") and "sample: 'def " in proc.stdout


@pytest.mark.integration
def test_every_layout_gives_the_loss_curve_of_one_process_within_the_fp32_tolerance(layouts):
    runs, _ = layouts
    curves = tl.runs.loss_curves({label: r.metrics() for label, r in runs.items()})
    assert list(curves.index) == list(range(1, 7)) and not curves.isna().any().any(), curves
    relative = curves.sub(curves["one process"], axis=0).abs().div(curves["one process"], axis=0)
    assert (relative.max() <= FP32_TOLERANCE).all(), relative
    assert curves["one process"].iloc[-1] < curves["one process"].iloc[0]
    evals = tl.runs.loss_curves({label: r.metrics() for label, r in runs.items()}, "eval_loss")
    assert (evals.sub(evals["one process"], axis=0).abs().div(evals["one process"], axis=0).max()
            <= FP32_TOLERANCE).all(), \
        "the held-out loss, an exact distributed mean, is the same on 1, 2 and 4 ranks"


@pytest.mark.integration
def test_every_rank_reads_the_same_corpus(layouts):
    runs, _ = layouts
    digests = {(label, r["rank"]): r["corpus_sha256"] for label, run in runs.items()
               for r in tl.runs.read_rank_json(run.run_dir, "data")}
    assert len(digests) == 1 + 2 + 2 + 4 and len(set(digests.values())) == 1, digests


@pytest.mark.integration
def test_the_memory_plan_equals_a_real_two_rank_run_in_every_category(layouts):
    runs, _ = layouts
    for label, parallel in (("FSDP2", "fsdp"), ("DDP", "ddp")):
        plan = tl.planning.plan_memory([*SMALL, "--parallel", parallel, "--batch-size", 4], world_size=2)
        measured = tl.planning.read_memory_snapshots(runs[label].run_dir)
        assert len(measured) == 2
        for rank, snapshot in enumerate(measured):
            table = tl.planning.compare_plan(plan, snapshot)
            assert (table["relative_error"] <= 0.01).all(), (label, rank, table)
            assert table.loc["total", "measured_bytes"] > 0 and table.loc["activations", "measured_bytes"] > 0
        last = runs[label].metrics().groupby("rank").last()
        # The tracker's persistent categories against the script's own exact bytes (local shards):
        assert (last["param_bytes"] == plan.peak_bytes["parameters"]).all(), (last["param_bytes"], plan.peak_bytes)
        assert (last["optimizer_state_bytes"] == plan.peak_bytes["optimizer state"]).all()


@pytest.mark.integration
def test_resume_from_an_async_checkpoint_is_bitwise_the_uninterrupted_run(tmp_path):
    root = tmp_path / "runs"
    args = [*SMALL, "--parallel", "fsdp", "--batch-size", 4, "--dropout", 0.1]  # dropout: the RNG is restored too
    whole = launch(root, "whole", [*args, "--save-every", 3, "--async-save"], 2)
    assert (whole.run_dir / "checkpoints" / "step-3" / ".metadata").is_file()
    resumed = launch(root, "resumed", [*args, "--resume", whole.run_dir / "checkpoints" / "step-3"], 2)
    keys = ["loss_local", "loss_global", "grad_norm", "lr", "epoch", "eval_loss"]
    a = whole.metrics().set_index(["rank", "step"]).loc[(slice(None), slice(4, 6)), keys]
    b = resumed.metrics().set_index(["rank", "step"])[keys]
    assert set(resumed.metrics()["resumed_from_step"]) == {3} and len(b) == 6
    assert a.equals(b), a.compare(b)
    events = tl.runs.read_rank_json(whole.run_dir, "checkpoint")
    assert [e["step"] for e in events[0]["events"]] == [3, 6] and all(e["async"] for e in events[0]["events"])
    assert not wait_no_job_processes(str(tmp_path))


# A corpus of 460 training windows: an epoch is tens of steps, so a resumed run reaches the next one in seconds.
RESHARD = ["--n-layers", 1, "--d-model", 32, "--n-heads", 2, "--block-size", 32, "--corpus-bytes", 1 << 14,
           "--eval-windows", 8, "--precision", "fp32", "--parallel", "fsdp", "--batch-size", 4, "--log-windows"]


def windows_read(run):
    """[(epoch, window index), ...] every rank of ``run`` trained on, from its windows_rank<R>.json."""
    return [(epoch, w) for r in tl.runs.read_rank_json(run.run_dir, "windows") for _, epoch, ws in r["steps"] for w in ws]


@pytest.mark.integration
@pytest.mark.parametrize("saved_on, resumed_on", [(2, 3), (4, 2)])
def test_a_checkpoint_resumes_on_another_world_size_reading_every_unread_window_of_the_epoch_once(tmp_path, saved_on,
                                                                                                    resumed_on):
    """Issue 35: saved on 2 ranks, resumed on 3, every rank failed on the missing rng_rank2.cpu; once loaded, the
    per-rank data position skipped 48 windows. The position is global now: the resumed run reads on in the epoch's
    order, every window it had not read exactly once, then starts the next epoch."""
    lm = tl.import_script("train_lm")
    args = lm.parse_args([str(a) for a in RESHARD])
    data = lm.read_corpus(args.corpus_bytes)
    n = len(lm.TokenWindows(data[:-int(len(data) * args.val_fraction)], args.block_size))
    per_step = resumed_on * args.batch_size
    max_steps = 3 + (n - 3 * saved_on * args.batch_size) // per_step + 1  # to the end of epoch 0, and one step on
    root = tmp_path / "runs"
    saved = launch(root, "saved", [*RESHARD, "--max-steps", max_steps, "--stop-at-step", 3, "--save-every", 3],
                   saved_on)
    resumed = launch(root, "resumed", [*RESHARD, "--max-steps", max_steps, "--resume",
                                       saved.run_dir / "checkpoints" / "step-3"], resumed_on)
    before = [w for epoch, w in windows_read(saved)]
    after = [w for epoch, w in windows_read(resumed) if epoch == 0]
    assert len(before) == len(set(before)) == 3 * saved_on * args.batch_size
    assert len(after) == len(set(after)) and not set(after) & set(before), "no window read twice"
    unread = set(range(n)) - set(before) - set(after)
    assert len(unread) < per_step, f"only the epoch's last {len(unread)} windows, less than one step (drop_last)"
    assert len([w for epoch, w in windows_read(resumed) if epoch == 1]) == per_step, "the next epoch began"
    rows = resumed.metrics()
    assert set(rows["resumed_from_step"]) == {3} and set(rows["world_size"]) == {resumed_on}
    assert sorted(rows["step"].unique()) == list(range(4, max_steps + 1)) and rows["loss_global"].notna().all()
    assert f"saved on {saved_on} ranks, now {resumed_on}: data position kept, RNG reseeded" in (
        resumed.run_dir / "output.log").read_text()
    assert not wait_no_job_processes(str(tmp_path))


@pytest.mark.integration
def test_a_second_run_by_hand_in_the_same_folder_starts_its_metrics_afresh_and_says_where(tmp_path):
    """Issue 35: three `python train_lm.py` in one folder appended all three runs to one rank0.jsonl."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "rank1.jsonl").write_text('{"step": 1, "rank": 1}\n')  # an earlier 2-rank run's
    (metrics / "printed_rank0.jsonl").write_text("{}\n")  # not train_lm's: the launcher's, kept
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(LESSONS_DIR / "train_lm.py"), "--max-steps", "2", "--n-layers", "1",
                               "--d-model", "32", "--corpus-bytes", "65536", "--parallel", "none"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (metrics / "rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2], "the second run's lines only"
    assert sorted(p.name for p in metrics.glob("*.jsonl")) == ["printed_rank0.jsonl", "rank0.jsonl"]
    assert f"metrics: {metrics}/rank<RANK>.jsonl" in proc.stdout


@pytest.mark.integration
def test_ddp_compile_with_small_buckets_fails_the_doctor_names_the_fix_and_the_fix_trains_as_eager(tmp_path, layouts):
    runs, seed_dir = layouts
    args = [*SMALL, "--init-from", seed_dir, "--parallel", "ddp", "--batch-size", 4, "--compile", "--compile-backend",
            "aot_eager", "--bucket-cap-mb", 0.001]
    with pytest.raises(LaunchError) as info:
        launch(tmp_path / "runs", "compile-fails", args, 2)
    d = tl.diagnose(info.value)
    assert d.cause_id == CauseId.COMPILE_BUCKET_SPLIT and "optimize_ddp = False" in d.fix, str(d)
    fixed = launch(tmp_path / "runs", "compile-fixed", [*args, "--no-optimize-ddp"], 2).metrics()
    eager = runs["DDP"].metrics()
    assert (fixed.set_index(["rank", "step"])["loss_global"] - eager.set_index(["rank", "step"])["loss_global"]
            ).abs().max() <= FP32_TOLERANCE * 6
    assert not wait_no_job_processes(str(tmp_path))


def test_the_planner_refuses_what_it_cannot_plan():
    with pytest.raises(ConfigError, match="world_size must be an int >= 1, got 0"):
        tl.planning.plan_memory([], world_size=0)
    with pytest.raises(ConfigError, match="--parallel none is one process: world_size must be 1, got 2"):
        tl.planning.plan_memory(["--parallel", "none"], world_size=2)
    with pytest.raises(ConfigError, match="world_size 6 is not a multiple of --replicate-degree 4"):
        tl.planning.plan_memory(["--parallel", "hsdp", "--replicate-degree", 4], world_size=6)
    with pytest.raises(ConfigError, match="drop --compile and --grad-accum-steps"):
        tl.planning.plan_memory(["--compile"], world_size=2)
    with pytest.raises(ConfigError, match="invalid flags"):
        tl.planning.plan_memory(["--n-heads", 3], world_size=2)
    with pytest.raises(ConfigError, match="fewer than 2 batches"):
        tl.planning.plan_memory(["--corpus-bytes", 4096, "--block-size", 64, "--batch-size", 16], world_size=2)
    with pytest.raises(MetricsError, match="unknown memory tracker category 'NEW'"):
        memory_plan.categories_of({"NEW": 1})


def test_a_plan_is_one_process_with_nothing_left_behind():
    import torch.distributed as dist
    plan = tl.planning.plan_memory(["--parallel", "hsdp", "--n-layers", 1, "--d-model", 32, "--n-heads", 2], world_size=4)
    assert not dist.is_initialized(), "the fake process group is gone"
    assert plan.parallel == "hsdp" and plan.world_size == 4 and plan.total_bytes == sum(plan.peak_bytes.values())
    assert plan.state_bytes_analytic == plan.n_params * 16 / 2, "HSDP shards over the shard dimension (4 / 2) only"
    assert plan.unsimulated_bytes > 0 and plan.headroom_bytes(1 << 40) < (1 << 40) - plan.total_bytes


def test_peak_flops_come_from_the_device_name_and_the_4090d_is_not_a_4090():
    lm = tl.import_script("train_lm")
    wb = lm.workbook  # the FLOPs and MFU are the workbook's instruments (_workbook.py), the model is lm_model.py's
    assert wb.peak_flops("NVIDIA GeForce RTX 4090 D", torch.bfloat16) == 147.1e12
    assert wb.peak_flops("NVIDIA GeForce RTX 4090", torch.bfloat16) == 165.2e12
    assert wb.peak_flops("NVIDIA H100 PCIe", torch.float32) == 51.2e12
    assert wb.peak_flops("cpu", torch.float32) is None and wb.peak_flops("Tesla T4", torch.bfloat16) is None
    cfg = lm.GPTConfig(vocab_size=256, block_size=128, n_layers=2, d_model=64, n_heads=4)
    n = sum(p.numel() for p in lm.GPT(cfg).parameters())
    assert wb.model_flops_per_token(cfg, n) == 6 * (n - 256 * 64 - 128 * 64) + 12 * 2 * 64 * 128


@pytest.mark.parametrize("args, message", [
    (["--n-heads", 3], "--n-heads must divide --d-model"),
    (["--vocab-size", 128], "--vocab-size must be >= 256"),
    (["--track-memory", "--max-steps", 1], "--track-memory tracks the second step"),
    (["--val-fraction", 0], "--val-fraction must be in (0, 1)"),
    (["--block-size", 100000], "leaves fewer than 2 held-out windows"),
])
def test_bad_flags_are_refused_before_anything_starts(args, message):
    from tutorial_lib.notebook.script_source import check_script_args
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_script_args(LESSONS_DIR / "train_lm.py", args)


def test_the_stored_24gb_table_covers_every_row_and_more_gpus_never_hurt_fsdp():
    table = tl.planning.read_memory_table()
    assert len(table) == len(memory_plan.GPT_SIZES) * 3 * len(memory_plan.LAYOUTS)
    fsdp = table[table["layout"].str.startswith("FSDP2")].pivot_table(index=["model", "layout"], columns="gpus",
                                                                       values="peak_gib")
    assert (fsdp[4] < fsdp[1]).all() and (fsdp[8] < fsdp[4]).all(), fsdp
    ddp = table[table["layout"] == "DDP fp32"].pivot_table(index="model", columns="gpus", values="peak_gib")
    assert ((ddp[4] - ddp[1]).abs() / ddp[1] < 0.25).all(), "DDP holds everything on every rank"
    assert (table["headroom_gib"] >= 0).eq(table["fits"]).all()


@pytest.mark.integration
def test_async_save_on_the_training_process_group_breaks_the_job(tmp_path):
    """On the default gloo group the background save's collectives interleave with training's: a rank aborts on a size
    mismatch or the ranks wait until the collective timeout (both seen here). On a group of its own (every other
    async save in this file) it never did."""
    args = [*SMALL, "--parallel", "fsdp", "--batch-size", 4, "--save-every", 1, "--async-save", "--save-group",
            "default", "--pg-timeout-s", 10]
    with pytest.raises(LaunchError) as info:
        launch(tmp_path / "runs", "save-default-group", args, 2)
    cause_id = tl.diagnose(info.value).cause_id
    assert cause_id in (CauseId.COLLECTIVE_MISMATCH, CauseId.COLLECTIVE_TIMEOUT), str(info.value)
    assert not wait_no_job_processes(str(tmp_path))


def test_selective_activation_checkpointing_keeps_less_than_none_and_more_than_full():
    """Op-level selective checkpointing (torch.utils.checkpoint.create_selective_checkpoint_contexts, in torch 2.8 and
    2.13) keeps the matmul and attention outputs: between no checkpointing and whole blocks, in the planned peak."""
    activations = {ac: tl.planning.plan_memory(["--parallel", "fsdp", "--n-layers", 4, "--ac-mode", ac], world_size=2)
                   .peak_bytes["activations"] for ac in ("none", "selective", "full")}
    assert activations["none"] > activations["selective"] > activations["full"] > 0, activations
