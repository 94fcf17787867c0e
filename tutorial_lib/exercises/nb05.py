"""Notebook 05's exercises (checkpointing): a resume that replays steps, the steps a crashed and restarted job runs,
a checkpoint that forgets every rank's own random state."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ..errors import MetricsError
from ..i18n import N_, Message, Nn_, render
from ..notebook.script_source import import_script
from ..runs.observed import ObservedRun, read_observed
from .core import Context, Difference, Spec, register
from .observing import ObservedCheck, Property, Variant, Variants
from .properties import Distributed

WORLD_SIZE = 2
# The check's own program in front of the learner's script (launched under torchrun --max-restarts 1, written beside
# the script): the job's first attempt trains up to step STOP (its --steps replaced) and then ends with an error, as a
# job whose allocation ran out; torchrun starts the ranks again, and the second attempt runs the script as given. Run
# by file path in the ranks: the standard library only.
INTERRUPTED_ONCE = '''"""The check of exercise {id}: your script as a job interrupted once (each check writes it).

    torchrun --max-restarts 1 interrupted_once.py SCRIPT STOP ARGS...

Attempt 0 (TORCHELASTIC_RESTART_COUNT 0) runs SCRIPT ARGS --steps STOP, then exits with code {code}, as a job whose
time ran out; torchrun starts the job again, and attempt 1 runs SCRIPT ARGS.
"""
import os
import runpy
import sys

script, stop, *args = sys.argv[1:]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
sys.argv = [script, *args, *(["--steps", stop] if attempt == 0 else [])]
sys.path[0] = os.path.dirname(os.path.abspath(script))
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as e:
    if e.code not in (None, 0):
        raise
if attempt == 0:
    sys.exit({code})
'''
INTERRUPTED_EXIT = 75  # EX_TEMPFAIL (sysexits.h): "try again later", what attempt 0 ends with


def interruption(variant: Variant) -> tuple[int, int]:
    """``(stop, steps)``: the job trains to step ``steps`` (the variant's ``--steps``) and its first attempt stops after
    step ``stop``, 2 to ``steps - 2`` (from the variant's seed: at least 2 steps on each side of the interruption)."""
    steps = int(variant.args[variant.args.index("--steps") + 1])
    return 2 + variant.seed % (steps - 3), steps


def _steps_of(attempt: int, variant: Variant) -> range:
    """The steps of the uninterrupted run that attempt ``attempt`` must train (counted from 1)."""
    stop, steps = interruption(variant)
    return range(1, stop + 1) if attempt == 0 else range(stop + 1, steps + 1)


ATTEMPT = {0: N_("before the interruption (attempt 0)"), 1: N_("after the restart (attempt 1)")}


@dataclass(frozen=True)
class AttemptSteps(Property):
    """The attempt took the optimizer steps it had to: attempt 0 steps 1 to ``stop``, attempt 1 the rest, to
    ``steps``. An attempt 1 that took more replayed steps the checkpoint had already trained."""

    attempt: int = 1
    note: str | None = None

    def check(self, mine, reference, variant):
        want, out = len(_steps_of(self.attempt, variant)), []
        for observed in mine:
            got = len(observed.steps)
            if got == want:
                continue
            stop, _steps = interruption(variant)
            note = None
            if self.attempt == 1 and got > want:
                replayed = min(got - want, stop)
                singular, plural = Nn_(
                    "the restarted job took {measured} optimizer steps where {expected} were left: {n} step it had "
                    "already trained before the interruption ran a second time, on weights that had already learned "
                    "from it, so the resumed job trained on that batch twice and is not the uninterrupted run",
                    "the restarted job took {measured} optimizer steps where {expected} were left: {n} steps it had "
                    "already trained before the interruption ran a second time, on weights that had already learned "
                    "from them, so the resumed job trained on those batches twice and is not the uninterrupted run")
                note = Message(singular, {"measured": got, "expected": want, "n": replayed}, plural, replayed)
            out.append(Difference(Message("optimizer steps {attempt}", {"attempt": Message(ATTEMPT[self.attempt])}),
                                  want, got, observed.rank, note=note))
        return out


@dataclass(frozen=True)
class SameLosses(Property):
    """Each rank's losses in the attempt equal the uninterrupted run's at the same steps, bit for bit (the solution,
    uninterrupted, on the same variant). Exact, not within rounding: on CPU, gloo sums 2 ranks' gradients in one order,
    and a resumed step that gets the same weights, optimizer state, random state and data as the uninterrupted one
    computes the same bits (the same operations on the same inputs). The first step that differs is said, per rank."""

    attempt: int = 1
    note: str | None = None

    def check(self, mine, reference, variant):
        out, steps = [], _steps_of(self.attempt, variant)
        for observed in mine:
            if len(observed.steps) != len(steps):
                continue  # AttemptSteps says it: the losses of other steps are not comparable
            want = reference[observed.rank].losses()[steps.start - 1:steps.stop - 1]
            got = observed.losses()
            at = next((i for i, (w, g) in enumerate(zip(want, got)) if w != g), None)
            if at is None:
                continue
            note = (Message("the run differs from the solution's before any checkpoint was loaded: this training is "
                            "not the exercise's (its model, its data or its seed)") if self.attempt == 0 else Message(
                "the resumed run did not continue exactly: some input of this step (weights, optimizer state, this "
                "rank's random state, the data) is not what the uninterrupted run had"))
            out.append(Difference(Message("loss at step {step} {attempt}, compared with the uninterrupted run's",
                                          {"step": steps[at], "attempt": Message(ATTEMPT[self.attempt])}),
                                  repr(want[at]), repr(got[at]), observed.rank, note=note))
        return out


@dataclass(frozen=True)
class SameValues(Property):
    """The parameters after each step of the attempt equal the uninterrupted run's after the same step, bit for bit
    (their SHA-1 digests; exact for the reason ``SameLosses`` says). A rank whose losses already differ is left to
    ``SameLosses``; this says the first step whose update differs where the losses did not (the last step's, say)."""

    attempt: int = 1
    note: str | None = None

    def check(self, mine, reference, variant):
        out, steps = [], _steps_of(self.attempt, variant)
        for observed in mine:
            ref = reference[observed.rank]
            if observed.losses() != ref.losses()[steps.start - 1:steps.stop - 1]:
                continue  # SameLosses says it
            for k, step in enumerate(steps):
                if k >= len(observed.steps) or step > len(ref.steps):
                    break
                pairs = list(zip(ref.steps[step - 1].params, observed.steps[k].params))
                differ = [(w, g) for w, g in pairs if w.value.sha1 != g.value.sha1]
                if not differ and len(ref.steps[step - 1].params) == len(observed.steps[k].params):
                    continue
                gap = max(((g.value.tensor().double() - w.value.tensor().double()).abs().max().item()
                           for w, g in differ if w.value.shape == g.value.shape), default=float("nan"))
                out.append(Difference(Message("largest |parameter - the uninterrupted run's| after step {step}",
                                              {"step": step}), 0, gap, observed.rank, note=Message(
                    "the loss before this step was the uninterrupted run's, the update after it is not: the optimizer "
                    "did not step from the state the uninterrupted run had")))
                break
        return out


@dataclass(frozen=True)
class InterruptedOnce(ObservedCheck):
    """05.1, 05.3: the learner's script as a job interrupted once (one launch, torchrun ``--max-restarts 1``: attempt 0
    trains to step ``stop`` and ends as a job whose time ran out, attempt 1 runs to ``--steps`` from the checkpoint
    ``--ckpt``), and the solution on the same variant without interruption (``reference_run``: no ``--ckpt``, kept).
    ``properties`` are checked on attempt 1 (``after``), ``before`` on attempt 0."""

    before: tuple[Property, ...] = ()

    def __call__(self, ctx: Context) -> list[Difference]:
        variant = self.variants.pick()
        stop, steps = interruption(variant)
        driver = ctx.script.parent / "interrupted_once.py"
        driver.write_text(INTERRUPTED_ONCE.format(id=ctx.spec.id, code=INTERRUPTED_EXIT))
        folder = Path(tempfile.mkdtemp(prefix="checkpoint-", dir=ctx.script.parent))
        print(render(Message("[check {id}] your script as a job interrupted once: its first attempt trains to step "
                             "{stop} and ends as a job whose time ran out, torchrun starts it again (--max-restarts "
                             "1), the second attempt goes on to step {steps} from the checkpoint; then the solution "
                             "trains the same {steps} steps without interruption",
                             {"id": ctx.spec.id, "stop": stop, "steps": steps})), file=sys.stdout, flush=True)
        try:
            mine = dataclasses.replace(ctx, script=driver).launch(
                [ctx.script, stop, *variant.args, "--ckpt", folder / "checkpoint.pt"], nproc_per_node=WORLD_SIZE,
                observe=True, max_restarts=1, cwd=ctx.script.parent)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        attempts: list[ObservedRun] = []
        for attempt in (0, 1):
            try:
                attempts.append(read_observed(mine.run_dir, ranks=WORLD_SIZE, restart=attempt))
            except MetricsError as e:
                return [Difference(Message("the observer's records of attempt {attempt}", {"attempt": attempt}),
                                   Message("readable"), str(e)[:200], None, note=Message(
                                       "the job did not run twice: a rank of attempt 0 that ends the process itself "
                                       "(os._exit) keeps torchrun from starting attempt 1") if attempt else None)]
        # torchrun stops the other ranks as soon as one exits: a rank still leaving (no exit code recorded) when a
        # peer ended attempt 0 with INTERRUPTED_EXIT was stopped, not failed; what it saved is checked by attempt 1.
        ended = any(observed.exit_code == INTERRUPTED_EXIT for observed in attempts[0])
        failed = [Difference(Message("exit code of attempt 0"), INTERRUPTED_EXIT, observed.exit_code, observed.rank,
                             note=Message("attempt 0 failed by itself before its time ran out, and attempt 1 started "
                                          "from whatever it had saved: output.log holds its error"))
                  for observed in attempts[0]
                  if observed.exit_code != INTERRUPTED_EXIT and not (ended and observed.exit_code is None)]
        if failed:
            return failed
        reference = self.reference_run(ctx, variant, variant.args)
        out = []
        for run, properties in ((attempts[0], self.before), (attempts[1], self.properties)):
            for prop in properties:
                found = prop.check(run, reference, variant)
                out += found
                if found and isinstance(prop, Distributed):
                    return out
        return out


# 05.1 and 05.3: the job interrupted once ends with the uninterrupted run's losses and weights, step by step, bit for
# bit (section 4's exact resume): attempt 0 trains steps 1 to stop, attempt 1 only the steps after it, each step with
# the same inputs. On a fresh --seed (the model, every batch) and --steps (the interruption falls at a step picked with
# it), so steps or losses written in from an earlier run are another variant's.
RESUMES_EXACTLY = InterruptedOnce(
    before=(Distributed("DDP"), AttemptSteps(attempt=0), SameLosses(attempt=0)),
    properties=(Distributed("DDP"), AttemptSteps(attempt=1), SameLosses(attempt=1), SameValues(attempt=1)),
    variants=Variants({"--steps": (5, 6, 7)}))


def steps_of_crashed_job(ctx: Context) -> int:
    """05.2: checkpoint_train.py saving every 4 steps to step 20, a rank killed in the middle of the step-12 save,
    torchrun --max-restarts 1, --resume latest: the optimizer steps each rank runs over both attempts. The checkpoint
    folder the crash leaves (step-4/, step-8/ complete; .tmp-step-12/ half written) is built here and the lesson's own
    rule (``resume_path``) picks the one attempt 1 loads."""
    lesson = import_script("checkpoint_train")
    save_every, max_steps, fail_step = 4, 20, 12
    with tempfile.TemporaryDirectory() as folder:
        for step in range(save_every, fail_step, save_every):  # the saves that completed before the kill
            (Path(folder) / f"step-{step}").mkdir()
            (Path(folder) / f"step-{step}" / lesson.COMPLETE_MARKER).write_text("{}")
        (Path(folder) / f".tmp-step-{fail_step}").mkdir()  # the save the kill interrupted
        path = lesson.resume_path(SimpleNamespace(resume="latest", checkpoint_dir=folder))
        resumed_from = int(Path(path).name.removeprefix("step-"))
    return fail_step + (max_steps - resumed_from)  # attempt 0: steps 1..12; attempt 1: resumed_from+1..20


register(Spec("05.1", N_("A resume that replays steps"), solution="05_1_train.py", verify=RESUMES_EXACTLY,
              hints=(N_("Run the check and compare the optimizer steps the restarted attempt took with the steps "
                        "left after the interruption. Which step does the restarted script start from, and how could "
                        "it know?"),
                     N_("Save the step with the weights (\"step\": args.steps) and, when the checkpoint exists, start "
                        "the loop after it: for step in range(start + 1, args.steps + 1). The model and the optimizer "
                        "are already restored."))))
register(Spec("05.2", N_("The steps a crashed and restarted job runs"), solution="05_2.py",
              expected=steps_of_crashed_job,
              wrong={20: N_("that counts every step once, or resumes from step 12: the step-12 save never completed "
                            "(no checkpoint.json), so attempt 1 loads step-8 and runs steps 9 to 12 again"),
                     32: N_("that is a restart from scratch: --resume latest loads the newest complete checkpoint"),
                     28: N_("close: the newest complete checkpoint is step-8, not step-4 (saves every 4 steps: 4, 8)")},
              hints=(N_("Section 4: attempt 0 runs until the kill; attempt 1 loads the newest folder that has "
                        "checkpoint.json. Which step-N/ folders are complete when the step-12 save is interrupted?"),
                     N_("Attempt 0 trains steps 1 to 12 (it dies while saving step 12). step-4 and step-8 are "
                        "complete, .tmp-step-12 is not: attempt 1 trains steps 9 to 20. Add the two attempts."))))
register(Spec("05.3", N_("Every rank's random state in the checkpoint"), solution="05_3_train.py",
              verify=RESUMES_EXACTLY,
              hints=(N_("Run the check: which rank differs at the first resumed step, and which does not? Each rank "
                        "draws its own batches and dropout masks; whose random state does the checkpoint hold?"),
                     N_("Let every rank save its own torch.get_rng_state() (a file per rank, e.g. args.ckpt + \".rng\" "
                        "+ str(rank), before the barrier) and load its own on resume; rank 0 keeps writing the "
                        "weights."))))
