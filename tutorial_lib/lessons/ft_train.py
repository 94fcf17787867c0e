"""Fault-tolerant DDP (or DiLoCo) with torchft: replica groups that die and rejoin while the others keep training.

Run card (one terminal each; every group is its own torchrun job)
    python ft_train.py --max-steps 50                                # one group alone, with a lighthouse of its own
    torchrun --nproc-per-node 1 ft_train.py --max-steps 50          # the same under torchrun
    torchrun --nproc-per-node 2 ft_train.py --max-steps 50          # one HSDP group: 2 ranks sharding the model

    torchft_lighthouse --min_replicas 1 --bind 127.0.0.1:29510       # the lighthouse: who is alive, the quorum
    TORCHFT_LIGHTHOUSE=http://127.0.0.1:29510 REPLICA_GROUP_ID=0 NUM_REPLICA_GROUPS=2 \\
        torchrun --nproc-per-node 1 --master-port 29600 ft_train.py --max-steps 200
    TORCHFT_LIGHTHOUSE=http://127.0.0.1:29510 REPLICA_GROUP_ID=1 NUM_REPLICA_GROUPS=2 \\
        torchrun --nproc-per-node 1 --master-port 29601 ft_train.py --max-steps 200
    # kill group 1 (Ctrl-C, or kill -9 its processes): group 0 goes on alone; start it again: it heals from group 0
    # add --algorithm diloco --sync-every 5 to both groups: DiLoCo, the groups all-reduce once every 5 steps
    # --nproc-per-node 2 for both groups: HSDP, each group shards the model over its 2 ranks

What it shows
    * torchrun's restart stops every rank; torchft keeps the healthy replica groups stepping. Each group is a torchrun
      job of its own; the groups find each other through the lighthouse, which forms a *quorum* (the groups alive
      now) at every step, and torchft's process group is rebuilt for each new quorum;
    * ``manager.allreduce`` averages each gradient across the groups of the quorum, and ``torchft.Optimizer`` steps
      only when ``manager.should_commit()`` says every group's all-reduce succeeded: a step that failed half-way is
      dropped everywhere, never applied twice. (``torchft.DistributedDataParallel`` does the same all-reduce in a DDP
      comm hook, but in torchft 0.2.0 that hook crashes the surviving group when a peer dies mid-all-reduce:
      ``assert fut._fut`` in ``torchft/ddp.py``, as a failed ``wait()`` leaves the future unset.)
    * a group that (re)joins behind the others *heals*: it receives the model and optimizer state from a live peer
      (``PGTransport``, over the same gloo/NCCL process group), no checkpoint file involved;
    * ``manager.batches_committed()`` counts the batches that reached the weights: +2 per step with two groups, +1
      while one is down (its samples are simply not trained on);
    * ``--algorithm diloco`` (DiLoCo, arXiv 2311.08105; ``torchft.local_sgd.DiLoCo``) trades communication for
      drift: each group takes ``--sync-every`` (H) steps of its own optimizer alone, then the groups all-reduce the
      *pseudo-gradient* (their weights at the last sync minus their weights now) once and an outer optimizer (SGD,
      Nesterov momentum) applies its average to the weights of the last sync. The weights sent every H steps
      are as large as the gradients DDP sends every step: 1/H of DDP's traffic. torchft commits (and counts a step)
      only at a sync;
    * a group of several ranks (``torchrun --nproc-per-node 2``) is fault-tolerant HSDP (replicas x shards, as in
      torchtitan's torchft integration): FSDP2's ``fully_shard`` splits every layer over the group's ranks and
      reduce-scatters the gradients inside the group; torchft all-reduces each rank's *shard* of the gradient with
      the same rank of the other groups (FSDP2's all-reduce hook). A rank sends 1/N of the model's gradient across
      groups, and heals its shard from the same rank of a live group.

Needs torch, torchft and numpy (torchft sends state through numpy and does not declare it). In a workbook run,
``_workbook.py`` beside it adds the records notebook 15 reads (``--metrics-dir``) and its drills' flags.
"""

import argparse
import logging
import os
import sys
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import TCPStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.utils.data import DataLoader, Dataset
from torchft import DistributedSampler, Manager, Optimizer, ProcessGroupGloo, ProcessGroupNCCL
from torchft.checkpointing.pg_transport import PGTransport
from torchft.coordination import LighthouseServer
from torchft.local_sgd import DiLoCo

try:  # the workbook's instruments, written beside this file in a workbook run; a copy trains without them
    import _workbook as workbook
