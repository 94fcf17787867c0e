"""Benchmarks of the workbook's promises, as ratios measured side by side; a table at the end.

    python scripts/bench.py                      # everything (about 10 minutes on 2 CPU cores)
    python scripts/bench.py --only launcher metrics memory
    python scripts/bench.py --reps 5 --out bench.json

Sections (targets in brackets; a ratio over its target is printed as MISSED, and the exit code is 1):
    lessons    each lesson script's workbook share of its code lines [<= 0.25] and, for ddp_train.py and train_lm.py,
               its lines [<= 200, <= 450] (issue 48; scripts/lesson_stats.py counts, reading the files only)
    launcher   tutorial_lib's cold launch of ddp_train.py vs bare ``python -m torch.distributed.run`` with the same
               argv and environment, alternating, median wall time ratio [<= 1.05]
    warm       the same 20-step 2-rank DDP job four ways, alternating: launch() warm (ranks forked from the kernel's
               warm-start helper), launch() cold, bare torchrun, accelerate's ``notebook_launcher`` (forks this
               process; ``pip install -e .[bench]``): warm / bare [<= 0.45], warm / notebook_launcher [<= 1.1];
               and, with ``workbook`` also asked for, the whole workbook on each path: warm / cold [<= 0.6]
    metrics    ddp_train.py (hidden width 1024) with per-step metrics vs ``--no-metrics``, both launched [<= 1.02]
    observe    a launch with ``observe=True`` (the rank runner's observer records every collective, wrap, optimizer step
               and loss from torch) vs the same launch without, alternating, median wall time: ddp_train.py 20 steps
               and fsdp_train.py (FSDP2) 5 steps, 2 ranks, warm starts [<= 1.3 each: about 10 ns per parameter element
               and step on a rank, hashing and measuring each gradient and value, plus one record per collective]
    memory     fsdp_train.py at 2 ranks: FSDP2 per-rank parameter + gradient + AdamW bytes vs DDP [<= 0.52],
               and the analytic model's largest relative error vs measurement [<= 10%]
    plan       tl.planning.plan_memory of a 6.7 B GPT on 8 ranks (FSDP2, bf16, activation checkpointing), seconds [<= 30];
               tl.planning.plan_hf of Llama-3.1-70B's config on 64 ranks (train_hf.py, bf16 + full AC), seconds [<= 60]
    workbook   every notebook with papermill (on the warm path): seconds each [<= 60] and the whole workbook's wall time vs the sum
               of the runs inside it (from each run's run.json: torchrun launches, including failed and
               timed-out ones, and ``tl.run_in_process`` runs) [<= 1.3 on the cold path; printed for the warm one,
               where the kernel's own work is a larger share of a shorter whole]
    gpu        when CUDA exists: nccl all_reduce bus bandwidth for a size sweep, bf16 vs fp32 step time,
               FSDP2 vs DDP peak allocated memory per GPU
    nanogpt    (only when asked: ``--only nanogpt``, or ``compile``, its old name; about 40 minutes on 2 cores at the
               defaults) train_lm.py against nanoGPT's ``train.py`` at nanoGPT's small configuration
               (``config/train_shakespeare_char.py``: 6 x 384, block 256, batch 64, dropout 0.2), fp32, one CPU process
               each with ``OMP_NUM_THREADS`` equal (``--threads``, 1), on the same bytes, eager and compiled
               (``--compile`` / ``--compile=True``, inductor): ``--nanogpt-rounds`` alternated rounds (the two
               programs side by side in each, the order flipped every round), each run ``--nanogpt-warmup`` steps
               and then ``--nanogpt-steps`` measured ones, a step timed as the interval between the lines the
               programs print after each step (both log every step). A run's tokens/s: the median of its measured
               steps; each round's train_lm / nanoGPT, the load average at each run's start and the commands are
               printed; the figure: the median of the rounds' ratios [train_lm / nanoGPT >= 1.0, eager and
               compiled]. nanoGPT is read from ``--nanogpt-dir`` (a checkout of karpathy/nanoGPT; the figures in
               docs/benchmarks.md used 3adf61e)
    soak       (only when asked: ``--only soak``, about 40 minutes at the defaults) ``--soak-launches`` back-to-back
               launches of a short lesson script and as many of a plain script that ends the way the seeds'
               do (``destroy_process_group()`` and return): spurious failures [<= 0], and every exit abort
               (``terminate called without an active exception``) seen in the ranks' output, named; then the
               failures notebooks 02, 05, 06 and 07 make, ``--soak-repeats`` times each on both launch paths
               (warm and cold): the number of different diagnoses per failure [<= 1]
Machine load distorts every ratio: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import tutorial_lib as tl  # noqa: E402
from tutorial_lib.launcher.environment import build_env  # noqa: E402
from tutorial_lib.probes.ports import free_port  # noqa: E402
from tutorial_lib.launcher.plan import build_command  # noqa: E402

SECTIONS = ("lessons", "launcher", "warm", "metrics", "observe", "memory", "plan", "workbook", "gpu", "soak", "matrix",
            "nanogpt", "compile")
# soak (launches + matrix), matrix, nanogpt (compile: its old name): when asked for
DEFAULT_SECTIONS = ("lessons", "launcher", "warm", "metrics", "observe", "memory", "plan", "workbook", "gpu")


def row(name: str, value: float, target: float | None, unit: str = "x", note: str = "", at_least: bool = False) -> dict:
    """A table row; the target is a ceiling (value <= target), or with ``at_least`` a floor (value >= target)."""
    ok = None if target is None else (value >= target if at_least else value <= target)
    return {"benchmark": name, "value": round(value, 4), "unit": unit, "target": target, "ok": ok, "note": note,
            "at_least": at_least}


def bench_lessons() -> list[dict]:
    """scripts/lesson_stats.py's figures as rows: the workbook's share of each lesson's code, and the two lessons'
    line counts issue 48 sets targets for."""
    from lesson_stats import MAX_LINES, MIN_LESSON_SHARE, table
    rows = []
    for r in table():
        if r["meets"] is None:  # _workbook.py, the lessons' instruments: no target
            rows.append(row(f"instruments {r['name']}.py lines", r["lines"], None, "lines", f"{r['flags']} flags"))
            continue
        if r["name"] in MAX_LINES:
            rows.append(row(f"lesson {r['name']}.py lines", r["lines"], MAX_LINES[r["name"]], "lines",
                            f"{r['flags']} flags"))
        rows.append(row(f"lesson {r['name']}.py workbook share", 1 - r["lesson_share"], 1 - MIN_LESSON_SHARE, "share",
                        f"{r['scaffold_lines']} of {r['code_lines']} code lines"))
    return rows


def bench_launcher(root: Path, reps: int) -> list[dict]:
    """Median wall time: launch() vs the same torchrun argv run bare (subprocess, output discarded)."""
    args = ["--max-steps", 30, "--log-every", 30]
    plan = tl.resolve_device("cpu", 2)
    library, bare = [], []
    for i in range(reps):
        result = tl.run_script("ddp_train", args, runs_dir=root, label=f"bench-lib{i}", device="cpu",
                               nproc_per_node=2, live="off", warm=False)
        library.append(result.wall_time_s)
        run_dir = tl.new_run_dir(f"bench-bare{i}", root)
        script = tl.write_script("ddp_train", run_dir)
        command = build_command(script, args, plan, master_port=free_port(), log_dir=run_dir / "logs")
        start = time.monotonic()
        subprocess.run(command, cwd=run_dir, env=build_env(plan), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
        bare.append(time.monotonic() - start)
    ratio = statistics.median(library) / statistics.median(bare)
    return [row("launcher overhead: launch() / bare torchrun", ratio, 1.05,
                note=f"median {statistics.median(library):.2f} s vs {statistics.median(bare):.2f} s, {reps} each")]


WARM_JOB = ["--max-steps", 20, "--log-every", 20]  # the 20-step 2-rank DDP job of the warm section


def _accelerate_job(run_dir: str) -> None:
    """One rank of ``WARM_JOB`` under accelerate's ``notebook_launcher``: ddp_train.py's ``main`` in the fork."""
    import importlib.util

    os.chdir(run_dir)
    spec = importlib.util.spec_from_file_location("ddp_train_forked", Path(run_dir) / "ddp_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.argv = ["ddp_train.py", *map(str, WARM_JOB)]
    module.main()


def bench_warm(root: Path, reps: int) -> list[dict]:
    """Median wall time of one job four ways, alternating (the helper is started before the first warm timing)."""
    try:
        from accelerate import notebook_launcher
    except ImportError:
        notebook_launcher = None
    plan = tl.resolve_device("cpu", 2)
    times: dict[str, list[float]] = {"warm": [], "cold": [], "bare": [], "accelerate": []}
    tl.run_script("ddp_train", ["--max-steps", 1], runs_dir=root, label="bench-warmup", device="cpu", live="off")
    for i in range(reps):
        for path in ("warm", "cold"):
            start = time.monotonic()
            tl.run_script("ddp_train", WARM_JOB, runs_dir=root, label=f"bench-{path}{i}", device="cpu",
                          nproc_per_node=2, live="off", warm=path == "warm")
            times[path].append(time.monotonic() - start)
        run_dir = tl.new_run_dir(f"bench-bare{i}", root)
        command = build_command(tl.write_script("ddp_train", run_dir), WARM_JOB, plan, master_port=free_port(),
                                log_dir=run_dir / "logs")
        start = time.monotonic()
        subprocess.run(command, cwd=run_dir, env=build_env(plan), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
        times["bare"].append(time.monotonic() - start)
        if notebook_launcher is not None:
            run_dir = tl.new_run_dir(f"bench-accelerate{i}", root)
            tl.write_script("ddp_train", run_dir)
            start = time.monotonic()
            with _environ(build_env(plan)):
                notebook_launcher(_accelerate_job, (str(run_dir),), num_processes=2, use_port=str(free_port()))
            times["accelerate"].append(time.monotonic() - start)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    note = ", ".join(f"{k} {v:.2f} s" for k, v in med.items()) + f" (median of {reps})"
    print(f"[bench] warm: {note}", flush=True)
    rows = [row("warm start: warm launch / bare torchrun", med["warm"] / med["bare"], 0.45, note=note),
            row("warm start: warm launch / cold launch", med["warm"] / med["cold"], None)]
    if "accelerate" in med:
        rows.append(row("warm start: warm launch / accelerate notebook_launcher", med["warm"] / med["accelerate"], 1.1))
    else:
        rows.append(row("warm start: accelerate not installed (pip install -e .[bench])", 0.0, None, unit="-"))
    return rows


class _environ:
    """``os.environ`` replaced by ``env`` inside the block (notebook_launcher's ranks inherit this process's)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.saved = env, None

    def __enter__(self):
        self.saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)

    def __exit__(self, *exc):
        os.environ.clear()
        os.environ.update(self.saved)


