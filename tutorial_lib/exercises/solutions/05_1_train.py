import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
ckpt, stop = sys.argv[1], int(sys.argv[2])  # the checkpoint file; the job is interrupted after step `stop`
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
start = 0
if os.path.exists(ckpt):  # a restarted job: continue from the checkpoint
    state = torch.load(ckpt)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    # The fix: the checkpoint says which step it holds, and the loop starts after it. Without it, steps 1..stop ran
    # again on weights that had already learned from them, and the resumed run was not the uninterrupted one.
    start = state["step"]
for step in range(start + 1, stop + 1):
    g = torch.Generator().manual_seed(100 * step + rank)  # step `step`'s batch on this rank
    x = torch.randn(16, 8, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print("check", json.dumps({"step": step, "loss": loss.item()}))
if rank == 0:  # every rank holds the same weights: one copy is enough
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": stop}, ckpt)
dist.barrier()  # nobody exits (and no restarted job reads the file) before it is written
dist.destroy_process_group()
