"""Known failures: the messages gloo, NCCL, torchrun, the allocators and DDP print, each with its cause, a one-line
fix and the notebook section that shows it; and what a signal or an exit code without a traceback means.

The doctor (``tutorial_lib.diagnosis.doctor``) matches ``CAUSES`` in priority order against a failed run's tracebacks, error
files and output. The patterns are the messages these libraries print on torch 2.8 and 2.13 (both run in CI, each
failure of notebooks 02, 05, 06 and 07 is a test on each version); where a version drops a message the doctor also
reads what both leave. A message torch changes makes the doctor fall back to "Python exception" or "killed by
signal", never to a wrong specific cause on purpose.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..i18n import N_, Message, Nn_
from ..torchrun.root_cause import signal_name
from .cause_ids import CauseId
from .torchft_causes import TORCHFT_CAUSES
from .waiting import COMPILING_CAUSE, RANK_BRANCH_CAUSE


@dataclass(frozen=True)
class Cause:
    """A known failure: its id, its short name, the pattern of its messages, the fix, and where it is taught.

    ``id`` is what code compares; ``name`` and ``fix`` are gettext msgids (English; ``tutorial_lib.i18n`` words them
    when shown). ``describe``, if set, turns the matching line into the evidence shown (else the line itself is).
    A fix names only what the failing script has: ``fix`` is said of a script of your own, ``script_fixes`` holds
    the fix for a lesson script that has its own flags and files (``(("train_lm", msgid), ...)``; ``fix_for``).
    ``requires``, if set, must also occur in the evidence (a frame of the library that raised a message which alone
    could mean anything).
    """

    id: CauseId
    name: str
    pattern: re.Pattern
    fix: str
    describe: Callable[[str], str] | None = None
    script_fixes: tuple[tuple[str, str], ...] = ()
    requires: re.Pattern | None = None

    def fix_for(self, script: str | None) -> str:
        """The fix (a msgid) for a run of ``script``: a lesson script's name (``"train_lm"``), or ``None`` (a script
        of your own, or one the run directory does not name)."""
        return dict(self.script_fixes).get(script, self.fix) if script else self.fix


# A checkpoint loaded into a model of another shape: DCP's planner (dcp.load), set_state_dict's strict check, and
# nn.Module.load_state_dict (a full checkpoint), as torch 2.8 and 2.13 word them.
_SIZE_MISMATCH = (re.compile(r"Size mismatch between saved (?P<saved>torch\.Size\(\[[^\]]*\]\)) and current: "
                             r"(?P<current>torch\.Size\(\[[^\]]*\]\)) for (?P<key>[\w.]*\w)"),
                  re.compile(r"size mismatch for (?P<key>[\w.]*\w): copying a param with shape (?P<saved>torch\.Size\("
                             r"\[[^\]]*\]\)) from checkpoint, the shape in current model is (?P<current>torch\.Size\("
                             r"\[[^\]]*\]\))"))
_MISSING_KEY = re.compile(r"Missing key in checkpoint state_dict: (?P<key>[\w.]*\w)|Missing key: (?P<key2>[\w.]*\w)|"
                          r"Missing key\(s\) in state_dict: (?P<keys>.*?)\.?\s*$")
_UNEXPECTED_KEY = re.compile(r"Unexpected key\(s\) in state_dict: (?P<keys>.*?)\.?\s*$")
# DCP's strict load of a key that names a rank (train_lm.py's rng_rank2.cpu until it resumed on any world size): the
# checkpoint was saved on fewer ranks than this run has.
_PER_RANK_KEY = re.compile(r"Missing key in checkpoint state_dict: (?P<key>[\w.]*?rank(?P<rank>\d+)[\w.]*\w)")
# Pipeline schedules (GPipe, 1F1B) cut the batch with tensor_split: 10 in 3 gives 4, 3, 3, and every micro-batch must
# have the first one's shape. torch 2.8's stage checks the shapes it receives (PipeliningShapeError, only the first
# dimension differs); torch 2.13's last stage fails in the loss (broadcast of the output against the target, dimension
# 0; with F.cross_entropy, a ValueError: "Expected input batch_size (4) to match target batch_size (3)"), a message
# that alone could be any shape bug: the cause requires a frame of torch.distributed.pipelining.
_UNEVEN_MICROBATCH = re.compile(r"PipeliningShapeError: .*shape mismatch: expected torch\.Size\(\[(?P<a>\d+)"
                                r"(?P<rest>[^\]]*)\]\) actual torch\.Size\(\[(?P<b>\d+)(?P=rest)\]\)|"
                                r"The size of tensor a \((?P<a2>\d+)\) must match the size of tensor b \((?P<b2>\d+)\) "
                                r"at non-singleton dimension 0|"
                                r"Expected input batch_size \((?P<a3>\d+)\) to match target batch_size \((?P<b3>\d+)\)")
_PIPELINING = re.compile(r"torch[/\\.]distributed[/\\.]pipelining|PipeliningShapeError")


def describe_fewer_ranks(line: str) -> str:
    """``"rng_rank2.cpu: the checkpoint has no entry for rank 2"`` from DCP's missing-key message."""
    m = _PER_RANK_KEY.search(line)
    return f"{m['key']}: the checkpoint has no entry for rank {m['rank']}" if m else line


