"""Open challenges (issue 44): a starter that works but misses a measured target, and no single answer.

An exercise of this kind is a ``Challenge`` record (``Spec.verify``): the baseline (the notebook's starter, as shipped
in ``programs/``), the ``target`` (a ``Bound`` on one ``Measure``: the quantity whose best the progress record keeps),
the ``conditions`` that must hold as well (``Bound`` s: the loss within a tolerance of the baseline's, at least one
compiled graph, ...), the ``guards`` every attempt must pass to count at all (``observing``'s properties: every rank
took part, as many optimizer steps as the baseline), and the inputs (``Variants``).

The check launches the learner's script observed, then the baseline on the same inputs (kept per variant and torch
version under ``<runs>/exercises/<id>/baseline/``, so it runs once: ``observing.kept_run``), measures both from the
observer's records (never from what a script prints), and reports every measurement beside the baseline's with the
bound it must meet. Solved when the guards pass and every bound holds. The record keeps each attempt's measurements and
the best target measurement among the attempts whose guards and conditions held (``best``): a script that skips
training reaches a small number by not training, fails its conditions, and is never a best.

Every ``Measure`` here is lower-is-better.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError, LaunchError, MetricsError
from ..i18n import N_, Message
from ..runs.observed import ObservedRun, read_observed
from . import store
from .core import Context, Difference, Spec, notes_once
from .observing import Property, Variants, kept_run
from .properties import Distributed
from .rounds import PROGRAMS
from .verdict import Verdict


class Measure:
    """A quantity of an observed run (``of(run)``: a number, or ``None`` when the run has none of it); ``name`` (a
    msgid) says it, ``bytes`` whether it counts bytes (shown with separators); ``detail(run)``, where the number
    alone does not say what the run did, the line that does (shown under the learner's measurement), else ``None``."""

    name: str = ""
    bytes: bool = False

    def of(self, run: ObservedRun) -> float | None:
        raise NotImplementedError

    def detail(self, run: ObservedRun) -> Message | None:
        return None


@dataclass(frozen=True)
class CommBytesPerStep(Measure):
    """The bytes a rank puts into collectives of ``kinds`` per optimizer step, from step ``first`` on (their
    ``input_bytes``, over those steps), the most of any rank. All-reduces, reduce-scatters and all-gathers by default:
    the gradients' and the parameters' traffic, whichever way a script sends it (a broadcast of the initial weights, a
    barrier, are not training's traffic). From step 2 by default: the first step also carries the setup's collectives
    (DDP's constructor checks the parameters' shapes with an all-gather) and a hook's warm-up."""

    kinds: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather")
    first: int = 2
    name: str = N_("bytes sent into collectives per optimizer step, from step 2 (the most of any rank)")
    bytes: bool = True

    def of(self, run):
        per_rank = []
        for o in run:
            steps = [s.step for s in o.steps if s.step >= self.first]
            if steps:
                sent = sum(c.input_bytes for c in o.collectives if c.kind in self.kinds and c.step >= self.first
                           and c.step <= steps[-1])
                per_rank.append(sent / len(steps))
        return max(per_rank) if per_rank else None


@dataclass(frozen=True)
class FinalLoss(Measure):
    """The training loss at the end: each optimizer step's loss is the sum of what its ``backward()`` calls ran on (a
    step of two micro-batches that each call ``(loss / 2).backward()`` is their mean), averaged over the ``last``
    steps and over the ranks."""

    last: int = 3
    name: str = N_("final loss (the mean of the last steps' losses over the ranks)")

    def of(self, run):
        per_rank = []
        for observed in run:
            steps = [s.step for s in observed.steps][-self.last:]
            losses = [sum(b.loss for b in observed.backwards if b.step == step and b.loss is not None)
                      for step in steps]
            if losses:
                per_rank.append(sum(losses) / len(losses))
        return sum(per_rank) / len(per_rank) if per_rank else None


@dataclass(frozen=True)
class CompiledGraphs(Measure):
    """The graphs dynamo captured in the run (``ObservedRank.compiled``: every graph break and recompilation adds
    one; DDPOptimizer's cuts at DDP's buckets do not), the most of any rank; 0 for a rank that compiled nothing."""

    name: str = N_("graphs compiled (the most of any rank)")

    def of(self, run):
        return max(((o.compiled or {}).get("graphs", 0) for o in run), default=None)


@dataclass(frozen=True)
class GraphBreaks(Measure):
    """The graph breaks dynamo met in the run, the most of any rank."""

    name: str = N_("graph breaks (the most of any rank)")

    def of(self, run):
        return max(((o.compiled or {}).get("graph_breaks", 0) for o in run), default=None)


@dataclass(frozen=True)
class Bound:
    """What a measure must be: ``at_most`` / ``at_least`` a number, ``ratio`` at most that times the baseline's, or
    ``within`` that relative distance of the baseline's. ``note`` (a msgid) says what a miss means the run did."""

    measure: Measure
    at_most: float | None = None
    at_least: float | None = None
    ratio: float | None = None
    within: float | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        given = [v for v in (self.at_most, self.at_least, self.ratio, self.within) if v is not None]
        if len(given) != 1 or given[0] < 0:
            raise ValueError("Bound: give one of at_most, at_least, ratio, within (>= 0)")

    def holds(self, mine: float | None, base: float | None) -> bool:
        if mine is None:
            return False
        if self.at_most is not None:
            return mine <= self.at_most
        if self.at_least is not None:
            return mine >= self.at_least
        if base is None:
            return False
        if self.ratio is not None:
            return mine <= self.ratio * base
        return abs(mine - base) <= self.within * abs(base)

    def rule(self, base: float | None) -> Message:
        """The bound, worded: ``"at most 0.5 x the baseline's (17,474 bytes)"``."""
        shown = _shown(self.measure, base)
        if self.at_most is not None:
            return Message("at most {n}", {"n": _shown(self.measure, self.at_most)})
        if self.at_least is not None:
            return Message("at least {n}", {"n": _shown(self.measure, self.at_least)})
        if self.ratio is not None:
            return Message("at most {ratio:g} x the baseline's ({n})", {
                "ratio": self.ratio, "n": _shown(self.measure, None if base is None else self.ratio * base)})
        return Message("within {percent:g}% of the baseline's {base}", {"percent": self.within * 100, "base": shown})


@dataclass(frozen=True)
class SameOnEveryRank(Property):
    """Every rank ended with the same parameters, bit for bit (their SHA-1 digests): the ranks trained one model, not
    one each. Read from the wrapped module's parameters at the end, else after the last optimizer step; a sharded
    parameter (a DTensor shard: FSDP2) is one copy by construction and is left out."""

    note: str | None = None

    def check(self, mine, reference, variant):
        ends = {o.rank: _end_params(o) for o in mine}
        first = ends.get(0, [])
        out = []
        for rank, params in sorted(ends.items()):
            if rank == 0:
                continue
            differ = [name for (name, a), (_n, b) in zip(first, params) if a != b]
            if differ or len(params) != len(first):
                out.append(Difference(Message("parameters equal to rank 0's at the end"), len(first),
                                      len(first) - len(differ) if len(params) == len(first) else len(params), rank,
                                      note=Message(self.note) if self.note else Message(
                                          "the ranks ended with different models: each trained on its own share "
                                          "without the others' gradients")))
        return out


def _end_params(observed) -> list[tuple[str, str]]:
    """``[(name, digest)]`` of a rank's replicated parameters at the end of its run."""
    if observed.final:
        params = [p for wrap in sorted(observed.final) for p in observed.final[wrap]]
    else:
        params = list(observed.steps[-1].params) if observed.steps else []
    return [(p.name or str(p.index), p.value.sha1) for p in params
            if p.value is not None and p.value.placements in (None, ("R",))]


@dataclass(frozen=True)
class Challenge:
    """An *open challenge*'s check (``Spec.verify``); see the module docstring.

    Attributes:
        baseline: the starter as shipped, a file of ``programs/`` (the notebook's starter cell is the same text).
        target: the bound whose measure is the challenge's score (``best`` in the progress record).
        conditions: the other bounds the run must meet (the loss, that it still compiles, ...).
        guards: what every attempt must show first (``observing`` properties, checked against the baseline's run).
        variants: the inputs (both runs get the same).
    """

    baseline: str
    target: Bound
    conditions: tuple[Bound, ...] = ()
    guards: tuple[Property, ...] = (Distributed(),)
    variants: Variants = Variants(seed=False)
    kind: ClassVar[str] = "challenge"
    launches: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if not (PROGRAMS / self.baseline).is_file():
            raise ValueError(f"Challenge: no baseline {PROGRAMS / self.baseline}")

    def check(self, spec: Spec, runs_root, ctx: Context) -> Verdict:
        """Launch the learner's script and the baseline (kept) on one variant, measure both, record the attempt and
        the best; see the module docstring. Raises the learner's ``LaunchError`` (the handle shows the doctor)."""
        variant = self.variants.pick()
        mine_result = ctx.launch(list(variant.args), nproc_per_node=variant.world_size, observe=True)
        try:
            mine = read_observed(mine_result.run_dir)
        except MetricsError as e:
            return Verdict(spec.id, False, [Difference(Message("the observer's records of your run"),
                                                       Message("readable"), str(e)[:200])])
        try:
            base = kept_run(ctx, PROGRAMS / self.baseline, variant, list(variant.args), "baseline",
                            what=Message("the baseline ({name})", {"name": self.baseline}))
        except (LaunchError, MetricsError) as e:  # the workbook's own run: a busy machine, not the learner's script
            return Verdict(spec.id, False, attempted=False, problem=Message(
                "the baseline could not be run on this machine, so nothing was compared ({error}): run the check "
                "again", {"error": str(e).splitlines()[0][:200]}))
        differences = []
        for guard in self.guards:
            found = guard.check(mine, base, variant)
            differences += found
            if found and isinstance(guard, Distributed):
                break
        report, values, counted = [], {}, not differences
        solved = counted
        for bound in (self.target, *self.conditions):
            got, want = bound.measure.of(mine), bound.measure.of(base)
            values[bound.measure.name] = got
            ok = bound.holds(got, want)
            counted = counted and (ok or bound is self.target)  # a best counts only where the conditions held
            report.append(Message("{name}: baseline {base}, yours {mine}; {rule}: {verdict}", {
                "name": Message(bound.measure.name), "base": _shown(bound.measure, want),
                "mine": _shown(bound.measure, got), "rule": bound.rule(want),
                "verdict": Message("met") if ok else Message("not met")}))
            if not ok and bound.note:
                report.append(Message("  {note}", {"note": Message(bound.note)}))
            detail = bound.measure.detail(mine)
            if detail is not None:
                report.append(Message("  {note}", {"note": detail}))
            solved = solved and ok
        score = values[self.target.measure.name]

        def keep(entry):
            entry["measurements"].append({"values": values, "met": solved, "counted": counted,
                                          "time": store.now(), "run_dir": str(mine_result.run_dir)})
            entry["measured"] = score
            if counted and score is not None and (entry["best"] is None or score < entry["best"]):
                entry["best"] = score
        warning = None
        try:
            best = store.record_checked(runs_root, spec.id, solved, keep)["best"]
            if best is not None:
                report.append(Message("your best {name} so far: {best}", {
                    "name": Message(self.target.measure.name), "best": _shown(self.target.measure, best)}))
        except ConfigError as e:
            warning = Message("this check was not recorded in your progress: {error}", {"error": str(e)})
        return Verdict(spec.id, solved, notes_once(differences), report=report, warning=warning)


def _shown(measure: Measure, value: float | None) -> str | Message:
    if value is None:
        return Message("none")
    if measure.bytes:
        grouped = format(value, ",.0f")
        return Message("{bytes} bytes", {"bytes": grouped})
    return format(value, ".6g")
