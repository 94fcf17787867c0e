"""Pipeline parallelism: seed 000's two halves as a pipeline (torch.distributed.pipelining), GPipe against 1F1B.

Run card
    torchrun --nproc-per-node 2 pipeline_parallel.py                          # part1 on rank 0, part2 on rank 1
    torchrun --nproc-per-node 2 pipeline_parallel.py --schedules 1f1b --microbatches 4 8
    python pipeline_parallel.py --microbatches 1 2                            # a world of one: one stage, both halves

What it shows
    * seed 000 section 4.3's model (``part1``: Linear 1000 -> 2000, ``part2``: Linear 2000 -> 1000, MSE loss; here
      with a ReLU after ``part1``, which the seed leaves out), its halves on two ranks: stage 0 holds ``part1`` and
      the ReLU, stage 1 holds ``part2``;
    * one micro-batch is the seed's model parallelism, written out by hand across two processes: stage 0 runs the
      whole batch forward and sends the activation (``dist.send``), stage 1 runs forward, loss and backward and
      sends the activation's gradient back, then stage 0 runs its backward. Each stage idles while the other works;
    * ``PipelineStage`` and a schedule (``ScheduleGPipe``, ``Schedule1F1B``) split the batch into m micro-batches
      and send each one on as soon as it is done, so both stages work at once. GPipe runs every forward, then every
      backward; 1F1B starts a micro-batch's backward as soon as it can and alternates, so stage s keeps at most
      (stages - s) micro-batches' activations instead of m. Both leave the same idle fraction,
      (stages - 1) / (m + stages - 1) of equal-length steps: more micro-batches, a smaller bubble;
    * the loss (the mean of the micro-batch losses) and every gradient equal the unsplit model's on the whole batch;
      ``scale_grads`` (default True) divides the accumulated gradients by m, matching a mean loss.
For each configuration (a schedule and m) each stage records, for every micro-batch, when its forward and its
backward ran, in what order, and the bytes it held saved for backward after each; the p2p sends and receives of
the step are counted with torch.profiler. Each rank writes ``<metrics-dir>/pp_rank<RANK>.json``.
Only torch and the Python standard library are imported; ``PipelineStage`` needs numpy installed beside torch (its
first step sends the stages' shapes with ``send_object_list``, which goes through numpy; pip's torch does not
install it).
"""

