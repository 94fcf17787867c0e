"""What a pipeline did, from a finished ``pipeline_parallel.py`` run: each stage's recorded forwards and backwards,
replayed in equal time slots to count the bubble, checked for order, and measured from the clock.

The bubble of a pipeline schedule (GPipe, Huang et al. 2019, arXiv:1811.06965; 1F1B, Narayanan et al. 2021,
arXiv:2104.04473 section 2.2) is the fraction of a step a stage spends idle: with p stages, m micro-batches and
every forward (and every backward) the same length on every stage, (p - 1) / (m + p - 1). ``replay_slots`` derives
it from what the stages did: each stage's recorded order of actions, and the data dependencies between stages (a
micro-batch's forward on stage s needs its forward on stage s - 1, its backward on stage s needs its backward on
stage s + 1), each action started as early as both allow. The clock measures the same thing with real durations
(``measured_idle``), which vary with the machine; the slots do not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd


def gpipe_bubble(stages: int, microbatches: int) -> float:
    """The idle fraction of every stage in a GPipe (or 1F1B) step of equal-length actions: (p - 1) / (m + p - 1).

    Raises: ValueError when ``stages`` or ``microbatches`` is below 1.
    """
    if stages < 1 or microbatches < 1:
        raise ValueError(f"stages and microbatches must be >= 1, got stages={stages}, microbatches={microbatches}")
    return (stages - 1) / (microbatches + stages - 1)


def pipeline_events(ranks: Sequence[Mapping]) -> pd.DataFrame:
    """Every recorded action of every configuration, one row each, from ``read_rank_json(run_dir, "pp")``.

    Returns: columns ``schedule`` ("gpipe", "1f1b", "by hand"), ``microbatches`` (m), ``stage``, ``position`` (its
    index in the stage's order), ``action`` ("F" or "B"), ``microbatch``, ``start_ms`` and ``end_ms`` (from the
    configuration's first start on any stage; every rank of one machine reads the same monotonic clock),
    ``saved_bytes_after`` (the stage's bytes saved for backward right after the action).
    """
    rows = []
    for rank in ranks:
        for run in rank["runs"]:
            for position, event in enumerate(run["events"]):
                rows.append({"schedule": run["schedule"], "microbatches": run["microbatches"], "stage": rank["stage"],
                             "position": position, "action": event["action"], "microbatch": event["microbatch"],
                             "start_s": event["start_s"], "end_s": event["end_s"],
                             "saved_bytes_after": event["saved_bytes_after"]})
    events = pd.DataFrame(rows)
    first = events.groupby(["schedule", "microbatches"])["start_s"].transform("min")
    events["start_ms"] = (events["start_s"] - first) * 1e3
    events["end_ms"] = (events["end_s"] - first) * 1e3
    return events.drop(columns=["start_s", "end_s"])


def replay_slots(orders: Mapping[int, Sequence[str]], forward_slots: int = 1, backward_slots: int = 1) -> pd.DataFrame:
    """Replay each stage's recorded order of actions in time slots: every action as early as its stage is free and
    its dependency is done.

    Args:
        orders: stage index (0 .. p - 1) -> the actions it ran, in order: ``"F3"`` (forward of micro-batch 3),
            ``"B3"`` (its backward).
        forward_slots, backward_slots: slots a forward and a backward take (the bubble fraction of GPipe and 1F1B
            does not depend on their ratio; 1 and 1 is the textbook picture).

    Returns: one row per action: ``stage``, ``action``, ``microbatch``, ``start_slot``, ``end_slot``.

    Raises:
        ValueError: stages not numbered 0 .. p - 1, an action that is not F<i>/B<i>, or orders that cannot have run
            (an action waits for one that never runs before it: a deadlock), naming the stage and the action.
    """
    stages = sorted(orders)
    if stages != list(range(len(stages))):
        raise ValueError(f"orders must have stages 0 .. p - 1, got {stages}")
    parsed = {s: [_parse(a, s) for a in orders[s]] for s in stages}
    last = len(stages) - 1
    end, free, position, rows = {}, dict.fromkeys(stages, 0), dict.fromkeys(stages, 0), []
    while any(position[s] < len(parsed[s]) for s in stages):
        progressed = False
        for s in stages:
            while position[s] < len(parsed[s]):
                kind, mb = parsed[s][position[s]]
                needs = _dependency(s, kind, mb, last)
                if needs is not None and needs not in end:
                    break
                start = max(free[s], end.get(needs, 0))
                end[(s, kind, mb)] = free[s] = start + (forward_slots if kind == "F" else backward_slots)
                rows.append({"stage": s, "action": kind, "microbatch": mb, "start_slot": start, "end_slot": free[s]})
                position[s] += 1
                progressed = True
        if not progressed:
            waiting = {s: "".join(map(str, parsed[s][position[s]])) for s in stages if position[s] < len(parsed[s])}
            raise ValueError(f"these orders cannot have run: every unfinished stage waits for an action no stage ran "
                             f"before it (stage: next action) {waiting}")
    return pd.DataFrame(rows)


def _dependency(stage: int, kind: str, microbatch: int, last: int) -> tuple[int, str, int] | None:
    """What an action waits for from another stage: a forward, the previous stage's forward of the micro-batch; a
    backward, the next stage's backward of it (None on the first stage's forwards and the last stage's backwards)."""
    if kind == "F" and stage > 0:
        return stage - 1, "F", microbatch
    if kind == "B" and stage < last:
        return stage + 1, "B", microbatch
    return None


def _parse(action: str, stage: int) -> tuple[str, int]:
    if len(action) < 2 or action[0] not in "FB" or not action[1:].isdigit():
        raise ValueError(f"stage {stage}: action {action!r} is not F<i> or B<i> (forward or backward of micro-batch i)")
    return action[0], int(action[1:])


def idle_fractions(slots: pd.DataFrame) -> pd.Series:
    """Per stage, the fraction of the step (first start to last end over all stages) in which it ran nothing.

    Args: ``replay_slots``'s table, or any table with ``stage``, ``start_slot``, ``end_slot``.
    """
    span = slots["end_slot"].max() - slots["start_slot"].min()
    busy = (slots["end_slot"] - slots["start_slot"]).groupby(slots["stage"]).sum()
    return 1 - busy / span


def measured_idle(events: pd.DataFrame) -> pd.Series:
    """Per stage, the idle fraction of the step measured with the clock (``pipeline_events`` rows of one
    configuration): 1 - (time inside its actions) / (first start to last end over all stages). Varies from run to
    run with the machine's load; print it, do not assert it."""
    span = events["end_ms"].max() - events["start_ms"].min()
    return 1 - (events["end_ms"] - events["start_ms"]).groupby(events["stage"]).sum() / span


def order_violations(events: pd.DataFrame) -> list[str]:
    """Dependencies the recorded times break (``pipeline_events`` rows of one configuration): a forward that started
    before the previous stage's forward of the same micro-batch ended, or a backward before the next stage's
    backward of it ended. Empty when the clock agrees with the data flow (one machine: one clock)."""
    at = {(r.stage, r.action, r.microbatch): r for r in events.itertuples()}
    last = events["stage"].max()
    found = []
    for (stage, action, mb), r in at.items():
        other = _dependency(stage, action, mb, last)
        if other in at and r.start_ms < at[other].end_ms:
            found.append(f"stage {stage} {action}{mb} started at {r.start_ms:.3f} ms, before stage {other[0]} "
                         f"{other[1]}{mb} ended at {at[other].end_ms:.3f} ms")
    return found


def in_flight(order: Sequence[str]) -> int:
    """The most micro-batches a stage held between their forward and their backward, from its order of actions."""
    held = peak = 0
    for action in order:
        held += 1 if action.startswith("F") else -1
        peak = max(peak, held)
    return peak
