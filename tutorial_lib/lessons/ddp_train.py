"""DDP training of a small MLP on a synthetic dataset, one JSON line of metrics per step per rank.

Run card
    python ddp_train.py --max-steps 20                       # one process, no process group
    torchrun --nproc-per-node 2 ddp_train.py --max-steps 20  # 2 ranks (gloo on CPU, nccl on CUDA)
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 \
        --master-addr HOST --master-port 29500 ddp_train.py   # node 0 of 2 (run node 1 with --node-rank 1)

    python ddp_train.py --precision bf16                     # bf16 autocast (no scaler needed)
    torchrun --nproc-per-node 2 ddp_train.py --precision fp16 --clip-grad-norm 1.0  # fp16 + GradScaler

    torchrun --nproc-per-node 2 ddp_train.py --fail-rank 1 --fail-step 2 --fail-mode hang --pg-timeout-s 3
                                                             # a failure on purpose (notebook 07): raise, hang,
                                                             # skip-collective or oom
    torchrun --standalone --nproc-per-node 2 ddp_train.py --profile-steps 3
                                                             # torch.profiler: a Chrome trace per rank (notebook 08)
    torchrun --nproc-per-node 2 ddp_train.py --compile       # DDP(torch.compile(model)) (notebook 14)

What it shows
    * the device comes from LOCAL_RANK (the GPU index on *this* node), never from the global RANK;
    * a map-style Dataset read through a DistributedSampler: each rank gets its own 1/world_size of every
      epoch's shuffle, and ``sampler.set_epoch(epoch)`` reshuffles each epoch, the same way on every rank;
    * DDP averages the gradients across ranks during ``backward()``, so W ranks with batch B take the same step as
      one process with batch W*B on the same samples (up to the order of floating-point sums);
    * the loss a rank computes is its *local* loss; the global loss needs an all_reduce;
    * mixed precision with ``torch.autocast(device_type, dtype)`` and ``torch.amp.GradScaler(device_type)``
      (not the deprecated ``torch.cuda.amp``): the scaler multiplies the loss before backward so small fp16
      gradients do not underflow to zero, gradients are unscaled before clipping reads them, and a step whose
      gradients hold inf/NaN is skipped;
    * ``init_process_group`` with a short timeout, ``@record`` on ``main``, ``destroy_process_group`` in ``finally``.

Everything above the "Workbook instrumentation" section is the training script; below it is what the workbook's
notebooks use to measure it and to break it on purpose (metrics, memory, failure injection, flag checks).
Each rank appends one JSON line per step to ``<metrics-dir>/rank<RANK>.jsonl``.
Only torch and the Python standard library are used, so the file can be copied to a cluster as is.
"""

import argparse
import gc
import json
import os
import resource
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

AMP_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # --precision -> autocast dtype


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-steps", type=int, default=50, help="optimizer steps to run, over as many epochs as needed")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (count)")
    p.add_argument("--dataset-size", type=int, default=8192, help="samples in the synthetic dataset (count)")
    p.add_argument("--input-dim", type=int, default=64, help="features per sample (count)")
    p.add_argument("--hidden-dim", type=int, default=256, help="width of the hidden layers (count)")
    p.add_argument("--output-dim", type=int, default=8, help="targets per sample (count)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (unitless)")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw", help="optimizer")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, the dataset and the shuffle")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0,
                   help="collective timeout of the process group (seconds); torch's default (10 minutes on "
                        "NCCL, 30 on gloo) is far too long to notice a hang")
    p.add_argument("--log-every", type=int, default=10, help="print a line every N steps (count)")
    p.add_argument("--precision", choices=list(AMP_DTYPES), default="fp32",
                   help="compute dtype of the forward pass under torch.autocast; parameters, gradients "
                        "and optimizer state stay fp32")
    p.add_argument("--grad-scaler", choices=["auto", "on", "off"], default="auto",
                   help="torch.amp.GradScaler: auto = on for fp16 only (bf16 has fp32's exponent range)")
    p.add_argument("--clip-grad-norm", type=float, default=0.0,
                   help="clip the global gradient L2 norm to this value (0: no clipping)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP's bucket_cap_mb: the largest gradient bucket it all-reduces at once (MiB); default: "
                        "DDP's own (25 MiB, the first bucket 1 MiB)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (in place) before DDP wraps it: DDP(torch.compile(model))")
    p.add_argument("--compile-backend", type=str, default="inductor",
                   help="torch.compile's backend: inductor (generates kernels; needs a C++ compiler on CPU), or "
                        "aot_eager (traces forward and backward, runs them eagerly: quick to compile)")
    p.add_argument("--no-optimize-ddp", action="store_true",
                   help="with --compile: torch._dynamo.config.optimize_ddp = False (one graph, no split at buckets)")
    add_workbook_flags(p)
    return check_args(p, p.parse_args(argv))


