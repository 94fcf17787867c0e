"""The launcher's parts between the plan and the outcome, each without launching: the printer, the output pump,
run.json, and the error a failed job raises."""

import io
import os
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
from tutorial_lib.torchrun.noise import NoiseFilter



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

    RunRecord(RunStatus.TIMEOUT, 12.5, nnodes=2, nproc_per_node=2, device="cpu", summary="t.py timed out",
              timeout_s=5, limit="stall_timeout_s", where={1: "t.py:3 in main"}).write(tmp_path)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["status"] == "timeout" and data["where"] == {"1": "t.py:3 in main"} and data["in_process"] is False
    assert set(data) == set(RunRecord.__dataclass_fields__)
    back = RunRecord.read(tmp_path)
    assert back.status == RunStatus.TIMEOUT == "timeout" and back.where == {1: "t.py:3 in main"} and back.timeout_s == 5
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


def test_the_pump_logs_every_piece_keeps_transcripts_and_labels_a_nodes_agent_lines(tmp_path):
    pump, log = _pump_for(tmp_path, nodes=(0, 1), nnodes=2)
    pump.lines.put((1, "[rank2]:step 1"))
    pump.lines.put((0, "I1130 agent line"))
    pump.lines.put((0, None))
    assert pump.read_lines(0.01) and pump.open_streams == {1}
    assert log.getvalue() == "[rank2]:step 1\nI1130 agent line\n"
    assert pump.node_transcripts == {0: ["I1130 agent line"], 1: ["[rank2]:step 1"]}
    assert pump.ranked == [(2, "step 1"), (None, "I1130 agent line")]
    assert not pump.read_lines(0.01), "nothing more arrived"


def test_the_failure_outcome_explains_torchruns_own_failure_from_the_transcript(tmp_path):
    pump, _ = _pump_for(tmp_path)
    for line in ["torch.distributed.DistNetworkError: address already in use (EADDRINUSE)"]:
        pump.take(0, line)
    error, record, outcome = failure_error(_plan(tmp_path), pump, {0: 1}, 2.5, command=["torchrun"])
    assert str(error).startswith("t.py failed: torchrun exited with code 1: the port, picked as free for this launch")
    assert outcome.status == RunStatus.FAILED and outcome.elapsed_s == 2.5 and str(outcome.cause) == record.summary
    assert error.returncode == 1 and error.failure is None and error.output_tail == pump.transcript
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
    """What torchrun's --tee passes on from two ranks' marked progress bars (an unfinished chunk, its end mark arriving
    later, a line of the rank's stdout in between): the printer shows each rank's final state once, attributed to its
    rank; the widget view's output area shows the latest state in place meanwhile; output.log keeps every state."""
    buffer, log = LogBuffer(), io.StringIO()
    pump = OutputPump(1, tmp_path, [0], ThrottledPrinter(buffer), log)
    raw = ["[default0]:\x1b[G", "[default0]:\x1b[Ar0 1/50\x1b[G", "[default0]:\x1b[Ar0 2/50[default1]:\x1b[G",
           "[default1]:\x1b[Ar1 1/50\x1b[G", "[default0]:\x1b[G", "[default0]:rank 0 done", "[default1]:\x1b[Ar1 2/50"]
    for line in raw:
        pump.take(0, line)
    assert buffer.lines() == ["[rank 0] rank 0 done", "[rank 0] r0 2/50", "[rank 1] r1 2/50"], "latest states, in place"
    pump.take(0, "[default0]:\x1b[Ar0 3/50\x1b[K")  # rank 0's bar ends: its final state becomes a line
    assert buffer.lines() == ["[rank 0] rank 0 done", "[rank 0] r0 3/50", "[rank 1] r1 2/50"]
    pump.finish()  # the job ended while rank 1 was still redrawing: its latest state is its last word
    assert buffer.lines() == ["[rank 0] rank 0 done", "[rank 0] r0 3/50", "[rank 1] r1 2/50"]
    assert pump.printer.tail(1) == ["r1 2/50"] and pump.printer.tail(0) == ["rank 0 done", "r0 3/50"]
    assert log.getvalue().splitlines() == ["[default0]:r0 1/50", "[default0]:r0 2/50", "[default1]:r1 1/50",
                                           "[default0]:rank 0 done", "[default1]:r1 2/50", "[default0]:r0 3/50"]

    # A text-mode cell (stdout): no line in place, only the final states, as lines.
    out = io.StringIO()
    pump = OutputPump(1, tmp_path, [0], ThrottledPrinter(out), io.StringIO())
    for line in raw + ["[default0]:\x1b[Ar0 3/50\x1b[K"]:
        pump.take(0, line)
    assert out.getvalue() == "[rank 0] rank 0 done\n[rank 0] r0 3/50\n"
    pump.finish()
    assert out.getvalue() == "[rank 0] rank 0 done\n[rank 0] r0 3/50\n[rank 1] r1 2/50\n"


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
