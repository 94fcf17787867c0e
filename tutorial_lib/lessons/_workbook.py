"""The workbook's instruments for its lesson scripts: not needed to train, and not part of any lesson.

A workbook run writes this file beside the lesson it launches (``tl.write_script``); the lesson imports it only when
it is there (``try: import _workbook``), so a lesson copied alone to a cluster trains without it. What it adds,
each reached from the lesson in one line marked ``# workbook``:

* flags: ``--metrics-dir``/``--no-metrics``, ``--save-grads-dir``, ``--step-delay-s``, ``--profile-steps`` and the
  failures on purpose ``--fail-rank/--fail-step/--fail-mode`` (notebook 07);
* ``StepRecorder``: one JSON line per step per rank in ``<metrics-dir>/rank<RANK>.jsonl``, whose keys the workbook's
  plots read (``tutorial_lib.runs.metrics`` lists them), gradient and memory statistics, torch.profiler traces;
* ``memory_fields``: exact tensor bytes (a DTensor's: this rank's shard), plus allocator peaks (CUDA) or the
  process's RSS (CPU).

Those serve ``ddp_train.py``. Two sections at the end serve one lesson each: ``fsdp_train.py``'s sharded memory,
activations, FSDP units and collectives (``add_fsdp_flags``, ``FSDPStepRecorder``), and ``checkpoint_train.py``'s
saves, loads and failures on purpose (``add_checkpoint_flags``, ``CheckpointStepRecorder``).

Only torch and the standard library, like the lessons.
"""

import contextlib
import json
import math
import os
import resource
import signal
import sys
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

FAIL_MODES = ("raise", "hang", "skip-collective", "oom")
PROFILE_SKIP_STEPS = 2  # --profile-steps: steps before the recorded ones (DDP rebuilds its buckets after step 1)


def add_flags(p):
    """Add the workbook's flags to the lesson's ``argparse`` parser ``p``."""
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder of rank<RANK>.jsonl (made if missing)")
    p.add_argument("--no-metrics", action="store_true",
                   help="write no per-step metrics (the benchmark measures what they cost)")
    p.add_argument("--save-grads-dir", type=str, default="",
                   help="if set, save each rank's gradients after the first backward to "
                        "<dir>/grads_rank<RANK>.pt (to compare DDP with one process)")
    p.add_argument("--step-delay-s", type=float, default=0.0, help="extra sleep per step (s), to slow a demo")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="record this many steps with torch.profiler after 2 warm-up steps and write this rank's "
                        "Chrome trace to <metrics-dir>/trace_rank<RANK>.json (0: no profiler)")
    p.add_argument("--fail-rank", type=int, default=-1, help="inject a failure on this global rank (-1: none)")
    p.add_argument("--fail-step", type=int, default=0, help="step at which the failure happens")
    p.add_argument("--fail-mode", choices=FAIL_MODES, default="raise",
                   help="raise: RuntimeError on that rank; hang: that rank sleeps forever "
                        "while the others wait in the next collective; skip-collective: that rank skips "
                        "the loss all_reduce of that step, so the ranks' collectives no longer match; "
                        "oom: that rank allocates far more memory than the machine has (4x the RAM on "
                        "CPU, 2x the GPU's memory on CUDA) and fails with the allocator's error")


def check_flags(p, args):
    """Refuse bad values of the workbook's flags before anything starts (``p.error`` exits with 2)."""
    if args.step_delay_s < 0:
        p.error(f"--step-delay-s must be >= 0 (seconds), got {args.step_delay_s}")
    if args.profile_steps < 0 or (args.profile_steps and args.profile_steps + PROFILE_SKIP_STEPS > args.max_steps):
        p.error(f"--profile-steps {args.profile_steps} needs --max-steps >= {args.profile_steps + PROFILE_SKIP_STEPS} "
                f"(the first {PROFILE_SKIP_STEPS} steps are not recorded), got --max-steps {args.max_steps}")


