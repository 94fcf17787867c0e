"""Notebook 11's exercises (a transformer LM with FSDP2): the layout the stored plan picks for a GPT on 4 x 24 GB, and
a held-out loss that must be the exact mean over every token whatever the world size, a model built on meta and
sharded that must start from one process's weights."""

from __future__ import annotations

import torch

from ..i18n import N_, Message
from ..planning.memory_plan import LAYOUTS, read_memory_table
from .core import Context, Difference, Spec, register

MODEL_11_1, GPUS_11_1 = "1.3B", 4


def fewest_savers_that_fit(ctx: Context) -> str:
    """11.1: the first layout of ``memory_plan.LAYOUTS`` (fewest memory savers first) whose stored plan fits the 1.3B
    GPT on 4 GPUs of 24 GB (``tl.read_memory_table()``, section 8's table)."""
    table = read_memory_table()
    rows = table[(table["model"] == MODEL_11_1) & (table["gpus"] == GPUS_11_1)].set_index("layout")
    return next(layout for layout in LAYOUTS if bool(rows.loc[layout, "fits"]))


def exact_held_out_mean(ctx: Context) -> list[Difference]:
    """11.2: the script's held-out loss on 2 ranks equals its value on 1 rank (the mean over every token, once), and
    each rank scored only its share of the tokens."""
    pair, differences = ctx.per_rank(ctx.launch(nproc_per_node=2), 2)
    single, missing = ctx.per_rank(ctx.launch(nproc_per_node=1), 1)
    differences += missing
    if differences:
        return differences
    reference, total = single[0]["eval_loss"], single[0]["tokens_scored"]
    for rank, record in sorted(pair.items()):
        loss = record.get("eval_loss")
        if not isinstance(loss, (int, float)) or abs(loss - reference) > 1e-9 * max(abs(reference), 1.0):
            differences.append(Difference(Message("held-out loss"), reference, loss, rank, note=Message(
                "the mean of the ranks' means weighs a token of the rank with fewer tokens more: all-reduce the "
                "sums and the counts, then divide")))
    shares = [pair[rank].get("tokens_scored") for rank in sorted(pair)]
    if any(not isinstance(s, int) or s >= total for s in shares) or sum(shares) != total:
        differences.append(Difference(Message("tokens each rank scored (their sum is every held-out token, once)"),
                                      f"< {total} each, {total} in all", shares, note=Message(
                                          "each rank scores only its own windows: the evaluation is split, not "
                                          "repeated")))
    return differences


def one_process_weights(ctx: Context) -> list[Difference]:
    """11.3: the script's sharded model on 2 ranks holds the weights (and gives the loss) of the same script on 1 rank,
    with its first Linear really sharded (half of its rows on each rank)."""
    pair, differences = ctx.per_rank(ctx.launch(nproc_per_node=2), 2)
    single, missing = ctx.per_rank(ctx.launch(nproc_per_node=1), 1)
    differences += missing
    if differences:
        return differences
    reference = torch.tensor(single[0]["weights"])
    for rank, record in sorted(pair.items()):
        if record.get("rows_here") != single[0]["rows_here"] // 2:
            differences.append(Difference(Message("rows of the first weight on this rank (sharded: half of them)"),
                                          single[0]["rows_here"] // 2, record.get("rows_here"), rank))
        weights = torch.tensor(record.get("weights") or [])
        if weights.shape != reference.shape:
            differences.append(Difference(Message("weights (all of them, gathered)"), reference.numel(),
                                          weights.numel(), rank))
            continue
        gap = (weights - reference).abs().max().item()
        if gap > 1e-7:
            differences.append(Difference(Message("largest |weight - one process's initial weight|"), "<= 1e-07", gap,
                                          rank, note=Message(
                "each rank initialised its own shard from the same seed, so every shard holds the same numbers: "
                "start every layout from one set of whole weights (section 3's seed checkpoint)")))
        loss = record.get("loss")
        if not isinstance(loss, (int, float)) or abs(loss - single[0]["loss"]) > 1e-6 * max(abs(single[0]["loss"]), 1):
            differences.append(Difference(Message("loss of the first batch"), single[0]["loss"], loss, rank))
    return differences


register(Spec("11.1", N_("The layout for a 1.3B GPT on 4 x 24 GB"), solution="11_1.py",
              expected=fewest_savers_that_fit,
              wrong={"DDP fp32": N_("DDP keeps the whole model and its AdamW state on every GPU: the plan of 1.3B "
                                    "needs about 25 GiB per GPU, over the 23.6 usable"),
                     "FSDP2 bf16 + AC": N_("it fits, but so does a layout with fewer savers; activation checkpointing "
                                           "costs a second forward of every block and bf16 changes the numbers"),
                     "FSDP2 bf16": N_("it fits, but so does a layout with fewer savers: fp32 compute already fits")},
              hints=(N_("Section 8's stored table (tl.read_memory_table()) has one row per model, GPU count and "
                        "layout, with a fits column. Look at the rows of 1.3B on 4 GPUs."),
                     N_("Take the layouts in the table's order, DDP fp32, FSDP2 fp32, FSDP2 bf16, FSDP2 bf16 + AC "
                        "(each adds a memory saver), and answer the first whose fits is True."))))
register(Spec("11.2", N_("A held-out loss that does not depend on the world size"), solution="11_2_eval.py",
              verify=exact_held_out_mean,
              hints=(N_("Section 4: the evaluation all-reduces the loss sums and the token counts. Here the ranks "
                        "hold different numbers of tokens: what does averaging their means weigh wrongly?"),
                     N_("Keep each rank's sum of token losses and its token count, all_reduce both (SUM), and divide "
                        "the total sum by the total count."))))
register(Spec("11.3", N_("One process's weights in a model built on meta"), solution="11_3_init.py",
              verify=one_process_weights,
              hints=(N_("Section 3: a run on 2, 4 or 64 ranks must start from exactly the same weights. Print "
                        "model[0].weight.full_tensor() on 2 ranks: what do rows 0 and 8 hold?"),
                     N_("Let rank 0 build the whole model once (build().state_dict(); the other ranks pass {}) and "
                        "load it with set_model_state_dict(model, seed, options=StateDictOptions("
                        "full_state_dict=True, broadcast_from_rank0=True)) instead of reset_parameters()."))))
