import json
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
layers = [nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)]
model = DDP(nn.Sequential(*layers), bucket_cap_mb=1)  # the fix: a cap below the 2 MiB of gradients (or DDP's default):
# the first bucket (output and hidden layers) is all-reduced while backward still computes the input layer's gradient;
# with bucket_cap_mb=100 every gradient sat in one bucket, all-reduced only after the whole backward
events = []  # what happened during backward, in order
def hook(state, bucket):  # DDP calls it once per bucket, when the bucket's last gradient is ready
    events.append(["all_reduce", bucket.buffer().numel()])
    return allreduce_hook(state, bucket)
model.register_comm_hook(None, hook)
layers[0].weight.register_hook(lambda g: events.append(["input_layer_grad", g.numel()]))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 4):
    events.clear()
    x = torch.randn(32, 512)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print("check", json.dumps({"step": step, "loss": loss.item(), "events": events,
                               "params": sum(p.numel() for p in model.parameters())}))
dist.destroy_process_group()
