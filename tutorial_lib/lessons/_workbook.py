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

Those serve ``ddp_train.py``. The sections after them serve one lesson each: ``ft_train.py``'s per-group records
(notebook 15), one JSON file of results per rank (``context_parallel_float8.py``, ``tensor_parallel.py``: notebook
12) and tensor parallelism's collectives, activations and comparisons, ``fsdp_train.py``'s sharded memory,
activations, FSDP units and collectives (``add_fsdp_flags``, ``FSDPStepRecorder``), ``checkpoint_train.py``'s
saves, loads and failures on purpose (``add_checkpoint_flags``, ``CheckpointStepRecorder``),
``pipeline_parallel.py``'s stage timelines, saved bytes and p2p transfers (``PipelineRecorder``), ``train_lm.py``'s
tokens/s, MFU, save timings and memory tracker (``add_lm_flags``, ``LMStepRecorder``, ``make_tracker``), and
``train_hf.py``'s per-step record and memory tracker (``add_hf_flags``, ``HFStepRecorder``).

Only torch and the standard library, like the lessons.
"""

import collections
import contextlib
import hashlib
import json
import math
import os
import re
import resource
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
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
    """This rank's part of a tensor: a DTensor's local shard (FSDP2, tensor parallel), the tensor itself otherwise."""
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


def weights_sha256(model):
    """SHA-256 of every parameter's bytes in order: two groups with equal hashes hold bitwise equal weights."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(local(p).detach().cpu().contiguous().numpy().tobytes())
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
        self.params_local = sum(local(p).numel() for p in model.parameters())
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
    """The lesson's flag for the workbook: ``--metrics-dir``, the folder of its ``filename`` (``<RANK>``: this rank's
    number)."""
    p.add_argument("--metrics-dir", type=str, default="metrics", help=f"folder for {filename} (created)")