def setup(args):
    """Join the process group when launched by torchrun; return (rank, local_rank, world_size, device)."""
    rank = int(os.environ.get("RANK", 0))  # torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): "
                 "use --device cpu, or a machine with a GPU and a CUDA build of torch")
    if use_cuda:
        # LOCAL_RANK, not RANK: on node 1 of a 4-GPU-per-node job, RANK is 4..7 but the GPUs are 0..3.
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if "RANK" in os.environ:  # under torchrun; `python ddp_train.py` trains alone, without a process group
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            timeout=timedelta(seconds=args.pg_timeout_s),  # a hang becomes an error after this, not 10-30 minutes
            device_id=device if use_cuda else None,
        )
    return rank, local_rank, world_size, device


def cleanup():
    if dist.is_initialized():
        dist.destroy_process_group()


class TeacherDataset(Dataset):
    """``size`` fixed samples: x ~ N(0, 1), y = a fixed random two-layer "teacher" network of x, plus noise.

    The teacher makes the targets learnable. Everything comes from ``seed``, so every rank (and a single
    process) builds the very same dataset, and the sampler decides who reads which sample.
    """

    def __init__(self, size, input_dim, output_dim, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, input_dim, generator=g)
        w1 = torch.randn(input_dim, 32, generator=g) / input_dim ** 0.5
        w2 = torch.randn(32, output_dim, generator=g) / 32 ** 0.5
        self.y = torch.tanh(self.x @ w1) @ w2 + 0.01 * torch.randn(size, output_dim, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def make_data(args, rank, world_size):
    """(sampler, loader): this rank's batches of the shared dataset."""
    dataset = TeacherDataset(args.dataset_size, args.input_dim, args.output_dim, seed=args.seed)
    # Every rank shuffles with the same seed, so all ranks agree on the permutation and each takes every
    # world_size-th index of it: no sample is seen by two ranks in an epoch. drop_last=True drops the tail that
    # does not split evenly (the default pads it with repeated samples). num_replicas and rank are explicit, so
    # the same line runs without a process group: with one process it is a plain shuffled sampler.
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed,
                                 drop_last=True)
    # drop_last here too: every step has a full batch on every rank, so every step equals one process's step
    # with batch world_size * batch_size.
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        raise SystemExit(f"--dataset-size {args.dataset_size} leaves each of {world_size} ranks fewer samples "
                         f"than --batch-size {args.batch_size}")
    return sampler, loader


class MLP(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(input_dim, hidden_dim), nn.ReLU(),
            nn.Linear(hidden_dim, hidden_dim), nn.ReLU(),
            nn.Linear(hidden_dim, output_dim),
        )

    def forward(self, x):
        return self.net(x)


def make_model(args, local_rank, device):
    # Same seed on every rank: DDP would broadcast rank 0's weights anyway, but FSDP does not,
    # and a single-process reference run must start from the same weights.
    torch.manual_seed(args.seed)
    model = MLP(args.input_dim, args.hidden_dim, args.output_dim).to(device)  # fp32 weights in every precision
    if args.compile:
        # Compile first, then wrap: DDP(torch.compile(model)). Dynamo's DDPOptimizer cuts the graph where DDP's
        # gradient buckets end, so each bucket's all-reduce starts while backward goes on (notebook 14); with
        # optimize_ddp = False the model is one graph and every all-reduce starts after its backward.
        if args.no_optimize_ddp:
            torch._dynamo.config.optimize_ddp = False  # no split at DDP's buckets: one graph
        model.compile(backend=args.compile_backend)  # in place: the state_dict keeps its names
    if dist.is_initialized():
        # DDP broadcasts rank 0's parameters, then hooks backward() to all-reduce (average) the gradients.
        # bucket_cap_mb=None is DDP's default: gradients are all-reduced in buckets of 25 MiB, the first one 1 MiB,
        # each bucket as soon as all its gradients are ready, while backward goes on (notebooks 08 and 10).
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_cap_mb)
    return model


