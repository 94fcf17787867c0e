"""torchrun's output and files, read: rank prefixes, redrawn lines, noise, stacks, the root cause. Nothing is launched."""

import json
import os

from conftest import FIXTURES
from tutorial_lib.torchrun.noise import NoiseFilter
from tutorial_lib.torchrun.output_lines import label_line, rank_lines, torchrun_output
from tutorial_lib.torchrun.rank_logs import NodeLogs
from tutorial_lib.torchrun.root_cause import find_root_cause
from tutorial_lib.torchrun.stacks import Frame, Place, innermost_frame, stacks_by_rank, without_tracebacks
from tutorial_lib.torchrun.tee import RankTails, TeeSplitter, split_rank_prefix, split_tee_line


def test_rank_prefix_is_split_and_torchrun_lines_have_no_rank():
    assert split_rank_prefix("[default1]:step 3/5 loss 0.1") == (1, "step 3/5 loss 0.1")
    assert split_rank_prefix("[trainer12]:x", rank_offset=4) == (16, "x")
    assert split_rank_prefix("[1]:") == (None, "[1]:"), "torchrun's failure summary is not a rank's line"
    assert split_rank_prefix("W1130 12:00 api.py:1] Sending process 7 closing signal SIGTERM")[0] is None


def test_a_line_where_torchrun_wrote_several_ranks_chunks_is_split_at_each_ranks_prefix():
    """torchrun's --tee copies an unfinished line of a rank (a ``\\r`` progress bar: its reader turns each ``\\r``
    into a line break) without a newline, so the next chunk of any rank continues the line (measured, torch 2.13)."""
    assert split_tee_line("[default0]:7/50[default1]:") == ["[default0]:7/50", "[default1]:"]
    assert split_tee_line("[default1]:10/50[default0]:8/50") == ["[default1]:10/50", "[default0]:8/50"]
    assert split_tee_line("[default1]:[rank1]: Traceback (most recent call last):") == [
        "[default1]:[rank1]: Traceback (most recent call last):"], "torch's own [rankN]: is no other rank's chunk"
    # several nodes: the launcher's prefix template is [rank<global rank>]:, torch's excepthook adds its own again
    assert split_tee_line("[rank3]:7/50[rank2]:[rank2]: Traceback") == ["[rank3]:7/50", "[rank2]:[rank2]: Traceback"]
    assert split_tee_line("W1130 12:00 api.py:1] [default0]: x") == ["W1130 12:00 api.py:1] [default0]: x"]

    # The lines of a real run (rank 0's and rank 1's bars, then rank 0's print on stdout): every piece to its rank;
    # the empty pieces that only end an unfinished chunk (the newline or next \r arriving alone) are dropped.
    tee = TeeSplitter()
    raw = ["[default0]:", "[default0]:6/50", "[default0]:7/50[default1]:", "[default1]:1/50",
           "[default1]:5/50[default1]:", "[default1]:6/50", "[default0]:", "[default1]:10/50[default0]:8/50",
           "[default0]:46/50[default0]:rank 0 done", "[default0]:"]
    pieces = [piece for line in raw for piece in tee.split(line)]
    assert [split_rank_prefix(p) for p in pieces] == [
        (0, ""), (0, "6/50"), (0, "7/50"), (1, ""), (1, "1/50"), (1, "5/50"), (1, "6/50"), (1, "10/50"), (0, "8/50"),
        (0, "46/50"), (0, "rank 0 done")]
    assert rank_lines("\n".join(raw))[-3:] == [(0, "8/50"), (0, "46/50"), (0, "rank 0 done")]


def test_root_cause_is_read_from_the_summary_and_the_error_file(tmp_path):
    summary = (FIXTURES / "torchrun_failure_summary.txt").read_text()
    error_dir = tmp_path / "logs" / "none_abc" / "attempt_0" / "1"
    error_dir.mkdir(parents=True)
    (error_dir / "error.json").write_text((FIXTURES / "error.json").read_text())
    tails = RankTails()
    tails.add(1, "last words of rank 1")
    failure = find_root_cause(summary, tmp_path / "logs", tails)
    assert failure.rank == 1 and failure.exit_code == 1
    assert "ValueError: boom on rank 1" in failure.traceback
    assert failure.log_tail == ["last words of rank 1"]


