"""What to run on a real cluster: per-node torchrun commands and a SLURM batch script. Pure text, no I/O.

The batch script runs for real on the local SLURM cluster (``python -m tutorial_lib slurm up``,
``tests/test_slurm.py``); ``tutorial_lib.slurm`` submits and watches it.

Sources: torchrun's documentation (https://pytorch.org/docs/stable/elastic/run.html: "Usage",
static vs c10d rendezvous), the SLURM multi-node example of pytorch/examples
(``distributed/ddp-tutorial-series/slurm/sbatch_run.sh``) and the sbatch(1) and srun(1) man pages
(``--kill-on-bad-exit``, ``--output`` filename patterns: ``%x`` job name, ``%j`` job id, ``%n`` node index).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
from collections.abc import Sequence

from ..errors import ConfigError
from ..notebook.parameters import check_positive_int


def _check(nnodes: int, nproc_per_node: int, port: int, port_name: str = "master_port") -> None:
    check_positive_int("nnodes", nnodes)
    check_positive_int("nproc_per_node", nproc_per_node)
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise ConfigError(f"{port_name} must be an integer in 1024..65535, got {port!r}")


def this_torchrun() -> str:
    """This interpreter's torchrun, ``<sys.executable> -m torch.distributed.run``: what ``slurm_script`` and a launch
    on SLURM run on the nodes unless told otherwise. It needs no activated environment (``torchrun`` by name is found
    on ``PATH`` only where the venv's ``bin/`` is on it: a job from a kernel or a script run as ``.venv/bin/python``
    failed with ``torchrun: not found``, exit 127), only this Python at the same path on every node."""
    return shlex.join([sys.executable, "-m", "torch.distributed.run"])


def _launcher(torchrun: str | None) -> list[str]:
    """The torchrun command as argv (``"python -m torch.distributed.run"`` -> 3 words; ``None``: ``this_torchrun``)."""
    if torchrun is None:
        torchrun = this_torchrun()
    launcher = shlex.split(torchrun) if isinstance(torchrun, str) else []
    if not launcher:
        raise ConfigError(f"torchrun must be the torchrun command on the nodes, e.g. 'torchrun' or "
                          f"'python -m torch.distributed.run', or None (this interpreter's), got {torchrun!r}")
    return launcher


def node_commands(script: str, args: Sequence[object] = (), *, nnodes: int, nproc_per_node: int,
                  master_addr: str = "NODE0_HOSTNAME", master_port: int = 29500,
                  torchrun: str = "torchrun") -> list[str]:
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
        torchrun: the torchrun command on the nodes, as in ``slurm_script``.

    Raises:
        ConfigError: a count < 1, a bad port, an empty ``master_addr`` or ``torchrun``.
    """
    _check(nnodes, nproc_per_node, master_port)
    if not master_addr:
        raise ConfigError("master_addr is empty: give node 0's hostname or IP address")
    launcher = _launcher(torchrun)
    return [shlex.join([*launcher, "--nnodes", str(nnodes), "--node-rank", str(node),
                        "--nproc-per-node", str(nproc_per_node), "--master-addr", master_addr,
                        "--master-port", str(master_port), script, *map(str, args)])
            for node in range(nnodes)]


