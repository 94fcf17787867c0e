import json
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 1))
for layer in (model[0], model[2]):
    fully_shard(layer)  # two units; the root (the last layer) is the third
fully_shard(model)
for m in model.modules():  # sum, then divide: right on gloo in every torch version (notebook 09, section 4)
    if isinstance(m, FSDPModule):
        m.set_force_sum_reduction_for_comms(True)
K = 4  # micro-batches per optimizer step
x = torch.randn(K, 8, 16)  # each micro-batch: a global batch of 8 samples, the same on every rank
y = x.sum(-1, keepdim=True)
mine = slice(rank, None, world_size)  # this rank's share of each micro-batch
with torch.profiler.profile() as prof:  # counts the collectives of one optimizer step
    for micro in range(K):
        # The fix: no reduce-scatter until the last micro-batch. FSDP accumulates the unsharded gradients locally and
        # reduce-scatters their sum once, in the last backward: one reduce-scatter per unit instead of K.
        model.set_requires_gradient_sync(micro == K - 1)
        loss = nn.functional.mse_loss(model(x[micro][mine]), y[micro][mine]) / K
        loss.backward()
reduce_scatters = sum(e.name == "c10d::_reduce_scatter_base_" for e in prof.events())
norms = [p.grad.full_tensor().norm().item() for p in model.parameters()]  # of the accumulated gradients
print("check", json.dumps({"reduce_scatters": reduce_scatters, "grad_norms": norms}))
dist.destroy_process_group()
