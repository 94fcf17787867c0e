import contextlib
import json

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
K = 4  # micro-batches per optimizer step
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
calls = [0]


def counting_hook(state, bucket):  # DDP calls it once per bucket it all-reduces
    calls[0] += 1
    return allreduce_hook(state, bucket)


model.register_comm_hook(None, counting_hook)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 3):
    x = torch.randn(K, 8, 8)  # the global batch: K micro-batches of 8 samples, the same on every rank
    y = x.sum(dim=2, keepdim=True)
    per_micro = []
    for k in range(K):
        calls[0] = 0
        mine = slice(rank, None, world_size)
        # The fix: the first K - 1 backward() calls keep their gradients local (no_sync); the last one all-reduces
        # the sum the micro-batches accumulated. Same gradients, 1/K of the all-reduces.
        with model.no_sync() if k < K - 1 else contextlib.nullcontext():
            loss = torch.nn.functional.mse_loss(model(x[k][mine]), y[k][mine]) / K
            loss.backward()
        per_micro.append(calls[0])
    optimizer.step()
    optimizer.zero_grad()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    print("check", json.dumps({"step": step, "allreduce_calls": per_micro, "params": params.tolist()}))
dist.destroy_process_group()
