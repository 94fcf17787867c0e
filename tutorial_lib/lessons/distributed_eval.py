"""Distributed evaluation: DistributedSampler pads, so a naive all-reduced metric counts some samples twice.

Run card
    python distributed_eval.py                                # one process: the reference metric
    torchrun --nproc-per-node 2 distributed_eval.py           # 11 samples on 2 ranks: 12 are evaluated
    torchrun --nproc-per-node 5 distributed_eval.py           # 15 evaluated: another wrong naive value

A fixed model (seeded, no training) is evaluated on a fixed dataset of ``--dataset-size`` samples, three ways:

    naive     ``DistributedSampler(dataset, shuffle=False)``, each rank averages loss and accuracy over what its
              loader gave it, then the ranks average their averages (an all_reduce). The sampler pads the index
              list by repeating its first indices until it divides by the world size (11 on 2 ranks: index 0 is
              evaluated twice, 12 samples in all), so the metric is over the padded list: wrong, and different
              for another world size (5 ranks pad to 15).
    exact     a sampler that does not pad (rank r takes r, r + W, r + 2W, ...: shards differ by at most one
              sample), and the all_reduce sums the loss and the number of correct predictions *and counts the
              samples*; one division at the end. Equals the single-process metric.
    gathered  the padded loader again, and every rank's (index, loss, correct) all-gathered: results are keyed
              by sample index, so the repeated sample lands on its own slot twice and counts once. Also exact.

Each rank prints the indices it evaluated. Writes ``<metrics-dir>/eval_rank<RANK>.json``: ``{"rank",
"world_size", "dataset_size", "padded_indices", "shard_indices", "naive", "exact", "gathered", "seen_twice",
"per_sample_loss", "per_sample_correct"}``; each metric is ``{"loss", "accuracy", "samples"}`` (samples: how many
evaluated results went into it, over all ranks). Only torch and the standard library are used.
"""

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset-size", type=int, default=11, help="samples in the evaluation set (count)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per batch per rank (count)")
    p.add_argument("--input-dim", type=int, default=8, help="features per sample (count)")
    p.add_argument("--num-classes", type=int, default=3, help="classes (count)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and the dataset")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--pg-timeout-s", type=float, default=60.0, help="collective timeout (seconds)")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for eval_rank<RANK>.json")
    args = p.parse_args(argv)
    for name in ("dataset_size", "batch_size", "input_dim", "num_classes", "pg_timeout_s"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    return args


class LabelledDataset(Dataset):
    """``size`` fixed samples (x, label, index); the index says which sample a rank evaluated."""

    def __init__(self, size, input_dim, num_classes, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, input_dim, generator=g)
        teacher = torch.randn(input_dim, num_classes, generator=g)
        self.y = (self.x @ teacher + torch.randn(size, num_classes, generator=g)).argmax(dim=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class ShardSampler(Sampler):
    """Rank r of W takes indices r, r + W, r + 2W, ...: every sample exactly once over the ranks, no padding.

    Shards differ in length by at most one, which is fine for evaluation (no collective runs per batch) and
    wrong for DDP training, where every rank must run the same number of backward passes.
    """

    def __init__(self, dataset, num_replicas, rank):
        self.indices = list(range(rank, len(dataset), num_replicas))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


def setup(args):
    """Pick this rank's device and join the process group under torchrun; return (rank, world_size, device)."""
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): "
                 "use --device cpu, or run on a machine with a GPU and a CUDA build of torch")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # LOCAL_RANK picks the GPU on this node
    if "RANK" in os.environ:  # under torchrun; `python distributed_eval.py` evaluates alone, no process group
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=args.pg_timeout_s),
                                device_id=device if use_cuda else None)
        return dist.get_rank(), dist.get_world_size(), device
    return 0, 1, device


@torch.no_grad()
def evaluate(model, loader, device):
    """This rank's per-sample results, in loader order: (indices, losses, correct)."""
    # Start from empty tensors: with more ranks than samples, a rank's unpadded shard is empty.
    indices = [torch.empty(0, dtype=torch.long, device=device)]
    losses, correct = [torch.empty(0, device=device)], [torch.empty(0, dtype=torch.bool, device=device)]
    for x, y, index in loader:
        logits = model(x.to(device))
        y = y.to(device)
        losses.append(F.cross_entropy(logits, y, reduction="none"))  # per sample, not the batch mean
        correct.append(logits.argmax(dim=1) == y)
        indices.append(index.to(device))
    return torch.cat(indices), torch.cat(losses), torch.cat(correct)