def train(args, rank, local_rank, world_size, device):
    sampler, loader = make_data(args, rank, world_size)
    model = make_model(args, local_rank, device)
    optimizer_class = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.SGD
    optimizer = optimizer_class(model.parameters(), lr=args.lr)
    amp_dtype = AMP_DTYPES[args.precision]  # None: fp32, autocast off
    use_scaler = args.grad_scaler == "on" or (args.grad_scaler == "auto" and args.precision == "fp16")
    # enabled=False turns every scaler call into a pass-through, so one loop serves all precisions.
    scaler = torch.amp.GradScaler(device.type, init_scale=args.init_scale, enabled=use_scaler)
    loss_fn = nn.MSELoss()
    recorder = StepRecorder(args, rank, local_rank, world_size, device, model, optimizer, scaler)  # workbook
    step, epoch = 0, 0
    while step < args.max_steps:  # --max-steps counts optimizer steps, over as many epochs as it takes
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank; without it epochs repeat
        for x, y in loader:
            step += 1
            inject_failure(args, rank, step, device)  # workbook: --fail-rank/--fail-step, a no-op by default
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                # The loss belongs inside autocast as well: autocast runs mse_loss in fp32 on its own.
                loss = loss_fn(model(x), y)
            # DDP all-reduces (averages) the fp32 gradient buckets while backward runs. The scaler first
            # multiplies the loss by its scale, so fp16 gradients stay above the 3e-8 below which fp16 rounds to 0.
            scaler.scale(loss * args.loss_weight).backward()
            if not args.clip_before_unscale:  # (--clip-before-unscale: notebook 03's mistake, on purpose)
                scaler.unscale_(optimizer)  # divide by the scale now: clipping must see the true gradients
            recorder.gradients(step)  # workbook: gradient norm and zeros before clipping; --save-grads-dir
            if args.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            scaler.step(optimizer)  # calls optimizer.step() only if every gradient is finite
            scaler.update()  # halves the scale after a skipped step, doubles it after 2000 good ones
            # loss is this rank's *local* loss, over its own samples; the global mean needs one more collective.
            loss_global = loss.detach().float().clone()  # a copy: all_reduce works in place
            if dist.is_initialized() and not skips_collective(args, rank, step):  # workbook: skip-collective
                # SUM, then divide: every backend has SUM (gloo's and NCCL's all_reduce also take ReduceOp.AVG on
                # torch 2.8 and 2.13; gloo's reduce_scatter AVG sums on 2.8: notebook 09).
                dist.all_reduce(loss_global, op=dist.ReduceOp.SUM)
                loss_global /= world_size
            if step % args.log_every == 0 or step == args.max_steps:  # one write per line: ranks never interleave
                sys.stdout.write(f"step {step}/{args.max_steps} epoch {epoch} loss_local {loss.item():.5f} "
                                 f"loss_global {loss_global.item():.5f}\n")
            recorder.step_done(step, loss, loss_global)  # workbook: one JSON line per step; --step-delay-s
            if step == args.max_steps:
                break
        epoch += 1
    recorder.close()
    if dist.is_initialized():
        dist.barrier()  # nobody tears the process group down while a peer still uses it


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    rank, local_rank, world_size, device = setup(args)
    try:
        train(args, rank, local_rank, world_size, device)
        # Free the DDP model (held in a reference cycle) while the process group still lives: left to the
        # interpreter's exit, gloo's threads aborted about 4% of finished CPU runs (torch 2.13, SIGABRT). Only after
        # a clean finish: after a peer's failure, freeing it waits for the broken all-reduce (--pg-timeout-s).
        gc.collect()
    finally:
        cleanup()  # also after an error: leave the process group cleanly, the peers see this rank go


