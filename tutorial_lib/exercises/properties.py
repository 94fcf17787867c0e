"""What a rank wrapped and sent, as the observer saw it: the properties of an ``ObservedCheck`` (``observing``) that
read the process group, the wraps and the collectives (``Distributed``, ``Setting``, ``Count``, ``CountAtLeast``,
``Matched``, ``PhaseCounts``, ``Buckets``), the optimizer's steps and what it stepped (``SameSteps``,
``SameParameters``, ``OptimizesTheModel``), and ``FirstDifference``, which says one cause once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..i18n import N_, Message
from ..runs.observed import ObservedRank
from .core import Difference
from .observing import WRAPPERS, Property


@dataclass(frozen=True)
class Distributed(Property):
    """Every rank took part: it joined a process group of the variant's world size, wrapped a module with
    ``wrapper`` (``"DDP"``, ``"FSDP2"``, ``"TP"``; ``None``: any or none), and issued at least one collective across
    all the ranks. A script that trains alone on each rank, or never wraps its model, fails here."""

    wrapper: str | None = None
    note: str | None = None
    stops_the_check = True  # not a field: a run that did not distribute is not checked further (ObservedCheck)

    def check(self, mine, reference, variant):
        out = []
        for rank in range(variant.world_size):
            observed = mine.ranks.get(rank)
            if observed is None:
                out.append(Difference(Message("an observed record of this rank"), 1, 0, rank))
                continue
            group = (observed.process_group or {}).get("world_size")
            if group != variant.world_size:
                out.append(Difference(Message("the world size init_process_group joined"), variant.world_size,
                                      group if group is not None else Message("no process group"), rank,
                                      note=Message("this rank never joined the others: it trained alone")))
                continue
            if self.wrapper is not None and not observed.latest_wraps(WRAPPERS[self.wrapper]):
                out.append(Difference(Message("modules wrapped with {wrapper}", {"wrapper": self.wrapper}), ">= 1",
                                      0, rank, note=self._note() or Message(
                                          "nothing made this rank's model part of the others': its gradients never "
                                          "left the rank")))
            if not any(c.group_size == variant.world_size for c in observed.collectives):
                out.append(Difference(Message("collectives across all {n} ranks", {"n": variant.world_size}), ">= 1",
                                      0, rank, note=Message("the ranks never communicated: each one trained alone")))
        return out


@dataclass(frozen=True)
class Setting(Property):
    """A wrap's setting as torch held it at the end, on every rank: ``Setting("DDP", "find_unused_parameters",
    False)``."""

    wrapper: str = "DDP"
    key: str = ""
    expected: object = None
    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            wraps = observed.latest_wraps(WRAPPERS[self.wrapper])
            if not wraps:
                continue  # Distributed says so
            measured = wraps[-1].settings.get(self.key)
            if measured != self.expected:
                out.append(Difference(Message("{wrapper}'s {key}", {"wrapper": self.wrapper, "key": self.key}),
                                      self.expected, measured, observed.rank, note=self._note(measured=measured)))
        return out


@dataclass(frozen=True)
class Count(Property):
    """How many collectives of family ``kind`` (``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, ...) the
    rank issued ``per`` ``"step"`` (between optimizer steps), ``"backward"`` (in each ``backward()``) or ``"run"``
    (in all), from ``first`` on (a step or backward number: DDP rebuilds its buckets after the first backward),
    equal to the reference's on the same variant (``expected`` ``None``) or to ``expected`` (a list, or a number for
    ``per="run"``)."""

    kind: str = "all_reduce"
    per: str = "step"
    first: int = 1
    expected: object = None
    note: str | None = None

    def counts(self, observed: ObservedRank) -> list[int] | int:
        if self.per == "run":
            return len(observed.collectives_of(self.kind))
        counts = observed.per_step(self.kind) if self.per == "step" else observed.per_backward(self.kind)
        return counts[self.first - 1:]

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            want = self.expected if self.expected is not None else self.counts(reference[observed.rank])
            got = self.counts(observed)
            if got != want:
                what = {"step": Message("{kind} collectives per optimizer step", {"kind": self.kind}),
                        "backward": Message("{kind} collectives per backward()", {"kind": self.kind}),
                        "run": Message("{kind} collectives in the run", {"kind": self.kind})}[self.per]
                out.append(Difference(what, want, got, observed.rank,
                                      note=self._note(measured=got, expected=want)))
        return out


@dataclass(frozen=True)
class SameSteps(Property):
    """The rank took as many optimizer steps as the reference (or ``expected``, when given): counted from the
    observer's step records, whatever the script printed."""

    expected: int | None = None
    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            want = self.expected if self.expected is not None else len(reference[observed.rank].steps)
            if len(observed.steps) != want:
                out.append(Difference(Message("optimizer steps taken"), want, len(observed.steps), observed.rank,
                                      note=self._note(measured=len(observed.steps), expected=want)))
        return out


