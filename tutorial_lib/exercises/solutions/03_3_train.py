import argparse
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--max-norm", type=float, default=1.0)  # the clipping threshold
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
for step in range(1, 6):
    x = torch.randn(16, 8)[rank::world_size]  # this rank's half of the global batch
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x), 3 * x.sum(1, keepdim=True))
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    # The fix: unscale_ first. Before it the gradients are still multiplied by the scale (1024 here), so clipping
    # saw a norm 1024 times too large, clipped every step down to max_norm, and the scaler's division then left
    # the optimizer a gradient of norm max_norm / 1024. After unscale_, clipping sees and bounds the true norm.
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)  # the norm it measured, before clipping
    scaler.step(optimizer)  # skipped if a gradient is inf/NaN
    scaler.update()
    print(f"rank {rank} step {step}: scale {scaler.get_scale():g}, clipping measured a gradient norm of {norm:.4g}")
dist.destroy_process_group()
