"""DataLoader knobs measured: num_workers, persistent_workers, prefetch_factor, pin_memory, per rank.

Run card
    python dataloader_bench.py
    torchrun --nproc-per-node 2 dataloader_bench.py --sample-delay-ms 2
    torchrun --nproc-per-node 2 dataloader_bench.py --one-knob-at-a-time   # each knob vs one baseline

The dataset sleeps ``--sample-delay-ms`` per sample, standing in for decoding or reading from disk.
With ``num_workers=0`` the training process loads every batch itself and waits; with workers the
batches are loaded in parallel, ahead of time (``prefetch_factor`` batches per worker). Workers are
started again every epoch unless ``persistent_workers=True``. ``pin_memory=True`` copies batches into
page-locked host memory so the host-to-GPU copy can run asynchronously (``non_blocking=True``): it
only helps with CUDA, so it is measured only there (``--one-knob-at-a-time`` runs it everywhere: without an
accelerator the DataLoader warns and pins nothing). Every rank reads its own shard (DistributedSampler).

Besides the speed, each row counts what the knobs do, in the training process: ``worker_starts`` (worker
processes started over all epochs, by ``worker_init_fn``), ``batches_requested_at_start`` (batches whose
indices the loader had sent to its workers when ``iter(loader)`` returned, in epoch 0: ``prefetch_factor``
per worker), ``batch_is_pinned`` (the first batch's ``is_pinned()``), and from the moments every sample's load
began and ended (each sample carries them, read from the machine-wide monotonic clock): ``max_concurrent_loads``
(the most loads in progress at one instant: 1 without workers, up to ``num_workers`` with them) and
``loading_processes`` (the processes that loaded samples). ``first_batch_s`` is the time from ``iter(loader)`` to
the first batch in epoch 0 (with workers: starting them, and one worker loading a whole batch).
Writes ``<metrics-dir>/loader_rank<RANK>.json``. Only torch and the standard library.
"""

