"""Mixed precision (notebook 03): ddp_train.py's --precision path, the scaler's behaviour, and
tutorial_lib.probes.precision.

Scripts run with FutureWarning and DeprecationWarning as errors, so a deprecated torch API (such as
``torch.cuda.amp.GradScaler``) fails these tests instead of printing a warning.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.runs.rundir import LESSONS_DIR

ROOT = Path(__file__).resolve().parents[2]
PRECISIONS = [p for p in ("fp32", "bf16", "fp16") if tl.probes.autocast_supported(p, "cpu")]
STRICT = ["-W", "error::FutureWarning", "-W", "error::DeprecationWarning"]


def train(tmp_path, tag, *args, steps=5):
    """Run ddp_train.py as one process (warnings as errors); return its rows."""
    out = subprocess.run([sys.executable, *STRICT, LESSONS_DIR / "ddp_train.py", "--max-steps", str(steps),
                          "--metrics-dir", tag, *map(str, args)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in (tmp_path / tag / "rank0.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def fp32_reference(tmp_path_factory):
    return train(tmp_path_factory.mktemp("fp32"), "reference", "--precision", "fp32")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_supported_precision_trains_like_fp32_without_deprecation_warnings(tmp_path, precision, fp32_reference):
    reference = fp32_reference
    rows = train(tmp_path, precision, "--precision", precision)
    assert [r["precision"] for r in rows] == [precision] * 5
    assert all(r["grad_scaler"] == (precision == "fp16") for r in rows)
    assert rows[-1]["loss_scale"] == (2.0**16 if precision == "fp16" else 1.0)
    assert rows[-1]["optimizer_steps"] == 5 and not any(r["step_skipped"] for r in rows)
    assert rows[-1]["loss_global"] < rows[0]["loss_global"]
    for mine, ref in zip(rows, reference):
        assert abs(mine["loss_global"] - ref["loss_global"]) / ref["loss_global"] < 0.02
    assert rows[-1]["param_bytes"] == reference[-1]["param_bytes"], "parameters stay fp32"


@pytest.mark.skipif("fp16" not in PRECISIONS, reason="this torch has no fp16 autocast on CPU")
def test_fp16_gradients_underflow_without_a_scaler_and_survive_with_one(tmp_path):
    weight = ["--precision", "fp16", "--loss-weight", 1e-5]
    lost = train(tmp_path, "off", *weight, "--grad-scaler", "off", steps=1)[0]
    kept = train(tmp_path, "on", *weight, steps=1)[0]
    fp32 = train(tmp_path, "fp32", "--loss-weight", 1e-5, steps=1)[0]
    assert lost["grad_zero_fraction"] > 0.9
    assert kept["grad_zero_fraction"] == pytest.approx(fp32["grad_zero_fraction"], abs=0.01)
    assert kept["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.01)


@pytest.mark.skipif("fp16" not in PRECISIONS, reason="this torch has no fp16 autocast on CPU")
def test_overflowing_steps_are_skipped_and_halve_the_scale(tmp_path):
    rows = train(tmp_path, "overflow", "--precision", "fp16", "--init-scale", 2.0**24, steps=10)
    skipped = [r["step_skipped"] for r in rows]
    assert skipped[0] and not skipped[-1]
    assert rows[-1]["optimizer_steps"] == 10 - sum(skipped), "a skipped step never calls optimizer.step()"
    for before, after in zip(rows, rows[1:]):
        assert after["loss_scale"] == (before["loss_scale"] / 2 if before["step_skipped"] else before["loss_scale"])


@pytest.mark.skipif("fp16" not in PRECISIONS, reason="this torch has no fp16 autocast on CPU")
def test_clipping_before_unscale_sees_the_scaled_gradient_norm(tmp_path):
    right = train(tmp_path, "right", "--precision", "fp16", "--clip-grad-norm", 1.0, steps=1)[0]
    wrong = train(tmp_path, "wrong", "--precision", "fp16", "--clip-grad-norm", 1.0, "--clip-before-unscale", steps=1)[0]
    assert wrong["grad_norm"] / right["grad_norm"] == pytest.approx(2.0**16, rel=0.01)


@pytest.mark.skipif("bf16" not in PRECISIONS, reason="this torch has no bf16 autocast on CPU")
def test_a_scaler_changes_nothing_in_bf16(tmp_path):
    plain = train(tmp_path, "plain", "--precision", "bf16", steps=4)
    scaled = train(tmp_path, "scaled", "--precision", "bf16", "--grad-scaler", "on", steps=4)
    assert [r["loss_global"] for r in plain] == [r["loss_global"] for r in scaled]
    assert scaled[-1]["grad_scaler"] and scaled[-1]["loss_scale"] == 2.0**16


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp8"], "invalid choice: 'fp8'"),
    (["--init-scale", "0"], "--init-scale must be > 0, got 0.0"),
    (["--loss-weight", "-1"], "--loss-weight must be > 0, got -1.0"),
    (["--clip-grad-norm", "-1"], "--clip-grad-norm must be >= 0"),
    (["--clip-before-unscale"], "--clip-before-unscale needs --clip-grad-norm > 0"),
])
def test_bad_precision_flags_fail_before_training(tmp_path, args, message, forked_python):
    python, env = forked_python  # the refusal is the point, not the start-up: torch imported once
    out = subprocess.run([*python, LESSONS_DIR / "ddp_train.py", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 2 and message in out.stderr
    assert not (tmp_path / "metrics").exists()


@pytest.mark.integration
@pytest.mark.skipif("fp16" not in PRECISIONS, reason="this torch has no fp16 autocast on CPU")
def test_fp16_under_ddp_ranks_agree_on_every_scaler_decision(run_root):
    result = tl.run_script("ddp_train", ["--max-steps", 8, "--precision", "fp16", "--init-scale", 2.0**20],
                           runs_dir=run_root, device="cpu", nproc_per_node=2, timeout_s=120)
    m = result.metrics()
    by_rank = {rank: df.sort_values("step") for rank, df in m.groupby("rank")}
    for column in ("loss_scale", "step_skipped", "optimizer_steps", "loss_global"):
        assert by_rank[0][column].tolist() == by_rank[1][column].tolist(), column
    assert by_rank[0]["step_skipped"].any(), "2**20 overflows the first step"
    # Each rank's local loss is its own slice's (the global one is their mean): they differ.
    assert (by_rank[0]["loss_local"].to_numpy() != by_rank[1]["loss_local"].to_numpy()).all()


# --- tutorial_lib.probes.precision and summarize_runs --------------------------------------------------------

def test_op_dtypes_show_matmuls_in_bf16_and_the_loss_in_fp32_only_inside_autocast():
    inside = tl.probes.autocast_op_dtypes("bf16", "cpu")
    outside = tl.probes.autocast_op_dtypes("bf16", "cpu", loss_inside_autocast=False)
    assert list(inside.columns) == ["op", "input_dtypes", "output_dtype", "reduced", "where"]
    assert inside.query("op == 'linear'")["output_dtype"].tolist() == ["bfloat16", "bfloat16"]
    assert inside.query("where == 'loss'")[["op", "output_dtype"]].values.tolist() == [["cross_entropy", "float32"]]
    assert outside.query("where == 'loss'")["output_dtype"].tolist() == ["bfloat16"]
    assert inside.loc[0, "input_dtypes"] == "float32", "parameters and inputs stay fp32; autocast casts per op"


def test_op_dtypes_of_a_custom_model_and_loss():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    table = tl.probes.autocast_op_dtypes("bf16", "cpu", model=model, inputs=torch.ones(2, 4),
                                  loss_fn=lambda out: out.float().pow(2).mean())
    assert table["op"].tolist()[:2] == ["linear", "relu"]
    assert table.query("where == 'loss'")["output_dtype"].tolist()[-1] == "float32"


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "fp8"}, "precision='fp8' is not an autocast dtype"),
    ({"device": "tpu"}, "device='tpu'"),
])
def test_op_dtypes_refuse_bad_input(kwargs, message):
    with pytest.raises(tl.ConfigError, match=message):
        tl.probes.autocast_op_dtypes(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_is_refused_without_a_gpu():
    with pytest.raises(tl.ConfigError, match="torch.cuda.is_available"):
        tl.probes.autocast_op_dtypes("bf16", "cuda")
    assert tl.probes.autocast_supported("bf16", "cuda") is False


def test_autocast_supported():
    assert tl.probes.autocast_supported("fp32") and tl.probes.autocast_supported("bf16", "cpu")
    with pytest.raises(tl.ConfigError, match="precision='int8'"):
        tl.probes.autocast_supported("int8")


def test_float_formats_match_the_ieee_and_bf16_definitions():
    f = tl.probes.float_formats()
    assert f.loc["fp16", "max"] == 65504 and f.loc["fp16", "smallest_subnormal"] == 2.0**-24
    assert f.loc["bf16", "smallest_normal"] == f.loc["fp32", "smallest_normal"] == 2.0**-126
    assert f.loc["bf16", "eps"] == 2.0**-7 and f.loc["fp16", "eps"] == 2.0**-10


def test_cpu_low_precision_flags_are_known_flags():
    assert set(tl.probes.cpu_low_precision_flags()) <= {"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"}


def _metrics(losses, skipped=None, scale=1.0, rss=100 * 2**20):
    rows = []
    for rank in (0, 1):
        for step, loss in enumerate(losses, 1):
            row = {"rank": rank, "step": step, "loss_global": loss, "step_time_s": 0.1 * step,
                   "global_samples_per_s": 10.0 / step, "peak_rss_bytes": rss + rank * 2**20}
            if skipped is not None:
                row.update(step_skipped=skipped[step - 1], loss_scale=scale)
            rows.append(row)
    return pd.DataFrame(rows)


def test_summarize_runs_by_hand():
    table = tl.runs.summarize_runs({"a": _metrics([1.0, 0.5, 0.25]), "b": _metrics([1.0, 0.6, 0.3], [True, False, False], 8.0)},
                              baseline="a")
    assert table.loc["b", "final_loss"] == 0.3 and table.loc["b", "loss_diff_vs_baseline"] == pytest.approx(0.05)
    assert table.loc["a", "median_step_time_s"] == pytest.approx(0.25), "steps after the first: 0.2 and 0.3"
    assert table.loc["a", "peak_memory_mib"] == 101, "the largest rank's peak"
    assert table.loc["b", "skipped_steps"] == 1 and table.loc["b", "final_loss_scale"] == 8.0
    assert pd.isna(table.loc["a", "skipped_steps"])


def test_summarize_runs_errors():
    with pytest.raises(tl.errors.MetricsError, match="baseline='c' is not one of the runs"):
        tl.runs.summarize_runs({"a": _metrics([1.0])}, baseline="c")
    with pytest.raises(tl.errors.MetricsError, match="run 'a' has no metrics rows"):
        tl.runs.summarize_runs({"a": pd.DataFrame(columns=["rank", "step"])})


def test_plot_loss_scale_marks_the_skipped_steps():
    fig = tl.plots.plot_loss_scale(_metrics([1.0, 0.9, 0.8], [True, True, False], 4.0))
    (ax,) = fig.axes
    assert ax.get_yscale() == "log" and "skipped (inf/NaN gradients): 2" in [t.get_text() for t in ax.get_legend().texts]


def test_show_script_between_two_texts(tmp_path):
    script = tl.write_script("ddp_train", tmp_path)
    listing = tl.show_script(script, between=("use_scaler =", "scaler.update()"))
    text = str(listing)
    assert "torch.amp.GradScaler(device.type" in text and "scaler.update()" in text
    assert "def parse_args" not in text
    with pytest.raises(tl.ConfigError, match="no line containing 'no such text'"):
        tl.show_script(script, between=("use_scaler =", "no such text"))


# --- no deprecated AMP API anywhere we ship ----------------------------------------------------------------

DEPRECATED = {"torch.cuda.amp", "torch.cpu.amp"}


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _shown_as_history(tree):
    """Line numbers inside ``with warnings.catch_warnings(...)``: a deprecated call made to show its warning."""
    lines = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.With) and any(isinstance(i.context_expr, ast.Call)
                                           and _dotted(i.context_expr.func) == "warnings.catch_warnings"
                                           for i in n.items):
            lines.update(range(n.lineno, n.end_lineno + 1))
    return lines


def _deprecated_uses(source, where):
    tree = ast.parse(source)
    history = _shown_as_history(tree)
    found = [f"{where}:{n.lineno}: {_dotted(n)}" for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and any(_dotted(n).startswith(d) for d in DEPRECATED)
             and n.lineno not in history]
    found += [f"{where}:{n.lineno}: import {n.module}" for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module and any(n.module.startswith(d) for d in DEPRECATED)]
    return found


def python_of(cell_source):
    """A code cell as Python: a ``%%writefile`` cell's body is the file it writes (a script, scanned as one); other
    magics as IPython runs them (``get_ipython()`` calls)."""
    from IPython.core.inputtransformer2 import TransformerManager

    if cell_source.startswith("%%writefile"):
        return cell_source.split("\n", 1)[1] if "\n" in cell_source else ""
    return TransformerManager().transform_cell(cell_source)


def test_no_deprecated_amp_api_in_code_or_notebooks():
    found = []
    for path in [*(ROOT / "tutorial_lib").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]:
        found += _deprecated_uses(path.read_text(), path.relative_to(ROOT))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            # An exercise's starter may hold the deprecated call as the mistake to fix (03.1: torch.cuda.amp's
            # GradScaler, disabled on a machine without CUDA); its solution, scanned above, uses torch.amp.
            if cell.cell_type == "code" and "exercise-starter" not in cell.metadata.get("tags", []):
                found += _deprecated_uses(python_of(cell.source), f"{path.name} cell {i}")
    assert not found, found
    assert _deprecated_uses("scaler = torch.cuda.amp.GradScaler()", "probe"), "the scan finds a real use"
    shown = "with warnings.catch_warnings(record=True) as caught:\n    scaler = torch.cuda.amp.GradScaler()"
    assert not _deprecated_uses(shown, "probe"), "a use whose warning is captured and shown is history, allowed"
    assert _deprecated_uses(python_of("%%writefile train.py\nscaler = torch.cuda.amp.GradScaler()"), "probe"), \
        "a script written by a cell is scanned too"
