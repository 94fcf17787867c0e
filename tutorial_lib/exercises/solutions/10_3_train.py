import json
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
wire = []  # (dtype, bytes) of every all-reduce the hook issued
def bf16_hook(state, bucket):  # DDP calls it once per bucket and expects a Future of the averaged bucket
    buffer = bucket.buffer()
    # The fix: divide by world_size. all_reduce sums the ranks' buckets; DDP expects their average (its own
    # all-reduce divides, and so do torch's fp16_compress_hook and bf16_compress_hook, before their all-reduce).
    compressed = buffer.div(world_size).to(torch.bfloat16)  # half the bytes on the wire
    wire.append([str(compressed.dtype), compressed.numel() * compressed.element_size()])
    future = dist.all_reduce(compressed, async_op=True).get_future()
    def decompress(fut):
        buffer.copy_(fut.value()[0])  # back to fp32, into the bucket
        return buffer
    return future.then(decompress)
torch.manual_seed(0)
x = torch.randn(16, 32)  # the global batch: the same tensor on every rank
y = x[:, :1].sin()
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
model.register_comm_hook(None, bf16_hook)
mine = slice(rank, None, world_size)  # this rank's share of the batch
torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
norms = [p.grad.norm().item() for p in model.parameters()]  # of each parameter's gradient
print("check", json.dumps({"wire": wire, "params": sum(p.numel() for p in model.parameters()), "grad_norms": norms}))
dist.destroy_process_group()