# ---------------------------------------------------------------------------------------------------------------
# Workbook instrumentation: not needed to train on a cluster.
# What the notebooks use to measure this script and to break it on purpose, each called from the loop above in
# one line: flag checks, the per-step metrics record (one JSON line per step per rank, whose keys the workbook's
# plots read), gradient and memory statistics, --save-grads-dir, and failure injection (--fail-*).
# ---------------------------------------------------------------------------------------------------------------

def add_workbook_flags(p):
    p.add_argument("--metrics-dir", type=str, default="metrics",
                   help="folder for rank<RANK>.jsonl (created if missing)")
    p.add_argument("--no-metrics", action="store_true",
                   help="write no per-step metrics (the benchmark measures what they cost)")
    p.add_argument("--save-grads-dir", type=str, default="",
                   help="if set, save each rank's gradients after the first backward to "
                        "<dir>/grads_rank<RANK>.pt (to compare DDP with one process)")
    p.add_argument("--step-delay-s", type=float, default=0.0,
                   help="extra sleep per step (seconds), to slow a demo down")
    p.add_argument("--init-scale", type=float, default=2.0 ** 16,
                   help="the scaler's first loss scale (unitless, > 0); too large a value overflows "
                        "and the first steps are skipped while the scale halves")
    p.add_argument("--loss-weight", type=float, default=1.0,
                   help="multiply the loss by this weight (unitless, > 0), as a weighted auxiliary loss "
                        "does; small weights make every gradient small, which is how fp16 gradients "
                        "underflow (AdamW itself is almost insensitive to the gradients' scale)")
    p.add_argument("--clip-before-unscale", action="store_true",
                   help="the mistake: clip the still-scaled gradients (their norm is scale times too "
                        "large, so clipping shrinks every step far too much)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="record this many steps with torch.profiler after 2 warm-up steps and write this rank's "
                        "Chrome trace to <metrics-dir>/trace_rank<RANK>.json (0: no profiler)")
    p.add_argument("--fail-rank", type=int, default=-1,
                   help="inject a failure on this global rank (-1: none)")
    p.add_argument("--fail-step", type=int, default=0, help="step at which the failure happens")
    p.add_argument("--fail-mode", choices=["raise", "hang", "skip-collective", "oom"], default="raise",
                   help="raise: RuntimeError on that rank; hang: that rank sleeps forever "
                        "while the others wait in the next collective; skip-collective: that rank skips "
                        "the loss all_reduce of that step, so the ranks' collectives no longer match; "
                        "oom: that rank allocates far more memory than the machine has (4x the RAM on "
                        "CPU, 2x the GPU's memory on CUDA) and fails with the allocator's error")


