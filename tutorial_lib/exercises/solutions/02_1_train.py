import json

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("gloo")
dataset = list(range(12))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # rank and world size from the process group
loader = DataLoader(dataset, batch_size=3, sampler=sampler)
for epoch in range(3):
    # The fix: the sampler shuffles with seed + epoch, and its epoch changes only here. Without this call every
    # epoch repeats epoch 0's order: the model sees the same batches in the same order again and again.
    sampler.set_epoch(epoch)
    seen = [int(i) for batch in loader for i in batch]
    print("check", json.dumps({"epoch": epoch, "indices": seen}))  # the line the check reads
dist.destroy_process_group()
