"""train_lm.py's data: the Python standard library's own source as bytes, and each rank's share of it.

The corpus: the files in ``CORPUS_FILES`` (a fixed, sorted list of pure-Python standard-library modules that exist
in every Python from 3.10 on), concatenated in that order and cut to ``--corpus-bytes``: every rank and every machine
with the same Python reads the same bytes; another Python version reads text of the same size whose content differs
a little (the modules change between releases). The last ``--val-fraction`` of it is held out.

``Batches`` deals every step's windows to the ranks as ``DistributedSampler`` would, from a position (epoch, windows
read) that is the same on every rank, so a checkpoint of it resumes on any number of ranks. Only torch.
"""

import sys
import sysconfig
from pathlib import Path

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import Dataset, DistributedSampler

CORPUS_FILES = ("argparse.py", "ast.py", "calendar.py", "collections/__init__.py", "dataclasses.py", "difflib.py",
                "enum.py", "fractions.py", "functools.py", "heapq.py", "inspect.py", "json/decoder.py",
                "json/encoder.py", "logging/__init__.py", "pprint.py", "random.py", "shutil.py", "statistics.py",
                "string.py", "textwrap.py", "threading.py", "tokenize.py", "typing.py", "weakref.py")


def read_corpus(n_bytes):
    """The first ``n_bytes`` of CORPUS_FILES concatenated, as a uint8 tensor (the same on every rank)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    missing = [f for f in CORPUS_FILES if not (root / f).is_file()]
    if missing:
        sys.exit(f"the standard library's source is not in {root} (missing {missing[:3]}): this Python ships no .py "
                 "sources; use a Python that does (python.org builds, pyenv, conda, Debian's python3 all do)")
    data = b"".join((root / f).read_bytes() for f in CORPUS_FILES)
    if len(data) < n_bytes:
        sys.exit(f"--corpus-bytes {n_bytes}: the corpus files hold only {len(data)} bytes here")
    return torch.frombuffer(bytearray(data[:n_bytes]), dtype=torch.uint8)


class TokenWindows(Dataset):
    """Non-overlapping windows of ``block_size + 1`` bytes: the inputs and, shifted by one, the targets."""

    def __init__(self, data, block_size):
        self.data, self.block_size = data, block_size

    def __len__(self):
        return (len(self.data) - 1) // self.block_size

    def __getitem__(self, i):
        chunk = self.data[i * self.block_size: (i + 1) * self.block_size + 1].long()
        return chunk[:-1], chunk[1:]


class Batches(Stateful):
    """This rank's batches, and the data position a checkpoint keeps: (epoch, windows of the epoch already read).

    Every epoch has one order of all windows, the same on every rank: ``DistributedSampler``'s shuffle of the whole
    dataset (one replica). A step reads the next world_size x batch_size windows of that order; rank r takes every
    world_size-th of them from the r-th on, as ``DistributedSampler(num_replicas=world_size, drop_last=True)`` would
    deal them, so each rank reads exactly the windows that sampler would give it. Why not that sampler itself: it
    deals from the start of the epoch, and its position (a rank's batch index) means nothing on another number of
    ranks. This position is global (windows of the epoch read): a run resumed on another world size reads on from
    the same place in the same order, so no window of the epoch is skipped or read twice. An epoch ends when fewer
    than one step's windows are left (drop_last: at most world_size x batch_size - 1 windows of it are not read).
    A DataLoader's iterator cannot be saved; where it is can. Stateful: DCP saves and restores it by itself.
    """

    def __init__(self, dataset, batch_size, rank, world_size, seed):
        # One replica: the sampler shuffles the whole dataset with seed + epoch, the same order on every rank.
        self.sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)
        self.dataset, self.batch_size, self.rank, self.world_size = dataset, batch_size, rank, world_size
        self.epoch, self.windows_read, self.order, self.read = 0, 0, None, []
        if len(dataset) < batch_size * world_size:
            sys.exit(f"{len(dataset)} training windows are fewer than one step's {world_size} ranks x --batch-size "
                     f"{batch_size}: lower --batch-size or raise --corpus-bytes")

    def next(self, device):
        step_windows = self.world_size * self.batch_size  # what all ranks read in one micro-batch
        if self.windows_read + step_windows > len(self.dataset):
            self.epoch, self.windows_read, self.order = self.epoch + 1, 0, None  # a new epoch: a new shuffle
        if self.order is None:
            self.sampler.set_epoch(self.epoch)  # without it every epoch repeats the same order
            self.order = list(self.sampler)
        start = self.windows_read + self.rank
        picked = self.order[start:self.windows_read + step_windows:self.world_size]
        self.read.extend(picked)  # workbook: what --log-windows writes
        self.windows_read += step_windows
        x, y = zip(*(self.dataset[i] for i in picked))
        return torch.stack(x).to(device), torch.stack(y).to(device)

    def state_dict(self):
        return {"epoch": self.epoch, "windows_read": self.windows_read}  # the same on every rank, for any world size

    def load_state_dict(self, state):
        self.epoch, self.windows_read, self.order = int(state["epoch"]), int(state["windows_read"]), None