import argparse
import contextlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--schedules", nargs="+", choices=list(SCHEDULES), default=list(SCHEDULES),
                   help="pipeline schedules to run (1 micro-batch runs once, by hand, for all of them)")
    p.add_argument("--microbatches", nargs="+", type=int, default=[1, 2, 4, 8],
                   help="micro-batches per step to try (count each; each must divide --batch-size)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per step, split into micro-batches (count)")
    p.add_argument("--input-dim", type=int, default=1000, help="features in and out of the model (count; seed: 1000)")
    p.add_argument("--hidden-dim", type=int, default=2000, help="features between the halves (count; seed: 2000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and of the data")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl on cuda, gloo on cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0,
                   help="collective timeout of the process group (seconds); torch's default is 10 minutes on NCCL, "
                        "30 on gloo")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for pp_rank<RANK>.json (created)")
    args = p.parse_args(argv)
    for name in ("batch_size", "input_dim", "hidden_dim"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    bad = [m for m in args.microbatches if m <= 0 or args.batch_size % m]
    if bad:
        # Checked here, before anything runs: the schedules cut the batch with tensor_split (10 in 3: 4, 3, 3) and
        # fail deep in torch on the first micro-batch of another shape ("The size of tensor a (4) must match ...").
        m = next((m for m in bad if m > 0), None)
        sizes = [len(c) for c in torch.arange(args.batch_size).tensor_split(m)] if m else []
        split = f"; {args.batch_size} in {m} would be {sizes}" if m else ""
        p.error(f"--microbatches must each be > 0 and divide --batch-size {args.batch_size} (equal micro-batches: "
                f"the schedules need every one the shape of the first, and the mean of their losses is then the "
                f"batch's loss), got {bad}{split}")
    if args.pg_timeout_s <= 0:
        p.error(f"--pg-timeout-s must be > 0, got {args.pg_timeout_s}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False (no GPU visible, or a CPU-only torch build); "
                "use --device cpu or --device auto")
    return args


def setup(args):
    """Join the process group (a world of one over an in-memory store without torchrun).

    Returns: (rank, world size, device)."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # LOCAL_RANK: the GPU index on this node
    backend = ("nccl" if use_cuda else "gloo") if args.backend == "auto" else args.backend
    timeout = timedelta(seconds=args.pg_timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:  # a pipeline stage talks through a process group, even alone
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), device


def check_world(world_size):
    """Raises ValueError naming WORLD_SIZE unless it is 1 or 2: the model has two halves, so two stages at most."""
    if world_size > 2:
        raise ValueError(f"pipeline_parallel.py splits seed 000's model into its two halves: 2 stages, so WORLD_SIZE "
                         f"must be 2 (or 1: both halves in one stage), got {world_size}; use "
                         f"torchrun --nproc-per-node 2")


class TwoHalves(nn.Module):
    """Seed 000 section 4.3's model, without its hard-coded devices: which half runs where is the pipeline's job."""

    def __init__(self, input_dim, hidden_dim):
        super().__init__()
        self.part1 = nn.Linear(input_dim, hidden_dim)
        self.part2 = nn.Linear(hidden_dim, input_dim)

    def forward(self, x):
        return self.part2(torch.relu(self.part1(x)))


def build(args, device):
    torch.manual_seed(args.seed)  # the same weights on every rank: each keeps the half it runs
    return TwoHalves(args.input_dim, args.hidden_dim).to(device)


def stage_module(model, stage_index, num_stages):
    """What stage ``stage_index`` runs: part1 and the ReLU, or part2 (with one stage, the whole model)."""
    if num_stages == 1:
        return model
    return nn.Sequential(model.part1, nn.ReLU()) if stage_index == 0 else model.part2


def batch(args, device):
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.batch_size, args.input_dim, generator=g)
    return x.to(device), torch.randn(args.batch_size, args.input_dim, generator=g).to(device)


def pipeline_step(schedule, rank, world_size, x, y):
    """One step through the pipeline: the first stage feeds the batch, the last computes the loss of each
    micro-batch (returned, on the last stage). Every stage must call ``step`` the same number of times."""
    losses = []
    if world_size == 1:
        schedule.step(x, target=y, losses=losses)
    elif rank == 0:
        schedule.step(x)  # split into micro-batches; activations sent on to stage 1 as each is ready
    else:
        schedule.step(target=y, losses=losses)  # receives activations, sends their gradients back
    return losses


def by_hand_step(module, rank, x, y, recorder, hidden_dim):
    """One micro-batch: seed 000's model parallelism across two processes, every transfer written out."""
    if rank == 0:
        with recorder.action("F", 0):
            h = module(x)
        dist.send(h.detach(), dst=1)  # the activation goes to the next stage ...
        grad = torch.empty_like(h)
        dist.recv(grad, src=1)  # ... and its gradient comes back, after stage 1's backward
        with recorder.action("B", 0):
            h.backward(grad)
        return []
    h = torch.empty(x.shape[0], hidden_dim, device=x.device)
    dist.recv(h, src=0)
    h.requires_grad_(True)
    with recorder.action("F", 0):
        out = module(h)
    loss = F.mse_loss(out, y)
    with recorder.action("B", 0):
        loss.backward()
    dist.send(h.grad, dst=0)
    return [loss.detach()]


def run_configuration(args, rank, world_size, device, schedule_name, n_micro, scale_grads=True):
    """Build the model afresh, run one warm-up step (the stages agree on shapes), then one recorded step."""
    model = build(args, device)
    module = stage_module(model, rank, world_size)
    recorder = StageRecorder(module, device)
    x, y = batch(args, device)
    if n_micro == 1 and world_size > 1:  # torch's schedules want at least one micro-batch per stage (see below)
        def step():
            return by_hand_step(module, rank, x, y, recorder, args.hidden_dim)
        order = None
    else:
        stage = RecordedStage(module, rank, world_size, device)  # a PipelineStage that also records (below)
        stage.recorder = recorder
        schedule = SCHEDULES[schedule_name](stage, n_micro, loss_fn=F.mse_loss, scale_grads=scale_grads)

        def step():
            return pipeline_step(schedule, rank, world_size, x, y)
        order = schedule_order(schedule, rank)
    step()
    model.zero_grad(set_to_none=True)
    recorder.reset()
    with count_p2p() as p2p:
        losses = step()
    return {"schedule": schedule_name if (n_micro > 1 or world_size == 1) else "by hand", "microbatches": n_micro,
            "scale_grads": scale_grads, "events": recorder.events, "peak_saved_bytes": recorder.live.peak,
            "schedule_order": order, "p2p": p2p,
            "loss": torch.stack(losses).mean().item() if losses else None,
            "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None}}


# ---------------------------------------------------------------------------------------------------------------
# Workbook instrumentation: what the notebook reads (each micro-batch's forward and backward on each stage, the
# bytes saved for backward, the p2p transfers, the comparison with the unsplit model). Not needed to pipeline.
# ---------------------------------------------------------------------------------------------------------------

class LiveSavedBytes:
    """The bytes this stage holds saved for backward, live: added when autograd saves a tensor (pack hook), removed
    when autograd frees it (after that micro-batch's backward). Parameters and their views are not counted; a
    tensor saved twice counts once."""

    def __init__(self, module):
        self.params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self.refs, self.live, self.peak = {}, 0, 0

    def pack(self, t):
        if t.untyped_storage().data_ptr() in self.params:
            return t
        key = (t.data_ptr(), t.numel())
        count, nbytes = self.refs.get(key, (0, t.numel() * t.element_size()))
        if count == 0:
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        self.refs[key] = (count + 1, nbytes)
        return _Saved(self, key, t)

    @staticmethod
    def unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def release(self, key):
        count, nbytes = self.refs[key]
        if count == 1:
            del self.refs[key]
            self.live -= nbytes
        else:
            self.refs[key] = (count - 1, nbytes)


class _Saved:
    """What autograd keeps instead of a saved tensor: the tensor, and a note to the counter when it is freed."""

    def __init__(self, owner, key, tensor):
        self.owner, self.key, self.tensor = owner, key, tensor

    def __del__(self):
        self.owner.release(self.key)


class StageRecorder:
    """Each forward and backward this stage runs: action ("F"/"B"), micro-batch, start and end times (seconds on
    the machine's monotonic clock, shared by every process on one machine) and the live saved bytes after it."""

    def __init__(self, module, device):
        self.device, self.live, self.events = device, LiveSavedBytes(module), []

    def reset(self):
        self.events, self.live.peak = [], self.live.live

    @contextlib.contextmanager
    def action(self, kind, microbatch):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the GPU works asynchronously: time what it did, not the launch
        start = time.monotonic()
        hooks = (torch.autograd.graph.saved_tensors_hooks(self.live.pack, self.live.unpack) if kind == "F"
                 else contextlib.nullcontext())
        with hooks:
            yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.events.append({"action": kind, "microbatch": microbatch, "start_s": start, "end_s": time.monotonic(),
                            "saved_bytes_after": self.live.live})


class RecordedStage(PipelineStage):
    """A ``PipelineStage`` that notes when the schedule runs each micro-batch's forward and backward."""

    recorder = None

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        with self.recorder.action("F", fwd_chunk_id):
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        with self.recorder.action("B", bwd_chunk_id):
            return super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)


def schedule_order(schedule, stage_index):
    """The schedule's own plan for this stage (``pipeline_order``, torch 2.8 and 2.13): ["F0", "F1", "B0", ...],
    idle slots and other actions left out; None when the schedule has no such plan."""
    plan = (getattr(schedule, "pipeline_order", None) or {}).get(stage_index)
    if plan is None:
        return None
    names = {"FORWARD": "F", "FULL_BACKWARD": "B"}
    return [f"{names[a.computation_type.name]}{a.microbatch_index}" for a in plan
            if a is not None and a.computation_type.name in names]


@contextlib.contextmanager
def count_p2p():
    """Point-to-point sends and receives inside the block (torch.profiler: c10d::send and c10d::recv_ ops); the
    dict is filled when the block exits."""
    counts = {"send": 0, "recv": 0}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        yield counts
    for event in prof.events():
        kind = {"c10d::send": "send", "c10d::recv_": "recv"}.get(event.name)
        if kind:
            counts[kind] += 1


def try_schedule(schedule_cls, args, rank, world_size, device, n_micro):
    """Whether torch accepts ``schedule_cls`` with ``n_micro`` micro-batches on this many stages (built, not run)."""
    stage = PipelineStage(stage_module(build(args, device), rank, world_size), rank, world_size, device)
    try:
        schedule_cls(stage, n_micro, loss_fn=F.mse_loss)
        return "accepted"
    except ValueError as e:
        return f"ValueError: {e}"


def compare_with_unsplit(run, reference, names):
    """Max |gradient - the unsplit model's| over this stage's parameters, and the gradients' norm ratio."""
    diffs = {n: (run["grads"][n] - reference[n]).abs().max().item() for n in names}
    norm = sum(run["grads"][n].norm().item() ** 2 for n in names) ** 0.5
    ref_norm = sum(reference[n].norm().item() ** 2 for n in names) ** 0.5
    return {"grad_max_abs_diff": max(diffs.values()),
            "grad_max_abs": max(reference[n].abs().max().item() for n in names),
            "grad_norm_ratio": norm / ref_norm}


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # torch.profiler: quiet on start and stop (2.13), no GPU (2.8)
    rank, world_size, device = setup(args)
    try:
        check_world(world_size)
        model = build(args, device)  # the unsplit model: loss and gradients every configuration must give
        x, y = batch(args, device)
        ref_loss = F.mse_loss(model(x), y)
        ref_loss.backward()
        reference = {n: p.grad for n, p in model.named_parameters()}
        names = [n for n, _ in stage_module(model, rank, world_size).named_parameters()]
        names = [n if world_size == 1 else ("part1." if rank == 0 else "part2.") + n.split(".")[-1] for n in names]
        runs, done_by_hand = [], False
        for schedule_name in args.schedules:
            for n_micro in args.microbatches:
                if n_micro == 1 and world_size > 1 and done_by_hand:
                    continue  # one micro-batch is the same for every schedule: run once
                done_by_hand = done_by_hand or (n_micro == 1 and world_size > 1)
                run = run_configuration(args, rank, world_size, device, schedule_name, n_micro)
                runs.append({**{k: v for k, v in run.items() if k != "grads"},
                             **compare_with_unsplit(run, reference, names)})
        control = run_configuration(args, rank, world_size, device, args.schedules[0], max(args.microbatches),
                                    scale_grads=False)  # gradients summed over micro-batches, not averaged
        result = {"rank": rank, "world_size": world_size, "stage": rank, "num_stages": world_size,
                  "torch": torch.__version__, "device": str(device), "args": vars(args),
                  "loss_unsplit": ref_loss.item(), "runs": runs,
                  "control_scale_grads_false": {"microbatches": control["microbatches"],
                                                **compare_with_unsplit(control, reference, names)},
                  "one_microbatch_accepted": {name: try_schedule(cls, args, rank, world_size, device, 1)
                                              for name, cls in SCHEDULES.items()},
                  "param_bytes": sum(p.numel() * p.element_size()
                                     for p in stage_module(model, rank, world_size).parameters())}
        path = Path(args.metrics_dir) / f"pp_rank{rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        sys.stdout.write(f"rank {rank} (stage {rank} of {world_size}): {len(runs)} configurations; every number in "
                         f"{path.resolve()}\n")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
