import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch", type=int, default=8)  # each micro-batch's global batch: every rank takes a share
parser.add_argument("--micro-batches", type=int, default=4)  # K: micro-batches per optimizer step
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
# The fix, three settings for the step's three kinds of collective. A unit kept whole from its forward to its backward
# (the root is, by default) needs no all-gather in backward.
for layer in (model[0], model[2]):
    fully_shard(layer, reshard_after_forward=False).set_force_sum_reduction_for_comms(True)  # sum, then divide
fully_shard(model).set_force_sum_reduction_for_comms(True)  # the root: the head, the third unit
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # built after fully_shard: it steps the shards
K, mine = args.micro_batches, slice(rank, None, world_size)  # this rank's share of each micro-batch
for step in range(1, 3):
    x = torch.randn(K, args.batch, 16)  # K micro-batches, the same on every rank (same seed)
    for micro in range(K):
        # Until the last micro-batch: no reduce-scatter (each rank accumulates the unsharded gradients), and the units
        # stay gathered after backward, so the next forward gathers nothing. The last backward reduce-scatters the
        # sum once per unit and frees the units: the optimizer then changes the shards, and the next step's forward
        # must gather them again (kept gathered, it would run on the weights before the step).
        last = micro == K - 1
        model.set_requires_gradient_sync(last)
        model.set_reshard_after_backward(last)
        loss = nn.functional.mse_loss(model(x[micro][mine]), x[micro][mine, :1]) / K
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item() * K:.4f}")  # the last micro-batch's
dist.destroy_process_group()
