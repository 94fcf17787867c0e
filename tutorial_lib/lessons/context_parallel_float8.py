"""Context parallelism (attention over a sequence split across ranks) and float8 matmuls: two GPU-only techniques.

Run card
    torchrun --nproc-per-node 2 context_parallel_float8.py       # 2 GPUs: attention over 2 sequence shards
    python context_parallel_float8.py                            # one GPU (a mesh of 1); on CPU both lessons say why
                                                                 # they cannot run there

What it shows
    * context_parallel: ``torch.distributed.tensor.experimental.context_parallel`` cuts q, k and v along the sequence
      (each rank keeps 1/N of the tokens, in 2N chunks for causal load balance) and turns
      ``scaled_dot_product_attention`` into attention over every rank's keys and values: each rank computes its
      queries against them chunk by chunk and merges the partial softmaxes by their logsumexp. How the keys and values
      travel is torch's rotate method, and its default on torch 2.8 and 2.13 is ``allgather``: one all-gather gives
      every rank the whole sequence's K and V (so during attention each rank holds all of them); ring attention
      proper, one neighbour's shard at a time, is ``set_rotate_method("alltoall")``. The result records the method. The output, put back together (``context_parallel_unshard``), equals attention
      over the whole sequence in one process, within bf16 rounding. It needs an attention kernel DTensor can shard:
      on CPU, torch 2.8 and 2.13 raise ``NotImplementedError`` (no sharding strategy for the CPU flash kernel), and
      the lesson records that message (without numpy, torch's context parallelism does not import: it records that).
    * float8: a matmul in float8 (e4m3: 3 mantissa bits) with per-tensor scales, ``torch._scaled_mm``, against bf16
      and fp32: what float8 training (torchao's ``convert_to_float8_training``) does in every Linear. It needs a GPU
      with compute capability 8.9 or newer (Ada, such as the RTX 4090D; Hopper); elsewhere the lesson records why
      it did not run.
Each rank prints whether each lesson ran; in a workbook run, ``_workbook.py`` beside it writes every number to
``<metrics-dir>/cp_float8_rank<RANK>.json``. Only torch and the Python standard library.
"""

import argparse
import contextlib
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record

try:  # the workbook's instruments, written beside this file in a workbook run; a copy runs without them
    import _workbook as workbook
except ImportError:
    workbook = None