def bench_metrics(root: Path, reps: int) -> list[dict]:
    """Per-step metrics cost a fixed time per step (a JSON line, /proc reads); the ratio is taken on a step of
    realistic size (hidden width 1024, ~10-30 ms on a CPU core), the absolute cost per step is printed too."""
    steps = 100
    args = ["--max-steps", steps, "--log-every", steps, "--hidden-dim", 1024, "--batch-size", 64]
    times = {"on": [], "off": []}
    for i in range(reps):
        for mode, extra in (("on", []), ("off", ["--no-metrics"])):
            result = tl.run_script("ddp_train", args + extra, runs_dir=root, label=f"bench-metrics-{mode}{i}",
                                   device="cpu", nproc_per_node=2, live="off")
            times[mode].append(result.wall_time_s)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    return [row("metrics overhead: per-step metrics on / off", on / off, 1.02,
                note=f"median {on:.2f} s vs {off:.2f} s for {steps} steps: {(on - off) / steps * 1e3:+.2f} ms per step")]


OBSERVE_JOBS = {"ddp_train.py, 20 steps": ("ddp_train", ["--max-steps", 20, "--log-every", 20]),
                "fsdp_train.py (FSDP2), 5 steps": ("fsdp_train", ["--max-steps", 5])}


def bench_observe(root: Path, reps: int) -> list[dict]:
    """What observing costs a launch: median wall time with ``observe=True`` over without, alternating, on the
    notebooks' path (warm starts); every observed run's records are read back and must be complete."""
    rows = []
    for label, (script, args) in OBSERVE_JOBS.items():
        tl.run_script(script, ["--max-steps", 1], runs_dir=root, label="bench-observe-warmup", device="cpu",
                      nproc_per_node=2, live="off")
        times, record_bytes = {"off": [], "on": []}, []
        for i in range(reps):
            for mode in ("off", "on"):
                result = tl.run_script(script, args, runs_dir=root, label=f"bench-observe-{mode}{i}", device="cpu",
                                       nproc_per_node=2, live="off", observe=mode == "on")
                times[mode].append(result.wall_time_s)
                if mode == "on" and not all(rank.complete for rank in result.observed()):
                    raise RuntimeError(f"{script}: a rank's observed record has no end ({result.run_dir / 'observed'})")
                if mode == "on":
                    record_bytes.append(sum(p.stat().st_size for p in (result.run_dir / "observed").iterdir()))
        on, off = statistics.median(times["on"]), statistics.median(times["off"])
        rows.append(row(f"observer: {label}, observed / not observed", on / off, 1.3,
                        note=f"median {on:.2f} s vs {off:.2f} s ({reps} each); records "
                             f"{statistics.median(record_bytes) / 2**10:.0f} KiB per run"))
    return rows


