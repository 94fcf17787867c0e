"""Notebook 11's exercises (a transformer LM with FSDP2): the layout the stored plan picks for a GPT on 4 x 24 GB, a
loss per token whose gradient must be the mean over every token whatever the world size, and a model built on meta and
sharded that must start from one process's weights."""

from __future__ import annotations

from ..i18n import N_
from ..planning.memory_plan import LAYOUTS, read_memory_table
from .core import Context, Spec, register
from .observing import ObservedCheck, Variants
from .properties import Distributed
from .same_values import SameLosses, SameTensors

MODEL_11_1, GPUS_11_1 = "1.3B", 4


def fewest_savers_that_fit(ctx: Context) -> str:
    """11.1: the first layout of ``memory_plan.LAYOUTS`` (fewest memory savers first) whose stored plan fits the 1.3B
    GPT on 4 GPUs of 24 GB (``tl.planning.read_memory_table()``, section 8's table)."""
    table = read_memory_table()
    rows = table[(table["model"] == MODEL_11_1) & (table["gpus"] == GPUS_11_1)].set_index("layout")
    return next(layout for layout in LAYOUTS if bool(rows.loc[layout, "fits"]))


# 11.2: two SGD steps of a stand-in LM head on windows of different lengths, each rank taking windows rank, rank + W,
# ...; the gradient DDP left at each step against the solution's on the same windows (the gradient of the mean over
# every token of the step, as one process takes it), and each rank's loss against the solution's rank's (its own
# windows' share of that mean: a rank that scored every window, or other ones, fails there even when the average
# agrees). That is section 4's lesson, on a training step: the evaluation's mean is not observable (no backward(), no
# optimizer step), a gradient is.
# The windows hold 8, 16, ..., 8 x windows tokens in a random order; the window counts picked (5, 6, 9) make the
# multipliers sum to an odd number (15, 21, 45), so 2 ranks never hold as many tokens and the mean of their means is
# never the mean over every token by chance.
WINDOWS_11_2 = (5, 6, 9)
# Rounding alone: a gradient entry, or a rank's loss, sums at most every token of the step (8 x 45 = 360 for 9
# windows) in float32, then one division, one multiplication, DDP's sum over 2 ranks and its division: 364 terms
# (rounding_tolerance). Cross-entropies are >= 0, so the loss's sum has no cancellation; the gradient's scale is its
# largest entry.
TERMS_11_2 = 8 * sum(range(1, max(WINDOWS_11_2) + 1)) + 4
EVERY_TOKEN_ONCE = ObservedCheck(
    properties=(Distributed("DDP"),
                SameTensors("grad", terms=TERMS_11_2, note=N_(
                    "the gradient DDP left is not the gradient of the mean over every token of the step (its norm is "
                    "{ratio:.3g} times the solution's on the same windows): the step's tokens did not all weigh the "
                    "same in it")),
                SameLosses(terms=TERMS_11_2, note=N_(
                    "this rank's loss is {ratio:.3g} times the solution's on the same windows: it is not this rank's "
                    "share of the step's loss (its own windows' token losses, each weighed as the mean over every "
                    "token of the step weighs it)"))),
    variants=Variants({"--windows": WINDOWS_11_2}))

# 11.3: the weights each rank holds after the model was built on meta, sharded and initialised (the observer records the
# root's parameters at the end: each rank's own shard, with its placement), against the solution's on the same seed,
# whose rank 0 built the whole model once: one process's weights, each rank its rows. A copy, no arithmetic: one
# rounding's room (terms=1). Then the loss of the first batch, the forward on those weights: the same few sums of
# float32 products in the same order (8 + 16 inputs, 16 squares and their mean: 42 terms, 48 allowed). The gradients
# are not compared: the lesson is the starting weights. (They would agree too, the solution running on the same torch:
# on 2.8 both come out world_size times larger, gloo's reduce-scatter with AVG summing, pytorch#162338.)
ONE_PROCESS_WEIGHTS = ObservedCheck(
    properties=(Distributed("FSDP2"),
                SameTensors("value", at="final", terms=1, note=N_(
                    "the weights this rank holds are not its rows of the model one process builds from the same seed: "
                    "put together, the ranks hold a model no single process would build, and one that changes with "
                    "the world size")),
                SameLosses(terms=48, note_first=N_(
                    "the first batch's loss differs from the solution's on the same batch: the forward did not run on "
                    "one process's weights"))))


register(Spec("11.1", N_("The layout for a 1.3B GPT on 4 x 24 GB"), solution="11_1.py",
              expected=fewest_savers_that_fit,
              wrong={"DDP fp32": N_("DDP keeps the whole model and its AdamW state on every GPU: the plan of 1.3B "
                                    "needs about 25 GiB per GPU, over the 23.6 usable"),
                     "FSDP2 bf16 + AC": N_("it fits, but so does a layout with fewer savers; activation checkpointing "
                                           "costs a second forward of every block and bf16 changes the numbers"),
                     "FSDP2 bf16": N_("it fits, but so does a layout with fewer savers: fp32 compute already fits")},
              hints=(N_("Section 8's stored table (tl.planning.read_memory_table()) has one row per model, GPU count "
                        "and layout, with a fits column. Look at the rows of 1.3B on 4 GPUs."),
                     N_("Take the layouts in the table's order, DDP fp32, FSDP2 fp32, FSDP2 bf16, FSDP2 bf16 + AC "
                        "(each adds a memory saver), and answer the first whose fits is True."))))
register(Spec("11.2", N_("A loss per token that does not depend on the world size"), solution="11_2_train.py",
              verify=EVERY_TOKEN_ONCE,
              hints=(N_("Section 4: the evaluation all-reduces the loss sums and the token counts, so every token "
                        "weighs the same whatever the split. Here the ranks hold different numbers of tokens, and DDP "
                        "averages their gradients: what does averaging the ranks' means weigh wrongly?"),
                     N_("All-reduce the step's number of tokens (SUM), and make each rank's loss the sum of its token "
                        "losses divided by that number, times world_size: DDP divides the ranks' summed gradients by "
                        "world_size."))))
register(Spec("11.3", N_("One process's weights in a model built on meta"), solution="11_3_init.py",
              verify=ONE_PROCESS_WEIGHTS,
              hints=(N_("Section 3: a run on 2, 4 or 64 ranks must start from exactly the same weights. Print "
                        "model[0].weight.full_tensor() on 2 ranks: what do rows 0 and 8 hold?"),
                     N_("Let rank 0 build the whole model once (build().state_dict(); the other ranks pass {}) and "
                        "load it with set_model_state_dict(model, seed, options=StateDictOptions("
                        "full_state_dict=True, broadcast_from_rank0=True)) instead of reset_parameters()."))))