class StepRecorder:
    """This rank's metrics: one JSON line per step in ``<metrics-dir>/rank<RANK>.jsonl`` (unless --no-metrics).

    The keys are the workbook's contract with its plots and notebooks: step, max_steps, rank, local_rank,
    world_size, device, precision, loss_local, loss_global, step_time_s, samples_per_s, global_samples_per_s,
    elapsed_s, grad_scaler, loss_scale, step_skipped, optimizer_steps, grad_norm, grad_zero_fraction, and the
    memory fields of ``memory_fields``. A step's time runs from the end of the previous step, data loading included.
    It also injects the --fail-* failure (``begin``) and runs --profile-steps' profiler.
    """

    def __init__(self, args, device, model, optimizer, scaler):
        rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))  # torchrun's
        world_size = int(os.environ.get("WORLD_SIZE", 1))
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

    def begin(self, step):
        """At the start of ``step``: the --fail-rank/--fail-step failure, a no-op by default."""
        inject_failure(self.args, self.rank, step, self.device)

    def skips_collective(self, step):
        """--fail-mode skip-collective: this rank skips --fail-step's loss all_reduce (as under ``if rank == 0``)."""
        args = self.args
        return args.fail_mode == "skip-collective" and self.rank == args.fail_rank and step == args.fail_step

    def gradients(self, step):
        """After backward (and unscale_), before clipping: the gradients' norm and zeros, the scale they used."""
        if self.args.save_grads_dir and step == 1:
            save_grads(self.model, self.args.save_grads_dir, self.rank)
        self.grad_norm, self.grad_zero_fraction = grad_stats(self.model)
        self.loss_scale = self.scaler.get_scale()  # before update(): the scale this step's backward used
        self.steps_before = self.applied_steps

    def step_done(self, step, loss, loss_global):
        """After the optimizer step: write the step's record; --step-delay-s; the profiler's step boundary."""
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


def make_profiler(args, rank, device):
    """--profile-steps N: a started torch.profiler that records steps 3..N+2 and then writes this rank's trace.

    Step 1 is skipped (DDP measures the order in which gradients become ready and rebuilds its buckets after
    it), step 2 is the profiler's warm-up (recorded, then thrown away: the profiler's own start-up cost lands
    there). The trace (<metrics-dir>/trace_rank<RANK>.json, Chrome trace format) opens in https://ui.perfetto.dev
    or chrome://tracing: forward, backward and optimizer ops on the main thread, DDP's bucket all-reduces on
    gloo's worker threads (``gloo:all_reduce``) or, on CUDA, NCCL's kernels on their own stream.
    See https://pytorch.org/docs/stable/profiler.html.
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
    """Save this rank's gradients, by parameter name, to ``<out_dir>/grads_rank<RANK>.pt``."""
    inner = model.module if isinstance(model, DDP) else model  # no "module." prefix in the names
    grads = {name: p.grad.detach().cpu().clone() for name, p in inner.named_parameters()}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    torch.save(grads, Path(out_dir) / f"grads_rank{rank}.pt")


def local(t):
    """This rank's part of a tensor: the local shard of a DTensor (FSDP2), the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def tensor_bytes(tensors):
    """The bytes ``tensors`` hold on this rank (a DTensor: its local shard; ``None`` entries count 0)."""
    return sum(local(t).numel() * local(t).element_size() for t in tensors if t is not None)


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


def inject_failure(args, rank, step, device):
    """--fail-rank/--fail-step/--fail-mode: fail this rank at this step on purpose (notebook 07)."""
    if rank != args.fail_rank or step != args.fail_step:
        return
    if args.fail_mode == "raise":
        raise RuntimeError(f"injected failure on rank {rank} at step {step} (--fail-rank/--fail-step)")
    if args.fail_mode == "skip-collective":
        return  # the training loop skips this step's loss all_reduce on this rank (StepRecorder.skips_collective)
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


# ---------------------------------------------------------------------------------------------------------------
# fsdp_train.py: sharded memory per rank, the bytes each forward keeps for backward, the blocks' forward calls, the
# FSDP units and the collectives each step runs (--count-collectives).
# ---------------------------------------------------------------------------------------------------------------

def add_fsdp_flags(p):
    """Add ``fsdp_train.py``'s workbook flags to its parser ``p``."""
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for rank<RANK>.jsonl (created)")
    p.add_argument("--count-collectives", action="store_true",
                   help="count each step's all-gathers, reduce-scatters and all-reduces with torch.profiler "
                        "(metric keys all_gather_calls, reduce_scatter_calls, all_reduce_calls)")


