"""torch.compile across ranks: which wrapping compiles, how DDP cuts the graph, when its all-reduces start, what breaks.

Run card
    python compile_train.py --max-steps 2                                   # one process, a world of one
    torchrun --nproc-per-node 2 compile_train.py --compile-form compile-then-ddp     # DDP(torch.compile(model)): compiles
    torchrun --nproc-per-node 2 compile_train.py --compile-form ddp-then-compile     # torch.compile(DDP(model))
    torchrun --nproc-per-node 2 compile_train.py --compile-form per-block            # each block compiled, then DDP
    torchrun --nproc-per-node 2 compile_train.py --strategy fsdp2 --compile-form per-block  # each block, then fully_shard
    torchrun --nproc-per-node 2 compile_train.py --no-optimize-ddp           # one graph, no split at DDP's buckets
    torchrun --nproc-per-node 2 compile_train.py --graph-break item --fullgraph          # fails: a graph break
    torchrun --nproc-per-node 2 compile_train.py --vary-seq --no-dynamic --fullgraph    # fails: recompile limit
    torchrun --nproc-per-node 2 compile_train.py --rank-shape-step 3         # rank 1 alone recompiles at step 3

What it shows
    * the order: DDP wraps the compiled model (``DDP(torch.compile(model))``), or each block is compiled and then
      wrapped (torchtitan's order for FSDP2); the number of graphs each form compiles is counted by a backend
      that wraps the real one (``--compile-backend``: aot_eager traces forward and backward and runs them eagerly;
      inductor generates kernels and needs a C++ compiler on CPU);
    * DDP + compile: dynamo's DDPOptimizer cuts the graph where DDP's gradient buckets end, so each bucket's
      all-reduce can start while the rest of backward runs; ``torch._dynamo.config.optimize_ddp = False`` keeps
      one graph, whose backward produces every gradient at once: the all-reduces start only after it;
    * graph breaks (a print or ``.item()`` in forward) and recompilations (a sequence length that changes) are
      counted per step; ``fullgraph=True`` turns a break into an error, a recompile limit into another;
    * a rank whose input shape differs recompiles alone while the others wait for it in the next all-reduce.

Each rank writes its steps (one row per form and step: graphs, events) to ``<metrics-dir>/compile_rank<RANK>.json``
at the end. Only torch and the standard library.
"""

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

