"""The live view without a browser: papermill stays small under an output flood, a failure is named in red.

tests/notebooks/test_browser.py checks the same views rendered in JupyterLab.
"""

import shutil
from pathlib import Path
from types import SimpleNamespace

import nbformat
import papermill as pm
import pytest

import tutorial_lib as tl
from tutorial_lib.launcher.live import LogBuffer, TerminalView, TextNotebookView, WidgetNotebookView, make_view
from tutorial_lib.launcher.live import Outcome
from tutorial_lib.runs.rundir import RunStatus

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def notebook(*sources: str, parameters: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": KERNELSPEC})
    params = nbformat.v4.new_code_cell(parameters)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params] + [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


@pytest.mark.parametrize("live", ["text", "widgets"])
def test_a_flood_of_lines_leaves_papermill_a_small_notebook(tmp_path, run_root, live):
    """6000 lines from two ranks: the cell shows a throttled few, papermill stores a small notebook, nothing is lost."""
    run_dir = tl.new_run_dir("chatty", run_root)
    shutil.copy(FIXTURES / "chatty.py", run_dir)
    source = tmp_path / "flood.ipynb"
    nbformat.write(notebook(
        "import tutorial_lib as tl\n"
        "result = tl.launch(tl.LaunchSpec(SCRIPT, device='cpu', live=LIVE, timeout_s=120))",
        parameters="SCRIPT = None\nLIVE = 'auto'"), source)
    out = tmp_path / "flood-out.ipynb"
    pm.execute_notebook(source, out, parameters={"SCRIPT": str(run_dir / "chatty.py"), "LIVE": live},
                        kernel_name="python3", progress_bar=False, cwd=str(tmp_path))
    size = out.stat().st_size
    cell = nbformat.read(out, as_version=4).cells[-1]
    shown = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    log = (run_dir / "output.log").read_text()
    assert log.count("[rank 0] rank 0 line") == 3000 and log.count("[rank 1] rank 1 line") == 3000
    print(f"live={live}: notebook {size} bytes, {len(shown.splitlines())} stream lines, output.log {len(log)} bytes")
    assert size < 60_000, f"the executed notebook is {size} bytes (the unthrottled output alone is {len(log)})"
    assert len(log) > 100_000, "the flood is big enough that an unthrottled cell would exceed the bound"
    if live == "text":
        assert 20 < shown.count("[rank ") < 400, shown[-2000:]
        assert "not shown to keep the output small" in shown
    else:
        assert "[rank " not in shown, "with widgets the lines go to the widget's output area, not the cell's stdout"
        box = next(o for o in cell.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {}))
        assert "finished in" in box.data["text/plain"], "a notebook opened without widget state still shows the outcome"


def test_plain_papermill_with_widgets_saves_the_ranks_lines_and_the_loss_curve_as_text(tmp_path, run_root,
                                                                                       monkeypatch):
    """Issue 26: plain papermill (no $TUTORIAL_LIB_LIVE, ipywidgets installed: the widget view) and nbconvert see the
    ranks' lines as text, in the widget's text/plain, which JupyterLab does not draw (it draws the widget); a script's
    printed losses are drawn as the figure."""
    import nbconvert

    monkeypatch.delenv("TUTORIAL_LIB_LIVE", raising=False)  # what a learner's own papermill run has
    project = tmp_path / "project"
    project.mkdir()
    (project / "hello.py").write_text(
        "import os\n"
        "rank = os.environ['RANK']\n"
        "print(f'hello from rank {rank}', flush=True)\n"
        "for step in range(1, 4):\n"
        "    print(f'step {step} loss {1 / step:.3f}', flush=True)\n")
    source, out = tmp_path / "plain.ipynb", tmp_path / "plain-out.ipynb"
    nbformat.write(notebook("import tutorial_lib as tl\n"
                            "result = tl.run_script(SCRIPT, device='cpu', timeout_s=120, runs_dir=RUNS)",
                            parameters="SCRIPT = None\nRUNS = None"), source)
    pm.execute_notebook(source, out, parameters={"SCRIPT": str(project / "hello.py"), "RUNS": str(run_root)},
                        kernel_name="python3", progress_bar=False, cwd=str(tmp_path))
    cell = nbformat.read(out, as_version=4).cells[-1]
    box = next(o for o in cell.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {}))
    text = box.data["text/plain"]
    lines = [f"[rank {r}] {t}" for r in (0, 1) for t in [f"hello from rank {r}", "step 1 loss 1.000",
                                                          "step 3 loss 0.333"]]
    assert all(line in text.splitlines() for line in lines), text
    assert f"ranks run in {project}" in text and "finished in" in text and "output.log" in text
    assert "rank 1: step 3  loss 0.3330" in text, "the progress comes from the printed losses"
    assert any("image/png" in o.get("data", {}) for o in cell.outputs), "and so does the figure"
    markdown, _ = nbconvert.MarkdownExporter().from_filename(str(out))
    assert all(line in markdown for line in lines), "nbconvert to text shows them too"


