import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch", type=int, default=32)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(args.seed)
layers = [nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)]
# The fix: a cap below the 2 MiB of gradients (or DDP's default, whose first bucket is 1 MiB). After the first step DDP
# rebuilds its buckets in backward's order: the first (the output and hidden layers') is all-reduced while backward
# still computes the input layer's gradient. With bucket_cap_mb=100 every gradient sat in one bucket, all-reduced only
# after the whole backward: communication overlapped none of the computation.
model = DDP(nn.Sequential(*layers), bucket_cap_mb=1)
events = []  # what happened during backward, in order
def hook(state, bucket):  # DDP calls it once per bucket, when the bucket's last gradient is ready
    events.append(f"all_reduce({bucket.buffer().numel()})")
    return allreduce_hook(state, bucket)
model.register_comm_hook(None, hook)
layers[0].weight.register_hook(lambda g: events.append("input_layer_grad"))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 4):
    events.clear()
    x = torch.randn(args.batch, 512)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if dist.get_rank() == 0:
        print(f"step {step}: " + " -> ".join(events))
dist.destroy_process_group()
