"""What the kinds that go in rounds share (``predicting``: predict, then run; ``bugs``: find the bug): the round's
variant as the progress store keeps it, a fresh variant for the next round, and the exercise's own program.

A round is one variant of an exercise shown to the learner: the variant a prediction is for, or the failed run a found
bug is checked against. It lives in the progress store (``store``: ``round``), so a kernel restart keeps it: ``{"n": 3,
"variant": {...}, "key": "...", "opened": "<time>", "revealed": false, "fresh": true}``; ``n`` counts the rounds, so a
prediction or an answer names the round it was given in.

The programs a check runs for these kinds (a script to measure, a job that fails) are files of ``programs/`` beside
this module: standalone like the lesson scripts (torch and the standard library). A program runs from a copy in the
exercise's folder (``<runs>/exercises/<id>/``), never from the package's own folder.
"""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path

from ..i18n import Message, Nn_
from . import store
from .observing import VARIANT_SEED_ENV, Variant, Variants

PROGRAMS = Path(__file__).resolve().parent / "programs"
FRESH_TRIES = 64  # variants drawn at most to find one not seen yet, when the variants cannot be listed (a fresh seed)


def rng() -> random.Random:
    """The variants' randomness: seeded by ``$TUTORIAL_LIB_EXERCISE_VARIANT_SEED`` when set (tests pin it), else the
    system's."""
    pinned = os.environ.get(VARIANT_SEED_ENV)
    return random.Random(int(pinned)) if pinned not in (None, "") else random.SystemRandom()


def as_dict(variant: Variant) -> dict:
    """``variant`` as the store keeps it (JSON)."""
    return {"seed": variant.seed, "args": list(variant.args), "world_size": variant.world_size}


def from_dict(data: dict) -> Variant:
    """The variant the store kept (``as_dict``)."""
    return Variant(int(data["seed"]), tuple(str(a) for a in data["args"]), int(data["world_size"]))


def key(variant: Variant) -> str:
    """One string per variant: the arguments and the ranks (two rounds on equal inputs have equal keys)."""
    return " ".join(variant.args) + f" @{variant.world_size}"


def options(variant: Variant) -> dict[str, str]:
    """``{"--blocks": "4", ...}``: each flag the variant passes with its value (``--seed`` too)."""
    args = list(variant.args)
    return {flag: value for flag, value in zip(args[::2], args[1::2])}


def every_variant(variants: Variants) -> list[Variant] | None:
    """Every variant ``variants`` can pick, in a fixed order, or ``None`` when they cannot be listed (a fresh seed
    each time)."""
    if variants.seed:
        return None
    flags = list(variants.options)
    out = []
    for values in itertools.product(*(tuple(variants.options[f]) for f in flags)):
        args = [a for flag, value in zip(flags, values) for a in (flag, str(value))]
        out += [Variant(0, tuple(args), world_size) for world_size in variants.world_sizes]
    return out


def pick_fresh(variants: Variants, seen: set[str], last: str | None = None) -> tuple[Variant, bool]:
    """A variant for the next round: one whose key is not in ``seen`` (its measurement was never shown) and not
    ``last`` where one is left, else any other than ``last``, else any. Returns ``(variant, fresh)``: ``fresh`` is
    ``False`` when every variant had been seen."""
    chooser = rng()
    listed = every_variant(variants)
    if listed is None:
        drawn = [variants.pick(chooser) for _ in range(FRESH_TRIES)]
        unseen = [v for v in drawn if key(v) not in seen and key(v) != last]
        return (unseen[0], True) if unseen else (drawn[0], key(drawn[0]) not in seen)
    unseen = [v for v in listed if key(v) not in seen and key(v) != last]
    if unseen:
        return chooser.choice(unseen), True
    others = [v for v in listed if key(v) != last] or listed
    variant = chooser.choice(others)
    return variant, key(variant) not in seen


def open_round(entry: dict, variants: Variants) -> dict:
    """A new round in ``entry`` (a store entry, changed in place, under the store's lock): the next number, a fresh
    variant (``pick_fresh``: not one whose measurement this learner has seen, nor the last round's), unrevealed."""
    last = entry["round"]
    variant, fresh = pick_fresh(variants, set(entry["revealed"]), last["key"] if last else None)
    entry["round"] = {"n": (last["n"] + 1) if last else 1, "variant": as_dict(variant), "key": key(variant),
                      "opened": store.now(), "revealed": False, "fresh": fresh}
    return entry["round"]


def describe(program: str, variant: Variant) -> Message:
    """``"04_4_units.py --blocks 4 --reshard-after-forward true on 2 ranks"``, worded when shown."""
    singular, plural = Nn_("{program} {args} on {ranks} rank", "{program} {args} on {ranks} ranks")
    return Message(singular, {"program": program, "args": " ".join(variant.args), "ranks": variant.world_size},
                   plural, variant.world_size)


def program_copy(folder: Path, program: str, name: str | None = None) -> Path:
    """The exercise's ``program`` written into ``folder`` (created) as ``name`` (default: its own name) for a launch:
    its ranks run there, and a learner reads the lines a traceback names in that file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name or program)
    path.write_text((PROGRAMS / program).read_text())
    return path
