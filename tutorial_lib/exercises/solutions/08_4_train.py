"""Exercise 08.4, one solution of the open challenge: DDP's buckets cut for this model's layers. The layers' fp32
gradients in backward's order (output first) are 8,224, 263,168, 525,312, 1,050,624, 526,336 and 33,792 bytes; a
layer's weight and bias are ready together, and a bucket is all-reduced once its last gradient is ready. On a wire as
fast as backward, what is left to send when backward ends is the largest bucket (it waits for its last layer, then
takes as long as backward took to compute it), so the 1 MiB layer should travel alone: no bucketing of whole layers
leaves less than its 1,050,624 bytes. DDP closes a bucket once it holds at least bucket_cap_mb: with 0.5 MiB (524,288
bytes) the buckets are the three last layers (796,704), the 1 MiB layer (1,050,624), the next (526,336) and the input
layer (33,792): 4 all-reduces, 1,050,624 bytes left. DDP's default put the 1 MiB layer in the first bucket, after the
three layers that follow it: 1,847,328 bytes, sent after the last of them was ready. Any cap above 271,392 bytes (two
layers) and at most 796,704 works. Other solutions: the layers wrapped in two DDP modules (the three last, the three
first), or the gradients all-reduced by hand, a group of layers at a time, from post-accumulate-grad hooks.
"""
import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=1)  # the seed of the model and of the data
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)  # the same data and initial weights on every rank
x = torch.randn(256, 32)
y = torch.tanh(x @ torch.randn(32, 8) / 4)  # the target
net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                    nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
model = DDP(net, bucket_cap_mb=0.5)  # buckets of whole layers, the 1 MiB layer alone
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
mine = slice(rank, None, world_size)  # this rank's half of the batch
for step in range(1, 7):
    loss = nn.functional.mse_loss(model(x[mine]), y[mine])
    optimizer.zero_grad()
    loss.backward()  # DDP all-reduces each bucket once its last gradient is ready, while backward goes on
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