def test_root_cause_without_summary_or_error_file_is_unknown(tmp_path):
    assert find_root_cause("torchrun: killed", tmp_path, RankTails()) is None


def _summary(root_rank, root_exit, other_rank, other_exit):
    block = "  time      : 2026-11-30_00:28:30\n  host      : localhost\n  rank      : {r} (local_rank: {r})\n  exitcode  : {e} (pid: 1)\n"
    return ("Failures:\n[1]:\n" + block.format(r=other_rank, e=other_exit)
            + "------\nRoot Cause (first observed failure):\n[0]:\n" + block.format(r=root_rank, e=root_exit))


def _error_file(log_dir, local_rank, message, mtime_ns):
    path = log_dir / "none_x" / "attempt_0" / str(local_rank) / "error.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": message}}}))
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_same_second_tie_in_torchruns_summary_is_broken_by_error_file_times(tmp_path):
    """torchrun's timestamps have 1 s resolution: the peer that failed second can be named root cause."""
    _error_file(tmp_path, 1, "RuntimeError: injected failure on rank 1", 1_000_000_000_000)
    _error_file(tmp_path, 0, "RuntimeError: Connection closed by peer", 1_000_000_000_500)
    tails = RankTails()
    failure = find_root_cause(_summary(root_rank=0, root_exit=1, other_rank=1, other_exit=1), tmp_path, tails)
    assert failure.rank == 1 and failure.exit_code == 1 and "injected failure" in failure.traceback


def test_a_rank_killed_by_a_signal_stays_root_cause_though_a_peer_wrote_an_error_file(tmp_path):
    _error_file(tmp_path, 0, "RuntimeError: Connection closed by peer", 1_000_000_000_500)
    tails = RankTails()
    failure = find_root_cause(_summary(root_rank=1, root_exit=-9, other_rank=0, other_exit=1), tmp_path, tails)
    assert failure.rank == 1 and failure.exit_code == -9 and failure.traceback == ""


def test_an_empty_error_file_and_a_crashed_torchrun_still_name_the_killed_rank(tmp_path):
    """Rank 1 SIGKILLed; rank 0, stopped by torchrun's SIGTERM while @record wrote its error file, left it empty;
    torchrun crashed reading it (JSONDecodeError, no summary: seen once under load, torch 2.13)."""
    _error_file(tmp_path, 0, "x", 1_000_000_000_500)
    (tmp_path / "none_x" / "attempt_0" / "0" / "error.json").write_text("")
    (tmp_path / "none_x" / "attempt_0" / "1").mkdir()
    tails = RankTails()
    failure = find_root_cause("json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)", tmp_path,
                              tails)
    assert failure.rank == 1 and failure.exit_code is None and failure.traceback == ""


def test_a_rank_sigtermed_while_failing_is_not_preferred_over_one_that_exited_itself(tmp_path):
    """Both ranks hit the collective timeout; torchrun SIGTERMs the slower one, which already wrote its error file."""
    _error_file(tmp_path, 1, "RuntimeError: Timed out (rank 1)", 1_000_000_000_000)
    _error_file(tmp_path, 0, "RuntimeError: Timed out (rank 0)", 1_000_000_000_500)
    tails = RankTails()
    failure = find_root_cause(_summary(root_rank=0, root_exit=1, other_rank=1, other_exit=-15), tmp_path, tails)
    assert failure.rank == 0 and failure.exit_code == 1 and "rank 0" in failure.traceback


def test_a_rank_killed_by_a_signal_is_the_cause_when_torchrun_names_the_peer_that_lost_it(tmp_path):
    """Reliability trials: rank 1 SIGKILLed in a save, rank 0 failed on the lost connection and torchrun named rank 0."""
    _error_file(tmp_path, 0, "RuntimeError: [gloo] Read error [127.0.0.1]:5: Connection reset by peer", 1_000_000_000_500)
    tails = RankTails()
    failure = find_root_cause(_summary(root_rank=0, root_exit=1, other_rank=1, other_exit=-9), tmp_path, tails)
    assert failure.rank == 1 and failure.exit_code == -9 and failure.traceback == ""
    # a rank that failed for its own reason stays the cause
    _error_file(tmp_path / "own", 0, "RuntimeError: injected failure on rank 0", 1_000_000_000_000)
    failure = find_root_cause(_summary(root_rank=0, root_exit=1, other_rank=1, other_exit=-9), tmp_path / "own", tails)
    assert failure.rank == 0 and "injected failure" in failure.traceback