def describe_uneven_microbatches(line: str) -> str:
    """``"micro-batches of 4 and 3 samples"`` from a pipeline's shape error (the error line shows the message)."""
    m = _UNEVEN_MICROBATCH.search(line)
    return f"micro-batches of {m['a'] or m['a2'] or m['a3']} and {m['b'] or m['b2'] or m['b3']} samples" if m else line


def describe_checkpoint_mismatch(line: str) -> str:
    """``"model.net.6.weight: saved [4, 128], this model [128, 128]"`` from a size mismatch message (or the key a
    missing/unexpected-key message names); the line itself when it is neither.

    Args:
        line: a line that ``CAUSES``' "checkpoint does not match the model" pattern matched.
    """
    for pattern in _SIZE_MISMATCH:
        m = pattern.search(line)
        if m:
            saved, current = (m[name].removeprefix("torch.Size(").removesuffix(")") for name in ("saved", "current"))
            return f"{m['key']}: saved {saved}, this model {current}"
    m = _MISSING_KEY.search(line)
    if m:
        return f"{m['key'] or m['key2'] or m['keys']}: in this model, not in the checkpoint"
    m = _UNEXPECTED_KEY.search(line)
    if m:
        return f"{m['keys']}: in the checkpoint, not in this model"
    return line


# In priority order: the first cause whose pattern occurs in any rank's traceback or output wins. Specific
# causes come first; the consequences they trigger on the peers ("Connection reset by peer", a timeout
# while a peer is already dead) come later or not at all.
CAUSES = (
    *(Cause(**cause) for cause in TORCHFT_CAUSES),  # torchft's own lines, before the generic messages they contain
    Cause(CauseId.PORT_IN_USE, N_("port in use"), re.compile(r"EADDRINUSE|address already in use", re.I),
          N_("another process holds master_port: leave master_port=None (the launcher picks a free port) or choose "
             "another one (06, section 5 'A port that is already taken')")),
    Cause(CauseId.RENDEZVOUS_TIMEOUT, N_("rendezvous timeout"), re.compile(r"RendezvousTimeoutError|waiting for clients|RendezvousClosedError"),
          N_("not every node joined in time: start every node's torchrun with the same --nnodes and rendezvous "
             "endpoint, and check that the port is reachable (06, section 4 'A node that never arrives')")),
    Cause(CauseId.OUT_OF_MEMORY, N_("out of memory"), re.compile(r"CUDA out of memory|OutOfMemoryError|can't allocate memory|"
                                      r"DefaultCPUAllocator|std::bad_alloc|Cannot allocate memory"),
          N_("the allocation does not fit: a smaller batch per rank with gradient accumulation (02, section 3), "
             "activation checkpointing or FSDP sharding (04, the OOM ladder) (07, section 4 'Out of memory')")),
    Cause(CauseId.CHECKPOINT_FEWER_RANKS, N_("checkpoint saved on fewer ranks"), _PER_RANK_KEY,
          N_("the checkpoint has no entry for a rank this run has: it was saved on fewer ranks, and state saved under "
             "rank-numbered keys (an RNG stream per rank, a per-rank data position) loads only on the world size that "
             "saved it. Resume on that many ranks, or make the state loadable on any world size: a data position "
             "counted for all ranks together, and per-rank entries loaded only where the checkpoint has them (its "
             "metadata lists the keys), the others given a defined state (05, section 3 'Sharded checkpoints')"),
          describe_fewer_ranks,
          script_fixes=(("train_lm", N_(
              "this copy of train_lm.py keeps one RNG stream per rank (rng_rank<R>) and loads its own strictly, so a "
              "checkpoint resumes only on the world size that saved it: resume on that many ranks (--nproc-per-node "
              "in the saving run's command.txt), or use the workbook's current train_lm.py, which resumes on any "
              "world size (a global data position, RNG reseeded) (11, section 5 'Resume exactly from the "
              "asynchronous checkpoint')")),)),
    Cause(CauseId.CHECKPOINT_MISMATCH, N_("checkpoint does not match the model"),
          re.compile(r"Size mismatch between saved .* for |size mismatch for \S+: copying a param with shape|"
                     r"Missing key in checkpoint state_dict: |Missing key: |Missing key\(s\) in state_dict|"
                     r"Unexpected key\(s\) in state_dict"),
          N_("the state dict loaded does not fit the model it is loaded into (other layer counts or widths, other "
             "module names, a wrapper's prefix such as DDP's 'module.'): build the model with the arguments it was "
             "saved with, as the saving code built it, or load a checkpoint of this model; strict=False "
             "(StateDictOptions(strict=False)) only for keys you mean to leave as they are (05, section 3 "
             "'Sharded checkpoints')"), describe_checkpoint_mismatch,
          script_fixes=(
              ("checkpoint_train", N_(
                  "the checkpoint was saved from a model of another shape: build the model with the arguments it was "
                  "saved with (the same layer count and widths: the saving run's command.txt has them; checkpoint.json "
                  "in the step folder records only the step, world size, format and strategy), or start without "
                  "--resume (05, section 3 'Sharded checkpoints')")),
              ("train_lm", N_(
                  "the checkpoint --resume names was saved by a model of another shape: resume with the arguments it "
                  "was saved with (--n-layers, --d-model, --n-heads, --block-size, --vocab-size, --bias: the saving "
                  "run's command.txt has them), give --resume a checkpoint of this model, or leave --resume out to "
                  "start afresh (11, section 5 'Resume exactly from the asynchronous checkpoint')")))),
    Cause(CauseId.UNEVEN_MICROBATCHES, N_("micro-batches do not split the batch evenly"), _UNEVEN_MICROBATCH,
          N_("a pipeline schedule (GPipe, 1F1B) cuts each batch into its micro-batches with tensor_split, and every "
             "micro-batch must have the shape of the first (the stages' buffers and the loss are sized by it): a "
             "batch of 10 in 3 micro-batches gives 4, 3 and 3 samples. Make the number of micro-batches divide the "
             "batch size, and check it before the step runs (12, section 4 'Pipelining seed 000's two halves')"),
          describe_uneven_microbatches, requires=_PIPELINING),
    # gloo's size check: torch 2.13 prints "op.preamble.length <= op.nbytes. 84488 vs 4. Received data size
    # doesn't match expected size..."; torch 2.8's gloo stops after "84488 vs 4".
    Cause(CauseId.COLLECTIVE_MISMATCH, N_("collective mismatch"), re.compile(r"mismatch between collectives|doesn't match expected size|"
                                            r"collective mismatch|op\.preamble\.length <= op\.nbytes", re.I),
          N_("the ranks called different collectives (one skipped or reordered a call): every rank must issue the "
             "same collectives in the same order; TORCH_DISTRIBUTED_DEBUG=DETAIL names each rank's call "
             "(07, section 1 'Hang')")),
    # A rank that finished its work and then died in the interpreter's teardown: a gloo thread aborts while the
    # process exits, even after destroy_process_group() (about 4-12% of CPU runs of a plain script).
    Cause(CauseId.ABORT_AT_EXIT, N_("abort at interpreter exit"), re.compile(r"terminate called without an active exception"),
          N_("the script had returned: gloo aborted the process during Python's teardown, not your code, and the "
             "rank's work is done; end main() with dist.destroy_process_group() in a finally (it makes the abort rarer, "
             "not impossible), not with os._exit, which skips atexit handlers and a running dcp.async_save; the "
             "launcher's rank runner leaves with os._exit for you (07, section 2 'A crashing rank')")),
    # dynamo's DDPOptimizer splits a compiled graph at DDP's bucket boundaries and insists that the first bucket (1 MiB)
    # is no larger than the others; a bucket_cap_mb below 1 breaks that (torch 2.8 and 2.13 alike). Measured with
    # optimize_ddp = False (notebook 14, aot_eager, 2.8 and 2.13): a whole-model graph's all-reduces all start after its
    # backward graph returns; per-block graphs interleave with them.
    Cause(CauseId.COMPILE_BUCKET_SPLIT, N_("DDP + torch.compile bucket split"), re.compile(r"First bucket should be smaller/equal to other buckets"),
          N_("torch.compile under DDP with a bucket_cap_mb below DDP's first bucket (1 MiB): dynamo's DDPOptimizer "
             "cannot split the graph at these buckets. Use a bucket_cap_mb of at least 1, or set "
             "torch._dynamo.config.optimize_ddp = False before compiling (train_lm.py --no-optimize-ddp): no split, "
             "so a model compiled whole is one graph whose backward yields every gradient at once and DDP's "
             "all-reduces start only after it (no overlap with backward); compiled block by block (as train_lm.py "
             "does) each block's all-reduce still starts while the earlier blocks' backward runs (14, section 4 "
             "'Buckets too small for the split')")),
    # inductor writes C++ kernels on CPU and compiles them with torch._inductor.config.cpp.cxx, read from $CXX (else
    # g++) when inductor is imported: "InvalidCxxCompiler: No working C++ compiler found in
    # torch._inductor.config.cpp.cxx: (None, 'g++')" (torch 2.8 and 2.13, measured with CXX naming no compiler).
    Cause(CauseId.COMPILE_NO_CXX, N_("no C++ compiler for inductor"),
          re.compile(r"InvalidCxxCompiler|No working C\+\+ compiler found"),
          N_("torch.compile's default backend, inductor, generates C++ kernels on CPU and found no working compiler "
             "(torch._inductor.config.cpp.cxx: the CXX environment variable, else g++): install one (apt-get install "
             "g++, or conda install gxx) or set CXX to one in the environment the ranks start in; or compile with "
             "backend=\"aot_eager\", which traces the graphs and runs them without generating kernels (14, section 8 "
             "'What compiling costs and buys')"),
          script_fixes=tuple((name, N_(
              "inductor (--compile-backend inductor, the default of train_lm.py) generates C++ kernels on CPU and "
              "found no working compiler (the CXX environment variable, else g++): install one (apt-get install g++, "
              "or conda install gxx) or set CXX to one, or run with --compile-backend aot_eager, which traces the "
              "graphs and runs them without generating kernels (14, section 8 'What compiling costs and buys')"))
              for name in ("train_lm", "ddp_train", "fsdp_train", "compile_train"))),
    # fullgraph=True (or torch._dynamo.config.fail_on_recompile_limit_hit) turns dynamo's recompile limit into an
    # error: "FailOnRecompileLimitHit: Hard failure due to fullgraph=True" (2.13), "recompile_limit reached with
    # one_graph=True" (2.8). Before the graph-break cause: on 2.13 it is raised from an Unsupported.
    Cause(CauseId.COMPILE_RECOMPILE_LIMIT, N_("torch.compile recompile limit"), re.compile(r"FailOnRecompileLimitHit"),
          N_("dynamo compiled the same function recompile_limit times (a new graph for each new input shape, dtype "
             "or guarded Python value) and, under fullgraph=True, stopped instead of running it eagerly: find what "
             "changes with TORCH_LOGS=recompiles; give a length that varies a few fixed, padded values, or let it "
             "be dynamic (dynamic=None, the default, or torch._dynamo.mark_dynamic); raise "
             "torch._dynamo.config.recompile_limit only if the recompilations are wanted (14, section 6 'Graph "
             "breaks and recompilations')")),
    # torch.compile(DDP(model), fullgraph=True): dynamo traces DDP's own forward and stops in its _pre_forward (its
    # logger, set_runtime_stats_and_log: "Unsupported method call") on 2.8 and 2.13, a break no change to the model
    # can remove. Before the general graph break, which would send the learner looking for a print in their module.
    Cause(CauseId.COMPILE_DDP_GRAPH_BREAK, N_("graph break inside DDP under fullgraph=True"),
          re.compile(r"torch\._dynamo\.exc\.Unsupported\b"),
          N_("torch.compile(DDP(model), fullgraph=True) traced DDP's own forward and stopped inside it (its logger "
             "and hooks), not in your model: nothing in your module can remove that break. Compile the model, then "
             "wrap it: model.compile() (or torch.compile(model)), then DDP(model); fullgraph=True then applies to "
             "your model's forward alone (14, section 1 'Which wrapping compiles')"),
          requires=re.compile(r"nn[/\\]parallel[/\\]distributed\.py\", line \d+, in _(pre|post)_forward")),
    # A graph break where none is allowed: torch.compile(fullgraph=True) raises dynamo's Unsupported ("Failed to
    # trace builtin operator" for a print on 2.13; its gb_type names the construct) on 2.8 and 2.13 alike.
    Cause(CauseId.COMPILE_GRAPH_BREAK, N_("graph break under fullgraph=True"),
          re.compile(r"torch\._dynamo\.exc\.Unsupported\b"),
          N_("torch.compile(fullgraph=True) met code it cannot put in the graph (a print, a Python number read from "
             "a tensor with .item(), a call dynamo cannot trace): the traceback's 'from user code' lines name it. "
             "Move it out of the compiled module (print after the step), keep it in the graph "
             "(torch._dynamo.config.capture_scalar_outputs = True for .item()), or drop fullgraph=True and let it "
             "run as a graph break; torch._dynamo.explain(model)(inputs) lists every break (14, section 6 'Graph "
             "breaks and recompilations')")),
    Cause(CauseId.UNUSED_PARAMETERS, N_("DDP unused parameters"), re.compile(r"Expected to have finished reduction"),
          N_("a parameter got no gradient: use every module in the loss, or DDP(find_unused_parameters=True) "
             "(01, section 6 'A parameter without a gradient')")),
    # A GPU program on a machine without a usable GPU, as torch 2.8's CUDA wheel and 2.13's CPU build say it:
    # torch.cuda.set_device: "Found no NVIDIA driver on your system" (2.8, CUDA wheel, no driver), "module
    # 'torch._C' has no attribute '_cuda_setDevice'" (2.13 CPU build); a CUDA tensor: "Torch not compiled with CUDA
    # enabled" (CPU build); init_process_group("nccl"): "ProcessGroupNCCL is only supported with GPUs, no GPUs found!"
    # (2.8), "Distributed package doesn't have NCCL built in" (2.13 CPU build); all measured here. "No CUDA GPUs are
    # available" (CUDA_VISIBLE_DEVICES empty) and "no CUDA-capable device is detected" (the CUDA runtime's
    # cudaErrorNoDevice) are the texts of torch's and CUDA's sources, not seen on this machine.
    Cause(CauseId.NO_GPU, N_("no GPU"), re.compile(r"Found no NVIDIA driver on your system|Torch not compiled with CUDA enabled|"
                               r"has no attribute '_cuda_setDevice'|ProcessGroupNCCL is only supported with GPUs|"
                               r"Distributed package doesn't have NCCL built in|No CUDA GPUs are available|"
                               r"no CUDA-capable device is detected"),
          N_("the script asks for a GPU and this machine has none torch can use (or torch is a CPU build): choose the "
             "device and backend from what is there (device = 'cuda' if torch.cuda.is_available() else 'cpu'; nccl "
             "on CUDA, gloo on CPU; torch.cuda.set_device and device_ids only on CUDA), as the lesson scripts do, or "
             "run it on a machine whose nvidia-smi lists GPUs with a CUDA build of torch (06, section 2 'The GPU "
             "comes from LOCAL_RANK, never from RANK')")),
    # A GPU index the node does not have: the CUDA runtime's cudaErrorInvalidDevice, "CUDA error: invalid device
    # ordinal" (torch.cuda.set_device(i) and tensors on cuda:i, i >= the node's GPU count); torch.cuda's own check
    # "Invalid device id" (get_device_properties). The texts of torch 2.8's CUDA wheel (libcudart's error strings,
    # torch/cuda/__init__.py): this machine has no GPU to show them on.
    Cause(CauseId.INVALID_DEVICE_ORDINAL, N_("invalid device ordinal"), re.compile(r"invalid device ordinal|Invalid device id"),
          N_("a rank asked for a GPU index this node does not have: take the GPU from LOCAL_RANK "
             "(torch.cuda.set_device(int(os.environ['LOCAL_RANK']))), never from RANK, which counts the ranks of every "
             "node, and start at most torch.cuda.device_count() ranks per node (--nproc-per-node; CUDA_VISIBLE_DEVICES "
             "limits what a node shows) (06, section 2 'The GPU comes from LOCAL_RANK, never from RANK')")),
    Cause(CauseId.COLLECTIVE_TIMEOUT, N_("collective timeout (hang)"), re.compile(r"[Tt]imed out|[Ww]ait timeout|collective operation timeout|"
                                                  r"Socket Timeout|Application timeout caused pair closure"),
          N_("a rank waited in a collective that a peer never joined: compare the ranks' last steps and stacks to "
             "find the rank that is elsewhere; keep init_process_group(timeout=...) short so a hang becomes an "
             "error (07, section 1 'Hang'; uneven inputs: 02, section 4)")),
    Cause(CauseId.NCCL_ERROR, N_("NCCL error"), re.compile(r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|"
                                   r"ncclInvalidUsage|ncclRemoteError|NCCL WARN"),
          N_("rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and check NCCL_SOCKET_IFNAME "
             "(07, section 3 'Debugging variables')")),
)

