import argparse
import contextlib
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--micro-batches", type=int, default=4)  # K: micro-batches of 4 samples per rank and step
parser.add_argument("--max-norm", type=float, default=0.3)  # the clipping threshold
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
K = args.micro_batches
torch.manual_seed(args.seed)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8)))
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
x = torch.randn(world_size * 4 * K, 8)  # the global batch, the same on every rank
y = torch.tanh(x @ torch.randn(8, 8))  # a teacher's targets
# fp16 keeps small gradients only when the loss is scaled before backward() (section 2); GradScaler("cpu") starts at
# 65536, which these gradients never overflow, so it stays there.
scaler = torch.amp.GradScaler("cpu")
for step in range(1, 7):
    mine = slice(rank, None, world_size)  # this rank's share: 4 x K samples, K times what fits at once
    xs, ys = x[mine].chunk(K), y[mine].chunk(K)  # K micro-batches of 4, one at a time
    for k in range(K):
        # Notebook 02, section 3: only the last micro-batch's backward() all-reduces; the others add their gradients
        # to .grad on the rank (no_sync), and the last one's all-reduce carries the sum.
        with model.no_sync() if k < K - 1 else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(xs[k]), ys[k]) / K  # K of them make the step's mean
            scaler.scale(loss).backward()  # the scaled loss: fp16 keeps the small gradients
    # Once per step, after the last backward(): unscale_ divides the scale out of .grad, so clip_grad_norm_ measures
    # and bounds the true gradient (section 5c); scaler.step then steps (or skips a step with inf/NaN gradients),
    # and update() adjusts the scale for the next step.
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    print(f"rank {rank} step {step}: loss {loss.item() * K:.4f} (last micro-batch), gradient norm {norm:.4g}, "
          f"scale {scaler.get_scale():g}")
dist.destroy_process_group()
