"""The workbook's instruments for its lesson scripts: not needed to train, and not part of any lesson.

A workbook run writes this file beside the lesson it launches (``tl.write_script``); the lesson imports it only when
it is there (``try: import _workbook``), so a lesson copied alone to a cluster trains without it. What it adds,
each reached from the lesson in one line marked ``# workbook``:

* flags: ``--metrics-dir``/``--no-metrics``, ``--save-grads-dir``, ``--step-delay-s``, ``--profile-steps`` and the
  failures on purpose ``--fail-rank/--fail-step/--fail-mode`` (notebook 07);
* ``StepRecorder``: one JSON line per step per rank in ``<metrics-dir>/rank<RANK>.jsonl``, whose keys the workbook's
  plots read (``tutorial_lib.runs.metrics`` lists them), gradient and memory statistics, torch.profiler traces;
* ``memory_fields``: exact tensor bytes, plus allocator peaks (CUDA) or the process's RSS (CPU).

Only torch and the standard library, like the lessons.
"""

import hashlib
import json
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


def tensor_bytes(tensors):
    """The bytes ``tensors`` hold (``None`` entries count 0)."""
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


# --- ft_train.py (notebook 15) ----------------------------------------------------------------------------------
# What the workbook's checks read: one JSON line per step per group in <metrics-dir>/group<ID>.jsonl (appended: a
# restarted group adds its own lines, told apart by "pid"), and one "heal" line when the group received its state.
# In an HSDP group, rank R > 0 of the group writes group<ID>.rank<R>.jsonl, with the hash and size of its own shard.
# Each step line also says what crossed between the groups in that step, counted at the Manager (every all-reduce
# of torchft's DDP and of DiLoCo goes through manager.allreduce): the bytes of the tensors handed to it, and whether
# the step ended in a commit vote (manager.should_commit: DDP every step, DiLoCo at each sync).

def add_torchft_flags(p):
    """ft_train.py's flags for the workbook: where its records go, a pause per step, a death on purpose mid-heal."""
    p.add_argument("--metrics-dir", type=str, default="metrics",
                   help="folder for group<REPLICA_GROUP_ID>.jsonl, one line per step (created if missing)")
    p.add_argument("--step-delay-s", type=float, default=0.0,
                   help="sleep after each step (seconds), so a demo can kill a group mid-run")
    p.add_argument("--die-sending-state-if", type=str, default=None, metavar="PATH",
                   help="SIGKILL this rank when it is asked to send its state to a healing group while PATH exists: "
                        "a drill's trigger for a machine that dies in the middle of a heal")


def replica_group():
    """This replica group's id, from the variable ft_train.py reads too (set by whoever starts the groups)."""
    return int(os.environ.get("REPLICA_GROUP_ID", 0))


def local_part(t):
    """The part of ``t`` this rank holds: a DTensor's local shard (FSDP2, tensor parallel), or all of it."""
    return t.to_local() if hasattr(t, "to_local") else t


def weights_sha256(model):
    """SHA-256 of every parameter's bytes in order: two groups with equal hashes hold bitwise equal weights."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(local_part(p).detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class TorchftRecorder:
    """ft_train.py's records, one JSON line each (the comment above this section says which)."""

    def __init__(self, args, model, manager):
        self.args, self.model, self.group = args, model, replica_group()
        self.local_step, self.allreduce_bytes, self.sync_step = 0, 0, False
        allreduce, should_commit = manager.allreduce, manager.should_commit

        def counted_allreduce(tensor, *a, **kw):  # what torchft's DDP comm hook and DiLoCo call, per tensor
            self.allreduce_bytes += tensor.numel() * tensor.element_size()
            return allreduce(tensor, *a, **kw)

        def observed_should_commit(*a, **kw):
            self.sync_step = True
            return should_commit(*a, **kw)

        manager.allreduce, manager.should_commit = counted_allreduce, observed_should_commit  # on this instance only
        Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
        rank = int(os.environ.get("RANK", 0))
        self.file = open(Path(args.metrics_dir) / (f"group{self.group}.jsonl" if rank == 0 else
                                                   f"group{self.group}.rank{rank}.jsonl"), "a", buffering=1)
        self.params_local = sum(local_part(p).numel() for p in model.parameters())
        self.write({"event": "start"})

    def write(self, fields):
        # One write per line, so a reader never sees half a record (a SIGKILL may cut the last line off).
        self.file.write(json.dumps({"replica_group": self.group, "pid": os.getpid(), "time_s": time.time(),
                                    **fields}) + "\n")

    def healed(self, manager, source_group):
        # Called while the state is applied: the step is already the one the group joined at.
        self.write({"event": "heal", "step": manager.current_step(), "source_group": source_group})

    def sending_state(self, manager):
        self.write({"event": "send_state", "step": manager.current_step()})
        if self.args.die_sending_state_if and Path(self.args.die_sending_state_if).exists():
            self.write({"event": "killed_itself", "step": manager.current_step(), "why": "--die-sending-state-if"})
            os.kill(os.getpid(), signal.SIGKILL)  # no clean-up, no flush of anything else: a machine dying

    def step(self, manager, committed, loss):
        self.local_step += 1
        self.write({"event": "step", "step": manager.current_step(), "committed": committed,
                    "batches_committed": manager.batches_committed(), "participants": manager.num_participants(),
                    "loss_local": loss.item(), "weights_sha256": weights_sha256(self.model),
                    "local_step": self.local_step, "sync_step": self.sync_step,
                    "allreduce_bytes": self.allreduce_bytes, "params_local": self.params_local})
        self.allreduce_bytes, self.sync_step = 0, False
        if self.args.step_delay_s:
            time.sleep(self.args.step_delay_s)

    def close(self):
        self.file.close()


# --- one JSON file of results per rank (context_parallel_float8.py, tensor_parallel.py: notebook 12) -------------

def add_rank_json_flags(p, filename):
    """The lesson's flag for the workbook: ``--metrics-dir``, the folder of its ``filename`` (``RANK`` in it: this
    rank's number)."""
    p.add_argument("--metrics-dir", type=str, default="metrics", help=f"folder for {filename} (created)")


def write_rank_json(args, filename, result):
    """Write ``result``, every number of this rank's run, to ``<metrics-dir>/<filename>`` (RANK replaced by this
    rank's number), the file the notebooks read; return its path."""
    path = Path(args.metrics_dir) / filename.replace("RANK", str(int(os.environ.get("RANK", 0))))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return path