def bench_memory(root: Path) -> list[dict]:
    measured, predicted = {}, {}
    for strategy in ("ddp", "fsdp2"):
        result = tl.run_script("fsdp_train", ["--strategy", strategy, "--max-steps", 2], runs_dir=root,
                               label=f"bench-{strategy}", device="cpu", nproc_per_node=2, live="off")
        m = result.metrics()
        last = m[m["step"] == m["step"].max()].set_index("rank")
        measured[strategy] = (last["param_bytes"] + last["grad_bytes"] + last["optimizer_state_bytes"]).to_dict()
        model = tl.runs.read_rank_json(result.run_dir, "model")[0]
        predicted[strategy] = {}
        for rank in measured[strategy]:
            p = tl.planning.predict_state_bytes(model["shapes"], strategy=strategy, world_size=2, rank=rank)
            predicted[strategy][rank] = p.param_bytes + p.grad_bytes + p.optimizer_state_bytes
    ratio = max(measured["fsdp2"].values()) / max(measured["ddp"].values())
    error = max(abs(predicted[s][r] - measured[s][r]) / measured[s][r] for s in measured for r in measured[s])
    return [row("memory: FSDP2 / DDP state bytes per rank (N=2)", ratio, 0.52,
                note=f"{max(measured['fsdp2'].values()) / 2**20:.2f} MiB vs {max(measured['ddp'].values()) / 2**20:.2f} MiB"),
            row("memory: analytic model's largest relative error", error, 0.10, unit="fraction")]


def bench_plan() -> list[dict]:
    """tl.planning.plan_memory of a 6.7 B GPT (32 x 4096, 1024-token windows, vocabulary 50304) on 8 ranks, FSDP2 bf16 with
    activation checkpointing: seconds per plan, the first one in this process (imports included) and the next."""
    from tutorial_lib.planning.memory_plan import table_args
    args = table_args("6.7B", "FSDP2 bf16 + AC", 8)
    times = []
    for _ in range(2):
        plan = tl.planning.plan_memory(args, world_size=8)
        times.append(plan.plan_time_s)
    note = f"{plan.n_params / 1e9:.2f} B parameters, peak {plan.total_bytes / 2**30:.2f} GiB per rank"
    # Issue 35: a Hugging Face 70 B (Llama-3.1-70B's config) on 64 ranks, train_hf.py's step, bf16 + full AC.
    big = tl.planning.plan_hf("llama-3.1-70b", world_size=64, seq_len=4096, layout="bf16 + AC full")
    big_note = f"{big.n_params / 1e9:.2f} B parameters, peak {big.total_bytes / 2**30:.2f} GiB per rank"
    return [row("plan: 7B on 8 ranks, first plan in the process (s)", times[0], 30.0, unit="s", note=note),
            row("plan: 7B on 8 ranks, the next one (s)", times[1], 30.0, unit="s"),
            row("plan: HF 70B (Llama-3.1-70B) on 64 ranks, bf16 + full AC, 4096 tokens (s)", big.plan_time_s, 60.0,
                unit="s", note=big_note)]


