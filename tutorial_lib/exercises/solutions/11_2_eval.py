import json
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(16, 256)  # a stand-in LM head: the same weights on every rank (same seed)
lengths = [40, 8, 24, 16, 64]  # five held-out windows of different lengths (tokens)
sums = torch.zeros(2, dtype=torch.float64)  # [sum of token losses, tokens]
for w in range(rank, len(lengths), world_size):  # this rank's windows: w = rank, rank + W, ...
    g = torch.Generator().manual_seed(w)
    x, y = torch.randn(lengths[w], 16, generator=g), torch.randint(0, 256, (lengths[w],), generator=g)
    with torch.no_grad():
        losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
    sums += torch.tensor([losses.sum().item(), float(lengths[w])], dtype=torch.float64)
tokens_scored = int(sums[1])
# The fix: all-reduce the sums and the counts, then divide: every token weighs the same, whatever the split.
dist.all_reduce(sums)
eval_loss = (sums[0] / sums[1]).item()
print("check", json.dumps({"eval_loss": eval_loss, "tokens_scored": tokens_scored}))
dist.destroy_process_group()
