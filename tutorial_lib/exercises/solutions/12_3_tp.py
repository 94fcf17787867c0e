import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import Replicate, init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module
class Attention(nn.Module):  # q, k, v (heads of 8 features), then the output projection wo
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(32, 32) for _ in range(4))
    def forward(self, x):  # -1 heads: under TP each rank's q, k, v hold only its own heads
        q, k, v = (w(x).unflatten(-1, (-1, 8)).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        return self.wo(nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch", type=int, default=2)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(args.seed)
model = nn.Sequential(Attention(), nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))  # attention, then an MLP
x = torch.randn(args.batch, 6, 32, requires_grad=True)  # the same input on every rank; a block's input needs a gradient
plan = {"0.wq": ColwiseParallel(), "0.wk": ColwiseParallel(), "0.wv": ColwiseParallel(), "0.wo": RowwiseParallel(),
        "1": ColwiseParallel(), "3": RowwiseParallel(),
        # The fix: make the attention's input a replicated DTensor once, for q, k and v together. Their three partial
        # input gradients are then summed locally and all-reduced once in backward (2 all-reduces, not 4).
        "0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))}
parallelize_module(model, init_device_mesh("cpu", (dist.get_world_size(),)), plan)
out = model(x)  # forward
out.square().sum().backward()  # backward
print(f"rank {dist.get_rank()}: {model[0].wq.weight.to_local().shape[0]} of wq's 32 rows here, output sum "
      f"{out.sum().item():.6f}")
dist.destroy_process_group()
