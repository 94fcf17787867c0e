"""DDP's communication knobs, measured on every rank: bucket size, gradients as bucket views, static graph,
compression hooks, and a head that is computed but left out of the loss.

Run card
    torchrun --nproc-per-node 2 ddp_knobs.py                          # every lesson, in one launch
    torchrun --nproc-per-node 2 ddp_knobs.py --lessons comm_hook --max-steps 50
    python ddp_knobs.py --lessons buckets static_graph                # a world of one

What it shows (each variant builds the same model again, from the same seed, and trains it on the same batches)
    * buckets: ``DDP(model, bucket_cap_mb=...)``. DDP packs gradients into buckets and all-reduces each bucket as
      soon as all its gradients are ready; smaller buckets mean more, smaller all-reduces per step (more overlap
      with backward, more per-call latency). A bucket holds whole tensors. The default, ``bucket_cap_mb=None``, is
      25 MiB except for the first bucket (1 MiB): not the same buckets as an explicit 25.
    * bucket_view: ``gradient_as_bucket_view=True`` makes every ``param.grad`` a view into its bucket, so the
      gradients are not held twice (once in ``.grad``, once in the bucket); the training is the same. The copies
      are counted: without it each gradient is copied into its bucket and back; with it, after
      ``zero_grad(set_to_none=True)`` (the default) each new ``.grad`` is still copied in once (and then becomes the
      view), after ``zero_grad(set_to_none=False)`` backward accumulates straight into the bucket: no copy.
    * static_graph: ``static_graph=True`` tells DDP the set of used parameters and the graph do not change between
      iterations. In iteration 1 DDP then only records which gradient hooks fire and all-reduces every bucket after
      backward (a callback ``_DDPSink`` queues); later iterations are the same as without it, and so are the losses
      (bitwise on 2 ranks; on 3 or more, within float rounding: an element's 3+ gradients are added in an order
      that depends on where the buckets put it).
    * comm_hook: ``register_comm_hook`` replaces DDP's all-reduce of a bucket. ``fp16_compress_hook`` casts the
      bucket to fp16, all-reduces that and casts back: half the bytes per step, gradients rounded (the loss stays
      close, not equal). ``bf16_compress_hook`` does the same in bf16, but DDP accepts it only on a CUDA build of
      torch with NCCL 2.10+ (a CPU build refuses it); the hand-written ``bf16_hook`` below works anywhere.
    * unused_head: a second head whose output the forward returns but the loss leaves out gets no gradient.
      Plain DDP fails at the next forward (step 2). ``static_graph=True`` fails at step 3, saying the graph changed,
      and for DDP it did: in iteration 1 every returned output runs through ``_DDPSink``, whose backward sends an
      undefined gradient into head_b, so head_b's gradient hooks fired in step 1 and never after.
      ``find_unused_parameters=True`` trains through the same mechanism (``_DDPSink`` in every iteration), and so
      does not returning the head, or putting it in the loss (torch 2.8 and 2.13 alike).

All-reduces are counted with torch.profiler (each is one ``c10d::allreduce_`` op, whatever the backend) in one step;
the bytes and dtype of every tensor handed to an all-reduce are read with a ``TorchDispatchMode`` in the next. Failures of a variant are
caught on every rank and recorded (both ranks raise at the same point, so the process group stays in step).
Each rank writes ``<metrics-dir>/ddp_knobs_rank<RANK>.json``. Only torch and the Python standard library.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode

LESSONS = ("buckets", "bucket_view", "static_graph", "comm_hook", "unused_head")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))  # the first paragraph
    p.add_argument("--lessons", nargs="+", choices=LESSONS, default=list(LESSONS), help="what to run, in this order")
    p.add_argument("--bucket-caps-mb", nargs="+", type=float, default=[25.0, 1.0, 0.25, 0.05],
                   help="bucket_cap_mb values of the buckets lesson, besides the default None (MiB)")
    p.add_argument("--hidden-dim", type=int, default=256, help="width of the MLP (count)")
    p.add_argument("--n-layers", type=int, default=6, help="hidden Linear layers of the MLP (count)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (count)")
    p.add_argument("--max-steps", type=int, default=30, help="steps of every training variant (count, >= 3)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (unitless)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and of the synthetic data")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl on cuda, gloo on cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0,
                   help="collective timeout of the process group (seconds); torch's default is 10 minutes on NCCL, "
                        "30 on gloo")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for ddp_knobs_rank<RANK>.json (created)")
    args = p.parse_args(argv)
    for name in ("hidden_dim", "n_layers", "batch_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.max_steps < 3:
        p.error(f"--max-steps must be >= 3 (step 1 builds the buckets, later steps are measured), got {args.max_steps}")
    if min(args.bucket_caps_mb) <= 0:
        p.error(f"--bucket-caps-mb must all be > 0, got {args.bucket_caps_mb}")
    if args.lr <= 0 or args.pg_timeout_s <= 0:
        p.error(f"--lr and --pg-timeout-s must be > 0, got {args.lr}, {args.pg_timeout_s}")
    return args


def setup(args):
    """Join the process group (a world of one over an in-memory store without torchrun); return (rank, device).

    Raises SystemExit when ``--device cuda`` is asked for and ``torch.cuda.is_available()`` is False."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"ddp_knobs.py --device cuda, but torch.cuda.is_available() is False here (torch "
                         f"{torch.__version__}, CUDA build {torch.version.cuda}); use --device cpu or auto")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # LOCAL_RANK: the GPU index on this node
    backend = ("nccl" if use_cuda else "gloo") if args.backend == "auto" else args.backend
    timeout = timedelta(seconds=args.pg_timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:  # DDP needs a process group even alone
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dist.get_rank(), device


class MLP(nn.Module):
    """Input layer, ``n_layers`` hidden layers, one output; with ``head_b`` a second output head."""

    def __init__(self, dim, n_layers, head_b="none"):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(),
                                   *[m for _ in range(n_layers) for m in (nn.Linear(dim, dim), nn.ReLU())])
        self.head_a = nn.Linear(dim, 1)
        self.head_b = nn.Linear(dim, 1) if head_b != "none" else None
        self.head_b_mode = head_b  # none | returned | in_loss | not_returned

    def forward(self, x):
        h = self.trunk(x)
        a = self.head_a(h)
        if self.head_b is None:
            return a, None
        b = self.head_b(h)  # computed in every mode
        return a, (None if self.head_b_mode == "not_returned" else b)


