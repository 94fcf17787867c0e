"""Notebook 01's exercises (DDP): gradients equal to one process's, the optimizer state DDP replicates, an unused
head fixed without ``find_unused_parameters``, and a single-process script ported to DDP."""

from __future__ import annotations

import torch

from ..i18n import N_
from ..notebook.script_source import import_script
from ..diagnosis.causes import CauseId
from .core import Context, Spec, register
from .observing import ObservedCheck, Variants
from .properties import Distributed, SameSteps, Setting
from .same_values import DistinctLosses, SameTensors

# 01.1: the gradients DDP left after one backward() on 2 ranks, against the solution's on the same seed and batch (one
# process's on the whole batch: section 4). Rounding alone: each entry is a mean over at most 24 samples, summed over
# the ranks and halved in another order than the solution's: 24 terms and two more roundings (rounding_tolerance).
GRADIENTS_EQUAL_ONE_PROCESS = ObservedCheck(
    properties=(Distributed("DDP"),
                SameTensors("grad", at="final", terms=26, note=N_(
                    "this rank's gradient is {ratio:.3g} times one process's on the whole batch: each step would move "
                    "the weights {ratio:.3g} times as far as training on one process"))),
    variants=Variants({"--batch": (12, 16, 20, 24)}))


def adamw_state_bytes(ctx: Context) -> int:
    """01.2: AdamW's state after one step of ddp_train.py's model at its default sizes, counted from the tensors."""
    lesson = import_script("ddp_train")
    args = lesson.parse_args([])
    model = lesson.MLP(args.input_dim, args.hidden_dim, args.output_dim)
    optimizer = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
               if torch.is_tensor(t))


# 01.3: the two-head script trains its 5 steps on 2 ranks with DDP's find_unused_parameters off, as torch held it.
UNUSED_HEAD_WITHOUT_THE_FLAG = ObservedCheck(
    properties=(Distributed("DDP"),
                Setting("DDP", "find_unused_parameters", False, note=N_(
                    "the run trains, but every step DDP searches the autograd graph for parameters without a gradient "
                    "and all-reduces one more time (section 6 measured both), and head b still learns nothing")),
                SameSteps(5)),
    reference=False)


register(Spec("01.1", N_("DDP gradients equal to one process's"), solution="01_1_train.py",
              verify=GRADIENTS_EQUAL_ONE_PROCESS,
              hints=(N_("Run it in your head with world_size 1 and 2: which line changes the gradient when the world "
                        "grows? What does DDP already do to the gradients in backward()?"),
                     N_("DDP averages the ranks' gradients (it divides their sum by world_size). The mean of the ranks' "
                        "mean losses is already the mean over the whole batch: the loss needs no scaling at all."))))
register(Spec("01.2", N_("The bytes of AdamW's state on each rank"), solution="01_2.py", expected=adamw_state_bytes,
              byte_count=True,
              wrong={337_952: N_("that is the parameters' bytes once: AdamW keeps two moments per parameter"),
                     675_904: N_("close: AdamW also keeps one step counter per parameter tensor (4 bytes each)"),
                     337_964: N_("DDP does not shard the optimizer state: every rank holds all of it")},
              hints=(N_("Section 5 counted it: the optimizer state is the same on every rank under DDP. Count "
                        "ddp_train.py's parameters at its default sizes (64 -> 256 -> 256 -> 8, with biases)."),
                     N_("AdamW keeps exp_avg and exp_avg_sq (fp32, 4 bytes per element each) and a 4-byte step "
                        "counter per parameter tensor: 2 x 4 x parameters + 4 x tensors."))))
register(Spec("01.3", N_("An unused head, fixed without find_unused_parameters"), solution="01_3_train.py",
              verify=UNUSED_HEAD_WITHOUT_THE_FLAG, withheld_fixes=(CauseId.UNUSED_PARAMETERS,),
              hints=(N_("Section 6: DDP waits for a gradient of every parameter before it all-reduces a bucket. Which "
                        "parameters never get one here?"),
                     N_("Make head b's output part of the loss with weight 0 (0.0 * b.sum()), or do not create a head "
                        "the loss does not use. Keep find_unused_parameters off."))))


# 01.4: a single-process training script ported to DDP by the learner, against the solution on the same seed and
# batch. Section 4's lesson at the level of a real script: every rank joins the group, wraps the model, trains on its
# own share of each global batch (DistinctLosses: two ranks with the same loss trained on the same samples), and each
# optimizer step applies one process's gradient on the whole global batch (the solution's). Rounding alone: a gradient
# entry is a mean over at most 16 samples, split over the ranks otherwise than the solution's (strided or contiguous
# shares), plus the all-reduce's addition and division; the later steps' weights carry the earlier steps' roundings:
# 3 steps x (16 + 3) terms.
BATCHES_14, STEPS_14 = (8, 12, 16), 3
PORTED_TO_DDP = ObservedCheck(
    properties=(Distributed("DDP"), SameSteps(), DistinctLosses(),
                SameTensors("grad", terms=STEPS_14 * (max(BATCHES_14) + 3), note=N_(
                    "the gradient this rank's optimizer applied is {ratio:.3g} times the solution's: one process's "
                    "on the step's whole global batch of --batch samples. The ranks' shares are not that batch split "
                    "in equal parts (other samples, or shares of another size), or the loss was scaled"))),
    variants=Variants({"--batch": BATCHES_14}))

register(Spec("01.4", N_("A single-process script ported to DDP"), solution="01_4_train.py", verify=PORTED_TO_DDP,
              hints=(N_("Section 4 set up what each rank needs before it trains: a process group (torchrun gives each "
                        "process its rank and the world size), the model wrapped, and its own part of every global "
                        "batch of --batch samples. Then: what must stay as one process had it (each step's gradient), "
                        "and which rank speaks for the run?"),
                     N_("dist.init_process_group(\"gloo\"); wrap the model in DistributedDataParallel; give the "
                        "DataLoader a DistributedSampler(train, shuffle=False) and batch_size=args.batch // "
                        "world_size (or keep the loader and take xb[rank::world_size]); print on rank 0; "
                        "dist.destroy_process_group() at the end."))))
