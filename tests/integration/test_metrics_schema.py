"""One documented schema for the per-step metrics of every script (issue 17): the same key and unit for the same
quantity, documented in tutorial_lib/runs/metrics.py's docstring, and every script's records checked against it."""

import json
import subprocess
import sys
import textwrap

import pytest

from tutorial_lib.runs import metrics
from tutorial_lib.errors import MetricsError
from tutorial_lib.runs.metrics import ALL, METRIC_KEYS, STEP_METRICS, WHEN, check_step_record, format_schema
from tutorial_lib.runs.rundir import LESSONS_DIR, available_scripts

# Each script as plain python (a world of one), small; variants reach the keys written only sometimes.
RUNS = {
    "ddp_train": [["--max-steps", 2], ["--max-steps", 2, "--precision", "bf16", "--grad-scaler", "on"]],
    "fsdp_train": [["--max-steps", 1, "--dim", 32, "--n-layers", 1],
                   ["--max-steps", 1, "--dim", 32, "--n-layers", 1, "--strategy", "ddp", "--precision", "bf16",
                    "--grad-scaler", "on"]],
    "checkpoint_train": [["--max-steps", 2, "--save-every", 1]],
    "grad_accum": [["--max-steps", 1]],
    "model_parallel": [["--max-steps", 1]],
    "collective_mismatch": [["--max-steps", 2]],
    "uneven_inputs": [[]],
    "unused_params": [["--loss-uses", "both", "--max-steps", 2]],
    "collectives_check": [["--sizes-bytes", 4096, "--iters", 1]],
    "sampler_demo": [[]],
    "dataloader_bench": [["--dataset-size", 8, "--epochs", 1, "--num-workers", 0]],
    "distributed_eval": [[]],
    "ddp_knobs": [["--lessons", "buckets", "--bucket-caps-mb", 1, "--max-steps", 4]],  # ddp_knobs_rank<R>.json only
    "train_lm": [["--max-steps", 2, "--n-layers", 1, "--d-model", 32, "--corpus-bytes", 65536]],
    "train_hf": [["--model", "tiny", "--max-steps", 2, "--seq-len", 32, "--corpus-bytes", 65536]],
}
# Run first, in the same folder: train_hf trains a model folder, written here.
PREPARE = {"train_hf": ["--create-tiny-model", "tiny", "--arch", "llama"]}
NEEDS_GPUS = {"sync_batchnorm"}  # refuses to run without CUDA; writes no step records (syncbn_rank<R>.json)
NO_STEP_RECORDS = {"fsdp_knobs",  # needs 2 or 4 ranks; writes one JSON per rank (knobs_rank<R>.json), no steps
                   "tensor_parallel", "pipeline_parallel", "context_parallel_float8",  # tp_, pp_, cp_float8_rank<R>.json
                   "compile_train",  # compile_rank<R>.json: graphs compiled and the order of events per step
                   "ft_train"}  # one group<G>.jsonl per replica group (runs/replica_records.py; test_torchft.py)


@pytest.fixture(scope="module")
def records(tmp_path_factory, forked_python):
    """{script: [(args, record), ...]} from every run in RUNS: each rank0.jsonl line, parsed. Each run forked from
    a warm-start helper, as a launch's ranks are (18 processes: torch imported once, not 18 times)."""
    python, env = forked_python
    out = {}
    for name, variants in RUNS.items():
        for n, args in enumerate(variants):
            cwd = tmp_path_factory.mktemp(f"{name}{n}")
            if name in PREPARE:
                subprocess.run([*python, str(LESSONS_DIR / f"{name}.py"), *PREPARE[name]], cwd=cwd, check=True,
                               capture_output=True, timeout=180, env=env)
            proc = subprocess.run([*python, str(LESSONS_DIR / f"{name}.py"), *map(str, args), "--metrics-dir", "m"],
                                  cwd=cwd, capture_output=True, text=True, timeout=180, env=env)
            assert proc.returncode == 0, (name, args, proc.stderr[-2000:])
            lines = [json.loads(line) for f in sorted((cwd / "m").glob("rank*.jsonl"))
                     for line in f.read_text().splitlines()]
            out.setdefault(name, []).extend((args, row) for row in lines)
    return out


def test_every_shipped_script_is_run_here():
    assert set(RUNS) | NEEDS_GPUS | NO_STEP_RECORDS == set(available_scripts())


def test_the_docstring_shows_the_schema_table():
    table = textwrap.indent(format_schema(), "    ")
    assert table in metrics.__doc__, ("regenerate the table in tutorial_lib/runs/metrics.py's docstring from "
                                      "format_schema() (indented by 4 spaces)")
    assert all(f"{k.name:<22} {k.type:<5} {k.unit:<5} " in metrics.__doc__ for k in STEP_METRICS)


