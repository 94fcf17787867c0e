"""train_hf.py (issue 35): a Hugging Face architecture (Llama here; notebook 13 runs Qwen2) built on meta, sharded
with FSDP2 on 2 CPU ranks, loaded from safetensors: one process's loss and gradient norm, an exact resume, a resume on
another number of ranks, the memory plan against every rank's measurement, LoRA, and bad input refused first."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.runs.rundir import LESSONS_DIR

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FP32_TOLERANCE = 64 * torch.finfo(torch.float32).eps
COMMON = ["--seq-len", 32, "--max-steps", 4, "--lr", 3e-3, "--precision", "fp32", "--corpus-bytes", 1 << 16]


def launch(root, label, args, nproc=2):
    return tl.run_script("train_hf", args, runs_dir=root, label=label, device="cpu", nproc_per_node=nproc,
                         timeout_s=300, live="off")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-runs")
    made = tl.run_in_process("train_hf", ["--create-tiny-model", "tiny", "--arch", "llama"], runs_dir=root,
                             label="tiny")
    tiny = str(made.run_dir / "tiny")
    common = ["--model", tiny, *COMMON]
    fsdp = launch(root, "fsdp", [*common, "--batch-size", 2, "--save-every", 2, "--track-memory"])
    return {"root": root, "tiny": tiny, "common": common, "fsdp": fsdp,
            "one": tl.run_in_process("train_hf", [*common, "--batch-size", 4], runs_dir=root, label="one")}


def test_fsdp_on_two_ranks_equals_one_process_in_loss_and_gradient_norm(runs):
    fsdp = runs["fsdp"].metrics().query("rank == 0").set_index("step")
    one = runs["one"].metrics().set_index("step")
    for key in ("loss_global", "grad_norm"):
        gap = ((fsdp[key] - one[key]).abs() / one[key].abs()).max()
        assert gap <= FP32_TOLERANCE, (key, gap)
    # The control: gradients summed over the 2 ranks (x2) would not pass.
    assert ((2 * fsdp["grad_norm"] - one["grad_norm"]).abs() / one["grad_norm"]).min() > 100 * FP32_TOLERANCE


def test_cpu_offload_runs_on_cpu_ranks_and_trains_as_without_it(runs):
    """Issue 46: the layout the planner recommends for a 7B (--cpu-offload) refused CPU ranks and, on GPUs, made an
    NCCL-only group that refuses clip_grad_norm_'s collectives on the CPU gradients. On CPU ranks it runs FSDP's
    CPUOffloadPolicy code path (nothing moves: the shards are on the CPU already) and trains exactly as without it."""
    offload = launch(runs["root"], "offload", [*runs["common"], "--batch-size", 2, "--cpu-offload", "--save-every", 2,
                                               "--export", "exported"])
    keys = ["rank", "step", "loss_local", "loss_global", "grad_norm"]
    with_it = offload.metrics()[keys].sort_values(["rank", "step"]).reset_index(drop=True)
    without = runs["fsdp"].metrics()[keys].sort_values(["rank", "step"]).reset_index(drop=True)
    assert len(with_it) == 8 and (with_it[["rank", "step"]] == without[["rank", "step"]]).all().all()
    for key in ("loss_global", "grad_norm"):
        gap = ((with_it[key] - without[key]).abs() / without[key].abs()).max()
        assert gap <= FP32_TOLERANCE, (key, gap)
    # The export from offloaded shards, as scripts/gpu_check.py verifies it on GPUs: the step-4 checkpoint exactly;
    # the control, step 2's checkpoint, is refused.
    import importlib.util

    spec = importlib.util.spec_from_file_location("_gpu_check_for_train_hf", ROOT / "scripts" / "gpu_check.py")
    gpu_check = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(gpu_check)
    assert "export equals the step-4 checkpoint" in gpu_check.verify_export(offload.run_dir, step=4)
    with pytest.raises(AssertionError, match="differs from the step-2 checkpoint"):
        gpu_check.verify_export(offload.run_dir, step=2)


def test_the_process_group_gets_a_cpu_backend_beside_nccl_when_offloading_on_cuda():
    """torchtitan's _get_distributed_backend: with CPU offload, "cuda:nccl,cpu:gloo" (a unit test: no GPU here)."""
    backend = tl.import_script("train_hf").process_group_backend
    assert backend("cuda", cpu_offload=True) == "cuda:nccl,cpu:gloo"
    assert backend("cuda", cpu_offload=False) == "nccl" and backend("cpu", cpu_offload=True) == "gloo"
    assert backend("cuda", cpu_offload=True, backend="gloo") == "cuda:gloo,cpu:gloo"
    assert backend("cpu", cpu_offload=False, backend="auto") == "gloo"