except ImportError:
    workbook = None

# The groups torchft can form: set by whoever starts the groups, one id per group (0, 1, ...).
REPLICA_GROUP_ID = int(os.environ.get("REPLICA_GROUP_ID", 0))
NUM_REPLICA_GROUPS = int(os.environ.get("NUM_REPLICA_GROUPS", 2))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-steps", type=int, default=200,
                   help="steps to train, as torchft commits them (count): DDP every step, DiLoCo every --sync-every")
    p.add_argument("--batch-size", type=int, default=32, help="samples per group per step (count)")
    p.add_argument("--dataset-size", type=int, default=8192, help="samples in the synthetic dataset (count)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW's learning rate (unitless; DiLoCo's inner optimizer)")
    p.add_argument("--algorithm", choices=["ddp", "diloco"], default="ddp",
                   help="ddp: all-reduce the gradients every step; diloco: the weights' change every --sync-every steps")
    p.add_argument("--sync-every", type=int, default=5,
                   help="DiLoCo's H: local steps between two all-reduces (count; --algorithm diloco only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, the dataset and the shuffle")
    p.add_argument("--pg-timeout-s", type=float, default=5.0,
                   help="gloo's collective timeout across groups (seconds): how long an all-reduce with a dead "
                        "group can hang before the step is dropped")
    p.add_argument("--manager-timeout-s", type=float, default=30.0,
                   help="the Manager's timeout for its own calls: should_commit, sending a heal (seconds)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: this group's GPU (REPLICA_GROUP_ID mod the GPU count) over NCCL if there is one, else "
                        "the CPU over gloo")
    p.add_argument("--log-every", type=int, default=20, help="print a line every N commits (count; DiLoCo: syncs)")
    if workbook:  # workbook
        workbook.add_torchft_flags(p)  # workbook: --metrics-dir, --step-delay-s, --die-sending-state-if
    args = p.parse_args(argv)
    for name in ("max_steps", "batch_size", "dataset_size", "log_every", "sync_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("pg_timeout_s", "manager_timeout_s"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0 (seconds), got {getattr(args, name)}")
    if args.batch_size > args.dataset_size:
        p.error(f"--batch-size {args.batch_size} is larger than --dataset-size {args.dataset_size}")
    if args.algorithm == "diloco" and args.max_steps % args.sync_every:
        p.error(f"--max-steps {args.max_steps} must be a multiple of --sync-every {args.sync_every} (DiLoCo commits "
                "only at a sync)")
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
    # Ranks *inside* this replica group (torchrun's); the groups themselves are torchft's.
    rank, local_rank, world_size = (int(os.environ.get(k, d)) for k, d in
                                    (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))
    sharded = world_size > 1  # HSDP: the group's ranks shard the model
    if sharded and args.algorithm == "diloco":
        sys.exit(f"--algorithm diloco runs one rank per replica group here (got WORLD_SIZE={world_size})")
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            sys.exit("--device cuda: torch sees no GPU here (torch.cuda.is_available() is False); use --device cpu")
        # one GPU per rank, the groups on one box side by side
        device = torch.device("cuda", (REPLICA_GROUP_ID * world_size + local_rank) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        os.environ.setdefault("NCCL_HOSTID", str(REPLICA_GROUP_ID))  # groups on one box: NCCL sees other hosts
    else:
        device = torch.device("cpu")
    dataset = TeacherDataset(args.dataset_size, seed=args.seed)
    # Shards the data over every group that may exist: a dead group's shard is not trained on while it is down.
    sampler = DistributedSampler(dataset, replica_rank=REPLICA_GROUP_ID, num_replica_groups=NUM_REPLICA_GROUPS,
                                 group_rank=rank, num_replicas=world_size, shuffle=True, seed=args.seed,
                                 drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        sys.exit(f"--dataset-size {args.dataset_size} leaves each of {NUM_REPLICA_GROUPS * world_size} ranks "
                 f"fewer samples than --batch-size {args.batch_size}")

    if "RANK" not in os.environ:  # `python ft_train.py`: the store torchrun would host, in this process
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), RANK="0", WORLD_SIZE="1")
    if "TORCHFT_LIGHTHOUSE" not in os.environ and rank == 0:  # none given: one of our own, this group trains alone
        # (only the group's rank 0 talks to the lighthouse)
        lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)  # (the torchft_lighthouse command's server)
        os.environ["TORCHFT_LIGHTHOUSE"] = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]

    model = make_model(args.seed).to(device)
    if sharded:  # each rank keeps 1/world_size of every layer; FSDP2 reduce-scatters the gradients in the group
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=60),
                                device_id=device if device.type == "cuda" else None)
        mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    inner_optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    # What a healthy group sends a healing one, and how the healing one takes it in.
    def state_dict():
        if recorder:  # workbook
            recorder.sending_state(manager)  # workbook
        return {"model": model.state_dict(), "optim": inner_optimizer.state_dict(), "sent_by": REPLICA_GROUP_ID}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner_optimizer.load_state_dict(state["optim"])
        if recorder:  # workbook
            recorder.healed(manager, source_group=state["sent_by"])  # workbook

    # The process group *across* replica groups. torchft reconfigures it (new members, new store prefix) whenever
    # the quorum changes; a short timeout turns an all-reduce with a dead group into a dropped step, not a hang.
    pg_timeout = timedelta(seconds=args.pg_timeout_s)
    pg = ProcessGroupNCCL(timeout=pg_timeout) if device.type == "cuda" else ProcessGroupGloo(timeout=pg_timeout)
    manager = Manager(
        pg=pg,
        min_replica_size=1,  # commit a step as long as one group is alive
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"ft_train_{REPLICA_GROUP_ID}",  # the lighthouse's name for this group (trailing digits: the id)
        timeout=timedelta(seconds=args.manager_timeout_s),
        # Heal through the process group itself (torchft's default is an HTTP server on every interface).
        checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=args.manager_timeout_s),
                                         device=device),
        init_sync=False,
        # DiLoCo needs the quorum (and any heal) before its all-reduce; with FSDP2 the heal's state_dict() must not
        # run beside the forward pass (it did: the sender crashed in backward on a freed parameter's storage).
        use_async_quorum=args.algorithm == "ddp" and not sharded,
    )
    if sharded:
        def average_across_groups(grad_shard):  # FSDP2 calls this with each layer's reduce-scattered gradient
            manager.allreduce(grad_shard).wait()  # the same rank of every group holds the same shard

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_all_reduce_hook(average_across_groups)
    if args.algorithm == "ddp":
        optimizer = Optimizer(manager, inner_optimizer)  # zero_grad() starts the quorum, step() commits or drops
        syncing, steps_per_commit = nullcontext(), 1
    else:  # the model and AdamW stay plain: between two syncs nothing leaves the group
        optimizer = inner_optimizer
        outer_optimizer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)  # the paper's
        # Hooks inner_optimizer.step(): every H-th step starts the quorum, all-reduces (last sync's - current weights),
        # and if should_commit(), the outer optimizer steps from the last sync's weights with that average.
        syncing = DiLoCo(manager, [model], inner_optimizer, outer_optimizer, sync_every=args.sync_every)
        steps_per_commit = args.sync_every
    loss_fn = nn.MSELoss()
    recorder = workbook.TorchftRecorder(args, model, manager) if workbook else None  # workbook: group<ID>.jsonl

    try:
        with syncing:
            epoch = 0
            while manager.current_step() * steps_per_commit < args.max_steps:
                sampler.set_epoch(epoch)
                for x, y in loader:
                    x, y = x.to(device), y.to(device)
                    step_before = manager.current_step()
                    optimizer.zero_grad()  # DDP: asks the lighthouse for this step's quorum (in the background)
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    if args.algorithm == "ddp" and not sharded:  # (HSDP: in the hook above)
                        for p in model.parameters():  # average each gradient across the quorum's groups
                            manager.allreduce(p.grad).wait()  # a failure is recorded: should_commit() drops the step
                    optimizer.step()  # DDP: applied only if should_commit(); DiLoCo: every H-th step syncs
                    committed = manager.current_step() > step_before
                    if recorder:  # workbook
                        recorder.step(manager, committed, loss)  # workbook
                    if committed and manager.current_step() % args.log_every == 0:
                        # One write per line (torchrun runs ranks unbuffered, ``python -u``: print's text and
                        # newline would be two writes, and another rank's line could fall between them).
                        sys.stdout.write(f"group {REPLICA_GROUP_ID} step {manager.current_step()} loss "
                                         f"{loss.item():.5f} participants {manager.num_participants()} "
                                         f"batches_committed {manager.batches_committed()}\n")
                    if manager.current_step() * steps_per_commit >= args.max_steps:
                        break
                epoch += 1
    finally:
        manager.shutdown(wait=False)  # stops its manager server and heartbeats; the others go on without it
        if recorder:  # workbook
            recorder.close()  # workbook
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
