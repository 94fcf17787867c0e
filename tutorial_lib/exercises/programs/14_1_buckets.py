"""Exercise 14.1: a model of --blocks blocks (Linear(512, 512, bias=False) + ReLU: one 1 MiB weight each), compiled
(model.compile(backend="aot_eager")) and then wrapped in DDP with --bucket-cap-mb, dynamo's DDPOptimizer on or off
(--optimize-ddp); three training steps on 2 ranks. The check counts, from the observer's records, the all-reduces
rank 0 issues in the last step (DDP rebuilt its buckets after the first one).

    torchrun --nproc-per-node 2 14_1_buckets.py --blocks 5 --bucket-cap-mb 2 --optimize-ddp off
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--blocks", type=int, default=4, help="blocks of one 512 x 512 fp32 weight (1 MiB) each (count)")
parser.add_argument("--bucket-cap-mb", type=float, default=1, help="DDP's bucket_cap_mb (MiB; at least 1 here)")
parser.add_argument("--optimize-ddp", choices=["on", "off"], default="on",
                    help="torch._dynamo.config.optimize_ddp: cut the compiled graph where DDP's buckets end")
args = parser.parse_args()


class Blocks(nn.Module):  # a class of the script's own: dynamo traces its forward (torch's own modules it skips)
    def __init__(self, n):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(512, 512, bias=False) for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


dist.init_process_group("gloo")
torch._dynamo.config.optimize_ddp = args.optimize_ddp == "on"
torch.manual_seed(0)
model = Blocks(args.blocks)
model.compile(backend="aot_eager")  # compile, then wrap: DDP's hooks stay outside the compiled code
ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
for step in range(1, 4):
    x = torch.randn(4, 512)
    loss = ddp(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
