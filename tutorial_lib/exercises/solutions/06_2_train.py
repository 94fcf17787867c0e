import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--samples", type=int, default=32)  # the data set's size
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)
x = torch.randn(args.samples, 4)
dataset = TensorDataset(x, x.sum(1, keepdim=True))  # the same data set on every rank (same seed)
# The fix: split the data set over the whole world (global RANK and WORLD_SIZE; DistributedSampler's defaults).
# LOCAL_RANK / LOCAL_WORLD_SIZE number one node's ranks only: every node trained on the same halves of the data.
sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
inputs, targets = dataset[list(sampler)]  # this rank's share
model = DDP(torch.nn.Linear(4, 1))  # DDP copies rank 0's initial weights to every rank
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = torch.nn.functional.mse_loss(model(inputs), targets)
optimizer.zero_grad()
loss.backward()  # DDP averages the gradients of all ranks, on both nodes
optimizer.step()
print(f"rank {rank} on node {os.environ['GROUP_RANK']}: samples {list(sampler)}")
dist.destroy_process_group()
