import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--blocks", type=int, default=4)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(args.seed)
blocks = [nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(args.blocks)]
model = nn.Sequential(nn.Linear(8, 32), *blocks, nn.Linear(32, 1))
# The fix: one unit per block, then the root (bottom-up). Each unit is all-gathered just before it runs and freed
# after, so only one block's full parameters exist at a time. U = blocks + 1 units: 2U - 1 all-gathers per step (each
# block in forward and again in backward; the root stays gathered until its backward) and U reduce-scatters.
for block in blocks:
    fully_shard(block)
fully_shard(model)  # the root: the first and last Linear
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(8, 8)
for step in range(1, 3):
    loss = model(x).pow(2).mean()
    loss.backward()  # FSDP2 all-gathers a unit before its forward and backward, reduce-scatters after its backward
    optimizer.step()
    optimizer.zero_grad()
    print(f"rank {rank} step {step}: loss {loss.item():.5f}")
dist.destroy_process_group()
