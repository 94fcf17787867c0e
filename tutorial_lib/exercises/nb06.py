"""Notebook 06's exercises (multi-node): the GPUs the seeds' set_device(RANK) asks for, a data set sharded by the
local rank, node-local preparation done by the global rank 0. The script exercises run on 2 simulated nodes (two
torchrun agents on this machine, as the notebook's section 1) with 2 ranks each."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import MetricsError
from ..i18n import N_, Message
from ..runs.observed import read_observed
from .core import Context, Difference, Spec, register
from .observing import ObservedCheck, Variants
from .properties import Distributed
from .same_values import DistinctLosses, SameTensors

NNODES, NPROC = 2, 2  # simulated nodes, ranks per node
WORLD = NNODES * NPROC


def missing_gpus(ctx: Context) -> int:
    """06.1: 4 nodes x 8 GPUs, one rank per GPU, torchrun's layout (node n holds RANK n * 8 .. n * 8 + 7, LOCAL_RANK
    0..7): the processes whose set_device(RANK) names a GPU index their node does not have."""
    nnodes, gpus = 4, 8
    return sum(1 for node in range(nnodes) for local_rank in range(gpus) if node * gpus + local_rank >= gpus)


@dataclass(frozen=True)
class OnTwoNodes(ObservedCheck):
    """06.2, 06.3: an ``ObservedCheck`` whose learner's launch runs on ``NNODES`` simulated nodes x ``NPROC`` ranks (two
    torchrun agents on this machine, section 1), where a mix-up of local and global ranks shows. The solution, the
    oracle, runs on one node of ``WORLD`` ranks (``reference_run``): what it computes does not depend on how its ranks
    sit on nodes (it uses the global rank and world size, or ``LOCAL_RANK`` on a node that is then the only one), and
    one agent costs less than two.

    Attributes:
        folder_flag: a flag naming the folder the script writes into (``"--disks"``): the learner's launch gets a fresh
            one, removed after it (a folder an earlier run filled would hide what this one did not write).
    """

    folder_flag: str | None = None

    def __call__(self, ctx: Context) -> list[Difference]:
        variant = self.variants.pick()
        folder = Path(tempfile.mkdtemp(prefix="disks-", dir=ctx.script.parent)) if self.folder_flag else None
        try:
            mine = ctx.launch([*variant.args, *((self.folder_flag, folder) if folder else ())], nnodes=NNODES,
                              nproc_per_node=NPROC, observe=True)
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        try:
            run = read_observed(mine.run_dir, ranks=WORLD)
        except MetricsError as e:
            return [Difference(Message("the observer's records of your run"), Message("readable"), str(e)[:200], None)]
        reference = self.reference_run(ctx, variant, variant.args) if self.reference else None
        out = []
        for prop in self.properties:
            found = prop.check(run, reference, variant)
            out += found
            if found and isinstance(prop, Distributed):
                break
        return out


# 06.2: across 2 nodes x 2 ranks, each rank trains one DDP step on its share of the data set. No two ranks computed the
# same loss (two equal losses: two ranks read the same samples), and the gradient all ranks stepped with equals the
# solution's on the same seed and data set size: the mean over every sample, each counted once, whatever the split.
# The sizes are not the lesson's 32, so shares written in from a run of the notebook's script miss samples.
# Rounding: each gradient entry sums at most 64 per-sample products (the largest --samples) in another grouping than
# the solution's, then 4 ranks' shares and a division. Their signs cancel, so the sum of their magnitudes is up to
# about 8 x the largest entry (sqrt(64) for random signs): 64 x 8 + 4 + 2 terms, 520 with room (6e-5 of the entry); a
# sample missed or read twice moves the gradient by about 1/64 of itself, 250 times that.
SHARDS_COVER_THE_DATA_ONCE = OnTwoNodes(
    properties=(Distributed("DDP"),
                DistinctLosses(note=N_(
                    "ranks {ranks} computed the same loss, bit for bit: they trained on the same samples. Every sample "
                    "they share was trained on by each of them, and the job did the same work on several ranks")),
                SameTensors("grad", terms=520, note=N_(
                    "the gradient is {ratio:.3g} times the solution's on the same data set: the ranks' shares do not "
                    "cover every sample exactly once"))),
    variants=Variants({"--samples": (40, 48, 56, 64)}, world_sizes=(WORLD,)))

# 06.3: each node's data set is prepared on that node's own disk, every rank of both nodes reads it and trains one DDP
# step on its shard: the job ends on both nodes, and the gradient all ranks stepped with equals the solution's on the
# same seed and size (every rank read the data set as prepared). Who wrote a node's file is not something the observer
# sees (it records torch, not the file system); a node's ranks that find no file fail, and the doctor says so.
# Rounding: at most 32 rows (the largest --rows) summed per entry, as in 06.2: 32 x 8 + 4 + 2, 272 with room.
PREPARED_ON_EVERY_NODE = OnTwoNodes(
    properties=(Distributed("DDP"),
                SameTensors("grad", terms=272, note=N_(
                    "the gradient is {ratio:.3g} times the solution's on the same data set: some rank did not train on "
                    "the data set as it was prepared"))),
    variants=Variants({"--rows": (16, 24, 32)}, world_sizes=(WORLD,)), folder_flag="--disks")


register(Spec("06.1", N_("The GPUs set_device(RANK) asks for"), solution="06_1.py", expected=missing_gpus,
              wrong={8: N_("node 1's ranks only: nodes 2 and 3 ask for indices 16 to 31, which do not exist either"),
                     32: N_("node 0's ranks ask for GPUs 0 to 7 (RANK = LOCAL_RANK there): those exist"),
                     0: N_("global ranks are unique, so no two ranks share a GPU; but RANK 8 to 31 name GPU indices a "
                           "node with 8 GPUs does not have")},
              hints=(N_("Section 2's table: on node n, RANK runs from n x 8 to n x 8 + 7, while the node's GPUs are "
                        "numbered 0 to 7. Which ranks name an index that exists?"),
                     N_("Only node 0's ranks (RANK 0 to 7) name existing GPUs. Count the ranks of the other three "
                        "nodes."))))
register(Spec("06.2", N_("A data set split over both nodes"), solution="06_2_train.py",
              verify=SHARDS_COVER_THE_DATA_ONCE,
              hints=(N_("Run the check and look at which ranks computed the same loss. On one node the script was "
                        "right; what changes on the second node?"),
                     N_("LOCAL_RANK and LOCAL_WORLD_SIZE number the ranks of one node. The sampler needs the global "
                        "ones: DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank()) "
                        "(its defaults)."))))
register(Spec("06.3", N_("Node-local preparation, once per node"), solution="06_3_train.py",
              verify=PREPARED_ON_EVERY_NODE,
              hints=(N_("Read the doctor's verdict: which ranks fail, on which node, and what file do they miss? "
                        "Who wrote the data on that node's disk?"),
                     N_("The node's own disk needs one writer per node: LOCAL_RANK 0 "
                        "(int(os.environ[\"LOCAL_RANK\"]) == 0), not the global rank 0. Keep the barrier: the node's "
                        "other ranks wait for it."))))
