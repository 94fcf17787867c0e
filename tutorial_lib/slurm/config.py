"""The local SLURM cluster's ``slurm.conf``, rendered from its ports and folders; pure (writes nothing)."""

from __future__ import annotations

from pathlib import Path

PARTITION = "debug"


def render_slurm_conf(state_dir: Path, *, controller_port: int, node_ports: dict[str, int], cpus_per_node: int,
                      munge_socket: Path) -> str:
    """The ``slurm.conf`` of the local cluster; pure.

    Args:
        state_dir: the folder for slurmctld's state, the nodes' spool folders and the daemons' PID files.
        controller_port: slurmctld's TCP port on 127.0.0.1.
        node_ports: ``{node name: slurmd port}``: every node is 127.0.0.1, so each slurmd needs its own port.
        cpus_per_node: CPUs each node offers (the machine's; the nodes share them).
        munge_socket: the socket of this cluster's munged.
    """
    nodes = "\n".join(f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs={cpus_per_node} State=UNKNOWN"
                      for name, port in node_ports.items())
    return f"""# The local SLURM cluster of tutorial_lib (python -m tutorial_lib slurm up): generated, rewritten by every `up`.
ClusterName=tutorial
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={controller_port}
SlurmdPort={next(iter(node_ports.values()))}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
# No cgroups: processes are tracked through their parents, tasks are not bound to CPUs.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# No accounting: sacct does not work here, squeue and scontrol do.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation={state_dir / "ctld"}
SlurmdSpoolDir={state_dir / "spool"}/%n
SlurmctldPidFile={state_dir / "run"}/slurmctld.pid
SlurmdPidFile={state_dir / "run"}/slurmd-%n.pid
ReturnToService=2
InactiveLimit=0
# scancel: SIGTERM, then SIGKILL after KillWait seconds (default 30).
KillWait=5
{nodes}
PartitionName={PARTITION} Nodes={",".join(node_ports)} Default=YES MaxTime=INFINITE State=UP
"""
