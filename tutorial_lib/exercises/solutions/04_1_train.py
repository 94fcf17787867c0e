import json
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
torch.manual_seed(0)  # every rank builds the same model (FSDP2 keeps each rank's own shard of it)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)  # one unit per Linear
fully_shard(model)  # the root
# The fix: build the optimizer *after* fully_shard. fully_shard replaces every parameter with a new DTensor (this
# rank's shard); an optimizer built before holds the old, full tensors, which no longer belong to the model: they
# never get a gradient, so it never steps and keeps no state, and the model does not learn.
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
def local(t):  # a DTensor's shard on this rank, else the tensor itself
    return t.to_local() if hasattr(t, "to_local") else t
x = torch.randn(8, 16)
for step in range(1, 4):
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    state = [local(t) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    print("check", json.dumps({"step": step, "loss": loss.item(),
                               "param_bytes": sum(local(p).nbytes for p in model.parameters()),
                               "optimizer_bytes": sum(t.nbytes for t in state)}))
dist.destroy_process_group()
