"""``diagnosis.collectives.extra_collective``: the rank that issued a collective the others had moved past, from the
observer's records (built here as the reader makes them), whichever rank's timeout fired first.

The records follow notebook 07's exercise 3 starter as the observer wrote it on torch 2.13 (DDP on 2 gloo ranks):
DDP's constructor (an all-gather, two broadcasts, line 14), step 1's backward (one bucket, line 20), the optimizer
step (line 21); then rank 0 all-reduces its loss inside ``if rank == 0:`` (line 23) while rank 1 goes round the loop
to step 2's forward, where DDP broadcasts its rebuilt buckets (line 18).
"""

from __future__ import annotations

from pathlib import Path

from tutorial_lib.diagnosis.collectives import extra_collective
from tutorial_lib.runs.observed import Backward, CallSite, Collective, ObservedRank, ObservedRun, OptimizerStep

PATH = "/runs/x/train.py"


def site(line: int, function: str = "<module>", path: str = PATH) -> tuple[CallSite, ...]:
    return (CallSite(path, line, function),)


class Record:
    """One rank's record, written in order: each event gets the next ``seq``."""

    def __init__(self, rank: int) -> None:
        self.rank = ObservedRank(rank=rank, world_size=2, restart=0, groups={"0": {"size": 2}})
        self.seq = 1

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def collective(self, op: str, nbytes: int, line: int | None, backward: int | None = None, **kw) -> Record:
        stack = site(line, **kw) if line is not None else ()
        group_seq = len(self.rank.collectives) + 1
        self.rank.collectives.append(Collective(
            seq=self._next(), op=op, kind=op, torch_op=f"c10d::{op}", group="0", group_size=2, group_seq=group_seq,
            input_bytes=nbytes, output_bytes=nbytes, dtype="float32", shapes=(), reduce_op=None,
            step=len(self.rank.steps) + 1, backward=backward, stack=stack))
        return self

    def backward(self, line: int | None = 20) -> Record:
        index = len(self.rank.backwards) + 1
        self.rank.backwards.append(Backward(index, len(self.rank.steps) + 1, 0.5, 1, (), "float32", self._next(),
                                            site(line) if line is not None else ()))
        return self

    def step(self, line: int | None = 21) -> Record:
        self.rank.steps.append(OptimizerStep(len(self.rank.steps) + 1, "SGD", 1, (0.01,), 0, (), self._next(),
                                             site(line) if line is not None else ()))
        return self

    def train_step(self, lines: bool = True) -> Record:
        """forward, backward (DDP's one bucket inside it), optimizer step."""
        self.backward(20 if lines else None)
        return self.collective("all_reduce", 1284, 20 if lines else None, backward=len(self.rank.backwards)).step(
            21 if lines else None)

    def ended(self, code: int = 0) -> Record:
        self.rank.exit_code = code
        return self


def start(rank: int, lines: bool = True) -> Record:
    record = Record(rank)
    for op, nbytes in (("all_gather", 8), ("broadcast", 96), ("broadcast", 1284)):  # DDP's constructor
        record.collective(op, nbytes, 14 if lines else None)
    return record.train_step(lines)


def run(*records: Record) -> ObservedRun:
    return ObservedRun(Path("/runs/x"), {r.rank.rank: r.rank for r in records})


def test_the_rank_that_called_a_collective_the_other_went_round_the_loop_past_is_named():
    waiting = start(0).collective("all_reduce", 4, 23)  # inside `if rank == 0:`, after the optimizer step
    moved_on = start(1).collective("broadcast", 20, 18)  # step 2's forward: line 18 < 21, the loop went round
    extra = extra_collective(run(waiting, moved_on))
    assert (extra.ranks, extra.op, extra.input_bytes, extra.where, extra.index, extra.step, extra.others) == \
        ((0,), "all_reduce", 4, "train.py:23", 5, 2, {1: "broadcast"})
    # the control: the same script with `if rank == 1:` names rank 1
    extra = extra_collective(run(start(0).collective("broadcast", 20, 18), start(1).collective("all_reduce", 4, 23)))
    assert (extra.ranks, extra.op, extra.where, extra.others) == ((1,), "all_reduce", "train.py:23", {0: "broadcast"})


def test_a_rank_a_whole_step_ahead_or_finished_is_past_the_collective():
    # rank 1 skips step 2's loss all-reduce: its next collective is in step 3's backward
    ahead = start(1).collective("all_reduce", 4, 23).train_step().train_step()
    behind = start(0).collective("all_reduce", 4, 23).train_step().collective("all_reduce", 4, 23)
    extra = extra_collective(run(behind, ahead))
    assert (extra.ranks, extra.op, extra.index, extra.others) == ((0,), "all_reduce", 7, {1: "all_reduce"})
    # a final barrier only rank 0 calls: rank 1 returned (its record's end, or the launcher's word for it)
    barrier = start(0).collective("barrier", 0, 30)
    assert extra_collective(run(barrier, start(1).ended(0))).ranks == (0,)
    assert extra_collective(run(barrier, start(1)), finished={1}).ranks == (0,)


def test_a_late_rank_or_a_mismatch_at_the_same_point_names_nobody():
    # a hang: rank 1 sleeps before step 2's backward; rank 0 waits in step 2's bucket. Rank 1 is late, not past.
    waiting = start(0).backward().collective("all_reduce", 1284, 20, backward=2)
    assert extra_collective(run(waiting, start(1))) is None
    assert extra_collective(run(waiting, start(1).ended(1))) is None, "a rank that raised did not move past it"
    # two different collectives at the same point of the same pass: a mismatch, neither rank is behind
    assert extra_collective(run(start(0).collective("all_reduce", 4, 23), start(1).collective("broadcast", 4, 23))) \
        is None
    # the records agree as far as each went
    assert extra_collective(run(start(0).ended(0), start(1).ended(0))) is None


def test_records_without_call_sites_name_nobody_at_the_same_counts():
    """A record the observer wrote before it kept call sites: the counts alone cannot say which rank went round."""
    waiting = start(0, lines=False).collective("all_reduce", 4, None)
    moved_on = start(1, lines=False).collective("broadcast", 20, None)
    assert extra_collective(run(waiting, moved_on)) is None


def test_the_pass_is_read_in_the_function_that_holds_the_loop():
    """The training step in a function: both ranks call it from line 40 of main(); rank 1's next collective is at an
    earlier line of train_step than the optimizer step both took, so it is the next call of train_step."""
    def nested(line: int) -> tuple[CallSite, ...]:
        return (CallSite(PATH, 40, "main"), CallSite(PATH, line, "train_step"))

    records = [start(r) for r in (0, 1)]
    for record in records:  # the last event, the optimizer step, as called from train_step
        record.rank.steps[-1] = OptimizerStep(1, "SGD", 1, (0.01,), 0, (), record.rank.steps[-1].seq, nested(33))
    records[0].collective("all_reduce", 4, 23)
    records[0].rank.collectives[-1] = Collective(**{**records[0].rank.collectives[-1].__dict__, "stack": nested(35)})
    records[1].collective("broadcast", 20, 18)
    records[1].rank.collectives[-1] = Collective(**{**records[1].rank.collectives[-1].__dict__, "stack": nested(28)})
    extra = extra_collective(run(*records))
    assert extra.ranks == (0,) and extra.where == "train.py:35"
