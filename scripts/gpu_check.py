"""The GPU check: every training script and every notebook on CUDA with nccl, planned first, then run.

    PYTHONPATH=. python scripts/gpu_check.py [--gpus N [N ...]] [--out-dir DIR]
    PYTHONPATH=. python scripts/gpu_check.py --dry-run --gpus 1 2 4    # the plan only: no GPU needed

``plan_checks(gpus)`` lists, without touching CUDA, what runs on a machine with ``gpus`` GPUs:

1. every shipped training script (``tutorial_lib/lessons/*.py``) through ``tutorial_lib``'s launcher, one
   rank per GPU (``model_parallel.py``: one rank per pair of GPUs), each checking what only a GPU run
   produces (``cuda:LOCAL_RANK`` devices, ``peak_allocated_bytes`` > 0, NVML samples, pinned memory,
   fp16 with a GradScaler, DCP over nccl, ...);
2. ``ddp_train.py`` in fp32, bf16 and fp16 (tensor-core speed, final loss vs fp32);
3. one script with ``device="cpu"``: the GPUs are hidden from the workers and gloo is used;
4. every notebook (``notebooks/NN_*.ipynb``) with ``DEVICE="cuda"`` and ``NPROC`` ranks, through papermill in
   a Jupyter kernel (``display``, widgets and the notebook's outputs exist only there: a real run without
   papermill and ipykernel stops before it starts anything). The notebooks take most of the time.

``--dry-run`` prints that plan (torchrun command lines from ``tutorial_lib``'s ``build_command``, notebook
parameters, what each check asserts) and exits 0. Otherwise the plan of each ``--gpus`` count runs
(default: every visible GPU; a count below the visible one shows the workers and kernels only the first N
GPUs), a summary table is printed, and the exit status is 1 if anything failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tutorial_lib as tl  # noqa: E402
from tutorial_lib.runs import metrics as metrics_schema  # noqa: E402
from tutorial_lib.launcher.devices import DevicePlan  # noqa: E402
from tutorial_lib.launcher.plan import build_command  # noqa: E402
from tutorial_lib.notebook.parameters import check_positive_int  # noqa: E402
from tutorial_lib.runs.rundir import LESSONS_DIR  # noqa: E402

NOTEBOOKS_DIR = ROOT / "notebooks"
DRY_RUN_GPUS = (1, 2, 4)  # --dry-run without --gpus: the machines of issue 15 (8 GPUs: --gpus 8)
LAUNCH_TIMEOUT_S = 240  # wall-clock limit of each script launch, seconds
SUCCESS_IS_THE_CHECK = "every rank exits 0 (the notebook asserts the details)"

# Every shipped script needs an entry: its arguments on GPUs and what its check asserts (plan_checks
# refuses a script without one, so a new script cannot silently go unchecked).
SCRIPT_CHECKS: dict[str, tuple[tuple[object, ...], str]] = {
    "checkpoint_train": (("--strategy", "fsdp2", "--format", "dcp", "--save-every", 6),
                         "FSDP2 over nccl writes complete DCP checkpoints step-6 and step-12"),
    "collective_mismatch": ((), SUCCESS_IS_THE_CHECK + "; gloo and CPU tensors even with GPUs visible"),
    "collectives_check": (("--sizes-bytes", 1 << 20, 16 << 20, 256 << 20, "--iters", 10),
                          "all_reduce, all_gather and broadcast right on every rank over nccl; busbw per size"),
    "compile_train": (("--compile-backend", "inductor", "--max-steps", 4),
                      SUCCESS_IS_THE_CHECK + "; DDP(torch.compile(model)) with inductor's Triton kernels over nccl "
                      "(notebook 14 asserts graph counts and the order of events)"),
    "dataloader_bench": (("--num-workers", 0, 4), "pin_memory=True configurations are measured (CUDA only)"),
    "ddp_knobs": ((), SUCCESS_IS_THE_CHECK + " over nccl (bf16_compress_hook accepted on a CUDA build; notebook 10 "
                      "asserts the counts, bytes and failures)"),
    "ddp_train": (("--max-steps", 30, "--batch-size", 256, "--hidden-dim", 1024, "--log-every", 10),
                  "rank r on cuda:r, peak_allocated_bytes > 0 on every step, the global loss falls; NVML samples"),
    "distributed_eval": ((), "naive, exact and gathered metrics all-reduced and all-gathered over nccl (the notebook "
                             "asserts the values)"),
    "fsdp_knobs": (("--lessons", "reshard", "averaging", "accumulation", "clipping"),
                   SUCCESS_IS_THE_CHECK + " over nccl (collectives counted by torch.profiler; notebook 09 asserts)"),
    "fsdp_train": (("--strategy", "fsdp2", "--precision", "fp16", "--max-steps", 5),
                   "FSDP2 with fp16 + GradScaler (CUDA only): a loss_scale and peak_allocated_bytes > 0 every step"),
    "grad_accum": ((), SUCCESS_IS_THE_CHECK),
    # One rank: torchft's DDP averages across replica groups, not inside one; alone, the script starts its own
    # lighthouse. --device cuda: torchft's ProcessGroupNCCL across groups (TORCH_NCCL_NONBLOCKING_TIMEOUT set from
    # --pg-timeout-s by torchft itself, NCCL_HOSTID per group as torchft's train_ddp.py sets it), PGTransport on the
    # GPU; then DiLoCo the same way. Written from torchft 0.2.0's source, never run on a GPU before this check.
    "ft_train": (("--max-steps", 20, "--device", "cuda"),
                 SUCCESS_IS_THE_CHECK + "; one torchft replica group alone on its GPU over torchft's ProcessGroupNCCL, "
                 "with a lighthouse of its own"),
    "context_parallel_float8": ((), "context parallelism over nccl: each rank holds 1/N of the sequence, the ring "
                                    "attention's output equals one process's in bf16; float8 (torch._scaled_mm) on "
                                    "compute capability >= 8.9, else the reason recorded (notebook 12 asserts)"),
    "pipeline_parallel": ((), SUCCESS_IS_THE_CHECK + "; 2 stages on 2 GPUs (1 stage on 1 GPU), GPipe and 1F1B over "
                              "nccl's send/recv (notebook 12 asserts the bubble, memory and gradients)"),
    "tensor_parallel": (("--lessons", "block", "sequence", "model"),
                        SUCCESS_IS_THE_CHECK + "; TP, SP and loss_parallel over nccl (notebook 12 asserts the counts, "
                        "bytes and the equality with one process)"),
    "model_parallel": ((), "each rank's halves on the devices pick_devices() gives it, no GPU shared by two ranks, "
                           "split across two GPUs when there is a pair per rank; output equals one device's"),
    "sampler_demo": ((), SUCCESS_IS_THE_CHECK + "; gloo, no tensors move"),
    "sync_batchnorm": ((), "every rank's running mean equals one BatchNorm's over the global batch (the script "
                           "fails above 1e-5)"),
    # --eval-every: without it the held-out loss exists at the last step only, and "it fell" compared it with itself.
    "train_lm": (("--parallel", "fsdp", "--max-steps", 20, "--precision", "bf16", "--n-layers", 4, "--d-model", 256,
                  "--track-memory", "--save-every", 10, "--async-save", "--log-every", 5, "--eval-every", 5),
                 "FSDP2 bf16 over nccl: the held-out loss falls from step 5 to step 20, MFU in (0, 1] from the "
                 "device's known peak, async DCP saves at 10 and 20; torch's tracker on the GPU equals "
                 "tl.planning.plan_memory's CPU plan within 2% and max_memory_allocated is reported beside it"),
    # TINY_MODEL: a tiny Llama written first (train_hf.py --create-tiny-model), the same command a learner runs.
    "train_hf": (("--model", "TINY_MODEL", "--max-steps", 8, "--precision", "bf16", "--ac-mode", "selective",
                  "--seq-len", 256, "--batch-size", 2, "--track-memory", "--save-every", 4, "--lr", 3e-3,
                  "--export", "exported"),
                 "FSDP2 bf16 + selective AC over nccl from safetensors broadcast by rank 0: the loss falls, DCP saves "
                 "at 4 and 8, peak_allocated_bytes > 0; torch's tracker on each GPU against its rank's tl.planning.plan_hf "
                 "plan counted as CUDA (device='cuda': total within 5%, printed per category, and which ranks "
                 "tl.planning.matches_plan accepts); --export from the GPUs without gathering the model (DCP's consolidating "
                 "HuggingFaceStorageWriter where torch has it): from_pretrained equals the step-8 checkpoint"),
    "uneven_inputs": (("--join",), "every rank exits 0: inside Join the rank with extra batches finishes"),
    "unused_params": (("--loss-uses", "both"), SUCCESS_IS_THE_CHECK),
}
# The layout tl.planning.recommend_layout picks for a 7B on 4 x 24 GB (bf16 + full AC + offload), on the tiny Llama. Every step
# clip_grad_norm_ all-reduces the norm of the gradients, which offload keeps on the CPU: an NCCL-only group refuses it.
OFFLOAD_ARGS = ("--model", "TINY_MODEL", "--max-steps", 8, "--precision", "bf16", "--ac-mode", "full", "--cpu-offload",
                "--clip-grad-norm", 1.0, "--seq-len", 256, "--batch-size", 2, "--lr", 3e-3, "--save-every", 8,
                "--export", "exported")
PRECISION_ARGS = ("--max-steps", 40, "--batch-size", 512, "--hidden-dim", 4096, "--log-every", 20,
                  "--clip-grad-norm", 1.0)
NOTEBOOK_ASSERTS = {
    "00_environment_check": "every collective right on every rank over nccl; RANK, LOCAL_RANK, WORLD_SIZE consistent",
    "01_ddp": "DDP gradients equal one process's; global loss = mean of local losses; the unused-parameter error "
              "and both fixes; sync_batchnorm.py on the GPUs",
    "02_data_and_accumulation": "sampler shards and set_epoch; DataLoader knobs one at a time (worker starts, "
                                "batches prefetched, batches pinned on CUDA); one all-reduce round per step "
                                "with no_sync; Join finishes the uneven run; the exact evaluation metric equals one "
                                "process's",
    "03_mixed_precision": "bf16 and fp16 end within 2% of fp32's loss; fp16 underflows without a scaler; overflowing "
                          "steps halve the scale",
    "04_fsdp": "FSDP state bytes are 1/N of DDP's and match the memory model; same loss curves; model_parallel "
               "splits across cuda:0 and cuda:1 when there are 2 GPUs",
    "05_checkpointing": "full and DCP saves, the rank-0-only save times out, resharded load, a killed rank's "
                        "restart resumes",
    "06_multi_node": "2 simulated nodes: unique RANKs, LOCAL_RANK from 0 on each node; a missing node and a taken "
                     "port fail naming the cause",
    "07_troubleshooting": "hangs, a skipped collective, DETAIL's mismatch and a crash diagnosed (on 2 CPU ranks); "
                          "a real CUDA out-of-memory named",
    "08_performance": "a profiler trace per rank with NCCL's all-reduce kernels overlapping backward's on the GPU; "
                      "SDPA backends in bf16 match math; NVML samples, nvidia-smi and torch.cuda.memory_summary",
    "09_fsdp_in_depth": "reshard_after_forward's all-gathers and held bytes, the ShardingStrategy table, HSDP's groups "
                        "(4 GPUs, else 4 CPU ranks), set_requires_gradient_sync, clip_grad_norm_ equals DDP's",
    "11_transformer_lm": "train_lm.py with FSDP2 learns below the unigram entropy (2 CPU ranks on 1 GPU), resumes "
                         "bitwise from an async DCP checkpoint, one process = DDP = FSDP2 = HSDP (4 GPUs, else 4 CPU "
                         "ranks) within the fp32 tolerance, the memory plan equals the measured peak, the 24 GB table",
    "10_ddp_in_depth": "all-reduces per step against bucket_cap_mb, gradients as bucket views (and the CUDA memory "
                       "they save), static_graph, compression hooks halving the bytes (bf16_compress_hook accepted "
                       "on CUDA), the returned-but-unused head under static_graph and its fixes",
    "14_compile": "DDP + compile over nccl (aot_eager): graphs = DDP's buckets as predicted, the order of backward "
                  "graphs and all-reduces with and without the split, FSDP2 compiled per block runs eager's "
                  "collectives; the compile failures named on 2 CPU ranks",
    "15_fault_tolerance": "two torchft replica groups as 1-rank torchrun jobs on CPU and gloo whatever the GPUs (NCCL "
                          "replica groups: the ft_train script checks), one SIGKILLed, healed and bitwise equal; "
                          "the same with 2 CPU ranks per group sharding the model (HSDP); "
                          "checkpoint_train.py's torchrun restart beside it over nccl; the lighthouse and the last live "
                          "group lost; DiLoCo beside DDP (bytes counted); exercise 15.1's check on its starter",
    "13_your_model_on_your_gpus": "config errors refused; plans of the shipped models; to_empty's control; the tiny "
                                  "Qwen2 on the GPUs: FSDP2 = one process, bitwise resume, every rank against its own "
                                  "plan counted as CUDA's tracker counts (tl.planning.matches_plan: parameters and optimizer "
                                  "state exact, the peak within one collective buffer; CUDA's attention kernels may "
                                  "save other tensors than the CPU's, which would be the finding)",
    "12_tensor_and_pipeline_parallel": "TP's shards, collectives and activation bytes per block, SP and loss_parallel "
                                       "equal to one process over nccl (2, 4 or 8 GPUs; else CPU ranks), FSDP x TP "
                                       "on a (2, 2) mesh (4 GPUs, else 4 CPU ranks), the pipeline bubble and memory "
                                       "on 2 GPUs, context parallelism and float8 on the GPUs",
}


@dataclass(frozen=True)
class Launch:
    """One torchrun job of a check.

    Attributes:
        script: a shipped script's name, e.g. ``"ddp_train"``.
        args: the script's own arguments.
        nproc_per_node: ranks torchrun starts.
        device: ``"cuda"`` (nccl) or ``"cpu"`` (gloo, GPUs hidden from the workers).
        gpus_per_rank: GPUs each rank drives (2: ``model_parallel.py``'s halves on a pair).
        label: run folder label (``""``: ``gpu-<script>``).
    """

    script: str
    args: tuple[object, ...] = ()
    nproc_per_node: int = 1
    device: str = "cuda"
    gpus_per_rank: int = 1
    label: str = ""

    @property
    def gpus_used(self) -> int:
        """GPUs the job occupies (0 on CPU)."""
        return self.nproc_per_node * self.gpus_per_rank if self.device == "cuda" else 0


@dataclass(frozen=True)
class Check:
    """One line of the summary: a script's launches, or a notebook.

    Attributes:
        label: the summary line's name, e.g. ``"script ddp_train"``.
        kind: ``"script"``, ``"precisions"``, ``"cpu_ranks"``, ``"offload"`` or ``"notebook"`` (which runner runs it).
        name: the script (kind ``"script"``) or notebook file (``"01_ddp.ipynb"``).
        asserts: what the check asserts, in words.
        launches: the torchrun jobs it starts (none for a notebook: the notebook launches its own).
        parameters: the notebook's papermill parameters (``RUNS_DIR`` is added at run time).
    """

    label: str
    kind: str
    name: str
    asserts: str
    launches: tuple[Launch, ...] = ()
    parameters: dict[str, object] = field(default_factory=dict)


def shipped_notebooks() -> list[Path]:
    """The workbook's notebooks, ``notebooks/NN_*.ipynb``, in order."""
    return sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


def model_parallel_layout(gpus: int) -> tuple[int, int]:
    """``(ranks, gpus_per_rank)`` for ``model_parallel.py`` on ``gpus`` GPUs: a pair of GPUs per rank when
    there are two or more (``gpus // 2`` ranks), else one rank with both halves on the one GPU."""
    return (gpus // 2, 2) if gpus >= 2 else (1, 1)


def notebook_check(path: Path, gpus: int) -> Check:
    """A notebook with ``DEVICE="cuda"`` and one rank per GPU; notebook 06's two simulated nodes share the GPUs."""
    parameters: dict[str, object] = {"DEVICE": "cuda", "NPROC": gpus}
    asserts = NOTEBOOK_ASSERTS.get(path.stem, "the notebook's own asserts")
    if path.stem.startswith("05_") and gpus < 2:
        asserts += " (1 GPU: the lesson runs on 2 CPU ranks instead, as it says)"
    if path.stem.startswith("08_") and gpus < 2:
        asserts += " (1 GPU: the profiled DDP runs use 2 CPU ranks, as it says; the rest runs on the GPU)"
    if path.stem.startswith("06_"):
        # NPROC is per node: 2 nodes x NPROC GPU ranks must fit. None on 1 GPU: the notebook falls back to 2 x 2 CPU ranks.
        parameters.update(NNODES=2, NPROC=gpus // 2 if gpus >= 2 else None)
        if gpus < 2:
            asserts += " (1 GPU: the simulated nodes run on CPU ranks, as it says)"
    return Check(f"notebook {path.name}", "notebook", path.name, asserts, parameters=parameters)


def plan_checks(gpu_count: int) -> list[Check]:
    """Everything the GPU check runs on a machine with ``gpu_count`` GPUs; pure (launches nothing, no CUDA).

    Args:
        gpu_count: GPUs the check may use (1, 2, 4, 8, ...).

    Returns:
        One ``Check`` per shipped script, then the precision comparison, the CPU-ranks check, and one per
        notebook. No job asks for more GPUs than ``gpu_count``.

    Raises:
        ConfigError: ``gpu_count`` is not a positive integer.
        KeyError: a shipped script has no entry in ``SCRIPT_CHECKS``.
    """
    check_positive_int("gpu_count", gpu_count)
    checks = []
    for name in tl.runs.available_scripts():
        if name not in SCRIPT_CHECKS:
            raise KeyError(f"{name}.py is shipped but has no GPU check: add an entry for it to SCRIPT_CHECKS in "
                           f"{Path(__file__).name} (its arguments on GPUs and what the check asserts)")
        args, asserts = SCRIPT_CHECKS[name]
        ranks, per_rank = model_parallel_layout(gpu_count) if name == "model_parallel" else (gpu_count, 1)
        if name == "pipeline_parallel":  # seed 000's two halves: two stages, one GPU each (one stage on one GPU)
            ranks = min(gpu_count, 2)
        if name == "ft_train":  # one rank per replica group
            ranks = 1
        checks.append(Check(f"script {name}", "script", name, asserts, (Launch(name, args, ranks, "cuda", per_rank),)))
    checks.append(Check("precisions fp32/bf16/fp16", "precisions", "ddp_train",
                        "each precision autocast supports here ends within 5% of fp32's loss; step time vs fp32",
                        tuple(Launch("ddp_train", PRECISION_ARGS + ("--precision", p), gpu_count, label=f"gpu-amp-{p}")
                              for p in ("fp32", "bf16", "fp16"))))
    if gpu_count >= 2:  # a replica group of 2 ranks: FSDP2 over NCCL inside it, torchft's ProcessGroupNCCL across
        checks.append(Check("ft_train HSDP", "hsdp", "ft_train",
                            "one torchft replica group of 2 GPUs sharding the model (FSDP2 on "
                            "nccl, torchft's all-reduce in FSDP2's hook), with a lighthouse of its own: both ranks "
                            "commit every step, each holding half the parameters; never run on a GPU before this check",
                            (Launch("ft_train", ("--max-steps", 20, "--device", "cuda"), 2, "cuda", 1,
                                    label="gpu-ft-hsdp"),)))
    cpu_ranks = Launch("collectives_check", ("--sizes-bytes", 4096), nproc_per_node=2, device="cpu", gpus_per_rank=0,
                       label="gpu-cpu-ranks")
    checks.append(Check("device=cpu on a GPU machine", "cpu_ranks", "collectives_check",
                        "2 ranks on gloo with device cpu: the GPUs are hidden from the workers", (cpu_ranks,)))
    offload = Launch("train_hf", OFFLOAD_ARGS, gpu_count, label="gpu-offload")
    checks.append(Check("train_hf --cpu-offload", "offload", "train_hf",
                        "the planner's layout for a 7B on 4 x 24 GB: FSDP2's CPUOffloadPolicy on a cuda:nccl,cpu:gloo "
                        "group; clip_grad_norm_ over the CPU gradients every step, the loss falls; --export of the "
                        "offloaded shards equals the step-8 checkpoint", (offload,)))
    checks += [notebook_check(path, gpu_count) for path in shipped_notebooks()]
    return checks


def load_script(name: str) -> ModuleType:
    """The shipped script ``name`` imported as a module (its ``main()`` does not run; imports torch)."""
    return tl.import_script(LESSONS_DIR / f"{name}.py")


def torchrun_argv(launch: Launch, gpu_count: int) -> list[str]:
    """The torchrun argv the launcher builds for ``launch`` (run folder ``RUN_DIR``, port 29500 as placeholders)."""
    plan = DevicePlan(launch.device, "nccl" if launch.device == "cuda" else "gloo", launch.nproc_per_node, gpu_count)
    return build_command(f"RUN_DIR/{launch.script}.py", launch.args, plan, master_port=29500, log_dir="RUN_DIR/logs",
                         python="python")


def format_plan(checks: list[Check], gpu_count: int, out_dir: str | os.PathLike = "OUT") -> str:
    """The plan as text: per check, its ranks, what it asserts, and the command lines it runs.

    Args:
        checks: from ``plan_checks(gpu_count)``.
        gpu_count: the GPUs the plan is for.
        out_dir: the ``--out-dir`` shown in the notebooks' output paths.
    """
    out = Path(out_dir) / f"{gpu_count}-gpus"
    lines = [f"== GPU check plan for {gpu_count} GPU(s): {len(checks)} checks "
             "(run folders RUN_DIR and ports are chosen at launch) =="]
    pick_devices = None
    for check in checks:
        if check.kind == "notebook":
            p = check.parameters
            ranks = (f"{p['NNODES']} nodes x NPROC={p['NPROC']}" if "NNODES" in p else f"NPROC={p['NPROC']}")
            lines.append(f"{check.label}: {ranks}, DEVICE={p['DEVICE']}")
        else:
            lines.append(f"{check.label}: " + "; ".join(sorted({
                f"{x.nproc_per_node} rank(s) x {x.gpus_per_rank} GPU" if x.device == "cuda"
                else f"{x.nproc_per_node} rank(s) on cpu" for x in check.launches})))
        lines.append(f"    asserts: {check.asserts}")
        for launch in check.launches:
            env = "CUDA_VISIBLE_DEVICES= " if launch.device == "cpu" else ""  # build_env hides the GPUs on CPU
            lines.append(f"    $ {env}{shlex.join(torchrun_argv(launch, gpu_count))}")
            if launch.script == "model_parallel":
                pick_devices = pick_devices or load_script("model_parallel").pick_devices
                lines.append("    devices: " + ", ".join(
                    f"rank {r} {'+'.join(pick_devices(r, launch.nproc_per_node, gpu_count))}"
                    for r in range(launch.nproc_per_node)))
        if check.kind == "notebook":
            params = [a for k, v in check.parameters.items() for a in ("-p", k, str(v))]
            lines.append("    $ " + shlex.join(["papermill", f"notebooks/{check.name}", str(out / check.name),
                                                "--cwd", "notebooks", *params, "-p", "RUNS_DIR", str(out / "runs")]))
    launches = [x for c in checks for x in c.launches]
    notebooks = sum(c.kind == "notebook" for c in checks)
    lines.append(f"== {len(launches)} launches and {notebooks} notebooks; at most "
                 f"{max(x.gpus_used for x in launches)} GPU(s) per launch ==")
    return "\n".join(lines)


# ---- running a plan (needs GPUs) ----


def launch_one(launch: Launch, root: Path) -> tl.LaunchResult:
    """Write ``launch.script`` into a fresh run folder under ``root``, run it (``LAUNCH_TIMEOUT_S``) and check its
    per-step records against the metrics schema (``check_metrics_schema``)."""
    result = tl.run_script(launch.script, launch.args, runs_dir=root, label=launch.label or f"gpu-{launch.script}",
                           device=launch.device, nproc_per_node=launch.nproc_per_node, timeout_s=LAUNCH_TIMEOUT_S,
                           live="text")
    check_metrics_schema(result.run_dir, launch)
    return result


def check_metrics_schema(run_dir: Path, launch: Launch) -> None:
    """Every per-step record the launch wrote follows the documented schema (``tutorial_lib/runs/metrics.py``), with the
    CUDA keys (``peak_allocated_bytes``, ...) where the ranks ran on CUDA: what the CPU tests cannot see."""
    if launch.script not in metrics_schema.ALL:
        return
    device = "cuda" if launch.device == "cuda" else "cpu"
    for path in sorted((run_dir / "metrics").glob("rank*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            problems = metrics_schema.check_step_record(json.loads(line), launch.script, device)
            assert not problems, f"{path}:{n} breaks the metrics schema: {problems}"


def verify_ddp_train(result: tl.LaunchResult, launch: Launch, gpus: int) -> str:
    m = result.metrics()
    assert set(m["device"]) == {f"cuda:{r}" for r in range(launch.nproc_per_node)}, set(m["device"])
    assert (m["peak_allocated_bytes"] > 0).all()
    assert m["loss_global"].iloc[-1] < m["loss_global"].iloc[0]
    last = m.groupby("rank").last()
    notes = [f"peak_allocated {last['peak_allocated_bytes'].max() / 2**20:.1f} MiB, "
             f"reserved {last['peak_reserved_bytes'].max() / 2**20:.1f} MiB, "
             f"{m['global_samples_per_s'].median():.0f} samples/s"]
    samples = result.memory_samples()
    gpu_col = samples.get("gpu_used_bytes")
    notes.append("NVML per-process GPU memory: "
                 + (f"{gpu_col.max() / 2**20:.0f} MiB" if gpu_col is not None and gpu_col.notna().any() else "none"))
    gpu_samples = result.memory_samples("gpu")
    notes.append(f"GPU samples {len(gpu_samples)}, max used {gpu_samples['used_bytes'].max() / 2**30:.2f} GiB")
    tl.plots.plot_run(m, samples).savefig(result.run_dir / "run.png")
    return "; ".join(notes)


def verify_dataloader_bench(result: tl.LaunchResult, launch: Launch, gpus: int) -> str:
    rows = tl.runs.read_rank_json(result.run_dir, "loader")[0]["rows"]
    assert any(r["pin_memory"] for r in rows), "pin_memory is measured on CUDA"
    assert all(r["batch_is_pinned"] == r["pin_memory"] for r in rows), "on CUDA pin_memory=True pins every batch"
    return "; ".join(f"workers={r['num_workers']} persistent={r['persistent_workers']} "
                     f"pin={r['pin_memory']}: {r['samples_per_s']:.0f}/s" for r in rows)


def verify_sync_batchnorm(result: tl.LaunchResult, launch: Launch, gpus: int) -> str:
    ranks = tl.runs.read_rank_json(result.run_dir, "syncbn")
    return f"max |running_mean - global| {max(r['max_abs_diff_vs_global'] for r in ranks):.1e}"


def verify_fsdp_train(result: tl.LaunchResult, launch: Launch, gpus: int) -> str:
    m = result.metrics()
    assert (m["peak_allocated_bytes"] > 0).all() and m["loss_scale"].notna().all()
    return (f"fp16 + GradScaler: scale {m['loss_scale'].iloc[-1]:g}, loss {m['loss_global'].iloc[-1]:.3f}, "
            f"peak_allocated {m['peak_allocated_bytes'].max() / 2**20:.0f} MiB")


def verify_model_parallel(result: tl.LaunchResult, launch: Launch, gpus: int) -> str:
    ranks = tl.runs.read_rank_json(result.run_dir, "mp")
    pick_devices = load_script("model_parallel").pick_devices
    assert [r["devices"] for r in ranks] == [pick_devices(r, launch.nproc_per_node, gpus)
                                             for r in range(launch.nproc_per_node)], [r["devices"] for r in ranks]
    used = [d for r in ranks for d in set(r["devices"])]
    assert len(used) == len(set(used)), f"a GPU shared by two ranks: {used}"
    assert all(r["split_across_devices"] == (launch.gpus_per_rank == 2) for r in ranks), ranks
    assert all(r["max_abs_diff_vs_one_device"] < 1e-4 for r in ranks), ranks
    return "; ".join(f"rank {r['rank']}: {r['note']}" for r in ranks)


def verify_checkpoint_train(result: tl.LaunchResult, launch: Launch, gpus: int) -> str:
    listing = tl.runs.list_checkpoints(result.run_dir / "checkpoints")
    assert listing["complete"].all() and list(listing["step"]) == [6, 12], listing
    return f"saved {list(listing['name'])} (dcp) on nccl"


def verify_collectives_check(result: tl.LaunchResult, launch: Launch, gpus: int) -> str:
    ranks = tl.runs.read_collectives(result.run_dir)
    assert all(c["ok"] for r in ranks for c in r["checks"]) and {r["backend"] for r in ranks} == {"nccl"}
    return "busbw " + ", ".join(f"{b['size_bytes'] >> 20} MiB: {b['busbw_GBps']:.1f} GB/s"
                                for b in ranks[0]["bandwidth"])


def verify_context_parallel_float8(result: tl.LaunchResult, launch: Launch, gpus: int) -> str:
    """The GPU-only lessons ran where they can: ring attention equal to one process's within bf16 rounding (4 eps of
    bf16 times the output's magnitude), float8 on compute capability >= 8.9 and within float8's rounding."""
    notes = []
    for r in tl.runs.read_rank_json(result.run_dir, "cp_float8"):
        cp, f8 = r["context_parallel"], r["float8"]
        assert cp["ran"], f"rank {r['rank']}: context parallelism did not run on {r['device']}: {cp.get('reason')}"
        assert cp["output_max_abs_diff"] <= 4 * 2**-7 * cp["output_max_abs"], cp
        assert cp["local_shape"][2] * r["world_size"] == cp["global_shape"][2], cp
        assert f8["ran"] or "compute capability" in f8["reason"], f8
        if f8["ran"]:
            assert f8["bf16_rel_error"] < f8["float8_rel_error"] < 2**-3, f8
    notes.append(f"ring attention max |diff| {cp['output_max_abs_diff']:.2e}")
    notes.append(f"float8 {f8['float8_ms']:.3f} ms vs bf16 {f8['bf16_ms']:.3f} ms, "
                 f"rel. error {f8['float8_rel_error']:.3f}"
                 if f8["ran"] else f"float8 skipped: {f8['reason']}")
    return "; ".join(notes)


def verify_train_lm(result: tl.LaunchResult, launch: Launch, gpus: int) -> str:
    m = result.metrics()
    evals = m[m["rank"] == 0].set_index("step")["eval_loss"].dropna()
    assert list(evals.index) == [5, 10, 15, 20], f"held-out losses at steps {list(evals.index)}, want 5, 10, 15, 20"
    assert (m["peak_allocated_bytes"] > 0).all() and evals.iloc[-1] < evals.iloc[0], evals
    mfu = m["mfu"] if "mfu" in m else None  # absent on a GPU whose peak train_lm.py does not know
    assert mfu is None or ((mfu > 0) & (mfu <= 1)).all(), mfu
    assert list(tl.runs.list_checkpoints(result.run_dir / "checkpoints")["step"]) == [10, 20]
    plan = tl.planning.plan_memory([str(a) for a in launch.args], world_size=launch.nproc_per_node, device="cuda")
    measured = tl.planning.read_memory_snapshots(result.run_dir)[0]  # the rank's CUDA device (the corpus stays on the CPU)
    table = tl.planning.compare_plan(plan, measured, rank=0)
    assert table.loc["total", "relative_error"] <= 0.02, table
    allocated = m[m["step"] == 2]["peak_allocated_bytes"].max()
    return (f"plan {plan.total_bytes / 2**20:.1f} MiB, tracked {table.loc['total', 'measured_bytes'] / 2**20:.1f} MiB, "
            f"max_memory_allocated after step 2 {allocated / 2**20:.1f} MiB; MFU "
            + (f"{mfu.median():.3f}" if mfu is not None else "not known for this GPU")
            + f"; {m['tokens_per_s'].median():.0f} tokens/s per rank")


def verify_train_hf(result: tl.LaunchResult, launch: Launch, gpus: int) -> str:
    m = result.metrics()
    loss = m[m["rank"] == 0].set_index("step")["loss_global"]
    assert loss.iloc[-1] < loss.iloc[0] and (m["peak_allocated_bytes"] > 0).all(), loss
    assert list(tl.runs.list_checkpoints(result.run_dir / "checkpoints")["step"]) == [4, 8]
    args = dict(zip(launch.args[::2], launch.args[1::2]))
    plan = tl.planning.plan_hf(args["--model"], world_size=launch.nproc_per_node, seq_len=int(args["--seq-len"]),
                      batch_size=int(args["--batch-size"]), layout="bf16 + AC selective", device="cuda")
    measured = tl.planning.read_memory_snapshots(result.run_dir)
    tables = [tl.planning.compare_plan(plan, snapshot, rank=rank) for rank, snapshot in enumerate(measured)]
    exact = [rank for rank, snapshot in enumerate(measured) if tl.planning.matches_plan(plan, snapshot, rank=rank)]
    print(f"ranks matching their plan exactly (parameters, optimizer state) and within one buffer: {exact}")
    worst = max(t.loc["total", "relative_error"] for t in tables)
    print(tables[0].to_string())
    assert worst <= 0.05, tables[0]
    return (f"loss {loss.iloc[0]:.3f} -> {loss.iloc[-1]:.3f}; plan {plan.total_bytes / 2**20:.1f} MiB, worst rank's "
            f"tracked total {worst:+.1%} off (CUDA attention kernels save other tensors than the CPU's); "
            + verify_export(result.run_dir, step=8))


def verify_export(run_dir: Path, step: int) -> str:
    """The folder train_hf.py's ``--export exported`` wrote when the run ended: ``from_pretrained`` loads it, every
    tensor equals the step's DCP checkpoint bit for bit (the tiny model's config.json says fp32: nothing is cast), and
    the output names the path this torch takes (DCP's consolidating writer, or gathered file by file)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "exported")
    saved = {"app": {"model": {k: torch.empty_like(v) for k, v in model.state_dict().items()}}}
    dcp.load(saved, checkpoint_id=tl.runs.checkpoint_dir(run_dir, step=step), no_dist=True)
    differ = [k for k, v in model.state_dict().items() if not torch.equal(saved["app"]["model"][k], v)]
    assert not differ, f"the export differs from the step-{step} checkpoint in {differ[:3]}"
    path = ("every rank wrote its own rows with dcp.save" if load_script("train_hf").dcp_writes_hf_folders()
            else "gathered file by file")
    assert path in tl.runs.read_output_log(run_dir), f"the export did not say {path!r}"
    return f"export equals the step-{step} checkpoint ({path})"


VERIFY = {  # scripts not named here: a finished launch is the check (the notebooks assert the details)
    "ddp_train": verify_ddp_train, "dataloader_bench": verify_dataloader_bench,
    "sync_batchnorm": verify_sync_batchnorm, "fsdp_train": verify_fsdp_train,
    "model_parallel": verify_model_parallel, "checkpoint_train": verify_checkpoint_train,
    "collectives_check": verify_collectives_check, "context_parallel_float8": verify_context_parallel_float8,
    "train_lm": verify_train_lm, "train_hf": verify_train_hf,
}


def with_tiny_model(launch: Launch, root: Path) -> Launch:
    """``launch`` with ``TINY_MODEL`` replaced by a tiny Llama folder written first (train_hf.py trains a folder)."""
    if "TINY_MODEL" not in launch.args:
        return launch
    made = tl.run_in_process("train_hf", ["--create-tiny-model", "tiny", "--arch", "llama"], runs_dir=root,
                             label=f"{launch.label or 'gpu'}-tiny-model")
    return replace(launch, args=tuple(str(made.run_dir / "tiny") if a == "TINY_MODEL" else a for a in launch.args))


def run_script_check(check: Check, root: Path, out_dir: Path, gpus: int) -> str:
    """Launch the check's one script and verify what only a GPU run produces."""
    (launch,) = check.launches
    launch = with_tiny_model(launch, root)
    result = launch_one(launch, root)
    verify = VERIFY.get(check.name)
    return "; ".join([f"{result.wall_time_s:.1f} s"] + ([verify(result, launch, gpus)] if verify else []))


def run_precisions(check: Check, root: Path, out_dir: Path, gpus: int) -> str:
    """``ddp_train.py`` in each precision CUDA autocast supports here: tensor-core speedup and final loss vs fp32."""
    metrics, skipped = {}, []
    for launch in check.launches:
        precision = str(launch.args[list(launch.args).index("--precision") + 1])
        if tl.probes.autocast_supported(precision, "cuda"):
            metrics[precision] = launch_one(launch, root).metrics()
        else:
            skipped.append(precision)
    table = tl.runs.summarize_runs(metrics, baseline="fp32")
    for precision in metrics:
        assert table.loc[precision, "loss_diff_vs_baseline"] < 0.05 * table.loc["fp32", "final_loss"], table
    return "; ".join([f"{p}: step {table.loc[p, 'median_step_time_s'] * 1e3:.2f} ms "
                      f"(x{table.loc['fp32', 'median_step_time_s'] / table.loc[p, 'median_step_time_s']:.2f} vs fp32), "
                      f"peak {table.loc[p, 'peak_memory_mib']:.0f} MiB, final loss {table.loc[p, 'final_loss']:.4f}"
                      for p in metrics] + [f"{p} skipped: autocast does not support it here" for p in skipped])


def run_cpu_ranks(check: Check, root: Path, out_dir: Path, gpus: int) -> str:
    """CPU ranks on a GPU machine: gloo, device cpu, the GPUs hidden."""
    (launch,) = check.launches
    ranks = tl.runs.read_collectives(launch_one(launch, root).run_dir)
    assert {r["backend"] for r in ranks} == {"gloo"} and {r["device"] for r in ranks} == {"cpu"}, ranks
    return f"{launch.nproc_per_node} ranks on gloo/cpu with the GPUs hidden"


def run_offload(check: Check, root: Path, out_dir: Path, gpus: int) -> str:
    """train_hf.py with FSDP2's CPU offload on the GPUs: it trains, and clip_grad_norm_ ran on the CPU gradients."""
    (launch,) = check.launches
    result = launch_one(with_tiny_model(launch, root), root)
    m = result.metrics()
    loss = m[m["rank"] == 0].set_index("step")["loss_global"]
    assert loss.iloc[-1] < loss.iloc[0] and m["grad_norm"].notna().all() and (m["grad_norm"] > 0).all(), m
    return (f"{result.wall_time_s:.1f} s; loss {loss.iloc[0]:.3f} -> {loss.iloc[-1]:.3f} with the optimizer on the CPU; "
            + verify_export(result.run_dir, step=8))


def run_ft_hsdp(check: Check, root: Path, out_dir: Path, gpus: int) -> str:
    """ft_train.py as one replica group of 2 GPUs (HSDP): both ranks commit every step, each holding half."""
    (launch,) = check.launches
    result = launch_one(launch, root)
    ranks = {r: tl.runs.read_replica_records(result.run_dir / "metrics", group_rank=r) for r in (0, 1)}
    held = {r: {s.params_local for s in records.steps[0]} for r, records in ranks.items()}
    steps = {r: [s.step for s in records.committed(0)] for r, records in ranks.items()}
    assert steps[0] == steps[1] == list(range(1, 21)) and held[0] == held[1] and len(held[0]) == 1, (steps, held)
    return f"{result.wall_time_s:.1f} s; 20 steps committed by both ranks, each holding {min(held[0]):,} parameters"


def notebook_runner_missing() -> str:
    """Why the notebooks cannot run here (``""``: they can): papermill and ipykernel, dependencies of this package,
    run each notebook in a Jupyter kernel, the only place ``display``, widgets and cell outputs exist."""
    import importlib.util
    missing = [name for name in ("papermill", "ipykernel") if importlib.util.find_spec(name) is None]
    if not missing:
        return ""
    return (f"the notebook checks run through papermill in a Jupyter kernel, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed for {sys.executable}: pip install -e . (they are "
            "dependencies of the package), or --dry-run for the plan alone")


def run_notebook(check: Check, root: Path, out_dir: Path, gpus: int) -> str:
    """Execute the notebook with its parameters through papermill, in a Jupyter kernel."""
    import papermill as pm

    path = NOTEBOOKS_DIR / check.name
    parameters = {**check.parameters, "RUNS_DIR": str(root)}
    pm.execute_notebook(path, out_dir / path.name, parameters=parameters, cwd=str(path.parent),
                        progress_bar=False, kernel_name="python3")
    return "papermill"


RUNNERS = {"script": run_script_check, "precisions": run_precisions, "cpu_ranks": run_cpu_ranks,
           "offload": run_offload, "hsdp": run_ft_hsdp, "notebook": run_notebook}


def first_gpus(count: int, visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` that keeps the first ``count`` GPUs of ``visible`` (its current value; unset or
    empty: all GPUs, numbered from 0)."""
    ids = visible.split(",") if visible else [str(i) for i in range(count)]
    return ",".join(ids[:count])


def run_plan(checks: list[Check], gpus: int, visible_gpus: int, out_dir: Path) -> list[tuple[str, str, float]]:
    """Run every check; return ``(label, "ok: ..." or "FAILED: ...", seconds)`` per check.

    Args:
        checks: from ``plan_checks(gpus)``.
        gpus: the GPUs the plan is for; below ``visible_gpus`` the workers and kernels see only the first ``gpus``.
        visible_gpus: GPUs this machine shows.
        out_dir: notebooks' outputs go here, run folders under ``out_dir/runs``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    root = out_dir / "runs"
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpus < visible_gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = first_gpus(gpus, saved)  # inherited by torchrun and the kernels
    rows = []
    try:
        for check in checks:
            print(f"\n== [{gpus} GPU] {check.label}: {check.asserts}", flush=True)
            start = time.monotonic()
            try:
                status = "ok: " + RUNNERS[check.kind](check, root, out_dir, gpus)
            except Exception as e:  # noqa: BLE001 - one failed check must not stop the others
                traceback.print_exc()
                status = f"FAILED: {type(e).__name__}: {str(e)[:1500]}"
            rows.append((f"[{gpus} GPU] {check.label}", status, time.monotonic() - start))
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=None,
                        help="GPU counts to plan for, e.g. 1 2 4 (default: every visible GPU; with --dry-run: "
                             + " ".join(map(str, DRY_RUN_GPUS)) + ")")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (torchrun command lines, notebook parameters, what each check asserts) "
                             "and exit 0; touches no GPU")
    parser.add_argument("--out-dir", type=Path, default=Path(os.environ.get("OUT", "gpu-check")),
                        help="notebook outputs and run folders go here, one subfolder per GPU count "
                             "(default: $OUT or ./gpu-check)")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.gpus or ()):
        parser.error(f"--gpus takes counts >= 1, got {args.gpus}")
    if args.dry_run:
        for gpus in args.gpus or DRY_RUN_GPUS:
            print(format_plan(plan_checks(gpus), gpus, args.out_dir), end="\n\n")
        return 0
    why_not = notebook_runner_missing()
    if why_not:  # before anything runs: the scripts' checks take minutes of a GPU lent for a quarter of an hour
        parser.error(why_not)
    print(tl.environment_report().to_text(), flush=True)
    visible = tl.resolve_device("auto").gpu_count
    counts = args.gpus or [visible]
    if max(counts) > visible or visible == 0:
        parser.error(f"--gpus {' '.join(map(str, counts))} needs that many GPUs and this machine shows {visible}; "
                     "--dry-run prints the plan of any machine")
    out_dir = args.out_dir.resolve()
    rows = []
    for gpus in counts:
        checks = plan_checks(gpus)
        print(format_plan(checks, gpus, out_dir), flush=True)
        rows += run_plan(checks, gpus, visible, out_dir / f"{gpus}-gpus")
    print("\n== GPU check summary ==")
    for label, status, seconds in rows:
        print(f"{label:<44} {seconds:6.1f} s  {status}")
    failed = sum(not status.startswith("ok") for _, status, _ in rows)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
