import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.head_a, self.head_b = nn.Linear(8, 16), nn.Linear(16, 1), nn.Linear(16, 1)

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        return self.head_a(h), self.head_b(h)


parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(args.seed)
model = DDP(TwoHeads())  # the fix keeps find_unused_parameters off (its default): no extra collective per step
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(1, 6):
    x = torch.randn(8, 8)
    a, b = model(x)
    # The fix: every parameter gets a gradient in every step. Head b joins the loss with weight 0: its gradients
    # are zeros, DDP's buckets all fill, and the training is unchanged.
    loss = nn.functional.mse_loss(a, x.sum(1, keepdim=True)) + 0.0 * b.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
