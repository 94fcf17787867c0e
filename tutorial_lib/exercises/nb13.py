"""Notebook 13's exercises (your model on your GPUs): the layout the stored plans recommend for a Qwen2.5 on
4 x 24 GB at 4096 tokens, and what ``to_empty`` leaves undone (a tied head, a buffer the checkpoint does not hold)."""

from __future__ import annotations

import math

from ..i18n import N_, Message
from ..planning.hf_plan import FULL_FINE_TUNING, read_hf_table, recommend_layout
from .core import SOLUTIONS, Context, Difference, Spec, register

MODEL_13_1, GPUS_13_1, SEQ_13_1 = "qwen2.5-1.5b", 4, 4096
STEPS_13_2 = [1, 2, 3]
MODEL_13_3, SEQ_13_3 = "qwen2.5-7b", 1024


def recommended_layout(ctx: Context) -> str:
    """13.1: the layout section 3's planner recommends (``tl.recommend_layout`` on the stored table) for Qwen2.5-1.5B
    on 4 GPUs of 24 GB at 4096 tokens."""
    return recommend_layout(read_hf_table(), MODEL_13_1, GPUS_13_1, SEQ_13_1)["layout"]


def materialized_like_the_checkpoint(ctx: Context) -> list[Difference]:
    """13.2: the learner's model, built on meta and loaded from the checkpoint, trains its 3 steps on 2 ranks with the
    same losses as the reference (the solution, launched the same way), and its head is still the embedding."""
    records = ctx.records(ctx.launch(nproc_per_node=2))
    reference = ctx.records(ctx.launch(nproc_per_node=2, script=SOLUTIONS / ctx.spec.solution))
    differences = []
    for rank in range(2):
        mine, ref = records.get(rank, []), reference.get(rank, [])
        steps = [r.get("step") for r in mine]
        if steps != STEPS_13_2:
            differences.append(Difference(Message("steps trained"), STEPS_13_2, steps, rank))
            continue
        if not all(r.get("tied") is True for r in mine):
            differences.append(Difference(Message("head.weight is embed.weight after each step"), True, False, rank,
                                          note=Message("to_empty gives every parameter its own new storage: a tied "
                                                       "pair becomes two tensors that train apart; tie them again")))
        gaps = [abs(a.get("loss", math.nan) - b["loss"]) for a, b in zip(mine, ref)]
        worst = max(gaps, key=lambda g: math.inf if math.isnan(g) else g)
        limit = 1e-5 * max(abs(r["loss"]) for r in ref)
        if not worst <= limit:
            first_ok = gaps[0] <= limit  # the same start, then apart: the weights, not the forward, differ
            note = Message("the first step agrees and the later ones do not: two tensors that should be one "
                           "trained apart") if first_ok else Message(
                "a buffer the checkpoint does not hold (persistent=False) was never computed on meta, and to_empty "
                "left it uninitialised: compute it again")
            differences.append(Difference(Message("largest |loss - the loaded model's loss| over the steps"),
                                          "<= 1e-05 x loss", worst, rank, note=note))
    return differences


def fewest_gpus_without_offload(ctx: Context) -> int:
    """13.3: the fewest GPUs of the stored table's counts on which a full fine-tuning layout that keeps the state on
    the GPUs (no CPU offload) fits Qwen2.5-7B at 1024 tokens."""
    table = read_hf_table()
    on_gpu = [layout for layout in FULL_FINE_TUNING if "offload" not in layout]
    rows = table[(table["model"] == MODEL_13_3) & (table["seq_len"] == SEQ_13_3) & table["layout"].isin(on_gpu)]
    return int(rows[rows["fits"].astype(bool)]["gpus"].min())


register(Spec("13.1", N_("The layout for Qwen2.5-1.5B on 4 x 24 GB at 4096 tokens"), solution="13_1.py",
              expected=recommended_layout,
              wrong={"bf16": N_("bf16 halves the parameters and activations, but at 4096 tokens the activations "
                                "still do not fit: something must recompute them"),
                     "fp32": N_("fp32 fits at 1024 tokens; at 4096 the activations are four times larger and it "
                                "no longer fits"),
                     "bf16 + AC full": N_("it fits, but a layout that recomputes less fits too: the recommendation "
                                          "takes the fewest memory savers"),
                     "LoRA r16, bf16 + AC full": N_("LoRA trains a small adapter, not the model: the recommendation "
                                                    "takes it only when no full fine-tuning layout fits")},
              hints=(N_("Section 3: tl.read_hf_table() holds the plans, tl.recommend_layout(table, model, gpus, "
                        "seq_len) picks from them. The model's name in the table is qwen2.5-1.5b."),
                     N_("Full fine-tuning layouts in order of memory savers: fp32, bf16, bf16 + AC selective, bf16 + "
                        "AC full, bf16 + AC full + offload. Answer the first whose plan fits at 4096 tokens on 4 "
                        "GPUs."))))
register(Spec("13.2", N_("What to_empty leaves undone"), solution="13_2_train.py",
              verify=materialized_like_the_checkpoint,
              hints=(N_("Section 4: two things are not in a checkpoint. Compare the state dict's keys with the model's "
                        "buffers, and ask what to_empty does to two modules that share one Parameter."),
                     N_("After to_empty: tie the head to the embedding again (net.head.weight = net.embed.weight) and "
                        "compute inv_freq again, as __init__ does."))))
register(Spec("13.3", N_("The fewest GPUs for Qwen2.5-7B without offload"), solution="13_3.py",
              expected=fewest_gpus_without_offload,
              wrong={4: N_("on 4 GPUs only offload or LoRA fit: the state alone, 16 bytes per parameter over 4 GPUs, "
                           "is about 28 GiB per GPU"),
                     2: N_("on 2 GPUs the state alone is about 57 GiB per GPU"),
                     16: N_("the table plans 1, 2, 4 and 8 GPUs, and one of them is enough")},
              hints=(N_("Section 3's table has the plans on 1, 2, 4 and 8 GPUs. Leave out the layouts with offload and "
                        "LoRA (LoRA is not full fine-tuning)."),
                     N_("Filter tl.read_hf_table() to qwen2.5-7b, seq_len 1024, the layouts fp32, bf16, bf16 + AC "
                        "selective and bf16 + AC full, with fits True, and take the smallest gpus."))))
