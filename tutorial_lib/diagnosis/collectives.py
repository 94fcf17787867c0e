"""The collective some ranks issued and the others did not, from what the observer saw each rank do.

Every collective is a rendezvous: the n-th collective of a group on one rank meets the n-th on the others. When a
script calls one inside a branch only some ranks take (``if rank == 0: dist.all_reduce(loss)``), its records
(``runs.observed``, a launch with ``observe=True``) disagree from that collective on: rank 0's n-th is the extra
all-reduce, rank 1's n-th is its next collective (or none: it finished). Torch reports a timeout on whichever rank
gives up first; the records say the same thing in every run, and they say which rank is behind.

A rank is *past* another's n-th collective when it had done more before its own n-th: more optimizer steps, more
``backward()`` calls, or the same counts but a later pass through the loop. The pass is read from where the script
called each thing (``Collective.stack``): after the same last event (an optimizer step, a backward, a collective, at
the same line on both ranks), a rank whose n-th collective is at a later line of the same function is still in that
pass; one at an earlier line (or the same line again) has gone round the loop. The ranks whose n-th collective every
other rank is past issued a collective those ranks did not: that is ``extra_collective``. A rank that finished is
past everything; a rank stopped elsewhere with no more done than the waiting rank is not (it is late: a hang, not an
extra collective), and then nothing is concluded.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runs.observed import CallSite, Collective, ObservedRun

_FINISHED = (float("inf"), float("inf"), 1)


@dataclass(frozen=True)
class ExtraCollective:
    """A collective that ``ranks`` issued and every other rank had moved past without issuing.

    Attributes:
        ranks: the ranks that issued it (global), in order.
        op: its ``torch.distributed`` name (``"all_reduce"``), ``input_bytes`` and ``dtype`` as recorded.
        group: the process group's name; index: its number among the group's collectives on those ranks (from 1).
        step: the optimizer step it led up to (from 1).
        site: where the script called it (its innermost own frame), or ``None`` when the record holds no frame.
        others: ``{rank: op}`` of what each other rank issued as its collective ``index`` of the group (``None``:
            none, it finished or was stopped elsewhere).
    """

    ranks: tuple[int, ...]
    op: str
    input_bytes: int
    dtype: str | None
    group: str
    index: int
    step: int
    site: CallSite | None
    others: dict[int, str | None]

    @property
    def where(self) -> str:
        """``"train.py:22"``, or ``"?"`` without a frame."""
        return self.site.where if self.site is not None else "?"


def _token(c: Collective | None) -> tuple | None:
    return None if c is None else (c.op, c.input_bytes, c.dtype)


def _frame(site: CallSite) -> tuple:
    return (site.path, site.function, site.line)


def _anchor(rank, c: Collective):
    """The rank's last recorded event before ``c``: a collective, a ``backward()`` or an optimizer step."""
    before = [e for e in (*rank.collectives, *rank.backwards, *rank.steps) if 0 < e.seq < c.seq]
    return max(before, key=lambda e: e.seq, default=None)


def _pass(c: Collective, anchor) -> int | None:
    """0: ``c`` comes later in the same pass through the script's code as ``anchor``; 1: the code went round a loop
    in between; ``None``: the frames cannot tell."""
    if anchor is None:
        return None
    if c.backward is not None and getattr(anchor, "backward", getattr(anchor, "index", None)) == c.backward:
        return 0  # the same backward() call
    a, b = anchor.stack, c.stack
    if not a or not b:
        return None
    for x, y in zip(a, b):
        if _frame(x) == _frame(y):
            continue
        if (x.path, x.function) != (y.path, y.function):
            return None
        return 0 if y.line > x.line else 1
    return 1 if len(a) == len(b) else 0  # the same line again: a new pass; a deeper call from it: the same one


def _anchor_key(rank, c: Collective) -> tuple | None:
    anchor = _anchor(rank, c)
    return None if anchor is None else (type(anchor).__name__, tuple(map(_frame, anchor.stack)))


def _position(rank, c: Collective | None, finished: bool) -> tuple:
    """``(optimizer steps done, backward() calls started, pass)`` when the rank issued ``c``; where it stopped
    (pass ``None``) when it issued no such collective; past everything when it finished."""
    if c is None:
        return _FINISHED if finished else (len(rank.steps), len(rank.backwards), None)
    backwards = sum(1 for b in rank.backwards if b.seq < c.seq) if c.backward is None else c.backward
    return c.step - 1, backwards, _pass(c, _anchor(rank, c))


def _past(p: tuple, q: tuple, same_anchor: bool) -> bool:
    """Whether position ``p`` is past position ``q``."""
    if p == _FINISHED:
        return q != _FINISHED
    if p[:2] != q[:2]:
        return p[:2] > q[:2]
    return same_anchor and p[2] == 1 and q[2] == 0


def extra_collective(observed: ObservedRun, finished: set[int] = frozenset()) -> ExtraCollective | None:
    """The first collective, group by group, that some ranks issued and every other rank had moved past without
    issuing, from the ranks' records; ``None`` when the records agree, or disagree without a rank being behind (a
    rank stopped before that point, or two different collectives at the same point: a mismatch, not an extra one).

    Args:
        observed: the launch's records (``read_observed``).
        finished: ranks that returned (exit code 0) while the others waited; a record that ends with exit code 0
            counts too.
    """
    ranks = sorted(observed.ranks)
    done = {r for r in ranks if r in finished or observed[r].exit_code == 0}
    groups = list(dict.fromkeys(c.group for r in ranks for c in observed[r].collectives))
    for group in groups:
        sequences = {r: [c for c in observed[r].collectives if c.group == group] for r in ranks
                     if group in observed[r].groups or any(c.group == group for c in observed[r].collectives)}
        if len(sequences) < 2:
            continue
        for i in range(max(map(len, sequences.values()))):
            at = {r: s[i] if i < len(s) else None for r, s in sequences.items()}
            positions = {r: _position(observed[r], c, r in done) for r, c in at.items()}
            if len({_token(c) for c in at.values()}) == 1 and len({p[:2] for p in positions.values()}) == 1:
                continue
            return _behind(observed, at, positions)
    return None


def _behind(observed: ObservedRun, at: dict, positions: dict) -> ExtraCollective | None:
    """At the first index where the ranks' collectives differ: the ranks whose collective every other rank is past."""
    anchors = {r: _anchor_key(observed[r], c) for r, c in at.items() if c is not None}
    for token in dict.fromkeys(_token(c) for c in at.values() if c is not None):
        issued = [r for r, c in at.items() if _token(c) == token]
        others = [r for r in at if r not in issued]
        if others and all(_past(positions[o], positions[r], anchors.get(o) is not None and anchors.get(o) ==
                                anchors.get(r)) for o in others for r in issued):
            c = at[issued[0]]
            return ExtraCollective(ranks=tuple(issued), op=c.op, input_bytes=c.input_bytes, dtype=c.dtype,
                                   group=c.group, index=c.group_seq, step=c.step,
                                   site=c.stack[-1] if c.stack else None,
                                   others={o: at[o].op if at[o] is not None else None for o in others})
    return None