FORMS = ["eager", "compile-then-ddp", "ddp-then-compile", "per-block"]
EVENTS = []  # (what, time.perf_counter()) of this step: backward graphs run, all-reduces started
GRAPHS = []  # one entry per graph the backend compiled (a recompile or a DDP split adds one)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp", help="ddp: replicas; fsdp2: fully_shard")
    p.add_argument("--compile-form", choices=FORMS, nargs="+", default=["compile-then-ddp"],
                   help="how compile and the wrapper are combined (per-block: each block compiled, then wrapped); "
                        "several: each in turn, from scratch")
    p.add_argument("--compile-backend", type=str, default="aot_eager",
                   help="torch.compile's backend: aot_eager (graphs only, quick) or inductor (kernels; a C++ compiler)")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl on cuda, gloo on cpu (gloo also moves cuda tensors: "
                        "tl.run_in_process uses it so no NCCL runs inside a notebook's kernel)")
    p.add_argument("--n-layers", type=int, default=8, help="blocks of Linear + ReLU (count)")
    p.add_argument("--dim", type=int, default=256, help="features per token (count)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per rank per step (count)")
    p.add_argument("--seq-len", type=int, default=8, help="tokens per sample (count)")
    p.add_argument("--max-steps", type=int, default=4, help="optimizer steps (count)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="ddp: gradient bucket size (MiB)")
    p.add_argument("--no-optimize-ddp", action="store_true",
                   help="ddp: torch._dynamo.config.optimize_ddp = False (one graph, no split at buckets)")
    p.add_argument("--fullgraph", action="store_true", help="torch.compile(fullgraph=True): a graph break raises")
    p.add_argument("--graph-break", choices=["none", "print", "item"], default="none",
                   help="put a graph break in the first block's forward: a print() or a tensor's .item()")
    p.add_argument("--vary-seq", action="store_true", help="sequence length seq_len + step - 1: a new shape per step")
    p.add_argument("--no-dynamic", action="store_true",
                   help="torch.compile(dynamic=False): every new shape compiles a new graph (no dynamic shapes)")
    p.add_argument("--recompile-limit", type=int, default=8,
                   help="torch._dynamo.config.recompile_limit: graphs kept per function before dynamo gives up")
    p.add_argument("--rank-shape-step", type=int, default=0,
                   help="at this step rank 1's sequence is one token longer: it alone recompiles (0: never)")
    p.add_argument("--pg-timeout-s", type=float, default=60.0, help="collective timeout (seconds)")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for compile_rank<RANK>.jsonl (created)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    args = p.parse_args(argv)
    for name in ("n_layers", "dim", "batch_size", "seq_len", "max_steps", "recompile_limit"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if not args.bucket_cap_mb > 0 or not args.pg_timeout_s > 0:
        p.error(f"--bucket-cap-mb and --pg-timeout-s must be > 0, got {args.bucket_cap_mb} and {args.pg_timeout_s}")
    if args.strategy == "fsdp2" and set(args.compile_form) - {"per-block", "eager"}:
        p.error(f"--strategy fsdp2 takes --compile-form per-block or eager, got --compile-form {args.compile_form}")
    return args


class Block(nn.Module):
    def __init__(self, width, graph_break="none"):
        super().__init__()
        self.linear, self.graph_break = nn.Linear(width, width, bias=False), graph_break  # one tensor per block

    def forward(self, x):
        if self.graph_break == "print":
            print("block input norm computed")  # Python I/O: dynamo stops the graph here and resumes after it
        elif self.graph_break == "item":
            x = x / (1 + x.abs().max().item())  # a Python float from a tensor: the graph breaks to compute it
        return torch.relu(self.linear(x)) + x


class Model(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.blocks = nn.ModuleList(Block(args.dim, args.graph_break if i == 0 else "none")
                                    for i in range(args.n_layers))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x.square().mean()


def counting_backend(name):
    """The real backend, counted: every graph dynamo hands it (after DDP's split, after a recompile) adds to GRAPHS.
    With aot_eager, the backward graphs also record when they run (EVENTS), for the order of events."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.registry import lookup_backend

    def timed(kind):
        def compiler(gm, example_inputs):
            def run(args):
                EVENTS.append((f"{kind}_start", time.perf_counter()))
                out = gm(*args)
                EVENTS.append((f"{kind}_end", time.perf_counter()))
                return out
            run._boxed_call = True
            return run
        return compiler

    real = aot_autograd(fw_compiler=timed("forward"), bw_compiler=timed("backward")) if name == "aot_eager" \
        else lookup_backend(name)

    def backend(gm, example_inputs):
        GRAPHS.append(len([n for n in gm.graph.nodes if n.op == "call_function"]))
        return real(gm, example_inputs)
    return backend


def build(args, form, device):
    torch.manual_seed(args.seed)
    model = Model(args).to(device)
    torch._dynamo.config.recompile_limit = args.recompile_limit
    if args.no_optimize_ddp:
        torch._dynamo.config.optimize_ddp = False  # DDP's split at bucket boundaries off: one graph
    compile_kw = dict(backend=counting_backend(args.compile_backend), fullgraph=args.fullgraph,
                      dynamic=False if args.no_dynamic else None)
    if form == "per-block":
        for block in model.blocks:
            block.compile(**compile_kw)  # in place, before wrapping (torchtitan's order: compile, then shard)
    elif form == "compile-then-ddp":
        model.compile(**compile_kw)  # in place: DDP wraps the compiled model, and its state_dict keeps its names
    if args.strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    else:
        model = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
        model.register_comm_hook(None, timed_allreduce)  # records when each bucket's all-reduce starts
    if form == "ddp-then-compile":
        model = torch.compile(model, **compile_kw)
    return model


def timed_allreduce(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    EVENTS.append((f"allreduce_{bucket.index()}", time.perf_counter()))
    return allreduce_hook(state, bucket)


def sequence_length(args, rank, step):
    length = args.seq_len + (step - 1 if args.vary_seq else 0)
    return length + (1 if step == args.rank_shape_step and rank == 1 else 0)  # a shape only rank 1 sees


def train(args, rank, world_size, device):
    rows = []
    for form in args.compile_form:  # each form from scratch: dynamo's caches emptied, the same seed
        torch._dynamo.reset()
        GRAPHS.clear()
        model = build(args, form, device)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        for step in range(1, args.max_steps + 1):
            g = torch.Generator().manual_seed(args.seed * 1000 + step * 10 + rank)
            x = torch.randn(args.batch_size, sequence_length(args, rank, step), args.dim, generator=g).to(device)
            graphs_before, t0 = len(GRAPHS), time.perf_counter()
            EVENTS.clear()
            loss = model(x)
            EVENTS.append(("backward_call", time.perf_counter()))
            loss.backward()  # DDP all-reduces (FSDP reduce-scatters) the gradients here
            EVENTS.append(("backward_return", time.perf_counter()))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_global = loss.detach().clone()
            dist.all_reduce(loss_global)
            row = {"form": form, "step": step, "rank": rank, "world_size": world_size,
                   "loss_global": loss_global.item() / world_size, "step_time_s": time.perf_counter() - t0,
                   "graphs": len(GRAPHS), "graphs_compiled": len(GRAPHS) - graphs_before, "seq_len": x.shape[1],
                   "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
                   "events": [[what, t - t0] for what, t in EVENTS]}
            rows.append(row)
            sys.stdout.write(f"rank {rank} {form} step {step} loss_global {row['loss_global']:.5f} graphs "
                             f"{len(GRAPHS)} step_time_s {row['step_time_s']:.3f}\n")
        dist.barrier()
    path = Path(args.metrics_dir) / f"compile_rank{rank}.json"
    path.write_text(json.dumps({"rank": rank, "torch": torch.__version__, "rows": rows}))


@record
def main():
    args = parse_args()
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else \
        torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
    backend = ("nccl" if device.type == "cuda" else "gloo") if args.backend == "auto" else args.backend
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timedelta(seconds=args.pg_timeout_s))
    else:  # one process: a world of one over an in-memory store
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        train(args, rank, world_size, device)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
