"""Notebook 12's exercises (tensor and pipeline parallelism): the micro-batches a 4-stage GPipe needs for a given
bubble, replayed as section 4 replays the stages; a TP plan whose collectives, as torch saw each rank issue them, must
match section 1's table; and a whole plan for a two-block model, written from nothing (tensor parallel, with or without
sequence parallelism), held to what TP must do: split weights, at most 2 synchronisations per block each way, and the
gradients one process computes."""

from __future__ import annotations

from dataclasses import dataclass

from ..i18n import N_, Message, Nn_
from ..runs.observed import Collective, ObservedRank
from ..runs.pipeline import idle_fractions, in_flight, replay_slots
from .core import Context, Difference, Spec, register
from .observing import ObservedCheck, Property, Variants
from .properties import Distributed, HeldParameterBytes, PhaseCounts
from .same_values import SameTensors, SameWholeGradients

STAGES_12_1, BUBBLE_12_1 = 4, 0.2  # four GPUs as four stages; each may idle at most a fifth of the step
STAGES_12_2, MICROBATCHES_12_2, STAGE_12_2 = 4, 8, 1  # 1F1B, 4 stages, 8 micro-batches: the second stage's peak

# Section 1's table for one block under TP (Megatron's plan): one all-reduce after each Colwise -> Rowwise pair in
# forward (after the attention, after the MLP), one per prepared input in backward; no all-gather, no reduce-scatter.
TP_BLOCK_COLLECTIVES = {"forward": {"all_reduce": 2, "all_gather": 0, "reduce_scatter": 0},
                        "backward": {"all_reduce": 2, "all_gather": 0, "reduce_scatter": 0}}
# 12.3's block: the sums its output and input gradient go through, one after the other (q, k and v over 32 features, a
# head's dot product over 8, the attention over 6 positions, wo over 32, the MLP over 32 then 128). TP splits some of
# them over the ranks and adds the halves in an all-reduce: another order of the same float32 sums.
TP_BLOCK_SUM_TERMS = 32 + 8 + 6 + 32 + 32 + 128
EXTRA_ALL_REDUCES = Nn_("{extra} all-reduce more than section 1's table in backward: q, k and v each turned the same "
                        "plain input into a replicated DTensor of its own, and each all-reduces its own input gradient "
                        "where one all-reduce of their sum is enough",
                        "{extra} all-reduces more than section 1's table in backward: q, k and v each turned the same "
                        "plain input into a replicated DTensor of its own, and each all-reduces its own input gradient "
                        "where one all-reduce of their sum is enough")


def fewest_microbatches(ctx: Context) -> int:
    """12.1: the fewest micro-batches m for which every stage of a 4-stage GPipe step idles at most 1/5 of it, found
    by replaying GPipe's order (every forward, then every backward) in equal slots, as section 4 replays the stages'."""
    for m in range(1, 1000):
        orders = {s: [f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)] for s in range(STAGES_12_1)}
        if (idle_fractions(replay_slots(orders)) <= BUBBLE_12_1 + 1e-12).all():
            return m
    raise AssertionError("no m below 1000")


def one_f_one_b(stages: int, m: int) -> dict[int, list[str]]:
    """1F1B's order of actions per stage: stage s warms up with min(p - s, m) forwards, then alternates one backward,
    one forward, then runs the backwards left (arXiv:2104.04473, section 2.2)."""
    orders = {}
    for s in range(stages):
        warm = min(stages - s, m)
        order = [f"F{i}" for i in range(warm)]
        for i in range(m - warm):
            order += [f"B{i}", f"F{warm + i}"]
        orders[s] = order + [f"B{i}" for i in range(m - warm, m)]
    return orders


def peak_in_flight(ctx: Context) -> int:
    """12.2: the most micro-batches whose activations stage 1 holds at once under 1F1B (4 stages, 8 micro-batches),
    counted from the order of actions (replayed first: an order that cannot run raises)."""
    orders = one_f_one_b(STAGES_12_2, MICROBATCHES_12_2)
    replay_slots(orders)
    return in_flight(orders[STAGE_12_2])


# 12.3: the block's forward and backward on 2 ranks, as torch saw each rank issue them: the all-reduces, all-gathers and
# reduce-scatters outside and inside backward() against section 1's table (the plan's setup scatters and broadcasts the
# weights once: other kinds, not counted); then the gradients each rank's shards got, against the solution's on the same
# input (the same plan shards them the same way: a layer not split as section 1 splits it has other shapes). The
# weight gradients also sum over the batch's positions (at most 4 x 6) after the block's sums (TP_BLOCK_SUM_TERMS).
BATCHES_12_3 = (2, 3, 4)
TP_BLOCK = ObservedCheck(
    properties=(Distributed("TP"),
                PhaseCounts(kinds=("all_reduce", "all_gather", "reduce_scatter"), expected=TP_BLOCK_COLLECTIVES,
                            note_phase="backward", note=EXTRA_ALL_REDUCES),
                SameTensors("grad", at="final", terms=TP_BLOCK_SUM_TERMS + 6 * max(BATCHES_12_3), note=N_(
                    "this rank's gradient shard is {ratio:.3g} times the solution's on the same input: the sharded "
                    "block does not compute what the unsharded one computes"))),
    variants=Variants({"--batch": BATCHES_12_3}))


