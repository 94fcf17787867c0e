import argparse
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch", type=int, default=16)  # the global batch: each rank takes half
args = parser.parse_args()
dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# The fix: torch.amp.GradScaler("cpu"). Seed 000's torch.cuda.amp.GradScaler() is deprecated and CUDA-only: on a
# machine without CUDA it warns and returns a *disabled* scaler (scale 1.0), so the fp16 backward ran unscaled and
# every gradient below about 3e-8 rounded to 0. Scaled by 65536 they survive; unscale_ divides it out in fp32.
scaler = torch.amp.GradScaler("cpu")
LOSS_WEIGHT = 1e-8  # a weighted auxiliary loss: its gradients are tiny
for step in range(1, 4):
    x = torch.randn(args.batch, 8)[rank::world_size]  # this rank's half of the global batch
    with torch.autocast("cpu", dtype=torch.float16):  # the matmuls run in fp16
        out = model(x)
        loss = LOSS_WEIGHT * torch.nn.functional.mse_loss(out, x.sum(1, keepdim=True))
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # the gradients as the optimizer will see them
    zeros = sum((p.grad == 0).sum().item() for p in model.parameters())
    print(f"rank {rank} step {step}: output {out.dtype}, scale {scaler.get_scale():g}, {zeros} gradient entries are 0")
    scaler.step(optimizer)
    scaler.update()
dist.destroy_process_group()