class FSDPStepRecorder:
    """``fsdp_train.py``'s measurements: ``<metrics-dir>/model_rank<RANK>.json`` once (the parameter shapes for the
    analytic memory model, the FSDP units), and one JSON line per step in ``<metrics-dir>/rank<RANK>.jsonl`` (the keys
    of ``row`` below, the workbook's contract with its notebooks)."""

    def __init__(self, args, rank, world_size, device, model, optimizer, scaler, shapes):
        self.args, self.rank, self.world_size, self.device = args, rank, world_size, device
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.activations = SavedActivations()
        self.block_forwards = 0  # forward calls of the blocks per step: checkpointing recomputes each one in backward
        for m in model.modules():
            if any(c.__name__ == "Block" for c in type(m).__mro__):  # the lesson's Block (FSDP2's FSDPBlock subclasses it)
                m.register_forward_pre_hook(self.count_block_forward)
        if args.activation_checkpointing:
            for m in model.modules():
                if type(m).__name__ == "CheckpointWrapper":
                    m.register_forward_pre_hook(self.activations.checkpoint_input)
        self.units = fsdp_units(model, args.strategy)
        metrics_dir = Path(args.metrics_dir)
        metrics_dir.mkdir(parents=True, exist_ok=True)
        (metrics_dir / f"model_rank{rank}.json").write_text(json.dumps({
            "rank": rank, "world_size": world_size, "strategy": args.strategy, "shapes": shapes,
            "n_params": sum(math.prod(s) for s in shapes.values()), "fsdp_units": len(self.units),
            "unit_params": self.units, "args": vars(args)}))
        self.file = open(metrics_dir / f"rank{rank}.jsonl", "a", buffering=1)
        self.collectives = CollectiveCounter(args.count_collectives)

    def count_block_forward(self, module, inputs):
        self.block_forwards += 1

    def step_start(self):
        self.collectives.start()  # --count-collectives: this step's forward, backward and optimizer step
        self.saved_bytes, self.zero_grads, self.block_forwards = 0, None, 0

    @contextlib.contextmanager
    def saved_activations(self):
        """Around one forward (and its loss): the largest bytes a forward of this step kept for backward."""
        with torch.autograd.graph.saved_tensors_hooks(self.activations.pack, lambda t: t):
            yield
        self.saved_bytes = max(self.saved_bytes, self.activations.take())

    def gradients(self):
        """After the last backward of the step, before the optimizer step: zeros (fp16) and the scale used."""
        if self.args.precision == "fp16":  # gradient elements that underflowed to exactly 0 (scaled ones, with a scaler)
            self.zero_grads = sum(int((local(p.grad) == 0).sum()) for p in self.model.parameters() if p.grad is not None)
        self.loss_scale = self.scaler.get_scale() if self.scaler else 1.0  # the scale this step's backward used

    def optimizer_done(self):
        self.collectives.stop()  # (the loss all-reduce after it is the workbook's, not training's)

    def step_done(self, step, loss_sum, loss_global, step_time_s):
        args = self.args
        row = {"step": step, "max_steps": args.max_steps, "rank": self.rank, "world_size": self.world_size,
               "device": str(self.device), "strategy": args.strategy, "precision": args.precision,
               "loss_local": loss_sum.item(), "loss_global": loss_global.item(), "step_time_s": step_time_s,
               "samples_per_s": args.batch_size * args.grad_accum_steps / step_time_s,
               "fsdp_units": len(self.units), "activation_bytes": self.saved_bytes, "block_forwards": self.block_forwards,
               "grad_scaler": self.scaler is not None, "loss_scale": self.loss_scale,
               **memory_fields(self.model, self.optimizer, self.device),
               "param_device": str(local(next(self.model.parameters())).device),  # cpu under --cpu-offload
               **self.collectives.counts}
        if self.zero_grads is not None:
            row["grad_zero_elements"] = self.zero_grads
        self.file.write(json.dumps(row) + "\n")

    def close(self):
        self.file.close()