def build(args, device, head_b="none", **ddp_kwargs):
    torch.manual_seed(args.seed)  # the same weights in every variant (DDP also broadcasts rank 0's)
    model = MLP(args.hidden_dim, args.n_layers, head_b).to(device)
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **ddp_kwargs)


def batch(args, rank, step, device):
    """Rank ``rank``'s batch of step ``step``: the same in every variant."""
    g = torch.Generator().manual_seed(args.seed * 100_003 + step * 1009 + rank)
    x = torch.randn(args.batch_size, args.hidden_dim, generator=g)
    return x.to(device), x[:, :1].sin().to(device)


def train_step(model, optimizer, args, rank, step, device, head_b_in_loss=False, inspect=None, set_to_none=True):
    x, y = batch(args, rank, step, device)
    a, b = model(x)
    loss = (a - y).pow(2).mean()
    if head_b_in_loss:
        loss = loss + 0.1 * (b - y).pow(2).mean()  # every output feeds the loss: every parameter gets a gradient
    loss.backward()  # DDP all-reduces the gradients, bucket by bucket, while backward runs
    if inspect is not None:
        inspect(model)  # look at the gradients before the optimizer uses and zero_grad drops them
    optimizer.step()
    optimizer.zero_grad(set_to_none=set_to_none)  # True (the default): the next backward makes new .grad tensors
    return loss


def train(model, args, rank, device, measure_step=3, head_b_in_loss=False):
    """``args.max_steps`` SGD steps; returns (losses, what was counted, median step time in seconds over the steps
    after the first that were not measured). Step ``measure_step`` counts the all-reduces (``count_allreduces``),
    the step after it the bytes they carried (``allreduced_tensors``): one instrument per step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses, counts, times = [], {}, []
    instruments = {measure_step: count_allreduces, measure_step + 1: allreduced_tensors}
    for step in range(1, args.max_steps + 1):
        t0 = time.perf_counter()
        with instruments.get(step, contextlib.nullcontext)() as seen:
            loss = train_step(model, optimizer, args, rank, step, device, head_b_in_loss)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        counts.update(seen or {})
        if step > 1 and step not in instruments:
            times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, counts, statistics.median(times) if times else None


def param_diff(model_a, model_b):
    """Largest |difference| between two models' parameters (after their training)."""
    return max((pa - pb).abs().max().item() for pa, pb in zip(model_a.parameters(), model_b.parameters()))


