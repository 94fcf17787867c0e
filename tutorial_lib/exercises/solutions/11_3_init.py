import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import fully_shard
def build():  # a small MLP; train_lm.py's GPT is built, sharded and initialised the same way
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(args.seed)
with torch.device("meta"):
    model = build()  # shapes only: no memory, no random numbers
for layer in (model[0], model[2]):
    fully_shard(layer)  # each Linear a unit: its parameters become DTensors sharded on dim 0
fully_shard(model)
model.to_empty(device="cpu")  # storage for this rank's shards, uninitialised
# The fix: a seed checkpoint. Rank 0 builds the whole model once (one process's random numbers) and
# set_model_state_dict broadcasts each whole tensor from it; every rank keeps its own rows. Initialising each shard
# on its rank draws the same numbers on every rank (on CPU): a model no single process would build.
seed = build().state_dict() if rank == 0 else {}
set_model_state_dict(model, seed, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(args.seed))  # the same batch on every rank
loss = model(x).square().mean()
loss.backward()
print(f"rank {rank}: loss {loss.item():.6f}, rows of the first weight here: {model[0].weight.to_local().shape[0]}")
dist.destroy_process_group()
