"""Notebook 14's exercises (torch.compile across ranks): predict DDP's all-reduces under compile, find the rank, line
and cause of a compiled job that fails on one rank, and an open challenge, the fewest graphs without a graph break.

Every program compiles with ``aot_eager`` (the graphs inductor would get, compiled in a fraction of its time) and small
models: a check costs a few seconds on 2 CPU cores; 14.3's baseline, which compiles a graph per sequence length, is
the longest (about 15 s) and is kept, so it runs once."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..diagnosis.causes import CauseId
from ..i18n import N_, Message
from .bugs import FindTheBug
from .challenges import Bound, Challenge, CompiledGraphs, FinalLoss, GraphBreaks
from .core import Spec, register
from .observing import Variants
from .properties import Distributed, SameSteps
from .predicting import Prediction, Quantity


def buckets_explained(options: Mapping[str, str], measured: int) -> Message:
    """14.1: why DDP all-reduced ``measured`` buckets, from the variant's flags."""
    blocks, cap = int(options["--blocks"]), float(options["--bucket-cap-mb"])
    return Message("walking the {blocks} blocks (one 1 MiB weight each) from the last, a bucket closes once it holds "
                   "at least bucket_cap_mb = {cap:g} MiB: ceil({blocks} / {cap:g}) = {rule} buckets, and DDP "
                   "all-reduces each once per step (it rebuilt them after the first step: {measured} measured). "
                   "optimize_ddp={ddp} decides where dynamo cuts the compiled graph (at the buckets, or nowhere), and "
                   "so whether the all-reduces can start while backward runs; it does not change what DDP sends",
                   {"blocks": blocks, "cap": cap, "rule": math.ceil(blocks / cap), "measured": measured,
                    "ddp": options["--optimize-ddp"]})


ALL_REDUCES_UNDER_COMPILE = Prediction(
    program="14_1_buckets.py",
    quantity=Quantity("count", "all_reduce", rank=0, step=-1, name=N_("all-reduces")),
    variants=Variants({"--blocks": (3, 4, 5, 6), "--bucket-cap-mb": (1, 2, 3), "--optimize-ddp": ("on", "off")},
                      seed=False),
    explain=buckets_explained)

# 14.2: one rank breaks the graph (a print inside forward, under fullgraph=True) or needs more graphs than the
# recompile limit (a new length every step, dynamic=False); the data seed decides which rank and which.
COMPILED_JOB = FindTheBug(
    program="14_2_job.py",
    causes=(CauseId.COMPILE_GRAPH_BREAK, CauseId.COMPILE_RECOMPILE_LIMIT, CauseId.COMPILE_BUCKET_SPLIT,
            CauseId.COMPILE_NO_CXX, CauseId.COLLECTIVE_TIMEOUT, CauseId.PYTHON_EXCEPTION),
    variants=Variants(seed=True))

# 14.3: the loss of a compiled model equals eager's (aot_eager runs eager's kernels): 0.1% leaves room for another
# order of the same sums (a padded, masked mean), never for a change in what is trained.
FEWEST_GRAPHS = Challenge(
    baseline="14_3_train.py",
    target=Bound(CompiledGraphs(), at_most=2, note=N_(
        "every graph is compiled before the step that needs it can run: a rank that compiles a new graph for a new "
        "length spends that step compiling, and the others wait for it in the next all-reduce")),
    conditions=(Bound(GraphBreaks(), at_most=0, note=N_(
                    "a graph break splits the forward in two graphs with Python between them: each length compiles "
                    "both, and the code between runs eagerly")),
                Bound(CompiledGraphs(), at_least=1, note=N_("nothing was compiled: the challenge is a compiled step")),
                Bound(FinalLoss(last=3), within=0.001, note=N_(
                    "the model trained differently: the loss is not the baseline's"))),
    guards=(Distributed("DDP"), SameSteps()),
    variants=Variants({"--seed": (1, 2, 3)}, seed=False))


register(Spec("14.1", N_("Predict DDP's all-reduces under torch.compile"), solution="14_1.py",
              verify=ALL_REDUCES_UNDER_COMPILE,
              hints=(N_("Section 2's rule: walking the blocks from the last, a bucket closes once it holds at least "
                        "bucket_cap_mb. Does compiling the model, or optimize_ddp, change DDP's buckets?"),
                     N_("Each block is one 1 MiB weight: ceil(blocks / bucket_cap_mb) all-reduces per step once DDP "
                        "rebuilt its buckets, with optimize_ddp on or off: it decides where dynamo cuts the graph, not "
                        "what DDP sends."))))
register(Spec("14.2", N_("Find the rank, the line and the cause of a failed compiled job"), solution="14_2.py",
              verify=COMPILED_JOB, script_name="job.py", limit_s=120,
              hints=(N_("Which rank's traceback is dynamo's own error, and which rank only lost its peer? Read that "
                        "error's name: what did dynamo refuse to do?"),
                     N_("Under fullgraph=True a graph break raises Unsupported, and dynamo's 'from user code:' frame "
                        "names the line that broke the graph; past the recompile limit, FailOnRecompileLimitHit is "
                        "raised at the call that needed one more graph. The causes: compile graph break, compile "
                        "recompile limit."))))
register(Spec("14.3", N_("At most 2 graphs per rank, no graph break (open challenge)"), solution="14_3_train.py",
              verify=FEWEST_GRAPHS,
              hints=(N_("Section 6: .item() breaks the graph, and with dynamic=False every new length compiles new "
                        "graphs. Count them: torch._dynamo.explain, or TORCH_LOGS=graph_breaks,recompiles."),
                     N_("Keep .item() out of the compiled forward (keep a tensor, read it outside), and let one graph "
                        "serve every length: dynamic=True (or torch._dynamo.mark_dynamic), or pad every batch to one "
                        "length with a mask."))))