@dataclass(frozen=True)
class FirstDifference(Property):
    """The first of ``properties`` that finds a difference, and only its differences (the rest are not checked).
    For properties that see one cause from several sides (a loss scale of 1, the gradient entries it lost, the
    update they made): the verdict says the cause once, from the side that explains it best, given first."""

    properties: tuple[Property, ...] = ()

    def check(self, mine, reference, variant):
        for prop in self.properties:
            found = prop.check(mine, reference, variant)
            if found:
                return found
        return []


P2P_KINDS = ("send", "recv", "p2p")  # point-to-point: one rank sends what another receives, so the ranks differ


@dataclass(frozen=True)
class Matched(Property):
    """Every rank issued the same collectives as rank 0, in the same order: the same family, the same group size,
    the same bytes in (point-to-point sends and receives left out). That is what a collective needs to complete: each
    call is a rendezvous of every rank of its group, matched by its position (notebook 07, section 1). A run whose
    ranks issued different collectives ended by luck, deadlocked, or summed one rank's loss with another's gradient.
    The first collective that differs is said, per rank."""

    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        ranks = list(mine)
        if not ranks:
            return out
        first = _issued(ranks[0])
        for observed in ranks[1:]:
            theirs = _issued(observed)
            at = next((i for i, (a, b) in enumerate(zip(first, theirs)) if a != b), min(len(first), len(theirs)))
            if at == len(first) == len(theirs):
                continue
            want = Message("{kind} across {size} ranks, {bytes} bytes", first[at]) if at < len(first) else Message(
                "none")
            got = Message("{kind} across {size} ranks, {bytes} bytes", theirs[at]) if at < len(theirs) else Message(
                "none")
            out.append(Difference(Message("collective {n} of the run, compared with rank 0's", {"n": at + 1}), want,
                                  got, observed.rank, note=self._note(n=at + 1) or Message(
                                      "rank 0 and this rank did not call the same collectives in the same order: a "
                                      "collective waits for every rank of its group, so one of them waited for a "
                                      "call the other never made, or two different calls were matched")))
        return out


def _issued(observed: ObservedRank) -> list[dict]:
    """The rank's collectives as they must match across ranks: family, group size, bytes in; in order."""
    return [{"kind": c.kind, "size": c.group_size, "bytes": c.input_bytes} for c in observed.collectives
            if c.kind not in P2P_KINDS]


@dataclass(frozen=True)
class OptimizesTheModel(Property):
    """Every tensor each optimizer step updated is one of the wrapped model's parameters (the observer names it: a
    parameter of the outermost wrapped module) and had a gradient, on every rank. An optimizer built over tensors the
    model no longer holds (``fully_shard`` and ``parallelize_module`` replace every parameter with a new DTensor), or
    over a copy, steps tensors that never get a gradient: nothing the model uses changes. Said per rank at its first
    step that falls short (a rank that never steps is ``SameSteps``'s); the note gets ``step``, ``stepped`` (tensors
    the step held), ``model`` (of them the model's) and ``grads`` (of those, with a gradient)."""

    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            for step in observed.steps:
                stepped = len(step.params)
                model = sum(p.name is not None for p in step.params)
                grads = sum(p.name is not None and p.grad is not None for p in step.params)
                if stepped and grads == stepped:
                    continue
                out.append(Difference(
                    Message("tensors optimizer step {step} updated that are the model's parameters, with a gradient",
                            {"step": step.step}),
                    stepped, grads, observed.rank,
                    note=self._note(step=step.step, stepped=stepped, model=model, grads=grads)))
                break
        return out


