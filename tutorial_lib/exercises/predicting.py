"""Predict, then run (issue 44): the learner writes down what a run will show before the run shows it.

An exercise of this kind is a ``Prediction`` record (``Spec.verify``): the program the check runs observed (a script
of the exercise, in ``programs/``), the inputs it may run it on (``Variants``: a finite set, listed, so each round can
take one whose measurement this learner has not seen), the ``Quantity`` to predict, read from the observer's records
(``tutorial_lib.runs.observed``: what torch saw each rank do, never what the program prints), the tolerance (``0``:
exact, for counts; relative for bytes, said in the verdict), and what explains the measurement (``explain``: a message
from the variant's inputs and the measured value).

The rounds, kept in the progress store (``store``) so a kernel restart loses nothing (``rounds``):

1. a round opens on a variant, shown by ``repr(ex)`` and by ``ex.predict()``;
2. ``ex.predict(12)`` records a prediction for it (more than one before the check: the last counts);
3. ``ex.check()`` runs the program on the variant, observed, shows the measurement beside the prediction with what
   explains it, and closes the round: the variant's measurement has been shown. Solved when the prediction agrees
   within the tolerance. A check with no prediction in the round runs nothing and says to predict first;
4. a prediction after the reveal is refused, kept in the record as made after it (it never counts), and the next
   round opens on another variant, which the refusal names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..diagnosis.doctor import diagnose
from ..errors import ConfigError, LaunchError, MetricsError
from ..i18n import N_, Message, render
from ..runs.observed import ObservedRun, read_observed
from . import answers, rounds, store
from .core import MISSING, Context, Spec
from .observing import Variants
from .verdict import Hint, Verdict

WHATS = ("count", "input_bytes", "output_bytes", "state_bytes")


@dataclass(frozen=True)
class Quantity:
    """What a prediction is about, read from an observed run.

    Attributes:
        what: ``"count"`` (collectives of family ``kind``), ``"input_bytes"`` or ``"output_bytes"`` (their sum, bytes:
            what the rank put in, what it got out), or ``"state_bytes"`` (the optimizer state after the step, bytes).
        kind: the collectives' family (``"all_gather"``, ``"all_reduce"``, ...; ``Collective.kind``).
        rank: the rank whose record is read.
        step: the optimizer step (from 1; ``-1``: the last): the collectives that led up to it.
        name: what is predicted, as the verdict says it (a msgid: ``N_("all-gathers")``).
    """

    what: str = "count"
    kind: str = "all_reduce"
    rank: int = 0
    step: int = -1
    name: str = N_("all-reduces")

    def __post_init__(self) -> None:
        if self.what not in WHATS:
            raise ValueError(f"Quantity(what={self.what!r}): one of {WHATS}")

    @property
    def bytes(self) -> bool:
        return self.what != "count"

    def step_of(self, run: ObservedRun) -> int:
        """The optimizer step read in ``run`` (``step``, or counted from the end)."""
        taken = len(run[self.rank].steps)
        return self.step if self.step > 0 else taken + 1 + self.step

    def measure(self, run: ObservedRun) -> int:
        """The quantity in ``run``.

        Raises:
            MetricsError: the rank took fewer optimizer steps than ``step``, or has no record.
        """
        observed, step = run[self.rank], self.step_of(run)
        if not 1 <= step <= len(observed.steps):
            raise MetricsError(f"rank {self.rank} took {len(observed.steps)} optimizer steps; this quantity is read "
                               f"at step {self.step}")
        if self.what == "state_bytes":
            return observed.steps[step - 1].state_bytes
        found = observed.collectives_of(self.kind, step=step)
        return len(found) if self.what == "count" else sum(getattr(c, self.what) for c in found)

    def describe(self, step: int | None = None) -> Message:
        """``"all-gathers on rank 1 in optimizer step 2"`` (``step``: the step read, default ``self.step``; the last
        one when that counts from the end), worded when shown."""
        step = self.step if step is None else step
        fields = {"name": Message(self.name), "rank": self.rank, "step": step}
        if step > 0:
            return Message("{name} on rank {rank} in optimizer step {step}", fields)
        return Message("{name} on rank {rank} in the last optimizer step", fields)


@dataclass(frozen=True)
class Prediction:
    """A *predict, then run* exercise's check (``Spec.verify``); see the module docstring.

    Attributes:
        program: the script the check runs, a file of ``programs/``.
        quantity: what the learner predicts.
        variants: the inputs a round may take (``seed=False`` and a few options: they are listed).
        explain: ``explain(options, measured) -> Message``: what explains the measurement, from the variant's flags
            (``{"--blocks": "4"}``) and the measured value; shown beside the prediction after the run.
        tolerance: relative (``0.05``: within 5% of the measurement); ``0``: exact (counts).
    """

    program: str
    quantity: Quantity
    variants: Variants
    explain: Callable[[Mapping[str, str], int], Message]
    tolerance: float = 0.0
    kind: ClassVar[str] = "predict"
    launches: ClassVar[int] = 1

    def __post_init__(self) -> None:
        if not (rounds.PROGRAMS / self.program).is_file():
            raise ValueError(f"Prediction: no program {rounds.PROGRAMS / self.program}")
        if rounds.every_variant(self.variants) is None:
            raise ValueError("Prediction: its variants must be listable (Variants(seed=False, ...)): a round takes one "
                             "whose measurement the learner has not seen")
        if not (self.tolerance >= 0 and (self.tolerance == 0 or self.quantity.bytes)):
            raise ValueError(f"Prediction: tolerance={self.tolerance!r}: >= 0, and 0 for a count")

    def current(self, spec: Spec, runs_root) -> dict:
        """This learner's open round (a store ``round``): the one not yet revealed, else a new one (opened now)."""
        def change(entry):
            if entry["round"] is None or entry["round"]["revealed"]:
                rounds.open_round(entry, self.variants)
        return store.update(runs_root, spec.id, change)["round"]

    def task(self, spec: Spec, runs_root) -> Message:
        """What to predict this round, for the handle's ``repr``."""
        rnd = self.current(spec, runs_root)
        return Message("this round: {variant}; predict the {quantity}: ex{n}.predict(your number)",
                       {"variant": self._variant(rnd), "quantity": self.quantity.describe(),
                        "n": spec.number})

    def predict(self, spec: Spec, runs_root, value: object = MISSING) -> Hint:
        """Record ``value`` as the prediction of this round (``Exercise.predict``); see the module docstring.

        Returns:
            A ``Hint`` that says what was recorded, or why not (no value, a form the check does not read, a
            measurement already shown: then the next round's variant).
        """
        heading = Message("Exercise {id}: your prediction", {"id": spec.id})
        if value is MISSING or value is None:
            rnd = self.current(spec, runs_root)
            return _note(heading, Message("no prediction yet. This round: {variant}. Predict the {quantity}: "
                                          "ex{n}.predict(your number)",
                                          {"variant": self._variant(rnd), "n": spec.number,
                                           "quantity": self.quantity.describe()}))
        reading = answers.read(value, 0, byte_count=self.quantity.bytes)
        number = _number(reading)
        if reading.problem is not None or number is None:
            problem = reading.problem or Message("{answer}: a count is a whole number", {"answer": reading.given})
            return _note(heading, problem, Message("(not recorded)"))
        outcome: dict = {}

        def change(entry):
            rnd = entry["round"]
            if rnd is not None and not rnd["revealed"]:
                counts = rnd["fresh"]  # a variant whose measurement was shown in an earlier round never counts
                entry["predictions"].append({"round": rnd["n"], "key": rnd["key"], "value": number,
                                             "time": store.now(), "counts": counts})
                if counts:
                    entry["prediction"] = number
                outcome.update(kind="recorded" if counts else "seen", round=rnd)
                return
            if rnd is not None:  # this round's measurement was shown: refused, kept as made after it
                entry["predictions"].append({"round": rnd["n"], "key": rnd["key"], "value": number,
                                             "time": store.now(), "counts": False, "after_reveal": True})
            outcome.update(kind="refused" if rnd is not None else "opened", old=rnd,
                           round=rounds.open_round(entry, self.variants))

        store.update(runs_root, spec.id, change)
        rnd, n = outcome["round"], spec.number
        shown = self._shown(number)
        if outcome["kind"] == "recorded":
            return _note(heading, Message("{value} recorded for {variant}", {"value": shown,
                                                                              "variant": self._variant(rnd)}),
                         Message("now ex{n}.check() runs it and shows the measurement beside your prediction",
                                 {"n": n}))
        if outcome["kind"] == "seen":
            return _note(heading, Message("{value} recorded for {variant}, but it will not count: this variant's "
                                          "measurement was shown to you in an earlier round",
                                          {"value": shown, "variant": self._variant(rnd)}))
        if outcome["kind"] == "refused":
            return _note(heading, Message(
                "not recorded as a prediction: the measurement of {old} was shown at {time}, so a number given now is "
                "not a prediction (kept in your progress as made after it). The next round: {variant}. Predict for "
                "it: ex{n}.predict(your number)", {"old": self._variant(outcome["old"]), "n": n,
                                                   "time": outcome["old"].get("revealed_at", "?"),
                                                   "variant": self._variant(rnd)}))
        return _note(heading, Message("not recorded: you had not seen the variant yet. This round: {variant}. "
                                      "Predict the {quantity}: ex{n}.predict(your number)",
                                      {"variant": self._variant(rnd), "n": n,
                                       "quantity": self.quantity.describe()}))

    def check(self, spec: Spec, runs_root, ctx: Context) -> Verdict:
        """Run this round's variant observed and compare its measurement with the round's prediction; records the
        attempt, the measurement and the reveal. A round without a prediction runs nothing."""
        entry = store.entry_of(store.read_store(runs_root), spec.id)
        rnd = entry["round"]
        made = [p for p in entry["predictions"] if rnd is not None and p.get("round") == rnd["n"]
                and not p.get("after_reveal")]
        if rnd is None or rnd["revealed"] or not made:
            rnd = self.current(spec, runs_root)
            return Verdict(spec.id, False, attempted=False, problem=Message(
                "predict first: this round runs {variant}; give your number of {quantity} with ex{n}.predict(...), "
                "then check. Nothing was run.", {"variant": self._variant(rnd), "n": spec.number,
                                                 "quantity": self.quantity.describe()}))
        variant = rounds.from_dict(rnd["variant"])
        script = rounds.program_copy(ctx.script.parent / "program", self.program)
        try:
            result = ctx.launch(list(variant.args), nproc_per_node=variant.world_size, observe=True, script=script,
                                what=Message("the exercise's program ({name})", {"name": self.program}))
            run = read_observed(result.run_dir, ranks=variant.world_size)
            measured = self.quantity.measure(run)
        except LaunchError as e:  # the program is the workbook's: a machine too busy, say
            return Verdict(spec.id, False, failure=diagnose(e), attempted=False, problem=Message(
                "the exercise's program failed on this machine, so nothing was measured: run the check again"))
        except MetricsError as e:
            return Verdict(spec.id, False, attempted=False, problem=Message(
                "the run's records could not be read ({error}): run the check again", {"error": str(e)[:200]}))
        last = made[-1]
        solved = bool(last["counts"]) and self.agrees(last["value"], measured)
        step = self.quantity.step_of(run)

        def reveal(e):
            if e["round"] is not None and e["round"]["n"] == rnd["n"]:
                e["round"]["revealed"], e["round"]["revealed_at"] = True, store.now()
            if rnd["key"] not in e["revealed"]:
                e["revealed"].append(rnd["key"])
            e["measured"] = measured
            e["measurements"].append({"round": rnd["n"], "key": rnd["key"], "value": measured, "time": store.now(),
                                      "prediction": last["value"], "agrees": self.agrees(last["value"], measured),
                                      "run_dir": str(result.run_dir)})

        warning = None
        try:
            store.record_checked(runs_root, spec.id, solved, reveal)
        except ConfigError as e:  # the verdict stands; only its record is lost
            warning = Message("this check was not recorded in your progress: {error}", {"error": str(e)})
        return Verdict(spec.id, solved, report=self._report(last, measured, rnd, step), warning=warning,
                       next_step=Message("the next round runs another variant: ex{n}.predict() shows it",
                                         {"n": spec.number}))

    def agrees(self, predicted: float, measured: int) -> bool:
        """Whether ``predicted`` is ``measured``: exactly for a count, within ``tolerance`` (relative) for bytes."""
        if self.tolerance == 0:
            return predicted == measured
        return math.isclose(predicted, measured, rel_tol=self.tolerance, abs_tol=0)

    def _report(self, last: dict, measured: int, rnd: dict, step: int) -> list[Message]:
        variant = rounds.from_dict(rnd["variant"])
        out = [Message("your prediction: {value} (recorded {time}, before the run)",
                       {"value": self._shown(last["value"]), "time": last["time"]}) if last["counts"] else
               Message("your prediction: {value}; it does not count: this variant's measurement had been shown to "
                       "you before", {"value": self._shown(last["value"])}),
               Message("measured: {value} {quantity}, {variant}", {
                   "value": self._shown(measured), "quantity": self.quantity.describe(step),
                   "variant": self._variant(rnd)})]
        if self.tolerance:
            out.append(Message("(a prediction agrees within {percent:g}% of the measurement)",
                               {"percent": self.tolerance * 100}))
        if not self.agrees(last["value"], measured):
            gap = format(last["value"] - measured, "+,.0f" if self.quantity.bytes else "+g")
            out.append(Message("your prediction is {gap} from the measurement", {"gap": gap}))
        out.append(self.explain(rounds.options(variant), measured))
        return out

    def _variant(self, rnd: dict) -> Message:
        return rounds.describe(self.program, rounds.from_dict(rnd["variant"]))

    def _shown(self, value: float) -> str:
        if self.quantity.bytes:
            grouped = format(value, ",.0f")
            return render(Message("{bytes} bytes", {"bytes": grouped}))
        return format(value, "g")


def _number(reading: answers.Reading) -> float | None:
    """The number a prediction says (a unit converted to bytes), or ``None``."""
    if reading.problem is not None:
        return None
    if reading.number is not None:
        return float(reading.number * reading.factor)
    if isinstance(reading.exact, bool) or not isinstance(reading.exact, (int, float)):
        return None
    return reading.exact


def _note(heading: Message, text: Message, footer: Message | None = None) -> Hint:
    return Hint(render(heading), render(text), footer=render(footer) if footer is not None else "")