register(Spec("12.1", N_("Micro-batches for a bubble of at most 1/5 on 4 stages"), solution="12_1.py",
              expected=fewest_microbatches,
              wrong={15: N_("that makes (p - 1) / m at most 1/5; the step is m + p - 1 slots long, not m"),
                     4: N_("that is the answer for 2 stages; here each of the 4 GPUs is a stage"),
                     13: N_("that leaves each stage idle less than 1/5 of the step, but a smaller m does too")},
              hints=(N_("Section 4: with equal forwards and backwards, GPipe and 1F1B leave each stage idle for "
                        "(p - 1) / (m + p - 1) of the step (p stages, m micro-batches)."),
                     N_("Solve (4 - 1) / (m + 4 - 1) <= 1/5 for the smallest whole m: 3 x 5 <= m + 3."))))
register(Spec("12.2", N_("Activations in flight on a 1F1B stage"), solution="12_2.py", expected=peak_in_flight,
              wrong={8: N_("that is GPipe: every forward before any backward, all m micro-batches held at once"),
                     4: N_("that is stage 0: stage s warms up with p - s forwards, and this is stage 1"),
                     2: N_("stages count from 0: stage 1 is the second of the four stages")},
              hints=(N_("Section 4's memory table: 1F1B starts backward on stage s after p - s forwards, then "
                        "alternates one forward and one backward."),
                     N_("In flight on stage s: min(m, p - s). Here p = 4, m = 8, s = 1."))))
register(Spec("12.3", N_("A TP plan with section 1's collectives"), solution="12_3_tp.py",
              verify=TP_BLOCK,
              hints=(N_("Section 1's table: under TP one block issues 2 all-reduces in forward and 2 in backward. Run "
                        "the check: which phase issues more, and which modules receive a plain tensor?"),
                     N_("Add \"0\": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts="
                        "(Replicate(),)) to the plan: q, k and v then share one DTensor input, and their input "
                        "gradients are summed locally and reduced once."))))


# 12.4: a whole plan for two pre-norm blocks (attention, then an MLP), trained 2 SGD steps. Section 1's rule per block:
# one synchronisation of the activations after each column-wise -> row-wise pair, forward and backward; sequence
# parallelism turns each into a reduce-scatter followed, before the next pair, by an all-gather (one more puts the
# output's sequence back together). Counted from what torch saw each rank issue: in each step's forward (outside
# backward(), before the step's first collective inside it) and in its backward(); the optimizer step's own all-reduces
# (a norm's Partial gradient under sequence parallelism) are the optimizer's, not the blocks'.
BLOCKS_12_4, SYNCS_PER_BLOCK_12_4 = 2, 2
BATCHES_12_4 = (2, 3, 4)
TOKENS_12_4, WIDTH_12_4, STEPS_12_4 = 8, 32, 2  # the starter's tokens per sequence, width, SGD steps
SYNCS = ("all_reduce", "reduce_scatter")  # a sum of the ranks' partial activations: whole, or each rank its tokens


def phase_collectives(observed: ObservedRank, step: int) -> dict[str, list[Collective]]:
    """``{"forward": [...], "backward": [...]}``: the all-reduces, reduce-scatters and all-gathers the rank issued in
    optimizer step ``step``'s forward (outside ``backward()``, before the step's first collective inside it; all of
    them outside when none ran inside) and inside its ``backward()`` calls. The weights' scatter and broadcast at setup
    are other kinds, and the optimizer step's collectives come after the backward's."""
    mine = [c for c in observed.collectives_of(step=step) if c.kind in (*SYNCS, "all_gather")]
    inside = [c for c in mine if c.backward is not None]
    first = min((c.seq for c in inside), default=None)
    return {"forward": [c for c in mine if c.backward is None and (first is None or c.seq < first)],
            "backward": inside}


