"""Fault-tolerant DDP with torchft: replica groups that die and rejoin while the others keep training.

Run card (one terminal each; every group is its own torchrun job)
    python ft_train.py --max-steps 50                                # one group alone, with a lighthouse of its own
    torchrun --nproc-per-node 1 ft_train.py --max-steps 50          # the same under torchrun

    torchft_lighthouse --min_replicas 1 --bind 127.0.0.1:29510       # the lighthouse: who is alive, the quorum
    TORCHFT_LIGHTHOUSE=http://127.0.0.1:29510 REPLICA_GROUP_ID=0 NUM_REPLICA_GROUPS=2 \\
        torchrun --nproc-per-node 1 --master-port 29600 ft_train.py --max-steps 200
    TORCHFT_LIGHTHOUSE=http://127.0.0.1:29510 REPLICA_GROUP_ID=1 NUM_REPLICA_GROUPS=2 \\
        torchrun --nproc-per-node 1 --master-port 29601 ft_train.py --max-steps 200
    # kill group 1 (Ctrl-C, or kill -9 its processes): group 0 goes on alone; start it again: it heals from group 0

What it shows
    * torchrun's restart stops every rank; torchft keeps the healthy replica groups stepping. Each group is a torchrun
      job of its own; the groups find each other through the lighthouse, which forms a *quorum* (the groups alive
      now) at every step, and torchft's process group is rebuilt for each new quorum;
    * ``torchft.DistributedDataParallel`` averages gradients across the groups of the quorum, and
      ``torchft.Optimizer`` steps only when ``manager.should_commit()`` says every group's all-reduce succeeded: a
      step that failed half-way is dropped everywhere, never applied twice;
    * a group that (re)joins behind the others *heals*: it receives the model and optimizer state from a live peer
      (``PGTransport``, over the same gloo/NCCL process group), no checkpoint file involved;
    * ``manager.batches_committed()`` counts the batches that reached the weights: +2 per step with two groups, +1
      while one is down (its samples are simply not trained on).

torchft's DDP averages across replica groups only, so each group here is one rank (torchft's own train_ddp.py does
the same); ranks inside a group would shard the model (HSDP). Needs torch, torchft and numpy (torchft sends state
through numpy and does not declare it). Everything above the "Workbook instrumentation" section is the lesson.
"""

import argparse
import hashlib
import json
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed import TCPStore
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Dataset
from torchft import DistributedDataParallel, DistributedSampler, Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.pg_transport import PGTransport
from torchft.coordination import LighthouseServer

# The groups torchft can form: set by whoever starts the groups, one id per group (0, 1, ...).
REPLICA_GROUP_ID = int(os.environ.get("REPLICA_GROUP_ID", 0))
NUM_REPLICA_GROUPS = int(os.environ.get("NUM_REPLICA_GROUPS", 2))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-steps", type=int, default=200, help="committed steps to train (count)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per group per step (count)")
    p.add_argument("--dataset-size", type=int, default=8192, help="samples in the synthetic dataset (count)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW's learning rate (unitless)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, the dataset and the shuffle")
    p.add_argument("--pg-timeout-s", type=float, default=5.0,
                   help="gloo's collective timeout across groups (seconds): how long an all-reduce with a dead "
                        "group can hang before the step is dropped")
    p.add_argument("--manager-timeout-s", type=float, default=30.0,
                   help="the Manager's timeout for its own calls: should_commit, sending a heal (seconds)")
    p.add_argument("--log-every", type=int, default=20, help="print a line every N steps (count)")
    add_workbook_flags(p)
    args = p.parse_args(argv)
    for name in ("max_steps", "batch_size", "dataset_size", "log_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("pg_timeout_s", "manager_timeout_s"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0 (seconds), got {getattr(args, name)}")
    if args.batch_size > args.dataset_size:
        p.error(f"--batch-size {args.batch_size} is larger than --dataset-size {args.dataset_size}")
    return args