def bench_workbook(root: Path, paths: tuple[str, ...] = ("warm",)) -> list[dict]:
    """The workbook on each launch path in ``paths`` ("warm", "cold"); per-notebook rows for the first."""
    rows, totals = [], {}
    for path in paths:
        with _environ({**os.environ, "TUTORIAL_LIB_WARM": "1" if path == "warm" else "0"}):
            path_rows, totals[path] = _workbook_once(root / f"workbook-{path}")
        rows += path_rows if path == paths[0] else [r for r in path_rows if "total" in r["benchmark"]]
        rows[-1]["benchmark"] += f" ({path})"
        if path == "warm":  # the kernel's own work (start-up, the helper's import, figures) is then a larger share
            rows[-1].update(target=None, ok=None)
    if len(totals) == 2:
        rows.append(row("workbook: warm / cold wall time", totals["warm"] / totals["cold"], 0.6,
                        note=f"{totals['warm']:.0f} s vs {totals['cold']:.0f} s"))
    return rows


def _workbook_once(root: Path) -> tuple[list[dict], float]:
    """Every notebook as ``make workbook`` runs it (``run_workbook.py``'s kernels, text progress)."""
    import papermill as pm
    import run_workbook  # this file's folder, scripts/, is sys.path[0]

    rows, total, launches, in_process = [], 0.0, 0.0, 0.0
    runs = root / "workbook-runs"
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        before = set(runs.glob("*")) if runs.exists() else set()
        start = time.monotonic()
        with tempfile.TemporaryDirectory() as out, _environ({**os.environ, "TUTORIAL_LIB_LIVE": "text"}):
            pm.execute_notebook(str(path), str(Path(out) / path.name), parameters={"RUNS_DIR": str(runs)},
                                kernel_name="python3", progress_bar=False, cwd=str(path.parent),
                                kernel_manager_class=run_workbook.IPCKernelManager)
        seconds = time.monotonic() - start
        run_workbook.reap_kernels(block=False)
        total += seconds
        new = set(runs.glob("*")) - before
        records = [json.loads((d / "run.json").read_text()) for d in new if (d / "run.json").exists()]
        launched = [r["wall_time_s"] for r in records if not r.get("in_process")]  # finished, failed or timed out
        here = [r["wall_time_s"] for r in records if r.get("in_process")]  # tl.run_in_process: no torchrun
        launches, in_process = launches + sum(launched), in_process + sum(here)
        rows.append(row(f"workbook: {path.stem} (papermill)", seconds, 60.0, unit="s",
                        note=f"{len(launched)} torchrun launches {sum(launched):.1f} s"
                             + (f", {len(here)} in-process runs {sum(here):.1f} s" if here else "")))
    run_workbook.reap_kernels()
    runs_s = launches + in_process
    rows.append(row("workbook: total / sum of its runs", total / runs_s if runs_s else float("nan"), 1.3,
                    note=f"{total:.0f} s vs {launches:.0f} s in launches + {in_process:.0f} s in-process"))
    return rows, total


def bench_gpu(root: Path) -> list[dict]:
    if not torch.cuda.is_available():
        return [row("gpu: skipped (no CUDA)", 0.0, None, unit="-")]
    plan = tl.resolve_device("cuda")
    rows = []
    result = tl.run_script("collectives_check", ["--sizes-bytes", 1 << 20, 16 << 20, 256 << 20, "--iters", 10],
                           runs_dir=root, label="bench-nccl", device="cuda", live="off")
    for b in tl.runs.read_collectives(result.run_dir)[0]["bandwidth"]:
        rows.append(row(f"gpu: nccl all_reduce busbw {b['size_bytes'] >> 20} MiB", b["busbw_GBps"], None, unit="GB/s",
                        note=f"world size {plan.nproc_per_node}"))
    wide = ["--max-steps", 40, "--batch-size", 512, "--hidden-dim", 4096, "--log-every", 40]
    step = {p: tl.runs.summarize_runs({p: tl.run_script("ddp_train", wide + ["--precision", p], runs_dir=root,
                                                    label=f"bench-{p}", device="cuda", live="off").metrics()})
            .loc[p, "median_step_time_s"] for p in ("fp32", "bf16") if tl.probes.autocast_supported(p, "cuda")}
    if len(step) == 2:
        rows.append(row("gpu: bf16 / fp32 step time", step["bf16"] / step["fp32"], None,
                        note=f"{step['bf16'] * 1e3:.2f} ms vs {step['fp32'] * 1e3:.2f} ms"))
    peak = {}
    for strategy in ("ddp", "fsdp2"):
        m = tl.run_script("fsdp_train", ["--strategy", strategy, "--max-steps", 3], runs_dir=root,
                          label=f"bench-gpu-{strategy}", device="cuda", live="off").metrics()
        peak[strategy] = m["peak_allocated_bytes"].max()
    rows.append(row("gpu: FSDP2 / DDP peak allocated per GPU", peak["fsdp2"] / peak["ddp"], None,
                    note=f"{peak['fsdp2'] / 2**20:.0f} MiB vs {peak['ddp'] / 2**20:.0f} MiB"))
    return rows


PLAIN_SCRIPT = """\
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    loss = model(torch.randn(8, 32)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
"""
EXIT_ABORT = "terminate called without an active exception"


