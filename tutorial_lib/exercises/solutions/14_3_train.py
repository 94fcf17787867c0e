"""Exercise 14.3, one solution of the open challenge: the statistic stays a tensor inside the compiled forward (read
with .item() outside it, by the log line: no graph break), and the model compiles with dynamic=True (one graph whose
sequence length is a symbol serves every length): 1 graph per rank, the baseline's losses. Another solution pads every
batch to one length and masks the padding out of the mean (one static graph); torch._dynamo.mark_dynamic(tokens, 1)
is a third.
"""
import argparse
import torch
import torch.distributed as dist
class Pooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 1)
    def forward(self, tokens):
        h = self.embed(tokens)
        self.peak = h.abs().max().detach()  # a tensor: .item() inside the graph would break it
        return self.head(h.mean(dim=1))
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=1)  # the seed of the model and of the data
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(args.seed)
model = Pooled()
model.compile(backend="aot_eager", dynamic=True)  # one graph for every length
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
data = torch.Generator().manual_seed(args.seed * 100 + dist.get_rank())  # each rank's own batches
for step in range(1, 7):
    tokens = torch.randint(0, 64, (8, 8 + step), generator=data)  # 9, 10, ..., 14 tokens long
    loss = (ddp(tokens) - (tokens.float().mean(dim=1, keepdim=True) - 31.5) / 18).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f} peak {model.peak:.3f}")
dist.destroy_process_group()
