import json
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import Replicate, init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module
class Attention(nn.Module):  # q, k, v (heads of 8 features), then the output projection wo
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(32, 32) for _ in range(4))
    def forward(self, x):  # -1 heads: under TP each rank's q, k, v hold only its own heads
        q, k, v = (w(x).unflatten(-1, (-1, 8)).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        return self.wo(nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(Attention(), nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))  # attention, then an MLP
x = torch.randn(2, 6, 32, requires_grad=True)  # the same input on every rank
plan = {"0.wq": ColwiseParallel(), "0.wk": ColwiseParallel(), "0.wv": ColwiseParallel(), "0.wo": RowwiseParallel(),
        "1": ColwiseParallel(), "3": RowwiseParallel(),
        # The fix: make the attention's input a replicated DTensor once, for q, k and v together. Their three partial
        # input gradients are then summed locally and all-reduced once in backward (2 all-reduces, not 4).
        "0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))}
parallelize_module(model, init_device_mesh("cpu", (dist.get_world_size(),)), plan)
with CommDebugMode() as forward:
    out = model(x)
with CommDebugMode() as backward:
    out.square().sum().backward()
counts = lambda mode: {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}
print("check", json.dumps({"forward": counts(forward), "backward": counts(backward), "out": out.flatten().tolist(),
                           "x_grad": x.grad.flatten().tolist(), "wq_rows": model[0].wq.weight.to_local().shape[0]}))
dist.destroy_process_group()
