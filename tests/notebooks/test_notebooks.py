"""Notebooks as a user runs them: papermill with parameters, and a failing rank failing the cell."""

import io
import json
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import nbformat
import papermill as pm
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_thin_and_parameterised(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and code.index(tagged[0]) == 1, "second code cell is the papermill parameters cell"
    for name in ("NPROC", "DEVICE", "RUNS_DIR", "TIMEOUT_S", "RANK_ENV"):
        assert re.search(rf"^{name}: [\w\[\]]+ = ", tagged[0].source, re.M), name  # typed, for tl.check_parameters
    starters = [c for c in code if "exercise-starter" in c.metadata.get("tags", [])]
    assert all(len(c.source.splitlines()) <= 15 for c in code if c not in starters), \
        "cells stay short: the logic is in tutorial_lib"
    # A starter is a whole training script with --seed and the sizes a check varies: one screen, read whole (40 lines);
    # 12.4 hands over two transformer blocks to write a whole TP plan for (60).
    longest = {("12_tensor_and_pipeline_parallel", "{ex4.script}"): 60}
    for c in starters:
        limit = longest.get((path.stem.split("/")[-1], c.source.split()[1]), 40)
        assert len(c.source.splitlines()) <= limit, f"an exercise's script is short enough to read whole: {c.source[:40]}"
    checked = [c for c in code if "nbval-check-output" in c.metadata.get("tags", [])]
    assert not any("NBVAL_" in c.source for c in code), "nbval's cell tags, not comments in the code a learner reads"
    assert checked, "claims are checked by nbval"
    for cell in checked:
        assert "assert" in cell.source and cell.execution_count and cell.outputs, \
            "checked cells carry reference outputs (run scripts/store_nbval_outputs.py)"


# What a run directory holds is named by library calls (tl.script_path, tl.runs.read_command, tl.runs.read_output_log,
# tl.runs.read_rank_tensors, tl.runs.trace_files, tl.runs.checkpoint_dir, tl.runs.read_loaded_state,
# tl.runs.load_checkpoint_state, ...), never spelled out in a cell (issue 27): a cell that knows the layout breaks when the layout changes.
RUN_DIR_PLUMBING = {
    r"\b\w*_dir\s*/(?![/=])": "a path joined onto a run directory (`run_dir / ...`, `.run_dir / ...`)",
    r"\brun_dir\.(?:r?glob|iterdir)\(": "a glob over a run directory",
    r"command\.txt": "command.txt read by hand (tl.runs.read_command)",
    r"output\.log": "output.log read by hand (tl.runs.read_output_log)",
    r"trace_rank": "trace files found by hand (tl.runs.trace_files)",
    r"dcp_to_torch_save\(": "a checkpoint converted by hand (tl.runs.load_checkpoint_state)",
}


def code_lines(source: str) -> list[str]:
    """The lines of a code cell without their comments (prose in a comment may name a file)."""
    lines = source.splitlines()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                row, col = token.start
                lines[row - 1] = lines[row - 1][:col]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # not plain Python (a magic): every line, comments included
    return lines


def run_dir_plumbing(source: str) -> list[str]:
    """The lines of a cell's ``source`` that reach into a run directory by hand, each with the reason."""
    return [f"{line.strip()}  <- {why}" for line in code_lines(source) for pattern, why in RUN_DIR_PLUMBING.items()
            if re.search(pattern, line)]


def test_run_dir_plumbing_is_found():
    """The check below can fail: each kind of plumbing the notebooks once held is caught, the named calls are not."""
    caught = ['ddp_state = tl.runs.load_checkpoint_state(ddp.run_dir / "checkpoints" / f"step-{SAVE_EVERY}")',
              'print((result.run_dir / "command.txt").read_text())', 'ddp_grads = [torch.load(ddp_dir / "grads")]',
              'log = open(e.run_dir/"output.log").read()', 'assert not list(port_error.run_dir.rglob("stdout.log"))',
              'print(*sorted(p.name for p in metrics_path.glob("trace_rank*.json")))',
              "    dcp_to_torch_save(step_dir, converted_file)"]
    assert [len(run_dir_plumbing(line)) >= 1 for line in caught] == [True] * len(caught)
    named = ["tl.show_script(tl.script_path(fsdp2.run_dir), 'wrap_fsdp2')", "x = tl.runs.read_output_log(e.run_dir)",
             "half = total_dir_bytes / 2  # a division", "a = b // c",
             "tl.runs.list_checkpoints(tl.runs.checkpoint_dir(crash.run_dir))  # the folder of step-N/ checkpoints",
             "x = 1  # the output.log keeps every line (a comment may name a file)"]
    assert [run_dir_plumbing(line) for line in named] == [[]] * len(named)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_cells_name_the_parts_of_a_run_directory_with_library_calls(path):
    """No `run_dir / ...` in a cell, no hand reads of command.txt or output.log, no globs for trace files (issue 27)."""
    nb = nbformat.read(path, as_version=4)
    found = [line for c in nb.cells if c.cell_type == "code" for line in run_dir_plumbing(c.source)]
    assert not found, "\n".join(found)


DEVICE_DEPENDENT = re.compile(r"\{[^}]*\b(world_size|plan\b|nproc_per_node|gpu_count|device|backend|len\(shards\))")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_checked_outputs_do_not_depend_on_the_device_or_the_rank_count(path):
    """nbval compares the stored text on GPUs too: a checked cell prints no rank count, device or backend."""
    nb = nbformat.read(path, as_version=4)
    for cell in (c for c in nb.cells if c.cell_type == "code" and "nbval-check-output" in c.metadata.get("tags", [])):
        for line in cell.source.splitlines():
            if ("print(" in line or line.lstrip().startswith(('f"', "f'"))) and "# same on every device" not in line:
                assert not DEVICE_DEPENDENT.search(line), f"device-dependent checked output: {line.strip()}"


def test_a_raising_rank_fails_the_cell_with_the_library_error(tmp_path):
    out = tmp_path / "crash_rank1.ipynb"
    with pytest.raises(pm.PapermillExecutionError) as info:
        pm.execute_notebook(ROOT / "tests" / "fixtures" / "notebooks" / "crash_rank1.ipynb", out,
                            parameters={"RUNS_DIR": str(tmp_path / "runs")}, kernel_name="python3",
                            progress_bar=False, cwd=str(tmp_path))
    e = info.value
    assert e.ename == "LaunchError"
    assert e.evalue.startswith("ddp_train.py failed on rank 1 (exit code 1)")
    assert "RuntimeError: injected failure on rank 1 at step 2" in e.evalue
    cell = nbformat.read(out, as_version=4).cells[-1]
    assert any(o.get("ename") == "LaunchError" for o in cell.outputs), "the failing cell shows the error"


def test_run_workbook_passes_parameters_down_to_the_training_processes(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_workbook.py"), "--output-dir", str(tmp_path),
                           "--only", "00_environment_check", "-p", "NPROC", "3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed, 0 failed" in proc.stdout
    results = list((tmp_path / "runs").glob("*-collectives/metrics/collectives_rank*.json"))
    assert len(results) == 3, "NPROC=3 reached torchrun: three ranks ran"
    assert {json.loads(p.read_text())["world_size"] for p in results} == {3}
    assert (tmp_path / "00_environment_check.ipynb").exists()


def test_the_chinese_edition_runs_under_papermill_as_make_workbook_edition_zh_runs_it(tmp_path):
    """A Chinese twin (notebooks/zh/, issue 31) executes from its own folder like an English notebook: its code is the
    English code (tests/notebooks/test_twins.py), its prose stays Chinese in the executed copy. nbval runs every twin
    too (pytest collects notebooks/ recursively)."""
    twin = ROOT / "notebooks" / "zh" / "00_environment_check.ipynb"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_workbook.py"), "--notebooks-dir",
                           str(twin.parent), "--output-dir", str(tmp_path), "--only", twin.stem],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed, 0 failed" in proc.stdout
    executed = nbformat.read(tmp_path / twin.name, as_version=4)
    prose = [c.source for c in executed.cells if c.cell_type == "markdown"]
    assert prose == [c.source for c in nbformat.read(twin, as_version=4).cells if c.cell_type == "markdown"]
    assert re.search(r"[\u4e00-\u9fff]", prose[0]), prose[0]
    assert len(list((tmp_path / "runs").glob("*-collectives/metrics/collectives_rank*.json"))) == 2, "2 ranks ran"


def test_run_workbook_reports_a_failing_notebook_and_exits_non_zero(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_workbook.py"), "--output-dir", str(tmp_path),
                           "--only", "00_environment_check", "-p", "NPROC", "two"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    # The notebook's first cell checks the declared parameter types and names the flag that gives a good value.
    assert ("ConfigError: parameter NPROC must be int or None, got 'two' (str); from the command line: -p NPROC 2"
            in proc.stdout), proc.stdout[-3000:]
    assert "0 passed, 1 failed" in proc.stdout
    assert not list((tmp_path / "runs").glob("*/command.txt")), "nothing was launched"


@pytest.mark.parametrize("flag, hint", [(["-p", "NPROCS", "3"], "did you mean NPROC? "),
                                        (["-y", "NOT_A_PARAM: 1"], "declared: DEVICE, NPROC, ")])
def test_run_workbook_refuses_a_parameter_no_notebook_declares_before_running_anything(tmp_path, flag, hint):
    """Issue 26: a typo (`-p NPROCS 3`) used to get papermill's warning, then "1 passed" with the default NPROC."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_workbook.py"), "--output-dir",
                           str(tmp_path / "out"), "--only", "00_environment_check", *flag],
                          capture_output=True, text=True, timeout=300)
    name = flag[1].split(":")[0]
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"parameter {name!r}: no notebook to run declares it; {hint}" in proc.stderr, proc.stderr
    assert "did you mean" not in proc.stderr or name == "NPROCS", "no close name, no guess"
    assert not (tmp_path / "out").exists() and "passed" not in proc.stdout, "nothing ran"


def test_a_parameter_declared_by_one_notebook_of_the_batch_is_accepted(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from run_workbook import undeclared_parameters
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    paths = []
    for name, params in [("01_a", "NPROC = None"), ("02_b", "NPROC = None\nMAX_STEPS = 3")]:
        nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                               "language": "python"}})
        nb.cells = [nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]})]
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        paths.append(tmp_path / f"{name}.ipynb")
    assert undeclared_parameters({"NPROC": 2, "MAX_STEPS": 5}, paths) == [], "MAX_STEPS: 02_b declares it"
    assert undeclared_parameters({"MAX_STEPS": 5, "MAX_STEP": 5}, paths[:1]) == [
        "parameter 'MAX_STEPS': no notebook to run declares it; declared: NPROC",
        "parameter 'MAX_STEP': no notebook to run declares it; declared: NPROC"]
    assert undeclared_parameters({"MAX_STEP": 5}, paths) == [
        "parameter 'MAX_STEP': no notebook to run declares it; did you mean MAX_STEPS? declared: MAX_STEPS, NPROC"]


def test_run_workbook_passes_none_as_none_like_papermill(tmp_path):
    """Issue 17's input 2: `-p NPROC None` used to reach the notebook as the string 'None' and fail."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_workbook.py"), "--output-dir", str(tmp_path),
                           "--only", "00_environment_check", "-p", "NPROC", "None"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "1 passed, 0 failed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_run_workbook_gives_every_notebook_its_row_even_a_bare_assert(tmp_path):
    """A failing assert without a message (empty evalue) must not crash the runner; later notebooks still run."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name, source in [("01_bare_assert", "x = 1\nassert 1 + 1 == 3\nx = 2"), ("02_raises_empty", "raise RuntimeError()"),
                         ("03_fine", "x = 1\nassert x == 1")]:
        nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                               "language": "python"}})
        nb.cells = [nbformat.v4.new_code_cell("NPROC = None", metadata={"tags": ["parameters"]}),
                    nbformat.v4.new_code_cell(source)]
        nbformat.write(nb, notebooks / f"{name}.ipynb")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_workbook.py"), "--notebooks-dir", str(notebooks),
                           "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith("0") and "  " in line}
    assert set(rows) == {"01_bare_assert.ipynb", "02_raises_empty.ipynb", "03_fine.ipynb"}, proc.stdout
    # The failing line is named (CI's log is all one has), its traceback printed under the notebook's line.
    assert rows["01_bare_assert.ipynb"].endswith("FAILED in cell 2, line 2 (assert 1 + 1 == 3): AssertionError (no message)")
    assert rows["02_raises_empty.ipynb"].endswith("FAILED in cell 2, line 1 (raise RuntimeError()): RuntimeError (no message)")
    assert "    | ----> 2 assert 1 + 1 == 3" in proc.stdout, proc.stdout
    # Kernels talk over Unix sockets: ipykernel's "running over TCP without encryption" warning is gone.
    assert "without encryption" not in proc.stdout + proc.stderr, proc.stderr
    assert rows["03_fine.ipynb"].endswith("ok")
    assert "1 passed, 2 failed" in proc.stdout
    assert re.search(r"^torch \S+, Python 3\.\d+", proc.stdout, re.M), "the runner says which torch ran"


def test_run_workbook_lets_each_kernel_exit_by_itself_and_kills_one_that_does_not(tmp_path):
    """Kernels exit in the background (their interpreter's teardown overlaps the next notebook), and gracefully:
    their atexit handlers run. One that does not exit is killed after jupyter_client's shutdown_wait_time."""
    import psutil

    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    mark = "import atexit, os, time\nopen(f'{os.getpid()}.pid', 'w').close()\n"
    for name, source in [("01_exits", mark + "atexit.register(lambda: open(f'{os.getpid()}.exited', 'w').close())"),
                         ("02_hangs_at_exit", mark + "atexit.register(time.sleep, 600)"),
                         ("03_exits", mark + "atexit.register(lambda: open(f'{os.getpid()}.exited', 'w').close())")]:
        nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                               "language": "python"}})
        nb.cells = [nbformat.v4.new_code_cell(source)]
        nbformat.write(nb, notebooks / f"{name}.ipynb")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_workbook.py"), "--notebooks-dir", str(notebooks),
                           "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "3 passed, 0 failed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    pids = sorted(int(p.stem) for p in notebooks.glob("*.pid"))
    assert len(pids) == 3
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"kernels left running after run_workbook.py returned: {alive}"
    assert len(list(notebooks.glob("*.exited"))) == 2, "the two kernels that could exit ran their atexit handlers"


