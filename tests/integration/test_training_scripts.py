"""The shipped training scripts on their own: `python x.py` works, flags are checked, imports are torch + stdlib."""

import argparse
import ast
import functools
import json
import os
import subprocess
import sys
from unittest import mock

import pytest

from tutorial_lib.notebook.script_source import import_script
from tutorial_lib.runs.rundir import LESSONS_DIR, available_scripts, sibling_modules

SCRIPTS = available_scripts()


def run(args, cwd, **kw):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120, **kw)


# A script may also use the library it teaches: a Hugging Face model's, the Hugging Face libraries it builds on
# (transformers and its safetensors, peft for LoRA, imported only under --lora-rank); the fault-tolerant one, torchft.
HUGGING_FACE = {"train_hf": {"transformers", "safetensors", "peft"}, "ft_train": {"torchft"}}
# torchft's Manager owns the process group across replica groups (no torch default group): shut down in finally.
CLEANUP = {"ft_train": "manager.shutdown("}


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_imports_only_torch_and_the_standard_library(name):
    # and the files beside it that it imports: _workbook, the workbook's instruments, under try/except ImportError;
    # train_lm.py's lm_model, lm_data and lm_checkpoint, plainly, as nanoGPT's train.py imports model.py (issue 48)
    siblings = sibling_modules(LESSONS_DIR / f"{name}.py")
    for file in (f"{name}.py", *siblings):
        tree = ast.parse((LESSONS_DIR / file).read_text())
        modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names}
        modules |= {node.module.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module}
        beside = {sibling.removesuffix(".py") for sibling in siblings}
        outside = modules - set(sys.stdlib_module_names) - beside
        allowed = {"torch"} | HUGGING_FACE.get(name, set())  # the lesson imports them all; a file beside it no more
        assert outside == allowed if file == f"{name}.py" else outside <= {"torch"}, (file, outside)


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_follows_the_conventions(name):
    source = (LESSONS_DIR / f"{name}.py").read_text()
    tree = ast.parse(source)
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert any(isinstance(d, ast.Name) and d.id == "record" for d in main.decorator_list), "@record on main"
    assert "torchrun" in ast.get_docstring(tree) and "python " in ast.get_docstring(tree), "run card"
    assert CLEANUP.get(name, "destroy_process_group()") in source and "finally:" in source
    assert 'if __name__ == "__main__":' in source and "timeout=" in source
    # Its end: main(), then a flush and os._exit(0). On torch 2.13 a gloo thread still tidying up after the last
    # collective can abort a finished rank in the interpreter's teardown (SIGABRT, "terminate called without an
    # active exception": a copied train_hf.py did, in CI), and a DeviceMesh keeps its groups past
    # destroy_process_group(), so only leaving before the teardown prevents it; the launcher's rank runner turns
    # that os._exit into the script's end and still records it (test_rank_runner.py).
    guard = tree.body[-1]
    assert isinstance(guard, ast.If) and ast.unparse(guard.test) == "__name__ == '__main__'", "ends with its guard"
    assert [ast.unparse(node) for node in guard.body] == ["main()", "sys.stdout.flush()", "os._exit(0)"]


def test_a_failing_script_exits_with_1_and_its_traceback(tmp_path):
    out = run([LESSONS_DIR / "ddp_train.py", "--max-steps", 3, "--fail-rank", 0, "--fail-step", 2, "--metrics-dir", "m"],
              tmp_path)
    assert out.returncode == 1
    assert "Traceback (most recent call last)" in out.stderr
    assert "RuntimeError: injected failure on rank 0 at step 2" in out.stderr