def test_a_resume_on_the_same_ranks_is_bitwise_and_on_three_ranks_continues(runs):
    checkpoint = str(tl.runs.checkpoint_dir(runs["fsdp"].run_dir, step=2))
    again = launch(runs["root"], "resume", [*runs["common"], "--batch-size", 2, "--resume", checkpoint])
    keys = ["rank", "step", "loss_local", "grad_norm", "lr"]
    before = runs["fsdp"].metrics().query("step > 2")[keys].sort_values(["rank", "step"]).reset_index(drop=True)
    after = again.metrics()[keys].sort_values(["rank", "step"]).reset_index(drop=True)
    assert after.equals(before)
    three = launch(runs["root"], "resume-3", [*runs["common"], "--batch-size", 2, "--resume", checkpoint], nproc=3)
    metrics = three.metrics()
    assert sorted(metrics["rank"].unique()) == [0, 1, 2] and sorted(metrics["step"].unique()) == [3, 4]
    assert (metrics["resumed_from_step"] == 2).all() and metrics["loss_global"].notna().all()


def test_the_data_position_is_global_so_another_world_size_reads_each_window_once():
    """Saved after 3 steps on 2 ranks, resumed on 3: the windows read are the epoch's order from its start, each once."""
    hf = tl.import_script("train_hf")
    tokens = torch.arange(32 * 40 + 1)  # 40 windows of 33 tokens, window i starts with token 32 i

    def read(windows, steps, world_size, batch_size=2):
        out = []
        for _ in range(steps):
            start = windows.consumed
            for rank in range(world_size):  # every rank of the step, in this one process
                windows.consumed = start
                x, _ = windows.next(batch_size, rank, world_size, "cpu")
                out += [int(row[0]) // 32 for row in x]
        return out

    windows = hf.Windows(tokens, 32, seed=0)
    first = read(windows, 3, world_size=2)  # 12 windows
    resumed = hf.Windows(tokens, 32, seed=0)
    resumed.load_state_dict(windows.state_dict())
    rest = read(resumed, 4, world_size=3)  # 24 more: 36 of the epoch's 40
    order = torch.randperm(40, generator=torch.Generator().manual_seed(0)).tolist()
    assert first + rest == order[:36]


def test_the_plan_equals_every_ranks_measured_memory(runs):
    """Parameters and optimizer state byte for byte, the total within one collective buffer (tl.planning.matches_plan): gloo's
    worker thread can free an all-gather output after the main thread's next allocation (traced: 15 of 222 ranks
    beside three busy loops, the CI failure of stop 41)."""
    plan = tl.planning.plan_hf(runs["tiny"], world_size=2, seq_len=32, batch_size=2, layout="fp32")
    # The tiny Llama's decoder layer, the largest unit: q, o 64 x 64; k, v 64 x 32; gate, up, down 64 x 176; 2 norms.
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176 + 2 * 64
    assert plan.collective_buffer_bytes == plan.unsimulated_bytes == 4 * layer  # the headroom counts it
    measured = tl.planning.read_memory_snapshots(runs["fsdp"].run_dir)
    assert len(measured) == 2
    for snapshot in measured:
        assert tl.planning.matches_plan(plan, snapshot), tl.planning.compare_plan(plan, snapshot)
    # The control: the plan of twice the batch misses every rank by more than one buffer.
    wrong = tl.planning.plan_hf(runs["tiny"], world_size=2, seq_len=32, batch_size=4, layout="fp32")
    assert not any(tl.planning.matches_plan(wrong, snapshot) for snapshot in measured)


def test_on_three_ranks_each_rank_matches_its_own_plan_and_not_rank_0s(runs):
    """Issue 46: on 3 ranks rank 2 holds fewer rows of some parameters (torch.chunk), so less optimizer state: with
    rank 0's plan only, a correct run failed tl.planning.matches_plan on rank 2."""
    three = launch(runs["root"], "memory-3", [*runs["common"], "--batch-size", 2, "--max-steps", 2, "--track-memory"],
                   nproc=3)
    plan = tl.planning.plan_hf(runs["tiny"], world_size=3, seq_len=32, batch_size=2, layout="fp32")
    measured = tl.planning.read_memory_snapshots(three.run_dir)
    assert len(measured) == 3 and sorted(plan.rank_peak_bytes) == [0, 1, 2]
    for rank, snapshot in enumerate(measured):
        assert tl.planning.matches_plan(plan, snapshot, rank=rank), (rank, tl.planning.compare_plan(plan, snapshot, rank=rank))
    assert plan.for_rank(2)["optimizer state"] == measured[2]["optimizer state"] < plan.for_rank(0)["optimizer state"]
    assert not tl.planning.matches_plan(plan, measured[2], rank=0), "the control: rank 0's plan is not rank 2's"


def test_lora_trains_the_adapters_only_and_exports_them_merged(runs, tmp_path):
    exported = tmp_path / "merged"
    lora = launch(runs["root"], "lora", [*runs["common"], "--batch-size", 2, "--lora-rank", 4, "--max-steps", 2,
                                         "--export", exported])
    model = tl.runs.read_rank_json(lora.run_dir, "model")[0]
    assert 0 < model["n_trainable"] < model["n_params"] / 5
    assert lora.metrics()["loss_global"].notna().all()
    from safetensors.torch import load_file
    before, after = load_file(f"{runs['tiny']}/model.safetensors"), load_file(exported / "model.safetensors")
    assert set(after) == set(before)
    frozen = [k for k in before if not any(t in k for t in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                            "up_proj", "down_proj"))]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen), "the base outside the adapters is frozen"
    assert not torch.equal(before["model.layers.0.self_attn.q_proj.weight"],
                           after["model.layers.0.self_attn.q_proj.weight"]), "the adapters were merged in"