def test_run_workbook_types_parameters_like_papermill(tmp_path):
    from papermill.cli import _resolve_type  # papermill's own -p typing: ours must be the same

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from run_workbook import merged_parameters, parameter_value, parse_args
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for text in ["None", "True", "False", "2", "-3", "1e-5", "0.5", "nan", "cpu", "[1, 2]", "{a: 1}", "none", ""]:
        assert parameter_value(text) == _resolve_type(text) or text == "nan", text
        assert type(parameter_value(text)) is type(_resolve_type(text)), text
    params_file = tmp_path / "params.yaml"
    params_file.write_text("NPROC: 4\nRANK_ENV: {NCCL_P2P_DISABLE: '1'}\nDEVICE: cuda\n")
    args = parse_args(["-f", str(params_file), "-y", "NPROC: 3\nMAX_STEPS: 7", "-p", "NPROC", "None",
                       "-p", "SMALL_LOSS_WEIGHT", "1e-5", "-r", "TAG", "2"])
    assert merged_parameters(args) == {"NPROC": None, "RANK_ENV": {"NCCL_P2P_DISABLE": "1"}, "DEVICE": "cuda",
                                       "MAX_STEPS": 7, "SMALL_LOSS_WEIGHT": 1e-5, "TAG": "2"}
    with pytest.raises(SystemExit, match="-y '\\[1, 2\\]': parameters must be a YAML mapping"):
        merged_parameters(parse_args(["-y", "[1, 2]"]))
    with pytest.raises(SystemExit, match="cannot read parameters"):
        merged_parameters(parse_args(["-f", str(tmp_path / "missing.yaml")]))


