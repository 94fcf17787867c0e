import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch", type=int, default=16)  # the global batch: every rank builds it, each takes a share
args = parser.parse_args()
dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)
x = torch.randn(args.batch, 8)  # the same tensor on every rank (same seed)
y = x.sum(dim=1, keepdim=True)
model = DDP(torch.nn.Linear(8, 1))  # DDP copies rank 0's initial weights to every rank
mine = slice(rank, None, world_size)  # this rank's share: samples rank, rank + W, rank + 2W, ...
loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])  # the mean over this rank's samples
# The fix: no scaling. DDP *averages* the ranks' gradients in backward(), and the average of the ranks' mean
# losses (equal shares) is the mean over the whole batch: dividing by world_size again made them W times too small.
loss.backward()
grad = torch.cat([p.grad.flatten() for p in model.parameters()])
print(f"rank {rank}: gradient norm {grad.norm().item():.6f}")
dist.destroy_process_group()