def soak_launches(root: Path, launches: int) -> list[dict]:
    """Back-to-back launches that must all pass: a lesson script, and a plain script written as a learner would."""
    rows = []
    for kind in ("lesson script (ddp_train.py, 3 steps)", "plain script ending with destroy_process_group()"):
        failures, aborts, start = [], [], time.monotonic()
        for i in range(launches):
            try:
                if kind.startswith("lesson"):
                    result = tl.run_script("ddp_train", ["--max-steps", 3], runs_dir=root, label=f"soak-lesson{i}",
                                           device="cpu", nproc_per_node=2, live="off", timeout_s=300)
                else:
                    run_dir = tl.new_run_dir(f"soak-plain{i}", root)
                    (run_dir / "plain.py").write_text(PLAIN_SCRIPT)
                    result = tl.launch(tl.LaunchSpec(run_dir / "plain.py", device="cpu", live="off", timeout_s=300))
                run_dir = result.run_dir
            except tl.LaunchError as e:
                failures.append(f"{e.run_dir.name}: {tl.diagnose(e).cause}")
                run_dir = e.run_dir
            if EXIT_ABORT in (run_dir / "output.log").read_text(errors="replace"):
                aborts.append(run_dir.name)
        note = (f"{launches} launches in {time.monotonic() - start:.0f} s; exit aborts seen: {len(aborts)}"
                + (f" ({', '.join(aborts[:5])})" if aborts else "") + (f"; failures: {failures[:5]}" if failures else ""))
        print(f"[bench] soak, {kind}: {note}", flush=True)
        rows.append(row(f"soak: spurious failures in {launches} launches, {kind}", len(failures), 0, "count", note))
    return rows


def failure_matrix(root: Path, repeats: int) -> list[dict]:
    """The failures notebooks 02, 05, 06 and 07 make on purpose, each ``repeats`` times on each launch path (warm
    and cold): the doctor's verdicts."""
    import socket
    cpu = dict(runs_dir=root, device="cpu", nproc_per_node=2, live="off", timeout_s=120)
    fail = ["--max-steps", 6, "--log-every", 1, "--fail-rank", 1, "--fail-step", 2]
    ckpt = ["--max-steps", 12, "--hidden-dim", 256, "--strategy", "fsdp2"]
    cases = {
        "02 uneven inputs without Join": lambda: tl.run_script("uneven_inputs", ["--pg-timeout-s", 3], **cpu),
        "05 rank-0-only FSDP save": lambda: tl.run_script("checkpoint_train", [*ckpt, "--format", "full", "--save-mode",
                                                          "rank0-only", "--max-steps", 1, "--save-every", 1,
                                                          "--pg-timeout-s", 3], **cpu),
        "05 rank killed during a save, restarted": lambda: tl.run_script(
            "checkpoint_train", [*ckpt, "--format", "dcp", "--save-every", 3, "--fail-rank", 1, "--fail-step", 6,
                                 "--fail-mode", "kill-during-save", "--resume", "latest"], max_restarts=1, **cpu),
        "06 a node that never starts": lambda: tl.run_script("collectives_check", [], **{**cpu, "nproc_per_node": 1},
                                                             nnodes=2, start_nodes=[0], rendezvous_timeout_s=5),
        "06 a taken port": None,  # below: holds a port while it runs
        "07 hang, no-progress limit": lambda: tl.run_script("ddp_train", [*fail, "--fail-mode", "hang", "--pg-timeout-s",
                                                            600], stall_timeout_s=5, **cpu),
        "07 hang, 3 s collective timeout": lambda: tl.run_script("ddp_train", [*fail, "--fail-mode", "hang",
                                                                 "--pg-timeout-s", 3], **cpu),
        "07 skipped collective": lambda: tl.run_script("ddp_train", [*fail, "--fail-mode", "skip-collective",
                                                       "--pg-timeout-s", 600], **cpu),
        "07 mismatch under DETAIL": lambda: tl.run_script("collective_mismatch", ["--fail-rank", 1, "--fail-step", 2,
                                                          "--max-steps", 4], env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                                                          **cpu),
        "07 crashing rank": lambda: tl.run_script("ddp_train", [*fail, "--fail-mode", "raise"], **cpu),
        "07 out of memory": lambda: tl.run_script("ddp_train", [*fail, "--fail-mode", "oom"], **cpu),
    }

    def taken_port():
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            return tl.run_script("collectives_check", [], master_port=held.getsockname()[1], **cpu)

    cases["06 a taken port"] = taken_port
    rows = []
    for name, run in cases.items():
        verdicts, ranks = [], []
        for i in range(repeats):
            for path in ("warm", "cold"):  # each repeat on both launch paths: one diagnosis for both
                with _environ({**os.environ, "TUTORIAL_LIB_WARM": "1" if path == "warm" else "0"}):
                    try:
                        result = run()
                        d = tl.diagnose(result.run_dir)
                    except tl.LaunchError as e:
                        d = tl.diagnose(e)
                verdicts.append(d.cause + (" (recovered)" if d.recovered else ""))
                ranks.append(d.rank)
                print(f"[bench] failure matrix, {name}, {path} start: {verdicts[-1]} (rank {d.rank})", flush=True)
        repeats_both = 2 * repeats
        counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
        # The rank named: where every rank's collective timed out, whichever timer fired first (either is right).
        named = ", ".join(f"rank {r}: {ranks.count(r)}" for r in sorted(set(ranks), key=str))
        note = "; ".join(f"{v}: {n}/{repeats_both}" for v, n in counts.items()) + f" (named {named}; warm and cold)"
        print(f"[bench] failure matrix, {name}: {note}", flush=True)
        rows.append(row(f"soak: different diagnoses, {name}", len(counts), 1, "count", note))
    return rows