def test_a_failing_rank_is_named_in_a_red_box_with_its_cause_and_logs(tmp_path, run_root):
    from nbclient import NotebookClient

    run_dir = tl.new_run_dir("fails", run_root)
    tl.write_script("ddp_train", run_dir)
    nb = notebook(
        "import tutorial_lib as tl\n"
        "try:\n"
        "    tl.launch(tl.LaunchSpec(SCRIPT, device='cpu', live='widgets', timeout_s=120,\n"
        "                            args=['--max-steps', 20, '--fail-rank', 1, '--fail-step', 2]))\n"
        "except tl.LaunchError as e:\n"
        "    print('caught', e.rank)",
        parameters=f"SCRIPT = {str(run_dir / 'ddp_train.py')!r}")
    NotebookClient(nb, timeout=120, kernel_name="python3", store_widget_state=True).execute()
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    html = [str(s["state"].get("value", "")) for s in states.values() if s["model_name"] == "HTMLModel"]
    box = next(h for h in html if "tutorial-lib-failure" in h)
    for expected in ("ddp_train.py failed on rank 1 (exit code 1)",
                     "cause: RuntimeError: injected failure on rank 1 at step 2", str(run_dir), "output.log"):
        assert expected in box, box
    bars = [s["state"] for s in states.values() if s["model_name"] == "IntProgressModel"]
    assert {b["bar_style"] for b in bars} == {"danger"}
    log = next(h for h in html if "tutorial-lib-log" in h)
    assert "[rank 1] RuntimeError: injected failure on rank 1 at step 2" in log, "the traceback is in the output area"
    assert "in inject_failure" in log, "with its frames: one click away (a text-mode cell shows the exception line)"
    outputs = nb.cells[-1].outputs
    assert any(o.output_type == "stream" and o.text == "caught 1\n" for o in outputs)


def test_the_terminal_view_prints_progress_lines_and_the_status(capsys):
    view = TerminalView(interval_s=0)
    view.add([{"step": 3, "max_steps": 10, "rank": 0, "loss_local": 0.5, "samples_per_s": 1000.0}])
    view.update(1.0, [])
    view.finish([], Outcome(RunStatus.FINISHED, 2.0))
    out = capsys.readouterr().out
    assert "rank 0: step 3/10  loss 0.5000  samples/s 1000" in out and out.endswith("[launcher] finished in 2.0 s\n")


def test_outside_a_kernel_every_mode_but_off_degrades_to_the_terminal_view():
    assert type(make_view("widgets")) is TerminalView and type(make_view("text")) is TerminalView
    assert type(make_view("off")).__name__ == "LiveView" and make_view("off").log_stream is None


def test_the_log_buffer_keeps_the_last_lines_and_joins_partial_writes():
    buf = LogBuffer(maxlen=3)
    for i in range(5):
        buf.write(f"[rank 0] line {i}\n")
    buf.write("[rank 1] par")
    buf.write("tial\n")
    assert buf.lines() == ["[rank 0] line 3", "[rank 0] line 4", "[rank 1] partial"]
    assert TextNotebookView().log_stream is None, "text mode: lines go to the cell's stdout"


def test_the_red_box_names_the_cause_of_a_failure_and_where_ranks_were_at_a_timeout(tmp_path, capsys):
    view = WidgetNotebookView(run_dir=tmp_path)
    view.start()  # outside a kernel the widgets still exist; display() prints their text
    view.add([{"step": 7, "max_steps": 10, "rank": 0}, {"step": 3, "max_steps": 10, "rank": 1}])
    failure = tl.errors.RankFailure(rank=1, exit_code=1, traceback="Traceback ...\nValueError: bad batch", log_tail=["x"])
    view.fail(tl.LaunchError("t.py failed on rank 1 (exit code 1)", run_dir=tmp_path, command=["t"], returncode=1,
                             failure=failure))
    box = view._alert.value
    assert "t.py failed on rank 1 (exit code 1)" in box and "cause: ValueError: bad batch" in box
    assert "rank 0 at step 7, rank 1 at step 3" in box and f"full logs in {tmp_path}: output.log" in box
    timeout = tl.LaunchTimeout("t.py timed out after 5 s (limit timeout_s) and was stopped; ranks still running: [0, 1]",
                               timeout_s=5, last_steps={0: 7, 1: 3}, run_dir=tmp_path, command=["t"], returncode=None,
                               output_tail=["an unrelated last line"],
                               headline="t.py timed out after 5 s (limit timeout_s) and was stopped")  # as launched
    view.fail(timeout)
    box = view._alert.value
    assert "t.py timed out after 5 s (limit timeout_s) and was stopped<" in box and "unrelated" not in box
    assert "the job ran past timeout_s=5 s" in box
    # A timeout that knows where each rank's Python stack was (the launcher's stack dump, where it has one).
    view.fail(SimpleNamespace(summary="t.py timed out after 5 s", timeout_s=5, where={1: "all_reduce (t.py:42)"}))
    assert "rank 1 was in all_reduce (t.py:42)" in view._alert.value


