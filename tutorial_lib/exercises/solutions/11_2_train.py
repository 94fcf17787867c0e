import argparse
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--windows", type=int, default=5)  # windows per step, over all ranks
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(args.seed)
model = DDP(torch.nn.Linear(16, 256))  # a stand-in LM head
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
lengths = (torch.randperm(args.windows) + 1) * 8  # windows of 8, 16, ... tokens, in a random order
windows = [(torch.randn(n, 16), torch.randint(0, 256, (n,))) for n in lengths.tolist()]  # the same on every rank
for step in range(1, 3):
    mine = windows[rank::world_size]  # this rank's windows: rank, rank + W, ...
    x, y = torch.cat([x for x, _ in mine]), torch.cat([y for _, y in mine])
    token_losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")  # one loss per token
    # The fix: every token of the step weighs the same, whatever the split. All-reduce the step's number of tokens;
    # DDP averages the ranks' gradients (their sum / world_size), so each rank's loss is its tokens' sum over all the
    # step's tokens, times world_size: the average is then the gradient of the mean over every token, as one process
    # takes it. The mean of the ranks' means weighed a token of the rank with fewer tokens more.
    tokens = torch.tensor(token_losses.numel())
    dist.all_reduce(tokens)
    loss = token_losses.sum() / tokens * world_size
    optimizer.zero_grad()
    loss.backward()  # DDP averages the ranks' gradients
    optimizer.step()
    print(f"rank {rank} step {step}: {token_losses.numel()} of {tokens.item()} tokens, loss {loss.item():.4f}")
dist.destroy_process_group()
