"""Notebook 07's exercises (troubleshooting): a hang, first read (which rank is not in a collective, at which line),
then fixed; a collective inside ``if rank == 0:``. The hang's script is exercise 2's starter; its collective timeout (3 s) turns the hang into an error, so
a check of the starter costs seconds, not the launch's limit."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from ..errors import LaunchError
from ..i18n import N_, Message
from .core import Context, Difference, Spec, register

# Exercise 2's starter, as the notebook's %%writefile {ex2.script} cell writes it: exercise 1 asks where it hangs.
HANG = '''import json, os, sys, time
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
print("check", json.dumps({"total": total.item()}))  # the line the check reads
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
                places = {rank: re.match(r"train\.py:(\d+) in <module>", where) for rank, where in e.where.items()}
                found = [(rank, int(m[1])) for rank, m in sorted(places.items()) if m]
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if len(found) == 1:
            _measured["hang"] = found[0]
    if "hang" not in _measured:
        raise RuntimeError("exercise 07.1: exercise 2's starter did not stop with one rank in the script itself")
    return _measured["hang"]


def hang_fixed(ctx: Context) -> list[Difference]:
    """07.2: the learner's script on 2 ranks, in a fresh folder, ends by itself (the starter times out in its
    collective after 3 s: the doctor's verdict), and every rank read the whole vocabulary (its all-reduced sum)."""
    folder = Path(tempfile.mkdtemp(prefix="vocab-", dir=ctx.script.parent))
    try:
        records, differences = ctx.per_rank(ctx.launch([folder], timeout_s=LIMIT_S), 2)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    total = sum(range(100))  # the vocabulary: torch.arange(100), split over the ranks and all-reduced
    for rank, record in sorted(records.items()):
        if record.get("total") != total:
            differences.append(Difference(Message("sum of the vocabulary over both ranks (all_reduce)"), total,
                                          record.get("total"), rank))
    return differences


def global_loss_on_every_rank(ctx: Context) -> list[Difference]:
    """07.3: the learner's script on 2 ranks trains its 5 steps on both, and rank 0 logs the global loss: the mean of
    both ranks' local losses at every step (not rank 0's own)."""
    records = ctx.records(ctx.launch(timeout_s=LIMIT_S))
    differences = []
    steps = {rank: [r.get("step") for r in records.get(rank, [])] for rank in range(2)}
    for rank in range(2):
        if steps[rank] != [1, 2, 3, 4, 5]:
            differences.append(Difference(Message("steps trained"), [1, 2, 3, 4, 5], steps[rank], rank))
    if differences:
        return differences
    local = {rank: {r["step"]: r.get("loss") for r in records[rank]} for rank in range(2)}
    for record in records[0]:
        step, logged = record["step"], record.get("global_loss")
        mean = (local[0][step] + local[1][step]) / 2
        if not isinstance(logged, (int, float)) or abs(logged - mean) > 1e-6 * max(abs(mean), 1.0):
            differences.append(Difference(
                Message("global loss rank 0 logged at step {step}", {"step": step}), mean, logged, 0,
                note=Message("the global loss is the mean of every rank's loss: an all_reduce that every rank joins")))
            break  # the first step that differs
    return differences


register(Spec("07.1", N_("Which rank hangs, and where"), solution="07_1.py", expected=hang_culprit,
              wrong={(0, _line("dist.barrier()  # wait until every")): N_(
                         "rank 0 is the rank named first: its barrier timed out while it waited. It is the victim; the "
                         "culprit is the rank that never reached a collective"),
                     (1, _line("else:") + 2): N_(
                         "line 13 of train.py is rank 1's barrier, which it never reached: its stack shows the line it was at. If you "
                         "counted the cell's lines, %%writefile is line 1 there; the doctor names lines of train.py"),
                     (0, _line("    torch.save(")): N_(
                         "rank 0 never got to torch.save: it was waiting in the barrier above it")},
              hints=(N_("Run ex2.check() and read the doctor's verdict: the rank named first is the one whose "
                        "collective timed out. Which row says where the other rank was when it was stopped?"),
                     N_("The row 'rank R was in  train.py:L in <module>' is the rank that never reached the collective: "
                        "answer (R, L)."))))
register(Spec("07.2", N_("Fix the hang"), solution="07_2_train.py", verify=hang_fixed,
              hints=(N_("Rank 0 writes the file only after the barrier, and rank 1 reaches the barrier only after the "
                        "file exists: each waits for the other. Which of the two must come first?"),
                     N_("Rank 0 writes the file, then every rank calls dist.barrier(), then every rank reads it: no "
                        "polling loop, no rank-dependent barrier. The barrier is the signal that the file is there."))))
register(Spec("07.3", N_("A collective only rank 0 calls"), solution="07_3_train.py",
              verify=global_loss_on_every_rank,
              hints=(N_("Section 1: every collective is a rendezvous of all ranks. Which collective does rank 1 never "
                        "call, and what is rank 1 doing when rank 0 waits in it?"),
                     N_("Compute the global loss on every rank (dist.all_reduce outside the if), and keep only the "
                        "logging inside if rank == 0. Do not drop the all_reduce: rank 0's own loss is not the "
                        "global one."))))