def test_a_rank_with_its_own_error_beats_an_earlier_lost_connection(tmp_path):
    """Notebook 05's rank-0-only save: the peer's "Connection closed" file can be written before the timed-out rank's."""
    _error_file(tmp_path, 1, "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:4", 1_000_000_000_000)
    _error_file(tmp_path, 0, "RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 3000ms",
                1_000_000_000_500)
    tails = RankTails()
    failure = find_root_cause(_summary(root_rank=1, root_exit=1, other_rank=0, other_exit=1), tmp_path, tails)
    assert failure.rank == 0 and "Timed out" in failure.traceback


def test_stacks_by_rank_keeps_each_ranks_last_faulthandler_dump():
    ranked = [
        (0, "step 1"), (1, "Current thread 0x01 (most recent call first):"), (1, '  File "/r/a.py", line 3 in old'),
        (1, "step 2"),  # other output closes a dump
        (1, "Thread 0x02 (most recent call first):"), (1, '  File "/lib/python3.11/threading.py", line 9 in wait'),
        (1, ""), (0, "interleaved line of rank 0"),
        (1, "Current thread 0x01 (most recent call first):"), (1, '  File "/r/ddp_train.py", line 210 in inject_failure'),
        (1, '  File "/r/ddp_train.py", line 300 in train'), (None, "torchrun: Sending process 2 closing signal SIGTERM"),
    ]
    stacks = stacks_by_rank(ranked)
    assert set(stacks) == {1} and "in old" not in stacks[1] and "threading.py" in stacks[1]
    frame = Frame("/r/ddp_train.py", 210, "inject_failure")
    assert innermost_frame(stacks[1]) == Place(own=frame, innermost=frame)
    assert str(innermost_frame(stacks[1])) == "ddp_train.py:210 in inject_failure"
    assert stacks_by_rank([]) == {} and stacks_by_rank([(None, "Current thread 0x1 (most recent call first):")]) == {}


def test_the_screen_shows_a_tracebacks_exception_line_not_its_frames():
    """A failed run's cell shows the cause (the exception line) per rank; frames stay in output.log and the error."""
    noise = NoiseFilter()
    lines = [(1, "step 1"), (1, "Traceback (most recent call last):"), (1, '  File "t.py", line 3, in main'),
             (1, "    raise KeyError('x')"), (1, "KeyError: 'x'"), (1, ""),
             (1, "During handling of the above exception, another exception occurred:"), (1, ""),
             (1, "Traceback (most recent call last):"), (1, '  File "t.py", line 5, in main'),
             (1, "           ^^^^^^"), (1, "RuntimeError: injected failure"), (1, "after"),
             (None, "E1130 20:31:20.15 123 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 9) of binary: x"),
             (None, "W1130 20:31:20.15 123 api.py:1028] Sending process 7 closing signal SIGTERM"),
             (0, "Fatal Python error: Aborted"), (0, "Extension modules: numpy._core, torch._C (total: 2)"),
             (None, "W1130 20:31:21.00 123 api.py:900] the agent's own warning")]
    shown = [t for r, t in lines if noise.kind(r, t) is None]
    assert shown == ["step 1", "KeyError: 'x'", "RuntimeError: injected failure", "after", "Fatal Python error: Aborted",
                     "W1130 20:31:21.00 123 api.py:900] the agent's own warning"]
    assert noise.traceback_lines == 9
    assert without_tracebacks([t for r, t in lines if r == 1]) == ["step 1", "after"]


def _terminal(text: str) -> list[str]:
    """What a terminal shows for ``text``: ``\\r``, ``\\n`` and the rank runner's ESC[G, ESC[A, ESC[K (a tiny emulator)."""
    import re as _re

    rows, row, col = [""], 0, 0
    for token in _re.findall(r"\x1b\[[GAK]|\r|\n|[^\x1b\r\n]+", text):
        if token in ("\r", "\x1b[G"):
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            rows += [""] * (row + 1 - len(rows))
        elif token == "\x1b[A":
            row = max(0, row - 1)
        elif token == "\x1b[K":
            rows[row] = rows[row][:col]
        else:
            line = rows[row].ljust(col)
            rows[row], col = line[:col] + token + line[col + len(token):], col + len(token)
    return rows


