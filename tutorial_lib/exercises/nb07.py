"""Notebook 07's exercises (troubleshooting): a hang, first read (which rank is not in a collective, at which line),
then fixed; a collective inside ``if rank == 0:``. The hang's script is exercise 2's starter; its collective timeout
(3 s) turns the hang into an error, so a check of the starter costs seconds, not the launch's limit."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from ..errors import LaunchError
from ..diagnosis.causes import CauseId
from ..i18n import N_
from .bugs import FindTheBug
from .core import Context, Difference, Spec, register
from .observing import ObservedCheck, Variants
from .properties import CountAtLeast, Distributed, Matched, SameSteps

# Exercise 2's starter, as the notebook's %%writefile {ex2.script} cell writes it: exercise 1 asks where it hangs.
HANG = '''import os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=3))  # a hang becomes an error after 3 s
rank, world_size = dist.get_rank(), dist.get_world_size()
vocab = os.path.join(sys.argv[1], "vocab.pt")  # a file rank 0 builds and every rank reads
if rank == 0:
    dist.barrier()  # wait until every rank has started
    torch.save(torch.arange(100), vocab)  # build the vocabulary
else:
    while not os.path.exists(vocab): time.sleep(0.05)  # wait for rank 0's file
    dist.barrier()
tokens = torch.load(vocab)
total = tokens[rank::world_size].sum()  # this rank's share
dist.all_reduce(total)
print(f"rank {rank}: {total.item()}, the sum of the whole vocabulary")
dist.destroy_process_group()
'''
LIMIT_S = 30  # a launch of exercise 2's script: its own collective timeout ends the starter in seconds
_measured: dict[str, tuple[int, int]] = {}


def _line(text: str) -> int:
    return next(n for n, line in enumerate(HANG.splitlines(), 1) if text in line)


def hang_culprit(ctx: Context) -> tuple[int, int]:
    """07.1: exercise 2's starter launched on 2 ranks: (the rank that was not in a collective when the job was
    stopped, the line of the script it was at), from the stacks the ranks printed (``LaunchError.where``). Measured
    once per process."""
    for _attempt in range(2):  # a second try where a loaded machine made the first one fail elsewhere (its init)
        if "hang" in _measured:
            break
        folder = Path(tempfile.mkdtemp(prefix="exercise-07.1-"))
        found: list[tuple[int, int]] = []
        try:
            (folder / "train.py").write_text(HANG)
            try:
                ctx.launch([folder], script=folder / "train.py", timeout_s=LIMIT_S, live="off")
            except LaunchError as e:
                found = [(rank, place.own.line) for rank, place in sorted(e.where.items())
                         if (place.own.name, place.own.function) == ("train.py", "<module>")]
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if len(found) == 1:
            _measured["hang"] = found[0]
    if "hang" not in _measured:
        raise RuntimeError("exercise 07.1: exercise 2's starter did not stop with one rank in the script itself")
    return _measured["hang"]


# 07.2: the learner's script on 2 ranks, in a fresh folder (a vocabulary file an earlier run left would let the hang
# pass), ends by itself within LIMIT_S (the starter's collective times out after 3 s: the doctor's verdict), every rank
# took part in collectives across both ranks, and the ranks called the same collectives in the same order (section 1:
# each collective is a rendezvous of every rank). Nothing here varies between checks, so no variant and no reference:
# what is compared is the run's own structure. What the ranks read from the file is not something the observer sees.
HANG_FIXED = ObservedCheck(properties=(Distributed(), Matched()), variants=Variants(seed=False), reference=False)


def hang_fixed(ctx: Context) -> list[Difference]:
    """07.2: ``HANG_FIXED`` on a fresh folder for the vocabulary (the script's argument), removed after the launch."""
    folder = Path(tempfile.mkdtemp(prefix="vocab-", dir=ctx.script.parent))
    try:
        return dataclasses.replace(HANG_FIXED, extra_args=(str(folder),))(ctx)  # at most LIMIT_S (the spec's limit_s)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# 07.3: the learner's script on 2 ranks ends by itself (the starter's rank 0 waits alone in its all-reduce: the doctor's
# verdict), both ranks take the solution's optimizer steps on the same variant, call the same collectives in the same
# order, and each rank joins as many loss collectives outside backward() (the script's own, beside DDP's buckets) as
# the solution's: rank 0 can only log a global loss the other rank sent it. At least, not equal: a reduce to rank 0 or
# an all-gather does it too. What rank 0 logs is not something the observer sees; that a loss crossed the ranks, it
# does.
GLOBAL_LOSS_ON_EVERY_RANK = ObservedCheck(
    properties=(Distributed("DDP"), SameSteps(), Matched(),
                CountAtLeast(kinds=("all_reduce", "reduce", "all_gather", "gather"), note=N_(
                    "fewer collectives outside backward() than the solution's, which sends each step's loss across "
                    "the ranks: a loss rank 0 logs without them holds no other rank's loss"))),
    variants=Variants({"--steps": (3, 4, 5)}))


register(Spec("07.1", N_("Which rank hangs, and where"), solution="07_1.py", expected=hang_culprit,
              wrong={(0, _line("dist.barrier()  # wait until every")): N_(
                         "rank 0 is the rank named first: its barrier timed out while it waited. It is the victim; the "
                         "culprit is the rank that never reached a collective"),
                     (1, _line("else:") + 2): N_(
                         "line 13 of train.py is rank 1's barrier, which it never reached: its stack shows the line "
                         "it was at. If you counted the cell's lines, %%writefile is line 1 there; the doctor names "
                         "lines of train.py"),
                     (0, _line("    torch.save(")): N_(
                         "rank 0 never got to torch.save: it was waiting in the barrier above it")},
              hints=(N_("Run ex2.check() and read the doctor's verdict: the rank named first is the one whose "
                        "collective timed out. Which row says where the other rank was when it was stopped?"),
                     N_("The row 'rank R was in  train.py:L in <module>' is the rank that never reached the "
                        "collective: answer (R, L)."))))
register(Spec("07.2", N_("Fix the hang"), solution="07_2_train.py", verify=hang_fixed, launches=1, limit_s=LIMIT_S,
              hints=(N_("Rank 0 writes the file only after the barrier, and rank 1 reaches the barrier only after the "
                        "file exists: each waits for the other. Which of the two must come first?"),
                     N_("Rank 0 writes the file, then every rank calls dist.barrier(), then every rank reads it: no "
                        "polling loop, no rank-dependent barrier. The barrier is the signal that the file is there."))))
register(Spec("07.3", N_("A collective only rank 0 calls"), solution="07_3_train.py",
              verify=GLOBAL_LOSS_ON_EVERY_RANK, limit_s=LIMIT_S, withheld_fixes=(CauseId.RANK_BRANCH_COLLECTIVE,),
              hints=(N_("Section 1: every collective is a rendezvous of all ranks. Which collective does rank 1 never "
                        "call, and what is rank 1 doing when rank 0 waits in it?"),
                     N_("Compute the global loss on every rank (dist.all_reduce outside the if), and keep only the "
                        "logging inside if rank == 0. Do not drop the all_reduce: rank 0's own loss is not the "
                        "global one."))))


# 07.4, find the bug (issue 44): a job whose data seed decides which rank fails and how (a record without features:
# an exception; a record that waits for a cache file nobody writes: a hang, ended by the 3 s collective timeout).
# The answer is checked against the run the learner read (bugs.found_in: the doctor's diagnosis and the ranks'
# stacks), never against a constant.
FAILED_JOB = FindTheBug(
    program="07_4_job.py",
    causes=(CauseId.COLLECTIVE_TIMEOUT, CauseId.PYTHON_EXCEPTION, CauseId.COLLECTIVE_MISMATCH, CauseId.RANK_FINISHED,
            CauseId.KILLED_BY_SIGNAL, CauseId.OUT_OF_MEMORY),
    variants=Variants(seed=True))
register(Spec("07.4", N_("Find the rank, the line and the cause of a failed job"), solution="07_4.py",
              verify=FAILED_JOB, script_name="job.py", limit_s=LIMIT_S,
              hints=(N_("Section 1: the rank whose collective timed out is the one that waited, not the one it waited "
                        "for. In each rank's last lines, which rank raised an error of its own, and which was stopped "
                        "elsewhere?"),
                     N_("The line is the innermost line of job.py in the culprit's traceback, or in its stack when "
                        "torchrun stopped it (File \"...job.py\", line N). A timeout in a collective is a collective "
                        "timeout; an error the script raised is a python exception."))))