@pytest.mark.parametrize("traceback, log_tail, output_tail, cause", [
    ("", [], [], None),  # NCCL's watchdog abort on a GPU: no error file, nothing logged
    ("  \n\n", ["", "   "], [], None),  # whitespace only
    ("", ["[rank0]:[E ProcessGroupNCCL.cpp:632] Watchdog caught collective operation timeout", "Fatal Python error: Aborted",
          "", "Thread 0x01 (most recent call first):", '  File "t.py", line 3 in main', "", "Extension modules: torch._C"],
     [], "Fatal Python error: Aborted"),
    ("", [], ["torchrun: rendezvous failed"], "torchrun: rendezvous failed"),
])
def test_the_red_box_survives_a_failure_that_left_no_traceback_or_log(tmp_path, traceback, log_tail, output_tail, cause):
    view = WidgetNotebookView(run_dir=tmp_path)
    view.start()
    error = tl.LaunchError("t.py failed on rank 0 (exit code -6)", run_dir=tmp_path, command=["t"], returncode=1,
                           failure=tl.errors.RankFailure(rank=0, exit_code=-6, traceback=traceback, log_tail=log_tail),
                           output_tail=output_tail)
    assert error.cause == (cause or "")
    view.fail(error)
    box = view._alert.value
    assert "t.py failed on rank 0 (exit code -6)" in box
    assert (f"cause: {cause}" in box) if cause else "cause:" not in box


def test_a_run_with_fewer_than_two_logged_steps_draws_no_figure(tmp_path, monkeypatch):
    """One dot is no curve: a 1-step (or early-failed) run says so in text; from two steps on, the figure."""
    drawn = []
    monkeypatch.setattr("tutorial_lib.launcher.live.plot_run", lambda records, rss: drawn.append(len(records)) or "figure")
    shown = []
    handle = SimpleNamespace(update=shown.append)  # a display handle, as a kernel gives one
    monkeypatch.setattr("IPython.display.display", lambda *args, **kwargs: handle)
    view = TextNotebookView(run_dir=tmp_path)
    view.start()
    view.add([{"step": 1, "max_steps": 5, "rank": 0, "loss_local": 1.0}, {"step": 1, "max_steps": 5, "rank": 1}])
    view.update(1.0, [], final=True)
    view.finish([], Outcome(RunStatus.FAILED, 2.0, "t.py failed on rank 1 (exit code 1)"))
    assert drawn == [], "no figure for one step"
    assert any("1 step logged: too few for a curve" in repr(x) for x in shown), shown
    view.add([{"step": 2, "max_steps": 5, "rank": 0, "loss_local": 0.9}])
    view.finish([], Outcome(RunStatus.FINISHED, 3.0))
    assert drawn == [3], "two steps: the figure, with every record"


def test_the_views_draw_a_typed_outcome(tmp_path, monkeypatch):
    """The launcher says how a run ended with an ``Outcome`` (no status strings to parse): an interrupt is red, named,
    and says that every process was stopped; a finished run is green; the text view says the same in words."""
    shown = []
    handle = SimpleNamespace(update=lambda *args, **kwargs: shown.append(args[0]))  # a display handle, as in a kernel
    monkeypatch.setattr("IPython.display.display", lambda *args, **kwargs: handle)
    view = WidgetNotebookView(run_dir=tmp_path)
    view.start()
    view.add([{"step": 4, "max_steps": 10, "rank": 0}])
    interrupted = Outcome(RunStatus.INTERRUPTED, 3.0, "interrupted")
    assert interrupted.failed and interrupted.text == "failed: interrupted"
    view.finish([], interrupted)
    assert "color:#c62828'>failed: interrupted<" in view._header.value
    assert "the kernel was interrupted: torchrun and every worker were stopped" in view._alert.value
    assert "last step reported: rank 0 at step 4" in view._alert.value
    finished = WidgetNotebookView(run_dir=tmp_path)
    finished.start()
    finished.finish([], Outcome(RunStatus.FINISHED, 4.25))
    assert "color:#2e7d32'>finished in 4.2 s<" in finished._header.value and finished._alert.value == ""
    assert shown[-1]["text/plain"].endswith("\nfinished in 4.2 s"), "a notebook saved without widget state shows the outcome"
    text = TextNotebookView(run_dir=tmp_path)
    text.start()
    text.finish([], Outcome(RunStatus.TIMEOUT, 9.0, "timed out after 8 s"))
    assert repr(shown[-1]).endswith("elapsed 9.0 s - failed: timed out after 8 s")
