"""Notebook 08's exercises (performance): the bytes DDP all-reduces per step, the buckets a cap makes, a bucket size
that loses the overlap of communication with backward, and an open challenge, buckets designed for a model's layers
(checked on the buckets each backward() all-reduced, never on durations)."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..i18n import N_, Message
from ..notebook.script_source import import_script
from ..runs.observed import ObservedRank
from .challenges import Bound, Challenge, FinalLoss, Measure, SameOnEveryRank
from .core import Context, Difference, Spec, register
from .observing import ObservedCheck, Property, Variants
from .properties import FLOATING, Buckets, Distributed, SameSteps
from .rounds import PROGRAMS

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


# 08.3: the order of events, never their durations (section 1). From the second backward() on (DDP rebuilds its
# buckets in backward's order after the first), each of the 3 steps all-reduces its gradients in at least 2 buckets,
# every gradient element once, as the buckets DDP logged: the first bucket (the output and hidden layers') is then
# all-reduced while backward still computes the input layer's gradient, which one bucket of everything waits for. No
# reference run: this holds for every cap that makes 2 buckets or more (DDP's default, 1 MiB, 0.5 MiB), and the
# variant's seed and batch change nothing of it.
OVERLAP_KEPT = ObservedCheck(
    properties=(Distributed("DDP"), SameSteps(3),
                Buckets(first=2, at_least=2, note=N_(
                    "a single all-reduce in this backward() carried every gradient: DDP all-reduces a bucket once its "
                    "last gradient is ready, so it waited for the input layer's, the last one backward computes, and "
                    "communication overlapped none of the computation"))),
    variants=Variants({"--batch": (16, 32, 48)}), reference=False)


register(Spec("08.1", N_("The bytes each rank all-reduces per step"), solution="08_1.py", expected=allreduced_bytes,
              byte_count=True,
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
register(Spec("08.3", N_("A bucket size that loses the overlap"), solution="08_3_train.py", verify=OVERLAP_KEPT,
              hints=(N_("Read the events the script prints for a step: when is the only all-reduce issued, before or "
                        "after the input layer's gradient? Which argument decides how many buckets there are?"),
                     N_("bucket_cap_mb=100 puts all 2 MiB of gradients in one bucket. Leave DDP's default (the first "
                        "bucket 1 MiB) or pass a cap below the model's gradients, e.g. bucket_cap_mb=1."))))


# 08.4, an open challenge (issue 44): the overlap of section 1 as a number, from what each backward() all-reduced
# (never from durations). A layer's weight and bias gradients are ready together, once backward has computed that
# layer; an all-reduce can start once the layer holding its last byte is ready. On a wire that all-reduces a byte as
# fast as backward computes one (the balanced case, where bucketing decides), the all-reduces queue one after another,
# and what is left when backward ends is, for buckets of whole layers in backward's order, the largest bucket: a large
# first bucket delays every later one, a large last one is sent after backward. The count of all-reduces per
# backward() bounds the other side: every message pays a fixed start-up cost on a real network.
def layer_bytes(program: Path) -> tuple[int, ...]:
    """The fp32 gradient bytes of each ``Linear(in, out)`` layer (weight and bias) that ``program`` builds, in
    backward's order (its last layer first), read from its source: the layers the measure below assumes.

    Raises:
        ValueError: a ``Linear`` call whose first two arguments are not integer literals.
    """
    calls = [node for node in ast.walk(ast.parse(program.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "Linear"]
    sizes = []
    for call in sorted(calls, key=lambda node: (node.lineno, node.col_offset)):
        try:
            n_in, n_out = (ast.literal_eval(arg) for arg in call.args[:2])
        except ValueError:  # a name, an expression, or fewer than two arguments
            n_in = n_out = None
        if not (isinstance(n_in, int) and isinstance(n_out, int)):
            raise ValueError(f"{program.name}:{call.lineno}: a Linear layer whose widths are not two integer literals "
                             f"({ast.get_source_segment(program.read_text(), call)})")
        sizes.append((n_in * n_out + n_out) * torch.finfo(torch.float32).bits // 8)
    return tuple(reversed(sizes))


def left_after_backward(sent: Sequence[int], layers: Sequence[int]) -> tuple[int, list[int]]:
    """``(bytes left to all-reduce when backward ends, [when each all-reduce could start])``, in bytes of gradients
    backward had computed by then, on a wire that all-reduces a byte as fast as backward computes one.

    Args:
        sent: the bytes of each gradient all-reduce of one backward(), in the order they were issued (each carries the
            gradients that follow the previous one's, in backward's order, as DDP's buckets do).
        layers: each layer's gradient bytes in backward's order (``layer_bytes``); backward computes them in turn, one
            byte per unit of time, and a layer's gradients are ready together.
    """
    total, ready = sum(layers), list(itertools.accumulate(layers))
    starts, carried, wire = [], 0, 0
    for size in sent:
        carried += size
        starts.append(next((r for r in ready if r >= carried), total))  # the layer holding its last byte is ready
        wire = max(wire, starts[-1]) + size  # the wire takes one all-reduce at a time, in the order they came
    return max(wire - total, 0), starts


def gradient_all_reduces(observed: ObservedRank, backward: int) -> list:
    """The floating-point all-reduces issued inside ``backward()`` call ``backward`` (DDP's buckets, or a hook's),
    in order; not DDP's int32 flags of unused parameters."""
    return [c for c in observed.collectives_of("all_reduce", backward=backward) if c.dtype in FLOATING]


def _listed(numbers: Sequence[int], between: str) -> str:
    """``1,847,328 + 560,128`` (``between`` " + "): a backward()'s all-reduces, or where each could start, in the
    order issued, with the thousands separators the verdict's other bytes have."""
    return between.join(format(n, ",") for n in numbers)


@dataclass(frozen=True)
class LeftAfterBackward(Measure):
    """08.4's target: the gradient bytes still to all-reduce when backward() ends (``left_after_backward``), the most
    of any rank over its backward() calls from ``first`` on (DDP rebuilds its buckets in backward's order after the
    first); ``layers`` in backward's order (``layer_bytes``)."""

    layers: tuple[int, ...] = ()
    first: int = 2
    name: str = N_("gradient bytes left to all-reduce when backward() ends, from backward() 2 (the most of any rank)")
    bytes: bool = True

    def _each(self, run) -> list[tuple[int, int, list[int], int, list[int]]]:
        out = []
        for observed in run:
            for b in observed.backwards:
                if b.index >= self.first:
                    sent = [c.input_bytes for c in gradient_all_reduces(observed, b.index)]
                    left, starts = left_after_backward(sent, self.layers)
                    out.append((left, observed.rank, sent, b.index, starts))
        return out

    def of(self, run):
        return max((left for left, *_ in self._each(run)), default=None)

    def detail(self, run):
        each = self._each(run)
        if not each:
            return None
        left, rank, sent, index, starts = max(each, key=lambda e: e[0])
        if not sent:
            return Message("yours on rank {rank}, backward() {index}: no gradient all-reduce inside it",
                           {"rank": rank, "index": index})
        return Message("yours on rank {rank}, backward() {index}: all-reduces of {sent} bytes, each able to start once "
                       "backward had computed {starts} of its {total} bytes of gradients; {left} bytes were left to "
                       "send when it ended", {"rank": rank, "index": index, "sent": _listed(sent, " + "),
                                              "starts": "[" + _listed(starts, "; ") + "]",
                                              "total": format(sum(self.layers), ","), "left": format(left, ",")})


@dataclass(frozen=True)
class AllReducesPerBackward(Measure):
    """08.4's condition: the gradient all-reduces one backward() issued, the most of any rank over its backward()
    calls from ``first`` on."""

    first: int = 2
    name: str = N_("gradient all-reduces per backward(), from backward() 2 (the most of any rank)")

    def of(self, run):
        return max((len(gradient_all_reduces(o, b.index)) for o in run for b in o.backwards if b.index >= self.first),
                   default=None)


@dataclass(frozen=True)
class EveryGradientOnce(Property):
    """08.4's guard: every backward() of every rank all-reduced each of the model's ``elements`` gradient elements
    once, in float32, inside backward() (where communication can overlap computation). The first backward() that
    does not is said, per rank."""

    elements: int = 0

    def check(self, mine, reference, variant):
        out = []
        for observed in mine:
            for b in observed.backwards:
                reduces = gradient_all_reduces(observed, b.index)
                dtypes = sorted({c.dtype for c in reduces})
                sent = sum(c.input_bytes // getattr(torch, c.dtype).itemsize for c in reduces)
                what = Message("gradient elements all-reduced in backward() {index}, and their dtype", {
                    "index": b.index})
                if dtypes not in ([], ["float32"]):
                    note = Message("the gradients crossed the wire in {dtypes}: the challenge is when float32 "
                                   "gradients cross it, not how few bytes they take (notebook 10 compresses them)",
                                   {"dtypes": ", ".join(dtypes)})
                elif sent == 0:
                    note = Message("this backward() all-reduced no gradient: whatever averaged them over the ranks "
                                   "ran after it, with no computation left to overlap")
                elif sent != self.elements:
                    note = Message("{sent} gradient elements all-reduced for the model's {elements}: some gradients "
                                   "were not averaged over the ranks in this backward(), or were averaged more than "
                                   "once", {"sent": sent, "elements": self.elements})
                else:
                    continue
                out.append(Difference(what, f"{self.elements}, float32", f"{sent}, {', '.join(dtypes) or '-'}",
                                      observed.rank, note=note))
                break
        return out


LAYERS_84 = layer_bytes(PROGRAMS / "08_4_train.py")
# The target, at most 0.6 x the baseline's 1,847,328 bytes left: only buckets that give the 1 MiB layer (1,050,624
# bytes, the least any bucketing of whole layers leaves) a bucket of its own reach it. At most 4 all-reduces per
# backward(): a bucket per layer (6) or per tensor (12) leaves as little, each message paying its start-up. The loss is
# the baseline's: buckets change when the gradients cross the wire, not their values (an average over 2 ranks is exact
# in fp32, summed then halved or halved then summed), so 0.001% leaves room for nothing but another order of sums.
BUCKETS_BY_DESIGN = Challenge(
    baseline="08_4_train.py",
    target=Bound(LeftAfterBackward(LAYERS_84), ratio=0.6, note=N_(
        "a bucket is all-reduced once its last gradient is ready and then takes the wire as long as backward took to "
        "compute it: for buckets of whole layers in backward's order, what is left when backward ends is the "
        "largest bucket")),
    conditions=(Bound(AllReducesPerBackward(), at_most=4, note=N_(
                    "every all-reduce pays a fixed start-up cost on a real network (its latency): this many per "
                    "backward() spend more on starting messages than the overlap saves")),
                Bound(FinalLoss(last=3), within=1e-5, note=N_(
                    "the loss is not the baseline's: when the gradients cross the wire changes nothing of their "
                    "values, so this run trained something else"))),
    guards=(Distributed(), SameSteps(note=N_("the run took another number of optimizer steps than the baseline's: "
                                             "the same training is the challenge")),
            EveryGradientOnce(elements=sum(LAYERS_84) // 4), SameOnEveryRank()),
    variants=Variants({"--seed": (1, 2, 3)}, seed=False))

register(Spec("08.4", N_("Buckets for a model's layers: less left after backward (open challenge)"),
              solution="08_4_train.py", verify=BUCKETS_BY_DESIGN,
              hints=(N_("Section 1: DDP fills a bucket with whole gradients in backward's order and all-reduces it "
                        "once its last gradient is ready. List the layers' gradient bytes from the output back, and "
                        "find which bucket the 1 MiB layer lands in, and with what."),
                     N_("Give the 1 MiB layer a bucket of its own in at most 4: a bucket_cap_mb that closes a bucket "
                        "before it and one right after it, or the layers in two DDP modules, or all-reduces you "
                        "issue yourself from register_post_accumulate_grad_hook, a group of layers at a time."))))
