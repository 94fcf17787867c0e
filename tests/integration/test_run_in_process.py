"""tl.run_in_process: a shipped script run as one process inside this one, exactly as `python NAME.py` runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.runs.metrics import read_metrics

ARGS = ["--max-steps", 6, "--log-every", 3, "--precision", "fp16", "--loss-weight", 1e-5, "--grad-scaler", "off"]


def test_in_process_run_equals_python_script_run_bitwise(run_root, capsys):
    result = tl.run_in_process("ddp_train", ARGS, runs_dir=run_root, label="here")
    here = result.metrics()
    # The same script as a separate `python ddp_train.py` process, one thread as in the in-process run.
    alone = run_root / "alone"
    alone.mkdir()
    script = tl.write_script("ddp_train", alone)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")} | {"OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(script), *map(str, ARGS), "--device", "cpu"], cwd=alone, env=env,
                   check=True, capture_output=True, timeout=120)
    there = read_metrics(alone, ranks=1)
    assert here["loss_local"].tolist() == there["loss_local"].tolist()
    assert here["grad_zero_fraction"].tolist() == there["grad_zero_fraction"].tolist()
    assert here["grad_zero_fraction"].iloc[0] > 0.9, "fp16 without a scaler underflows, in process as outside"
    assert result.plan.nproc_per_node == 1 and result.plan.device == "cpu" and result.returncode == 0
    # Its own run directory, with what a launch leaves there.
    assert result.run_dir.parent == run_root and (result.run_dir / "ddp_train.py").exists()
    assert json.loads((result.run_dir / "run.json").read_text())["status"] == "finished"
    assert "python ddp_train.py --max-steps 6" in (result.run_dir / "command.txt").read_text()
    assert "step 6/6" in (result.run_dir / "output.log").read_text()
    assert "step 6/6" in capsys.readouterr().out


def test_process_state_is_restored_after_a_run(run_root):
    cwd, argv, threads = os.getcwd(), list(sys.argv), torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        tl.run_in_process("ddp_train", ["--max-steps", 2], runs_dir=run_root)
        assert (os.getcwd(), sys.argv, torch.get_num_threads()) == (cwd, argv, 2)
    finally:
        torch.set_num_threads(threads)


def test_a_script_error_propagates_and_is_recorded(run_root):
    cwd = os.getcwd()
    with pytest.raises(RuntimeError, match="injected failure on rank 0 at step 2"):
        tl.run_in_process("ddp_train", ["--max-steps", 4, "--fail-rank", 0, "--fail-step", 2, "--fail-mode", "raise"],
                          runs_dir=run_root, label="fails")
    assert os.getcwd() == cwd
    (run_dir,) = run_root.glob("*-fails")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    assert len(read_metrics(run_dir, ranks=1)) == 1, "step 1 ran and was recorded before the failure"


@pytest.mark.parametrize("kwargs, message", [
    (dict(args=["--max-steps", -1]), "--max-steps must be > 0, got -1"),
    (dict(args=["--precision", "fp8"]), "invalid choice: 'fp8'"),
    (dict(device="tpu"), "device='tpu'"),
    (dict(num_threads=0), "num_threads must be >= 1, got 0"),
])
def test_bad_input_is_refused_before_the_script_runs(run_root, kwargs, message):
    with pytest.raises(tl.ConfigError, match=message.replace("(", r"\(")):
        tl.run_in_process("ddp_train", kwargs.pop("args", []), runs_dir=run_root, **kwargs)
    assert not list(run_root.glob("*/metrics")), "nothing ran"


def test_refused_inside_a_rank_of_a_job(run_root, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(tl.ConfigError, match="RANK='0' is set"):
        tl.run_in_process("ddp_train", [], runs_dir=run_root)
    assert not list(run_root.iterdir()), "not even a run directory"