def write_rank_json(args, filename, result):
    """Write ``result``, every number of this rank's run, to ``<metrics-dir>/<filename>`` (``<RANK>`` replaced by this
    rank's number), the file the notebooks read; return its path."""
    path = Path(args.metrics_dir) / filename.replace("<RANK>", os.environ.get("RANK", "0"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return path


# --- tensor_parallel.py (notebook 12) ---------------------------------------------------------------------------
# What notebook 12 reads of the tensor-parallel lessons besides the losses they compare with one process: collective
# counts (torch.profiler), which process group ran each (a TorchDispatchMode), the activation bytes autograd saves for
# backward (saved_tensors_hooks), who holds which rows of a weight, the differences from one process, --track-memory
# (torch's MemTracker over step 2 of the model lesson, which tutorial_lib's plan_tp_memory predicts), and the
# fused-qkv control. Each rank's record is <metrics-dir>/tp_rank<RANK>.json (write_rank_json).

def add_tp_flags(p):
    """tensor_parallel.py's flags for the workbook."""
    add_rank_json_flags(p, "tp_rank<RANK>.json")
    p.add_argument("--track-memory", action="store_true",
                   help="model lesson: run step 2 under torch's memory tracker (MemTracker) and record its peak by "
                        "category (bytes) in the step's memory_peak")


def check_tp_flags(p, args):
    if args.track_memory and "model" not in args.lessons:
        p.error("--track-memory tracks step 2 of the model lesson: add model to --lessons")


@contextlib.contextmanager
def tp_block_pass(block, phase):
    """The forward or backward ``phase`` of ``run_block``: fills the dict with {phase: collective counts} and, for the
    forward, "activation_bytes" per module, when it exits."""
    out, saved = {}, SavedByModule(block)
    with count_collectives() as counts, saved.recording() if phase == "forward" else contextlib.nullcontext():
        yield out
    out[phase] = counts
    if phase == "forward":
        out["activation_bytes"] = dict(saved.by_module)


def tp_block_records(one, runs, fresh_block, mesh, x):
    """The block lesson's record: each run ``(block, run)`` of ``runs`` summarised and compared with ``one``, the TP
    block's shards, and the fused-qkv control on ``fresh_block``."""
    out = {"one_process": summary_of(one), "shapes": {}}
    for label, (block, run) in runs.items():
        out[label] = {**summary_of(run), **compare(run, one)}
        if label == "TP":
            out["shapes"] = {name: {"global": list(p.shape), "local": list(local(p).shape),
                                    "placements": [placement_name(q) for q in getattr(p, "placements", [])]}
                             for name, p in block.named_parameters()}
    out["fused qkv, ColwiseParallel (wrong)"] = fused_qkv_control(fresh_block, mesh, x, one["output"])
    return out


def tp_sequence_record(run, reference, one, block):
    """The sequence lesson's record: this rank's slice against the same slice of one process."""
    return {"SP": {**summary_of(run), **compare(run, reference)}, "one_process": summary_of(one),
            "norm_grad_placements": [placement_name(q) for q in getattr(block.norm1.weight.grad, "placements", [])]}


@contextlib.contextmanager
def tp_model_step(args, step, model, optimizer):
    """One step of the model lesson: fills the dict with its activation bytes, its collectives (step 1) and
    --track-memory's peak (step 2) when it exits."""
    record, saved = {}, SavedByModule(model)
    with count_collectives(enabled=step == 1) as counts, saved.recording(), \
            tracking_memory(args, step, model, optimizer) as memory:
        yield record
    record.update({"activation_bytes": saved.total(), **({"collectives": counts} if step == 1 else {}),
                   **({"memory_peak": memory} if memory else {})})


def tp_model_record(model, reference, logits):
    """The model lesson's record of one layout beside its steps: the logits' shards and the parameter bytes."""
    return {"logits_local_shape": list(local(logits).shape),
            "logits_placements": [placement_name(q) for q in logits.placements],
            "param_bytes": sum(local(p).numel() * local(p).element_size() for p in model.parameters()),
            "param_bytes_one_process": sum(p.numel() * p.element_size() for p in reference.parameters())}


HOLDINGS = ("blocks.0.attn.wq.weight", "blocks.0.attn.wo.weight", "blocks.0.mlp.fc2.bias", "blocks.0.norm1.weight",
            "embed.tok.weight", "head.weight")  # the parameters whose rows and columns the 2d lesson locates


def tp_2d_holdings(model, reference):
    """Before training: which rows (and columns) of ``HOLDINGS``' parameters this rank holds, and their layouts."""
    return {"holdings": {name: held_block(local(p), dict(reference.named_parameters())[name])
                         for name, p in model.named_parameters() if name in HOLDINGS},
            "placements": {name: [placement_name(q) for q in p.placements] for name, p in model.named_parameters()
                           if name in HOLDINGS}}


@contextlib.contextmanager
def tp_2d_step(step):
    """One step of the 2d lesson: fills the dict with its collectives (step 1) and their groups (step 2)."""
    record = {}
    with count_collectives(enabled=step == 1) as counts, collective_groups(enabled=step == 2) as groups:
        yield record
    record.update({**({"collectives": counts} if step == 1 else {}),
                   **({"collectives_by_group": groups} if step == 2 else {})})


def tp_2d_record(mesh, dp_rank, holdings, steps, model, reference):
    """The 2d lesson's record: the mesh, this rank's groups and holdings, the steps and the parameter bytes."""
    return {"mesh_shape": list(mesh.shape), "mesh_coordinate": mesh.get_coordinate(), "dp_rank": dp_rank,
            "tp_group": dist.get_process_group_ranks(mesh["tp"].get_group()),
            "dp_group": dist.get_process_group_ranks(mesh["dp"].get_group()), **holdings, "steps": steps,
            "param_bytes": sum(local(p).numel() * local(p).element_size() for p in model.parameters()),
            "param_bytes_one_process": sum(p.numel() * p.element_size() for p in reference.parameters())}


@contextlib.contextmanager
def tracking_memory(args, step, model, optimizer):
    """--track-memory: torch's ``MemTracker`` over step 2 (step 1 creates the optimizer's state and DTensor's sharding
    caches); the dict is filled with the tracker's peak, {category: bytes} of this rank's device, when it exits."""
    peak = {}
    if not (args.track_memory and step == 2):
        yield peak
        return
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(model, optimizer)  # now: the parameters and the optimizer's state as they are
    with tracker:
        yield peak
    snapshot = next(iter(tracker.get_tracker_snapshot("peak").values()))
    peak.update({getattr(k, "name", str(k)): int(v) for k, v in snapshot.items()})


def summary_of(run):
    return {"collectives_forward": run["forward"], "collectives_backward": run["backward"],
            "activation_bytes": run["activation_bytes"], "output_max_abs": run["output"].abs().max().item()}


def compare(run, reference):
    """Largest differences from the one-process run: output, input gradient, each parameter's gradient, and the
    largest magnitudes they are relative to."""
    grads = {n: (g - reference["grads"][n]).abs().max().item() for n, g in run["grads"].items()}
    return {"output_max_abs_diff": (run["output"] - reference["output"]).abs().max().item(),
            "input_grad_max_abs_diff": (run["input_grad"] - reference["input_grad"]).abs().max().item(),
            "param_grad_max_abs_diff": max(grads.values()), "param_grad_max_abs_diff_by_name": grads,
            "param_grad_max_abs": max(g.abs().max().item() for g in reference["grads"].values()),
            "input_grad_max_abs": reference["input_grad"].abs().max().item()}


class FusedAttention(nn.Module):
    """nanoGPT's attention: one Linear makes q, k and v, laid out [q | k | v] along its output features."""

    def __init__(self, dim, n_heads):
        super().__init__()
        self.head_dim = dim // n_heads
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in self.c_attn(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, -1))


def fused_qkv_control(block, mesh, x, reference_output):
    """``block`` (a fresh tensor_parallel.py Block) with a fused qkv Linear, split by ColwiseParallel like q, k, v:
    rank 0 gets [q | first half of k] (for 2 ranks), so its "k" and "v" are not k and v. Returns the output's
    distance from the unsplit model's."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    fused = FusedAttention(block.attn.wq.in_features, block.attn.wq.out_features // block.attn.head_dim
                           ).to(block.attn.wq.weight.device)
    with torch.no_grad():  # the same q, k, v and output weights as the reference, fused
        fused.c_attn.weight.copy_(torch.cat([block.attn.wq.weight, block.attn.wk.weight, block.attn.wv.weight]))
        fused.c_attn.bias.copy_(torch.cat([block.attn.wq.bias, block.attn.wk.bias, block.attn.wv.bias]))
        fused.c_proj.load_state_dict(block.attn.wo.state_dict())
    block.attn = fused
    unsplit = block(x).detach()  # fused but whole: the same function as the reference
    parallelize_module(block, mesh, {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
                                     "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
    with torch.no_grad():
        output = block(x)
    return {"unsplit_max_abs_diff": (unsplit - reference_output).abs().max().item(),
            "output_max_abs_diff": (output - reference_output).abs().max().item()}


def placement_name(placement):
    """``Shard(0)``, ``Replicate()``, ``Partial()`` (or ``_StridedShard(0)``): a DTensor's layout on one mesh dim."""
    name = type(placement).__name__
    if name == "_StridedShard":
        return f"_StridedShard({placement.dim})"
    if placement.is_shard():
        return f"Shard({placement.dim})"
    return "Replicate()" if placement.is_replicate() else "Partial()"


def held_block(shard, full):
    """Which rows (and columns) of ``full`` this rank's ``shard`` is, found by comparing values: [[row0, row1],
    [col0, col1]] (half-open), or None when the shard is no contiguous block of ``full``."""
    full = full.detach()
    shard = shard.detach().reshape(-1, 1) if full.dim() == 1 else shard.detach()
    full2 = full.reshape(-1, 1) if full.dim() == 1 else full
    h, w = shard.shape
    for r in range(0, full2.shape[0] - h + 1, max(h, 1)):
        for c in range(0, full2.shape[1] - w + 1, max(w, 1)):
            if torch.equal(full2[r:r + h, c:c + w], shard):
                return [[r, r + h], [c, c + w]]
    return None


COLLECTIVES = {"c10d::allreduce_": "all_reduce",  # each c10d collective is one dispatcher op on every backend
               "c10d::allgather_into_tensor_coalesced_": "all_gather", "c10d::_allgather_base_": "all_gather",
               "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
               "c10d::_reduce_scatter_base_": "reduce_scatter"}


@contextlib.contextmanager
def count_collectives(enabled=True):
    """Count the collectives issued inside the block with torch.profiler; the dict is filled when it exits."""
    counts = {name: 0 for name in dict.fromkeys(COLLECTIVES.values())}
    if not enabled:
        yield counts
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        yield counts
    for event in prof.events():
        if event.name in COLLECTIVES:
            counts[COLLECTIVES[event.name]] += 1


@contextlib.contextmanager
def collective_groups(enabled=True):
    """Which process group ran each collective inside the block: {"all_reduce [0, 1]": calls, ...}.

    A ``TorchDispatchMode`` sees every op called from Python with its arguments: DTensor's functional
    collectives name their group (``group_name``), FSDP2's c10d ops carry the ProcessGroup itself. (Not run with
    the profiler: on torch 2.13 an op the mode intercepts shows up twice in the profile.)"""
    from torch.distributed.distributed_c10d import _resolve_process_group
    from torch.utils._python_dispatch import TorchDispatchMode
    kinds = {"all_reduce": "all_reduce", "allreduce_": "all_reduce", "all_gather_into_tensor": "all_gather",
             "_allgather_base_": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
             "_reduce_scatter_base_": "reduce_scatter"}
    found = collections.Counter()

    class Groups(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kind = kinds.get(func.__name__.split(".")[0]) if func.namespace in ("c10d", "_c10d_functional") else None
            if kind:
                names = [a for a in args if isinstance(a, str)]  # functional: (..., reduce_op, [size,] group_name)
                pg = (_resolve_process_group(names[-1]) if names else
                      dist.ProcessGroup.unbox(next(a for a in args if type(a).__name__ == "ScriptObject")))
                found[f"{kind} {dist.get_process_group_ranks(pg)}"] += 1
            return func(*args, **(kwargs or {}))

    out = {}
    if not enabled:
        yield out
        return
    with Groups():
        yield out
    out.update(sorted(found.items()))


class SavedByModule:
    """Bytes autograd saves for backward while ``recording()``, per module (the innermost one running).

    Parameters (and views of them, like a Linear's transposed weight) are not activations: a saved tensor whose
    storage is a parameter's is skipped. A tensor saved twice (a Linear input also saved by the next op) counts once.
    """

    def __init__(self, model):
        self.model, self.stack, self.seen = model, ["(top)"], set()
        self.by_module = collections.Counter()
        self.params = {local(p).untyped_storage().data_ptr() for p in model.parameters()}

    def pack(self, t):
        lt = local(t)
        key = (lt.data_ptr(), lt.numel())
        if lt.untyped_storage().data_ptr() not in self.params and key not in self.seen:
            self.seen.add(key)
            self.by_module[self.stack[-1]] += lt.numel() * lt.element_size()
        return t

    def enter(self, name):
        self.stack.append(name)  # (returns None: a hook's return value would replace the module's input or output)

    def leave(self):
        self.stack.pop()

    @contextlib.contextmanager
    def recording(self):
        handles = []
        for name, module in self.model.named_modules():
            if name:
                handles.append(module.register_forward_pre_hook(lambda m, a, name=name: self.enter(name)))
                handles.append(module.register_forward_hook(lambda m, a, o: self.leave()))
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
                yield self
        finally:
            for handle in handles:
                handle.remove()

    def total(self):
        return sum(self.by_module.values())


# ---------------------------------------------------------------------------------------------------------------
# fsdp_train.py: sharded memory per rank, the bytes each forward keeps for backward, the blocks' forward calls and
# the FSDP units (the collectives each rank issues: the launch's observer, observe=True).
# ---------------------------------------------------------------------------------------------------------------

def add_fsdp_flags(p):
    """Add ``fsdp_train.py``'s workbook flags to its parser ``p``."""
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for rank<RANK>.jsonl (created)")


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

    def count_block_forward(self, module, inputs):
        self.block_forwards += 1

    def step_start(self):
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

    def step_done(self, step, loss_sum, loss_global, step_time_s):
        args = self.args
        row = {"step": step, "max_steps": args.max_steps, "rank": self.rank, "world_size": self.world_size,
               "device": str(self.device), "strategy": args.strategy, "precision": args.precision,
               "loss_local": loss_sum.item(), "loss_global": loss_global.item(), "step_time_s": step_time_s,
               "samples_per_s": args.batch_size * args.grad_accum_steps / step_time_s,
               "fsdp_units": len(self.units), "activation_bytes": self.saved_bytes, "block_forwards": self.block_forwards,
               "grad_scaler": self.scaler is not None, "loss_scale": self.loss_scale,
               **memory_fields(self.model, self.optimizer, self.device),
               "param_device": str(local(next(self.model.parameters())).device)}  # cpu under --cpu-offload
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


# ---------------------------------------------------------------------------------------------------------------
# pipeline_parallel.py (notebook 12): for each configuration (a schedule and m micro-batches, or one by hand), each
# forward and backward this stage ran, in order, with its start and end (the machine's monotonic clock, which every
# process on one machine shares) and the bytes held saved for backward after it; the schedule's own plan
# (pipeline_order); the step's p2p sends and receives (torch.profiler); its loss and gradients against the unsplit
# model's. Also the control (scale_grads=False) and whether torch accepts one micro-batch per schedule. Each rank's
# record is <metrics-dir>/pp_rank<RANK>.json (write_rank_json), read by tutorial_lib.runs.pipeline.
# ---------------------------------------------------------------------------------------------------------------

class PipelineRecorder:
    """``pipeline_parallel.py``'s records for this rank's stage (the comment above this section says which)."""

    def __init__(self, args, device, model, stage_module):
        """``model``: the unsplit model after its backward on the whole batch (its gradients are the reference);
        ``stage_module``: the part of it this rank's stage runs."""
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # torch.profiler: quiet on start and stop (2.13), no GPU (2.8)
        self.args, self.device, self.stage_module = args, device, stage_module
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.reference = {n: p.grad for n, p in model.named_parameters()}
        owned = {id(p) for p in stage_module.parameters()}
        self.names = [n for n, p in model.named_parameters() if id(p) in owned]  # this stage's, by the model's names
        self.runs, self.control = [], None

    def configuration(self, module):
        """A new configuration, whose stage runs ``module``: nothing recorded yet."""
        self.live, self.events, self.order, self.p2p = LiveSavedBytes(module), [], None, None

    @contextlib.contextmanager
    def action(self, kind, microbatch):
        """Around one forward ("F": saved tensors counted) or backward ("B") of ``microbatch``: one event."""
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

    def watch(self, stage, schedule):
        """Record each micro-batch's forward and backward that ``schedule`` runs on ``stage`` (a ``PipelineStage``:
        its ``forward_one_chunk`` and ``backward_one_chunk``, on this instance only), and keep the schedule's plan."""
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

        def recorded_forward(fwd_chunk_id, *args, **kwargs):
            with self.action("F", fwd_chunk_id):
                return forward(fwd_chunk_id, *args, **kwargs)

        def recorded_backward(bwd_chunk_id, *args, **kwargs):
            with self.action("B", bwd_chunk_id):
                return backward(bwd_chunk_id, *args, **kwargs)

        stage.forward_one_chunk, stage.backward_one_chunk = recorded_forward, recorded_backward
        self.order = schedule_order(schedule, self.rank)

    @contextlib.contextmanager
    def measured_step(self):
        """Around the step that counts: the events before it are dropped, its p2p transfers counted."""
        self.events, self.live.peak = [], self.live.live
        with count_p2p() as p2p:
            yield
        self.p2p = p2p

    def configuration_done(self, label, n_micro, model, losses, scale_grads=True):
        """Keep the configuration's record: its events, peak saved bytes, plan, p2p counts, loss (the mean of the
        micro-batch losses, last stage) and ``model``'s gradients against the unsplit model's; with
        ``scale_grads=False``, the control's comparison only."""
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        compared = compare_with_unsplit(grads, self.reference, self.names)
        if not scale_grads:
            self.control = {"microbatches": n_micro, **compared}
            return
        self.runs.append({"schedule": label, "microbatches": n_micro, "scale_grads": scale_grads,
                          "events": self.events, "peak_saved_bytes": self.live.peak, "schedule_order": self.order,
                          "p2p": self.p2p, "loss": torch.stack(losses).mean().item() if losses else None, **compared})

    def write(self, loss_unsplit, schedules):
        """Write this rank's record, ``pp_rank<RANK>.json``; ``schedules``: {name: schedule class}. Returns its path."""
        from torch.distributed.pipelining import PipelineStage

        def accepted(schedule_cls):  # built with one micro-batch, not run
            stage = PipelineStage(self.stage_module, self.rank, self.world_size, self.device)
            try:
                schedule_cls(stage, 1, loss_fn=F.mse_loss)
                return "accepted"
            except ValueError as e:
                return f"ValueError: {e}"

        return write_rank_json(self.args, "pp_rank<RANK>.json", {
            "rank": self.rank, "world_size": self.world_size, "stage": self.rank, "num_stages": self.world_size,
            "torch": torch.__version__, "device": str(self.device), "args": vars(self.args),
            "loss_unsplit": loss_unsplit, "runs": self.runs, "control_scale_grads_false": self.control,
            "one_microbatch_accepted": {name: accepted(cls) for name, cls in schedules.items()},
            "param_bytes": tensor_bytes(self.stage_module.parameters())})


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


def compare_with_unsplit(grads, reference, names):
    """Max |gradient - the unsplit model's| over this stage's parameters ``names``, the largest |gradient| of the
    unsplit model, and the gradients' norm ratio to the unsplit model's."""
    diffs = {n: (grads[n] - reference[n]).abs().max().item() for n in names}
    norm = sum(grads[n].norm().item() ** 2 for n in names) ** 0.5
    ref_norm = sum(reference[n].norm().item() ** 2 for n in names) ** 0.5
    return {"grad_max_abs_diff": max(diffs.values()),
            "grad_max_abs": max(reference[n].abs().max().item() for n in names),
            "grad_norm_ratio": norm / ref_norm}


# ---------------------------------------------------------------------------------------------------------------
# train_lm.py (notebook 11): its per-step record (tokens/s, model FLOPs utilisation, memory), save timings, the windows
# each step read (--log-windows), the generated sample, and --track-memory (torch's memory tracker on the second step).
# ---------------------------------------------------------------------------------------------------------------

# Dense bf16 (= fp16) tensor-core peak with FP32 accumulate, and plain fp32 peak, TFLOPS, by device name; the
# datasheets' boost clock figures. RTX 4090 D: 114 SMs to the 4090's 128 (147.1 vs 165.2 bf16). The longest name is
# matched first.
PEAK_TFLOPS = {"H200": (989.4, 66.9), "H100 PCIe": (756.0, 51.2), "H100": (989.4, 66.9), "A100": (312.0, 19.5),
               "RTX 4090 D": (147.1, 73.5), "RTX 4090": (165.2, 82.6)}
# What a train_lm.py run writes in --metrics-dir, per rank: a new run removes an earlier run's (start_afresh).
LM_RUN_FILE = re.compile(r"(?:(?:data|memory|checkpoint|windows|model|sample)_)?rank(\d+)\.jsonl?")


def add_lm_flags(p):
    """Add ``train_lm.py``'s workbook flags to its parser ``p``."""
    p.add_argument("--metrics-dir", type=str, default="metrics",
                   help="folder for rank<RANK>.jsonl (created; a new run replaces what an earlier run left there)")
    p.add_argument("--log-windows", action="store_true",
                   help="write the indices of the training windows every step read to "
                        "<metrics-dir>/windows_rank<RANK>.json")
    p.add_argument("--track-memory", action="store_true",
                   help="run the second step under torch's memory tracker (FSDPMemTracker under fsdp/hsdp, else "
                        "MemTracker) and write its peak by category to <metrics-dir>/memory_rank<RANK>.json")


def check_lm_flags(p, args):
    """Refuse a --track-memory run that never reaches the tracked step (``p.error`` exits with 2)."""
    if args.track_memory and (min(args.max_steps, args.stop_at_step or args.max_steps) < 2
                              or args.grad_accum_steps != 1):
        p.error("--track-memory tracks the second step (of one micro-batch): it needs --max-steps >= 2 and "
                "--grad-accum-steps 1")


def model_flops_per_token(cfg, n_params):
    """Training FLOPs per token: 6 per parameter (forward 2, backward 4) plus attention's 6 * 2 * layers * d * T
    (the PaLM paper's appendix B; nanoGPT's estimate_mfu). Embedding tables do no matmul: left out."""
    n_matmul = n_params - cfg.vocab_size * cfg.d_model - cfg.block_size * cfg.d_model
    return 6 * n_matmul + 12 * cfg.n_layers * cfg.d_model * cfg.block_size


def peak_flops(device_name, dtype):
    """Peak FLOP/s for ``dtype`` of the device called ``device_name`` (torch.cuda.get_device_name), from
    PEAK_TFLOPS, or None (a CPU, or a GPU not in the table). "NVIDIA GeForce RTX 4090 D" is a 4090 D, not a 4090."""
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key in (device_name or ""):
            return PEAK_TFLOPS[key][0 if dtype in (torch.bfloat16, torch.float16) else 1] * 1e12
    return None


def start_afresh(metrics_dir, rank, world_size):
    """Remove what an earlier run left in ``metrics_dir``: this rank's files, and (rank 0) those of ranks this run
    does not have. Otherwise a learner's second ``python train_lm.py`` in one folder appends its steps to the first
    run's lines. A torchrun restart (TORCHELASTIC_RESTART_COUNT > 0) continues its run and keeps them. The launcher
    gives every launch a folder of its own, so there is nothing to remove under it."""
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    for path in metrics_dir.iterdir():
        m = LM_RUN_FILE.fullmatch(path.name)
        if m and (int(m[1]) == rank or (rank == 0 and int(m[1]) >= world_size)):
            path.unlink(missing_ok=True)


class LMStepRecorder:
    """``train_lm.py``'s metrics: one JSON line per step in ``<metrics-dir>/rank<RANK>.jsonl``, and once per run
    ``model_rank0.json`` (parameters, FLOPs per token, the device's peak) and ``data_rank<RANK>.json`` (the corpus this
    rank read, by hash); rank 0 prints where they are. Keys: tutorial_lib/runs/metrics.py's schema.

    ``dtype`` is the run's compute dtype; the model's ``cfg`` (its ``GPTConfig``) gives the FLOPs per token."""

    def __init__(self, args, rank, local_rank, world_size, device, model, optimizer, data, resumed_from, dtype):
        self.args, self.rank, self.device, self.model, self.optimizer = args, rank, device, model, optimizer
        self.metrics_dir = Path(args.metrics_dir)
        self.metrics_dir.mkdir(parents=True, exist_ok=True)
        start_afresh(self.metrics_dir, rank, world_size)
        self.file = open(self.metrics_dir / f"rank{rank}.jsonl", "a", buffering=1)  # "a": a restart goes on
        self.windows = []  # --log-windows: [step, epoch, [window indices]] per step
        if rank == 0:
            sys.stdout.write(f"metrics: {self.metrics_dir.resolve()}/rank<RANK>.jsonl (one JSON line per step per "
                             f"rank, this run's only)\n")
        cfg = getattr(model, "module", model).cfg  # DDP keeps the GPT as .module
        n_params = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the global one
        self.flops_per_token = model_flops_per_token(cfg, n_params)
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        self.peak = peak_flops(device_name, dtype)
        self.tokens_per_step = args.batch_size * args.grad_accum_steps * args.block_size
        self.static = {"max_steps": args.max_steps, "rank": rank, "local_rank": local_rank,
                       "world_size": world_size, "device": str(device), "strategy": args.parallel,
                       "precision": {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32"),
                       "resumed_from_step": resumed_from}
        self.save_events = []
        if rank == 0:
            (self.metrics_dir / "model_rank0.json").write_text(json.dumps({
                "rank": 0, "n_params": n_params, "flops_per_token": self.flops_per_token, "device_name": device_name,
                "peak_flops": self.peak, "config": vars(cfg), "args": vars(args),
                "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}))
        # Which bytes this rank trains on: every rank must read the same corpus (tests/test_train_lm.py compares).
        (self.metrics_dir / f"data_rank{rank}.json").write_text(json.dumps({
            "rank": rank, "corpus_bytes": len(data),
            "corpus_sha256": hashlib.sha256(bytes(data.tolist())).hexdigest(),  # uint8 values: the bytes
            "python": sys.version.split()[0]}))

    @contextlib.contextmanager
    def tracking(self, step):
        """--track-memory: the tracker watches the second step only. The first one is a warm-up: it creates the
        optimizer's state, FSDP's lazy initialisation and DTensor's sharding caches (a cold cache allocates
        global-shape tensors that fake mode counts), so the second is the steady state every later step repeats."""
        if not (self.args.track_memory and step == self.static["resumed_from_step"] + 2):
            yield
            return
        tracker = make_tracker(self.model, self.optimizer)  # now: it registers the optimizer's state as it is
        with tracker:
            yield
        write_memory_snapshot(tracker, self.metrics_dir / f"memory_rank{self.rank}.json", self.rank)

    def saved(self, step, blocking_s):
        """A checkpoint of ``step`` was started (async) or written; training waited ``blocking_s`` seconds."""
        self.save_events.append({"step": step, "async": self.args.async_save, "blocking_s": blocking_s})
        (self.metrics_dir / f"checkpoint_rank{self.rank}.json").write_text(json.dumps(
            {"rank": self.rank, "events": self.save_events}))

    def step_done(self, step, loss, loss_global, grad_norm, lr, eval_loss, batches, step_start):
        """Write the step's JSON line; the step began at ``step_start`` (``time.perf_counter()``)."""
        epoch, read, batches.read = batches.epoch, batches.read, []
        if self.args.log_windows:
            self.windows.append([step, epoch, read])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        step_time_s = time.perf_counter() - step_start
        row = {"step": step, **self.static, "loss_local": loss.item(), "loss_global": loss_global.item(),
               "grad_norm": grad_norm.item(), "lr": lr, "epoch": epoch, "step_time_s": step_time_s,
               "tokens_per_s": self.tokens_per_step / step_time_s, **memory_fields(self.model, self.optimizer,
                                                                                  self.device)}
        if self.peak:
            row["mfu"] = self.flops_per_token * row["tokens_per_s"] / self.peak
        if eval_loss is not None:
            row["eval_loss"] = eval_loss
        self.file.write(json.dumps(row) + "\n")

    def sample(self, text):
        """Rank 0 writes the generated sample to ``sample_rank0.json``."""
        if self.rank == 0:
            (self.metrics_dir / "sample_rank0.json").write_text(json.dumps({"rank": 0, "prompt": self.args.prompt,
                                                                            "text": text}))

    def close(self):
        self.file.close()
        if self.args.log_windows:
            (self.metrics_dir / f"windows_rank{self.rank}.json").write_text(json.dumps(
                {"rank": self.rank, "world_size": self.static["world_size"], "steps": self.windows}))


def make_tracker(model, optimizer):
    """torch's own memory tracker: every tensor allocated or freed while it is active, by category (parameters,
    gradients, optimizer state, activations, temporaries; under FSDP also all-gather and reduce-scatter buffers).
    ``tutorial_lib.planning.memory_plan`` traces ``train_lm.py``'s step under this same tracker."""
    from torch.distributed.fsdp import FSDPModule
    if isinstance(model, FSDPModule):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        return FSDPMemTracker(model, optimizer)
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    return tracker


def write_memory_snapshot(tracker, path, rank):
    """The tracker's peak, {category: bytes} per device, as JSON (tutorial_lib.planning.memory_plan reads the same)."""
    peak = tracker.get_tracker_snapshot("peak")
    path.write_text(json.dumps({"rank": rank, "peak": {
        str(dev): {getattr(k, "name", str(k)): int(v) for k, v in snap.items()} for dev, snap in peak.items()}}))


# ---------------------------------------------------------------------------------------------------------------
# train_hf.py (notebook 13): its per-step record (loss, gradient norm, learning rate, memory) and --track-memory
# (torch's FSDPMemTracker on the second step, as train_lm.py's).
# ---------------------------------------------------------------------------------------------------------------

def add_hf_flags(p):
    """Add ``train_hf.py``'s workbook flags to its parser ``p``."""
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for rank<RANK>.jsonl (created)")
    p.add_argument("--track-memory", action="store_true",
                   help="run the second step under torch's FSDPMemTracker and write its peak by category to "
                        "<metrics-dir>/memory_rank<RANK>.json")


def check_hf_flags(p, args):
    """Refuse a --track-memory run that never reaches the tracked step (``p.error`` exits with 2)."""
    if args.track_memory and min(args.max_steps, args.stop_at_step or args.max_steps) < 2:
        p.error("--track-memory tracks the second step: it needs --max-steps >= 2")


class HFStepRecorder:
    """``train_hf.py``'s metrics: one JSON line per step in ``<metrics-dir>/rank<RANK>.jsonl`` (tutorial_lib/runs/
    metrics.py's schema), and once per run ``model_rank0.json`` (parameters, trainable parameters, the flags).

    A fresh run starts a fresh file (a second run in the same folder does not mix with the first); a resumed run
    (``resumed_from`` > 0) continues the file it resumes. ``dtype`` is the run's compute dtype."""

    def __init__(self, args, rank, local_rank, world_size, device, model, optimizer, resumed_from, dtype):
        self.args, self.rank, self.device, self.model, self.optimizer = args, rank, device, model, optimizer
        self.metrics_dir = Path(args.metrics_dir)
        self.metrics_dir.mkdir(parents=True, exist_ok=True)
        self.resumed_from = resumed_from
        path = self.metrics_dir / f"rank{rank}.jsonl"
        self.file = open(path, "a" if resumed_from else "w", buffering=1)
        if rank == 0:
            sys.stdout.write(f"metrics: {path.parent.resolve()}/rank<RANK>.jsonl\n")
        self.static = {"max_steps": args.max_steps, "rank": rank, "local_rank": local_rank,
                       "world_size": world_size, "device": str(device),
                       "strategy": "hsdp" if args.replicate_degree > 1 else "fsdp",
                       "precision": "bf16" if dtype == torch.bfloat16 else "fp32", "resumed_from_step": resumed_from}
        if rank == 0:
            n_params = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the global one
            n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            (self.metrics_dir / "model_rank0.json").write_text(json.dumps({
                "rank": 0, "n_params": n_params, "n_trainable": n_trainable, "args": vars(args),
                "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}))

    @contextlib.contextmanager
    def tracking(self, step):
        """--track-memory: torch's FSDPMemTracker (``make_tracker``) watches the second step of this run (the first
        one creates the optimizer's state and FSDP's lazy initialisation), as train_lm.py's does."""
        if not (self.args.track_memory and step == self.resumed_from + 2):
            yield
            return
        tracker = make_tracker(self.model, self.optimizer)  # the model is an FSDP2 unit: FSDPMemTracker
        # With the kernels package (a dependency from transformers 5.25 on), transformers calls its rotary embedding
        # through two modules of one class name, "Func", that are not the model's submodules: the tracker takes the
        # inner call for the outer one entered again and warns "module hierarchy tracking maybe be messed up". The
        # bytes it counts do not depend on module names; that warning alone is dropped (and the warning format the
        # tracker replaces for the whole process is put back).
        formatwarning = warnings.formatwarning
        try:
            with tracker, warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The module hierarchy tracking maybe be messed up")
                yield
        finally:
            warnings.formatwarning = formatwarning
        write_memory_snapshot(tracker, self.metrics_dir / f"memory_rank{self.rank}.json", self.rank)

    def step_done(self, step, loss, loss_global, grad_norm, lr, epoch, step_time_s):
        """Write the step's JSON line (``step_time_s``: seconds the step took, measured by the lesson)."""
        row = {"step": step, **self.static, "loss_local": loss.item(), "loss_global": loss_global.item(),
               "grad_norm": grad_norm.item(), "lr": lr, "epoch": epoch, "step_time_s": step_time_s,
               **memory_fields(self.model, self.optimizer, self.device)}
        self.file.write(json.dumps(row) + "\n")

    def close(self):
        self.file.close()
