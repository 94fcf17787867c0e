import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
node, local_rank = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"])
local_disk = os.path.join(sys.argv[1], f"node{node}")  # this node's own disk (simulated: one folder per node)
prepared = False
# The fix: node-local work is done once per NODE, by its LOCAL_RANK 0. The global rank 0 lives on node 0 only, so
# node 1's disk stayed empty and its ranks failed to read the file.
if local_rank == 0:  # download and unpack the data set, once per node
    os.makedirs(local_disk, exist_ok=True)
    torch.save(torch.arange(64.0).reshape(16, 4), os.path.join(local_disk, "data.pt"))
    prepared = True
dist.barrier()  # everyone waits until the data set is there
data = torch.load(os.path.join(local_disk, "data.pt"))
total = data[rank::world_size].sum()  # this rank's shard: the global rank splits the data over the world
dist.all_reduce(total)
print("check", json.dumps({"node": node, "local_rank": local_rank, "prepared": prepared, "total": total.item()}))
dist.destroy_process_group()
