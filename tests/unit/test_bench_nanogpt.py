"""scripts/bench.py's nanogpt section without running nanoGPT: what a step line is, which steps are measured, how the
rounds become the figure, and a floor target in the table."""

import importlib.util
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("_test_bench", ROOT / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)


def test_the_step_lines_of_both_programs_are_read_and_nothing_else():
    lm, ng = bench.STEP_LINE["train_lm"], bench.STEP_LINE["nanoGPT"]
    assert lm.match("step 12/40 loss 4.1234 lr 1.20e-04 tokens/s 931")[1] == "12"
    assert lm.match("step 40/40 loss 4.1 eval_loss 4.3 lr 1.00e-04 tokens/s 600")[1] == "40"
    assert ng.match("iter 3: loss 4.3032, time 22959.94ms, mfu -100.00%")[1] == "3"
    for other in ("step 0: train loss 5.4655, val loss 5.4842",  # nanoGPT's evaluation line
                  "metrics: /x/metrics/rank<RANK>.jsonl (one JSON line per step per rank, this run's only)",
                  "tokens per iteration will be: 16,384"):
        assert not lm.match(other) and not ng.match(other), other
    own = bench.NANOGPT_ITER.findall("iter 0: loss 5.4, time 84980.98ms, mfu -100.00%\n"
                                     "iter 1: loss 5.2, time 25409.98ms, mfu -100.00%\n")
    assert own == [("0", "84980.98"), ("1", "25409.98")]


def test_the_measured_steps_are_the_ones_after_the_warmup_each_from_the_line_before():
    # Lines of steps 1..6 (train_lm counts from 1) at these times; warm-up 2: steps 3, 4, 5 are measured.
    stamps = {1: 100.0, 2: 130.0, 3: 147.0, 4: 165.0, 5: 182.5, 6: 210.0}
    assert bench.measured_intervals(stamps, warmup=2, steps=3) == [17.0, 18.0, 17.5]
    # nanoGPT counts from 0: the same lines one lower are the same steps.
    assert bench.measured_intervals({k - 1: v for k, v in stamps.items()}, 2, 3) == [17.0, 18.0, 17.5]
    assert bench.measured_intervals(stamps, warmup=1, steps=1) == [30.0]


@pytest.mark.parametrize("stamps, warmup, steps", [({1: 0.0, 2: 1.0}, 2, 1),  # too few lines
                                                    ({1: 0.0, 2: 1.0, 4: 2.0}, 1, 2),  # a step line missing
                                                    ({1: 0.0, 2: 1.0}, 0, 1)])  # no line before the first step
def test_too_few_or_missing_step_lines_are_an_error_not_a_figure(stamps, warmup, steps):
    with pytest.raises(ValueError):
        bench.measured_intervals(stamps, warmup, steps)


def test_the_figure_is_the_median_of_the_rounds_ratios():
    rounds = [{"train_lm": 932.0, "nanoGPT": 965.0, "train_lm cpu": 950.0, "nanoGPT cpu": 950.0},
              {"train_lm": 500.0, "nanoGPT": 1000.0, "train_lm cpu": 990.0, "nanoGPT cpu": 1000.0},  # a loaded round
              {"train_lm": 980.0, "nanoGPT": 970.0, "train_lm cpu": 1000.0, "nanoGPT cpu": 990.0}]
    s = bench.round_summary(rounds)
    assert s["ratios"] == [932 / 965, 0.5, 980 / 970]
    assert s["ratio"] == 932 / 965  # the median ratio, not the ratio of medians (980 / 970) nor of sums
    assert (s["train_lm"], s["nanoGPT"]) == (932.0, 970.0)
    assert bench.round_summary(rounds, " cpu")["ratio"] == statistics.median([1.0, 0.99, 1000 / 990])


def test_a_floor_target_is_met_at_or_above_it():
    assert bench.row("r", 1.0, 1.0, at_least=True)["ok"] is True
    assert bench.row("r", 0.99, 1.0, at_least=True)["ok"] is False
    assert bench.row("r", 1.01, 1.0)["ok"] is False  # a ceiling, as before
    assert bench.row("r", 0.5, None)["ok"] is None


def test_cpu_seconds_reads_this_process():
    t = bench.cpu_seconds(__import__("os").getpid())
    assert 0 < t < 1e6