@dataclass(frozen=True)
class CountAtLeast(Property):
    """How many collectives of the families ``kinds`` the rank issued in the whole run, outside ``backward()`` when
    ``outside_backward`` (the script's own collectives, not the gradient collectives DDP or FSDP2 issue inside it), at
    least the reference's on the same variant (``at_least`` ``None``) or ``at_least``. At least, not equal: a correct
    script may gather where the solution reduces, or send an object in two calls."""

    kinds: tuple[str, ...] = ("all_reduce",)
    outside_backward: bool = True
    at_least: int | None = None
    note: str | None = None

    def counts(self, observed: ObservedRank) -> int:
        return sum(1 for c in observed.collectives if c.kind in self.kinds
                   and (c.backward is None or not self.outside_backward))

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            want = self.at_least if self.at_least is not None else self.counts(reference[observed.rank])
            got = self.counts(observed)
            if got < want:
                kinds = ", ".join(self.kinds)
                what = (Message("collectives ({kinds}) outside backward() in the run", {"kinds": kinds})
                        if self.outside_backward else Message("collectives ({kinds}) in the run", {"kinds": kinds}))
                out.append(Difference(what, f">= {want}", got, observed.rank,
                                      note=self._note(measured=got, expected=want)))
        return out


@dataclass(frozen=True)
class PhaseCounts(Property):
    """How many collectives of each family in ``kinds`` the rank issued in each phase of the run: ``"forward"``
    (outside any ``backward()`` call: the forward passes, and whatever else the script ran between them) and
    ``"backward"`` (inside its ``backward()`` calls), each a total over the run, equal to ``expected``
    (``{"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}``; a kind it leaves out must be 0) or, ``None``,
    to the reference's on the same rank. ``note`` words a phase (``note_phase``; ``None``: either) that issued more
    collectives of ``note_kind`` than expected (fields ``{phase}``, the phase's name as a message: "forward" or
    "backward", 前向 or 反向 in Chinese, and ``{extra}``, how many more); a ``(singular, plural)`` pair (``Nn_``) is
    worded by ``extra``."""

    # The phases' names in a note (the counts' keys are code; a Chinese note says 前向 or 反向).
    PHASE_NAMES = {"forward": N_("forward"), "backward": N_("backward")}

    kinds: tuple[str, ...] = ("all_reduce",)
    expected: Mapping[str, Mapping[str, int]] | None = None
    note_kind: str = "all_reduce"
    note_phase: str | None = None
    note: str | tuple[str, str] | None = None

    @staticmethod
    def counts(observed: ObservedRank, kinds: Sequence[str]) -> dict[str, dict[str, int]]:
        """``{"forward": {kind: n}, "backward": {kind: n}}``: the rank's collectives of ``kinds`` outside and inside
        its ``backward()`` calls."""
        out = {"forward": dict.fromkeys(kinds, 0), "backward": dict.fromkeys(kinds, 0)}
        for c in observed.collectives:
            if c.kind in out["forward"]:
                out["forward" if c.backward is None else "backward"][c.kind] += 1
        return out

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            got = self.counts(observed, self.kinds)
            if self.expected is not None:
                want = {phase: {k: self.expected.get(phase, {}).get(k, 0) for k in self.kinds} for phase in got}
            else:
                want = self.counts(reference[observed.rank], self.kinds)
            for phase in ("forward", "backward"):
                if got[phase] == want[phase]:
                    continue
                extra = got[phase].get(self.note_kind, 0) - want[phase].get(self.note_kind, 0)
                note = None
                if self.note and extra > 0 and self.note_phase in (None, phase):
                    singular, plural = self.note if isinstance(self.note, tuple) else (self.note, "")
                    note = Message(singular, {"phase": Message(self.PHASE_NAMES[phase]), "extra": extra}, plural, extra)
                what = (Message("collectives outside backward() (forward)") if phase == "forward"
                        else Message("collectives inside backward()"))
                out.append(Difference(what, want[phase], got[phase], observed.rank, note=note))
        return out