import argparse
import functools
import json
import multiprocessing
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset-size", type=int, default=384, help="samples in the dataset (count)")
    p.add_argument("--batch-size", type=int, default=16, help="samples per batch per rank (count)")
    p.add_argument("--input-dim", type=int, default=1024, help="float32 values per sample (count)")
    p.add_argument("--sample-delay-ms", type=float, default=2.0, help="simulated load time per sample (ms)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per configuration (count)")
    p.add_argument("--num-workers", type=int, nargs="+", default=[0, 2], help="worker counts to try (count)")
    p.add_argument("--one-knob-at-a-time", action="store_true",
                   help="rows: num_workers=0, a baseline (the first --num-workers > 0, persistent_workers=False, "
                        "prefetch_factor=2, pin_memory=False), then the baseline with one knob changed each: "
                        "persistent_workers=True, prefetch_factor=4, pin_memory=True (also without CUDA)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--metrics-dir", type=str, default="metrics", help="folder for loader_rank<RANK>.json")
    args = p.parse_args(argv)
    for name in ("dataset_size", "batch_size", "input_dim", "epochs"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.sample_delay_ms < 0 or any(n < 0 for n in args.num_workers):
        p.error(f"--sample-delay-ms and --num-workers must be >= 0, got {args.sample_delay_ms}, {args.num_workers}")
    if args.one_knob_at_a_time and not any(n > 0 for n in args.num_workers):
        p.error(f"--one-knob-at-a-time needs a --num-workers value > 0 for its baseline, got {args.num_workers}")
    return args


class SlowDataset(Dataset):
    def __init__(self, size, features, delay_s):
        self.size, self.features, self.delay_s = size, features, delay_s

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        started = time.monotonic()
        time.sleep(self.delay_s)  # stands in for reading and decoding one sample
        # The sample, and when and where it was loaded (the workbook's measurement: loads that overlap in time).
        return torch.full((self.features,), float(i)), torch.tensor([os.getpid(), started, time.monotonic()],
                                                                    dtype=torch.float64)


class CountingSampler(DistributedSampler):
    """A DistributedSampler that counts the indices the DataLoader has drawn from it (``drawn``, in this process)."""

    drawn = 0

    def __iter__(self):
        for index in super().__iter__():
            self.drawn += 1
            yield index


def count_worker_start(counter, worker_id):
    """worker_init_fn: runs once in every worker process the DataLoader starts."""
    with counter.get_lock():
        counter.value += 1


def one_knob_configurations(num_workers):
    """num_workers=0, a baseline with workers, and the baseline with each knob changed alone: (changed, config)."""
    n = next(n for n in num_workers if n > 0)
    baseline = {"num_workers": n, "persistent_workers": False, "prefetch_factor": 2, "pin_memory": False}
    return [("num_workers=0", {"num_workers": 0, "persistent_workers": False, "prefetch_factor": None,
                               "pin_memory": False}),
            ("baseline", baseline),
            ("persistent_workers=True", {**baseline, "persistent_workers": True}),
            ("prefetch_factor=4", {**baseline, "prefetch_factor": 4}),
            ("pin_memory=True", {**baseline, "pin_memory": True})]


def configurations(num_workers, cuda):
    configs = []
    for n in num_workers:
        configs.append({"num_workers": n, "persistent_workers": False, "prefetch_factor": None, "pin_memory": False})
        if n > 0:
            configs.append({"num_workers": n, "persistent_workers": True, "prefetch_factor": 4, "pin_memory": False})
            if cuda:
                configs.append({"num_workers": n, "persistent_workers": True, "prefetch_factor": 4, "pin_memory": True})
    return configs


def measure(config, dataset, sampler, args, device):
    starts = multiprocessing.Value("i", 0)  # shared with the workers: each adds 1 when it starts
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        worker_init_fn=functools.partial(count_worker_start, starts), **config)
    samples, requested_at_start, pinned, loads, first_batch_s = 0, 0, None, [], None
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        sampler.drawn = 0
        batches = iter(loader)  # with workers: starts them (unless persistent) and sends out the first index batches
        if epoch == 0:
            requested_at_start = -(-sampler.drawn // args.batch_size)
        for batch, load in batches:
            first_batch_s = time.perf_counter() - start if first_batch_s is None else first_batch_s
            pinned = batch.is_pinned() if pinned is None else pinned
            batch = batch.to(device, non_blocking=config["pin_memory"])
            samples += batch.shape[0]
            loads += load.tolist()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    del batches, loader  # stops persistent workers: every worker has run worker_init_fn before it is joined
    return {**config, "samples": samples, "seconds": seconds, "samples_per_s": samples / seconds,
            "first_batch_s": first_batch_s, "worker_starts": starts.value,
            "batches_requested_at_start": requested_at_start, "batch_is_pinned": bool(pinned),
            "max_concurrent_loads": max_concurrent(loads), "loading_processes": len({pid for pid, _, _ in loads})}


def max_concurrent(loads):
    """The most loads in progress at one instant, from (pid, start, end) triples: a sweep over the start and end
    moments (an end before a start at the same moment: touching loads do not overlap)."""
    moments = sorted([(end, -1) for _, _, end in loads] + [(begin, 1) for _, begin, _ in loads])
    running = most = 0
    for _, change in moments:
        running += change
        most = max(most, running)
    return most


def setup(args):
    """Pick this rank's device and join the process group under torchrun; return (rank, world_size, device)."""
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): "
                 "use --device cpu, or a machine with a GPU and a CUDA build of torch")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        device = torch.device("cuda", local_rank)  # LOCAL_RANK picks the GPU on this node
        # Before any CUDA work: pin_memory=True pins on the *current* device, so without set_device every
        # rank would open a CUDA context (and pinned buffers) on GPU 0.
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=120),
                                device_id=device if use_cuda else None)
        return dist.get_rank(), dist.get_world_size(), device
    return 0, 1, device


@record
def main():
    args = parse_args()
    rank, world_size, device = setup(args)
    use_cuda, distributed = device.type == "cuda", dist.is_initialized()
    try:
        dataset = SlowDataset(args.dataset_size, args.input_dim, args.sample_delay_ms / 1000)
        sampler = CountingSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
        rows = []
        if args.one_knob_at_a_time:
            labelled = one_knob_configurations(args.num_workers)
        else:
            labelled = [(None, config) for config in configurations(args.num_workers, use_cuda)]
        for changed, config in labelled:
            if distributed:
                dist.barrier()  # ranks measure each configuration at the same time, as in training
            rows.append(measure(config, dataset, sampler, args, device))
            if changed is not None:
                rows[-1]["changed"] = changed
            sys.stdout.write(f"{config} -> {rows[-1]['samples_per_s']:.0f} samples/s\n")
        Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.metrics_dir) / f"loader_rank{rank}.json").write_text(
            json.dumps({"rank": rank, "world_size": world_size, "device": str(device), "rows": rows}))
        if distributed:
            dist.barrier()
    finally:
        if distributed:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
