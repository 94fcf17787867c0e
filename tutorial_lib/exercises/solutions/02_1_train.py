import argparse
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank = dist.get_rank()
torch.manual_seed(args.seed)
x = torch.randn(12, 4)  # a dataset of 12 samples, the same on every rank (same seed)
y = x.sum(dim=1, keepdim=True)
sampler = DistributedSampler(range(12), shuffle=True, seed=args.seed)  # rank and world size from the process group
loader = DataLoader(range(12), batch_size=3, sampler=sampler)  # batches of sample indices
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(args.epochs):
    # The fix: the sampler shuffles with seed + epoch, and its epoch changes only here. Without this call every
    # epoch repeats epoch 0's order: the model sees the same batches in the same order again and again.
    sampler.set_epoch(epoch)
    seen = []
    for idx in loader:
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += idx.tolist()
    print(f"epoch {epoch}: rank {rank} trained on samples {seen}")
dist.destroy_process_group()