def all_reduce_sum(t):
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def naive_metrics(losses, correct, world_size):
    # The common loop: each rank averages over the samples its loader gave it (padding included), then the ranks
    # average their averages. Every rank has the same number of samples, so this is the mean over the padded list.
    local = torch.stack([losses.double().mean(), correct.double().mean()])
    loss, accuracy = (all_reduce_sum(local) / world_size).tolist()
    return {"loss": loss, "accuracy": accuracy, "samples": len(losses) * world_size}


def exact_metrics(losses, correct):
    # Sums and counts, never means: the all_reduce adds them over ranks, and one division at the end weights every
    # sample once, whatever the shard sizes. (float64 so the sum's order changes only the last bits.)
    count = torch.tensor(len(losses), dtype=torch.float64, device=losses.device)
    sums = torch.stack([losses.double().sum(), correct.double().sum(), count])
    loss_sum, correct_sum, count = all_reduce_sum(sums).tolist()
    return {"loss": loss_sum / count, "accuracy": correct_sum / count, "samples": int(count)}


def gathered_metrics(indices, losses, correct, dataset_size, world_size):
    # DistributedSampler gives every rank the same number of samples, so plain all_gather of equal-size tensors
    # works (all_gather_object would too, through pickling). Keyed by sample index, the padded duplicate writes
    # the same value into the same slot, and the metric is over the dataset_size real samples.
    parts = [torch.stack([indices.double(), losses.double(), correct.double()])]
    if dist.is_initialized():
        parts = [torch.empty_like(parts[0]) for _ in range(world_size)]
        dist.all_gather(parts, torch.stack([indices.double(), losses.double(), correct.double()]))
    every = torch.cat(parts, dim=1)  # 3 x (num_samples * world_size): index, loss, correct
    index = every[0].long()
    per_sample_loss = torch.zeros(dataset_size, dtype=torch.float64, device=every.device)
    per_sample_correct = torch.zeros(dataset_size, dtype=torch.float64, device=every.device)
    per_sample_loss[index], per_sample_correct[index] = every[1], every[2]
    seen = torch.bincount(index, minlength=dataset_size)
    metric = {"loss": per_sample_loss.mean().item(), "accuracy": per_sample_correct.mean().item(),
              "samples": int((seen > 0).sum())}
    return metric, (seen > 1).nonzero().flatten().tolist(), per_sample_loss.tolist(), per_sample_correct.tolist()


@record
def main():
    args = parse_args()
    rank, world_size, device = setup(args)
    try:
        torch.manual_seed(args.seed)  # the same fixed model on every rank (a trained model stands in here)
        model = nn.Linear(args.input_dim, args.num_classes).to(device).eval()
        # After DDP training, evaluate model.module: evaluation needs none of DDP's gradient synchronisation.
        dataset = LabelledDataset(args.dataset_size, args.input_dim, args.num_classes, args.seed)

        # (a) naive: the training sampler reused for evaluation (shuffle=False, drop_last=False: it pads).
        padded = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
        p_indices, p_losses, p_correct = evaluate(model, DataLoader(dataset, args.batch_size, sampler=padded), device)
        naive = naive_metrics(p_losses, p_correct, world_size)
        # (b) exact: a sampler without padding, and sums and counts all-reduced.
        shard = ShardSampler(dataset, num_replicas=world_size, rank=rank)
        s_indices, s_losses, s_correct = evaluate(model, DataLoader(dataset, args.batch_size, sampler=shard), device)
        exact = exact_metrics(s_losses, s_correct)
        # (c) the padded results, gathered and keyed by sample index.
        gathered, seen_twice, per_sample_loss, per_sample_correct = gathered_metrics(
            p_indices, p_losses, p_correct, len(dataset), world_size)

        sys.stdout.write(f"rank {rank}: DistributedSampler gave indices {p_indices.tolist()} "
                         f"({padded.num_samples} per rank, {padded.total_size} in all for {len(dataset)} samples)\n")
        sys.stdout.write(f"rank {rank}: the shard sampler gave indices {s_indices.tolist()}\n")
        if rank == 0:
            for name, m in (("naive", naive), ("exact", exact), ("gathered", gathered)):
                sys.stdout.write(f"{name:>8}: loss {m['loss']:.6f}  accuracy {m['accuracy']:.4f}  "
                                 f"over {m['samples']} evaluated samples\n")
            sys.stdout.write(f"seen twice under DistributedSampler: indices {seen_twice}\n")
        Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.metrics_dir) / f"eval_rank{rank}.json").write_text(json.dumps({
            "rank": rank, "world_size": world_size, "dataset_size": len(dataset),
            "padded_indices": p_indices.tolist(), "shard_indices": s_indices.tolist(),
            "naive": naive, "exact": exact, "gathered": gathered, "seen_twice": seen_twice,
            "per_sample_loss": per_sample_loss, "per_sample_correct": per_sample_correct}))
        if dist.is_initialized():
            dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