def slurm_script(script: str, args: Sequence[object] = (), *, nnodes: int, nproc_per_node: int | None = None,
                 gpus_per_node: int = 0, partition: str | None = None, account: str | None = None,
                 time_limit: str = "00:30:00", cpus_per_task: int | None = None, job_name: str = "ddp",
                 run_dir: str | os.PathLike | None = None, rendezvous_port: int | None = 29500, max_restarts: int = 0,
                 socket_ifname: str | None = None, torchrun: str | None = None,
                 rendezvous_timeout_s: float | None = None, output_dir: str | None = None) -> str:
    """An ``sbatch`` script: one task per node, each running torchrun with the c10d rendezvous on the first node.

    ``srun`` starts the same torchrun command on every node; the first node of the allocation (from
    ``scontrol show hostnames``, at its ``NodeAddr``) hosts the rendezvous, the job id names it, and the
    rendezvous hands out node ranks (in its own order: torchrun's node rank, ``GROUP_RANK``, need not be SLURM's
    index of the node), so no per-node arguments are needed. ``srun --kill-on-bad-exit=1`` ends every
    node's torchrun as soon as one exits with an error (without it, a failed node left the job running 34 s instead
    of 6 on the local cluster, and a crash at exit on one node left it running for more than a minute). Each node's
    ranks write their stdout and stderr to their own files under ``logs/node<N>/`` (N: SLURM's index of the node in
    the job, ``$SLURM_NODEID``; torchrun's ``--log-dir`` and ``--redirects 3``:
    ``logs/node<N>/<job id>_*/attempt_<A>/<local rank>/stdout.log`` and ``stderr.log``, beside their error files),
    written at once (``PYTHONUNBUFFERED``: ``tail -f`` shows them live), and the node's torchrun writes its own lines
    (its warnings, its failure summary) to ``<job_name>-<job id>-node<N>.out``; the batch script's own output goes to
    ``<job_name>-<job id>.out``. (With ``--tee 3`` instead torchrun would also copy every rank's lines into its own
    output behind a ``[<role><local rank>]:`` label, which a rank can print as well: ``tutorial_lib``'s launcher reads
    each rank's lines from its own files, and torchrun's output for torchrun's lines only.) Each node's torchrun
    ignores SIGUSR1 (it would die of it), so
    ``scancel --signal=USR1 JOBID`` reaches only the ranks: one that registered ``faulthandler`` for it prints its
    Python stack (``tutorial_lib``'s rank runner does; see ``tutorial_lib.launcher.slurm_job``). GPUs are requested
    only when ``gpus_per_node > 0`` (a ``--gpus-per-node`` line on a cluster without GPUs is refused: "Invalid
    generic resource (gres) specification"). The training script picks its backend: nccl on GPUs, gloo on CPU.
    Submit with ``sbatch job.sh``, from the run directory unless ``run_dir`` is given.

    Args:
        script, args: the training script (a path valid on every node, e.g. on the shared filesystem) and its
            arguments.
        nnodes: nodes to allocate (>= 1).
        nproc_per_node: ranks per node; default ``gpus_per_node`` (one rank per GPU); required for a CPU job.
        gpus_per_node: GPUs per node (0: a CPU job, no GPU requested).
        partition, account: SLURM's ``--partition`` and ``--account`` (``None``: the cluster's defaults; ask the
            cluster's documentation or ``sinfo``/``sacctmgr show assoc user=$USER``).
        time_limit: ``--time``, ``HH:MM:SS`` or ``D-HH:MM:SS``.
        cpus_per_task: CPUs per node's task (shared by its ranks; ``OMP_NUM_THREADS`` is this divided by
            ``nproc_per_node``); ``None``: the cluster's default (often 1 CPU) and ``OMP_NUM_THREADS=1``.
        job_name: ``--job-name``, also the prefix of the output files.
        run_dir: the job's working folder (``--chdir``), on the filesystem every node shares: the outputs,
            ``logs/`` and the script's ``metrics/`` go there. ``None``: the folder sbatch is run from.
        rendezvous_port: TCP port on the first node for the rendezvous (1024..65535); ``None``: derived from the
            job id (29500 + id % 2000), so jobs sharing a node do not collide.
        max_restarts: torchrun ``--max-restarts`` (the script must resume from its last checkpoint).
        socket_ifname: the network interface between the nodes, exported as ``GLOO_SOCKET_IFNAME`` (and
            ``NCCL_SOCKET_IFNAME`` on GPUs) when the libraries pick the wrong one; ``"lo"`` for the local cluster,
            whose nodes are all 127.0.0.1. ``None``: the libraries choose.
        torchrun: the torchrun command on the nodes (``"torchrun"``: the one on their ``PATH``, or a path);
            ``None``: this interpreter's (``this_torchrun()``: no activated environment needed).
        rendezvous_timeout_s: how long each node's torchrun waits for the others at the rendezvous
            (``--rdzv-conf join_timeout=``, seconds > 0); ``None``: torchrun's default (600 s).
        output_dir: the folder of the job's output files and ``logs/``, relative to ``run_dir`` (or absolute; SLURM
            does not create it); ``None``: ``run_dir``. Jobs sharing a ``run_dir`` (torchft's replica groups, one job
            per group: ``group<G>/attempt<A>``) keep their files apart this way.

    Raises:
        ConfigError: a count < 1, GPUs but not one rank per GPU, a bad port, time limit, timeout, name or folder.
    """
    nproc_per_node = _check_job(nnodes=nnodes, nproc_per_node=nproc_per_node, gpus_per_node=gpus_per_node,
                                cpus_per_task=cpus_per_task, max_restarts=max_restarts, time_limit=time_limit,
                                rendezvous_port=rendezvous_port, rendezvous_timeout_s=rendezvous_timeout_s,
                                names=dict(job_name=job_name, partition=partition, account=account,
                                           socket_ifname=socket_ifname, run_dir=run_dir), output_dir=output_dir)
    out = f"{output_dir.rstrip('/')}/" if output_dir else ""
    options = [f"--job-name={job_name}", f"--nodes={nnodes}", "--ntasks-per-node=1",
               *_optional(gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task, partition=partition,
                          account=account), f"--time={time_limit}", *_optional(chdir=run_dir),
               f"--output={out}%x-%j.out"]
    # Slurm 22.05's srun no longer inherits the job's --cpus-per-task: repeat it.
    srun = ["srun", "--kill-on-bad-exit=1", *_optional(cpus_per_task=cpus_per_task), f"--output={out}%x-%j-node%n.out"]
    # SLURM_NODEID differs per node: the node's own shell reads it (single quotes); `exec` makes torchrun the task.
    node_task = f'trap "" USR1; exec {shlex.join(_launcher(torchrun))} --log-dir "{out}logs/node$SLURM_NODEID" "$@"'
    rdzv_conf = ([] if rendezvous_timeout_s is None else ["--rdzv-conf", f"join_timeout={rendezvous_timeout_s:g}"])
    torchrun_argv = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node), "--max-restarts",
                     str(max_restarts), "--rdzv-backend", "c10d", *rdzv_conf]
    return _render(options, srun, node_task, torchrun_argv, [str(script), *map(str, args)], rendezvous_port,
                   omp_threads=max(1, (cpus_per_task or 1) // nproc_per_node),
                   network=_network_lines(gpus_per_node, socket_ifname))


def _render(options: list[str], srun: list[str], node_task: str, torchrun_argv: list[str], train: list[str],
            rendezvous_port: int | None, *, omp_threads: int, network: str) -> str:
    """The text of ``slurm_script``'s batch script."""
    port = "$rdzv_port" if rendezvous_port is None else str(rendezvous_port)
    port_line = "rdzv_port=$((29500 + SLURM_JOB_ID % 2000))  # one port per job\n" if rendezvous_port is None else ""
    sbatch_lines = "".join(f"#SBATCH {option}\n" for option in options)
    return f"""#!/bin/bash
{sbatch_lines}set -euo pipefail

# The first node of the allocation hosts the rendezvous; every node reaches it on this port.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# Its address as SLURM knows it (NodeAddr): the hostname on most clusters, 127.0.0.1 on a one-machine cluster.
head_addr=$(scontrol show node "$head_node" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
head_node=${{head_addr:-$head_node}}
{port_line}export OMP_NUM_THREADS={omp_threads}
# Every line a rank prints reaches its log file at once (tail -f logs/node0/*/attempt_0/0/stdout.log shows it live).
export PYTHONUNBUFFERED=1
{network}
# One task per node, each a torchrun that starts this node's ranks, their logs in logs/node<N> (N: $SLURM_NODEID,
# SLURM's index of the node; torchrun's node rank may differ). torchrun ignores SIGUSR1 (trap), so
# `scancel --signal=USR1 $SLURM_JOB_ID` reaches only the ranks (faulthandler: their Python stacks). If one node's
# torchrun fails, srun stops the others (--kill-on-bad-exit=1) and the job ends FAILED. Each rank's output: its own
# stdout.log and stderr.log under logs/node<N> (--redirects 3); the node's torchrun's own lines: %x-%j-node<N>.out.
{shlex.join(srun)} \\
    bash -c {shlex.quote(node_task)} torchrun \\
    {shlex.join(torchrun_argv)} \\
    --rdzv-id "$SLURM_JOB_ID" --rdzv-endpoint "$head_node:{port}" --redirects 3 \\
    {shlex.join(train)}
"""


def _optional(**options: object) -> list[str]:
    """``--name=value`` for each option that is set (not ``None``, 0 or ""): GPUs only where the job uses them."""
    return [f"--{name.replace('_', '-')}={value}" for name, value in options.items() if value]


def _check_job(*, nnodes: int, nproc_per_node: int | None, gpus_per_node: int, cpus_per_task: int | None,
               max_restarts: int, time_limit: str, rendezvous_port: int | None, rendezvous_timeout_s: float | None,
               names: dict[str, object], output_dir: str | None = None) -> int:
    """``slurm_script``'s checks; returns ``nproc_per_node`` (``gpus_per_node`` when not given)."""
    if output_dir is not None and not (isinstance(output_dir, str) and re.fullmatch(r"[A-Za-z0-9._/+-]+", output_dir)):
        raise ConfigError(f"output_dir must be a folder path of letters, digits, '.', '_', '-', '+' and '/' (SLURM "
                          f"reads '%' in it as a pattern, the batch script quotes it), got {output_dir!r}")
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 0:
        raise ConfigError(f"gpus_per_node must be an integer >= 0 (0: a CPU job), got {gpus_per_node!r}")
    if nproc_per_node is None:
        if not gpus_per_node:
            raise ConfigError("nproc_per_node is required for a CPU job (gpus_per_node=0): how many ranks per node?")
        nproc_per_node = gpus_per_node
    _check(nnodes, nproc_per_node, 29500 if rendezvous_port is None else rendezvous_port, "rendezvous_port")
    if gpus_per_node and nproc_per_node != gpus_per_node:
        raise ConfigError(f"nproc_per_node={nproc_per_node} with gpus_per_node={gpus_per_node}: run one rank per "
                          "GPU (each rank takes cuda:LOCAL_RANK), so give them the same value")
    if cpus_per_task is not None:
        check_positive_int("cpus_per_task", cpus_per_task)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
    if rendezvous_timeout_s is not None and (isinstance(rendezvous_timeout_s, bool) or not isinstance(
            rendezvous_timeout_s, (int, float)) or not rendezvous_timeout_s > 0):
        raise ConfigError(f"rendezvous_timeout_s must be a number of seconds > 0 or None, got {rendezvous_timeout_s!r}")
    if not isinstance(time_limit, str) or not re.fullmatch(r"(\d+-)?\d+:\d\d:\d\d", time_limit):
        raise ConfigError(f"time_limit must look like HH:MM:SS (or D-HH:MM:SS), got {time_limit!r}")
    for name, value in names.items():
        if value is not None and (not str(value) or re.search(r"\s", str(value))):
            raise ConfigError(f"{name} must be a non-empty name without spaces (it goes on an #SBATCH line), "
                              f"got {str(value)!r}")
    return nproc_per_node


def _network_lines(gpus_per_node: int, socket_ifname: str | None) -> str:
    """The backend note and the network interface variables of the batch script."""
    if gpus_per_node:
        return "# Ranks talk over nccl (GPUs).\n" + (
            f"export NCCL_SOCKET_IFNAME={socket_ifname} GLOO_SOCKET_IFNAME={socket_ifname}\n" if socket_ifname else
            "# export NCCL_SOCKET_IFNAME=ib0   # the network interface between nodes, if NCCL picks the wrong one\n"
        ) + "# export NCCL_DEBUG=INFO          # uncomment to see how NCCL connects the nodes\n"
    return "# Ranks talk over gloo (CPU).\n" + (
        f"export GLOO_SOCKET_IFNAME={socket_ifname}\n" if socket_ifname else
        "# export GLOO_SOCKET_IFNAME=eth0  # the network interface between nodes, if gloo picks the wrong one\n")


def time_limit(timeout_s: float) -> str:
    """SLURM's ``--time`` for a launch limited to ``timeout_s``: 5 minutes more, whole minutes (``D-HH:MM:SS``)."""
    minutes = math.ceil((timeout_s + 300) / 60)
    days, minutes = divmod(minutes, 24 * 60)
    return (f"{days}-" if days else "") + f"{minutes // 60:02d}:{minutes % 60:02d}:00"