def check_args(p, args):
    """Refuse bad values before anything starts, naming the flag and the value (argparse exits with 2)."""
    for name in ("max_steps", "batch_size", "dataset_size", "input_dim", "hidden_dim", "output_dim", "log_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.bucket_cap_mb is not None and not args.bucket_cap_mb > 0:
        p.error(f"--bucket-cap-mb must be > 0 (MiB), got {args.bucket_cap_mb}")
    for name in ("pg_timeout_s", "init_scale", "loss_weight"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.profile_steps < 0 or (args.profile_steps and args.profile_steps + PROFILE_SKIP_STEPS > args.max_steps):
        p.error(f"--profile-steps {args.profile_steps} needs --max-steps >= {args.profile_steps + PROFILE_SKIP_STEPS} "
                f"(the first {PROFILE_SKIP_STEPS} steps are not recorded), got --max-steps {args.max_steps}")
    if args.clip_grad_norm < 0:
        p.error(f"--clip-grad-norm must be >= 0 (0: off), got {args.clip_grad_norm}")
    if args.no_optimize_ddp and not args.compile:
        p.error("--no-optimize-ddp changes how torch.compile splits the graph: it needs --compile")
    if args.clip_before_unscale and not args.clip_grad_norm:
        p.error("--clip-before-unscale needs --clip-grad-norm > 0")
    if args.batch_size > args.dataset_size:
        p.error(f"--batch-size {args.batch_size} is larger than --dataset-size {args.dataset_size}")
    device_type = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    if not autocast_supported(AMP_DTYPES[args.precision], device_type):
        p.error(f"--precision {args.precision}: torch {torch.__version__} has no {AMP_DTYPES[args.precision]} "
                f"autocast on {device_type}; use --precision fp32 or bf16, or run on a GPU")
    return args


def autocast_supported(dtype, device_type):
    """Whether this torch autocasts to ``dtype`` on ``device_type`` (an unsupported dtype only warns)."""
    if dtype is None:
        return True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast(device_type, dtype=dtype):
            return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == dtype


class StepRecorder:
    """This rank's metrics: one JSON line per step in ``<metrics-dir>/rank<RANK>.jsonl`` (unless --no-metrics).

    The keys are the workbook's contract with its plots and notebooks: step, max_steps, rank, local_rank,
    world_size, device, precision, loss_local, loss_global, step_time_s, samples_per_s, global_samples_per_s,
    elapsed_s, grad_scaler, loss_scale, step_skipped, optimizer_steps, grad_norm, grad_zero_fraction, and the
    memory fields of ``memory_fields``. A step's time runs from the end of the previous step, data loading included.
    """

    def __init__(self, args, rank, local_rank, world_size, device, model, optimizer, scaler):
        self.args, self.rank, self.device, self.model, self.optimizer, self.scaler = (
            args, rank, device, model, optimizer, scaler)
        self.static = {"max_steps": args.max_steps, "rank": rank, "local_rank": local_rank,
                       "world_size": world_size, "device": str(device), "precision": args.precision}
        self.applied_steps = 0  # optimizer.step() calls that really ran (the scaler skips inf/NaN steps)
        optimizer.register_step_post_hook(lambda *_: setattr(self, "applied_steps", self.applied_steps + 1))
        metrics_dir = Path(args.metrics_dir)
        metrics_dir.mkdir(parents=True, exist_ok=True)
        self.file = None if args.no_metrics else open(metrics_dir / f"rank{rank}.jsonl", "a", buffering=1)
        self.profiler = make_profiler(args, rank, device)  # None unless --profile-steps
        self.start = self.step_start = time.perf_counter()
        if rank == 0 and args.precision == "fp16" and device.type == "cpu":
            sys.stdout.write("note: fp16 on CPU has no fast kernels; this run shows fp16 numerics, not speed\n")

    def gradients(self, step):
        """After backward (and unscale_), before clipping: the gradients' norm and zeros, the scale they used."""
        if self.args.save_grads_dir and step == 1:
            save_grads(self.model, self.args.save_grads_dir, self.rank)
        self.grad_norm, self.grad_zero_fraction = grad_stats(self.model)
        self.loss_scale = self.scaler.get_scale()  # before update(): the scale this step's backward used
        self.steps_before = self.applied_steps

    def step_done(self, step, loss, loss_global):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # CUDA runs asynchronously: wait before reading the clock
        now = time.perf_counter()
        step_time_s, batch = now - self.step_start, self.args.batch_size
        if self.file is not None:
            self.file.write(json.dumps({
                "step": step, **self.static, "loss_local": loss.item(), "loss_global": loss_global.item(),
                "step_time_s": step_time_s, "samples_per_s": batch / step_time_s,
                "global_samples_per_s": self.static["world_size"] * batch / step_time_s,
                "elapsed_s": now - self.start, "grad_scaler": self.scaler.is_enabled(),
                "loss_scale": self.loss_scale, "step_skipped": self.applied_steps == self.steps_before,
                "optimizer_steps": self.applied_steps, "grad_norm": self.grad_norm,
                "grad_zero_fraction": self.grad_zero_fraction,
                **memory_fields(self.model, self.optimizer, self.device),
            }) + "\n")
        if self.args.step_delay_s:
            time.sleep(self.args.step_delay_s)
        if self.profiler is not None:
            self.profiler.step()  # the profiler's step boundary: its schedule counts these calls
        self.step_start = time.perf_counter()

    def close(self):
        if self.file is not None:
            self.file.close()
        if self.profiler is not None:
            self.profiler.stop()


PROFILE_SKIP_STEPS = 2  # --profile-steps: steps before the recorded ones (DDP rebuilds its buckets after step 1)


def make_profiler(args, rank, device):
    """--profile-steps N: a started torch.profiler that records steps 3..N+2 and then writes this rank's trace.

    Step 1 is skipped (DDP measures the order in which gradients become ready and rebuilds its buckets after
    it), step 2 is the profiler's warm-up (recorded, then thrown away: the profiler's own start-up cost lands
    there). The trace (<metrics-dir>/trace_rank<RANK>.json, Chrome trace format) opens in https://ui.perfetto.dev
    or chrome://tracing: forward, backward and optimizer ops on the main thread, DDP's bucket all-reduces on
    gloo's worker threads (``gloo:all_reduce``) or, on CUDA, NCCL's kernels on their own stream.
    """
    if not args.profile_steps:
        return None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)  # kernels on the GPU's streams, with their times
    trace_path = Path(args.metrics_dir) / f"trace_rank{rank}.json"
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=1, warmup=PROFILE_SKIP_STEPS - 1, active=args.profile_steps, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace_path)),
        record_shapes=True,  # each all-reduce's tensor shapes and dtype: the bytes it sent (notebook 08)
    )
    profiler.start()
    return profiler


