import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
ckpt, stop = sys.argv[1], int(sys.argv[2])  # the checkpoint file; the job is interrupted after step `stop`
torch.manual_seed(1 + rank)  # each rank draws its own batches and dropout masks (DDP copies rank 0's weights)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
start = 0
if os.path.exists(ckpt):  # a restarted job: continue after the saved step
    state = torch.load(ckpt)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    # The fix: each rank restores its OWN random state. Rank 0's state on every rank gave rank 1 rank 0's batches
    # and dropout masks after the resume.
    torch.set_rng_state(torch.load(f"{ckpt}.rng{rank}"))
    start = state["step"]
for step in range(start + 1, stop + 1):
    x = torch.randn(16, 8)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print("check", json.dumps({"step": step, "loss": loss.item()}))
torch.save(torch.get_rng_state(), f"{ckpt}.rng{rank}")  # every rank draws its own: every rank saves its own
if rank == 0:  # the weights are the same on every rank: one copy is enough
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": stop}, ckpt)
dist.barrier()
dist.destroy_process_group()
