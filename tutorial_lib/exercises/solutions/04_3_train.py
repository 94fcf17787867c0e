import json
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
torch.manual_seed(0)
blocks = [nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(4)]
model = nn.Sequential(nn.Linear(8, 32), *blocks, nn.Linear(32, 1))
# The fix: one unit per block, then the root (bottom-up). Each unit is all-gathered just before it runs and freed
# after, so only one block's full parameters exist at a time. U = 5 units: 2U - 1 = 9 all-gathers per step (each
# block in forward and again in backward; the root stays gathered until its backward) and U = 5 reduce-scatters.
for block in blocks:
    fully_shard(block)
fully_shard(model)  # the root: the first and last Linear
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
OPS = {"c10d::_allgather_base_": "all_gathers", "c10d::_reduce_scatter_base_": "reduce_scatters"}
x = torch.randn(8, 8)
for step in range(1, 3):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss = model(x).pow(2).mean()
        loss.backward()  # forward and backward: every collective FSDP2 issues in a step
    optimizer.step()
    optimizer.zero_grad()
    counts = {name: sum(e.name == op for e in prof.events()) for op, name in OPS.items()}
    param_bytes = sum(p.to_local().nbytes for p in model.parameters())  # this rank's shards
    print("check", json.dumps({"step": step, "param_bytes": param_bytes, **counts}))
dist.destroy_process_group()