# nanoGPT's small configuration (config/train_shakespeare_char.py: 6 layers, width 384, 6 heads, 256-token windows,
# batch 64, dropout 0.2), fp32, one CPU process; train_lm.py with the same shape. Both print a line every step.
NANOGPT_ARGS = ["config/train_shakespeare_char.py", "--dataset=stdlib", "--device=cpu", "--dtype=float32",
                "--eval_iters=1", "--eval_interval=100000", "--log_interval=1", "--always_save_checkpoint=False"]
TRAIN_LM_ARGS = ["--parallel", "none", "--n-layers", 6, "--d-model", 384, "--n-heads", 6, "--block-size", 256,
                 "--batch-size", 64, "--dropout", 0.2, "--precision", "fp32", "--lr", 1e-3, "--warmup-steps", 100,
                 "--eval-windows", 1, "--log-every", 1]
TOKENS_PER_STEP = 64 * 256  # batch 64 x block 256, no accumulation, in both
# The line each program prints after a step (group 1: the step; nanoGPT counts from 0, train_lm from 1).
STEP_LINE = {"train_lm": re.compile(r"step (\d+)/\d+ loss"), "nanoGPT": re.compile(r"iter (\d+): loss")}
NANOGPT_ITER = re.compile(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms")  # nanoGPT's own clock
NANOGPT_MODES = ("eager", "compiled")


def write_nanogpt_data(nanogpt: Path) -> None:
    """train_lm.py's corpus (the standard-library bytes) in nanoGPT's format: data/stdlib/{train,val}.bin, meta.pkl."""
    import pickle

    import numpy as np
    data = tl.import_script("train_lm").read_corpus(1 << 20)
    n_val = int(len(data) * 0.1)  # train_lm.py's --val-fraction
    folder = nanogpt / "data" / "stdlib"
    folder.mkdir(parents=True, exist_ok=True)
    np.asarray(list(data[:-n_val]), dtype=np.uint16).tofile(folder / "train.bin")
    np.asarray(list(data[-n_val:]), dtype=np.uint16).tofile(folder / "val.bin")
    (folder / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 256}))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has run so far (Linux: /proc/PID/stat's utime and stime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()  # after "pid (name)": state, ppid, ..., utime (12th), stime
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def line_times(command: list, cwd: Path, env: dict, pattern: re.Pattern, log: Path,
               timeout_s: float = 3600) -> tuple[dict, dict, str]:
    """Run ``command``, reading its output as it comes: {step: monotonic time its line arrived}, {step: the process's
    CPU seconds then}, and the output.

    The interval between two consecutive step lines is one whole turn of the training loop, whatever the program does
    in it (data, forward, backward, clipping, the optimizer, its logging and metrics): the same clock for both
    programs. stdout is unbuffered (PYTHONUNBUFFERED=1), so a line arrives when it is printed. The CPU seconds are
    the same turns counted in the process's own CPU time, which other work on the machine inflates much less."""
    import threading
    wall, cpu, lines = {}, {}, []
    with open(log, "w") as err:
        proc = subprocess.Popen([str(c) for c in command], cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"},
                                stdout=subprocess.PIPE, stderr=err, text=True)
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                now = time.monotonic()
                lines.append(line)
                m = pattern.match(line)
                if m:
                    wall[int(m[1])] = now
                    with contextlib.suppress(OSError):  # the process may end right after its last line
                        cpu[int(m[1])] = cpu_seconds(proc.pid)
            rc = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM): the program goes with the benchmark
                proc.kill()
                proc.wait()
    if rc:
        raise RuntimeError(f"{' '.join(map(str, command))} failed ({rc}): {log.read_text()[-2000:]}")
    return wall, cpu, "".join(lines)


def measured_intervals(stamps: dict, warmup: int, steps: int) -> list[float]:
    """The seconds of steps warmup+1 .. warmup+steps (counting the program's first step as 1): each the interval
    between its line and the line before. Needs the lines of steps 1 .. warmup+steps, consecutive."""
    if warmup < 1:
        raise ValueError("warmup must be >= 1: the first step has no line before it")
    keys = sorted(stamps)
    if len(keys) < warmup + steps or keys[:warmup + steps] != list(range(keys[0], keys[0] + warmup + steps)):
        raise ValueError(f"need {warmup + steps} consecutive step lines, got steps {keys}")
    times = [stamps[k] for k in keys[:warmup + steps]]
    return [b - a for a, b in zip(times[warmup - 1:], times[warmup:])]


def round_summary(rounds: list[dict], clock: str = "") -> dict:
    """Per-round figures of both programs -> each round's train_lm / nanoGPT, their median (the figure), and the
    median of each program's figure over the rounds. ``clock``: "" (tokens/s), " cpu" (tokens per CPU second)."""
    ratios = [r["train_lm" + clock] / r["nanoGPT" + clock] for r in rounds]
    return {"ratios": ratios, "ratio": statistics.median(ratios),
            "train_lm": statistics.median(r["train_lm" + clock] for r in rounds),
            "nanoGPT": statistics.median(r["nanoGPT" + clock] for r in rounds)}