def test_the_rank_runner_marks_a_line_redrawn_with_carriage_returns_as_a_terminal_draws_it():
    """A rank's log is read as text where a bare ``\\r`` ends a line (torchrun's --tee and the launcher's rank_logs), so
    the rank runner marks redrawn lines (issue 17, input 1); a terminal (``cat`` of a rank's log) shows the marked
    bytes exactly as it shows the script's own."""
    import io

    from tutorial_lib.child.rank_runner import RedrawMarkingStream
    buffer = io.BytesIO()
    stream = RedrawMarkingStream(buffer, encoding="utf-8", newline="\n", write_through=True)
    writes = ["epoch 1\n", "\r  0%|", "\r 50%|#####", "\r100%|##########|", "\n", "done\n", "a\r\n", "\r", "b", "\n"]
    for text in writes:
        assert stream.write(text) == len(text)
    marked = buffer.getvalue().decode()
    assert marked == ("epoch 1\n\x1b[G\n\x1b[A  0%|\x1b[G\n\x1b[A 50%|#####\x1b[G\n\x1b[A100%|##########|\x1b[K\n"
                      "done\na\r\n\x1b[G\n\x1b[Ab\x1b[K\n")
    assert _terminal(marked) == _terminal("".join(writes)) == ["epoch 1", "100%|##########|", "done", "a", "b", ""]
    assert "\r" not in marked.replace("\r\n", ""), "no bare \\r left for a reader of the log to turn into a line break"


def _rank_folder(log_dir, local_rank, attempt=0):
    folder = log_dir / "none_x" / f"attempt_{attempt}" / str(local_rank)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_on_several_nodes_global_ranks_come_from_the_labels_not_the_folder_numbers(tmp_path):
    """c10d hands out node ranks by arrival order: the launcher's node 0 (logs/node0) can hold global ranks 2 and 3.
    Rank 3 raised without @record (its traceback, labelled [rank3]: by torch, is only in its stderr.log); rank 0, on
    node 1's folder, lost its peer and its error file is named in its node's summary."""
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    for node in (node0, node1):
        for local_rank in (0, 1):
            _rank_folder(node, local_rank)
    (_rank_folder(node0, 1) / "stderr.log").write_text(
        "[rank3]: Traceback (most recent call last):\n[rank3]:   File \"/r/train.py\", line 9, in <module>\n"
        "[rank3]: ValueError: bad shard\n")
    _error_file(node1, 0, "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:4", 2_000_000_000_000)
    summary = ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-01_00:00:00\n  host      : localhost\n"
               "  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 5)\n"
               f"  error_file: {node1 / 'none_x' / 'attempt_0' / '0' / 'error.json'}\n  traceback : RuntimeError\n")
    failure = find_root_cause(summary, {0: node0, 1: node1})
    assert (failure.rank, failure.how, failure.raised) == (3, "raised", [3]), failure
    assert failure.traceback.endswith("ValueError: bad shard") and "[rank3]" not in failure.traceback
    assert {e.rank: (e.node, e.local_rank) for e in failure.ends} == {0: (1, 0), 1: (1, 1), 2: (0, 0), 3: (0, 1)}


def test_a_fatal_signal_in_a_ranks_log_beats_the_peer_torchrun_reported_first(tmp_path):
    """torch 2.13, warm start, one busy core: torchrun saw rank 0's exit (code 1, "Connection reset by peer", no
    @record) before rank 1's, and named rank 0 the root cause; rank 1's stderr.log holds faulthandler's report."""
    (_rank_folder(tmp_path, 0) / "stderr.log").write_text(
        "[rank0]: Traceback (most recent call last):\n[rank0]:   File \"/r/segv.py\", line 17, in <module>\n"
        "[rank0]: RuntimeError: [pair.cc:537] Read error [127.0.0.1]:37055: Connection reset by peer.\n")
    (_rank_folder(tmp_path, 1) / "stderr.log").write_text(
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007fe8c106cb80 (most recent call first):\n"
        '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\n'
        '  File "/r/segv.py", line 15 in <module>\n  File "<frozen runpy>", line 88 in _run_code\n'
        '  File "/x/tutorial_lib/child/rank_runner.py", line 218 in run\n\nExtension modules: torch._C (total: 1)\n')
    failure = find_root_cause(_summary(root_rank=0, root_exit=1, other_rank=1, other_exit=-11).replace(
        "rank      : 1 (local_rank: 1)\n  exitcode  : -11 (pid: 1)\n", ""), tmp_path)
    assert (failure.rank, failure.exit_code, failure.signal, failure.how) == (1, -11, "SIGSEGV", "killed by a signal")
    assert failure.fatal_error.splitlines()[0] == "Fatal Python error: Segmentation fault"
    assert "segv.py" in failure.fatal_error and "rank_runner" not in failure.fatal_error, "the runner's frames cut"