# The failures of torchrun itself, no rank to blame: the launcher explains them in its error (with the spec's port and
# node count), the doctor by these causes.
AGENT_FAILURES = (CauseId.PORT_IN_USE, CauseId.RENDEZVOUS_TIMEOUT)


def agent_failure(output: str) -> Cause | None:
    """The cause of a failure of torchrun itself (``AGENT_FAILURES``: the rendezvous port was taken, a node never
    joined) that ``output`` (torchrun's) shows, or ``None``.

    Args:
        output: torchrun's output, every node's.
    """
    return next((c for c in CAUSES if c.id in AGENT_FAILURES and c.pattern.search(output)), None)


EXCEPTION_FIX = (N_("rank {rank}'s traceback is the root cause: fix the code it points to; the other ranks failed "
                     "only because their peer was gone (07, section 2 'A crashing rank')"))
# When several ranks raised an error of their own (the same code failing everywhere: a missing key, a bad path).
EVERY_RANK_RAISED_FIX = (N_("ranks {ranks} each raised (rank {rank} first): not a peer's failure but code every one of "
                             "them runs; fix the line the traceback points to (07, section 2 'A crashing rank')"))
# A rank that returned while the others still waited in a collective for it (the launcher's rank runner records
# exit code 0; torchrun reports no rank that exits 0).
FINISHED_CAUSE = N_("a rank finished while the others waited")
FINISHED_FIX = Nn_("rank {rank} returned (exit code 0) while rank {waiting} waited for it in a collective it never "
                   "called: a collective inside `if rank == 0:`, a final barrier() or all_reduce on some ranks only, or "
                   "more batches on one rank than another. Every rank must call the same collectives in the same order "
                   "(07, section 1c 'One rank skips a collective'; uneven inputs: 02, section 4)",
                   "rank {rank} returned (exit code 0) while ranks {waiting} waited for it in a collective it never "
                   "called: a collective inside `if rank == 0:`, a final barrier() or all_reduce on some ranks only, or "
                   "more batches on one rank than another. Every rank must call the same collectives in the same order "
                   "(07, section 1c 'One rank skips a collective'; uneven inputs: 02, section 4)")
