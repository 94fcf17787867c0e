"""Exercise 14.2: a compiled job that fails; read its output and name the rank, the line and the cause.

A small model is compiled with fullgraph=True and dynamic=False (every graph break, and every new shape past the
recompile limit, is an error), wrapped in DDP, and trained on each rank's own batches of token sequences. The
sequence lengths of each rank's batches follow from the data seed (--seed).

    torchrun --nproc-per-node 2 14_2_job.py --seed 3
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Pooled(nn.Module):
    def __init__(self, max_len):
        super().__init__()
        self.max_len = max_len
        self.embed, self.head = nn.Embedding(64, 16), nn.Linear(16, 1)

    def forward(self, tokens):
        if tokens.shape[1] > self.max_len:
            print(f"truncating a batch of length {tokens.shape[1]}")
            tokens = tokens[:, :self.max_len]
        return self.head(self.embed(tokens).mean(dim=1))


def lengths(seed, rank, steps):  # the sequence length of each of this rank's batches, from the data seed
    g = torch.Generator().manual_seed(seed)
    odd_rank, kind = [int(v) for v in torch.randint(0, 1000, (2,), generator=g)]
    if rank != odd_rank % 2:
        return [12] * steps
    return [20] * steps if kind % 2 else [12 + step for step in range(steps)]  # too long, or a new length each step


parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0, help="the data seed")
parser.add_argument("--steps", type=int, default=4, help="batches per rank (count)")
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch._dynamo.config.recompile_limit = 2  # at most 2 compiled versions of a function (fullgraph: then an error)
torch.manual_seed(0)
model = Pooled(max_len=16)
model.compile(backend="aot_eager", fullgraph=True, dynamic=False)
ddp = DDP(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step, length in enumerate(lengths(args.seed, rank, args.steps), start=1):
    tokens = torch.randint(0, 64, (4, length))
    loss = ddp(tokens).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