def test_units_are_in_the_key_names():
    suffix = {"s": "_s", "bytes": "_bytes", "1/s": "_per_s"}
    for key in STEP_METRICS:
        assert key.type in ("int", "float", "bool", "str") and key.when in ("always", *WHEN), key
        assert set(key.writers) <= set(ALL) and key.writers, key
        if key.unit in suffix:
            assert key.name.endswith(suffix[key.unit]), key
        else:
            assert key.unit == "-" and not key.name.endswith(("_s", "_bytes")), key
    assert len(METRIC_KEYS) == len(STEP_METRICS), "a key documented twice"


def test_every_script_writes_exactly_the_documented_keys(records):
    """Required keys present, no undocumented key, JSON types right; only the scripts in ALL write step records."""
    assert {name for name, rows in records.items() if rows} == set(ALL)
    for name, rows in records.items():
        for args, row in rows:
            assert check_step_record(row, name, device="cpu") == [], (name, args, row)


def test_every_documented_key_is_written_by_each_of_its_writers(records):
    """No key is documented for a script that never writes it (on CPU; the CUDA, fp16 and MFU keys are checked by
    scripts/gpu_check.py on GPUs)."""
    for key in STEP_METRICS:
        if key.when in ("cuda", "fp16", "known gpu"):
            continue
        for name in key.writers:
            assert any(key.name in row for _, row in records[name]), (key.name, name)


def test_a_loss_scale_is_one_key_in_every_script(records):
    """One contract for the per-step lines: a loss scale is ``loss_scale`` (the scale the step's backward used) and
    ``grad_scaler`` says whether a scaler ran, in ddp_train.py and fsdp_train.py alike, beside the same shared keys."""
    shared = {"step", "max_steps", "rank", "world_size", "device", "precision", "loss_local", "loss_global",
              "step_time_s", "samples_per_s", "grad_scaler", "loss_scale", "param_bytes", "grad_bytes",
              "optimizer_state_bytes", "rss_bytes", "peak_rss_bytes"}
    for name in ("ddp_train", "fsdp_train"):
        scaled = [row for args, row in records[name] if "--grad-scaler" in args]
        plain = [row for args, row in records[name] if "--grad-scaler" not in args]
        assert scaled[0]["grad_scaler"] is True and scaled[0]["loss_scale"] == 2.0**16, name
        assert plain[0]["grad_scaler"] is False and plain[0]["loss_scale"] == 1.0, name
        for row in scaled:
            assert shared <= set(row), (name, shared - set(row))
            assert row["grad_scaler"] is True and row["loss_scale"] == 2.0**16, (name, row)
            assert not {"grad_scale", "scale", "accum_steps"} & set(row), (name, row)
    assert not {"grad_scale", "scale", "zero_grad_elements"} & set().union(*(r for rows in records.values()
                                                                             for _, r in rows))


def test_check_step_record_names_each_problem():
    good = {"step": 1, "max_steps": 2, "rank": 0, "world_size": 2, "loss_local": 0.5, "step_time_s": 1,
            "samples_per_s": 8.0, "accumulation": "no_sync", "grad_accum_steps": 2, "all_reduce_calls": 1}
    assert check_step_record(good, "grad_accum") == []
    bad = {**good, "grad_scale": 2.0, "rank": "0", "all_reduce_calls": True}
    del bad["step_time_s"]
    problems = check_step_record(bad, "grad_accum")
    assert "missing key 'step_time_s'" in problems
    assert any(p.startswith("undocumented key 'grad_scale'") for p in problems)
    assert "'rank' should be int, got '0'" in problems and "'all_reduce_calls' should be int, got True" in problems
    trainer = {"step": 1, "max_steps": 1, "rank": 0, "world_size": 1, "loss_local": 1.0, "step_time_s": 0.1,
               "loss_global": 1.0, "local_rank": 0, "attempt": 0, "resumed_from_step": 0, "lr": 0.1, "epoch": 0,
               "param_bytes": 4, "grad_bytes": 4, "optimizer_state_bytes": 8}
    assert check_step_record({**trainer, "peak_allocated_bytes": 1, "peak_reserved_bytes": 2}, "checkpoint_train",
                             device="cuda") == []
    assert check_step_record(trainer, "checkpoint_train", device="cpu") == ["missing key 'rss_bytes'",
                                                                            "missing key 'peak_rss_bytes'"]
    with pytest.raises(MetricsError, match="script='sampler_demo' writes no per-step records"):
        check_step_record(good, "sampler_demo")
    with pytest.raises(MetricsError, match="device must be 'cpu' or 'cuda', got 'mps'"):
        check_step_record(good, "grad_accum", device="mps")
