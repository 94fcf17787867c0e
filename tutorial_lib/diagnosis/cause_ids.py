"""The doctor's causes as values: ``CauseId``, compared by code and worded only when shown (``causes.cause_message``)."""

from __future__ import annotations

from enum import Enum


class CauseId(str, Enum):
    """What the doctor found a run's failure to be: one value, compared by code and worded only when shown
    (``cause_message``). The known messages' causes (``CAUSES``) first, then what the doctor concludes without one."""

    TORCHFT_LIGHTHOUSE_UNREACHABLE = "torchft_lighthouse_unreachable"
    TORCHFT_QUORUM_TIMEOUT = "torchft_quorum_timeout"
    TORCHFT_RECOVERY_WITHOUT_NUMPY = "torchft_recovery_without_numpy"
    TORCHFT_RECOVERY_FAILED = "torchft_recovery_failed"  # a heal failed on the healing or the sending side
    PORT_IN_USE = "port_in_use"
    RENDEZVOUS_TIMEOUT = "rendezvous_timeout"
    OUT_OF_MEMORY = "out_of_memory"
    CHECKPOINT_MISMATCH = "checkpoint_mismatch"
    CHECKPOINT_FEWER_RANKS = "checkpoint_fewer_ranks"  # a per-rank entry (rng_rank2) the checkpoint lacks
    UNEVEN_MICROBATCHES = "uneven_microbatches"
    COLLECTIVE_MISMATCH = "collective_mismatch"
    ABORT_AT_EXIT = "abort_at_exit"
    COMPILE_BUCKET_SPLIT = "compile_bucket_split"
    COMPILE_NO_CXX = "compile_no_cxx"
    COMPILE_RECOMPILE_LIMIT = "compile_recompile_limit"
    COMPILE_GRAPH_BREAK = "compile_graph_break"
    COMPILE_DDP_GRAPH_BREAK = "compile_ddp_graph_break"
    UNUSED_PARAMETERS = "unused_parameters"
    NO_GPU = "no_gpu"
    INVALID_DEVICE_ORDINAL = "invalid_device_ordinal"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    COMPILING_RANK = "compiling_rank"  # field: ranks (a collective timed out while they compiled)
    # fields: rank (it issued a collective the others did not: `if rank == 0: dist.all_reduce(x)`), op, where
    RANK_BRANCH_COLLECTIVE = "rank_branch_collective"
    NCCL_ERROR = "nccl_error"
    PYTHON_EXCEPTION = "python_exception"  # field: name (the exception's class)
    KILLED_BY_SIGNAL = "killed_by_signal"  # field: signal
    KILLED_ON_PURPOSE = "killed_on_purpose"  # field: by (a drill killed it: launcher/replicas.py's KILL_RECORD)
    EXITED_WITHOUT_TRACEBACK = "exited_without_traceback"  # field: code
    DIED_WITHOUT_ERROR = "died_without_error"
    HANG_WALL_CLOCK = "hang_wall_clock"
    HANG_NO_PROGRESS = "hang_no_progress"
    RANK_FINISHED = "rank_finished"  # a rank returned while the others waited for it
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"
    SYNTAX_ERROR = "syntax_error"
    SBATCH_REFUSED = "sbatch_refused"
    SLURM_NEVER_STARTS = "slurm_never_starts"  # field: reason (squeue's pending reason)
    UNKNOWN = "unknown"
    NONE = "none"  # the run finished