@pytest.mark.parametrize("live", ["widgets", "text"])
def test_live_view_in_a_kernel_updates_in_place_and_ends_with_the_plot(tmp_path, live):
    """What a notebook user gets: one progress output and one figure, both updated in place."""
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell(
        "import tutorial_lib as tl\n"
        f"run_dir = tl.new_run_dir('live', {str(tmp_path)!r})\n"
        "script = tl.write_script('ddp_train', run_dir)\n"
        f"tl.launch(tl.LaunchSpec(script, device='cpu', live={live!r}, args=['--max-steps', 30, '--step-delay-s', 0.05]))"
    )]
    NotebookClient(nb, timeout=120, kernel_name="python3", store_widget_state=True).execute()
    outputs = nb.cells[0].outputs
    displays = [o for o in outputs if o.output_type == "display_data"]
    pngs = [o for o in displays if "image/png" in o.get("data", {})]
    assert len(pngs) == 1, "the figure is redrawn in place, not appended"
    assert "2 Axes" in pngs[0].data["text/plain"]
    if live == "widgets":
        assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in displays)
        states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
        bars = [s["state"] for s in states.values() if s["model_name"] == "IntProgressModel"]
        assert sorted((b["description"], b["value"], b["max"]) for b in bars) == [("rank 0", 30, 30), ("rank 1", 30, 30)]
        logs = [s["state"]["value"] for s in states.values() if "tutorial-lib-log" in str(s["state"].get("value", ""))]
        assert len(logs) == 1 and "[rank 0] step 30/30" in logs[0] and "[rank 1] step 30/30" in logs[0], \
            "output lines go to the widget's own output area"
        box = [o.data["text/plain"] for o in displays if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        assert box[0].startswith("rank 0: step 30/30") and "finished in" in box[0], "text fallback without widgets"
    else:
        progress = [o.data["text/plain"] for o in displays if "image/png" not in o.get("data", {})]
        assert progress[0].startswith("rank 0: step 30/30") and "finished in" in progress[0]
        assert sum(o.output_type == "stream" for o in outputs) >= 1
    assert all(o.output_type != "error" for o in outputs)


@pytest.mark.parametrize("stem", ["01_ddp", "02_data_and_accumulation", "04_fsdp", "05_checkpointing", "09_fsdp_in_depth"])
def test_lessons_about_ranks_run_on_two_cpu_ranks_where_one_gpu_would_make_them_trivial(stem):
    """Issue 15 item 10: on one GPU, 1/N = 1 and DDP = one process; these notebooks say so and use 2 CPU ranks."""
    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    setup = next(c.source for c in nb.cells if c.cell_type == "code" and "tl.resolve_device(DEVICE, NPROC)" in c.source)
    assert "if plan.nproc_per_node < 2:" in setup and 'plan = tl.resolve_device("cpu", 2)' in setup
    assert "this lesson runs on 2 CPU ranks instead" in setup
