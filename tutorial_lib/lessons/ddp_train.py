"""DDP training of a small MLP on a synthetic dataset: the pattern every later lesson builds on.

    python ddp_train.py --max-steps 20                       # one process, no process group
    torchrun --nproc-per-node 2 ddp_train.py --max-steps 20  # 2 ranks (gloo on CPU, nccl on CUDA)
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 \
        --master-addr HOST --master-port 29500 ddp_train.py   # node 0 of 2 (run node 1 with --node-rank 1)
    torchrun --nproc-per-node 2 ddp_train.py --precision fp16 --compile  # fp16 + GradScaler, torch.compile

It shows: the device comes from LOCAL_RANK, never RANK; a DistributedSampler gives each rank its own share of every
epoch's shuffle; DDP averages gradients in ``backward()``, so W ranks with batch B step as one process with batch W*B;
the global loss needs an all_reduce; ``torch.autocast`` with ``torch.amp.GradScaler``; a short process-group timeout,
``@record`` and ``destroy_process_group``. Only torch and the standard library. In a workbook run, ``_workbook.py``
beside it adds the notebooks' measurements and failures on purpose (``--metrics-dir``, ``--fail-rank``, ...).
"""

import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:  # the workbook's instruments, written beside this file in a workbook run; a copy trains without them
    import _workbook as workbook
except ImportError:
    workbook = None


class NoRecorder:  # stands in for _workbook.StepRecorder in a copy without _workbook.py: every call does nothing
    def __getattr__(self, name):
        return lambda *args: None


AMP_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # --precision -> autocast dtype


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default, help in [("--max-steps", 50, "optimizer steps"), ("--batch-size", 32, "samples per rank"),
                                ("--dataset-size", 8192, "samples"), ("--input-dim", 64, "features per sample"),
                                ("--hidden-dim", 256, "hidden width"), ("--output-dim", 8, "targets per sample"),
                                ("--log-every", 10, "print every N steps"), ("--seed", 0, "of model, data, shuffle")]:
        p.add_argument(name, type=int, default=default, help=help)
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if available")
    p.add_argument("--pg-timeout-s", type=float, default=60.0, help="collective timeout (s): torch's is 10+ min")
    p.add_argument("--precision", choices=list(AMP_DTYPES), default="fp32",
                   help="autocast's compute dtype; parameters, gradients and optimizer state stay fp32")
    p.add_argument("--grad-scaler", choices=["auto", "on", "off"], default="auto", help="GradScaler: auto = fp16 only")
    p.add_argument("--init-scale", type=float, default=2.0 ** 16, help="the scaler's first loss scale (> 0)")
    p.add_argument("--loss-weight", type=float, default=1.0, help="scale the loss (small: fp16 gradients underflow)")
    p.add_argument("--clip-grad-norm", type=float, default=0.0, help="clip the gradients' L2 norm (0: off)")
    p.add_argument("--clip-before-unscale", action="store_true", help="the mistake: clip still-scaled gradients")
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP's largest gradient bucket (MiB)")
    p.add_argument("--compile", action="store_true", help="DDP(torch.compile(model))")
    p.add_argument("--compile-backend", type=str, default="inductor", help="inductor, or aot_eager (no C++ needed)")
    p.add_argument("--no-optimize-ddp", action="store_true", help="with --compile: one graph, no split at buckets")
    if workbook:
        workbook.add_flags(p)  # workbook: --metrics-dir, --fail-rank, --profile-steps, ...
    args = p.parse_args(argv)
    for name in ("max_steps", "batch_size", "dataset_size", "input_dim", "hidden_dim", "output_dim", "log_every",
                 "pg_timeout_s", "init_scale", "loss_weight", "bucket_cap_mb"):  # refuse bad values before starting
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.clip_grad_norm < 0:
        p.error(f"--clip-grad-norm must be >= 0 (0: off), got {args.clip_grad_norm}")
    if args.clip_before_unscale and not args.clip_grad_norm:
        p.error("--clip-before-unscale needs --clip-grad-norm > 0")
    if args.no_optimize_ddp and not args.compile:
        p.error("--no-optimize-ddp changes how torch.compile splits the graph: it needs --compile")
    if workbook:
        workbook.check_flags(p, args)  # workbook
    return args


def setup(args):
    """Join the process group when launched by torchrun; return (rank, local_rank, world_size, device)."""
    rank = int(os.environ.get("RANK", 0))  # torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): use cpu")
    # LOCAL_RANK, not RANK: on node 1 of a 4-GPU-per-node job, RANK is 4..7 but the GPUs are 0..3.
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if "RANK" in os.environ:  # under torchrun; `python ddp_train.py` trains alone, without a process group
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", device_id=device if use_cuda else None,
                                timeout=timedelta(seconds=args.pg_timeout_s))  # a hang errors after this
    return rank, local_rank, world_size, device


