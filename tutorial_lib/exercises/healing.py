"""Script checks on torchft replica groups (notebook 15): the learner's script run as replica groups that die and come
back, every rank observed, and what each group's optimizer steps left compared with the other group's.

``HealCheck`` (a ``Spec.verify``) puts the learner's script through a failure drill, as ``tl.run_failure_drill`` puts
``ft_train.py`` through one in section 1, and waits on what the observer recorded in each rank (``observed_steps``:
the optimizer steps torch saw), never on what the script wrote or printed: the lighthouse on 127.0.0.1 and 2 replica
groups of one CPU rank each (``start_replica_groups(observe=True)``: each start records into its own
``group<G>/attempt<A>/observed/``), until each group has taken ``together`` optimizer steps; then group 1 is SIGKILLed
and group 0 must take ``alone`` more without it; group 1 is started again and must take ``after`` steps; then both are
SIGKILLed, group 1 first (every step it took has group 0's beside it). A start whose script fails is the doctor's
(``diagnose`` on that start's folder). The whole drill has the check's limit (``Context.timeout_s``).

What is compared is what each optimizer step applied and left, from the observer's SHA-1 digests of every parameter's
gradient before the step and value after it. In the step a group heals in, torchft leaves its own gradient out, so it
applies the averaged gradient the live group applies in that step (bit for bit: the same all-reduce); from then on, if
it holds what the live group holds, each of its steps leaves the weights the live group's step leaves, bit for bit
(the same averaged gradient applied to the same state). The restarted group's first step is found among group 0's by
its gradient (``follow``): the step it joined at, which must come after group 0's steps at the restart (it joined
where group 0 was; a group that trains alone from its seed starts at group 0's first step). Its first step whose
weights differ is reported with the two learning rates torch's optimizer held (``OptimizerStep.lr``).
"""

from __future__ import annotations

import bisect
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..diagnosis.doctor import diagnose
from ..errors import LaunchError, MetricsError
from ..i18n import Message, render
from ..launcher.replicas import TORCHRUN_LOG, ReplicaGroups, start_lighthouse, start_replica_groups
from ..runs.observed import OptimizerStep, observed_steps, read_observed
from ..runs.rundir import new_run_dir
from .core import Context, Difference
from .observing import Variants

SURVIVOR, KILLED = 0, 1  # group 0 trains on; group 1 is killed and started again
# The observer writes no tensor whole (its SHA-1 digest, norm and sum only): a step's record stays small while the
# check polls the records, and digests are what the comparison reads.
RECORD_ENV = {"TUTORIAL_LIB_OBSERVE_FULL_NUMEL": "0"}
POLL_S = 0.2


def _weights(step: OptimizerStep) -> tuple[str, ...]:
    return tuple(p.value.sha1 for p in step.params)


def _steps(folder: Path) -> list[OptimizerStep]:
    """The optimizer steps the observer recorded in a start's only rank (none: it recorded nothing)."""
    try:
        return read_observed(folder, ranks=1)[0].steps
    except MetricsError:
        return []


def _gradient(step: OptimizerStep) -> tuple[str | None, ...]:
    return tuple(p.grad.sha1 if p.grad is not None else None for p in step.params)


@dataclass(frozen=True)
class Followed:
    """How a restarted group's optimizer steps followed the live group's (``follow``).

    Attributes:
        joined: the live group's step (index from 0) whose gradient the restarted group's first step applied, or
            ``None``: it applied a gradient the live group never applied.
        matched: the restarted group's steps, from its first, that left the weights the live group's step at the same
            place left, before the first that did not.
        compared: its steps that had a step of the live group's beside them.
    """

    joined: int | None
    matched: int
    compared: int


def follow(restarted: list[OptimizerStep], live: list[OptimizerStep]) -> Followed:
    """Where ``restarted``'s steps join ``live``'s (by the first step's gradient) and how many left ``live``'s weights
    at the same place, in order; pure."""
    first = _gradient(restarted[0]) if restarted else None
    joined = next((i for i, s in enumerate(live) if _gradient(s) == first), None)
    if joined is None:
        return Followed(None, 0, 0)
    compared = min(len(restarted), len(live) - joined)
    matched = next((k for k in range(compared) if _weights(restarted[k]) != _weights(live[joined + k])), compared)
    return Followed(joined, matched, compared)


@dataclass(frozen=True)
class Drill:
    """What the check's drill recorded: the optimizer steps of group 0, of group 1's first start and of its start after
    the kill (empty when it was not started again), and group 0's step counts when group 1 was killed and started
    again (``None`` where that did not happen: ``waited`` names the phase that did not come in time)."""

    run_dir: Path
    survivor: list[OptimizerStep]
    first: list[OptimizerStep]
    restarted: list[OptimizerStep]
    at_kill: int
    at_restart: int | None
    waited: str | None