SIGNAL_FIXES = {
    "SIGKILL": N_("killed with SIGKILL: most likely the Linux OOM killer (compare the peak RSS with the machine's "
                  "memory, or the container's limit; dmesg says 'Out of memory: Killed process', but inside a "
                  "container dmesg is often not readable and the kill is the cgroup's: read the host's or the "
                  "platform's OOM records) or a manual kill (07, section 4 'Out of memory')"),
    "SIGSEGV": N_("a crash in native code (C++/CUDA): the faulthandler stack in the rank's log shows the Python line "
                  "that called it (07, section 1d: DDP under TORCH_DISTRIBUTED_DEBUG=DETAIL on gloo crashes so)"),
    "SIGABRT": N_("a native abort: often gloo or NCCL aborting on a broken collective, or a C++ exception; read the "
                  "rank's stderr in logs/ (07, section 1 'Hang')"),
    "SIGTERM": N_("stopped from outside (torchrun stops the other ranks when one fails; the launcher on a timeout or "
                  "interrupt): look for the rank that failed first"),
    "SIGFPE": N_("no traceback: an arithmetic fault in native code, most often an integer division by zero in C/C++ (an "
                 "extension, a custom op); Python and torch raise ZeroDivisionError or give inf/nan instead. The "
                 "faulthandler stack in the rank's log names the Python line that called it (07, section 2 'A crashing "
                 "rank')"),
    "SIGBUS": N_("no traceback: a bad memory access in native code, typically a memory-mapped file (a dataset, a "
                 "checkpoint) truncated or deleted while in use, or /dev/shm full (DataLoader workers pass tensors "
                 "through it: df -h /dev/shm; in Docker raise --shm-size) (07, section 2 'A crashing rank')"),
    "SIGILL": N_("no traceback: the CPU met an instruction it does not have: a binary (torch, numpy, an extension) "
                 "built for a newer CPU (AVX-512, ...) than this machine's, or a corrupt install; reinstall the wheels "
                 "for this machine (07, section 2 'A crashing rank')"),
    "SIGTRAP": N_("no traceback: a native breakpoint or assertion trap (__builtin_trap) in C/C++ code, or a debugger "
                  "attached to the rank; the faulthandler stack in the rank's log shows the Python line (07, section 2 "
                  "'A crashing rank')"),
    "SIGSYS": N_("no traceback: a system call the sandbox forbids (seccomp in a container); run with the container's "
                 "default profile or allow the call (07, section 2 'A crashing rank')"),
    "SIGXCPU": N_("no traceback: the rank used up its CPU-time limit (ulimit -t, or the batch scheduler's); raise the "
                  "limit or ask for more time (07, section 2 'A crashing rank')"),
    "SIGXFSZ": N_("no traceback: a write went past the file-size limit (ulimit -f), e.g. a checkpoint or log; raise the "
                  "limit (07, section 2 'A crashing rank')"),
    "SIGPIPE": N_("no traceback: the rank wrote to a pipe or socket whose reader was gone (output piped into a command "
                  "that exited, such as head) (07, section 2 'A crashing rank')"),
    "SIGINT": N_("interrupted (Ctrl-C in a terminal, a kernel interrupt in Jupyter): nothing failed by itself"),
    "SIGHUP": N_("its terminal or session closed (an ssh session ended): start long runs under nohup, tmux or a "
                 "batch scheduler"),
}
EXIT_FIX = (N_("rank {rank} ended itself with exit code {code} and left no traceback: sys.exit({code}), exit({code}) or "
                "os._exit({code}) in its script or in a library it calls ({meaning}); search the code for sys.exit, "
                "exit( and os._exit, and raise an exception there instead so @record keeps the traceback (07, section 2 "
                "'A crashing rank')"))
