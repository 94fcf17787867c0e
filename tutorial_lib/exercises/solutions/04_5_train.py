import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=1)  # the seed of the model and of the data
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)  # the same data and initial weights on every rank
x = torch.randn(256, 16)
y = torch.tanh(x @ torch.randn(16, 1) / 2) + 0.1 * torch.randn(256, 1)  # the target: a signal, and noise
blocks = [nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)]
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), *blocks, nn.Linear(64, 1))
# FSDP2 instead of DDP: every rank keeps 1/world_size of each parameter, of its gradient (a reduce-scatter instead
# of an all-reduce: the same average, each rank getting its own shard) and of AdamW's two moments, built for the
# shards. One unit per block, then the root (the input and output layers): a block's full weights exist only while
# it runs, gathered before its forward and again before its backward.
for block in blocks:
    fully_shard(block)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)  # after fully_shard: it steps the shards
mine = slice(rank, None, world_size)  # this rank's half of the batch
for step in range(1, 11):
    loss = nn.functional.mse_loss(model(x[mine]), y[mine])
    optimizer.zero_grad()
    loss.backward()  # FSDP2 reduce-scatters each unit's gradients: this rank keeps the average of its shard
    optimizer.step()
    local = [t.to_local() if hasattr(t, "to_local") else t for p in model.parameters() for t in (p, p.grad)]
    local += [t.to_local() if hasattr(t, "to_local") else t
              for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    held_bytes = sum(t.nbytes for t in local)  # this rank's shards: its parameters, gradients and AdamW state
    print(f"rank {rank} step {step}: loss {loss.item():.5f}, parameters + gradients + AdamW state {held_bytes:,} bytes")
dist.destroy_process_group()
