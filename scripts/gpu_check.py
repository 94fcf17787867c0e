"""The GPU check: every training script and every notebook on CUDA with nccl, in one short run.

    PYTHONPATH=. python scripts/gpu_check.py [--out-dir DIR]

Meant for a machine with NVIDIA GPUs (the CPU path is covered by ``make test``). It

1. prints the environment report and the device plan (must be ``cuda`` / ``nccl``);
2. launches each shipped training script through ``tutorial_lib.launch`` on all GPUs and checks
   what only a GPU run produces: ``cuda:LOCAL_RANK`` devices, ``peak_allocated_bytes`` > 0, NVML
   samples of each worker's GPU memory;
3. launches one script with ``device="cpu"`` to check the GPUs are hidden and gloo is used;
4. executes every notebook with ``DEVICE="cuda"``: through papermill when it is installed, else
   as a plain Python script made from the notebook's code cells (the asserts still run);
5. prints a summary table and exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tutorial_lib as tl  # noqa: E402

SCRIPT_ARGS = {
    "ddp_train": ["--max-steps", 30, "--batch-size", 256, "--hidden-dim", 1024, "--log-every", 10],
    "collectives_check": ["--sizes-bytes", 1 << 20, 16 << 20, 256 << 20, "--iters", 10],
    "dataloader_bench": ["--num-workers", 0, 4],
    "uneven_inputs": ["--join"],
    "unused_params": ["--loss-uses", "both"],
    "fsdp_train": ["--strategy", "fsdp2", "--precision", "fp16", "--max-steps", 5],  # fp16 + GradScaler: CUDA only
    "checkpoint_train": ["--strategy", "fsdp2", "--format", "dcp", "--save-every", 6],
}


def check_script(name: str, plan: tl.DevicePlan, root: Path) -> str:
    run_dir = tl.new_run_dir(f"gpu-{name}", root)
    script = tl.write_script(name, run_dir)
    result = tl.launch(tl.LaunchSpec(script, args=SCRIPT_ARGS.get(name, []), nproc_per_node=plan.nproc_per_node,
                                     device="cuda", timeout_s=240, live="text"))
    notes = [f"{result.wall_time_s:.1f} s"]
    if name == "ddp_train":
        m = result.metrics()
        assert set(m["device"]) == {f"cuda:{r}" for r in range(plan.nproc_per_node)}, set(m["device"])
        assert (m["peak_allocated_bytes"] > 0).all()
        assert m["loss_global"].iloc[-1] < m["loss_global"].iloc[0]
        last = m.groupby("rank").last()
        notes.append(f"peak_allocated {last['peak_allocated_bytes'].max() / 2**20:.1f} MiB, "
                     f"reserved {last['peak_reserved_bytes'].max() / 2**20:.1f} MiB, "
                     f"{m['global_samples_per_s'].median():.0f} samples/s")
        samples = result.memory_samples()
        gpu_col = samples.get("gpu_used_bytes")
        notes.append("NVML per-process GPU memory: "
                     + (f"{gpu_col.max() / 2**20:.0f} MiB" if gpu_col is not None and gpu_col.notna().any() else "none"))
        gpus = result.memory_samples("gpu")
        notes.append(f"GPU samples {len(gpus)}, max used {gpus['used_bytes'].max() / 2**30:.2f} GiB")
        tl.plot_run(m, samples).savefig(run_dir / "run.png")
    elif name == "dataloader_bench":
        rows = tl.read_rank_json(run_dir, "loader")[0]["rows"]
        assert any(r["pin_memory"] for r in rows), "pin_memory is measured on CUDA"
        notes.append("; ".join(f"workers={r['num_workers']} persistent={r['persistent_workers']} "
                               f"pin={r['pin_memory']}: {r['samples_per_s']:.0f}/s" for r in rows))
    elif name == "sync_batchnorm":
        ranks = tl.read_rank_json(run_dir, "syncbn")
        notes.append(f"max |running_mean - global| {max(r['max_abs_diff_vs_global'] for r in ranks):.1e}")
    elif name == "fsdp_train":
        m = result.metrics()
        assert (m["peak_allocated_bytes"] > 0).all() and m["grad_scale"].notna().all()
        notes.append(f"fp16 + GradScaler: scale {m['grad_scale'].iloc[-1]:g}, loss {m['loss_global'].iloc[-1]:.3f}, "
                     f"peak_allocated {m['peak_allocated_bytes'].max() / 2**20:.0f} MiB")
    elif name == "model_parallel":
        notes.append(tl.read_rank_json(run_dir, "mp")[0]["note"])
    elif name == "checkpoint_train":
        listing = tl.list_checkpoints(run_dir / "checkpoints")
        assert listing["complete"].all() and list(listing["step"]) == [6, 12], listing
        notes.append(f"saved {list(listing['name'])} (dcp) on nccl")
    elif name in ("grad_accum", "uneven_inputs", "unused_params", "sampler_demo", "collective_mismatch"):
        pass  # success is the check; the notebook asserts the details
    else:
        ranks = tl.read_collectives(run_dir)
        assert all(c["ok"] for r in ranks for c in r["checks"]) and {r["backend"] for r in ranks} == {"nccl"}
        bw = ranks[0]["bandwidth"]
        notes.append("busbw " + ", ".join(f"{b['size_bytes'] >> 20} MiB: {b['busbw_GBps']:.1f} GB/s" for b in bw))
    return "; ".join(notes)


def check_precisions(plan: tl.DevicePlan, root: Path) -> str:
    """ddp_train.py in fp32, bf16 and fp16 (+ GradScaler) on CUDA: tensor-core speedup and final loss vs fp32."""
    args = ["--max-steps", 40, "--batch-size", 512, "--hidden-dim", 4096, "--log-every", 20, "--clip-grad-norm", 1.0]
    metrics = {}
    for precision in ("fp32", "bf16", "fp16"):
        if tl.autocast_supported(precision, "cuda"):
            metrics[precision] = tl.run_script("ddp_train", args + ["--precision", precision], runs_dir=root,
                                               label=f"gpu-amp-{precision}", device="cuda",
                                               nproc_per_node=plan.nproc_per_node, timeout_s=240, live="text").metrics()
    table = tl.summarize_runs(metrics, baseline="fp32")
    for precision in metrics:
        assert table.loc[precision, "loss_diff_vs_baseline"] < 0.05 * table.loc["fp32", "final_loss"], table
    return "; ".join(f"{p}: step {table.loc[p, 'median_step_time_s'] * 1e3:.2f} ms "
                     f"(x{table.loc['fp32', 'median_step_time_s'] / table.loc[p, 'median_step_time_s']:.2f} vs fp32), "
                     f"peak {table.loc[p, 'peak_memory_mib']:.0f} MiB, final loss {table.loc[p, 'final_loss']:.4f}"
                     for p in metrics)


def check_cpu_on_gpu_machine(root: Path) -> str:
    run_dir = tl.new_run_dir("gpu-cpu-ranks", root)
    script = tl.write_script("collectives_check", run_dir)
    tl.launch(tl.LaunchSpec(script, nproc_per_node=2, device="cpu", timeout_s=120, live="text",
                            args=["--sizes-bytes", 4096]))
    ranks = tl.read_collectives(run_dir)
    assert {r["backend"] for r in ranks} == {"gloo"} and {r["device"] for r in ranks} == {"cpu"}
    return "2 ranks on gloo/cpu with the GPUs hidden"


def notebook_as_script(path: Path, parameters: dict) -> str:
    """The notebook's code cells as one script, parameters injected after the ``parameters`` cell."""
    nb = json.loads(path.read_text())
    parts = ["import matplotlib\nmatplotlib.use('Agg')"]
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        parts.append("".join(cell["source"]))
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            parts.append("\n".join(f"{k} = {v!r}" for k, v in parameters.items()))
    return "\n\n".join(parts) + "\n"


