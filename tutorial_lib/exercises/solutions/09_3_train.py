import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch", type=int, default=8)  # each micro-batch's global batch: every rank takes a share
parser.add_argument("--micro-batches", type=int, default=4)  # K: micro-batches per optimizer step
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 1))
for layer in (model[0], model[2]):
    fully_shard(layer)  # two units; the root (the last layer) is the third
fully_shard(model)
for m in model.modules():  # sum, then divide: right on gloo in every torch version (notebook 09, section 4)
    if isinstance(m, FSDPModule):
        m.set_force_sum_reduction_for_comms(True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # built after fully_shard: it steps the shards
K, mine = args.micro_batches, slice(rank, None, world_size)  # this rank's share of each micro-batch
for step in range(1, args.steps + 1):
    x = torch.randn(K, args.batch, 16)  # K micro-batches, the same on every rank (same seed)
    y = x.sum(-1, keepdim=True)
    with torch.profiler.profile() as prof:  # counts this step's collectives
        for micro in range(K):
            # The fix: no reduce-scatter until the last micro-batch. FSDP accumulates the unsharded gradients locally
            # and reduce-scatters their sum once, in the last backward: one reduce-scatter per unit instead of K.
            model.set_requires_gradient_sync(micro == K - 1)
            loss = nn.functional.mse_loss(model(x[micro][mine]), y[micro][mine]) / K
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    reduce_scatters = sum(e.name == "c10d::_reduce_scatter_base_" for e in prof.events())
    if rank == 0:
        print(f"step {step}: {reduce_scatters} reduce-scatters for {K} micro-batches")
dist.destroy_process_group()
