"""tutorial_lib.runs.pipeline: a pipeline's recorded orders replayed in slots (the bubble), its clock checked against the
data flow, and its timeline drawn. Pure functions: nothing is launched."""

from fractions import Fraction

import pandas as pd
import pytest
from matplotlib.figure import Figure

import tutorial_lib as tl


def gpipe(p, m):
    return {s: [f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)] for s in range(p)}


def one_f_one_b(p, m):
    """Schedule1F1B's order on each stage: p - s warm-up forwards (at most m), then one backward, one forward."""
    orders = {}
    for s in range(p):
        warmup = min(m, p - s)
        order, f, b = [f"F{i}" for i in range(warmup)], warmup, 0
        while b < m:
            order.append(f"B{b}")
            b += 1
            if f < m:
                order.append(f"F{f}")
                f += 1
        orders[s] = order
    return orders


def exact_idle(slots):
    span = int(slots["end_slot"].max() - slots["start_slot"].min())
    busy = (slots["end_slot"] - slots["start_slot"]).groupby(slots["stage"]).sum()
    return {s: Fraction(span - int(b), span) for s, b in busy.items()}


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
def test_gpipe_and_1f1b_orders_idle_exactly_the_textbook_bubble(schedule, p, m):
    slots = tl.runs.replay_slots(schedule(p, m))
    assert set(exact_idle(slots).values()) == {Fraction(p - 1, m + p - 1)}
    assert tl.runs.idle_fractions(slots).tolist() == pytest.approx([tl.runs.gpipe_bubble(p, m)] * p)


@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
def test_the_bubble_does_not_depend_on_backward_taking_longer(schedule):
    slots = tl.runs.replay_slots(schedule(2, 4), forward_slots=1, backward_slots=2)
    assert set(exact_idle(slots).values()) == {Fraction(1, 5)}


def test_the_seeds_two_halves_without_micro_batches_idle_half_the_step():
    slots = tl.runs.replay_slots({0: ["F0", "B0"], 1: ["F0", "B0"]})
    assert slots.to_dict("records") == [
        {"stage": 0, "action": "F", "microbatch": 0, "start_slot": 0, "end_slot": 1},
        {"stage": 1, "action": "F", "microbatch": 0, "start_slot": 1, "end_slot": 2},
        {"stage": 1, "action": "B", "microbatch": 0, "start_slot": 2, "end_slot": 3},
        {"stage": 0, "action": "B", "microbatch": 0, "start_slot": 3, "end_slot": 4}]
    assert exact_idle(slots) == {0: Fraction(1, 2), 1: Fraction(1, 2)}


def test_a_worse_order_shows_a_larger_bubble():
    """Stage 1 running its backwards in reverse waits for nothing less: the replay sees what the stages did."""
    slow = {0: ["F0", "F1", "B0", "B1"], 1: ["F0", "F1", "B1", "B0"]}
    assert exact_idle(tl.runs.replay_slots(slow))[0] > Fraction(1, 3)


def test_orders_that_cannot_have_run_are_refused_with_the_waiting_actions():
    with pytest.raises(ValueError, match=r"cannot have run.*\{0: 'B0', 1: 'F0'\}"):
        tl.runs.replay_slots({0: ["B0", "F0"], 1: ["F0", "B0"]})
    with pytest.raises(ValueError, match="stage 1: action 'X0' is not F<i> or B<i>"):
        tl.runs.replay_slots({0: ["F0"], 1: ["X0"]})
    with pytest.raises(ValueError, match=r"stages 0 \.\. p - 1, got \[1, 2\]"):
        tl.runs.replay_slots({1: ["F0"], 2: ["F0"]})
    with pytest.raises(ValueError, match="stages=0"):
        tl.runs.gpipe_bubble(0, 4)


def test_in_flight_counts_forwards_not_yet_backwarded():
    assert tl.runs.in_flight(gpipe(2, 8)[0]) == 8
    assert [tl.runs.in_flight(one_f_one_b(4, 8)[s]) for s in range(4)] == [4, 3, 2, 1]


def recorded(run, stage_events):
    return [{"schedule": "gpipe", "microbatches": 1, "stage": s, "position": i, "action": a, "microbatch": 0,
             "start_ms": start, "end_ms": end, "saved_bytes_after": 0} for s, events in stage_events.items()
            for i, (a, start, end) in enumerate(events)]


def test_the_clock_is_checked_against_the_data_flow():
    good = pd.DataFrame(recorded("x", {0: [("F", 0, 1), ("B", 6, 8)], 1: [("F", 1.5, 2), ("B", 3, 5)]}))
    assert tl.runs.order_violations(good) == []
    assert tl.runs.measured_idle(good).round(3).to_dict() == {0: 0.625, 1: 0.688}
    bad = pd.DataFrame(recorded("x", {0: [("F", 0, 1), ("B", 4, 8)], 1: [("F", 0.5, 2), ("B", 3, 5)]}))
    assert sorted(tl.runs.order_violations(bad)) == [
        "stage 0 B0 started at 4.000 ms, before stage 1 B0 ended at 5.000 ms",
        "stage 1 F0 started at 0.500 ms, before stage 0 F0 ended at 1.000 ms"]


def test_pipeline_events_flattens_every_rank_and_configuration_from_the_first_start():
    ranks = [{"stage": s, "runs": [{"schedule": "gpipe", "microbatches": 2, "events": [
        {"action": a, "microbatch": i, "start_s": 100 + s + k, "end_s": 100.5 + s + k, "saved_bytes_after": 8}
        for k, (a, i) in enumerate([("F", 0), ("F", 1), ("B", 0), ("B", 1)])]}]} for s in (0, 1)]
    events = tl.runs.pipeline_events(ranks)
    assert len(events) == 8 and events["start_ms"].min() == 0 and events["end_ms"].max() == pytest.approx(4500)
    assert list(events[events["stage"] == 1]["position"]) == [0, 1, 2, 3]


def test_the_timeline_draws_one_bar_per_action_per_panel_and_refuses_a_unit_it_lacks():
    slots = pd.concat([tl.runs.replay_slots(gpipe(2, 4)).assign(panel="gpipe"),
                       tl.runs.replay_slots(one_f_one_b(2, 4)).assign(panel="1f1b")])
    fig = tl.plots.plot_pipeline_timeline(slots, "slot", "m = 4")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["gpipe", "1f1b"]
    assert all(sum(len(c.get_paths()) for c in ax.collections) >= 16 for ax in fig.axes), "2 stages x 8 actions"
    assert {t.get_text() for t in fig.axes[0].texts} >= {"F0", "B3"}
    with pytest.raises(ValueError, match="unit must be 'slot' or 'ms'"):
        tl.plots.plot_pipeline_timeline(slots, "ms")
