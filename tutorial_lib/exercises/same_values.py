"""What a rank computed, against the shipped solution's on the same inputs: the properties of an ``ObservedCheck``
(``observing``) that compare tensors, losses, gradient norms and optimizer state (``SameTensors``, ``SameLosses``,
``SameGradNorms``, ``LostEntries``, ``SameStateBytes``, ``DistinctLosses``) within what rounding allows
(``core.rounding_tolerance``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import MetricsError
from ..i18n import Message
from ..runs.observed import ObservedRank, ObservedRun
from .core import Difference, rounding_tolerance
from .observing import WHAT, Property, final_params, tensor_of, worded


@dataclass(frozen=True)
class SameTensors(Property):
    """The parameters' gradients (``what="grad"``) or values (``"value"``) equal the reference's, parameter by
    parameter, at each optimizer step (``at="steps"``, every step both took; an FSDP2 shard is put together from the
    ranks first) or as the script left them (``at="final"``: a script that never steps), within what rounding allows:
    ``rounding_tolerance(dtype, terms, scale)`` with ``scale`` the reference's largest entry (``terms``: the values
    one entry sums, and the roundings after; ``dtype``: the dtype those roundings happen in, ``"float32"``, or
    ``"bfloat16"`` for gradients that crossed the wire in 16 bits)."""

    what: str = "grad"
    at: str = "steps"
    terms: int = 64
    note: str | None = None
    dtype: str = "float32"

    def check(self, mine, reference, variant):
        pairs = self._pairs(mine, reference, variant)
        if isinstance(pairs, Difference):
            return [pairs]
        out, reported = [], set()
        for rank, label, got, want in pairs:
            if rank in reported:
                continue  # one parameter says it for its rank; the others usually differ the same way
            if got is None or want is None or got.shape != want.shape:
                out.append(Difference(Message("parameter {name}: its {what}", {"name": label, "what": WHAT[self.what]}),
                                      None if want is None else tuple(want.shape),
                                      None if got is None else tuple(got.shape), rank))
                reported.add(rank)
                continue
            want64, got64 = want.to(torch.float64), got.to(torch.float64)
            scale = max(want64.abs().max().item(), 1e-30)
            gap = (got64 - want64).abs().max().item()
            tolerance = rounding_tolerance(getattr(torch, self.dtype), self.terms, scale)
            if not gap <= tolerance:  # a NaN is never within it
                ratio = (got64.norm() / want64.norm()).item() if want64.norm() > 0 else float("inf")
                out.append(Difference(
                    Message("largest |{what} - the solution's on the same inputs| of parameter {name}",
                            {"what": WHAT[self.what], "name": label}),
                    f"<= {tolerance:.3g}", gap, rank,
                    note=self._note(ratio=ratio) or Message("this rank's {what} is {ratio:.3g} times the solution's",
                                                            {"what": WHAT[self.what], "ratio": ratio})))
                reported.add(rank)
        return out

    def _pairs(self, mine, reference, variant):
        pairs = []
        if self.at == "final":
            for observed in mine:
                ref = reference[observed.rank]
                got, want = final_params(observed), final_params(ref)
                if len(got) != len(want):
                    return Difference(Message("parameters of the wrapped model"), len(want), len(got), observed.rank)
                for (name, g), (_n, w) in zip(got, want):
                    pairs.append((observed.rank, name, tensor_of(g, self.what), tensor_of(w, self.what)))
            return pairs
        steps = min(len(reference[0].steps), min(len(o.steps) for o in mine) if len(mine) else 0)
        for step in range(1, steps + 1):
            n_params = len(reference[0].steps[step - 1].params)
            if any(len(o.steps[step - 1].params) != n_params for o in mine):
                return Difference(Message("parameters the optimizer steps"), n_params,
                                  [len(o.steps[step - 1].params) for o in mine], None)
            for index in range(n_params):
                name = reference[0].steps[step - 1].params[index].name or str(index)
                try:
                    got, want = mine.gathered(step, index, self.what), reference.gathered(step, index, self.what)
                except MetricsError:
                    got, want = None, reference.gathered(step, index, self.what)
                pairs.append((None, f"{name} (step {step})", got, want))
        return pairs


@dataclass(frozen=True)
class SameStateBytes(Property):
    """The optimizer state's bytes on each rank after its last step equal the reference's (1/N of the whole under
    FSDP2, all of it under DDP)."""

    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            if not observed.steps:
                continue  # SameSteps says so
            want, got = reference[observed.rank].steps[-1].state_bytes, observed.steps[-1].state_bytes
            if got != want:
                out.append(Difference(Message("optimizer state bytes after the last step"), want, got, observed.rank,
                                      note=self._note(measured=got, expected=want)))
        return out


@dataclass(frozen=True)
class DistinctLosses(Property):
    """No two ranks ran ``backward()`` on the same loss, bit for bit, at the same step (``backward()`` calls counted
    from 1 on each rank, from ``first`` on). Data-parallel ranks hold the same weights, so two of them compute the same
    loss only on the same samples: two equal losses mean two ranks trained on the same data, work another rank did
    too. The first step where some ranks agree is said, with the ranks."""

    first: int = 1
    note: str | None = None

    def check(self, mine, reference, variant):
        ranks = list(mine)
        calls = min((len(o.backwards) for o in ranks), default=0)
        for index in range(self.first, calls + 1):
            same: dict[float, list[int]] = {}
            for observed in ranks:
                loss = observed.backwards[index - 1].loss
                if loss is not None:
                    same.setdefault(loss, []).append(observed.rank)
            groups = [group for group in same.values() if len(group) > 1]
            if groups:
                return [Difference(Message("ranks whose loss at backward() {index} is bit for bit the same",
                                           {"index": index}), Message("none"), group, None,
                                   note=self._note(ranks=group, index=index) or Message(
                                       "ranks {ranks} computed the same loss: they ran that step on the same "
                                       "samples, so each did work another rank did too", {"ranks": group}))
                        for group in groups]
        return []


@dataclass(frozen=True)
class SameLosses(Property):
    """What each ``backward()`` ran on (its loss, one number; under a ``GradScaler`` the scaled loss) equals the
    reference's on the same variant, backward by backward, on every rank: within ``rounding_tolerance(float32,
    terms, |the reference's loss|)`` (``terms``: the values the loss sums, and the roundings the steps before it
    carried into the weights). Each rank's first ``backward()`` that differs is said, with the optimizer step it led
    up to; a rank that called ``backward()`` another number of times differs too. The note gets ``step``,
    ``backward`` and ``ratio`` (measured / expected); ``note_first``, when given, words a first ``backward()`` that
    already differs (the runs differed from the start: the weights or the inputs of the first forward), ``note`` a
    later one (they parted while training)."""

    terms: int = 64
    note: str | None = None
    note_first: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            want, got = reference[observed.rank].backwards, observed.backwards
            for w, g in zip(want, got):
                if w.loss is None:
                    continue  # not one number in the reference either: nothing to compare
                limit = rounding_tolerance(torch.float32, self.terms, max(abs(w.loss), 1e-30))
                if g.loss is None or not abs(g.loss - w.loss) <= limit:  # a NaN is never within
                    ratio = g.loss / w.loss if g.loss is not None and w.loss else float("nan")
                    out.append(Difference(
                        Message("the loss backward() {backward} ran on (optimizer step {step})",
                                {"backward": w.index, "step": w.step}),
                        w.loss, g.loss if g.loss is not None else Message("not one number"), observed.rank,
                        note=worded(self.note_first if w.index == 1 and self.note_first else self.note,
                                     step=w.step, backward=w.index, ratio=ratio)))
                    break
            else:
                if len(got) != len(want):
                    out.append(Difference(Message("backward() calls"), len(want), len(got), observed.rank))
        return out


@dataclass(frozen=True)
class LostEntries(Property):
    """No entry of the parameters' gradients (``what="grad"``) or values (``"value"``) is exactly 0 at an optimizer
    step where the reference's is not: entries lost (rounded to 0 in a low precision, cut by a mask, never computed).
    Compared at every step both took, parameter by parameter, each rank against the reference's same rank (a DTensor
    as its local shard), for the tensors recorded whole (up to 4096 elements: ``TensorRecord.tensor``); a parameter
    without one counts all the reference's non-zero entries as lost. Each rank's first step with a loss is said, with
    how many entries of how many; the note gets ``step``, ``lost``, ``total`` and ``fraction`` (lost / total)."""

    what: str = "grad"
    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            for got_step, want_step in zip(observed.steps, reference[observed.rank].steps):
                lost = total = 0
                for index, w in enumerate(want_step.params):
                    want = tensor_of(w, self.what)
                    if want is None:
                        continue  # not recorded whole (or no gradient in the reference either)
                    got = tensor_of(got_step.params[index], self.what) if index < len(got_step.params) else None
                    total += want.numel()
                    if got is None or got.shape != want.shape:
                        lost += int((want != 0).sum())
                    else:
                        lost += int(((got == 0) & (want != 0)).sum())
                if lost:
                    fields = {"step": want_step.step, "lost": lost, "total": total, "fraction": lost / total}
                    out.append(Difference(
                        Message("{what} entries exactly 0 where the solution's are not, optimizer step {step}",
                                {"what": WHAT[self.what], "step": want_step.step}),
                        0, Message("{lost} of {total}", fields), observed.rank, note=self._note(**fields)))
                    break
        return out


@dataclass(frozen=True)
class SameGradNorms(Property):
    """The norm of the gradients each optimizer step applied, all its parameters taken as one vector (what gradient
    clipping bounds; a DTensor's ``Shard`` placements put together across the ranks), equals the reference's at
    every step both took, within ``rounding_tolerance(dtype, terms, the reference's norm)`` (``dtype``: where the
    gradients were rounded, ``"float32"`` or a lower precision the backward ran in). Said per rank with every step's
    norms; the note (``note_larger`` instead when this rank's norm is the larger and it is given) gets ``step`` (the
    first step that differs), ``ratio`` (measured / expected there) and ``inverse`` (1 / ratio)."""

    terms: int = 64
    dtype: str = "float32"
    note: str | None = None
    note_larger: str | None = None

    def check(self, mine, reference, variant):
        got_norms, want_norms = grad_norms(mine), grad_norms(reference)
        out = []
        for observed in mine:
            got, want = got_norms[observed.rank], want_norms[observed.rank]
            for step, (g, w) in enumerate(zip(got, want), start=1):
                if abs(g - w) <= rounding_tolerance(getattr(torch, self.dtype), self.terms, max(w, 1e-30)):
                    continue
                ratio = g / w if w > 0 else float("inf")
                note = self.note_larger if ratio > 1 and self.note_larger else self.note
                out.append(Difference(
                    Message("norm of the gradients each optimizer step applied"), rounded(want), rounded(got),
                    observed.rank, note=Message(note, {"step": step, "ratio": ratio,
                                                       "inverse": 1 / ratio if ratio else float("inf")})
                    if note else None))
                break
        return out


def grad_norms(run: ObservedRun) -> dict[int, list[float]]:
    """``{rank: [the norm of the gradients its optimizer step s applied, for each step]}``: all the step's parameters
    as one vector, a parameter sharded over the ranks (a ``Shard`` placement) with every rank's shard (float64 sums of
    the recorded norms; a parameter without a gradient adds nothing)."""
    def squares(observed: ObservedRank, s: int, index: int) -> float:
        steps = observed.steps
        if s >= len(steps) or index >= len(steps[s].params) or steps[s].params[index].grad is None:
            return 0.0
        norm = steps[s].params[index].grad.norm
        return 0.0 if norm is None else norm * norm

    out = {}
    for observed in run:
        norms = []
        for s, step in enumerate(observed.steps):
            total = 0.0
            for index, p in enumerate(step.params):
                sharded = p.grad is not None and any(str(pl).startswith("S(") for pl in p.grad.placements or ())
                total += sum(squares(o, s, index) for o in run) if sharded else squares(observed, s, index)
            norms.append(total ** 0.5)
        out[observed.rank] = norms
    return out


def rounded(values: Sequence[float | None], digits: int = 4) -> list:
    """Numbers as a verdict lists them: ``digits`` significant digits (``None`` as it is)."""
    return [float(f"{v:.{digits}g}") if isinstance(v, float) else v for v in values]


@dataclass(frozen=True)
class SameWholeGradients(Property):
    """Each parameter's gradient at every optimizer step both runs took, put together whole from the ranks' local
    tensors whatever the script placed where (``whole_tensor``), equals the reference's, parameter by parameter, within
    ``rounding_tolerance(float32, terms, scale)``, ``scale`` the largest entry of the reference's gradients at that
    step, every parameter's: a gradient whose exact value is 0 (a bias of the keys: softmax does not change when one
    constant is added to every key) is what rounding leaves of sums of the step's other gradients' size, not of its
    own. Two plans that place one gradient differently (a norm's gradient ``Partial`` under sequence parallelism,
    ``Replicate`` without) are compared as the whole gradient each computed. Parameters are paired by name when both
    runs name theirs alike (unique names, the same set), else in the optimizer's order. The first parameter that
    differs is said (one cause, usually); the note gets ``name``, ``step`` and ``ratio`` (the norms of the two,
    measured / expected)."""

    terms: int = 64
    note: str | None = None

    def check(self, mine, reference, variant):
        steps = min(len(reference[0].steps), min((len(o.steps) for o in mine), default=0))
        if steps == 0 and reference[0].steps:
            return [Difference(Message("optimizer steps taken"), len(reference[0].steps), 0, None)]
        for step in range(1, steps + 1):
            pairs = _paired(mine, reference, step)
            if isinstance(pairs, Difference):
                return [pairs]
            try:
                wanted = {ref_index: whole_tensor(reference, step, ref_index) for _, _, ref_index in pairs}
            except MetricsError as e:  # the solution's own records: nothing the learner's script did
                return [Difference(Message("the solution's gradients at step {step}", {"step": step}),
                                   Message("put together from the ranks' records"), str(e)[:160], None)]
            scale = max((w.abs().max().item() for w in wanted.values() if w is not None and w.numel()), default=0.0)
            tolerance = rounding_tolerance(torch.float32, self.terms, max(scale, 1e-30))
            for name, index, ref_index in pairs:
                label = f"{name} (step {step})"
                try:
                    got, want = whole_tensor(mine, step, index), wanted[ref_index]
                except MetricsError as e:
                    return [Difference(Message("parameter {name}: its whole gradient", {"name": label}),
                                       Message("put together from the ranks' records"), str(e)[:160], None)]
                if got is None or want is None or got.shape != want.shape:
                    return [Difference(Message("parameter {name}: its gradient's whole shape", {"name": label}),
                                       None if want is None else tuple(want.shape),
                                       None if got is None else tuple(got.shape), None)]
                want64, got64 = want.to(torch.float64), got.to(torch.float64)
                gap = (got64 - want64).abs().max().item()
                if not gap <= tolerance:  # a NaN is never within it
                    ratio = (got64.norm() / want64.norm()).item() if want64.norm() > 0 else float("inf")
                    return [Difference(
                        Message("largest |whole gradient - the solution's on the same inputs| of parameter {name}",
                                {"name": label}), f"<= {tolerance:.3g}", gap, None,
                        note=self._note(name=name, step=step, ratio=ratio) or Message(
                            "the whole gradient is {ratio:.3g} times the solution's", {"ratio": ratio}))]
        return []


def _paired(mine: ObservedRun, reference: ObservedRun, step: int):
    """``[(name, index in mine, index in the reference)]`` at optimizer step ``step`` (rank 0's lists), or a
    ``Difference`` when the two runs step different numbers of parameters."""
    got, want = mine[0].steps[step - 1].params, reference[0].steps[step - 1].params
    names_got, names_want = [p.name for p in got], [p.name for p in want]
    if (None not in names_got and len(set(names_got)) == len(got) and set(names_got) == set(names_want)
            and len(set(names_want)) == len(want)):
        where = {name: i for i, name in enumerate(names_got)}
        return [(name, where[name], i) for i, name in enumerate(names_want)]
    if len(got) != len(want):
        return Difference(Message("parameters the optimizer steps"), len(want), len(got), None)
    return [(w.name or str(i), i, i) for i, w in enumerate(want)]


def whole_tensor(run: ObservedRun, step: int, index: int, what: str = "grad"):
    """Parameter ``index``'s gradient (``what="grad"``) or value at optimizer step ``step``, whole, from every rank's
    record of it: a DTensor on a 1-D mesh put together by its placement (``Shard(d)``: the shards concatenated along
    ``d`` in mesh order; ``Replicate``: rank 0's; ``Partial``: the ranks' sum, or their mean for ``P(avg)``), a plain
    tensor as rank 0 holds it. ``None`` when rank 0's parameter had none (no gradient).

    Raises:
        MetricsError: a rank without that step or parameter, values not recorded (larger than the observer's limit),
            or a placement on a mesh of more than one dimension."""
    records = []
    for observed in run:
        steps = [s for s in observed.steps if s.step == step]
        if not steps or index >= len(steps[0].params):
            raise MetricsError(f"rank {observed.rank} has no parameter {index} at optimizer step {step}")
        records.append(getattr(steps[0].params[index], what))
    first = records[0]
    if first is None:
        return None
    placements = first.placements or ("R",)
    if len(placements) != 1:
        raise MetricsError(f"cannot put together placements {list(placements)}: a 1-D mesh only")
    if placements[0] == "R":
        return first.tensor()
    if any(r is None for r in records):
        raise MetricsError(f"a rank recorded no {what} of parameter {index} at optimizer step {step}")
    by_rank = dict(zip(sorted(run.ranks), records))
    order = first.mesh["ranks"] if first.mesh else sorted(run.ranks)
    tensors = [by_rank[r].tensor() for r in order]
    if placements[0].startswith("P"):
        total = torch.stack([t.to(torch.float64) for t in tensors]).sum(0)
        return (total / len(tensors) if "avg" in placements[0] else total).to(tensors[0].dtype)
    return torch.cat(tensors, dim=int(placements[0][2:-1]))