def teacher_dataset(size, input_dim, output_dim, seed):
    """``size`` samples: x ~ N(0, 1), y = a fixed random two-layer "teacher" network of x, plus noise. Everything
    comes from ``seed``, so every rank builds the very same dataset and the sampler decides who reads what."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, input_dim, generator=g)
    w1 = torch.randn(input_dim, 32, generator=g) / input_dim ** 0.5
    w2 = torch.randn(32, output_dim, generator=g) / 32 ** 0.5
    return TensorDataset(x, torch.tanh(x @ w1) @ w2 + 0.01 * torch.randn(size, output_dim, generator=g))


class MLP(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, hidden_dim),
                                 nn.ReLU(), nn.Linear(hidden_dim, output_dim))

    def forward(self, x):
        return self.net(x)


def make_model(args, local_rank, device):
    torch.manual_seed(args.seed)  # the same weights on every rank, and in a one-process reference run
    model = MLP(args.input_dim, args.hidden_dim, args.output_dim).to(device)  # fp32 weights in every precision
    if args.compile:
        # Compile, then wrap: Dynamo cuts the graph at DDP's buckets so all-reduces overlap backward (notebook 14).
        torch._dynamo.config.optimize_ddp = not args.no_optimize_ddp
        model.compile(backend=args.compile_backend)  # in place: the state_dict keeps its names
    if dist.is_initialized():
        # DDP broadcasts rank 0's parameters, then all-reduces (averages) the gradients in buckets (25 MiB by default,
        # the first 1 MiB), each as soon as its gradients are ready, while backward goes on (notebooks 08 and 10).
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_cap_mb)
    return model


def train(args, rank, local_rank, world_size, device):
    dataset = teacher_dataset(args.dataset_size, args.input_dim, args.output_dim, seed=args.seed)
    # The same seed on every rank: all agree on the permutation and each takes every world_size-th index, so no sample
    # is seen twice in an epoch. drop_last: every rank gets a full batch every step (the default pads with repeats).
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        sys.exit(f"--dataset-size {args.dataset_size} gives each of {world_size} ranks under --batch-size samples")
    model = make_model(args, local_rank, device)
    optimizer = (torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.SGD)(model.parameters(), lr=args.lr)
    amp_dtype = AMP_DTYPES[args.precision]  # None: fp32, autocast off
    use_scaler = args.grad_scaler == "on" or (args.grad_scaler == "auto" and args.precision == "fp16")
    scaler = torch.amp.GradScaler(device.type, init_scale=args.init_scale, enabled=use_scaler)  # off: a pass-through
    recorder = workbook.StepRecorder(args, device, model, optimizer, scaler) if workbook else NoRecorder()  # workbook
    step, epoch = 0, 0
    while step < args.max_steps:
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank; without it epochs repeat
        for x, y in loader:
            step += 1
            recorder.begin(step)  # workbook: --fail-rank/--fail-step
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = nn.functional.mse_loss(model(x), y)  # inside autocast too: it runs mse_loss in fp32 itself
            # DDP all-reduces the fp32 gradient buckets while backward runs. The scaler multiplies the loss first,
            # so fp16 gradients stay above the 3e-8 below which fp16 rounds to 0.
            scaler.scale(loss * args.loss_weight).backward()
            if not args.clip_before_unscale:
                scaler.unscale_(optimizer)  # divide by the scale now: clipping must see the true gradients
            recorder.gradients(step)  # workbook: gradient norm and zeros before clipping
            if args.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            scaler.step(optimizer)  # calls optimizer.step() only if every gradient is finite
            scaler.update()  # halves the scale after a skipped step, doubles it after 2000 good ones
            loss_global = loss.detach().float().clone()  # this rank's loss is local; all_reduce works in place
            if dist.is_initialized() and not recorder.skips_collective(step):  # workbook: --fail-mode
                dist.all_reduce(loss_global, op=dist.ReduceOp.SUM)  # SUM, then divide: every backend has SUM
                loss_global /= world_size
            if step % args.log_every == 0 or step == args.max_steps:  # one write per line: ranks never interleave
                sys.stdout.write(f"step {step}/{args.max_steps}: loss {loss_global.item():.5f} (this rank's "
                                 f"{loss.item():.5f}), epoch {epoch}\n")
            recorder.step_done(step, loss, loss_global)  # workbook: one JSON line per step
            if step == args.max_steps:
                break
        epoch += 1
    recorder.close()  # workbook
    if dist.is_initialized():
        dist.barrier()  # nobody tears the process group down while a peer still uses it


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    rank, local_rank, world_size, device = setup(args)
    try:
        train(args, rank, local_rank, world_size, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()  # also after an error: leave cleanly, the peers see this rank go


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