@dataclass(frozen=True)
class SameParameters(Property):
    """The optimizer stepped the same parameters as the reference's on the same rank: their names (as the wrapped
    module names them) and shapes (a DTensor's: this rank's shard), at the rank's first step; a rank that took no
    step where the reference did fails too. Two tensors where the reference has one (a tied weight come apart), or one
    left out, fail here; ``note`` words a run that steps parameters the reference does not have (fields ``{extra}``
    and ``{missing}``: their names, and those of the reference's it lacks)."""

    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            ref = reference[observed.rank]
            if not ref.steps:
                continue  # the reference stepped nothing: nothing to compare with
            if not observed.steps:
                out.append(Difference(Message("optimizer steps taken"), len(ref.steps), 0, observed.rank))
                continue
            got = [(p.name, list(p.value.shape)) for p in observed.steps[0].params]
            want = [(p.name, list(p.value.shape)) for p in ref.steps[0].params]
            if got != want:
                extra = [name for name, _ in got if name not in {n for n, _ in want}]
                missing = [name for name, _ in want if name not in {n for n, _ in got}]
                out.append(Difference(Message("parameters the optimizer steps (name, shape)"), want, got,
                                      observed.rank, note=self._note(extra=", ".join(map(str, extra)),
                                                                     missing=", ".join(map(str, missing)))
                                      if extra else None))
        return out


FLOATING = ("float64", "float32", "bfloat16", "float16")  # a gradient's dtypes on the wire (not DDP's int32 flags)


@dataclass(frozen=True)
class Buckets(Property):
    """DDP's gradient buckets as they crossed the wire. In every ``backward()`` from ``first`` on (DDP rebuilds its
    buckets in backward's order after its first), the floating-point all-reduces issued inside it (DDP's reducer
    issues one per bucket as soon as the bucket's last gradient is ready; a comm hook issues its own in the bucket's
    place; DDP's int32 flags of ``find_unused_parameters`` are not gradients) must be:

    * at least ``at_least``: with two or more, the first bucket is all-reduced while backward still computes the
      gradients of the layers before it (communication overlaps computation); with one, it waits for the whole
      backward (``note``: the exercise's words for that, with ``measured``);
    * every gradient element of the DDP modules' parameters exactly once (their elements add up to the parameters');
    * each in one of ``dtypes`` (``()``: any; a 16-bit compression hook sends ``("bfloat16", "float16")``);
    * in the last backward, one all-reduce per bucket DDP logged, of that bucket's elements (a hook may cast a
      bucket, not split, merge or add to it), where DDP's log holds the buckets that backward used: a run of one
      backward (nothing rebuilt), or of three or more (DDP logs its buckets at each synchronised forward, before the
      second one rebuilds them: the rebuilt ones from the third).

    A backward under ``no_sync`` all-reduces nothing and fails the first point: the property is for scripts that
    synchronise every backward. Per rank, only the first backward that differs is reported (later ones repeat it)."""

    first: int = 1
    at_least: int = 1
    dtypes: tuple[str, ...] = ()
    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            wraps = observed.latest_wraps(WRAPPERS["DDP"])
            if not wraps:
                continue  # Distributed says so
            params = sum(w.settings.get("parameters", {}).get("numel", 0) for w in wraps)
            backwards = [b.index for b in observed.backwards if b.index >= self.first]
            if not backwards:
                out.append(Difference(Message("backward() calls"), f">= {self.first}", len(observed.backwards),
                                      observed.rank))
                continue
            found = next((d for d in (self._backward(observed, index, params) for index in backwards) if d), None)
            if found is not None:
                out.append(found)
                continue
            logged = sorted(_bucket_elements(wraps))
            if logged and (len(observed.backwards) == 1 or len(observed.backwards) >= 3):
                last = sorted(_elements(c) for c in _gradient_all_reduces(observed, backwards[-1]))
                if last != logged:
                    out.append(Difference(
                        Message("elements of each gradient all-reduce in backward() {index}, smallest first",
                                {"index": backwards[-1]}), logged, last, observed.rank,
                        note=Message("DDP's buckets hold {buckets} gradient elements each, and this backward()'s "
                                     "all-reduces carried {measured}: something other than DDP's reducer split, "
                                     "merged or added them", {"buckets": logged, "measured": last})))
        return out

    def _backward(self, observed: ObservedRank, index: int, params: int) -> Difference | None:
        """The first way backward ``index``'s gradient all-reduces differ from DDP's buckets, or ``None``."""
        reduces = _gradient_all_reduces(observed, index)
        least = max(self.at_least, 1)
        if len(reduces) < least:
            note = self._note(measured=len(reduces)) if reduces else Message(
                "this backward() all-reduced no gradient: each rank kept its own, the ranks' models drift apart")
            return Difference(Message("gradient all-reduces in backward() {index}", {"index": index}), f">= {least}",
                              len(reduces), observed.rank, note=note)
        dtypes = sorted({c.dtype for c in reduces})
        if self.dtypes and any(d not in self.dtypes for d in dtypes):
            sent = sum(c.input_bytes for c in reduces)
            return Difference(Message("dtype of the gradient all-reduces in backward() {index}", {"index": index}),
                              " or ".join(self.dtypes), ", ".join(dtypes), observed.rank,
                              note=Message("the gradients crossed the wire in {dtypes}: {sent} bytes for {params} "
                                           "gradient elements, {per:.3g} bytes each",
                                           {"dtypes": ", ".join(dtypes), "sent": sent, "params": params,
                                            "per": sent / max(params, 1)}))
        elements = sum(_elements(c) for c in reduces)
        if elements != params:
            return Difference(Message("gradient elements all-reduced in backward() {index}", {"index": index}), params,
                              elements, observed.rank,
                              note=Message("{elements} gradient elements all-reduced for {params} parameter elements: "
                                           "some gradients were not averaged over the ranks in this backward(), or "
                                           "were averaged more than once", {"elements": elements, "params": params}))
        return None


