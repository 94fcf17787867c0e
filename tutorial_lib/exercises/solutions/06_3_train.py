import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--rows", type=int, default=16)  # the data set's size
parser.add_argument("--disks", default="disks")  # the nodes' own disks (simulated: a folder per node in it)
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
node, local_rank = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"])
local_disk = os.path.join(args.disks, f"node{node}")  # this node's own disk
# The fix: node-local work is done once per NODE, by its LOCAL_RANK 0. The global rank 0 lives on node 0 only, so
# node 1's disk stayed empty and its ranks failed to read the file.
if local_rank == 0:  # download and unpack the data set, once per node
    os.makedirs(local_disk, exist_ok=True)
    download = torch.randn(args.rows, 5, generator=torch.Generator().manual_seed(args.seed))
    torch.save(download, os.path.join(local_disk, "data.pt"))
dist.barrier()  # everyone waits until the data set is there
data = torch.load(os.path.join(local_disk, "data.pt"))
inputs, targets = data[rank::world_size, :4], data[rank::world_size, 4:]  # this rank's shard
torch.manual_seed(args.seed)
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = torch.nn.functional.mse_loss(model(inputs), targets)
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(f"rank {rank} (node {node}, local rank {local_rank}): {len(inputs)} rows from {local_disk}")
dist.destroy_process_group()
