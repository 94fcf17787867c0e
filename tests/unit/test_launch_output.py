"""The launcher's parts between the plan and the outcome, each without launching: the printer, the output pump,
run.json, and the error a failed job raises."""

import io
import json
import os
import shutil
import signal

import pytest

from conftest import FIXTURES
from tutorial_lib import LaunchSpec
from tutorial_lib.launcher.job import sigint_deferred
from tutorial_lib.launcher.live import LogBuffer
from tutorial_lib.launcher.outcome import failure_error
from tutorial_lib.launcher.output import OutputPump, ThrottledPrinter
from tutorial_lib.launcher.plan import plan_launch
from tutorial_lib.runs.rundir import RunRecord, RunStatus
from tutorial_lib.torchrun.output_lines import rank_lines
from tutorial_lib.torchrun.noise import NoiseFilter
from tutorial_lib.torchrun.stacks import Frame, Place



def test_printer_throttles_a_flood_but_keeps_every_rank_tail(monkeypatch):
    import tutorial_lib.launcher.output as output

    clock = [100.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    printer = ThrottledPrinter(out, max_lines_per_s=10, tail_lines=5)
    for i in range(1000):
        printer.emit(i % 2, f"line {i}")
    shown = out.getvalue().splitlines()
    assert len(shown) == 20, "burst of 2 x 10 lines, then nothing until time passes"
    assert shown[0] == "[rank 0] line 0" and shown[1] == "[rank 1] line 1"
    clock[0] += 1.0  # one second later: 10 more lines may pass, preceded by the suppressed count
    printer.emit(None, "torchrun says hi")
    lines = out.getvalue().splitlines()
    assert "980 line(s) not shown" in lines[-2] and lines[-1] == "[torchrun] torchrun says hi"
    assert printer.tail(1) == [f"line {i}" for i in range(991, 1000, 2)]


def test_the_full_log_is_named_once_per_launch_and_a_count_is_never_zero(monkeypatch):
    """Issue 45: 07's cell printed the log's path with every count, then '0 line(s) not shown' before the last lines."""
    import tutorial_lib.launcher.output as output

    clock = [100.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    printer = ThrottledPrinter(out, max_lines_per_s=1, log_name="run/output.log")
    for burst in range(3):  # each burst: 2 lines shown, 3 held back, counted when the next line gets through
        for i in range(5):
            printer.emit(0, f"burst {burst} line {i}")
        clock[0] += 2.0
    printer.show_last_lines()
    notes = [line for line in out.getvalue().splitlines() if line.startswith("[launcher]")]
    assert notes == ["[launcher] 3 line(s) not shown to keep the output small; all lines are in run/output.log",
                     "[launcher] 3 more line(s) not shown",
                     "[launcher] 3 more line(s) not shown; the last lines of each rank:"], notes
    assert out.getvalue().count("run/output.log") == 1
    clock[0] += 2.0
    for i in range(5):  # rank 0 floods again; rank 1's line gets through later and the count comes before it
        printer.emit(0, f"late {i}")
    clock[0] += 2.0
    printer.emit(1, "rank 1 done")
    printer.show_last_lines()  # rank 0's held-back lines were counted already: no "0 line(s)"
    lines = out.getvalue().splitlines()
    assert lines[-6:] == ["[launcher] 3 more line(s) not shown", "[rank 1] rank 1 done",
                          "[launcher] the last lines of each rank, held back above:", "[rank 0] late 2",
                          "[rank 0] late 3", "[rank 0] late 4"], lines[-6:]


def test_a_long_line_is_cut_in_a_cell_and_whole_in_the_widget_view_and_the_tails():
    """Issue 45: a DETAIL collective fingerprint (about 600 characters) filled 07's cells; the cell shows its first
    LINE_CHARS characters and how many more there are, the widget view (which wraps and scrolls) and the tails the
    error reports read keep it whole."""
    long = "RuntimeError: Detected mismatch " + "x" * 500
    out, widget = io.StringIO(), io.StringIO()
    cell, view = ThrottledPrinter(out), ThrottledPrinter(widget, keeps_full_tracebacks=True)
    for printer in (cell, view):
        printer.emit(0, long)
        printer.emit(0, "short")
    n = ThrottledPrinter.LINE_CHARS
    assert out.getvalue().splitlines() == [f"[rank 0] {long[:n]} ... ({len(long) - n} more characters in the log)",
                                           "[rank 0] short"]
    assert widget.getvalue().splitlines() == [f"[rank 0] {long}", "[rank 0] short"]
    assert cell.tail(0) == [long, "short"], "the error reports read the whole line"


def test_at_the_end_torchruns_held_back_lines_are_counted_not_shown(monkeypatch):
    """Issue 45: at a job's end the cell showed torchrun's last three lines (its store shutting down) under each rank's
    last lines; they are counted with the others, and a rank's held-back lines are still shown."""
    import tutorial_lib.launcher.output as output

    clock = [100.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    printer = ThrottledPrinter(out, max_lines_per_s=1, log_name="run/output.log")
    for i in range(4):
        printer.emit(0, f"rank line {i}")
        printer.emit(None, f"store line {i}")
    printer.show_last_lines()
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["[rank 0] rank line 0", "[torchrun] store line 0"], lines
    assert lines[2] == ("[launcher] 6 line(s) not shown to keep the output small; all lines are in run/output.log; "
                        "the last lines of each rank:"), lines
    assert lines[3:] == ["[rank 0] rank line 1", "[rank 0] rank line 2", "[rank 0] rank line 3"], lines
    out.truncate(0), out.seek(0)
    only_torchrun = ThrottledPrinter(out, max_lines_per_s=1, log_name="run/output.log")
    for i in range(4):
        only_torchrun.emit(None, f"store line {i}")
    only_torchrun.show_last_lines()
    assert out.getvalue().splitlines()[-1] == ("[launcher] 2 line(s) not shown to keep the output small; all lines "
                                               "are in run/output.log"), out.getvalue()


def test_the_traceback_note_names_the_log_only_when_no_note_of_the_launch_has_yet(tmp_path, monkeypatch):
    """Issue 45: a launch whose held-back lines were counted with the log's path named output.log again in its
    traceback note; alone, the note names it."""
    import tutorial_lib.launcher.output as output

    clock = [100.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    for flood in (False, True):
        out = io.StringIO()
        printer = ThrottledPrinter(out, max_lines_per_s=1, log_name=str(tmp_path / "output.log"))  # as launch() does
        pump = OutputPump(1, tmp_path, [0], printer, io.StringIO())
        if flood:
            for i in range(5):
                pump.printer.emit(0, f"line {i}")
            clock[0] += 2.0
            pump.printer.emit(0, "after the flood")  # the count of held-back lines names the log first
        pump.noise.traceback_lines = 7
        pump.finish()
        log = str(tmp_path / "output.log")
        note = [line for line in out.getvalue().splitlines() if "traceback line(s)" in line]
        assert out.getvalue().count(log) == 1, out.getvalue()
        assert note == ["[launcher] 7 traceback line(s) not shown (the exception line is), in the same log" if flood
                        else f"[launcher] 7 traceback line(s) not shown (the exception line is); every line is in {log}"]


def test_sigint_during_cleanup_is_held_back_then_raised():
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            finished.append("cleanup ran to the end")
    assert finished == ["cleanup ran to the end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_run_json_has_one_schema_and_reads_back(tmp_path):
    """run.json is written by RunRecord only; an older or partial record still reads (unknown shape: None)."""
    import json

    own, sleep = Frame("/r/t.py", 3, "main"), Frame("/lib/python3.11/site-packages/x.py", 9, "wait")
    RunRecord(RunStatus.TIMEOUT, 12.5, nnodes=2, nproc_per_node=2, device="cpu", summary="t.py timed out",
              timeout_s=5, limit="stall_timeout_s", where={1: Place(own, sleep)}).write(tmp_path)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["status"] == "timeout" and data["in_process"] is False
    assert data["where"] == {"1": {"own": {"file": "/r/t.py", "line": 3, "function": "main"},
                                   "innermost": {"file": "/lib/python3.11/site-packages/x.py", "line": 9,
                                                 "function": "wait"}}}, "a value: nothing to parse back"
    assert set(data) == set(RunRecord.__dataclass_fields__)
    back = RunRecord.read(tmp_path)
    assert back.status == RunStatus.TIMEOUT == "timeout" and back.where == {1: Place(own, sleep)} and back.timeout_s == 5
    # A run.json written before places were values holds their text: it reads as the same places (file names only).
    data["where"] = {"0": "t.py:3 in main -> x.py:9 in wait", "1": "t.py:3 in <module>", "2": "not a place"}
    (tmp_path / "run.json").write_text(json.dumps(data))
    assert RunRecord.read(tmp_path).where == {0: Place(Frame("t.py", 3, "main"), Frame("x.py", 9, "wait")),
                                              1: Place(Frame("t.py", 3, "<module>"), Frame("t.py", 3, "<module>"))}
    (tmp_path / "run.json").write_text(json.dumps({"status": "failed", "returncode": 1}))
    old = RunRecord.read(tmp_path)
    assert old.status == RunStatus.FAILED and old.returncode == 1 and old.nproc_per_node is None
    (tmp_path / "run.json").write_text("{not json")
    assert RunRecord.read(tmp_path) is None


# --- launch()'s parts, each without launching: plan, output pump, limits, outcome -------------------------------------


def _pump_for(tmp_path, nodes=(0,), nnodes=1):
    log = io.StringIO()
    return OutputPump(nnodes, tmp_path, list(nodes), ThrottledPrinter(io.StringIO()), log), log


def _plan(tmp_path, **spec):
    script = tmp_path / "t.py"
    script.write_text("")
    return plan_launch(LaunchSpec(script, device="cpu", nproc_per_node=2, **spec))


def rank_folder(log_dir, local_rank, attempt=0, rank=None):
    """torchrun's folder of one rank (``--log-dir log_dir``), with its two empty logs and, if ``rank`` is given, the
    rank runner's record of its global rank."""
    folder = log_dir / "run_x1" / f"attempt_{attempt}" / str(local_rank)
    folder.mkdir(parents=True)
    for stream in ("stdout", "stderr"):
        (folder / f"{stream}.log").touch()
    if rank is not None:
        (folder / "rank.json").write_text(json.dumps({"rank": rank, "local_rank": local_rank}))
    return folder


def append(path, text):
    with open(path, "a") as f:
        f.write(text)


def test_the_pump_reads_each_ranks_lines_from_its_own_files_and_torchruns_from_its_output(tmp_path):
    """Issue 44: a rank's lines are its own files' lines, whatever they say; torchrun's own lines come from its
    output, labelled with their node. output.log labels each line with who wrote it."""
    logs = {node: tmp_path / "logs" / f"node{node}" for node in (0, 1)}
    log = io.StringIO()
    pump = OutputPump(2, tmp_path, [0, 1], ThrottledPrinter(io.StringIO()), log, log_dirs=logs)
    folder = rank_folder(logs[1], 0, rank=2)
    append(folder / "stdout.log", "step 1\n[rank 3] a line of rank 2\n[default3]:and another\n")
    pump.lines.put((0, "I1130 agent line"))
    pump.lines.put((0, None))
    assert pump.read_lines(0.01) and pump.open_streams == {1}
    assert log.getvalue() == ("[torchrun node 0] I1130 agent line\n[rank 2] step 1\n"
                              "[rank 2] [rank 3] a line of rank 2\n[rank 2] [default3]:and another\n")
    assert pump.ranked == [(None, "I1130 agent line"), (2, "step 1"), (2, "[rank 3] a line of rank 2"),
                           (2, "[default3]:and another")]
    assert pump.transcript == log.getvalue().splitlines()
    assert rank_lines(log.getvalue()) == pump.ranked, "output.log reads back as it was attributed"
    assert not pump.read_lines(0.01), "nothing more arrived"


def test_the_failure_outcome_explains_torchruns_own_failure_from_the_transcript(tmp_path):
    pump, _ = _pump_for(tmp_path)
    for line in ["torch.distributed.DistNetworkError: address already in use (EADDRINUSE)"]:
        pump.take(0, line)
    error, record, outcome = failure_error(_plan(tmp_path), pump, {0: 1}, 2.5, command=["torchrun"])
    assert str(error).startswith("t.py failed: torchrun exited with code 1: the port, picked as free for this launch")
    assert outcome.status == RunStatus.FAILED and outcome.elapsed_s == 2.5 and str(outcome.cause) == record.summary
    assert error.returncode == 1 and error.failure is None and error.output_tail == pump.transcript
    assert error.output is pump.transcript, "the doctor reads the lines the launcher held, not output.log again"
    assert record.status == RunStatus.FAILED and record.returncode == 1 and record.summary == error.summary
    assert not (tmp_path / "run.json").exists(), "launch writes the record after the view's last word"


def test_the_failure_outcome_names_the_rank_whose_error_file_torchrun_summarised(tmp_path):
    plan = _plan(tmp_path)  # before the launch's files exist, as in a launch
    pump, _ = _pump_for(tmp_path)
    for line in (FIXTURES / "torchrun_failure_summary.txt").read_text().splitlines():
        pump.take(0, line)
    error_dir = tmp_path / "logs" / "none_abc" / "attempt_0" / "1"
    error_dir.mkdir(parents=True)
    (error_dir / "error.json").write_text((FIXTURES / "error.json").read_text())
    error, record, outcome = failure_error(plan, pump, {0: 1}, 2.5, command=["torchrun"])
    assert record.summary.startswith("t.py failed on rank 1 (exit code 1)")
    assert outcome.text == "failed: t.py failed on rank 1 (exit code 1)", "the view's status: without where ranks were"
    assert "ValueError: boom on rank 1" in error.failure.traceback


def test_a_redrawn_line_is_shown_once_in_its_final_state_and_in_place_in_the_widget_view(tmp_path):
    """Two ranks' progress bars as the rank runner marks them in their stderr.log (each ``\\r`` as ESC[G and a
    newline, the next state after ESC[A, ESC[K before the final newline), a line of rank 0's stdout, and a line rank 1
    writes in two pieces: the printer shows each rank's final state once, attributed to its rank; the widget view's
    output area shows the latest state in place meanwhile, also one the rank has not ended yet; output.log keeps every
    state, and an unfinished line only once it ends, whole."""
    def job(printer, log):
        pump = OutputPump(1, tmp_path, [0], printer, log, log_dirs={0: tmp_path / "logs"})
        r0, r1 = rank_folder(tmp_path / "logs", 0), rank_folder(tmp_path / "logs", 1)
        append(r0 / "stderr.log", "\x1b[G\n\x1b[Ar0 1/50\x1b[G\n\x1b[Ar0 2/50")
        append(r1 / "stderr.log", "\x1b[G\n\x1b[Ar1 1/50\x1b[G\n\x1b[Ar1 2/50")
        append(r0 / "stdout.log", "rank 0 done\n")
        append(r1 / "stdout.log", "loading... ")
        yield pump
        append(r0 / "stderr.log", "\x1b[G\n\x1b[Ar0 3/50\x1b[K\n")  # rank 0's bar ends: its final state, a line
        append(r1 / "stdout.log", "done\n")
        yield pump

    buffer, log = LogBuffer(), io.StringIO()
    steps = job(ThrottledPrinter(buffer), log)
    pump = next(steps)
    assert pump.read_rank_logs()
    assert buffer.lines() == ["[rank 0] rank 0 done", "[rank 0] r0 2/50", "[rank 1] r1 2/50"], "latest states, in place"
    next(steps)
    assert pump.read_rank_logs()
    assert buffer.lines() == ["[rank 0] rank 0 done", "[rank 0] r0 3/50", "[rank 1] loading... done",
                              "[rank 1] r1 2/50"]
    pump.read_rank_logs(final=True)  # the job ended while rank 1 was still redrawing: its latest state
    logged = log.getvalue()
    pump.close()
    pump.finish()  # ... is its last word
    assert buffer.lines() == ["[rank 0] rank 0 done", "[rank 0] r0 3/50", "[rank 1] loading... done",
                              "[rank 1] r1 2/50"]
    assert pump.printer.tail(1) == ["loading... done", "r1 2/50"] and pump.printer.tail(0) == ["rank 0 done", "r0 3/50"]
    assert logged.splitlines() == ["[rank 0] rank 0 done", "[rank 0] r0 1/50", "[rank 1] r1 1/50",
                                   "[rank 0] r0 2/50", "[rank 0] r0 3/50", "[rank 1] loading... done",
                                   "[rank 1] r1 2/50"]

    # A text-mode cell (stdout): no line in place, only the final states, as lines.
    shutil.rmtree(tmp_path / "logs")
    out = io.StringIO()
    steps = job(ThrottledPrinter(out), io.StringIO())
    pump = next(steps)
    pump.read_rank_logs()
    next(steps)
    pump.read_rank_logs(final=True)
    assert out.getvalue() == "[rank 0] rank 0 done\n[rank 0] r0 3/50\n[rank 1] loading... done\n"
    pump.finish()
    assert out.getvalue() == "[rank 0] rank 0 done\n[rank 0] r0 3/50\n[rank 1] loading... done\n[rank 1] r1 2/50\n"


def test_the_screen_skips_stack_dumps_and_always_shows_the_error_line():
    """The dumps stay in output.log (the error says where each rank was); an exception line beats the line budget."""
    noise = NoiseFilter()
    lines = [(0, "step 1"), (0, "Current thread 0x01 (most recent call first):"), (0, '  File "a.py", line 3 in f'),
             (0, ""), (0, "Thread 0x02 (most recent call first):"), (0, '  File "b.py", line 1 in g'), (0, "step 2")]
    assert [t for r, t in lines if not noise.hide(r, t)] == ["step 1", "step 2"]
    out = io.StringIO()
    printer = ThrottledPrinter(out, max_lines_per_s=1)  # a budget of 2 lines
    for i in range(10):
        printer.emit(0, f"line {i}")
    printer.emit(1, "RuntimeError: injected failure on rank 1 at step 2")
    shown = out.getvalue()
    assert "line 9" not in shown and "[rank 1] RuntimeError: injected failure on rank 1 at step 2" in shown


def test_version_noise_is_kept_out_of_a_ranks_last_lines_but_a_stack_dump_is_not():
    """A DCP warning that reaches output.log after a rank's last words is not what the rank was doing."""
    noise, printer = NoiseFilter(), ThrottledPrinter(open(os.devnull, "w"))
    warning = ("/x/torch/distributed/checkpoint/filesystem.py:131: UserWarning: TypedStorage is deprecated. It will "
               "be removed in the future")
    for text in ["step 3", "rank 1: killed by SIGKILL in the middle of the step-6 save", warning,
                 "  if tensor.storage().size() != tensor.numel():", "Current thread 0x01 (most recent call first):",
                 '  File "a.py", line 3 in f']:
        kind = noise.kind(1, text)
        printer.emit(1, text, show=kind is None, keep=kind != NoiseFilter.VERSION)
    assert printer.tail(1) == ["step 3", "rank 1: killed by SIGKILL in the middle of the step-6 save",
                               "Current thread 0x01 (most recent call first):", '  File "a.py", line 3 in f']