LESSONS = ("context_parallel", "float8")
FLOAT8_MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (sm_89, RTX 4090 / 4090D) and Hopper (sm_90) onwards


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lessons", nargs="+", choices=LESSONS, default=list(LESSONS), help="what to run, in this order")
    p.add_argument("--seq-len", type=int, default=4096,
                   help="tokens per sequence of the attention (count; divisible by 2 x the number of ranks)")
    p.add_argument("--n-heads", type=int, default=8, help="attention heads (count)")
    p.add_argument("--head-dim", type=int, default=64, help="features per head (count)")
    p.add_argument("--matmul-size", type=int, default=4096,
                   help="M = N = K of the float8 matmul (count, a multiple of 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic tensors")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu (where both lessons say why they "
                        "cannot run)")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process-group backend; auto: nccl on cuda, gloo on cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0,
                   help="collective timeout of the process group (seconds); torch's default is 10 minutes on NCCL, "
                        "30 on gloo")
    if workbook:  # workbook
        workbook.add_rank_json_flags(p, "cp_float8_rank<RANK>.json")  # workbook: --metrics-dir
    args = p.parse_args(argv)
    for name in ("seq_len", "n_heads", "head_dim", "matmul_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.matmul_size % 16:
        p.error(f"--matmul-size must be a multiple of 16 (float8 matmul shapes), got {args.matmul_size}")
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
    else:  # a DeviceMesh needs a process group even alone
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    world_size = dist.get_world_size()
    if args.seq_len % (2 * world_size):
        raise ValueError(f"--seq-len {args.seq_len} must be divisible by 2 x WORLD_SIZE = {2 * world_size}: context "
                         f"parallelism gives each rank two equal chunks of the sequence (causal load balancing)")
    return dist.get_rank(), world_size, device


def lesson_context_parallel(args, rank, world_size, device):
    """Causal attention over a sequence split across the ranks, against the whole sequence."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, context_parallel_unshard
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("cp",))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # flash attention computes in bf16 / fp16
    g = torch.Generator().manual_seed(args.seed)
    q, k, v = (torch.randn(2, args.n_heads, args.seq_len, args.head_dim, generator=g).to(device, dtype)
               for _ in range(3))  # the same tensors on every rank
    whole = [t.clone() for t in (q, k, v)]  # context_parallel shards q, k and v in place
    # torch's default, ALL_GATHER on 2.8 and 2.13: every rank gathers the whole sequence's K and V (not a ring)
    out = {"dtype": str(dtype).replace("torch.", ""), "global_shape": list(q.shape),
           "rotate_method": _cp_options.rotate_method.name}
    try:
        with undo_context_parallel_patches(), context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            out["local_shape"] = list(q.shape)  # inside: each rank holds 1/N of the sequence of q, k and v
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # attention over the cp mesh's K and V
        (y,) = context_parallel_unshard(mesh, [y], [2])  # the whole sequence again, in order
    except (NotImplementedError, ImportError) as e:  # ImportError: torch's context parallelism imports numpy
        return {**out, "ran": False, "reason": f"{type(e).__name__}: {e}"}
    reference = F.scaled_dot_product_attention(*whole, is_causal=True)  # one process, the whole sequence
    return {**out, "ran": True, "output_max_abs_diff": (y.float() - reference.float()).abs().max().item(),
            "output_max_abs": reference.float().abs().max().item()}


def lesson_float8(args, rank, world_size, device):
    """One matmul in float8 with per-tensor scales, against bf16 and fp32 (and their times, CUDA events)."""
    if device.type != "cuda":
        return {"ran": False, "reason": f"float8 matmuls (torch._scaled_mm) need a CUDA GPU with compute capability "
                                        f">= {FLOAT8_MIN_CAPABILITY[0]}.{FLOAT8_MIN_CAPABILITY[1]} (Ada: RTX 4090, "
                                        f"4090D; Hopper); this rank runs on {device}"}
    capability = torch.cuda.get_device_capability(device)
    if capability < FLOAT8_MIN_CAPABILITY:
        return {"ran": False, "reason": f"{torch.cuda.get_device_name(device)} has compute capability "
                                        f"{capability[0]}.{capability[1]}; float8 matmuls need >= 8.9"}
    n = args.matmul_size
    g = torch.Generator().manual_seed(args.seed)
    a = torch.randn(n, n, generator=g).to(device, torch.bfloat16)  # activations (rows: tokens)
    w = torch.randn(n, n, generator=g).to(device, torch.bfloat16)  # a Linear's weight (out features, in features)
    fp8_max = torch.finfo(torch.float8_e4m3fn).max  # 448
    # Per-tensor scaling: divide by amax / 448 so the largest value lands on float8's largest, cast, and hand the
    # scales to the matmul, which multiplies them back in (torchao's dynamic scaling does exactly this per Linear).
    scale_a, scale_w = a.abs().max().float() / fp8_max, w.abs().max().float() / fp8_max
    a8, w8 = (a / scale_a).to(torch.float8_e4m3fn), (w / scale_w).to(torch.float8_e4m3fn)

    def float8_matmul():  # the second operand must be column-major: w8.t() of a row-major (out, in) weight is
        return torch._scaled_mm(a8, w8.t(), scale_a=scale_a, scale_b=scale_w, out_dtype=torch.bfloat16)

    exact = a.float() @ w.float().t()
    results = {"ran": True, "device_name": torch.cuda.get_device_name(device), "capability": list(capability),
               "bytes_per_element": {"float8_e4m3fn": a8.element_size(), "bfloat16": a.element_size()}}
    for label, fn in (("float8", float8_matmul), ("bf16", lambda: a @ w.t())):
        y = fn()
        results[f"{label}_rel_error"] = ((y.float() - exact).norm() / exact.norm()).item()
        results[f"{label}_ms"] = cuda_time_ms(fn)
    return results


@contextlib.contextmanager
def undo_context_parallel_patches():
    """Put ``F.scaled_dot_product_attention`` and DTensor's SDPA handlers back, whatever happened inside.

    torch 2.8's ``context_parallel`` patches both and restores them only when its block ends without an exception;
    after the CPU's NotImplementedError the process would keep the ring-attention SDPA (2.13 restores them itself).
    """
    from torch.distributed.tensor import DTensor
    sdpa, handlers = F.scaled_dot_product_attention, DTensor._op_dispatcher._custom_op_handlers
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa
        DTensor._op_dispatcher._custom_op_handlers = handlers


def cuda_time_ms(fn, repeats=10):
    """Median time of ``fn`` on the GPU in ms (CUDA events), after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    rank, world_size, device = setup(args)
    try:
        lessons = {"context_parallel": lesson_context_parallel, "float8": lesson_float8}
        result = {"rank": rank, "world_size": world_size, "torch": torch.__version__, "device": str(device),
                  "args": vars(args)}
        for name in args.lessons:
            result[name] = lessons[name](args, rank, world_size, device)
            if rank == 0:
                ran = result[name]["ran"]
                sys.stdout.write(f"{name}: {'ran' if ran else 'did not run'} on {world_size} rank(s)"
                                 f"{'' if ran else ': ' + result[name]['reason']}\n")
            dist.barrier()
        if workbook:  # workbook
            workbook.write_rank_json(args, "cp_float8_rank<RANK>.json", result)  # workbook: what notebook 12 reads
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
