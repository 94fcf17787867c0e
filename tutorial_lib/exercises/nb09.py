"""Notebook 09's exercises (FSDP in depth): the all-gathers of an accumulated step, the bytes a rank holds between
forward and backward with the default ``reshard_after_forward``, and accumulation with one reduce-scatter per unit."""

from __future__ import annotations

import torch

from ..i18n import N_, Message
from ..notebook.script_source import import_script
from .core import Context, Difference, Spec, register

UNITS_IN_THE_SCRIPT = 3  # 09.3's starter: fully_shard on two layers, then on the root


def _knobs_model(*argv: str) -> torch.nn.Module:
    lesson = import_script("fsdp_knobs")
    args = lesson.parse_args(list(argv))
    return lesson.Net(args.dim, args.n_layers), args


def accumulated_all_gathers(ctx: Context) -> int:
    """09.1: all-gathers per optimizer step of fsdp_knobs.py at --n-layers 5 with 4 micro-batches, the default
    reshard_after_forward, set_requires_gradient_sync(False) until the last: 2U - 1 per micro-batch."""
    model, args = _knobs_model("--n-layers", "5")
    units = len(model.blocks) + 1  # one unit per block, and the root (input layer and head)
    return args.grad_accum_steps * (2 * units - 1)


def held_after_forward(ctx: Context) -> int:
    """09.2: bytes of parameters rank 0 of 4 holds between forward and backward, the default reshard_after_forward,
    at notebook 09's MODEL (--dim 64 --n-layers 3): the root whole, every block's 1/4."""
    model, _args = _knobs_model("--dim", "64", "--n-layers", "3")
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    blocks = sum(p.numel() * p.element_size() for p in model.blocks.parameters())
    return (total - blocks) + blocks // 4


def one_reduce_scatter_per_unit(ctx: Context) -> list[Difference]:
    """09.3: on 2 ranks, one reduce-scatter per unit for the whole accumulated step, and the accumulated gradient
    equal to one process's on the whole batch (the script on 1 rank): each parameter's gradient norm, within 1e-5."""
    pair, differences = ctx.per_rank(ctx.launch(nproc_per_node=2), 2)
    single, missing = ctx.per_rank(ctx.launch(nproc_per_node=1), 1)
    differences += missing
    if 0 not in single:
        return differences
    reference = torch.tensor(single[0].get("grad_norms") or [], dtype=torch.float64)
    for rank, record in sorted(pair.items()):
        if record.get("reduce_scatters") != UNITS_IN_THE_SCRIPT:
            differences.append(Difference(
                Message("reduce-scatters in the accumulated step"), UNITS_IN_THE_SCRIPT, record.get("reduce_scatters"),
                rank, note=Message("FSDP reduce-scatters after every backward unless told not to: one per unit and "
                                   "micro-batch. Gradient sync off until the last micro-batch: one per unit")))
        norms = torch.tensor(record.get("grad_norms") or [], dtype=torch.float64)
        if norms.shape != reference.shape:
            differences.append(Difference(Message("gradients (one norm per parameter)"), reference.numel(),
                                          norms.numel(), rank))
            continue
        gap = ((norms - reference).abs() / reference.clamp_min(1e-12)).max().item()
        if gap > 1e-5:
            differences.append(Difference(
                Message("largest relative difference of a gradient's norm from one process's"), "<= 1e-05", gap, rank,
                note=Message("the accumulated gradient must still be the mean over every rank's samples: sync "
                             "must be back on for the last backward")))
    return differences


register(Spec("09.1", N_("All-gathers of an accumulated FSDP step"), solution="09_1.py",
              expected=accumulated_all_gathers,
              wrong={11: N_("that is one micro-batch: set_requires_gradient_sync(False) skips reduce-scatters, not "
                            "all-gathers; every micro-batch's forward and backward need the parameters"),
                     48: N_("the default keeps the root gathered from its forward to its backward: 2U - 1 per "
                            "micro-batch, not 2U"),
                     36: N_("count the root too: the input layer and the head are a unit of their own")},
              hints=(N_("Section 4's accumulation table: with K micro-batches the all-gathers are the same with and "
                        "without gradient sync. How many units does --n-layers 5 make?"),
                     N_("U = 5 blocks + the root = 6 units. The default reshard_after_forward gives 2U - 1 "
                        "all-gathers per forward and backward; a step has K = 4 (fsdp_knobs.py's default)."))))
register(Spec("09.2", N_("Bytes a rank holds between forward and backward"), solution="09_2.py",
              expected=held_after_forward,
              wrong={103_944: N_("that is reshard_after_forward=True, 1/N of everything: the default keeps the root "
                                 "gathered"),
                     415_776: N_("that is the whole model: reshard_after_forward=False"),
                     207_888: N_("that is an int 2 (1/2 of every unit); the default frees inner units to 1/N and "
                                 "keeps the root whole")},
              hints=(N_("Section 1: the default is True for the inner units (1/N held after their forward) and False "
                        "for the root (held whole until backward)."),
                     N_("fsdp_knobs.py at --dim 64 --n-layers 3: the root (inp 64 x 64 + 64, head 64 x 8 + 8) whole, "
                        "each block (64 -> 256 -> 64, with biases) 1/4; fp32, 4 bytes per element."))))
register(Spec("09.3", N_("Accumulation with one reduce-scatter per unit"), solution="09_3_train.py",
              verify=one_reduce_scatter_per_unit,
              hints=(N_("Section 4: by default FSDP reduce-scatters after every backward. Which FSDPModule method "
                        "is DDP's no_sync() for FSDP2?"),
                     N_("Before each backward call model.set_requires_gradient_sync(micro == K - 1): no sync until "
                        "the last micro-batch, whose backward reduce-scatters the accumulated sum once per unit."))))
