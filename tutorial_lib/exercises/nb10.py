"""Notebook 10's exercises (DDP in depth): the copies between ``.grad`` and the buckets with
``gradient_as_bucket_view``, the bytes a compression hook sends, and a hand-written bf16 hook that must average."""

from __future__ import annotations

import torch

from ..i18n import N_, Message
from ..notebook.script_source import import_script
from .core import Context, Difference, Spec, register


def _knobs_model(*argv: str) -> torch.nn.Module:
    lesson = import_script("ddp_knobs")
    args = lesson.parse_args(list(argv))
    return lesson.MLP(args.hidden_dim, args.n_layers)


def copies_with_bucket_view(ctx: Context) -> int:
    """10.1: tensors copied between ``.grad`` and the buckets in one backward, ``gradient_as_bucket_view=True`` and
    ``zero_grad()`` (``set_to_none=True``), ddp_knobs.py at --n-layers 10: one copy into a bucket per parameter tensor
    (the new ``.grad``), none back."""
    return len(list(_knobs_model("--n-layers", "10").parameters()))


def fp16_hook_bytes(ctx: Context) -> int:
    """10.2: bytes each rank all-reduces per step with ``fp16_compress_hook``, ddp_knobs.py at its defaults: every
    gradient element once, 2 bytes."""
    return sum(p.numel() * torch.finfo(torch.float16).bits // 8 for p in _knobs_model().parameters())


def hook_averages(ctx: Context) -> list[Difference]:
    """10.3: on 2 ranks, every gradient crosses the wire in 16 bits (half the fp32 bytes), and each gradient's norm
    equals one process's on the whole batch (the script on 1 rank) up to bf16 rounding (1%)."""
    pair, differences = ctx.per_rank(ctx.launch(nproc_per_node=2), 2)
    single, missing = ctx.per_rank(ctx.launch(nproc_per_node=1), 1)
    differences += missing
    if 0 not in single:
        return differences
    reference = torch.tensor(single[0].get("grad_norms") or [], dtype=torch.float64)
    for rank, record in sorted(pair.items()):
        wire = [w for w in record.get("wire") or [] if isinstance(w, list) and len(w) == 2]
        sent, fp32_bytes = sum(w[1] for w in wire), 4 * single[0].get("params", 0)
        if sent != fp32_bytes // 2 or any(w[0] not in ("torch.bfloat16", "torch.float16") for w in wire):
            differences.append(Difference(
                Message("bytes all-reduced in 16 bits per step"), fp32_bytes // 2, sent, rank,
                note=Message("a compression hook sends every gradient element once, in 2 bytes instead of 4")))
        norms = torch.tensor(record.get("grad_norms") or [], dtype=torch.float64)
        if norms.shape != reference.shape:
            differences.append(Difference(Message("gradients (one norm per parameter)"), reference.numel(),
                                          norms.numel(), rank))
            continue
        ratios = norms / reference.clamp_min(1e-12)
        gap = (ratios - 1).abs().max().item()
        if gap > 1e-2:
            ratio = (norms.norm() / reference.norm()).item()  # the whole gradient's
            differences.append(Difference(
                Message("largest relative difference of a gradient's norm from one process's"), "<= 0.01", gap, rank,
                note=Message("this rank's gradient is {ratio:.3g} times one process's: DDP expects the hook's "
                             "Future to hold the average of the ranks' buckets", {"ratio": ratio})))
    return differences


register(Spec("10.1", N_("Copies between .grad and the buckets"), solution="10_1.py", expected=copies_with_bucket_view,
              wrong={48: N_("that is without gradient_as_bucket_view: a copy into the bucket and one back, per "
                            "parameter tensor"),
                     0: N_("that is zero_grad(set_to_none=False): the views survive. With set_to_none=True each "
                           "backward makes a new .grad, copied into its bucket once"),
                     12: N_("count parameter tensors, not layers: every Linear has a weight and a bias")},
              hints=(N_("Section 2's table: with gradient_as_bucket_view=True and zero_grad()'s default, how many "
                        "copies into and out of the buckets per parameter tensor?"),
                     N_("One copy into a bucket per parameter tensor, none out. ddp_knobs.py at --n-layers 10 has an "
                        "input layer, 10 hidden layers and head_a, each a weight and a bias."))))
register(Spec("10.2", N_("The bytes fp16_compress_hook sends per step"), solution="10_2.py", expected=fp16_hook_bytes,
              wrong={1_843_204: N_("that is fp32 (or two ranks): the hook casts every bucket to 16 bits, 2 bytes per "
                                   "element, and each rank sends its own buckets once"),
                     460_801: N_("that is the number of gradient elements: each takes 2 bytes in fp16")},
              hints=(N_("Section 4: the same buckets as fp32, each cast to fp16 before its all-reduce. Count "
                        "ddp_knobs.py's parameters at its defaults (--hidden-dim 256 --n-layers 6, head_a only)."),
                     N_("An input layer and 6 hidden layers, each 256 x 256 + 256, and head_a 256 + 1: 2 bytes per "
                        "gradient element."))))
register(Spec("10.3", N_("A bf16 compression hook that averages"), solution="10_3_train.py", verify=hook_averages,
              hints=(N_("Compare the gradients of the 2 ranks with those of 1 rank: by which factor do they differ? "
                        "What does DDP's own all-reduce do after summing?"),
                     N_("dist.all_reduce sums. Divide by world_size before the all-reduce (torch's "
                        "fp16_compress_hook divides its 16-bit copy), or after it: the Future must hold the "
                        "average."))))
