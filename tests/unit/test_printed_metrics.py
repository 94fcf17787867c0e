"""Loss points read from the lines a script prints (``tutorial_lib.runs.printed_metrics``) and which script ``run_script``
runs: a shipped lesson or a script of your own (issue 26). Nothing is launched."""

import json
import re

import pytest

import tutorial_lib as tl
from tutorial_lib.launcher.run import own_script
from tutorial_lib.runs.printed_metrics import (DEFAULT_LOSS_PATTERN, PrintedMetricsWriter, compile_loss_pattern,
                                               parse_loss_line, printed_metrics_path)

DEFAULT = compile_loss_pattern(DEFAULT_LOSS_PATTERN)


@pytest.mark.parametrize("line, expected", [
    ("iter 10: loss 2.3456, time 41.20ms, mfu 1.23%", (10, 2.3456)),  # nanoGPT's train.py
    ("step 10/100 | loss=0.5", (10, 0.5)),
    ("Step 3: Loss: 1.2e-3", (3, 0.0012)),
    ("epoch 1 step 5 loss 0.25 lr 0.001", (5, 0.25)),
    ("iteration 12, loss 0.3", (12, 0.3)),
    ("global_step=7 loss=-1.5", (7, -1.5)),
    ("[step 4] loss .75", (4, 0.75)),
])
def test_the_default_pattern_reads_the_usual_step_and_iter_lines(line, expected):
    assert parse_loss_line(DEFAULT, line) == expected


@pytest.mark.parametrize("line", [
    "step 0: train loss 4.1744, val loss 4.1718",  # nanoGPT's evaluation line
    "step 5 - loss: 0.5 - val_loss: 0.6",
    "iter 3: eval loss 1.0",
    "step 10/40 epoch 0 loss_local 0.50000 samples/s 1000",  # the workbook's own lines: their JSON is the metrics
    "steps 5 loss 3",
    "mystep 5 loss 3",
    "iter 10: lossy 3",
    "loss 0.5",
    "step 3 done",
])
def test_the_default_pattern_leaves_out_evaluations_longer_words_and_lines_without_a_step(line):
    assert parse_loss_line(DEFAULT, line) is None


def test_a_pattern_of_your_own_names_its_groups_or_has_two_and_nan_is_a_number():
    named = compile_loss_pattern(r"loss=(?P<loss>\S+) at batch (?P<step>\d+)")
    assert parse_loss_line(named, "loss=0.5 at batch 3") == (3, 0.5)
    assert parse_loss_line(named, "LOSS=0.5 AT BATCH 3") == (3, 0.5), "a string pattern ignores case"
    positional = compile_loss_pattern(re.compile(r"b(\d+) l(\S+)"))
    assert parse_loss_line(positional, "b7 lnan")[0] == 7 and parse_loss_line(positional, "B7 l1") is None
    assert parse_loss_line(positional, "b7 lfoo") is None, "a loss that is no number is no point"
    assert compile_loss_pattern(None) is None


@pytest.mark.parametrize("pattern, match", [
    (r"loss (\d+)", "needs the groups"),
    (r"(?P<step>\d+) (?P<loss>x) (y)", None),  # named groups: extra groups are fine
    (r"(a)(b)(c)", "exactly two groups"),
    (r"step (?P<step>\d+", "is not a regular expression"),
    (re.compile(rb"(\d+) (\d+)"), "compiled re.Pattern of str"),
    (3, "must be a str or a compiled re.Pattern"),
])
def test_a_bad_pattern_is_a_config_error_naming_it(pattern, match):
    if match is None:
        assert compile_loss_pattern(pattern).groups == 3
        return
    with pytest.raises(tl.ConfigError, match=match):
        compile_loss_pattern(pattern)


def test_printed_points_are_written_per_rank_and_read_back_one_per_step_the_last_winning(tmp_path):
    writer = PrintedMetricsWriter(tmp_path, DEFAULT)
    assert writer.take(None, "iter 1: loss 9.0", 0.1) is None, "torchrun's own lines are no rank's"
    assert writer.take(0, "hello", 0.1) is None and not (tmp_path / "metrics").exists(), "no point, no file"
    for rank, text, t in [(0, "iter 1: loss 3.0", 0.5), (1, "step 1 loss 4.0", 0.6), (0, "iter 2: loss 2.0", 0.7),
                          (0, "iter 2: loss 1.5", 0.8)]:
        assert writer.take(rank, text, t)["loss_local"] == float(text.rsplit(" ", 1)[1])
    lines = printed_metrics_path(tmp_path, 0).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 2], "every matching line is kept in the file"
    table = tl.runs.read_printed_metrics(tmp_path)
    assert table[["rank", "step", "loss_local"]].values.tolist() == [[0, 1, 3.0], [0, 2, 1.5], [1, 1, 4.0]]
    assert table["line"].tolist()[1] == "iter 2: loss 1.5" and table["time_s"].tolist() == [0.5, 0.8, 0.6]
    assert not list((tmp_path / "metrics").glob("rank*.jsonl")), "read_metrics' files are the scripts' own"


def test_a_run_without_printed_points_says_what_to_do(tmp_path):
    with pytest.raises(tl.errors.MetricsError, match="no line matched the launch's loss_pattern"):
        tl.runs.read_printed_metrics(tmp_path)


def test_run_script_runs_a_shipped_name_as_the_lesson_and_a_path_or_a_file_here_as_your_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("")
    (tmp_path / "sub").mkdir()
    assert own_script("ddp_train") is None and own_script("ddp_train.py") is None
    assert own_script("mine.py") == tmp_path / "mine.py" and own_script(tmp_path / "mine.py") == tmp_path / "mine.py"
    assert own_script("./mine.py") == tmp_path / "mine.py"
    with pytest.raises(tl.ConfigError, match="unknown script 'nope.py': it is no file"):
        own_script("nope.py")
    with pytest.raises(tl.ConfigError, match="is a folder"):
        own_script("sub")
    (tmp_path / "ddp_train.py").write_text("# a copy of the lesson, edited")
    with pytest.raises(tl.ConfigError, match=r"both a shipped script and a file .* or './ddp_train.py' for your file"):
        own_script("ddp_train.py")
    assert own_script("./ddp_train.py") == tmp_path / "ddp_train.py" and own_script("ddp_train") is None
