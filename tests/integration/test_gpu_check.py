"""scripts/gpu_check.py's plan, printed by --dry-run without a GPU, and model_parallel.py's device assignment.

Issue 15: the users run 1, 2, 4 or 8 GPUs. Nothing here launches a job or touches CUDA.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tutorial_lib.errors import ConfigError
from tutorial_lib.runs.rundir import LESSONS_DIR, available_scripts

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_SCRIPTS = set(available_scripts())  # the lessons (not _workbook.py, their instruments, nor lm_model.py)
NOTEBOOKS = {p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}


def load_module(path):
    """A Python file imported as a module (a script's ``main()`` does not run)."""
    spec = importlib.util.spec_from_file_location(f"_test_gpu_check_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


pick_devices = load_module(LESSONS_DIR / "model_parallel.py").pick_devices
gpu_check = load_module(ROOT / "scripts" / "gpu_check.py")


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("ranks_of", [lambda g: max(1, g // 2), lambda g: g], ids=["a pair per rank", "a rank per GPU"])
def test_model_parallel_ranks_never_share_a_gpu(gpus, ranks_of):
    # Issue 15 item 3: one rank per GPU on 4 GPUs gave ranks 1 and 2 both cuda:2, and NCCL refused the group.
    ranks = ranks_of(gpus)
    devices = [pick_devices(r, ranks, gpus) for r in range(ranks)]
    used = [d for pair in devices for d in set(pair)]
    assert len(used) == len(set(used)), devices
    assert all(int(d.split(":")[1]) < gpus for d in used), devices


def test_model_parallel_devices_for_each_machine():
    assert pick_devices(0, 1, 0) == ["cpu", "cpu"]
    assert pick_devices(0, 1, 1) == ["cuda:0", "cuda:0"]  # one GPU: both halves on it, a logical split
    assert pick_devices(0, 1, 2) == ["cuda:0", "cuda:1"]
    assert [pick_devices(r, 2, 4) for r in range(2)] == [["cuda:0", "cuda:1"], ["cuda:2", "cuda:3"]]
    assert [pick_devices(r, 4, 8) for r in range(4)] == [[f"cuda:{2 * r}", f"cuda:{2 * r + 1}"] for r in range(4)]
    assert [pick_devices(r, 2, 3) for r in range(2)] == [["cuda:0", "cuda:0"], ["cuda:1", "cuda:1"]]


def test_model_parallel_refuses_more_ranks_than_gpus():
    with pytest.raises(ValueError, match=r"LOCAL_WORLD_SIZE=2 ranks but only 1 GPU\(s\).*--nproc-per-node <= 1"):
        pick_devices(1, 2, 1)


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_plan_covers_every_script_and_every_notebook_on_cuda(gpus):
    checks = gpu_check.plan_checks(gpus)
    scripts = [c for c in checks if c.kind == "script"]
    notebooks = [c for c in checks if c.kind == "notebook"]
    assert sorted(c.name for c in scripts) == sorted(SHIPPED_SCRIPTS)
    assert all(len(c.launches) == 1 and c.launches[0].script == c.name and c.launches[0].device == "cuda" for c in scripts)
    assert sorted(c.name for c in notebooks) == sorted(NOTEBOOKS) and len(NOTEBOOKS) == 16
    assert all(c.parameters["DEVICE"] == "cuda" for c in notebooks)
    assert all(c.asserts for c in checks), "every check says what it asserts"
    assert len({c.label for c in checks}) == len(checks)


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_no_check_asks_for_more_gpus_than_the_machine_has(gpus):
    checks = gpu_check.plan_checks(gpus)
    launches = [launch for c in checks for launch in c.launches]
    assert all(launch.gpus_used <= gpus for launch in launches)
    assert max(launch.gpus_used for launch in launches) == gpus, "and the plan uses all of them"
    for c in (c for c in checks if c.kind == "notebook"):
        nproc, nnodes = c.parameters["NPROC"], c.parameters.get("NNODES", 1)
        assert nproc is None or nnodes * nproc <= gpus, (c.name, c.parameters)


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_model_parallel_check_gives_each_rank_its_own_gpus(gpus):
    (launch,) = next(c for c in gpu_check.plan_checks(gpus) if c.name == "model_parallel").launches
    devices = [pick_devices(r, launch.nproc_per_node, gpus) for r in range(launch.nproc_per_node)]
    used = [d for pair in devices for d in set(pair)]
    assert len(used) == len(set(used)) == launch.gpus_used, devices
    assert all(a != b for a, b in devices) == (gpus >= 2), "split across a pair of GPUs whenever there are two"


def test_a_script_without_a_gpu_check_stops_the_plan(monkeypatch):
    monkeypatch.setattr(gpu_check.tl.runs, "available_scripts", lambda: sorted(SHIPPED_SCRIPTS) + ["new_lesson"])
    with pytest.raises(KeyError, match="new_lesson.py is shipped but has no GPU check: add an entry"):
        gpu_check.plan_checks(2)


def test_a_gpu_count_below_one_is_refused():
    with pytest.raises(ConfigError, match="gpu_count must be >= 1, got 0"):
        gpu_check.plan_checks(0)


def test_dry_run_prints_every_script_and_notebook_without_a_gpu(tmp_path):
    out = subprocess.run([sys.executable, ROOT / "scripts" / "gpu_check.py", "--dry-run", "--gpus", "4",
                          "--out-dir", tmp_path / "out"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for name in SHIPPED_SCRIPTS:
        assert f"script {name}:" in out.stdout and f"RUN_DIR/{name}.py" in out.stdout, name
    for name in NOTEBOOKS:
        assert f"papermill notebooks/{name} " in out.stdout, name
    lines = out.stdout.splitlines()
    mp = next(line for line in lines if "RUN_DIR/model_parallel.py" in line)
    assert "--nproc-per-node 2 " in mp and "devices: rank 0 cuda:0+cuda:1, rank 1 cuda:2+cuda:3" in out.stdout
    ddp = next(line for line in lines if line.endswith("RUN_DIR/ddp_train.py --max-steps 30 --batch-size 256 "
                                                       "--hidden-dim 1024 --log-every 10"))
    assert ddp.startswith("    $ python -m torch.distributed.run ") and "--nproc-per-node 4 " in ddp
    assert "-p NPROC 2 -p NNODES 2" in out.stdout, "notebook 06: 2 nodes x 2 GPU ranks"
    assert not (tmp_path / "out").exists(), "a dry run writes nothing"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without GPUs")
def test_the_real_run_without_gpus_says_to_use_the_dry_run(tmp_path):
    out = subprocess.run([sys.executable, ROOT / "scripts" / "gpu_check.py", "--gpus", "2", "--out-dir", tmp_path],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--gpus 2 needs that many GPUs and this machine shows 0; --dry-run" in out.stderr


def mp_results(run_dir, devices):
    (run_dir / "metrics").mkdir()
    for rank, pair in enumerate(devices):
        (run_dir / "metrics" / f"mp_rank{rank}.json").write_text(json.dumps({
            "rank": rank, "devices": pair, "split_across_devices": pair[0] != pair[1], "note": "...",
            "max_abs_diff_vs_one_device": 0.0}))
    return SimpleNamespace(run_dir=run_dir)


def test_model_parallel_verification_accepts_a_pair_per_rank(tmp_path):
    result = mp_results(tmp_path, [["cuda:0", "cuda:1"], ["cuda:2", "cuda:3"]])
    assert gpu_check.verify_model_parallel(result, gpu_check.Launch("model_parallel", (), 2, gpus_per_rank=2), 4)


def test_model_parallel_verification_refuses_a_gpu_shared_by_two_ranks(tmp_path):
    # The script before issue 15's fix, one rank per GPU on 4 GPUs: ranks 1 and 2 both on cuda:2.
    result = mp_results(tmp_path, [["cuda:0", "cuda:1"], ["cuda:2", "cuda:3"], ["cuda:2", "cuda:2"], ["cuda:3", "cuda:3"]])
    with pytest.raises(AssertionError):
        gpu_check.verify_model_parallel(result, gpu_check.Launch("model_parallel", (), 4), 4)


def test_fewer_gpus_than_visible_keeps_the_first_ones():
    assert gpu_check.first_gpus(2, None) == gpu_check.first_gpus(2, "") == "0,1"
    assert gpu_check.first_gpus(1, "3,5,7") == "3"


def test_the_gpu_check_holds_every_launch_to_the_metrics_schema(tmp_path):
    """On GPUs the CUDA keys of the schema are checked (issue 17): a record without them fails the check."""
    (tmp_path / "metrics").mkdir()
    row = {"step": 1, "max_steps": 1, "rank": 0, "world_size": 1, "local_rank": 0, "attempt": 0,
           "resumed_from_step": 0, "loss_local": 1.0, "loss_global": 1.0, "lr": 0.1, "epoch": 0, "step_time_s": 0.1,
           "param_bytes": 4, "grad_bytes": 4, "optimizer_state_bytes": 8}
    (tmp_path / "metrics" / "rank0.jsonl").write_text(json.dumps(row) + "\n")
    launch = gpu_check.Launch("checkpoint_train", [], 1)
    with pytest.raises(AssertionError, match="missing key 'peak_allocated_bytes'"):
        gpu_check.check_metrics_schema(tmp_path, launch)
    row.update(peak_allocated_bytes=1, peak_reserved_bytes=2)
    (tmp_path / "metrics" / "rank0.jsonl").write_text(json.dumps(row) + "\n")
    gpu_check.check_metrics_schema(tmp_path, launch)


def cp_float8_results(run_dir, context_parallel, float8):
    (run_dir / "metrics").mkdir(parents=True)
    for rank in (0, 1):
        (run_dir / "metrics" / f"cp_float8_rank{rank}.json").write_text(json.dumps({
            "rank": rank, "world_size": 2, "device": f"cuda:{rank}", "context_parallel": context_parallel,
            "float8": float8}))
    return SimpleNamespace(run_dir=run_dir)


RING = {"ran": True, "output_max_abs_diff": 0.01, "output_max_abs": 4.0, "global_shape": [2, 8, 4096, 64],
        "local_shape": [2, 8, 2048, 64]}


def test_the_gpu_only_lessons_are_verified_where_they_can_run(tmp_path):
    launch = gpu_check.Launch("context_parallel_float8", (), 2)
    float8 = {"ran": True, "float8_rel_error": 0.04, "bf16_rel_error": 0.003, "float8_ms": 0.2, "bf16_ms": 0.3}
    verify = gpu_check.verify_context_parallel_float8
    assert "ring attention" in verify(cp_float8_results(tmp_path / "a", RING, float8), launch, 2)
    older_gpu = {"ran": False, "reason": "NVIDIA A100 has compute capability 8.0; float8 matmuls need >= 8.9"}
    assert "float8 skipped" in verify(cp_float8_results(tmp_path / "b", RING, older_gpu), launch, 2)


@pytest.mark.parametrize("context_parallel", [
    {"ran": False, "reason": "NotImplementedError: ..."},  # it must run on GPUs
    {**RING, "output_max_abs_diff": 0.5},  # beyond bf16 rounding
    {**RING, "local_shape": [2, 8, 4096, 64]},  # each rank must hold 1/N of the sequence
])
def test_the_gpu_only_lessons_fail_the_gpu_check_when_wrong(tmp_path, context_parallel):
    with pytest.raises(AssertionError):
        result = cp_float8_results(tmp_path, context_parallel, {"ran": False, "reason": "compute capability 8.0"})
        gpu_check.verify_context_parallel_float8(result, gpu_check.Launch("context_parallel_float8", (), 2), 2)


def test_the_train_lm_check_evaluates_along_the_way_so_the_loss_can_fall():
    """Issue 35: launched without --eval-every, the held-out loss existed at the last step only, and "the loss fell"
    compared that value with itself: it failed on every GPU count."""
    (launch,) = next(c for c in gpu_check.plan_checks(2) if c.name == "train_lm").launches
    args = [str(a) for a in launch.args]
    assert args[args.index("--eval-every") + 1] == "5" and args[args.index("--max-steps") + 1] == "20"
    import pandas as pd
    rows = [{"rank": r, "step": s, "peak_allocated_bytes": 1, **({"eval_loss": 5.0} if s == 20 else {})}
            for r in (0, 1) for s in range(1, 21)]
    result = SimpleNamespace(metrics=lambda: pd.DataFrame(rows))
    with pytest.raises(AssertionError, match=r"held-out losses at steps \[20\], want 5, 10, 15, 20"):
        gpu_check.verify_train_lm(result, launch, 2)


def test_without_papermill_a_real_run_stops_before_it_starts_and_says_what_to_install(monkeypatch, capsys):
    """Issue 35: the fallback ran each notebook as plain Python, where `display` is undefined."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "papermill" else real(name, *a))
    assert "papermill is not installed" in gpu_check.notebook_runner_missing()
    with pytest.raises(SystemExit) as info:
        gpu_check.main(["--gpus", "1"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "papermill is not installed" in err and "pip install -e ." in err, err
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert gpu_check.notebook_runner_missing() == "", "papermill and ipykernel are dependencies of the package"