def bench_nanogpt(root: Path, nanogpt: Path, steps: int, rounds: int, warmup: dict, modes: tuple,
                  threads: int) -> list[dict]:
    """train_lm.py against nanoGPT's train.py, eager and compiled, tokens/s in alternated rounds.

    Each round runs, per mode, the two programs one after the other (train_lm first in odd rounds, nanoGPT first in
    even ones, so neither always gets the quieter half of a drifting load); each run does ``warmup[mode]`` steps,
    then ``steps`` measured steps (train_lm one more: its last step evaluates, as nanoGPT's first does, and neither
    is measured). A run's tokens/s is the median of its measured steps; a round's ratio is train_lm / nanoGPT of the
    two runs side by side; the figure is the median of the rounds' ratios [>= 1.0]."""
    if not (nanogpt / "train.py").is_file() or not (nanogpt / "config" / "train_shakespeare_char.py").is_file():
        print(f"[bench] nanogpt: no nanoGPT checkout in {nanogpt}: git clone https://github.com/karpathy/nanoGPT "
              f"{nanogpt} (the figures in docs/benchmarks.md used commit 3adf61e)", flush=True)
        return [row("nanogpt: nanoGPT checkout missing (--nanogpt-dir)", 0.0, None, unit="-")]
    write_nanogpt_data(nanogpt)
    # Each program's OMP_NUM_THREADS equal; inductor's cache in this benchmark's folder (removed at the end): the
    # first compiled round compiles from nothing, later ones may reuse its kernels (a shorter start, same steps).
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor-cache")}
    per_mode = {mode: [] for mode in modes}
    commands = {}
    for rnd in range(rounds):
        for mode in modes:
            w = warmup[mode]
            lm = [sys.executable, ROOT / "tutorial_lib" / "lessons" / "train_lm.py", *TRAIN_LM_ARGS,
                  "--max-steps", w + steps + 1, *(["--compile"] if mode == "compiled" else [])]
            ng = [sys.executable, "train.py", *NANOGPT_ARGS, f"--compile={mode == 'compiled'}",
                  f"--max_iters={w + steps - 1}", f"--out_dir={root / 'nanoGPT-out'}"]  # iterations 0..max_iters
            result = {}
            order = ("train_lm", "nanoGPT") if rnd % 2 == 0 else ("nanoGPT", "train_lm")
            for name in order:
                cwd = nanogpt if name == "nanoGPT" else root / f"train_lm-{mode}-{rnd}"
                cwd.mkdir(exist_ok=True)
                command = lm if name == "train_lm" else ng
                commands[(name, mode)] = f"cd {cwd} && OMP_NUM_THREADS={threads} " + " ".join(map(str, command))
                load = os.getloadavg()[0]
                start = time.monotonic()
                wall, cpu, out = line_times(command, cwd, env, STEP_LINE[name], root / f"{name}-{mode}-{rnd}.stderr")
                seconds, cpu_s = measured_intervals(wall, w, steps), measured_intervals(cpu, w, steps)
                if name == "nanoGPT":  # its own clock: "time Tms" of the same iterations
                    own = {int(i): float(t) / 1000 for i, t in NANOGPT_ITER.findall(out)}
                    own = [own[i] for i in range(w, w + steps)]
                else:  # its own clock: step_time_s in its metrics (the step, without writing the line itself)
                    lines = (cwd / "metrics" / "rank0.jsonl").read_text().splitlines()
                    own = [r["step_time_s"] for r in map(json.loads, lines) if w < r["step"] <= w + steps]
                result[name] = TOKENS_PER_STEP / statistics.median(seconds)
                result[f"{name} own clock"] = TOKENS_PER_STEP / statistics.median(own)
                result[f"{name} cpu"] = TOKENS_PER_STEP / statistics.median(cpu_s)
                result[f"{name} load"] = load
                print(f"[bench] nanogpt {mode} round {rnd + 1}/{rounds}: {name} {result[name]:.0f} tokens/s (steps "
                      f"{', '.join(f'{x:.2f}' for x in seconds)} s; CPU {', '.join(f'{x:.2f}' for x in cpu_s)} s: "
                      f"{result[name + ' cpu']:.0f} tokens per CPU second; its own clock "
                      f"{result[name + ' own clock']:.0f} tokens/s), run {time.monotonic() - start:.0f} s, load "
                      f"average {load:.2f} at its start", flush=True)
            per_mode[mode].append(result)
            print(f"[bench] nanogpt {mode} round {rnd + 1}/{rounds}: train_lm / nanoGPT "
                  f"{result['train_lm'] / result['nanoGPT']:.3f} (per CPU second "
                  f"{result['train_lm cpu'] / result['nanoGPT cpu']:.3f})", flush=True)
    for (name, mode), command in commands.items():
        print(f"[bench] nanogpt {mode}, {name}: {command}", flush=True)
    rows, tokens = [], {}
    for mode, results in per_mode.items():
        s = round_summary(results)
        tokens[mode] = s
        per_round = "; ".join(f"{ratio:.3f} ({r['train_lm']:.0f} / {r['nanoGPT']:.0f}, load {r['train_lm load']:.1f}/"
                              f"{r['nanoGPT load']:.1f})" for ratio, r in zip(s["ratios"], results))
        print(f"[bench] nanogpt {mode}: train_lm / nanoGPT {s['ratio']:.3f}, median of {len(results)} rounds: "
              f"{per_round}", flush=True)
        rows.append(row(f"nanogpt: train_lm / nanoGPT tokens/s, {mode}", s["ratio"], 1.0, at_least=True,
                        note=f"median of {len(results)} alternated rounds of {steps} steps: {per_round} "
                             f"(train_lm / nanoGPT tokens/s, load average at each run's start); "
                             f"OMP_NUM_THREADS={threads}"))
        c = round_summary(results, " cpu")
        rows.append(row(f"nanogpt: train_lm / nanoGPT tokens per CPU second, {mode}", c["ratio"], None,
                        note=f"the same steps in each process's own CPU time (other work on the machine moves it "
                             f"less): {', '.join(f'{x:.3f}' for x in c['ratios'])}"))
    if len(tokens) == 2:
        for name in ("train_lm", "nanoGPT"):
            rows.append(row(f"nanogpt: {name} compiled / eager tokens/s", tokens["compiled"][name] /
                            tokens["eager"][name], None, note=f"{tokens['compiled'][name]:.0f} / "
                                                              f"{tokens['eager'][name]:.0f} (medians of the rounds)"))
    return rows