# NCCL's watchdog on a timed-out collective ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(...)").
NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|WorkNCCL\(.*\) ran for")
# Added to the fix of an NCCL timeout or NCCL error when several ranks ran on one machine (doctor._match_cause).
P2P_HINT = (N_("; with several consumer GPUs in one machine (no NVLink, e.g. RTX 4090) a broken peer-to-peer path hangs "
                "NCCL's collectives or fails them with an NCCL error: rerun with env={\"NCCL_P2P_DISABLE\": \"1\"} "
                "(run_script / LaunchSpec env=); `python -m tutorial_lib env` lists the GPU pairs without peer access"))
NO_ERROR_FIX = (N_("the rank left no traceback and torchrun reported no exit code for it while its peers lost the "
                    "connection: most likely killed by a signal (SIGKILL from the OOM killer or kill -9); its last log "
                    "lines say what it was doing (07, section 4 'Out of memory')"))
SIGNAL_FIX = N_("the rank was killed by a signal: read its log in logs/")  # a signal SIGNAL_FIXES does not list
UNKNOWN_FIX = N_("no known pattern: read output.log and the ranks' logs under logs/ in the run directory")
# A run the launcher stopped on request (run.json "status": "interrupted": Ctrl-C, a Jupyter kernel interrupt) or
# because the kernel's own code raised while it waited ("stopped"): no rank failed by itself.
INTERRUPTED_CAUSE = N_("interrupted")
STOPPED_CAUSE = N_("stopped by the launching process")
INTERRUPTED_FIX = (N_("nothing to fix: you stopped it (Ctrl-C or a Jupyter kernel interrupt) and the launcher stopped "
                      "torchrun and every rank; rerun it with command.txt, or resume from its last checkpoint (05, "
                      "section 4 'A rank killed during a save'); if you stopped it because it hung, the stacks show "
                      "where each rank was (07, section 1 'Hang')"))