def check_notebooks(root: Path, out_dir: Path) -> list[tuple[str, str, float]]:
    parameters = {"DEVICE": "cuda", "RUNS_DIR": str(root)}
    rows = []
    try:
        import ipykernel  # noqa: F401
        import papermill as pm
    except ImportError:
        pm = None
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        start = time.monotonic()
        try:
            if pm is not None:
                pm.execute_notebook(path, out_dir / path.name, parameters=parameters, cwd=str(path.parent),
                                    progress_bar=False, kernel_name="python3")
                how = "papermill"
            else:
                script = out_dir / f"{path.stem}.py"
                script.write_text(notebook_as_script(path, parameters))
                proc = subprocess.run([sys.executable, str(script)], cwd=path.parent, capture_output=True, text=True,
                                      timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
                (out_dir / f"{path.stem}.log").write_text(proc.stdout + proc.stderr)
                if proc.returncode != 0:
                    raise RuntimeError(f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}")
                how = "as a script (no papermill here)"
            rows.append((path.name, f"ok ({how})", time.monotonic() - start))
        except Exception as e:  # noqa: BLE001
            rows.append((path.name, f"FAILED: {type(e).__name__}: {e}", time.monotonic() - start))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path(os.environ.get("OUT", "gpu-check")))
    out_dir = parser.parse_args().out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    root = out_dir / "runs"
    print(tl.environment_report().to_text(), flush=True)
    plan = tl.resolve_device("auto")
    print(plan, flush=True)
    rows = []
    checks = [(f"script {name}", lambda n=name: check_script(n, plan, root)) for name in tl.available_scripts()]
    checks.append(("precisions fp32/bf16/fp16", lambda: check_precisions(plan, root)))
    checks.append(("device=cpu on a GPU machine", lambda: check_cpu_on_gpu_machine(root)))
    for label, fn in checks:
        start = time.monotonic()
        try:
            rows.append((label, "ok: " + fn(), time.monotonic() - start))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            rows.append((label, f"FAILED: {type(e).__name__}: {str(e)[:1500]}", time.monotonic() - start))
    rows += check_notebooks(root, out_dir)
    print("\n== GPU check summary ==")
    for label, status, seconds in rows:
        print(f"{label:<32} {seconds:6.1f} s  {status}")
    failed = sum(not status.startswith("ok") for _, status, _ in rows)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
