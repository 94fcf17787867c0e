"""Script checks on what the ranks did, not on what they printed (issue 44): an exercise as data.

A script exercise's ``verify`` is an ``ObservedCheck``: a declarative record of the inputs the check may choose
(``Variants``: a fresh ``--seed`` each check, and sizes), whether the shipped solution runs beside the learner's script
as the oracle (``reference``), and the properties the observed run must have (a handful of parameterised ``Property``
kinds: what was wrapped and sent in ``properties`` (``Distributed``, ``Setting``, ``Count``, ``Matched``, ``Buckets``,
...), what was computed in ``same_values`` (``SameTensors``, ``SameLosses``, ``SameStateBytes``, ...)). The check:

1. picks a variant (``Variants.pick``): the learner's script and the solution get the same arguments, so a number
   copied from an earlier run is another variant's;
2. launches the learner's script with ``observe=True`` (``tutorial_lib/child/observer.py``: every collective each rank
   issued, how modules were wrapped, the gradients and values at each optimizer step, the process group, from torch
   itself, written to ``observed/`` and never to stdout), then the solution on the same variant (its records are kept
   per variant and torch version under ``<runs>/exercises/<id>/reference/`` and read again by the next check);
3. compares: each property turns what differs into ``Difference`` s that say what, on which rank, by how much, and
   (the exercise's note for that property) what it means the run did; never which line to write.

What the script prints plays no part: a script that keeps the lesson's bug and prints the right numbers, or skips
the distributed part, or prints another rank's lines, is seen doing what it did.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import MetricsError
from ..i18n import Message
from ..runs.observed import ObservedRank, ObservedRun, read_observed
from .core import SOLUTIONS, Context, Difference

# Tests pin the variants a check picks (a seed for random.Random); unset, every check picks afresh (SystemRandom).
VARIANT_SEED_ENV = "TUTORIAL_LIB_EXERCISE_VARIANT_SEED"


WRAPPERS = {"DDP": "DistributedDataParallel", "FSDP2": "fully_shard", "TP": "parallelize_module"}


WHAT = {"grad": Message("gradient"), "value": Message("value")}  # SameTensors.what, as a learner reads it


@dataclass(frozen=True)
class Variant:
    """The inputs one check chose: the arguments both scripts get (``args``, with ``--seed``), and the ranks."""

    seed: int
    args: tuple[str, ...]
    world_size: int

    def describe(self) -> str:
        return " ".join(self.args) + f" on {self.world_size} ranks"


@dataclass(frozen=True)
class Variants:
    """The inputs a check may choose from.

    Attributes:
        options: script flag -> the values to pick one from (``{"--batch": (12, 16, 24)}``); each script gets
            ``--flag value`` (the starters parse them with argparse, defaults as in the lesson).
        seed: whether ``--seed N`` (N a fresh number from 1 to 9999) is passed too.
        world_sizes: the ranks to pick from (2 on a 2-core machine; 3 where the lesson's rule must hold for any).
    """

    options: Mapping[str, tuple] = field(default_factory=dict)
    seed: bool = True
    world_sizes: tuple[int, ...] = (2,)

    def pick(self, rng: random.Random | None = None) -> Variant:
        """One variant: ``rng`` (default: seeded by ``$TUTORIAL_LIB_EXERCISE_VARIANT_SEED`` when set, else the
        system's randomness)."""
        if rng is None:
            pinned = os.environ.get(VARIANT_SEED_ENV)
            rng = random.Random(int(pinned)) if pinned not in (None, "") else random.SystemRandom()
        seed = rng.randint(1, 9999) if self.seed else 0
        args = ["--seed", str(seed)] if self.seed else []
        for flag, values in self.options.items():
            args += [flag, str(rng.choice(tuple(values)))]
        return Variant(seed, tuple(args), rng.choice(self.world_sizes))


class Property:
    """One thing the observed run must show. ``check(mine, reference, variant)`` -> the ``Difference`` s (empty: it
    holds). ``mine`` and ``reference`` are ``ObservedRun`` s of the same variant (``reference`` ``None`` when the
    exercise runs no oracle); ``note``: the exercise's own words for what a difference means the run did."""

    note: str | None = None

    def check(self, mine: ObservedRun, reference: ObservedRun | None, variant: Variant) -> list[Difference]:
        raise NotImplementedError

    def _note(self, **fields) -> Message | None:
        return Message(self.note, fields) if self.note else None


@dataclass(frozen=True)
class ObservedCheck:
    """A script exercise's check on observed runs (``Spec.verify``): see the module docstring.

    Attributes:
        properties: what the learner's run must show, in the order they are checked; a failed ``Distributed``
            stops there (nothing else means much for a run that did not distribute).
        variants: the inputs the check may choose.
        reference: whether the shipped solution runs on the same variant as the oracle (``Count``, ``SameTensors``,
            ``SameSteps``, ``SameStateBytes`` without ``expected`` need it).
        extra_args: arguments every launch gets after the variant's.
    """

    properties: tuple[Property, ...]
    variants: Variants = field(default_factory=Variants)
    reference: bool = True
    extra_args: tuple[str, ...] = ()

    @property
    def launches(self) -> int:
        return 2 if self.reference else 1

    def __call__(self, ctx: Context) -> list[Difference]:
        variant = self.variants.pick()
        args = [*variant.args, *self.extra_args]
        mine = ctx.launch(args, nproc_per_node=variant.world_size, observe=True)
        run = _read(mine.run_dir, variant)
        if isinstance(run, Difference):
            return [run]
        reference = self.reference_run(ctx, variant, args) if self.reference else None
        out = []
        for prop in self.properties:
            found = prop.check(run, reference, variant)
            out += found
            if found and getattr(prop, "stops_the_check", False):
                break
        return out

    def reference_run(self, ctx: Context, variant: Variant, args: Sequence[str]) -> ObservedRun:
        """The shipped solution's observed run on ``variant``: the one kept under ``<runs>/exercises/<id>/reference/``
        for this variant, solution and torch version, else a launch (then kept): ``kept_run``."""
        return kept_run(ctx, SOLUTIONS / ctx.spec.solution, variant, args, "reference")


def kept_run(ctx: Context, script: Path, variant: Variant, args: Sequence[str], folder: str,
             what: Message | None = None) -> ObservedRun:
    """``script``'s observed run on ``variant`` with ``args``, kept as ``ObservedCheck.reference_run`` keeps the
    solution's (a challenge's baseline, ``challenges``): the run under ``<runs>/exercises/<id>/<folder>/`` for this
    script's text, the arguments, the world size and the torch version, else a launch (then kept there).

    Raises:
        LaunchError: the launch failed. MetricsError: its records cannot be read.
    """
    key = hashlib.sha1(json.dumps([script.read_text(), list(args), variant.world_size,
                                   torch.__version__]).encode()).hexdigest()[:16]
    kept = ctx.runs_root / "exercises" / ctx.spec.id / folder / key
    if (kept / "observed").is_dir():
        try:
            run = read_observed(kept, ranks=variant.world_size)
            if all(r.complete and r.exit_code == 0 for r in run):
                ctx.note_reused(kept, what)
                return run
        except MetricsError:
            pass  # damaged: run it again
    copy = kept.parent / "script" / script.name  # its ranks run in its folder: never the package's own
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(script.read_text())
    result = ctx.launch(list(args), nproc_per_node=variant.world_size, observe=True, script=copy, what=what)
    run = read_observed(result.run_dir, ranks=variant.world_size)
    shutil.rmtree(kept, ignore_errors=True)
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(result.run_dir, kept, ignore=shutil.ignore_patterns("checkpoints", "samples"))
    return run


def _read(run_dir: Path, variant: Variant) -> ObservedRun | Difference:
    try:
        return read_observed(run_dir)
    except MetricsError as e:
        return Difference(Message("the observer's records of your run"), Message("readable"), str(e)[:200], None,
                          note=Message("the records the ranks' observer wrote could not be read: a script that writes "
                                       "into the observed/ folder or closes its files breaks them"))


def final_params(observed: ObservedRank) -> list[tuple[str, object]]:
    """``[(name, ParamRecord)]``: the parameters the rank's wrapped modules held at the end (``ObservedRank.final``),
    in wrap order: what a script that never steps an optimizer left."""
    out = []
    for wrap_id in sorted(observed.final):
        for p in observed.final[wrap_id]:
            out.append((p.name or str(p.index), p))
    return out


def tensor_of(param, what: str):
    """``param``'s gradient (``what="grad"``) or value (``"value"``) as a tensor, ``None`` when it had none or its
    values were not recorded (larger than the observer's limit)."""
    record = getattr(param, what, None)
    return None if record is None or record.data is None else record.tensor()


def variant_arg(variant: Variant, flag: str, default: str) -> str:
    """The value ``variant`` gives the scripts for ``flag`` (``"--epochs"``), else ``default`` (the starter's)."""
    args = list(variant.args)
    return args[args.index(flag) + 1] if flag in args[:-1] else default


def worded(note: str | None, **fields) -> Message | None:
    """``note`` (a msgid) with ``fields`` as a ``Message``; ``None`` for no note."""
    return Message(note, fields) if note else None

