import argparse, os, time
from datetime import timedelta
import torch
from torchft import Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.pg_transport import PGTransport
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)  # the model's and the data's
parser.add_argument("--steps", type=int, default=10_000)  # steps to train
args = parser.parse_args()
GROUP = int(os.environ["REPLICA_GROUP_ID"])  # this replica group (the check starts 2)
torch.manual_seed(args.seed)  # every group builds the same weights: step 0 needs no sync
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
inner = torch.optim.AdamW(model.parameters(), lr=0.01)

# The fix, in two parts. A group that heals must get everything its next update depends on, not the weights alone:
# AdamW's update reads its state (each parameter's two moments and the step count of its bias correction), so the
# optimizer's state_dict goes with the model's. And the step is torchft's, not this process's loop's: a restarted group
# counts its loop from 0, so its warm-up (and its batches) started over, while manager.current_step() is the step of
# the quorum, the same in every group and healed with the state (its own state_dict, which torchft sends too).


def state_dict():  # what a live group sends a group that heals
    return {"model": model.state_dict(), "optim": inner.state_dict()}

def load_state_dict(state):  # how the healing group takes it in
    model.load_state_dict(state["model"])
    inner.load_state_dict(state["optim"])

pg = ProcessGroupGloo(timeout=timedelta(seconds=5))
manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
                  replica_id=f"group_{GROUP}", timeout=timedelta(seconds=30), init_sync=False,
                  checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=30), device=torch.device("cpu")))
optimizer = Optimizer(manager, inner)  # zero_grad(): the quorum; step(): only if every group's all-reduce went through
while manager.current_step() < args.steps:
    step = manager.current_step()  # the quorum's step: the same in every group, and healed
    for param_group in inner.param_groups:  # 20 steps of warm-up, then a 1/sqrt decay
        param_group["lr"] = 0.01 * min((step + 1) / 20, (20 / (step + 1)) ** 0.5)
    batch = torch.Generator().manual_seed(args.seed * 100_000 + step * 10 + GROUP)
    x = torch.randn(32, 16, generator=batch)  # this group's batch for this step
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).tanh())
    loss.backward()
    for p in model.parameters():  # each gradient averaged across the quorum's groups
        manager.allreduce(p.grad).wait()
    optimizer.step()
    time.sleep(0.05)  # a step of 50 ms at least: the check kills a group mid-run
manager.shutdown(wait=False)
