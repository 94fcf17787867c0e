import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
class TinyLM(nn.Module):  # as Qwen2: the output head tied to the embedding, and a rotary buffer not in the checkpoint
    def __init__(self, vocab=64, dim=16, theta=10000.0):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one tensor
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim), persistent=False)
    def forward(self, tokens):
        angles = torch.arange(tokens.shape[1]).float()[:, None] * self.inv_freq  # (tokens, dim / 2)
        return self.head(self.embed(tokens) * torch.cat([angles.cos(), angles.sin()], dim=-1))
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(args.seed)
checkpoint = TinyLM().state_dict()  # the downloaded weights: inv_freq is not in it (persistent=False)
with torch.device("meta"):
    net = TinyLM()  # shapes only: no memory, no initialisation
net.to_empty(device="cpu")  # storage for every parameter and buffer, uninitialised
# The fix: what the checkpoint does not hold. to_empty gave the head and the embedding each its own storage: tie them
# again; the non-persistent buffer was never computed on meta and to_empty left it garbage: compute it again.
net.head.weight = net.embed.weight
net.inv_freq = 1.0 / 10000.0 ** (torch.arange(0, 16, 2).float() / 16)
net.load_state_dict(checkpoint)
model = DDP(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
tokens = torch.randint(0, 64, (4, 9), generator=torch.Generator().manual_seed(args.seed + rank))  # this rank's batch
for step in range(1, args.steps + 1):
    loss = nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    print(f"rank {rank} step {step}: loss {loss.item():.4f}")
dist.destroy_process_group()
