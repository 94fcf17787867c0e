import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=1)  # the seed of the model and of the data
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)  # the same data and initial weights on every rank
x = torch.randn(256, 16)
y = torch.tanh(x @ torch.randn(16, 1) / 2) + 0.1 * torch.randn(256, 1)  # the target: a signal, and noise
blocks = [nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)]
model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), *blocks, nn.Linear(64, 1)))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
mine = slice(rank, None, world_size)  # this rank's half of the batch
for step in range(1, 11):
    loss = nn.functional.mse_loss(model(x[mine]), y[mine])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    held_bytes = sum(t.nbytes for p in model.parameters() for t in (p, p.grad))  # every parameter and its gradient
    held_bytes += sum(t.nbytes for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    print(f"rank {rank} step {step}: loss {loss.item():.5f}, parameters + gradients + AdamW state {held_bytes:,} bytes")
dist.destroy_process_group()
