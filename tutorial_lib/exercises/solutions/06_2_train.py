import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
dataset = torch.arange(32)  # sample indices 0..31
# The fix: split the data set over the whole world (global RANK and WORLD_SIZE; DistributedSampler's defaults).
# LOCAL_RANK / LOCAL_WORLD_SIZE number one node's ranks only: every node trained on the same half of the data.
sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
samples = [int(dataset[i]) for i in sampler]
model = torch.nn.Linear(1, 1)
loss = (model(dataset[samples].float().unsqueeze(1)) ** 2).mean()
loss.backward()
for p in model.parameters():
    dist.all_reduce(p.grad)
print("check", json.dumps({"node": int(os.environ["GROUP_RANK"]), "samples": samples}))
dist.destroy_process_group()