@dataclass(frozen=True)
class HealCheck:
    """15.1: the learner's torchft script as 2 replica groups, group 1 killed and restarted (see the module docstring);
    its steps after the restart must continue group 0's training bit for bit.

    Attributes:
        variants: the inputs (a fresh ``--seed``: the model and the data).
        together: optimizer steps each group takes before the kill (count).
        alone: optimizer steps group 0 must take after the kill, before the restart (count).
        after: optimizer steps the restarted group must take (count): the steps compared.
        heartbeat_timeout_ms: the lighthouse's (section 1's ``HEARTBEAT_TIMEOUT_MS``).
        schedule: the starter's learning rate at step ``s`` (from 0), or ``None``: then every learning rate of both
            groups' steps must be one of the schedule's, and group 0's must change (a script that drops the schedule
            to make the heal easier trains something else); ``schedule_text`` says it in the verdict.
    """

    variants: Variants = Variants()
    together: int = 3
    alone: int = 5
    after: int = 8
    heartbeat_timeout_ms: int = 2000
    schedule: Callable[[int], float] | None = None
    schedule_text: str = ""
    launches: ClassVar[int] = 1

    def __call__(self, ctx: Context) -> list[Difference]:
        variant = self.variants.pick()
        drill = self.run(ctx, list(variant.args))
        return self.compare(drill)

    def run(self, ctx: Context, args: list[str]) -> Drill:
        """The drill on ``ctx.script`` (its run directory appended to ``ctx.runs``).

        Raises:
            LaunchError: a start's script ended by itself (its doctor's report is the error's ``diagnosis``).
        """
        run_dir = new_run_dir(f"exercise-{ctx.spec.id}", ctx.runs_root)
        ctx.runs.append(run_dir)
        print(render(Message(
            "[check {id}] launch 1 of 1: your script as 2 torchft replica groups of 1 CPU rank each (gloo) and a "
            "lighthouse; each group trains {together} optimizer steps, then group 1 is killed, group 0 trains {alone} "
            "more, group 1 is started again and trains {after}; stopped after {limit_s} s at most; what torch saw "
            "each rank do is recorded in {path}",
            {"id": ctx.spec.id, "together": self.together, "alone": self.alone, "after": self.after,
             "limit_s": format(ctx.timeout_s, "g"), "path": run_dir})), file=sys.stdout, flush=True)
        deadline = time.monotonic() + ctx.timeout_s
        with start_lighthouse(run_dir / "lighthouse.log", heartbeat_timeout_ms=self.heartbeat_timeout_ms) as light:
            with start_replica_groups(ctx.script, lighthouse=light, num_groups=2, run_dir=run_dir, args=args,
                                      env=RECORD_ENV, observe=True) as groups:
                try:
                    waited, at_kill, at_restart = self._phases(groups, deadline)
                finally:
                    for group in (KILLED, SURVIVOR):  # group 1 first: each of its steps has group 0's beside it
                        if groups.groups[group].running():
                            groups.kill(group)
            light.stop()
        starts = [[g for g in groups.history if g.group_id == group] for group in (SURVIVOR, KILLED)]
        restarted = _steps(starts[1][1].folder) if len(starts[1]) > 1 else []
        return Drill(run_dir, _steps(starts[0][0].folder), _steps(starts[1][0].folder), restarted, at_kill, at_restart,
                     waited)

    def _phases(self, groups: ReplicaGroups, deadline: float) -> tuple[str | None, int, int | None]:
        """Kill group 1 once both groups have trained, restart it once group 0 trained on alone, wait for its steps.
        Returns (the phase that did not come in time or ``None``, group 0's steps at the kill, at the restart)."""
        def steps(group: int) -> int:
            return observed_steps(groups.groups[group].folder)

        if not self._wait(groups, deadline, lambda: min(steps(SURVIVOR), steps(KILLED)) >= self.together):
            return "together", steps(SURVIVOR), None
        groups.kill(KILLED)
        at_kill = steps(SURVIVOR)
        if not self._wait(groups, deadline, lambda: steps(SURVIVOR) >= at_kill + self.alone):
            return "alone", at_kill, None
        groups.restart(KILLED)
        at_restart = steps(SURVIVOR)
        if not self._wait(groups, deadline, lambda: steps(KILLED) >= self.after):
            return "after", at_kill, at_restart
        return None, at_kill, at_restart

    @staticmethod
    def _wait(groups: ReplicaGroups, deadline: float, done) -> bool:
        """Until ``done()`` (True) or the deadline (False). A start that ended without being killed raises: the
        doctor says why."""
        while not done():
            for group in groups.groups.values():
                if group.popen.poll() is not None and group.killed_at_s is None:
                    error = LaunchError(
                        f"replica group {group.group_id} (start {group.attempt}) ended with code "
                        f"{group.popen.returncode} during the check", run_dir=group.folder, command=group.command,
                        returncode=group.popen.returncode,
                        output_tail=(group.folder / TORCHRUN_LOG).read_text(errors="replace").splitlines()[-20:])
                    error.diagnosis = diagnose(group.folder)
                    raise error
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def compare(self, drill: Drill) -> list[Difference]:
        """What differs between the drill's records and what a heal must give (see the module docstring)."""
        if drill.waited == "together":
            return [Difference(Message("optimizer steps of group {group} before the kill", {"group": group}),
                               Message("at least {n}", {"n": self.together}), len(steps), note=Message(
                                   "the groups did not both train within the check's limit: the check kills a group "
                                   "only once both are training"))
                    for group, steps in ((SURVIVOR, drill.survivor), (KILLED, drill.first))
                    if len(steps) < self.together]
        if drill.waited == "alone":
            return [Difference(Message("optimizer steps of group 0 after group 1 was killed"),
                               Message("at least {n}", {"n": self.alone}), len(drill.survivor) - drill.at_kill,
                               note=Message("group 0 stopped training when group 1 died and did not go on without "
                                            "it: the groups that are alive must keep committing steps"))]
        if drill.waited == "after":
            return [Difference(Message("optimizer steps of group 1 after its restart"),
                               Message("at least {n}", {"n": self.after}), len(drill.restarted),
                               note=Message("group 1, started again, did not train with group 0 within the "
                                            "check's limit"))]
        return self._scheduled(drill) or self._followed(drill)

    def _scheduled(self, drill: Drill) -> list[Difference]:
        """The learning rates of both groups' steps are the schedule's, and group 0's change (``schedule``)."""
        if self.schedule is None:
            return []
        steps = max(len(drill.survivor), len(drill.restarted)) * 4 + 1000  # the steps any group can be at
        rates = sorted(self.schedule(s) for s in range(steps))
        for group, taken in ((SURVIVOR, drill.survivor), (KILLED, drill.restarted)):
            found = [x for step in taken for x in step.lr]
            off = [x for x in found if not _among(x, rates)]
            if off or (group == SURVIVOR and len(set(found)) < 2):
                return [Difference(Message("learning rates of group {group}'s optimizer steps", {"group": group}),
                                   Message(self.schedule_text), _rates(tuple(off or found[:3])), note=Message(
                                       "the script trains with another learning rate than the exercise's schedule: "
                                       "the exercise keeps the starter's warm-up and decay, step by step"))]
        return []

    def _followed(self, drill: Drill) -> list[Difference]:
        found = follow(drill.restarted, drill.survivor)
        if found.joined is None:
            return [Difference(Message("group 0's step whose gradient group 1's first step after its restart "
                                       "applied"), Message("one of group 0's steps"), Message("none"), note=Message(
                "group 1 applied a gradient group 0 never applied: the two groups did not average their gradients "
                "in that step"))]
        if found.joined < drill.at_restart:
            return [Difference(Message("group 0's step at which group 1 joined after its restart (counted from 1)"),
                               Message("after step {n}, where group 0 was when group 1 was started again",
                                       {"n": drill.at_restart}), found.joined + 1, note=Message(
                "group 1 started over from its own fresh weights instead of joining group 0 where it was: it was "
                "not healed"))]
        if found.matched == found.compared:
            return []
        k = found.matched
        mine, theirs = drill.restarted[k], drill.survivor[found.joined + k]
        same_gradient = _gradient(mine) == _gradient(theirs)
        note = Message(
            "group 1's step {step} after its restart applied the same averaged gradient as group 0's step at the same "
            "place, and left other weights than group 0's: the update depends on more than the weights and the "
            "gradient, and group 1 did not hold all of it", {"step": k + 1}) if same_gradient else Message(
            "group 1's step {step} after its restart applied another gradient than group 0's step at the same place: "
            "the two groups did not average their gradients in that step", {"step": k + 1})
        out = [Difference(
            Message("group 1's optimizer steps after its restart that left the weights group 0's step left"),
            Message("{n} of {n}", {"n": found.compared}), Message("{k} of {n}", {"k": k, "n": found.compared}),
            note=note)]
        if mine.lr != theirs.lr:
            out.append(Difference(Message("learning rate of group 1's step {step} after its restart", {"step": k + 1}),
                                  _rates(theirs.lr), _rates(mine.lr), note=Message(
                                      "expected: group 0's learning rate in the same step")))
        return out


def _among(x: float, sorted_rates: list[float]) -> bool:
    """Whether ``x`` is one of ``sorted_rates`` to float32-ish rounding (the same formula written another way)."""
    i = bisect.bisect_left(sorted_rates, x * (1 - 1e-6))
    return i < len(sorted_rates) and math.isclose(sorted_rates[i], x, rel_tol=1e-6)


def _rates(lr: tuple) -> str:
    return ", ".join(format(x, ".6g") for x in lr)