def fsdp_units(model, strategy):
    """The FSDP units of a wrapped model: FSDP2, ``{unit: [the parameters it all-gathers]}`` (names as before
    checkpoint wrapping; a parameter belongs to the innermost unit that contains it, the rest to ``root``); FSDP1,
    one empty entry per unit (counted only); DDP, none."""
    if strategy == "ddp":
        return {}
    if strategy == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        return {f"unit{i}": [] for i in range(sum(isinstance(m, FSDP) for m in model.modules()))}
    from torch.distributed.fsdp import FSDPModule
    names = [name for name, m in model.named_modules() if isinstance(m, FSDPModule) and m is not model]
    prefixes = sorted((name + "." for name in names), key=len, reverse=True)
    membership = {}
    for name, _ in model.named_parameters():
        plain = name.replace("_checkpoint_wrapped_module.", "")
        unit = next((p[:-1] for p in prefixes if name.startswith(p)), "root").replace("._checkpoint_wrapped_module", "")
        membership.setdefault(unit.replace("_checkpoint_wrapped_module.", ""), []).append(plain)
    return membership


class SavedActivations:
    """Counts the bytes autograd keeps for backward during one forward: the activation memory.

    Every tensor saved for backward passes the pack hook; parameters (leaves that require grad, or views of
    them) are not activations and are skipped; storages are counted once. Inside a non-reentrant checkpoint
    the checkpoint's own hooks take over and nothing is saved, but each checkpointed block keeps its input
    for the recomputation: a forward pre-hook on the wrapper adds those bytes. Under DDP's autocast the bf16
    copies of the weights that matmuls save are counted too: they are memory held for backward.
    """

    def __init__(self):
        self.storages = {}

    def pack(self, t):
        base = t._base if t._base is not None else t
        if not (base.requires_grad and base.is_leaf):
            s = t.untyped_storage()
            self.storages[(s.data_ptr(), t.device)] = s.nbytes()
        return t

    def checkpoint_input(self, module, args):
        s = args[0].untyped_storage()
        self.storages[(s.data_ptr(), args[0].device)] = s.nbytes()

    def take(self):
        total, self.storages = sum(self.storages.values()), {}
        return total


class CollectiveCounter:
    """Counts the collectives between ``start()`` and ``stop()`` with torch.profiler, into ``counts``.

    Every c10d collective is a dispatcher op whatever the backend: ``c10d::_allgather_base_`` (an all-gather;
    ``c10d::allgather_`` for a list of outputs), ``c10d::_reduce_scatter_base_`` (a reduce-scatter),
    ``c10d::allreduce_`` (an all-reduce)."""

    OPS = {"c10d::_allgather_base_": "all_gather_calls", "c10d::allgather_": "all_gather_calls",  # FSDP1 on gloo
           "c10d::_reduce_scatter_base_": "reduce_scatter_calls",
           "c10d::allreduce_": "all_reduce_calls"}

    def __init__(self, enabled):
        self.enabled, self.counts, self.profiler = enabled, {}, None
        if enabled:  # torch 2.13's profiler logs each start and stop; 2.8's CUDA wheel without a GPU, an error
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")

    def start(self):
        if self.enabled:
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profiler.start()

    def stop(self):
        if self.enabled:
            self.profiler.stop()
            self.counts = dict.fromkeys(self.OPS.values(), 0)
            for event in self.profiler.events():
                if event.name in self.OPS:
                    self.counts[self.OPS[event.name]] += 1


