import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=3))  # a hang becomes an error after 3 s
rank, world_size = dist.get_rank(), dist.get_world_size()
vocab = os.path.join(sys.argv[1], "vocab.pt")  # a file rank 0 builds and every rank reads
# The fix: rank 0 writes the file BEFORE the barrier, and every rank calls the same barrier. Before, rank 0 waited in
# the barrier for rank 1, while rank 1 polled for a file rank 0 would write only after that barrier: a deadlock.
if rank == 0:
    torch.save(torch.arange(100), vocab)  # build the vocabulary
dist.barrier()  # when it returns, the file is there for everyone
tokens = torch.load(vocab)
total = tokens[rank::world_size].sum()  # this rank's share
dist.all_reduce(total)
print(f"rank {rank}: {total.item()}, the sum of the whole vocabulary")
dist.destroy_process_group()
