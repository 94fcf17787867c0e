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
    plan       tl.plan_memory of a 6.7 B GPT on 8 ranks (FSDP2, bf16, activation checkpointing), seconds [<= 30];
               tl.plan_hf of Llama-3.1-70B's config on 64 ranks (train_hf.py, bf16 + full AC), seconds [<= 60]
    workbook   every notebook with papermill (on the warm path): seconds each [<= 60] and the whole workbook's wall time vs the sum
               of the runs inside it (from each run's run.json: torchrun launches, including failed and
               timed-out ones, and ``tl.run_in_process`` runs) [<= 1.3 on the cold path; printed for the warm one,
               where the kernel's own work is a larger share of a shorter whole]
    gpu        when CUDA exists: nccl all_reduce bus bandwidth for a size sweep, bf16 vs fp32 step time,
               FSDP2 vs DDP peak allocated memory per GPU
    compile    (only when asked: ``--only compile``, about 10 minutes on 2 cores) train_lm.py --compile (inductor, one
               CPU process) tokens/s against its own eager run and against nanoGPT's ``train.py --compile=True`` at
               nanoGPT's small configuration (``config/train_shakespeare_char.py``), ``OMP_NUM_THREADS`` equal, on the
               same bytes; the ratios printed with the commands used [train_lm compiled / eager >= nanoGPT's own
               compiled / eager (its eager run is measured too); train_lm compiled >= 0.9 x nanoGPT compiled].
               nanoGPT is read from ``--nanogpt-dir`` (a checkout of karpathy/nanoGPT; the README's comparison
               used 3adf61e)
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
import json
import os
import platform
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
from tutorial_lib.launcher.job import free_port  # noqa: E402
from tutorial_lib.launcher.plan import build_command  # noqa: E402

SECTIONS = ("lessons", "launcher", "warm", "metrics", "observe", "memory", "plan", "workbook", "gpu", "soak", "matrix",
            "compile")
# soak (launches + matrix), matrix, compile: when asked for
DEFAULT_SECTIONS = ("lessons", "launcher", "warm", "metrics", "observe", "memory", "plan", "workbook", "gpu")


def row(name: str, value: float, target: float | None, unit: str = "x", note: str = "") -> dict:
    ok = None if target is None else value <= target
    return {"benchmark": name, "value": round(value, 4), "unit": unit, "target": target, "ok": ok, "note": note}


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
        model = tl.read_rank_json(result.run_dir, "model")[0]
        predicted[strategy] = {}
        for rank in measured[strategy]:
            p = tl.predict_state_bytes(model["shapes"], strategy=strategy, world_size=2, rank=rank)
            predicted[strategy][rank] = p.param_bytes + p.grad_bytes + p.optimizer_state_bytes
    ratio = max(measured["fsdp2"].values()) / max(measured["ddp"].values())
    error = max(abs(predicted[s][r] - measured[s][r]) / measured[s][r] for s in measured for r in measured[s])
    return [row("memory: FSDP2 / DDP state bytes per rank (N=2)", ratio, 0.52,
                note=f"{max(measured['fsdp2'].values()) / 2**20:.2f} MiB vs {max(measured['ddp'].values()) / 2**20:.2f} MiB"),
            row("memory: analytic model's largest relative error", error, 0.10, unit="fraction")]


def bench_plan() -> list[dict]:
    """tl.plan_memory of a 6.7 B GPT (32 x 4096, 1024-token windows, vocabulary 50304) on 8 ranks, FSDP2 bf16 with
    activation checkpointing: seconds per plan, the first one in this process (imports included) and the next."""
    from tutorial_lib.planning.memory_plan import table_args
    args = table_args("6.7B", "FSDP2 bf16 + AC", 8)
    times = []
    for _ in range(2):
        plan = tl.plan_memory(args, world_size=8)
        times.append(plan.plan_time_s)
    note = f"{plan.n_params / 1e9:.2f} B parameters, peak {plan.total_bytes / 2**30:.2f} GiB per rank"
    # Issue 35: a Hugging Face 70 B (Llama-3.1-70B's config) on 64 ranks, train_hf.py's step, bf16 + full AC.
    big = tl.plan_hf("llama-3.1-70b", world_size=64, seq_len=4096, layout="bf16 + AC full")
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
    for b in tl.read_collectives(result.run_dir)[0]["bandwidth"]:
        rows.append(row(f"gpu: nccl all_reduce busbw {b['size_bytes'] >> 20} MiB", b["busbw_GBps"], None, unit="GB/s",
                        note=f"world size {plan.nproc_per_node}"))
    wide = ["--max-steps", 40, "--batch-size", 512, "--hidden-dim", 4096, "--log-every", 40]
    step = {p: tl.summarize_runs({p: tl.run_script("ddp_train", wide + ["--precision", p], runs_dir=root,
                                                    label=f"bench-{p}", device="cuda", live="off").metrics()})
            .loc[p, "median_step_time_s"] for p in ("fp32", "bf16") if tl.autocast_supported(p, "cuda")}
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
# batch 64, dropout 0.2), fp32, one CPU process; train_lm.py with the same shape (the README's eager comparison).
NANOGPT_ARGS = ["config/train_shakespeare_char.py", "--dataset=stdlib", "--device=cpu", "--dtype=float32",
                "--eval_iters=1", "--eval_interval=100000", "--log_interval=1", "--always_save_checkpoint=False"]
TRAIN_LM_ARGS = ["--parallel", "none", "--n-layers", 6, "--d-model", 384, "--n-heads", 6, "--block-size", 256,
                 "--batch-size", 64, "--dropout", 0.2, "--precision", "fp32", "--lr", 1e-3, "--warmup-steps", 100,
                 "--eval-windows", 1]
NANOGPT_ITER = r"iter (\d+): loss [\d.]+, time ([\d.]+)ms"
SKIP_STEPS = 2  # the first steps compile (and recompile): tokens/s counts the steps after them


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


def timed_run(command: list, cwd: Path, threads: int) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(map(str, command))} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def bench_compile(root: Path, nanogpt: Path, steps: int, threads: int) -> list[dict]:
    """tokens/s after compiling: train_lm.py --compile vs its eager run (against nanoGPT's own compiled / eager ratio,
    the target), and vs nanoGPT's train.py --compile=True (target >= 0.9)."""
    import re
    if not (nanogpt / "train.py").is_file() or not (nanogpt / "config" / "train_shakespeare_char.py").is_file():
        print(f"[bench] compile: no nanoGPT checkout in {nanogpt}: git clone https://github.com/karpathy/nanoGPT "
              f"{nanogpt} (the README's comparison used commit 3adf61e)", flush=True)
        return [row("compile: nanoGPT checkout missing (--nanogpt-dir)", 0.0, None, unit="-")]
    write_nanogpt_data(nanogpt)
    lm = [sys.executable, ROOT / "tutorial_lib" / "lessons" / "train_lm.py", *TRAIN_LM_ARGS, "--max-steps",
          steps + SKIP_STEPS]
    runs = {"train_lm eager": lm, "train_lm --compile": [*lm, "--compile"],
            "nanoGPT --compile=True": [sys.executable, "train.py", *NANOGPT_ARGS, "--compile=True",
                                       f"--max_iters={steps + SKIP_STEPS}"],
            "nanoGPT --compile=False": [sys.executable, "train.py", *NANOGPT_ARGS, "--compile=False",
                                        f"--max_iters={steps + SKIP_STEPS}"]}
    tokens_per_s, commands = {}, {}
    for name, command in runs.items():
        cwd = nanogpt if name.startswith("nanoGPT") else root / name.replace(" --", "_").replace(" ", "_")
        cwd.mkdir(exist_ok=True)
        out = timed_run(command, cwd, threads)
        if name.startswith("nanoGPT"):
            times = [float(t) / 1000 for i, t in re.findall(NANOGPT_ITER, out) if int(i) >= SKIP_STEPS]
            tokens_per_s[name] = 64 * 256 / statistics.median(times)  # batch 64 x block 256, no accumulation
        else:
            rows_ = [json.loads(line) for line in (cwd / "metrics" / "rank0.jsonl").read_text().splitlines()]
            tokens_per_s[name] = statistics.median(r["tokens_per_s"] for r in rows_ if r["step"] > SKIP_STEPS)
        commands[name] = f"cd {cwd} && OMP_NUM_THREADS={threads} " + " ".join(map(str, command))
        print(f"[bench] compile: {name}: {tokens_per_s[name]:.0f} tokens/s\n    {commands[name]}", flush=True)
    compiled = tokens_per_s["train_lm --compile"]
    nanogpt_gain = tokens_per_s["nanoGPT --compile=True"] / tokens_per_s["nanoGPT --compile=False"]
    note = ", ".join(f"{k} {v:.0f} tokens/s" for k, v in tokens_per_s.items()) + f" (median of steps after {SKIP_STEPS})"
    return [row("compile: train_lm --compile / train_lm eager", compiled / tokens_per_s["train_lm eager"], None,
                note=f"target: at least nanoGPT's own compiled / eager, {nanogpt_gain:.2f} here; {note}"),
            row("compile: nanoGPT --compile=True / nanoGPT eager", nanogpt_gain, None, note="the first row's target"),
            row("compile: train_lm --compile / nanoGPT --compile=True", compiled / tokens_per_s["nanoGPT --compile=True"],
                None, note=f"target >= 0.9; OMP_NUM_THREADS={threads} each; the commands are printed above")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(DEFAULT_SECTIONS))
    parser.add_argument("--soak-launches", type=int, default=200, help="soak: launches of each script (count)")
    parser.add_argument("--soak-repeats", type=int, default=10, help="soak: runs of each notebook failure (count)")
    parser.add_argument("--reps", type=int, default=5, help="alternating repetitions per timed pair (count)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table as JSON here")
    parser.add_argument("--nanogpt-dir", type=Path, default=Path(os.environ.get("NANOGPT_DIR", "/tmp/nanoGPT")),
                        help="compile: a checkout of karpathy/nanoGPT (default $NANOGPT_DIR or /tmp/nanoGPT)")
    parser.add_argument("--compile-steps", type=int, default=4, help="compile: steps measured after the first 2")
    parser.add_argument("--threads", type=int, default=1, help="compile: OMP_NUM_THREADS of each process (count)")
    args = parser.parse_args()
    for name in ("reps", "soak_launches", "soak_repeats", "compile_steps", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
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
                  "compile": lambda: bench_compile(root, args.nanogpt_dir, args.compile_steps, args.threads),
                  }[section]
            rows += fn()
            print(f"[bench] {section} done in {time.monotonic() - start:.0f} s", flush=True)
    width = max(len(r["benchmark"]) for r in rows)
    print(f"\n{'benchmark':<{width}}  {'value':>9}  unit      target  result  note")
    for r in rows:
        result = "" if r["ok"] is None else ("ok" if r["ok"] else "MISSED")
        target = "" if r["target"] is None else f"<= {r['target']:g}"
        print(f"{r['benchmark']:<{width}}  {r['value']:>9.4g}  {r['unit']:<8}  {target:>7}  {result:<6}  {r['note']}")
    print(f"load average now: {os.getloadavg()[0]:.2f} (was {header['load_average_1min']:.2f} at the start)")
    if args.out:
        args.out.write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
