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
Each configuration (a schedule and m) runs two steps on a fresh copy of the model; after the second, the last
stage prints its loss beside the unsplit model's and every stage how far its gradients are from the unsplit model's.
In a workbook run, ``_workbook.py`` beside it records for notebook 12, from lines marked ``# workbook``, when each
stage ran each micro-batch's forward and backward, the bytes it held saved for backward and the step's p2p sends
and receives (``--metrics-dir``: ``pp_rank<RANK>.json``); a copy alone runs without it.
Only torch and the Python standard library are imported; ``PipelineStage`` needs numpy installed beside torch (its
first step sends the stages' shapes with ``send_object_list``, which goes through numpy; pip's torch does not
install it).
"""

import argparse
import contextlib
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

try:  # the workbook's instruments, written beside this file in a workbook run; a copy runs without them
    import _workbook as workbook
except ImportError:
    workbook = None


class NoRecorder:  # stands in for _workbook.PipelineRecorder in a copy without _workbook.py: records nothing
    def __getattr__(self, name):
        return lambda *args, **kwargs: contextlib.nullcontext()


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
    if workbook:  # workbook
        workbook.add_rank_json_flags(p, "pp_rank<RANK>.json")  # workbook: --metrics-dir
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
        with recorder.action("F", 0):  # workbook: when this forward ran, the bytes it saved for backward
            h = module(x)
        dist.send(h.detach(), dst=1)  # the activation goes to the next stage ...
        grad = torch.empty_like(h)
        dist.recv(grad, src=1)  # ... and its gradient comes back, after stage 1's backward
        with recorder.action("B", 0):  # workbook
            h.backward(grad)
        return []
    h = torch.empty(x.shape[0], hidden_dim, device=x.device)
    dist.recv(h, src=0)
    h.requires_grad_(True)  # a leaf here: its .grad is what stage 0's backward needs
    with recorder.action("F", 0):  # workbook
        out = module(h)
    loss = F.mse_loss(out, y)
    with recorder.action("B", 0):  # workbook
        loss.backward()
    dist.send(h.grad, dst=0)
    return [loss.detach()]


def how(schedule_name, n_micro, world_size):
    """How a configuration runs: one micro-batch on two stages "by hand" (torch's schedules want at least one
    micro-batch per stage: 1F1B refuses fewer, and GPipe on torch 2.8), else through the schedule."""
    return "by hand" if n_micro == 1 and world_size > 1 else schedule_name


def run_configuration(args, rank, world_size, device, label, n_micro, recorder, scale_grads=True):
    """Build the model afresh and run two steps of one configuration (``label``: "by hand" or a schedule's name) with
    ``n_micro`` micro-batches. Returns the model, holding the second step's gradients, and that step's micro-batch
    losses (on the last stage; [] on the others)."""
    model = build(args, device)
    module = stage_module(model, rank, world_size)
    recorder.configuration(module)  # workbook: a new timeline for this configuration
    x, y = batch(args, device)
    if label == "by hand":
        def step():
            return by_hand_step(module, rank, x, y, recorder, args.hidden_dim)
    else:
        stage = PipelineStage(module, rank, world_size, device)  # this rank's stage: which module, which neighbours
        # scale_grads=True divides the gradients summed over the m micro-batches by m: the mean loss's gradients.
        schedule = SCHEDULES[label](stage, n_micro, loss_fn=F.mse_loss, scale_grads=scale_grads)
        recorder.watch(stage, schedule)  # workbook: each forward and backward the schedule runs, and its plan

        def step():
            return pipeline_step(schedule, rank, world_size, x, y)
    step()  # a PipelineStage's first step also tells the next stage the activations' shapes (send_object_list)
    model.zero_grad(set_to_none=True)  # gradients accumulate across steps: keep the second step's only
    with recorder.measured_step():  # workbook: this step's actions and p2p transfers, not the first step's
        losses = step()
    return model, losses


def report(rank, world_size, label, n_micro, model, losses, loss_unsplit, reference):
    """Print this stage's gradients against the unsplit model's, and on the last stage the step's loss: the mean of
    the micro-batch losses, which equals the loss of the whole batch because the micro-batches are equal in size."""
    diff = max((p.grad - reference[n]).abs().max().item() for n, p in model.named_parameters() if p.grad is not None)
    loss = f"loss {torch.stack(losses).mean().item():.6f} (unsplit {loss_unsplit:.6f}), " if losses else ""
    sys.stdout.write(f"stage {rank} of {world_size}, {label}, {n_micro} micro-batch(es): {loss}gradients within "
                     f"{diff:.1e} of the unsplit model's\n")


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    rank, world_size, device = setup(args)
    try:
        check_world(world_size)
        model = build(args, device)  # the unsplit model: the loss and gradients every configuration must give
        x, y = batch(args, device)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        loss_unsplit, reference = loss.item(), {n: p.grad for n, p in model.named_parameters()}
        recorder = (workbook.PipelineRecorder(args, device, model, stage_module(model, rank, world_size))  # workbook
                    if workbook else NoRecorder())  # workbook
        # One micro-batch on two stages runs by hand, the same whatever the schedule: once.
        configurations = dict.fromkeys((how(s, m, world_size), m) for s in args.schedules for m in args.microbatches)
        for label, n_micro in configurations:
            trained, losses = run_configuration(args, rank, world_size, device, label, n_micro, recorder)
            recorder.configuration_done(label, n_micro, trained, losses)  # workbook: compared, kept for the JSON
            report(rank, world_size, label, n_micro, trained, losses, loss_unsplit, reference)
        # The control: scale_grads=False leaves the gradients summed over the micro-batches, m times the mean's.
        n_micro = max(args.microbatches)
        label = how(args.schedules[0], n_micro, world_size)
        trained, losses = run_configuration(args, rank, world_size, device, label, n_micro, recorder, scale_grads=False)
        recorder.configuration_done(label, n_micro, trained, losses, scale_grads=False)  # workbook
        report(rank, world_size, f"{label}, scale_grads=False", n_micro, trained, losses, loss_unsplit, reference)
        if workbook:  # workbook
            path = recorder.write(loss_unsplit, SCHEDULES)  # workbook: pp_rank<RANK>.json, notebook 12 reads
            sys.stdout.write(f"rank {rank}: every number in {path.resolve()}\n")  # workbook
        dist.barrier()  # nobody tears the process group down while a peer still waits for a send
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