def grad_stats(model):
    """(L2 norm of all gradients, fraction of gradient entries exactly zero) as floats.

    A fraction near 1 means the gradients underflowed: fp16's smallest value is about 6e-8 and anything
    below about 3e-8 rounds to 0, so that weight never learns. With fp32 almost no entry is exactly 0.
    """
    grads = [p.grad.detach().float() for p in model.parameters() if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    zeros = sum(int((g == 0).sum()) for g in grads)
    return norm.item(), zeros / sum(g.numel() for g in grads)


def save_grads(model, out_dir, rank):
    inner = model.module if isinstance(model, DDP) else model  # no "module." prefix in the names
    grads = {name: p.grad.detach().cpu().clone() for name, p in inner.named_parameters()}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    torch.save(grads, Path(out_dir) / f"grads_rank{rank}.pt")


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def memory_fields(model, optimizer, device):
    """Memory of this rank: exact tensor bytes, plus allocator peaks (CUDA) or process RSS (CPU)."""
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    fields = {
        "param_bytes": tensor_bytes(params),
        "grad_bytes": tensor_bytes(p.grad for p in params),
        "optimizer_state_bytes": tensor_bytes(state),
    }
    if device.type == "cuda":
        fields["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        fields["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    else:
        with open("/proc/self/statm") as f:  # Linux; fields are in pages
            fields["rss_bytes"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        fields["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return fields


def skips_collective(args, rank, step):
    """--fail-mode skip-collective: this rank skips --fail-step's loss all_reduce (like one under `if rank == 0:`)."""
    return args.fail_mode == "skip-collective" and rank == args.fail_rank and step == args.fail_step


def inject_failure(args, rank, step, device):
    if rank != args.fail_rank or step != args.fail_step:
        return
    if args.fail_mode == "raise":
        raise RuntimeError(f"injected failure on rank {rank} at step {step} (--fail-rank/--fail-step)")
    if args.fail_mode == "skip-collective":
        return  # the training loop skips this step's loss all_reduce on this rank (skips_collective)
    if args.fail_mode == "oom":
        allocate_too_much(rank, step, device)
    sys.stdout.write(f"rank {rank}: hanging at step {step} (--fail-mode hang)\n")
    sys.stdout.flush()
    while True:  # the other ranks now block in the next collective until --pg-timeout-s
        time.sleep(1)


def allocate_too_much(rank, step, device):
    """Fail the way a too-large batch or model does: ask the allocator for more than the device has.

    Nothing is caught: the allocator's error (torch.cuda.OutOfMemoryError, or on CPU "DefaultCPUAllocator:
    can't allocate memory") ends this rank, and @record reports it. The request is refused at once, before any
    page is touched, so the machine never runs short of memory.
    """
    if device.type == "cuda":
        size = 2 * torch.cuda.get_device_properties(device).total_memory
    else:
        size = 4 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        with open("/proc/sys/vm/overcommit_memory") as f:
            if f.read().strip() == "1":  # "always overcommit" would grant it: ask for more than the address space
                size = 2 ** 60
    sys.stdout.write(f"rank {rank}: allocating {size / 2**30:.0f} GiB at step {step} (--fail-mode oom)\n")
    sys.stdout.flush()
    return torch.empty(size, dtype=torch.uint8, device=device)


if __name__ == "__main__":
    main()