# ---- the lessons --------------------------------------------------------------------------------------------


def lesson_buckets(args, rank, device):
    out = []
    for cap in [None, *args.bucket_caps_mb]:
        model = build(args, device, bucket_cap_mb=cap)
        buckets = BucketRecorder()
        model.register_comm_hook(buckets, buckets.hook)  # DDP's plain all-reduce, with each bucket noted
        losses, counts, step_time_s = train(model, args, rank, device)
        out.append({"bucket_cap_mb": cap, "label": "None (default)" if cap is None else f"{cap:g}",
                    "all_reduce_calls_first_step": buckets.calls_in_step[1],
                    "all_reduce_calls_per_step": counts["all_reduce"],
                    "all_reduce_tensors_per_step": counts["all_reduce_tensors"],
                    "all_reduced_bytes_per_step": counts["all_reduce_bytes"],
                    "bucket_numels_first_step": buckets.numels_in_step[1],
                    "bucket_numels": buckets.numels_in_step[3],
                    "buckets_per_step": buckets.calls_in_step[3],  # what the hook saw, against the profiler's count
                    "param_tensors": len(list(model.parameters())),
                    "param_numels": [p.numel() for p in model.parameters()],  # model.parameters() order
                    "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                    "loss_last": losses[-1], "step_time_s": step_time_s})
    return out


def lesson_bucket_view(args, rank, device):
    out = {}
    for label, view, set_to_none in [("False", False, True), ("True", True, True),
                                     ("True, zero_grad(set_to_none=False)", True, False)]:
        model = build(args, device, gradient_as_bucket_view=view)
        buckets = BucketRecorder()
        model.register_comm_hook(buckets, buckets.hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        losses = [train_step(model, optimizer, args, rank, step, device, set_to_none=set_to_none).item()
                  for step in (1, 2)]
        x, y = batch(args, rank, 3, device)  # step 3's backward; the gradients are looked at before zero_grad
        allocated_before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
        with _TensorCopies() as copies:  # which copies DDP makes between .grad and its buckets
            (model(x)[0] - y).pow(2).mean().backward()
        grads = [p.grad for p in model.parameters()]
        ranges = buckets.buffer_ranges  # (data_ptr, nbytes) of every bucket of the last backward
        inside = [any(start <= g.data_ptr() < start + size for start, size in ranges) for g in grads]
        storages = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads}
        into, out_of = copies.between(ranges)
        out[label] = {
            "gradient_as_bucket_view": view, "zero_grad_set_to_none": set_to_none, "param_tensors": len(grads),
            "copies_into_buckets": into, "copies_out_of_buckets": out_of,  # tensors copied in step 3's backward
            "grads_inside_a_bucket": sum(inside),  # param.grad.data_ptr() lies in a bucket's buffer
            "grad_storages": len(storages), "buckets": len(ranges),
            "grad_bytes": sum(g.numel() * g.element_size() for g in grads),
            "bucket_bytes": sum(size for _, size in ranges),
            # bytes of distinct storage behind the gradients and the buckets: what gradients cost in memory
            "grad_and_bucket_storage_bytes": sum({**storages, **dict(ranges)}.values()),
            "cuda_allocated_by_step_bytes": (torch.cuda.memory_allocated(device) - allocated_before
                                                 if allocated_before is not None else None),
            "losses": losses,
        }
        del model, optimizer, grads
    return out


def lesson_static_graph(args, rank, device):
    out, models = {}, {}
    for static in (False, True):
        models[static] = build(args, device, static_graph=static)
        buckets = BucketRecorder()
        models[static].register_comm_hook(buckets, buckets.hook)  # DDP's plain all-reduce, each bucket noted
        losses, counts, step_time_s = train(models[static], args, rank, device)
        out[str(static)] = {"static_graph": static, "losses": losses, "all_reduce_calls_per_step": counts["all_reduce"],
                            "all_reduce_calls_first_step": buckets.calls_in_step[1],
                            "bucket_numels": buckets.numels_in_step[3], "step_time_s": step_time_s}
    out["max_param_diff"] = param_diff(models[False], models[True])
    return out


def bf16_hook(process_group, bucket):
    """A comm hook written by hand: all-reduce the bucket in bf16 (half the bytes), return a Future of the fp32
    average. DDP calls it once per bucket per step instead of its own all-reduce."""
    group = process_group if process_group is not None else dist.group.WORLD
    compressed = bucket.buffer().to(torch.bfloat16).div_(group.size())
    work = dist.all_reduce(compressed, group=group, async_op=True)

    def decompress(fut):
        bucket.buffer().copy_(fut.value()[0])  # back into the fp32 bucket, which DDP hands to the gradients
        return bucket.buffer()

    return work.get_future().then(decompress)


def lesson_comm_hook(args, rank, device):
    hooks = {"fp32 (no hook)": None, "fp16_compress_hook": default_hooks.fp16_compress_hook,
             "bf16_compress_hook": default_hooks.bf16_compress_hook, "bf16_hook (hand-written)": bf16_hook}
    out, reference = {}, None
    for label, hook in hooks.items():
        model = build(args, device)
        row = {"hook": label}
        try:
            if hook is not None:
                model.register_comm_hook(None, hook)  # state None: the default process group
        except (TypeError, RuntimeError, ValueError) as e:  # DDP refuses some hooks on some builds
            out[label] = {**row, "registered": False, "error": f"{type(e).__name__}: {e}"}
            continue
        losses, counts, step_time_s = train(model, args, rank, device)
        reference = reference or (model, losses)
        out[label] = {**row, "registered": True, "losses": losses, "step_time_s": step_time_s,
                      "all_reduce_calls_per_step": counts["all_reduce"],
                      "all_reduce_tensors_per_step": counts["all_reduce_tensors"],
                      "all_reduced_bytes_per_step": counts["all_reduce_bytes"],
                      "all_reduce_dtypes": counts["all_reduce_dtypes"],
                      "max_loss_diff_vs_fp32": max(abs(a - b) for a, b in zip(losses, reference[1])),
                      "max_param_diff_vs_fp32": param_diff(model, reference[0])}
    return out


def lesson_unused_head(args, rank, device):
    variants = [  # (label, head_b mode, DDP keyword arguments)
        ("no head_b (reference)", "none", {}),
        ("head_b returned, not in the loss", "returned", {}),
        ("static_graph=True, head_b returned, not in the loss", "returned", {"static_graph": True}),
        ("find_unused_parameters=True, head_b returned, not in the loss", "returned",
         {"find_unused_parameters": True}),
        ("static_graph=True, head_b computed, not returned", "not_returned", {"static_graph": True}),
        ("static_graph=True, head_b in the loss", "in_loss", {"static_graph": True}),
    ]
    out, reference = {}, None
    for label, mode, kwargs in variants:
        model = build(args, device, head_b=mode, **kwargs)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        row = {"head_b": mode, "ddp_kwargs": kwargs, "ok": True, "failed_at_step": None, "error": None, "losses": [],
               "head_b_grad": [],  # per step: "none" (no gradient), "zero" (all zeros) or "nonzero"
               "head_b_hooks_fired_in_steps": []}  # steps whose backward ran head_b's AccumulateGrad (DDP's hook)
        step = 0
        if model.module.head_b is not None:
            watch_accumulate_grad(model.module.head_b.weight, lambda: row["head_b_hooks_fired_in_steps"].append(step))
        for step in range(1, args.max_steps + 1):
            try:
                row["losses"].append(train_step(model, optimizer, args, rank, step, device, mode == "in_loss",
                                                inspect=lambda m: row["head_b_grad"].append(head_b_grad(m))).item())
            except RuntimeError as e:  # DDP raises on every rank at the same forward: the group stays in step
                row.update(ok=False, failed_at_step=step, error=str(e))
                break
        trunk = [p for n, p in model.module.named_parameters() if not n.startswith("head_b")]
        if reference is None:
            reference = trunk
        if row["ok"]:
            row["trunk_max_param_diff_vs_reference"] = max((p - q).abs().max().item() for p, q in zip(trunk, reference))
            row["head_b_trained"] = model.module.head_b is not None and any(
                (p != q).any().item() for p, q in zip(model.module.head_b.parameters(), fresh_head_b(args, device, mode)))
        out[label] = row
        dist.barrier()  # every rank is done with this variant before the next one starts
    return out


def watch_accumulate_grad(param, callback):
    """Call ``callback()`` whenever backward runs ``param``'s AccumulateGrad node, the node DDP hooks to learn that a
    gradient is ready; it runs also for an undefined gradient (``param.grad`` then stays None)."""
    node = param.view_as(param).grad_fn.next_functions[0][0]  # the AccumulateGrad node DDP's reducer holds too
    node.register_hook(lambda grad_inputs, grad_outputs: callback())


def head_b_grad(model):
    """What backward left in head_b's weight gradient: "none", "zero" or "nonzero" ("-" without a head_b)."""
    if model.module.head_b is None:
        return "-"
    grad = model.module.head_b.weight.grad
    return "none" if grad is None else ("zero" if not grad.any() else "nonzero")


def fresh_head_b(args, device, mode):
    """head_b's parameters as built, before any training (for 'did it change?')."""
    torch.manual_seed(args.seed)
    return list(MLP(args.hidden_dim, args.n_layers, mode).to(device).head_b.parameters())


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    # torch 2.13's profiler logs each start and stop on stderr, and 2.8's CUDA wheel on a machine without a GPU
    # an error per profile (gpuGetDeviceCount): the counts are what this script wants from it.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    rank, device = setup(args)
    try:
        lessons = {"buckets": lesson_buckets, "bucket_view": lesson_bucket_view, "static_graph": lesson_static_graph,
                   "comm_hook": lesson_comm_hook, "unused_head": lesson_unused_head}
        result = {"rank": rank, "world_size": dist.get_world_size(), "torch": torch.__version__,
                  "torch_cuda": torch.version.cuda, "device": str(device), "backend": dist.get_backend(),
                  "args": vars(args)}
        for name in args.lessons:
            if name == "unused_head" and rank == 0:
                sys.stdout.write("unused_head: expect DDP's warning (once per rank) that find_unused_parameters=True "
                                 "found no unused parameters: head_b's output is returned, so the graph walk from the "
                                 "outputs reaches it\n")  # C++ TORCH_WARN_ONCE on stderr, not a Python warning
            result[name] = lessons[name](args, rank, device)
            dist.barrier()
            sys.stdout.write(f"rank {rank}: {name} done\n")
        path = Path(args.metrics_dir) / f"ddp_knobs_rank{rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        if rank == 0:
            where = f"every rank's measurements: {path.parent.resolve()}/ddp_knobs_rank<RANK>.json"
            sys.stdout.write("".join(f"{line}\n" for line in [*summary_lines(result), where]))  # one write: no other
            # rank's line lands inside it (torchrun runs python -u, where print's text and newline are two writes)
    finally:
        dist.destroy_process_group()


def summary_lines(result):
    """A few lines per lesson of what ``result`` (one rank's measurements) shows, for the terminal."""
    lines = [f"rank {result['rank']} of {result['world_size']}, torch {result['torch']}, {result['backend']} on "
             f"{result['device']}:"]
    if "buckets" in result:
        rows = result["buckets"]
        lines.append("buckets: all-reduces per step by bucket_cap_mb (MiB): "
                     + ", ".join(f"{row['label']}: {row['all_reduce_calls_per_step']}" for row in rows))
        lines.append(f"  step 1: {rows[0]['all_reduce_calls_first_step']} all-reduce; the same "
                     f"{rows[0]['all_reduced_bytes_per_step']} bytes per step for every cap; last losses "
                     + ", ".join(sorted({f"{row['loss_last']:.9g}" for row in rows})))
    if "bucket_view" in result:
        views = result["bucket_view"].values()
        lines.append("bucket_view: gradient_as_bucket_view=False / True / True with zero_grad(set_to_none=False): "
                     "grads inside a bucket " + " / ".join(f"{v['grads_inside_a_bucket']} of {v['param_tensors']}"
                                                           for v in views)
                     + "; gradient + bucket storage "
                     + " / ".join(f"{v['grad_and_bucket_storage_bytes']}" for v in views)
                     + " bytes; copies into / out of buckets per backward "
                     + ", ".join(f"{v['copies_into_buckets']} / {v['copies_out_of_buckets']}" for v in views))
    if "static_graph" in result:
        s = result["static_graph"]
        same = "the same" if s["True"]["losses"] == s["False"]["losses"] else "not bitwise the same"
        lines.append(f"static_graph: True vs False: {same} losses, max |parameter difference| "
                     f"{s['max_param_diff']:.3g}, all-reduces per step {s['True']['all_reduce_calls_per_step']} vs "
                     f"{s['False']['all_reduce_calls_per_step']}")
    if "comm_hook" in result:
        lines.append("comm_hook: bytes per step (dtype, max |loss - fp32 loss|):")
        for label, h in result["comm_hook"].items():
            lines.append(f"  {label}: " + (f"{h['all_reduced_bytes_per_step']} ({', '.join(h['all_reduce_dtypes'])}, "
                                            f"{h['max_loss_diff_vs_fp32']:.3g})" if h["registered"]
                                            else "refused: " + h["error"].split("\n")[0][:100]))
    if "unused_head" in result:
        lines.append("unused_head:")
        for label, v in result["unused_head"].items():
            outcome = (f"trains (trunk vs reference {v['trunk_max_param_diff_vs_reference']:.3g}, head_b trained: "
                       f"{v['head_b_trained']})" if v["ok"] else f"fails at step {v['failed_at_step']}")
            lines.append(f"  {label}: {outcome}")
    return lines


# ---- Workbook instrumentation -------------------------------------------------------------------------------


class BucketRecorder:
    """A comm hook that notes every bucket DDP hands it (its size and where its buffer lives), then all-reduces it
    exactly as DDP's default does (``default_hooks.allreduce_hook``). Pass the recorder itself as the hook's state."""

    def __init__(self):
        self.step, self.calls_in_step, self.numels_in_step, self.buffer_ranges = 0, {}, {}, []

    @staticmethod
    def hook(state, bucket):
        if bucket.index() == 0:  # the first bucket of a new backward
            state.step += 1
            state.buffer_ranges = []
        buffer = bucket.buffer()
        state.calls_in_step[state.step] = state.calls_in_step.get(state.step, 0) + 1
        state.numels_in_step.setdefault(state.step, []).append(buffer.numel())
        state.buffer_ranges.append((buffer.data_ptr(), buffer.numel() * buffer.element_size()))
        return default_hooks.allreduce_hook(None, bucket)


class _CollectiveBytes(TorchDispatchMode):
    """Sees every op dispatched while active; notes the tensors handed to c10d's all-reduce (dtype, bytes)."""

    def __init__(self):
        super().__init__()
        self.tensors = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.startswith("allreduce_") and func.namespace == "c10d":
            self.tensors += [(str(t.dtype).replace("torch.", ""), t.numel() * t.element_size()) for t in args[0]]
        return func(*args, **(kwargs or {}))


class _TensorCopies(TorchDispatchMode):
    """Notes every copy between two tensors dispatched while active (``copy_``, and ``mul.out`` with which DDP's
    reducer divides while it copies): (destination data_ptr, source data_ptr). ``between(ranges)`` counts the copies
    into and out of the given buffers (DDP's buckets): ``(into, out_of)``."""

    def __init__(self):
        super().__init__()
        self.copies = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.__name__ == "copy_.default":
            self.copies.append((args[0].data_ptr(), args[1].data_ptr()))
        elif func.__name__ == "mul.out" and torch.is_tensor(args[0]):
            self.copies.append((kwargs["out"].data_ptr(), args[0].data_ptr()))
        return func(*args, **kwargs)

    def between(self, ranges):
        def inside(ptr):
            return any(start <= ptr < start + size for start, size in ranges)
        into = sum(inside(dst) and not inside(src) for dst, src in self.copies)
        out_of = sum(inside(src) and not inside(dst) for dst, src in self.copies)
        return into, out_of


@contextlib.contextmanager
def count_allreduces():
    """Count the all-reduces this rank issues inside the block with torch.profiler (each is one ``c10d::allreduce_``
    op, DDP's buckets included, whatever the backend). Yields a dict, filled on exit: ``all_reduce`` (calls)."""
    from torch.profiler import ProfilerActivity, profile

    counts = {}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield counts
    counts["all_reduce"] = sum(e.name == "c10d::allreduce_" for e in prof.events())


@contextlib.contextmanager
def allreduced_tensors():
    """The tensors this rank hands to all-reduces inside the block, seen by a TorchDispatchMode (not nested in the
    profiler: on torch 2.13 the profiler then records each op twice). Yields a dict, filled on exit:
    ``all_reduce_tensors`` (count), ``all_reduce_bytes`` and ``all_reduce_dtypes``."""
    counts = {}
    with _CollectiveBytes() as seen:
        yield counts
    counts["all_reduce_tensors"] = len(seen.tensors)
    counts["all_reduce_bytes"] = sum(size for _, size in seen.tensors)
    counts["all_reduce_dtypes"] = sorted({dtype for dtype, _ in seen.tensors})


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
