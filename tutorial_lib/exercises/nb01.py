"""Notebook 01's exercises (DDP): gradients equal to one process's, the optimizer state DDP replicates, an unused
head fixed without ``find_unused_parameters``."""

from __future__ import annotations

import torch

from ..i18n import N_, Message
from ..notebook.script_source import import_script
from .core import Context, Difference, Spec, register


def gradients_equal_one_process(ctx: Context) -> list[Difference]:
    """01.1: the learner's script on 2 ranks and on 1 (the whole batch): the gradients after one backward agree."""
    pair, differences = ctx.per_rank(ctx.launch(nproc_per_node=2), 2)
    single, missing = ctx.per_rank(ctx.launch(nproc_per_node=1), 1)
    differences += missing
    if differences:
        return differences
    reference = torch.tensor(single[0]["grad"])
    scale = reference.abs().max().item()
    for rank, record in sorted(pair.items()):
        grad = torch.tensor(record["grad"])
        if grad.shape != reference.shape:
            differences.append(Difference(Message("gradient entries"), reference.numel(), grad.numel(), rank))
            continue
        gap = (grad - reference).abs().max().item()
        if gap > 1e-6 * max(scale, 1.0):
            ratio = (grad.norm() / reference.norm()).item()
            differences.append(Difference(
                Message("largest |gradient - one process's gradient|"), "<= 1e-06", gap, rank,
                note=Message("this rank's gradient is {ratio:.3g} times one process's", {"ratio": ratio})))
    return differences


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


def unused_head_without_the_flag(ctx: Context) -> list[Difference]:
    """01.3: the two-head script trains its 5 steps on 2 ranks, with ``find_unused_parameters`` off."""
    records = ctx.records(ctx.launch(nproc_per_node=2))
    differences = []
    for rank in range(2):
        steps = [r.get("step") for r in records.get(rank, [])]
        if steps != [1, 2, 3, 4, 5]:
            differences.append(Difference(Message("steps trained"), [1, 2, 3, 4, 5], steps, rank))
        flags = {r.get("find_unused") for r in records.get(rank, [])}
        if True in flags:
            differences.append(Difference(Message("DDP's find_unused_parameters setting"), False, True, rank, note=Message(
                "the flag works, but costs one more all_reduce every step: make every parameter get a gradient")))
    return differences


register(Spec("01.1", N_("DDP gradients equal to one process's"), solution="01_1_train.py",
              verify=gradients_equal_one_process,
              hints=(N_("Run it in your head with world_size 1 and 2: which line changes the gradient when the world "
                        "grows? What does DDP already do to the gradients in backward()?"),
                     N_("DDP averages the ranks' gradients (it divides their sum by world_size). The mean of the ranks' "
                        "mean losses is already the mean over the whole batch: the loss needs no scaling at all."))))
register(Spec("01.2", N_("The bytes of AdamW's state on each rank"), solution="01_2.py", expected=adamw_state_bytes,
              wrong={337_952: N_("that is the parameters' bytes once: AdamW keeps two moments per parameter"),
                     675_904: N_("close: AdamW also keeps one step counter per parameter tensor (4 bytes each)"),
                     337_964: N_("DDP does not shard the optimizer state: every rank holds all of it")},
              hints=(N_("Section 5 counted it: the optimizer state is the same on every rank under DDP. Count "
                        "ddp_train.py's parameters at its default sizes (64 -> 256 -> 256 -> 8, with biases)."),
                     N_("AdamW keeps exp_avg and exp_avg_sq (fp32, 4 bytes per element each) and a 4-byte step "
                        "counter per parameter tensor: 2 x 4 x parameters + 4 x tensors."))))
register(Spec("01.3", N_("An unused head, fixed without find_unused_parameters"), solution="01_3_train.py",
              verify=unused_head_without_the_flag,
              hints=(N_("Section 6: DDP waits for a gradient of every parameter before it all-reduces a bucket. Which "
                        "parameters never get one here?"),
                     N_("Make head b's output part of the loss with weight 0 (0.0 * b.sum()), or do not create a head "
                        "the loss does not use. Keep find_unused_parameters off."))))