def test_export_is_a_folder_from_pretrained_reads_with_the_trained_weights(runs, tmp_path):
    from transformers import AutoModelForCausalLM
    import torch.distributed.checkpoint as dcp
    checkpoint = tl.runs.checkpoint_dir(runs["fsdp"].run_dir, step=4)
    one = tl.run_in_process("train_hf", [*runs["common"], "--batch-size", 4, "--resume", checkpoint, "--max-steps", 5,
                                         "--save-every", 5, "--export", tmp_path / "tuned"], runs_dir=runs["root"],
                            label="export")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tuned")
    saved = {"app": {"model": {k: torch.empty_like(v) for k, v in model.state_dict().items()}}}
    dcp.load(saved, checkpoint_id=tl.runs.checkpoint_dir(one.run_dir, step=5))
    assert all(torch.equal(saved["app"]["model"][k], v) for k, v in model.state_dict().items())


def published_copy(tiny, folder):
    """The tiny model as a published folder is: bf16 weights by config.json, and tokenizer files beside them."""
    import json
    import shutil

    shutil.copytree(tiny, folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("torch_dtype", None)
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordLevel"}}')  # copied, not read
    (folder / "special_tokens_map.json").write_text('{"eos_token": "</s>"}')
    return folder


def test_an_export_afterwards_from_a_checkpoint_is_the_export_at_the_end_sharded_in_the_models_dtype(runs, tmp_path):
    """Issue 46: --export wrote one fp32 model.safetensors at the end of a run only, without the tokenizer. Now: the
    config's dtype, shards with an index (a tiny shard limit here), the tokenizer files; and --export-from writes the
    same folder afterwards from a DCP checkpoint, in one process, whatever number of ranks saved it."""
    import json

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    source = published_copy(runs["tiny"], tmp_path / "published")
    common = ["--model", source, *COMMON, "--batch-size", 2, "--export-shard-gb", 1e-4]
    end = launch(runs["root"], "export-end", [*common, "--save-every", 4, "--export", tmp_path / "end"])
    tl.export_hf(tl.runs.checkpoint_dir(end.run_dir, step=4), tmp_path / "after", model=source, shard_gb=1e-4,
                 runs_dir=runs["root"])  # python train_hf.py --export-from ... in this process
    for folder in (tmp_path / "end", tmp_path / "after"):
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        files = sorted(set(index["weight_map"].values()))
        assert len(files) > 1 and all((folder / f).is_file() for f in files), files
        tensors = {k: v for f in files for k, v in load_file(folder / f).items()}
        assert set(tensors) == set(index["weight_map"]) and {t.dtype for t in tensors.values()} == {torch.bfloat16}
        assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in tensors.values())
        assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
        for name in ("tokenizer.json", "special_tokens_map.json"):
            assert (folder / name).read_bytes() == (source / name).read_bytes(), name
        # Nothing else: DCP's consolidation leaves every rank's pieces in sharded/, which the export removes.
        extra = {"config.json", "model.safetensors.index.json", "tokenizer.json", "special_tokens_map.json",
                 "generation_config.json"}
        assert {p.name for p in folder.iterdir()} == set(files) | extra
    after = tl.runs.read_output_log(max((runs["root"]).glob("*-export-hf"), key=lambda p: p.stat().st_mtime))
    assert "step-4: step 4, saved on 2 ranks" in after and "read from the checkpoint file by file" in after, after
    # torch 2.13's HuggingFaceStorageWriter consolidates: the end of the run gathered nothing (the path is printed).
    assert "every rank wrote its own rows with dcp.save" in tl.runs.read_output_log(end.run_dir)
    a, b = (AutoModelForCausalLM.from_pretrained(tmp_path / name) for name in ("end", "after"))
    assert a.dtype == torch.bfloat16 and all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    tokens = torch.arange(32)[None]
    assert torch.equal(a(tokens).logits, b(tokens).logits)
    refused = subprocess.run([sys.executable, str(LESSONS_DIR / "train_hf.py"), *map(str, common), "--export-from",
                              "latest", "--export", tmp_path / "end"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=180)
    assert refused.returncode != 0 and "exists and is not empty" in refused.stderr, "nothing is overwritten"
    with pytest.raises(tl.ConfigError, match="not a complete DCP checkpoint"):
        tl.runs.load_trained_hf(source, tmp_path / "end")  # an export is not a checkpoint


def test_a_lora_run_exports_a_peft_adapter_that_loads_on_the_base_as_the_merged_model(runs, tmp_path):
    """Issue 46: LoRA was exported merged only; --export-adapter writes what PeftModel.from_pretrained loads."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    args = [*runs["common"], "--batch-size", 2, "--lora-rank", 4, "--max-steps", 2, "--save-every", 2]
    lora = launch(runs["root"], "lora-adapter", [*args, "--export", tmp_path / "merged"])
    tl.run_in_process("train_hf", [*runs["common"], "--export-from", tl.runs.checkpoint_dir(lora.run_dir, step=2),
                                   "--export-adapter", "--export", tmp_path / "adapter"], runs_dir=runs["root"],
                      label="export-adapter")
    assert {p.name for p in (tmp_path / "adapter").iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(runs["tiny"]), tmp_path / "adapter")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    base = AutoModelForCausalLM.from_pretrained(runs["tiny"])
    tokens = torch.arange(32)[None]
    with torch.no_grad():
        gap = (adapted(tokens).logits - merged(tokens).logits).abs().max().item()
        moved = (base(tokens).logits - merged(tokens).logits).abs().max().item()
    assert gap <= 1e-5 < moved, (gap, moved)  # the adapter is the training's, not the untouched base
    # The merge is exact: W + alpha / r B A in fp32 from the adapter file and the base, here computed whole in one
    # process, equals bit for bit what the ranks merged each on its own rows (and what --export-from merged whole).
    from safetensors.torch import load_file
    tl.run_in_process("train_hf", [*runs["common"], "--export-from", tl.runs.checkpoint_dir(lora.run_dir, step=2),
                                   "--export", tmp_path / "merged-after"], runs_dir=runs["root"], label="export-merged")
    lora_ab = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    base_w = load_file(f"{runs['tiny']}/model.safetensors")
    at_end, after = (load_file(tmp_path / name / "model.safetensors") for name in ("merged", "merged-after"))
    merged_names = [k for k in base_w if k.endswith("proj.weight")]
    assert len(merged_names) == 14 and set(at_end) == set(after) == set(base_w)
    for name in merged_names:
        a, b = (lora_ab[f"base_model.model.{name[:-len('weight')]}lora_{x}.weight"] for x in "AB")
        expected = base_w[name] + 32.0 / 4 * (b @ a)
        assert torch.equal(at_end[name], expected) and torch.equal(after[name], expected), name
        assert not torch.equal(base_w[name] + (b @ a), expected)  # the control: a merge without the scale alpha / r


def test_a_resume_with_another_seq_len_is_refused_naming_both(runs, tmp_path):
    checkpoint = str(tl.runs.checkpoint_dir(runs["fsdp"].run_dir, step=2))
    args = [a for a in runs["common"]]
    args[args.index("--seq-len") + 1] = 64
    proc = subprocess.run([sys.executable, str(LESSONS_DIR / "train_hf.py"), *map(str, args), "--resume", checkpoint,
                           "--metrics-dir", "m"], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0 and "was saved with --seq-len 32; this run has --seq-len 64" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--model", "no-such-folder"], "no config.json in it"),
    (["--model", "TINY", "--seq-len", 4096], "--seq-len 4096 is above the model's max_position_embeddings 512"),
    (["--model", "TINY", "--replicate-degree", 3], "--replicate-degree 3 must divide the world size 1"),
])
def test_bad_input_is_refused_before_training(runs, tmp_path, args, message):
    args = [runs["tiny"] if a == "TINY" else str(a) for a in args]
    proc = subprocess.run([sys.executable, str(LESSONS_DIR / "train_hf.py"), *args, "--metrics-dir", "m"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "m").exists(), "nothing was written before the refusal"
