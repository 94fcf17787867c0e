import argparse
import contextlib
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--micro-batches", type=int, default=4)  # K: micro-batches per optimizer step
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
K = args.micro_batches
torch.manual_seed(args.seed)
model = DDP(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 3):
    x = torch.randn(K, 8, 8)  # the global batch: K micro-batches of 8 samples, the same on every rank
    y = x.sum(dim=2, keepdim=True)
    for k in range(K):
        mine = slice(rank, None, world_size)  # this rank's share of micro-batch k
        # The fix: the first K - 1 backward() calls keep their gradients local (no_sync); the last one all-reduces
        # the sum the micro-batches accumulated. Same gradients, 1/K of the all-reduces.
        with model.no_sync() if k < K - 1 else contextlib.nullcontext():
            loss = torch.nn.functional.mse_loss(model(x[k][mine]), y[k][mine]) / K
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"rank {rank} step {step}: {K} micro-batches accumulated, the last one's loss {loss.item() * K:.4f}")
dist.destroy_process_group()