# ---------------------------------------------------------------------------------------------------------------
# checkpoint_train.py: each save's and load's time and bytes per rank, the state a run loaded (--dump-loaded-state),
# the per-step record across elastic restarts, and failures on purpose (--fail-*: a raise, a SIGKILL inside a save).
# ---------------------------------------------------------------------------------------------------------------

CHECKPOINT_MARKER, FULL_FILE = "checkpoint.json", "model_optim.pt"  # checkpoint_train.py's COMPLETE_MARKER, FULL_FILE


def add_checkpoint_flags(p):
    """Add ``checkpoint_train.py``'s workbook flags to its parser ``p``."""
    p.add_argument("--metrics-dir", type=str, default="metrics",
                   help="folder for rank<RANK>.jsonl and checkpoint_rank<RANK>.json (created if missing)")
    p.add_argument("--dump-loaded-state", action="store_true",
                   help="after loading, write the full model and optimizer state to "
                        "<metrics-dir>/loaded_state.pt (rank 0) to compare round trips")
    p.add_argument("--fail-rank", type=int, default=-1,
                   help="inject a failure on this global rank, on the first attempt only (-1: none)")
    p.add_argument("--fail-step", type=int, default=0,
                   help="step at which the failure happens (raise: before the step; kill-during-save: "
                        "during the save after that step)")
    p.add_argument("--fail-mode", choices=["raise", "kill-during-save"], default="raise",
                   help="raise: RuntimeError; kill-during-save: SIGKILL after writing part of the checkpoint")


def check_checkpoint_flags(p, args):
    """Refuse a kill during a save that never happens (``p.error`` exits with 2)."""
    if args.fail_mode == "kill-during-save" and args.fail_rank >= 0 and (
            args.save_every == 0 or args.fail_step % args.save_every):
        p.error(f"--fail-step {args.fail_step} must be a multiple of --save-every {args.save_every} "
                "with --fail-mode kill-during-save (the kill happens inside that step's save)")


def attempt_number():
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))  # torchrun's restarts so far: 0 on the first attempt