class TeacherDataset(Dataset):
    """``size`` fixed samples: x ~ N(0, 1), y = a fixed random "teacher" network of x (the same as ddp_train.py)."""

    def __init__(self, size, input_dim=64, output_dim=8, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, input_dim, generator=g)
        w1 = torch.randn(input_dim, 32, generator=g) / input_dim ** 0.5
        w2 = torch.randn(32, output_dim, generator=g) / 32 ** 0.5
        self.y = torch.tanh(self.x @ w1) @ w2 + 0.01 * torch.randn(size, output_dim, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def make_model(seed):
    torch.manual_seed(seed)  # every group builds the same weights, so step 0 needs no sync (init_sync=False)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))


@record
def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO)  # torchft logs each quorum, heal and commit at INFO
    if int(os.environ.get("WORLD_SIZE", 1)) != 1:
        sys.exit(f"ft_train.py runs one rank per replica group (got WORLD_SIZE={os.environ['WORLD_SIZE']}): "
                 "torchft's DDP averages across groups, not across the ranks inside one")
    dataset = TeacherDataset(args.dataset_size, seed=args.seed)
    # Shards the data over every group that may exist: a dead group's shard is not trained on while it is down.
    sampler = DistributedSampler(dataset, replica_rank=REPLICA_GROUP_ID, num_replica_groups=NUM_REPLICA_GROUPS,
                                 group_rank=0, num_replicas=1, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        sys.exit(f"--dataset-size {args.dataset_size} leaves each of {NUM_REPLICA_GROUPS} groups fewer samples "
                 f"than --batch-size {args.batch_size}")

    if "RANK" not in os.environ:  # `python ft_train.py`: the store torchrun would host, in this process
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), RANK="0", WORLD_SIZE="1")
    if "TORCHFT_LIGHTHOUSE" not in os.environ:  # no lighthouse given: one of our own, and this group trains alone
        lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)  # (the torchft_lighthouse command's server)
        os.environ["TORCHFT_LIGHTHOUSE"] = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]

    model = make_model(args.seed)
    inner_optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    # What a healthy group sends a healing one, and how the healing one takes it in.
    def state_dict():
        return {"model": model.state_dict(), "optim": inner_optimizer.state_dict(), "sent_by": REPLICA_GROUP_ID}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner_optimizer.load_state_dict(state["optim"])
        recorder.healed(manager, source_group=state["sent_by"])  # workbook

    # The process group *across* replica groups. torchft reconfigures it (new members, new store prefix) whenever
    # the quorum changes; a short timeout turns an all-reduce with a dead group into a dropped step, not a hang.
    pg = ProcessGroupGloo(timeout=timedelta(seconds=args.pg_timeout_s))
    manager = Manager(
        pg=pg,
        min_replica_size=1,  # commit a step as long as one group is alive
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"ft_train_{REPLICA_GROUP_ID}",  # the lighthouse's name for this group (trailing digits: the id)
        timeout=timedelta(seconds=args.manager_timeout_s),
        # Heal through the process group itself (torchft's default is an HTTP server on every interface).
        checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=args.manager_timeout_s),
                                         device=torch.device("cpu")),
        init_sync=False,
    )
    ddp_model = DistributedDataParallel(manager, model)  # all-reduces gradients through the manager's process group
    optimizer = Optimizer(manager, inner_optimizer)  # zero_grad() starts the quorum, step() commits or drops
    loss_fn = nn.MSELoss()
    recorder = Recorder(args, model)  # workbook

    try:
        epoch = 0
        while manager.current_step() < args.max_steps:
            sampler.set_epoch(epoch)
            for x, y in loader:
                step_before = manager.current_step()
                optimizer.zero_grad()  # asks the lighthouse for this step's quorum (in the background)
                loss = loss_fn(ddp_model(x), y)
                loss.backward()  # the gradient all-reduce across the quorum's groups
                optimizer.step()  # applied only if should_commit(): every group's all-reduce went through
                committed = manager.current_step() > step_before
                recorder.step(manager, committed, loss)  # workbook
                if committed and manager.current_step() % args.log_every == 0:
                    print(f"group {REPLICA_GROUP_ID} step {manager.current_step()} loss {loss.item():.5f} "
                          f"participants {manager.num_participants()} batches_committed {manager.batches_committed()}",
                          flush=True)
                if manager.current_step() >= args.max_steps:
                    break
            epoch += 1
    finally:
        manager.shutdown(wait=False)  # stops its manager server and heartbeats; the others go on without it
        recorder.close()


# ---------------------------------------------------------------------------------------------------------------
# Workbook instrumentation
# What the workbook's checks read: one JSON line per step per group in <metrics-dir>/group<ID>.jsonl (appended: a
# restarted group adds its own lines, told apart by "pid"), and one "heal" line when the group received its state.
# ---------------------------------------------------------------------------------------------------------------

def add_workbook_flags(p):
    p.add_argument("--metrics-dir", type=str, default="metrics",
                   help="folder for group<REPLICA_GROUP_ID>.jsonl, one line per step (created if missing)")
    p.add_argument("--step-delay-s", type=float, default=0.0,
                   help="sleep after each step (seconds), so a demo can kill a group mid-run")
    p.add_argument("--leave-on-sigterm", action="store_true",
                   help="on SIGTERM (SLURM's scancel or preemption, SIGKILL following after KillWait) finish the "
                        "current step, record it, then exit 0: the group leaves between two steps, never inside an "
                        "all-reduce the other groups are in (torchft 0.2.0's DDP then fails theirs too)")


def weights_sha256(model):
    """SHA-256 of every parameter's bytes in order: two groups with equal hashes hold bitwise equal weights."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


class Recorder:
    def __init__(self, args, model):
        self.args, self.model = args, model
        Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
        self.file = open(Path(args.metrics_dir) / f"group{REPLICA_GROUP_ID}.jsonl", "a", buffering=1)
        self.write({"event": "start"})
        self.asked_to_leave = False
        if args.leave_on_sigterm:  # Python runs the handler between two bytecodes: never inside a collective
            signal.signal(signal.SIGTERM, lambda signum, frame: setattr(self, "asked_to_leave", True))

    def write(self, fields):
        # One write per line, so a reader never sees half a record (a SIGKILL may cut the last line off).
        self.file.write(json.dumps({"replica_group": REPLICA_GROUP_ID, "pid": os.getpid(), "time_s": time.time(),
                                    **fields}) + "\n")

    def healed(self, manager, source_group):
        # Called while the state is applied: the step is already the one the group joined at.
        self.write({"event": "heal", "step": manager.current_step(), "source_group": source_group})

    def step(self, manager, committed, loss):
        self.write({"event": "step", "step": manager.current_step(), "committed": committed,
                    "batches_committed": manager.batches_committed(), "participants": manager.num_participants(),
                    "loss_local": loss.item(), "weights_sha256": weights_sha256(self.model)})
        if self.asked_to_leave:  # between two steps: main's finally shuts the Manager down, the others go on
            sys.exit(0)
        if self.args.step_delay_s:
            time.sleep(self.args.step_delay_s)

    def close(self):
        self.file.close()


if __name__ == "__main__":
    main()
