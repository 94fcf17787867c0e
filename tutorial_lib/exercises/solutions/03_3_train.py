import json
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
LR, MAX_NORM = 0.01, 1.0
optimizer = torch.optim.SGD(model.parameters(), lr=LR)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
for step in range(1, 6):
    x = torch.randn(16, 8)[rank::world_size]  # this rank's half of the global batch
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x), 3 * x.sum(1, keepdim=True))
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    # The fix: unscale_ first. Before it the gradients are still multiplied by the scale (1024 here), so clipping
    # saw a norm 1024 times too large, clipped every step down to MAX_NORM, and the scaler's division then left
    # the optimizer a gradient of norm MAX_NORM / 1024. After unscale_, clipping sees and bounds the true norm.
    scaler.unscale_(optimizer)
    seen = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)  # the gradient norm clipping measured
    before = [p.detach().clone() for p in model.parameters()]
    scaler.step(optimizer)  # skipped if a gradient is inf/NaN
    scaler.update()
    moved = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    print("check", json.dumps({"step": step, "scale": scaler.get_scale(), "clip_saw": seen.item(),
                               "applied_norm": moved.norm().item() / LR}))  # the norm of the gradient applied
dist.destroy_process_group()
