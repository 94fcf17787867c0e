"""Notebook 08's exercises (performance): the bytes DDP all-reduces per step, the buckets a cap makes, and a bucket
size that loses the overlap of communication with backward (checked on the order of events, never on durations)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..i18n import N_, Message
from ..notebook.script_source import import_script
from .core import Context, Difference, Spec, register

PROFILED = ["--input-dim", "1024", "--hidden-dim", "1024"]  # section 1's model on CPU (output 8, the default)


def _profiled_model() -> torch.nn.Module:
    lesson = import_script("ddp_train")
    args = lesson.parse_args(PROFILED)
    return lesson.MLP(args.input_dim, args.hidden_dim, args.output_dim)


def allreduced_bytes(ctx: Context) -> int:
    """08.1: the bytes each rank all-reduces per step in section 2's sweep: one fp32 gradient per parameter."""
    return sum(p.numel() * p.element_size() for p in _profiled_model().parameters())


def buckets_at_8_mib(ctx: Context) -> int:
    """08.2: the gradient buckets (all-reduces per step) of the profiled model with ``bucket_cap_mb=8``, by DDP's own
    assignment (whole tensors in backward's order, a bucket closed once it reaches its cap)."""
    params = list(reversed(list(_profiled_model().parameters())))
    buckets, _limits = dist._compute_bucket_assignment_by_size(params, [8 * 2**20], [False] * len(params))
    return len(buckets)


def overlap_kept(ctx: Context) -> list[Difference]:
    """08.3: on every rank and step, at least 2 buckets, every gradient all-reduced once, and the first bucket's
    all-reduce issued before the input layer's gradient was computed (the order of events, not their durations)."""
    records = ctx.records(ctx.launch(nproc_per_node=2))
    differences = []
    for rank in range(2):
        mine = records.get(rank, [])
        steps = [r.get("step") for r in mine]
        if steps != [1, 2, 3]:
            differences.append(Difference(Message("steps trained"), [1, 2, 3], steps, rank))
            continue
        for record in mine[1:]:  # step 1 is DDP's first; it rebuilds its buckets after it
            found = _step_differences(record, rank)
            differences += found
            if found:
                break  # the first step that differs says it; later steps repeat it
    return differences


def _step_differences(record: dict, rank: int) -> list[Difference]:
    """One step's record: every gradient all-reduced once, at least 2 buckets, the first before the input layer's
    gradient."""
    differences = []
    pairs = [e for e in record.get("events") or [] if isinstance(e, list) and len(e) == 2]
    events = [e[0] for e in pairs]
    sizes = [e[1] for e in pairs if e[0] == "all_reduce"]
    if sum(sizes) != record.get("params"):
        differences.append(Difference(
            Message("gradient elements all-reduced in step {step}", {"step": record["step"]}),
            record.get("params"), sum(sizes), rank,
            note=Message("every parameter's gradient must be all-reduced once per step")))
    if len(sizes) < 2:
        differences.append(Difference(
            Message("all-reduces (buckets) in step {step}", {"step": record["step"]}), ">= 2", len(sizes),
            rank, note=Message("one bucket is all-reduced only when its last gradient is ready: after the "
                               "whole backward, with nothing left to overlap")))
    if "input_layer_grad" not in events:
        differences.append(Difference(
            Message("the input layer's gradient event in step {step}", {"step": record["step"]}), 1, 0, rank))
    elif sizes and events.index("all_reduce") > events.index("input_layer_grad"):
        differences.append(Difference(
            Message("events of step {step}, in order", {"step": record["step"]}),
            "all_reduce before input_layer_grad", " -> ".join(events), rank,
            note=Message("the first all-reduce must start while backward still computes the input layer's "
                         "gradient: that is the overlap")))
    return differences


register(Spec("08.1", N_("The bytes each rank all-reduces per step"), solution="08_1.py", expected=allreduced_bytes,
              wrong={2_107_400: N_("that is the number of parameters: each fp32 gradient element is 4 bytes"),
                     8_429_600 * 256: N_("the bytes do not grow with the batch: one gradient per parameter, "
                                         "whatever the batch size"),
                     8_429_600 * 2: N_("that is both ranks together: each rank all-reduces its own copy of every "
                                       "gradient")},
              hints=(N_("Section 2 asserted it: the same bytes at every batch size. Count the MLP's parameters at "
                        "--input-dim 1024 --hidden-dim 1024 (output 8): three Linear layers with biases."),
                     N_("Every parameter has one fp32 gradient (4 bytes per element) and DDP all-reduces each once "
                        "per step: 4 x parameters."))))
register(Spec("08.2", N_("How many buckets with bucket_cap_mb=8"), solution="08_2.py", expected=buckets_at_8_mib,
              wrong={2: N_("the gradients add up to 8.04 MiB, but a bucket holds whole tensors and is closed only "
                           "once it reaches its cap: the last tensor still joins it"),
                     6: N_("a bucket holds many gradients: DDP does not all-reduce each tensor on its own")},
              hints=(N_("Section 1 derived the buckets: gradients in backward's order (the output layer's first), "
                        "whole tensors, a bucket closed once it reaches its cap. With an explicit bucket_cap_mb every "
                        "bucket, the first included, has that cap."),
                     N_("Add the gradients' bytes in backward's order: output layer (32,800), hidden bias (4,096), "
                        "hidden weight (4 MiB), input bias (4,096), input weight (4 MiB). When does the sum first "
                        "reach 8 MiB = 8,388,608 bytes?"))))
register(Spec("08.3", N_("A bucket size that loses the overlap"), solution="08_3_train.py", verify=overlap_kept,
              hints=(N_("Read the events the script prints for a step: when is the only all-reduce issued, before or "
                        "after the input layer's gradient? Which argument decides how many buckets there are?"),
                     N_("bucket_cap_mb=100 puts all 2 MiB of gradients in one bucket. Leave DDP's default (the first "
                        "bucket 1 MiB) or pass a cap below the model's gradients, e.g. bucket_cap_mb=1."))))