STOPPED_FIX = (N_("no rank failed: the process that launched it raised {error} while it waited, and the launcher "
                  "stopped torchrun and every rank; fix that error and rerun it with command.txt (07, section 6 'The "
                  "doctor')"))
# The batch system refused the job at submission (run.json "status": "refused"): sbatch's message is the evidence.
REFUSED_CAUSE = N_("sbatch refused the job")
REFUSED_FIX = N_("nothing ran, so output.log is empty and there is no logs/: change what sbatch's message names in the "
                 "launch's SlurmSpec (a --cpus-per-task, --mem or --gres no node has, an unknown --partition, --account "
                 "or --qos in sbatch_args) and launch again; `sinfo -N -o '%N %c %m %G'` lists what each node has")
# A SLURM job pending for a reason after which it cannot start as submitted (the launcher cancelled it).
NEVER_STARTS_FIX = N_("no rank ran: SLURM kept the job pending for a reason it cannot outgrow, and the launcher cancelled "
                      "it; change what the evidence names in the launch's SlurmSpec (cpus_per_task, nnodes, time_limit, "
                      "or the --constraint, --account or --qos in sbatch_args) and launch again; `sinfo -N -o '%N %c %m "
                      "%G'` lists what each node has (06, section 6)")
# Python could not parse a file: the script itself (no traceback: Python prints only the file, the line and a caret)
# or a module it imports (a traceback ending in the SyntaxError).
SYNTAX_CAUSE = N_("syntax error")
SYNTAX_FIX = (N_("Python could not parse {path}, line {line}: correct that line (the caret under it in the rank's log "
                 "points at the spot), and check the file with `python -m py_compile {path}` before launching "
                 "(07, section 2 'A crashing rank')"))