def _gradient_all_reduces(observed: ObservedRank, backward: int) -> list:
    return [c for c in observed.collectives_of("all_reduce", backward=backward) if c.dtype in FLOATING]


def _elements(collective) -> int:
    """The elements a collective sent in (its input bytes over its dtype's size)."""
    return collective.input_bytes // getattr(torch, collective.dtype).itemsize


def _bucket_elements(wraps) -> list[int]:
    """Every bucket DDP logged, in elements of its parameters' dtype, over the DDP modules ``wraps``."""
    out = []
    for wrap in wraps:
        count = wrap.settings.get("parameters") or {}
        per = count.get("bytes", 0) / count["numel"] if count.get("numel") else 0
        out += [round(b / per) for b in wrap.settings.get("bucket_sizes_bytes") or []] if per else []
    return out


@dataclass(frozen=True)
class HeldParameterBytes(Property):
    """The bytes of the parameters each rank holds at its first optimizer step (a DTensor's local shard: what the rank
    stores and multiplies by), at most the reference's on the same rank (``at_most`` ``None``) or ``at_most``. A plan
    that leaves a layer whole on every rank holds more than one that splits it. Said per rank; the note gets
    ``measured``, ``expected``, ``ratio`` (measured / expected), ``whole`` (how many parameters this rank holds more
    of than the reference's same rank, in the optimizer's order) and ``names`` (the first three of them, as the
    reference names them)."""

    at_most: int | None = None
    note: str | None = None

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            ref = reference[observed.rank].steps if reference is not None else []
            if not observed.steps or (self.at_most is None and not ref):
                if not observed.steps:
                    out.append(Difference(Message("optimizer steps taken"), ">= 1", 0, observed.rank))
                continue
            got = sum(p.value.bytes for p in observed.steps[0].params)
            want = self.at_most if self.at_most is not None else sum(p.value.bytes for p in ref[0].params)
            if got <= want:
                continue
            more = [r.name or p.name or str(p.index) for p, r in zip(observed.steps[0].params,
                                                                    ref[0].params if ref else ())
                    if p.value.bytes > r.value.bytes]
            out.append(Difference(
                Message("bytes of the parameters this rank holds (its shards), optimizer step 1"), f"<= {want:,}",
                f"{got:,}", observed.rank,
                note=self._note(measured=got, expected=want, ratio=got / want if want else float("inf"),
                                whole=len(more), names=", ".join(more[:3]))))
        return out