# --- every rank's lines from its own files (rank_logs), and output.log's labelled lines (output_lines) ----------------


def _append(path, data):
    with open(path, "ab") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def _texts(lines):
    return [(line.rank, line.stream, line.text) for line in lines if line.complete]


def test_a_ranks_lines_are_its_files_lines_whatever_they_say_and_output_log_reads_them_back_so():
    """Issue 44: rank 0 printed rank 1's --tee prefix at the start of a line and inside one, and the current label:
    all of it is rank 0's, in the log file and read back from output.log; the same text in an older --tee output.log
    was split and credited to rank 1 (which is why the launcher no longer reads that)."""
    printed = ["[default1]:forged", 'x[default1]:check {"a": 1}', "[rank 1] forged",
               "a\x0c[default1]:b\u2028[rank 1] c"]
    log = "".join(label_line(0, text) + "\n" for text in printed) + label_line(None, "W1130 agent line") + "\n"
    assert rank_lines(log) == [(0, text) for text in printed] + [(None, "W1130 agent line")]
    assert torchrun_output(log) == "W1130 agent line"
    old = "[default0]:" + "\n[default0]:".join(printed[:2]) + "\nW1130 agent line\n"
    assert rank_lines(old) == [(0, "[default1]:forged"), (0, "x"), (1, 'check {"a": 1}'), (None, "W1130 agent line")]
    assert torchrun_output(old) == old, "the older format: torchrun's readers read it whole, as before"
    assert rank_lines(label_line(1, "[rank1]: Traceback (most recent call last):")) == [
        (1, "Traceback (most recent call last):")], "torch's own label of the same rank, said once"
    assert rank_lines(label_line(None, "x", node=1) + "\n[batch] srun: error") == [(None, "x"), (None, "srun: error")]


def test_a_rank_files_lines_are_read_as_they_grow_with_their_line_ends_and_characters_whole(tmp_path):
    """One node: the folder's local rank is the rank. A line is complete at \\n, \\r\\n or a bare \\r (as torchrun's own
    text reader has it), even when "\\r\\n" or a UTF-8 character is split between two reads; what is written of an
    unfinished line is reported as such, and again, whole, when it ends; the final read ends it."""
    folder = _rank_folder(tmp_path, 1)
    logs = NodeLogs(tmp_path, one_node=True)
    assert logs.read() == [], "no file yet: nothing, no error"
    _append(folder / "stdout.log", "step 1\nhalf\r")
    _append(folder / "stderr.log", b"caf\xc3")  # the first byte of a two-byte character
    lines = logs.read()
    assert _texts(lines) == [(1, "stdout", "step 1")]
    assert [(line.text, line.complete) for line in lines if not line.complete] == [("half", False), ("caf", False)]
    _append(folder / "stdout.log", "\nbare\rcr\x0cstays\u2028inside\n")
    _append(folder / "stderr.log", b"\xa9 ok\nno end")
    assert _texts(logs.read()) == [(1, "stdout", "half"), (1, "stdout", "bare"),
                                   (1, "stdout", "cr\x0cstays\u2028inside"), (1, "stderr", "caf\u00e9 ok")]
    assert logs.read() == [], "the unfinished line, unchanged, is not reported again"
    assert _texts(logs.read(final=True)) == [(1, "stderr", "no end")]
    assert logs.ranks() == {1}