HANG_FIX = (N_("no rank finished within its limit: the stacks show where each rank waits; the rank that is not in a "
                "collective is the culprit; set init_process_group(timeout=...) so a hang becomes an error "
                "(07, section 1 'Hang')"))


def exit_code_meaning(code: int) -> Message:
    """What a positive exit code usually means when a process leaves no traceback, in a few words (``str()`` for the
    English; ``render()`` in the language in use).

    Args:
        code: the exit code (1..255) torchrun reported for the rank.
    """
    if code == 1:
        return Message(N_("1 is also what sys.exit('message') gives: the message is then the rank's last line"))
    if code == 2:
        return Message(N_("2 is argparse's code for bad command-line arguments: look for 'usage:' and 'error:' in its "
                          "log"))
    if code == 126:
        return Message(N_("{code} is a shell's 'command not executable': a wrapper script"), {"code": code})
    if code == 127:
        return Message(N_("{code} is a shell's 'command not found': a wrapper script"), {"code": code})
    if 128 < code < 128 + 65:
        return Message(N_("{code} = 128 + {number}: a shell's way of saying its child was killed by {signal}"),
                       {"code": code, "number": code - 128, "signal": signal_name(128 - code)})
    if code == 255:
        return Message(N_("255 is sys.exit(-1) or os._exit(-1) (exit codes are taken modulo 256)"))
    return Message(N_("no library here exits with {code} on its own: it is most likely the script's own number"),
                   {"code": code})


