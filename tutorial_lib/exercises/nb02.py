"""Notebook 02's exercises (data and accumulation): a sampler that reshuffles every epoch, the samples padding
repeats, gradient accumulation with one all-reduce per optimizer step."""

from __future__ import annotations

import torch
from torch.utils.data import DistributedSampler

from ..i18n import N_, Message
from .core import Context, Difference, Spec, register

SAMPLER_DATASET, SAMPLER_EPOCHS, SAMPLER_SEED = 12, 3, 0  # 02.1's script: its dataset, epochs and seed
PAD_SAMPLES, PAD_RANKS = 100, 7  # 02.2's question


def _shard(n: int, ranks: int, rank: int, epoch: int, seed: int = 0) -> list[int]:
    """The indices ``DistributedSampler`` (shuffle on, padding) gives ``rank`` of ``ranks`` in ``epoch``."""
    sampler = DistributedSampler(range(n), num_replicas=ranks, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)



def sampler_reshuffles_every_epoch(ctx: Context) -> list[Difference]:
    """02.1: each rank's indices, epoch by epoch, equal DistributedSampler's shard of that epoch (set_epoch called)."""
    records = ctx.records(ctx.launch(nproc_per_node=2))
    differences = []
    epochs = list(range(SAMPLER_EPOCHS))
    for rank in range(2):
        mine = records.get(rank, [])
        seen = [r.get("epoch") for r in mine]
        if seen != epochs:
            differences.append(Difference(Message("epochs reported (check ...)"), epochs, seen, rank))
            continue
        first = [int(i) for i in mine[0].get("indices", [])]
        for epoch, record in zip(epochs, mine):
            expected = _shard(SAMPLER_DATASET, 2, rank, epoch, SAMPLER_SEED)
            measured = [int(i) for i in record.get("indices", [])]
            if measured == expected:
                continue
            if epoch > 0 and measured == first:
                note = Message("epoch {epoch} repeats epoch 0's order: the sampler shuffles with seed + epoch, and "
                               "its epoch only changes when you call set_epoch", {"epoch": epoch})
            else:
                note = Message("keep the sampler as it is (shuffle on, seed 0, padding): only the order across "
                               "epochs is wrong")
            differences.append(Difference(Message("indices read in epoch {epoch}", {"epoch": epoch}),
                                          expected, measured, rank, note=note))
    return differences


def padded_repeats(ctx: Context) -> int:
    """02.2: the index positions that repeat an index when DistributedSampler pads 100 samples for 7 ranks."""
    indices = [i for rank in range(PAD_RANKS) for i in _shard(PAD_SAMPLES, PAD_RANKS, rank, 0)]
    return len(indices) - len(set(indices))


def accumulation_with_no_sync(ctx: Context) -> list[Difference]:
    """02.3: the learner's accumulation loop on 2 ranks all-reduces only in each optimizer step's last micro-batch,
    and ends every step with the parameters of the same script on 1 rank (the whole batch)."""
    pair, differences = ctx.per_rank(ctx.launch(nproc_per_node=2), 2)
    single, missing = ctx.per_rank(ctx.launch(nproc_per_node=1), 1)
    differences += missing
    if differences:
        return differences
    records, reference = ctx.records(ctx.runs[0]), ctx.records(ctx.runs[1])[0]
    for rank in range(2):
        mine = records.get(rank, [])
        steps = [r.get("step") for r in mine]
        if len(steps) < 2:
            differences.append(Difference(Message("optimizer steps reported (the check needs 2 or more)"), ">= 2",
                                          len(steps), rank))
            continue
        if steps != [r.get("step") for r in reference]:
            differences.append(Difference(Message("optimizer steps reported"), [r.get("step") for r in reference],
                                          steps, rank))
            continue
        for record, ref in zip(mine, reference):
            calls = [int(c) for c in record.get("allreduce_calls", [])]
            expected = [0] * (len(calls) - 1) + [max(calls[-1], 1)] if calls else [0, 1]
            if calls != expected:
                differences.append(Difference(
                    Message("gradient all-reduces per micro-batch, optimizer step {step}", {"step": record["step"]}),
                    expected, calls, rank,
                    note=Message("only the last backward() before optimizer.step() needs the ranks' sum: run the "
                                 "others inside model.no_sync()")))
            params, want = torch.tensor(record.get("params", [])), torch.tensor(ref.get("params", []))
            if params.shape != want.shape:
                differences.append(Difference(Message("parameter entries"), want.numel(), params.numel(), rank))
                continue
            gap = (params - want).abs().max().item()
            if gap > 1e-6:
                differences.append(Difference(
                    Message("largest |parameter - one process's|, optimizer step {step}", {"step": record["step"]}),
                    "<= 1e-06", gap, rank,
                    note=Message("every micro-batch's gradient must reach the sum: keep its backward(), and let the "
                                 "last one all-reduce what the others accumulated")))
    return differences


register(Spec("02.1", N_("A sampler that reshuffles every epoch"), solution="02_1_train.py",
              verify=sampler_reshuffles_every_epoch,
              hints=(N_("Section 1: the plot without set_epoch. Compare the indices your ranks print in epoch 0, 1 "
                        "and 2: what does DistributedSampler shuffle with?"),
                     N_("DistributedSampler shuffles with seed + epoch, and its epoch is what you last gave "
                        "sampler.set_epoch(epoch): call it at the top of every epoch, before iterating the loader."))))
register(Spec("02.2", N_("The samples padding repeats"), solution="02_2.py", expected=padded_repeats,
              wrong={PAD_SAMPLES % PAD_RANKS: N_("that is how many samples drop_last=True would leave out; the "
                                                 "default pads instead, up to the next multiple of the world size"),
                     0: N_("without drop_last, DistributedSampler pads the index list, and the padding repeats "
                           "indices"),
                     -(-PAD_SAMPLES // PAD_RANKS) * PAD_RANKS: N_("that is every index the ranks read in one epoch; "
                                                                  "how many of them are repeats?")},
              hints=(N_("Section 1's claim: with padding, ceil(N / world_size) * world_size - N indices are seen "
                        "twice. Each rank gets the same number of indices."),
                     N_("Each of the 7 ranks gets ceil(100 / 7) = 15 indices, 105 in all, for 100 samples."))))
register(Spec("02.3", N_("Gradient accumulation with one all-reduce per step"), solution="02_3_train.py",
              verify=accumulation_with_no_sync,
              hints=(N_("Section 3: every backward() under DDP all-reduces the gradients. Which of the K backward() "
                        "calls of a step needs the ranks' sum?"),
                     N_("Run the first K - 1 micro-batches (forward and backward) inside `with model.no_sync():` and "
                        "the last one outside it; keep the loss divided by K."))))
