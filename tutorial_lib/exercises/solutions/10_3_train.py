import argparse
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch", type=int, default=16)  # the global batch: every rank builds it, each takes a share
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
def bf16_hook(state, bucket):  # DDP calls it once per bucket and expects a Future of the averaged bucket
    buffer = bucket.buffer()
    # The fix: divide by world_size. all_reduce sums the ranks' buckets; DDP expects their average (its own
    # all-reduce divides, and so do torch's fp16_compress_hook and bf16_compress_hook, before their all-reduce).
    compressed = buffer.div(world_size).to(torch.bfloat16)  # half the bytes on the wire
    future = dist.all_reduce(compressed, async_op=True).get_future()
    def decompress(fut):
        buffer.copy_(fut.value()[0])  # back to fp32, into the bucket
        return buffer
    return future.then(decompress)
torch.manual_seed(args.seed)
x = torch.randn(args.batch, 32)  # the global batch: the same tensor on every rank (same seed)
y = x[:, :1].sin()
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
model.register_comm_hook(None, bf16_hook)
mine = slice(rank, None, world_size)  # this rank's share of the batch
torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
grad = torch.cat([p.grad.flatten() for p in model.parameters()])
print(f"rank {rank}: gradient norm {grad.norm().item():.6f}")
dist.destroy_process_group()