def test_on_several_nodes_a_folders_lines_wait_for_the_rank_runners_record_of_its_global_rank(tmp_path):
    """The rendezvous decides a node's global ranks: node 1 may run ranks 0 and 1. A folder's lines are held until the
    rank runner's record (written before the script runs) says its rank; a folder without one takes it from its
    attempt's other folders; at the end, lines nothing attributes come with rank None."""
    logs = NodeLogs(tmp_path, one_node=False)
    first, second = _rank_folder(tmp_path, 0), _rank_folder(tmp_path, 1)
    _append(first / "stdout.log", "early\n")
    assert logs.read() == [], "no record yet: held"
    (first / "rank.json").write_text(json.dumps({"rank": 2, "local_rank": 0}))
    _append(second / "stderr.log", "from local rank 1\n")
    assert _texts(logs.read()) == [(2, "stdout", "early"), (3, "stderr", "from local rank 1")]
    assert logs.ranks() == {2, 3}
    other = NodeLogs(tmp_path / "other", one_node=False)
    _append(_rank_folder(tmp_path / "other", 0) / "stderr.log", "python: can't open file\n")
    (_rank_folder(tmp_path / "other", 0) / "rank.json").write_text(json.dumps({"rank": 5, "local_rank": 1}))
    assert other.read() == [], "a record naming another local rank is not this folder's"
    assert [(line.rank, line.local_rank, line.text) for line in other.read(final=True)] == [
        (None, 0, "python: can't open file")]


def test_a_restart_starts_a_new_attempt_and_the_last_one_is_read_to_its_end(tmp_path):
    """torchrun stops an attempt's ranks before it makes the next attempt's folder (--max-restarts): the first
    attempt's unfinished line ends there, and its files are closed."""
    logs = NodeLogs(tmp_path, one_node=True)
    _append(_rank_folder(tmp_path, 0) / "stdout.log", "attempt 0\nkilled mid-")
    assert _texts(logs.read()) == [(0, "stdout", "attempt 0")]
    _append(_rank_folder(tmp_path, 0, attempt=1) / "stdout.log", "attempt 1\n")
    assert [(line.attempt, line.text) for line in logs.read()] == [(0, "killed mid-"), (1, "attempt 1")]
    assert logs.read(final=True) == []


def test_a_restarted_ranks_lines_say_their_attempt_and_the_doctor_takes_the_earlier_attempts_as_evidence():
    """The launcher reads the ranks' files attempt by attempt while torchrun's own lines reach output.log as printed:
    torchrun's "failed (exitcode: -9)" can come before the killed rank's last line. The label says the attempt, and
    the doctor's evidence of a run that finished after a restart is what the earlier attempts printed, wherever the
    lines stand (a 05-style crash in the middle of a save, reproduced from a real run's order)."""
    from tutorial_lib.torchrun.root_cause import before_the_last_attempt
    from tutorial_lib.torchrun.output_lines import attempt_lines, label_line
    assert label_line(1, "x") == "[rank 1] x" and label_line(1, "x", attempt=2) == "[rank 1 attempt 2] x"
    output = "\n".join([
        "[torchrun] E1205 04:16:37.375000 21805 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 21809) of "
        "binary: /usr/bin/python",
        label_line(0, "step 3: saved step-3"), label_line(1, "step 3: saved step-3"),
        label_line(1, "rank 1: killed by SIGKILL in the middle of the step-6 save"),
        label_line(0, "attempt 1: resumed from step-3", attempt=1), label_line(1, "[default0]:forged", attempt=1),
        label_line(1, "step 12: saved step-12", attempt=1)]) + "\n"
    assert [(r, a) for r, a, _ in attempt_lines(output)] == [(None, None), (0, 0), (1, 0), (1, 0), (0, 1), (1, 1),
                                                              (1, 1)]
    assert attempt_lines(output)[5][2] == "[default0]:forged", "a label is read first, the text never split"
    evidence = attempt_lines(before_the_last_attempt(output))
    assert [t for r, _, t in evidence if r == 1][-1] == "rank 1: killed by SIGKILL in the middle of the step-6 save"
    assert not any("attempt 1" in t or "step-12" in t for _, _, t in evidence), evidence
    assert before_the_last_attempt(output.split("\n", 1)[1]) == output.split("\n", 1)[1], "no failure: all of it"
