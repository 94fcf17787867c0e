"""Notebook 05's exercises (checkpointing): a resume that replays steps, the steps a crashed and restarted job runs,
a checkpoint that forgets every rank's own random state."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

from ..i18n import N_, Message
from ..notebook.script_source import import_script
from .core import Context, Difference, Spec, register

STOP, STEPS = 3, 6  # the interrupted job stops after step STOP; both jobs train to step STEPS


def resume_equals_uninterrupted(ctx: Context) -> list[Difference]:
    """05.1, 05.3: the learner's script on 2 ranks, uninterrupted to STEPS, and interrupted after STOP then launched
    again (it resumes from its checkpoint): the resumed launch trains steps STOP+1..STEPS only, with every rank's
    losses bitwise equal to the uninterrupted run's (CPU, gloo: deterministic)."""
    folder = Path(tempfile.mkdtemp(prefix="checkpoints-", dir=ctx.script.parent))
    try:
        straight = ctx.records(ctx.launch([folder / "uninterrupted.pt", STEPS]))
        first = ctx.records(ctx.launch([folder / "interrupted.pt", STOP]))
        resumed = ctx.records(ctx.launch([folder / "interrupted.pt", STEPS]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    differences = []
    for rank in range(2):
        for what, records, steps in ((N_("steps of the uninterrupted run"), straight, range(1, STEPS + 1)),
                                     (N_("steps of the run before the interruption"), first, range(1, STOP + 1))):
            got = [r.get("step") for r in records.get(rank, [])]
            if got != list(steps):
                differences.append(Difference(Message(what), list(steps), got, rank))
        got = [r.get("step") for r in resumed.get(rank, [])]
        if got != list(range(STOP + 1, STEPS + 1)):
            replayed = sorted(set(got) & set(range(1, STOP + 1)))
            differences.append(Difference(
                Message("steps of the resumed run"), list(range(STOP + 1, STEPS + 1)), got, rank,
                note=Message("steps {steps} ran a second time, on weights that had already learned from them: the "
                             "checkpoint must say which step comes next", {"steps": replayed}) if replayed else None))
            continue
        reference = {r.get("step"): r.get("loss") for r in straight.get(rank, [])}
        for record in resumed.get(rank, []):
            step, loss = record.get("step"), record.get("loss")
            if loss != reference.get(step):
                differences.append(Difference(
                    Message("loss at step {step}, resumed vs uninterrupted", {"step": step}), reference.get(step),
                    loss, rank, note=Message("the resumed run did not continue exactly: some input of this step (weights, "
                                             "optimizer state, this rank's random state, the data) is not what the "
                                             "uninterrupted run had")))
                break  # the first step that differs; every later one differs too
    return differences


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


register(Spec("05.1", N_("A resume that replays steps"), solution="05_1_train.py", verify=resume_equals_uninterrupted,
              hints=(N_("Run the check and compare the steps the resumed run printed with those the interrupted run had "
                        "already trained. Which step does the restarted script start from, and how could it know?"),
                     N_("Save the step with the weights (\"step\": stop) and, when the checkpoint exists, start the loop "
                        "after it: for step in range(start + 1, stop + 1). The model and the optimizer are already "
                        "restored."))))
register(Spec("05.2", N_("The steps a crashed and restarted job runs"), solution="05_2.py",
              expected=steps_of_crashed_job,
              wrong={20: N_("that counts every step once, or resumes from step 12: the step-12 save never completed "
                            "(no checkpoint.json), so attempt 1 loads step-8 and runs steps 9 to 12 again"),
                     32: N_("that is a restart from scratch: --resume latest loads the newest complete checkpoint"),
                     28: N_("close: the newest complete checkpoint is step-8, not step-4 (saves every 4 steps: 4, 8)")},
              hints=(N_("Section 4: attempt 0 runs until the kill; attempt 1 loads the newest folder that has "
                        "checkpoint.json. Which step-N/ folders are complete when the step-12 save is interrupted?"),
                     N_("Attempt 0 trains steps 1 to 12 (it dies while saving step 12). step-4 and step-8 are complete, "
                        ".tmp-step-12 is not: attempt 1 trains steps 9 to 20. Add the two attempts."))))
register(Spec("05.3", N_("Every rank's random state in the checkpoint"), solution="05_3_train.py",
              verify=resume_equals_uninterrupted,
              hints=(N_("Run the check: which rank differs at the first resumed step, and which does not? Each rank "
                        "draws its own batches and dropout masks; whose random state does the checkpoint hold?"),
                     N_("Let every rank save its own torch.get_rng_state() (a file per rank, e.g. ckpt + \".rng\" + "
                        "str(rank), before the barrier) and load its own on resume; rank 0 keeps writing the weights."))))
