"""Notebook 06's exercises (multi-node): the GPUs the seeds' set_device(RANK) asks for, a data set sharded by the
local rank, node-local preparation done by the global rank 0. The script exercises run on 2 simulated nodes (two
torchrun agents on this machine, as the notebook's section 1) with 2 ranks each."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..i18n import N_, Message
from .core import Context, Difference, Spec, register

NNODES, NPROC = 2, 2  # simulated nodes, ranks per node
WORLD = NNODES * NPROC
SAMPLES = 32  # exercise 2's data set: sample indices 0..31


def missing_gpus(ctx: Context) -> int:
    """06.1: 4 nodes x 8 GPUs, one rank per GPU, torchrun's layout (node n holds RANK n * 8 .. n * 8 + 7, LOCAL_RANK
    0..7): the processes whose set_device(RANK) names a GPU index their node does not have."""
    nnodes, gpus = 4, 8
    return sum(1 for node in range(nnodes) for local_rank in range(gpus) if node * gpus + local_rank >= gpus)


def _two_nodes(ctx: Context, args: list) -> tuple[dict[int, dict], list[Difference]]:
    """The learner's script on NNODES simulated nodes x NPROC ranks: each rank's last record, and the ranks without."""
    records, differences = ctx.per_rank(ctx.launch(args, nnodes=NNODES, nproc_per_node=NPROC), WORLD)
    for rank, record in sorted(records.items()):
        if record.get("node") != rank // NPROC:
            differences.append(Difference(Message("node (GROUP_RANK) of this rank"), rank // NPROC, record.get("node"),
                                          rank))
    return records, differences


def shards_cover_the_data_once(ctx: Context) -> list[Difference]:
    """06.2: across 2 nodes x 2 ranks, every sample is seen by exactly one rank, each rank SAMPLES / WORLD of them."""
    records, differences = _two_nodes(ctx, [])
    seen: dict[int, list[int]] = {}
    for rank, record in sorted(records.items()):
        samples = list(record.get("samples", []))
        if len(samples) != SAMPLES // WORLD:
            differences.append(Difference(Message("samples on this rank"), SAMPLES // WORLD, len(samples), rank))
        for s in samples:
            seen.setdefault(s, []).append(rank)
    if records:
        twice = sorted(s for s, ranks in seen.items() if len(ranks) > 1)
        never = sorted(set(range(SAMPLES)) - set(seen))
        if twice:
            differences.append(Difference(Message("samples seen by more than one rank"), 0, len(twice), note=Message(
                "sample {sample} was seen by ranks {ranks}: the shards repeat on every node; a data set is split "
                "over the whole world (RANK, WORLD_SIZE), not over one node's ranks",
                {"sample": twice[0], "ranks": seen[twice[0]]})))
        if never:
            differences.append(Difference(Message("samples no rank saw"), 0, len(never)))
    return differences


def prepared_once_per_node(ctx: Context) -> list[Difference]:
    """06.3: each node's data set prepared on its own disk by exactly one rank (LOCAL_RANK 0), read by every rank of
    that node; the all-reduced sum of the shards equals the data set's sum."""
    folder = Path(tempfile.mkdtemp(prefix="disks-", dir=ctx.script.parent))
    try:
        records, differences = _two_nodes(ctx, [folder])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    total = float(sum(range(64)))  # the data set: torch.arange(64.0), 16 x 4
    for node in range(NNODES):
        ranks = [r for r in range(node * NPROC, (node + 1) * NPROC) if r in records]
        if not ranks:
            continue
        preparers = sorted(records[r].get("local_rank") for r in ranks if records[r].get("prepared"))
        if preparers != [0]:
            differences.append(Difference(
                Message("local ranks that prepared node {node}'s data", {"node": node}), [0], preparers,
                note=Message("one rank per node writes to the node's own disk: the first of the node (LOCAL_RANK 0); "
                             "the others wait at the barrier") if preparers else None))
    for rank, record in sorted(records.items()):
        if record.get("total") != total:
            differences.append(Difference(Message("sum of the whole data set (all_reduce)"), total,
                                          record.get("total"), rank))
    return differences


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
              verify=shards_cover_the_data_once,
              hints=(N_("Run the check and look at which ranks saw the same samples. On one node the script was "
                        "right; what changes on the second node?"),
                     N_("LOCAL_RANK and LOCAL_WORLD_SIZE number the ranks of one node. The sampler needs the global "
                        "ones: DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank()) "
                        "(its defaults)."))))
register(Spec("06.3", N_("Node-local preparation, once per node"), solution="06_3_train.py",
              verify=prepared_once_per_node,
              hints=(N_("Read the doctor's verdict: which ranks fail, on which node, and what file do they miss? "
                        "Who wrote the data on that node's disk?"),
                     N_("The node's own disk needs one writer per node: LOCAL_RANK 0 (int(os.environ[\"LOCAL_RANK\"]) == "
                        "0), not the global rank 0. Keep the barrier: the node's other ranks wait for it."))))
