import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--steps", type=int, default=6)  # train up to this step
parser.add_argument("--ckpt", default=None)  # the checkpoint file: loaded if it exists, written at the end
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(args.seed)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
start = 0
if args.ckpt and os.path.exists(args.ckpt):  # a restarted job: continue from the checkpoint
    state = torch.load(args.ckpt)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    # The fix: the checkpoint says which step it holds, and the loop starts after it. Without it, steps 1..N ran
    # again on weights that had already learned from them, and the resumed run was not the uninterrupted one.
    start = state["step"]
for step in range(start + 1, args.steps + 1):
    g = torch.Generator().manual_seed(1000 * args.seed + 10 * step + rank)  # step `step`'s batch on this rank
    x = torch.randn(16, 8, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.4f}")
if args.ckpt and rank == 0:  # every rank holds the same weights: one copy is enough
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": args.steps},
               args.ckpt)
dist.barrier()  # nobody exits (and no restarted job reads the file) before it is written
dist.destroy_process_group()
