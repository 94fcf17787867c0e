"""SLURM, spoken here only: the batch script and per-node torchrun lines (``batch``: pure text, no I/O), the client
commands that submit, watch and cancel jobs on any SLURM cluster (``commands``), and a real two-node cluster on this
machine to run them against (``local_cluster``, ``config``, ``target``, ``owner``, and ``watchdog``, the program that
stops it once its owner is gone); ``SlurmJob`` (a launch's job as last seen) and what to change for a job that can
never start (``target.what_to_change``).

The rule: these modules may start SLURM's programs (sbatch, squeue, scancel, the local daemons) but never import the
launcher, which submits through them (its one SLURM job class, ``launcher/slurm_job.py``'s ``SubmittedJob``, stands
behind the launcher's job interface: a ``LaunchSpec`` holds a ``SlurmSpec``, so this folder is below the launcher); of
the package they import only ``errors``, ``i18n``, ``notebook/``'s value checks and ``probes/``'s free ports. ``watchdog.py`` is a program run
by path: it imports nothing of the package, not even its neighbours here (a test checks it)."""

# tl.slurm: what a notebook writes, submits and asks a cluster (tl.slurm.slurm_script(...), tl.slurm.connect_slurm())
from .batch import node_commands, slurm_script
from .commands import (FINISHED_STATES, JobInfo, JobState, NeverStarts, cancel, client_env, expand_hostlist, job_info,
                       job_nodes, node_cpus, node_states, queue, run_slurm, submit, wait_for_state, wait_until_finished)
from .config import PARTITION
from .local_cluster import NODE_NAMES, STATE_DIR_ENV, LocalCluster, check_can_run, default_state_dir
from .target import SlurmSpec, SlurmTarget, connect_slurm

__all__ = ["FINISHED_STATES", "JobInfo", "JobState", "LocalCluster", "NODE_NAMES", "NeverStarts", "PARTITION",
           "STATE_DIR_ENV", "cancel", "check_can_run", "client_env", "default_state_dir", "expand_hostlist", "job_info",
           "job_nodes", "node_cpus", "node_states", "queue", "run_slurm", "submit", "wait_for_state", "wait_until_finished"]
__all__ += ["SlurmSpec", "SlurmTarget", "connect_slurm", "node_commands", "slurm_script"]