def test_ddp_train_runs_as_a_single_process_and_writes_one_json_line_per_step(tmp_path):
    out = run([LESSONS_DIR / "ddp_train.py", "--max-steps", 3, "--log-every", 1, "--metrics-dir", "m"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert [line.split(":")[0] for line in out.stdout.splitlines() if ": loss " in line] == ["step 1/3", "step 2/3", "step 3/3"]
    rows = [json.loads(line) for line in (tmp_path / "m" / "rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("rank", "local_rank", "world_size", "loss_local", "loss_global", "step_time_s", "samples_per_s",
                "param_bytes", "grad_bytes", "optimizer_state_bytes", "rss_bytes", "peak_rss_bytes"):
        assert key in rows[0], key
    assert rows[0]["world_size"] == 1 and rows[0]["loss_local"] == rows[0]["loss_global"]
    assert rows[-1]["grad_bytes"] == rows[-1]["param_bytes"] > 0
    assert rows[-1]["rss_bytes"] > 50 * 2**20, "RSS includes the torch import"


def test_collectives_check_runs_as_a_world_of_one(tmp_path):
    out = run([LESSONS_DIR / "collectives_check.py", "--metrics-dir", "m", "--sizes-bytes", 4096, "--iters", 2], tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "m" / "collectives_rank0.json").read_text())
    assert result["world_size"] == 1 and all(c["ok"] for c in result["checks"])
    assert result["bandwidth"][0]["size_bytes"] == 4096 and result["bandwidth"][0]["time_s"] > 0


@pytest.mark.parametrize("args, message", [
    (["--max-steps", "-1"], "--max-steps must be > 0, got -1"),
    (["--max-steps", "two"], "invalid int value: 'two'"),
    (["--pg-timeout-s", "0"], "--pg-timeout-s must be > 0"),
    (["--optimizer", "lion"], "invalid choice: 'lion'"),
    (["--bucket-cap-mb", "0"], "--bucket-cap-mb must be > 0, got 0.0"),
    (["--no-optimize-ddp"], "--no-optimize-ddp changes how torch.compile splits the graph: it needs --compile"),
])
def test_bad_flags_fail_fast_with_the_value_named(tmp_path, args, message, forked_python):
    python, env = forked_python  # the arguments' check is the point, not the start-up: torch imported once
    out = subprocess.run([*python, str(LESSONS_DIR / "ddp_train.py"), *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 2 and message in out.stderr
    assert not (tmp_path / "metrics").exists()


SMALL_ARGS = {
    "ddp_train": ["--max-steps", 2], "collectives_check": ["--sizes-bytes", 4096, "--iters", 1],
    "sampler_demo": [], "dataloader_bench": ["--dataset-size", 8, "--epochs", 1, "--num-workers", 0],
    "grad_accum": ["--max-steps", 1], "uneven_inputs": [], "unused_params": ["--loss-uses", "both", "--max-steps", 2],
    "fsdp_train": ["--max-steps", 1, "--dim", 32, "--n-layers", 1], "model_parallel": ["--max-steps", 1],
    "checkpoint_train": ["--max-steps", 2, "--save-every", 1],
    "collective_mismatch": ["--max-steps", 2], "distributed_eval": [],
    "fsdp_knobs": ["--dim", 16, "--n-layers", 1],
    "ddp_knobs": ["--lessons", "static_graph", "--max-steps", 4],
    "tensor_parallel": ["--lessons", "block", "sequence", "model", "--max-steps", 2, "--dim", 32],
    "pipeline_parallel": ["--microbatches", 1, 2, "--input-dim", 16, "--hidden-dim", 32, "--batch-size", 8],
    "context_parallel_float8": ["--seq-len", 64],
    "train_lm": ["--max-steps", 2, "--n-layers", 1, "--d-model", 32, "--corpus-bytes", 65536],
    "compile_train": ["--max-steps", 2, "--n-layers", 2, "--dim", 16],
    "train_hf": ["--model", "tiny", "--max-steps", 2, "--seq-len", 32, "--corpus-bytes", 65536],
    "ft_train": ["--max-steps", 2],
}
PREPARE = {"train_hf": ["--create-tiny-model", "tiny"]}  # run first in the same folder: the model folder it trains


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s != "sync_batchnorm"])
def test_every_script_runs_as_plain_python(tmp_path, name):
    # a TMPDIR of its own: a world of one leaves nothing there but torch's own empty folders (a FileStore's folder
    # in /tmp once stayed behind on every run of three scripts)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    if name in PREPARE:
        assert run([LESSONS_DIR / f"{name}.py", *PREPARE[name]], tmp_path, env=env).returncode == 0
    deterministic = ["--deterministic"] if name in ("train_lm", "train_hf") else []  # issue 46: for a CUDA resume
    out = run([LESSONS_DIR / f"{name}.py", *SMALL_ARGS[name], "--metrics-dir", "m", *deterministic], tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert list((tmp_path / "m").iterdir()), "it wrote its results"
    temp = list((tmp_path / "tmp").iterdir())
    assert all(p.name.startswith("torchinductor_") for p in temp), [p.name for p in temp]
    assert [p for p in (tmp_path / "tmp").rglob("*") if not p.is_dir()] == []
    if deterministic:  # what torch says it ran with, not what was asked
        assert json.loads((tmp_path / "m" / "model_rank0.json").read_text())["deterministic_algorithms"] is True


@pytest.mark.parametrize("name", SCRIPTS)
def test_what_c_code_wrote_to_a_redirected_stdout_survives_the_rank_runners_exit(name, tmp_path):
    """NCCL writes its INFO lines with C stdio, block-buffered when torchrun sends stdout to a file; the rank runner
    leaves through os._exit, which would drop them: it flushes C stdio first. Here a C printf stands in for NCCL
    and ``--help`` ends the script. Without PYTHONUNBUFFERED (which the launcher sets, and which makes C stdio
    unbuffered too), as under a learner's own torchrun."""
    from tutorial_lib.launcher.plan import RANK_RUNNER
    code = ("import ctypes, runpy, sys\n"
            "ctypes.CDLL(None).printf(b'C stdio line, as NCCL INFO writes it\\n')\n"
            f"sys.argv = [{str(RANK_RUNNER)!r}, {str(LESSONS_DIR / (name + '.py'))!r}, '--help']\n"
            f"runpy.run_path({str(RANK_RUNNER)!r}, run_name='__main__')\n")
    out = tmp_path / "stdout.log"
    with open(out, "w") as stdout:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        proc = subprocess.run([sys.executable, "-c", code], stdout=stdout, stderr=subprocess.PIPE, text=True,
                              timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "usage:" in text and "C stdio line, as NCCL INFO writes it" in text



@pytest.mark.parametrize("name, args, printed", [
    ("fsdp_train", ["--strategy", "fsdp2", "--dim", 32, "--n-layers", 1, "--max-steps", 2], "step 2/2 loss_global "),
    ("checkpoint_train", ["--max-steps", 2, "--save-every", 2], "step 2: saved step-2 (dcp)"),
    ("pipeline_parallel", ["--microbatches", 2, "--input-dim", 16, "--hidden-dim", 32, "--batch-size", 8],
     "stage 0 of 1, 1f1b, 2 micro-batch(es): loss "),
])
def test_a_lesson_copied_alone_trains_without_the_workbooks_instruments(tmp_path, name, args, printed):
    """Issue 48: the lesson imports ``_workbook.py`` only when it is beside it; a copy alone trains, writes no metrics
    and has none of the workbook's flags."""
    (tmp_path / f"{name}.py").write_bytes((LESSONS_DIR / f"{name}.py").read_bytes())
    out = run([f"{name}.py", *args], tmp_path)
    assert out.returncode == 0 and printed in out.stdout, out.stderr[-2000:]
    assert not (tmp_path / "metrics").exists() and not (tmp_path / "_workbook.py").exists()
    refused = run([f"{name}.py", "--metrics-dir", "m"], tmp_path)
    assert refused.returncode == 2 and "unrecognized arguments: --metrics-dir" in refused.stderr

# --- one name per concept across the scripts (issue 17) ---------------------------------------------------------

# A concept the scripts share -> its one flag, and the names it once had in some script (which must not come back).
FLAG_SYNONYMS = {
    "--grad-scaler": {"--no-grad-scaler", "--scaler", "--use-scaler", "--amp-scaler"},
    "--grad-accum-steps": {"--accum-steps", "--accumulation-steps", "--gradient-accumulation-steps"},
    "--batch-size": {"--micro-batch-size", "--micro-batch"},
    "--fail-rank": {"--skip-rank"},
    "--fail-step": {"--skip-step"},
    "--n-layers": {"--layers", "--num-layers"},
    "--input-dim": {"--features", "--in-features"},
    "--pg-timeout-s": {"--timeout", "--timeout-s", "--pg-timeout"},
}


def parser_of(name):
    """The script's own ArgumentParser, as its parse_args builds it (caught at its ``p.parse_args`` call), with the
    flags of the ``_workbook.py`` beside it when it imports that (as in a workbook run)."""
    module = import_script(LESSONS_DIR / f"{name}.py")

    class Caught(Exception):
        pass

    def catch(parser, *args, **kwargs):
        raise Caught(parser)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch), pytest.raises(Caught) as info:
        module.parse_args([])
    return info.value.args[0]


@functools.lru_cache(maxsize=1)
def flag_table():
    """{flag: {script: (action class, type name, choices)}} over every shipped script."""
    table = {}
    for name in SCRIPTS:
        for action in parser_of(name)._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    table.setdefault(flag, {})[name] = (type(action).__name__, getattr(action.type, "__name__", None),
                                                        tuple(action.choices) if action.choices else None)
    return table


def test_a_shared_concept_has_one_flag_name_in_every_script():
    table = flag_table()
    for canonical, synonyms in FLAG_SYNONYMS.items():
        found = {flag: sorted(table[flag]) for flag in synonyms if flag in table}
        assert not found, f"use {canonical} for this concept, not {found}"
    # Every script with fp16 (so a gradient scaler), accumulation or failure injection names it the same way.
    for name in SCRIPTS:
        source = (LESSONS_DIR / f"{name}.py").read_text()
        flags = {flag for flag, scripts in table.items() if name in scripts}
        if "fp16" in (table.get("--precision", {}).get(name) or (None, None, ()))[2]:  # fp16: a scaler to switch
            assert "--grad-scaler" in flags and table["--grad-scaler"][name][2] == ("auto", "on", "off"), name
        if "no_sync()" in source and "micro" in source:
            assert {"--grad-accum-steps", "--batch-size"} <= flags, name
        if "--fail-" in source:
            assert {"--fail-rank", "--fail-step"} <= flags, name


PER_SCRIPT_CHOICES = {"--fail-mode", "--strategy", "--lessons"}  # each script lists what it can do
# The same values, some scripts offering fewer (train_hf.py has no loss scaler, so no fp16).
SUBSET_CHOICES = {"--precision": ("fp32", "bf16", "fp16")}


def test_a_flag_has_the_same_type_and_choices_in_every_script_that_has_it():
    for flag, scripts in flag_table().items():
        if flag in SUBSET_CHOICES:
            assert len({(kind, type_name) for kind, type_name, _ in scripts.values()}) == 1, (flag, scripts)
            assert all(set(choices) <= set(SUBSET_CHOICES[flag]) for _, _, choices in scripts.values()), scripts
        elif flag in PER_SCRIPT_CHOICES:
            assert len({(kind, type_name) for kind, type_name, _ in scripts.values()}) == 1, (flag, scripts)
        else:
            assert len(set(scripts.values())) == 1, (flag, scripts)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_a_clear_error_in_every_script(tmp_path, forked_python):
    """Not torch's ``AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'`` from set_device. Each
    script forked from a warm-start helper, as a launch's ranks are (torch imported once, not once per script)."""
    python, env = forked_python
    takes_device = [name for name in SCRIPTS if "--device" in (LESSONS_DIR / f"{name}.py").read_text()]
    assert len(takes_device) >= 12, takes_device
    for name in takes_device:
        proc = subprocess.run([*python, str(LESSONS_DIR / f"{name}.py"), "--device", "cuda"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode != 0 and "--device cuda" in proc.stderr and "is False" in proc.stderr, (name, proc.stderr[-800:])
        assert "AttributeError" not in proc.stderr, (name, proc.stderr[-800:])