@dataclass(frozen=True)
class SyncsPerBlock(Property):
    """In the forward and in the backward of every optimizer step, on every rank: at most ``per_block`` x ``blocks``
    synchronisations of the activations (all-reduces and reduce-scatters together), and at most one all-gather more
    than reduce-scatters (sequence parallelism gathers the tokens again after each reduce-scatter, and once more for
    the output). The first step and phase over either bound is said per rank, with the three counts."""

    blocks: int = BLOCKS_12_4
    per_block: int = SYNCS_PER_BLOCK_12_4

    def check(self, mine, reference, variant):
        out = []
        limit = self.blocks * self.per_block
        for observed in mine:
            for step in range(1, len(observed.steps) + 1):
                found = self._phase(observed, step, limit)
                if found is not None:
                    out.append(found)
                    break
        return out

    def _phase(self, observed: ObservedRank, step: int, limit: int) -> Difference | None:
        for phase, collectives in phase_collectives(observed, step).items():
            counts = {kind: sum(c.kind == kind for c in collectives) for kind in (*SYNCS, "all_gather")}
            syncs = counts["all_reduce"] + counts["reduce_scatter"]
            gathers = counts["all_gather"] - counts["reduce_scatter"]
            if syncs <= limit and gathers <= 1:
                continue
            fields = {"step": step, "syncs": syncs, "blocks": self.blocks, "limit": limit,
                      "gathers": counts["all_gather"], "scatters": counts["reduce_scatter"]}
            if syncs > limit:
                note = Message(SYNCS_NOTES[phase], fields)
            else:
                note = Message(N_("{gathers} all-gathers for {scatters} reduce-scatters: activations were made whole "
                                  "on every rank more often than a plan needs (sequence parallelism gathers the "
                                  "tokens once after each reduce-scatter, and once for the output): a layer's output "
                                  "was made whole where the next layer could have used its shard, or several layers "
                                  "each gathered the same input"), fields)
            what = (Message("collectives in the forward of optimizer step {step}", fields) if phase == "forward" else
                    Message("collectives in the backward() of optimizer step {step}", fields))
            return Difference(what, Message("all_reduce + reduce_scatter <= {limit}; all_gather <= reduce_scatter + 1",
                                            fields), counts, observed.rank, note=note)
        return None


SYNCS_NOTES = {
    "forward": N_("the forward synchronised the ranks {syncs} times for {blocks} blocks: more than one sum of partial "
                  "activations after each column-wise -> row-wise pair, so some layer's output was summed over the "
                  "ranks where the next layer could have gone on with its own part"),
    "backward": N_("backward synchronised the ranks {syncs} times for {blocks} blocks: each column-wise -> row-wise "
                   "pair needs its input gradient summed once; more means that layers which read the same input each "
                   "made it a distributed tensor of their own, and each sums its own input gradient over the ranks"),
}
# The gradients against the solution's (tensor parallel, section 1's plan) on the same seed and batch, put together
# whole whatever the plan placed where, relative to the step's largest gradient entry (SameWholeGradients). Rounding: a
# block's output and input gradient go through q, k, v (32 terms each), a head's dot products (8), the attention over
# at most 8 tokens, wo (32), fc1 (32), fc2 (128) and two norms (32 each): 336 terms; the two blocks in a row, 672; the
# weight gradients then sum over at most 4 x 8 positions, and the loss is a mean over at most 4 x 8 x 32 values
# (1,024). Step 2 carries step 1's differences in the weights: twice that. Measured (2026-12-05, torch 2.8 and 2.13,
# sequence parallel and per-block plans against the solution): at most 2.1 x eps x that entry; a gradient off by a
# factor (a loss averaged over each rank's tokens only: 2) is some 1,000 times past the bound.
WHOLE_PLAN_TERMS = STEPS_12_4 * (BLOCKS_12_4 * 336 + max(BATCHES_12_4) * TOKENS_12_4 * (1 + WIDTH_12_4))
WHOLE_PLAN = ObservedCheck(
    properties=(HeldParameterBytes(note=N_(
                    "this rank holds {ratio:.2f} times the solution's parameter bytes: {whole} parameters whole (or "
                    "larger) where the solution holds a shard ({names}, ...): every rank stores, and multiplies by, "
                    "those weights in full")),
                Distributed(),
                SyncsPerBlock(),
                SameWholeGradients(terms=WHOLE_PLAN_TERMS, note=N_(
                    "parameter {name}'s gradient at step {step}, put together from the ranks, is {ratio:.3g} times "
                    "the solution's on the same inputs (one process's, up to rounding): the split run does not "
                    "compute what one process computes, in its model or in its loss"))),
    variants=Variants({"--batch": BATCHES_12_4}))

register(Spec("12.4", N_("A whole TP plan for two blocks"), solution="12_4_tp.py", verify=WHOLE_PLAN,
              hints=(N_("Section 1 splits one block; here are two, and the plan starts empty. For each block: which "
                        "Linears pair up column-wise -> row-wise, what must the attention's input be before q, k and v "
                        "read it, and what stays whole? Section 2 says what changes with sequence parallelism."),
                     N_("A plan maps a module's name to a ParallelStyle: ColwiseParallel() for blocks.N.attn.wq, wk, "
                        "wv and blocks.N.mlp.fc1, RowwiseParallel() for blocks.N.attn.wo and blocks.N.mlp.fc2, and "
                        "PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)) for "
                        "blocks.N.attn, for N = 0 and 1 (\"blocks.*.attn.wq\" names both). With SequenceParallel() on "
                        "the norms, the activations between the pairs are Shard(1): section 2's layouts."))))
