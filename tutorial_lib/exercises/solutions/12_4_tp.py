import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import Replicate, init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module
class Attention(nn.Module):  # q, k, v (heads of 8 features), then the output projection wo
    def __init__(self, dim):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim) for _ in range(4))
    def forward(self, x):  # -1 heads: under TP a rank's q, k and v hold only its own heads
        q, k, v = (w(x).unflatten(-1, (-1, 8)).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        return self.wo(nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))
class MLP(nn.Module):  # up to 4 x the width, GELU, back down
    def __init__(self, dim):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))
class Block(nn.Module):  # pre-norm, as section 1's: x + attention(norm(x)), then x + MLP(norm(x))
    def __init__(self, dim):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(dim), Attention(dim), nn.LayerNorm(dim), MLP(dim)
    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))
class Model(nn.Module):
    def __init__(self, dim=32, n_blocks=2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(n_blocks))
    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch", type=int, default=2)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(args.seed)  # the same weights and data on every rank
model = Model()
x, y = torch.randn(args.batch, 8, 32), torch.randn(args.batch, 8, 32)  # 8 tokens of 32 features, and the target
# Section 1's plan for each block ("*" matches both): q, k, v and fc1 column-wise (each rank its heads, its hidden
# units), wo and fc2 row-wise (one all-reduce of the partial sums after each pair), and the attention's input made one
# replicated DTensor for q, k and v together, so that backward sums their input gradients locally and all-reduces
# once. The norms stay whole on every rank. 2 all-reduces per block each way.
plan = {"blocks.*.attn": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)),
        "blocks.*.attn.wq": ColwiseParallel(), "blocks.*.attn.wk": ColwiseParallel(),
        "blocks.*.attn.wv": ColwiseParallel(), "blocks.*.attn.wo": RowwiseParallel(),
        "blocks.*.mlp.fc1": ColwiseParallel(), "blocks.*.mlp.fc2": RowwiseParallel()}
parallelize_module(model, init_device_mesh("cpu", (dist.get_world_size(),)), plan)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 3):
    loss = (model(x) - y).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"rank {dist.get_rank()} step {step}: loss {loss.item():.6f}")
dist.destroy_process_group()
