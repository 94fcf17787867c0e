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
torch.manual_seed(args.seed + rank)  # each rank draws its own batches and dropout masks (DDP copies rank 0's weights)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
start = 0
if args.ckpt and os.path.exists(args.ckpt):  # a restarted job: continue after the saved step
    state = torch.load(args.ckpt)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    # The fix: each rank restores its OWN random state. Rank 0's state on every rank gave rank 1 rank 0's batches
    # and dropout masks after the resume.
    torch.set_rng_state(torch.load(f"{args.ckpt}.rng{rank}"))
    start = state["step"]
for step in range(start + 1, args.steps + 1):
    x = torch.randn(16, 8)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.4f}")
if args.ckpt:
    torch.save(torch.get_rng_state(), f"{args.ckpt}.rng{rank}")  # every rank draws its own: every rank saves its own
if args.ckpt and rank == 0:  # the weights are the same on every rank: one copy is enough
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": args.steps},
               args.ckpt)
dist.barrier()
dist.destroy_process_group()
