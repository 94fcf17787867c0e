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
x = torch.randn(256, 32)
y = torch.tanh(x @ torch.randn(32, 8) / 4)  # the target
net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                    nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
model = DDP(net)  # DDP's default buckets
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
mine = slice(rank, None, world_size)  # this rank's half of the batch
for step in range(1, 7):
    loss = nn.functional.mse_loss(model(x[mine]), y[mine])
    optimizer.zero_grad()
    loss.backward()  # DDP all-reduces each bucket once its last gradient is ready, while backward goes on
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