# The names of the causes that no message of CAUSES gives (gettext msgids, with their fields).
CAUSE_NAMES = {
    CauseId.PYTHON_EXCEPTION: N_("Python exception ({name})"),
    CauseId.KILLED_BY_SIGNAL: N_("killed by {signal}"),
    CauseId.KILLED_ON_PURPOSE: N_("killed on purpose ({by})"),
    CauseId.EXITED_WITHOUT_TRACEBACK: N_("exited with code {code} without a traceback"),
    CauseId.DIED_WITHOUT_ERROR: N_("died without a Python error"),
    CauseId.HANG_WALL_CLOCK: N_("hang (wall-clock timeout)"),
    CauseId.HANG_NO_PROGRESS: N_("hang (no progress)"),
    CauseId.COMPILING_RANK: COMPILING_CAUSE,
    CauseId.RANK_BRANCH_COLLECTIVE: RANK_BRANCH_CAUSE,
    CauseId.RANK_FINISHED: FINISHED_CAUSE,
    CauseId.INTERRUPTED: INTERRUPTED_CAUSE,
    CauseId.STOPPED: STOPPED_CAUSE,
    CauseId.SYNTAX_ERROR: SYNTAX_CAUSE,
    CauseId.SBATCH_REFUSED: REFUSED_CAUSE,
    CauseId.SLURM_NEVER_STARTS: N_("the SLURM job can never start ({reason})"),
    CauseId.UNKNOWN: N_("unknown"),
    CauseId.NONE: N_("none"),
} | {cause.id: cause.name for cause in CAUSES}


def cause_by_id(cause_id: CauseId) -> Cause:
    """The known cause ``cause_id`` of ``CAUSES`` (its pattern and fix).

    Raises:
        KeyError: ``cause_id`` is one of the doctor's own conclusions, not a known message's cause.
    """
    try:
        return next(c for c in CAUSES if c.id == cause_id)
    except StopIteration:
        raise KeyError(cause_id) from None


def cause_message(cause_id: CauseId, **fields: object) -> Message:
    """The name of ``cause_id`` to show (``str()``: English), its fields filled in (``CauseId``'s comments name them;
    a missing one raises ``KeyError`` when shown)."""
    return Message(CAUSE_NAMES[cause_id], fields)
