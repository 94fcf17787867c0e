import argparse
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch", type=int, default=16)  # samples per optimizer step, over all the ranks
args = parser.parse_args()
# torchrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. gloo: the tensors are on the CPU (nccl for GPUs, with
# torch.cuda.set_device(LOCAL_RANK) first and the model and batches moved to that device).
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)  # the same seed on every rank: the same data set, split below
x = torch.randn(3 * args.batch + 32, 8)
y = torch.tanh(x @ torch.randn(8, 1))
train = TensorDataset(x[:-32], y[:-32])
# Each rank loads its own share of every global batch: samples rank, rank + W, ... (no shuffling here, as in the
# script), batch // W of them per step, so the W shares of a step are the --batch samples one process took.
sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, shuffle=False)
loader = DataLoader(train, batch_size=args.batch // world_size, sampler=sampler)
# DDP copies rank 0's weights to every rank, and in backward() averages the ranks' gradients: the mean of the ranks'
# mean losses over equal shares is the mean over the whole batch, so the loss stays as it was.
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (xb, yb) in enumerate(loader, start=1):
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:  # one line per step, not one per rank (rank 0's loss is the mean over its share)
        print(f"step {step}: loss {loss.item():.4f}")
if rank == 0:  # every rank holds the same weights: evaluating once is enough
    with torch.no_grad():
        held_out = torch.nn.functional.mse_loss(model.module(x[-32:]), y[-32:])
    print(f"held-out loss {held_out.item():.4f}")
dist.destroy_process_group()
