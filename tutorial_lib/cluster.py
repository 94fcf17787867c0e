"""What to run on a real cluster: per-node torchrun commands and a SLURM batch script. Pure text, no I/O.

Sources: torchrun's documentation (https://pytorch.org/docs/stable/elastic/run.html: "Usage",
static vs c10d rendezvous) and the SLURM multi-node example of pytorch/examples
(``distributed/ddp-tutorial-series/slurm/sbatch_run.sh``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from .errors import ConfigError
from .parameters import check_positive_int


def _check(nnodes: int, nproc_per_node: int, master_port: int) -> None:
    check_positive_int("nnodes", nnodes)
    check_positive_int("nproc_per_node", nproc_per_node)
    if isinstance(master_port, bool) or not isinstance(master_port, int) or not 1024 <= master_port <= 65535:
        raise ConfigError(f"master_port must be an integer in 1024..65535, got {master_port!r}")


def node_commands(script: str, args: Sequence[object] = (), *, nnodes: int, nproc_per_node: int,
                  master_addr: str = "NODE0_HOSTNAME", master_port: int = 29500) -> list[str]:
    """The torchrun command for each node (index = node rank), with the static rendezvous.

    Node 0 hosts the rendezvous store at ``master_addr:master_port``, so ``master_addr`` must be node 0's
    address, reachable from every node (not 127.0.0.1) and the port open between nodes. Every node
    runs ``nproc_per_node`` ranks; node ``n`` gets global ranks ``n * nproc_per_node`` onwards and
    local ranks ``0 .. nproc_per_node - 1``: set the GPU from ``LOCAL_RANK``, never from ``RANK``.

    Args:
        script: path of the training script on the nodes (the same path on every node).
        args: the script's arguments.
        nnodes: number of nodes (>= 1); nproc_per_node: ranks (GPUs) per node (>= 1).
        master_addr: node 0's hostname or IP; master_port: a free TCP port on it (1024..65535).

    Raises:
        ConfigError: a count < 1, a bad port, or an empty ``master_addr``.
    """
    _check(nnodes, nproc_per_node, master_port)
    if not master_addr:
        raise ConfigError("master_addr is empty: give node 0's hostname or IP address")
    return [shlex.join(["torchrun", "--nnodes", str(nnodes), "--node-rank", str(node),
                        "--nproc-per-node", str(nproc_per_node), "--master-addr", master_addr,
                        "--master-port", str(master_port), script, *map(str, args)])
            for node in range(nnodes)]


def slurm_script(script: str, args: Sequence[object] = (), *, nnodes: int, gpus_per_node: int,
                 job_name: str = "ddp", time_limit: str = "00:30:00", cpus_per_task: int = 8,
                 rendezvous_port: int = 29500, max_restarts: int = 0) -> str:
    """An ``sbatch`` script: one task per node, each running torchrun with the c10d rendezvous.

    ``srun`` starts the same command on every node; the first node of the allocation (from
    ``scontrol show hostnames``) hosts the rendezvous, the job id names it, and the rendezvous hands
    out node ranks, so no per-node arguments are needed. ``OMP_NUM_THREADS`` is set to the CPUs per
    rank. Submit with ``sbatch job.sh``.

    Args:
        script, args: the training script (a path valid on every node) and its arguments.
        nnodes: nodes to allocate; gpus_per_node: GPUs per node, one rank each.
        job_name, time_limit (``HH:MM:SS``), cpus_per_task: SLURM options.
        rendezvous_port: TCP port on the first node for the rendezvous (1024..65535).
        max_restarts: torchrun ``--max-restarts`` (the script must resume from its last checkpoint).

    Raises:
        ConfigError: a count < 1, a bad port or time limit.
    """
    _check(nnodes, gpus_per_node, rendezvous_port)
    check_positive_int("cpus_per_task", cpus_per_task)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
    parts = time_limit.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"time_limit must look like HH:MM:SS, got {time_limit!r}")
    threads = max(1, cpus_per_task // gpus_per_node)
    command = shlex.join(["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(gpus_per_node),
                          "--max-restarts", str(max_restarts), "--rdzv-backend", "c10d"])
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={nnodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --cpus-per-task={cpus_per_task}
#SBATCH --time={time_limit}
#SBATCH --output=%x-%j.out
set -euo pipefail

# The first node of the allocation hosts the rendezvous; every node reaches it on this port.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export OMP_NUM_THREADS={threads}
# export NCCL_DEBUG=INFO            # uncomment to see how NCCL connects the nodes
# export NCCL_SOCKET_IFNAME=ib0     # the network interface between nodes, if NCCL picks the wrong one

srun {command} \\
    --rdzv-id "$SLURM_JOB_ID" --rdzv-endpoint "$head_node:{rendezvous_port}" \\
    {shlex.join([script, *map(str, args)])}
"""
