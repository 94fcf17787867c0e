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
x = torch.randn(512, 32)
y = torch.tanh(x @ torch.randn(32, 1) / 4) + 0.3 * torch.randn(512, 1)  # the target: a signal, and noise
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
mine = slice(rank, None, world_size)  # this rank's half of the batch
for step in range(1, 21):
    loss = nn.functional.mse_loss(model(x[mine]), y[mine])
    optimizer.zero_grad()
    loss.backward()  # DDP all-reduces the gradients (one bucket of 25,348 bytes) while backward runs
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
