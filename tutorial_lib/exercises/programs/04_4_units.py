"""Exercise 04.4: an MLP of --blocks blocks between an input and an output Linear, each block its own FSDP2 unit with
--reshard-after-forward, then the root; two training steps on 2 ranks. The check counts, from the observer's records,
the all-gathers rank 1 issues in the second step (the first one is the same: FSDP2 needs no warm-up step).

    torchrun --nproc-per-node 2 04_4_units.py --blocks 4 --reshard-after-forward false
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--blocks", type=int, default=4, help="blocks between the input and the output Linear (count)")
parser.add_argument("--reshard-after-forward", choices=["true", "false"], default="true",
                    help="each block's fully_shard(reshard_after_forward=...): free its gathered weights after forward")
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)  # every rank builds the same model; FSDP2 keeps each rank's shard of it
blocks = [nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(args.blocks)]
model = nn.Sequential(nn.Linear(8, 32), *blocks, nn.Linear(32, 1))
for block in blocks:
    fully_shard(block, reshard_after_forward=args.reshard_after_forward == "true")
fully_shard(model)  # the root: the input and output Linear
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(1, 3):
    x = torch.randn(8, 8)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
