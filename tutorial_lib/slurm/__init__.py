"""SLURM: a real two-node cluster on this machine (``local_cluster``) and the client commands a launcher uses to
submit, watch and cancel jobs on any SLURM cluster (``commands``). The batch script itself is
``tutorial_lib.cluster.slurm_script``."""

from .commands import (FINISHED_STATES, JobInfo, JobState, NeverStarts, cancel, client_env, expand_hostlist, job_info,
                       job_nodes, node_cpus, node_states, queue, run_slurm, submit, wait_for_state, wait_until_finished)
from .config import PARTITION
from .local_cluster import NODE_NAMES, STATE_DIR_ENV, LocalCluster, check_can_run, default_state_dir

__all__ = ["FINISHED_STATES", "JobInfo", "JobState", "LocalCluster", "NODE_NAMES", "NeverStarts", "PARTITION",
           "STATE_DIR_ENV", "cancel", "check_can_run", "client_env", "default_state_dir", "expand_hostlist", "job_info",
           "job_nodes", "node_cpus", "node_states", "queue", "run_slurm", "submit", "wait_for_state", "wait_until_finished"]
