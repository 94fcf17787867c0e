import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch", type=int, default=8)
args = parser.parse_args()
dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank = dist.get_rank()
torch.manual_seed(args.seed)  # every rank builds the same model (FSDP2 keeps each rank's own shard of it)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)  # one unit per Linear
fully_shard(model)  # the root
# The fix: build the optimizer *after* fully_shard. fully_shard replaces every parameter with a new DTensor (this
# rank's shard); an optimizer built before holds the old, full tensors, which no longer belong to the model: they
# never get a gradient, so it never steps them, keeps no state, and the model does not learn.
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
x = torch.randn(args.batch, 16)
for step in range(1, 4):
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    state_bytes = sum(t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes
                      for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    print(f"rank {rank} step {step}: loss {loss.item():.5f}, optimizer state {state_bytes} bytes")
dist.destroy_process_group()