def inject_checkpoint_failure(args, rank, step, where):
    """--fail-*, only on the first attempt (an elastic restart then succeeds): raise before the step
    (``inject_failure``'s RuntimeError), or kill-during-save: SIGKILL inside the save (``where`` = "save")."""
    if rank != args.fail_rank or step != args.fail_step or attempt_number() != 0:
        return
    if where == "step" and args.fail_mode == "raise":
        inject_failure(args, rank, step, None)
    if where == "save" and args.fail_mode == "kill-during-save":
        sys.stdout.write(f"rank {rank}: killed by SIGKILL in the middle of the step-{step} save\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handler: like an OOM kill or a node loss


class CheckpointStepRecorder:
    """``checkpoint_train.py``'s measurements: one JSON line per step in ``<metrics-dir>/rank<RANK>.jsonl`` and every
    save and load, with its time and bytes, in ``<metrics-dir>/checkpoint_rank<RANK>.json`` (appended to by every
    attempt). It also injects --fail-mode raise (``begin``)."""

    def __init__(self, args, rank, local_rank, world_size, device, model, optimizer):
        self.args, self.rank, self.world_size, self.device, self.model, self.optimizer = (
            args, rank, world_size, device, model, optimizer)
        self.static = {"max_steps": args.max_steps, "rank": rank, "local_rank": local_rank, "world_size": world_size,
                       "attempt": attempt_number()}
        self.resumed_from = 0  # the step of the checkpoint loaded (0: none)
        self.metrics_dir = Path(args.metrics_dir)
        self.metrics_dir.mkdir(parents=True, exist_ok=True)
        self.events_path = self.metrics_dir / f"checkpoint_rank{rank}.json"
        self.events = json.loads(self.events_path.read_text())["events"] if self.events_path.exists() else []  # earlier attempts
        self.file = open(self.metrics_dir / f"rank{rank}.jsonl", "a", buffering=1)  # append: restarts add lines

    def begin(self, step):
        """At the start of ``step``: --fail-mode raise, a no-op by default."""
        inject_checkpoint_failure(self.args, self.rank, step, "step")

    @contextlib.contextmanager
    def checkpoint_event(self, event, path=None, step=None):
        """Around one save (``step``) or load (``path``): its wall time on this rank, barriers included, and the bytes
        this rank wrote (its files in the step folder) or needed (its shards or whole tensors, plus the metadata)."""
        start = time.perf_counter()
        yield
        time_s = time.perf_counter() - start
        if event == "save":
            self.log_event({"event": "save", "step": step, "format": self.args.format, "attempt": attempt_number(),
                            "time_s": time_s, "bytes": self.bytes_written(Path(self.args.checkpoint_dir) / f"step-{step}")})
            return
        path = Path(path)
        marker = json.loads((path / CHECKPOINT_MARKER).read_text())
        self.resumed_from = marker["step"]
        if marker["format"] == "dcp":
            from torch.distributed.checkpoint.state_dict import get_state_dict
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            read = state_bytes({"model": model_sd, "optim": optim_sd}) + (path / ".metadata").stat().st_size
        else:
            read = (path / FULL_FILE).stat().st_size if self.rank == 0 else 0
        own = path / f"extra_rank{self.rank}.pt"
        read += (own if own.exists() else path / "extra_rank0.pt").stat().st_size
        self.log_event({"event": "load", "step": marker["step"], "format": marker["format"], "attempt": attempt_number(),
                        "saved_world_size": marker["world_size"], "time_s": time_s, "bytes": read, "path": str(path)})

    def bytes_written(self, folder):
        """Bytes of the files this rank wrote into the step folder: its own state, its shards; rank 0 also the
        metadata (DCP) or the full file (the marker is not counted)."""
        names = [f"extra_rank{self.rank}.pt"] + [p.name for p in folder.glob(f"__{self.rank}_*.distcp")]
        if self.rank == 0:
            names += [".metadata"] if self.args.format == "dcp" else [FULL_FILE]
        return sum((folder / name).stat().st_size for name in names)

    def log_event(self, event):
        self.events.append(event)
        self.events_path.write_text(json.dumps({"rank": self.rank, "world_size": self.world_size, "events": self.events}))

    def dump_loaded_state(self):
        """--dump-loaded-state: the full model and optimizer state right after the load, written by rank 0 (every rank
        must call this: gathering a full state dict is a collective under FSDP)."""
        if self.args.dump_loaded_state:
            from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                                 get_optimizer_state_dict)
            full = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered, on rank 0's CPU only
            model_sd = get_model_state_dict(self.model, options=full)
            optim_sd = get_optimizer_state_dict(self.model, self.optimizer, options=full)
            if self.rank == 0:
                torch.save({"model": model_sd, "optim": optim_sd}, self.metrics_dir / "loaded_state.pt")

    def step_done(self, step, loss, loss_global, lr, epoch, step_time_s):
        self.file.write(json.dumps({
            "step": step, **self.static, "resumed_from_step": self.resumed_from,
            "loss_local": loss.item(), "loss_global": loss_global.item(), "lr": lr,
            "epoch": epoch, "step_time_s": step_time_s, **memory_fields(self.model, self.optimizer, self.device),
        }) + "\n")

    def close(self):
        self.file.close()


def state_bytes(state):
    """Tensor bytes held by this rank in a (nested) state dict; a DTensor counts its local shard."""
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return tensor_bytes([state]) if torch.is_tensor(state) else 0
