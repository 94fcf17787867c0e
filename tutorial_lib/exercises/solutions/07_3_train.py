import argparse
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()
dist.init_process_group("gloo", timeout=timedelta(seconds=3))  # a hang becomes an error after 3 s
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed + rank)  # each rank draws its own batches (DDP copies rank 0's weights)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, args.steps + 1):
    x = torch.randn(16, 8)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    # The fix: the all_reduce is a collective, so EVERY rank calls it; only the logging stays on rank 0. Inside
    # `if rank == 0:` rank 0 waited in it while rank 1 went on to the next step's gradient all-reduce: a hang.
    global_loss = loss.detach().clone()
    dist.all_reduce(global_loss)
    if rank == 0:  # only rank 0 logs
        print(f"step {step}: global loss {global_loss.item() / world_size:.4f}")
dist.destroy_process_group()