def main() -> int:
    # SIGTERM (kill, a CI timeout) unwinds like Ctrl-C, so every ``finally`` runs and no program this started
    # outlives the benchmark.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(DEFAULT_SECTIONS))
    parser.add_argument("--soak-launches", type=int, default=200, help="soak: launches of each script (count)")
    parser.add_argument("--soak-repeats", type=int, default=10, help="soak: runs of each notebook failure (count)")
    parser.add_argument("--reps", type=int, default=5, help="alternating repetitions per timed pair (count)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table as JSON here")
    parser.add_argument("--nanogpt-dir", type=Path, default=Path(os.environ.get("NANOGPT_DIR", "/tmp/nanoGPT")),
                        help="nanogpt: a checkout of karpathy/nanoGPT (default $NANOGPT_DIR or /tmp/nanoGPT)")
    parser.add_argument("--nanogpt-steps", "--compile-steps", dest="nanogpt_steps", type=int, default=3,
                        help="nanogpt: steps measured per run, after the warm-up (count)")
    parser.add_argument("--nanogpt-rounds", type=int, default=3, help="nanogpt: alternated rounds (count)")
    parser.add_argument("--nanogpt-warmup", type=int, nargs=2, default=[5, 2], metavar=("EAGER", "COMPILED"),
                        help="nanogpt: steps before the measured ones, eager and compiled (count, >= 1: a step is the "
                             "time between its line and the one before). Eager 5: a process's first steps fault in "
                             "fresh pages while its heap settles, each faster than the last (docs/benchmarks.md), and "
                             "nanoGPT's own MFU skips its first 5 iterations too; compiled 2: the first ones compile")
    parser.add_argument("--nanogpt-modes", nargs="+", choices=NANOGPT_MODES, default=list(NANOGPT_MODES),
                        help="nanogpt: eager, compiled (torch.compile, inductor) or both")
    parser.add_argument("--threads", type=int, default=1, help="nanogpt: OMP_NUM_THREADS of each process (count)")
    args = parser.parse_args()
    for name in ("reps", "soak_launches", "soak_repeats", "nanogpt_steps", "nanogpt_rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.nanogpt_warmup) < 1:
        parser.error(f"--nanogpt-warmup must be >= 1 each, got {args.nanogpt_warmup}")
    if "compile" in args.only:  # the section's old name
        args.only = list(dict.fromkeys("nanogpt" if s == "compile" else s for s in args.only))
    os.environ.setdefault("TUTORIAL_LIB_LIVE", "off")
    header = {"date": datetime.now().isoformat(timespec="minutes"), "machine": platform.node(),
              "cpu_cores": os.cpu_count(), "load_average_1min": os.getloadavg()[0], "torch": torch.__version__,
              "gpus": torch.cuda.device_count()}
    print(json.dumps(header))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        root = Path(tmp)
        for section in args.only:
            start = time.monotonic()
            fn = {"lessons": bench_lessons, "launcher": lambda: bench_launcher(root, args.reps), "metrics": lambda: bench_metrics(root, args.reps),
                  "observe": lambda: bench_observe(root, args.reps),
                  "memory": lambda: bench_memory(root), "plan": bench_plan, "workbook": lambda: bench_workbook(root, ("warm", "cold") if "warm" in args.only else ("warm",)),
                  "warm": lambda: bench_warm(root, args.reps),
                  "gpu": lambda: bench_gpu(root),
                  "soak": lambda: soak_launches(root, args.soak_launches) + failure_matrix(root, args.soak_repeats),
                  "matrix": lambda: failure_matrix(root, args.soak_repeats),
                  "nanogpt": lambda: bench_nanogpt(root, args.nanogpt_dir, args.nanogpt_steps, args.nanogpt_rounds,
                                                   dict(zip(NANOGPT_MODES, args.nanogpt_warmup)),
                                                   tuple(args.nanogpt_modes), args.threads),
                  }[section]
            rows += fn()
            print(f"[bench] {section} done in {time.monotonic() - start:.0f} s", flush=True)
    width = max(len(r["benchmark"]) for r in rows)
    print(f"\n{'benchmark':<{width}}  {'value':>9}  unit      target  result  note")
    for r in rows:
        result = "" if r["ok"] is None else ("ok" if r["ok"] else "MISSED")
        target = "" if r["target"] is None else f"{'>=' if r.get('at_least') else '<='} {r['target']:g}"
        print(f"{r['benchmark']:<{width}}  {r['value']:>9.4g}  {r['unit']:<8}  {target:>7}  {result:<6}  {r['note']}")
    print(f"load average now: {os.getloadavg()[0]:.2f} (was {header['load_average_1min']:.2f} at the start)")
    if args.out:
        args.out.write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
