"""A run directory and what a finished run left in it, read into values.

The rule: these modules lay out a run directory (``rundir``: where it goes, its named files, ``run.json``) and read
what a run wrote there (``metrics``, ``printed_metrics``, ``run_logs``, ``profiling``, ``checkpoints``, ``pipeline``,
``replica_records``).
They start no process, display nothing and never import the launcher: the launcher, the doctor and the notebooks all
read a run through them. They import only ``errors`` and ``torchrun/`` (torchrun's own formats) from the package.
"""

# tl.runs: the readers a notebook calls on a finished run (tl.runs.read_metrics(run_dir), tl.runs.read_rank_json(...))
from .checkpoints import (checkpoint_costs, checkpoint_dir, checkpoint_files, diff_state_dicts, latest_checkpoint,
                          list_checkpoints, load_checkpoint_state, load_trained_hf, read_loaded_state)
from .metrics import (last_steps, loss_curves, read_collectives, read_memory_notes, read_memory_samples, read_metrics,
                      read_rank_json, read_rank_tensors, summarize_runs)
from .observed import ObservedRank, ObservedRun, read_observed
from .pipeline import (gpipe_bubble, idle_fractions, in_flight, measured_idle, order_violations, pipeline_events,
                       replay_slots)
from .printed_metrics import DEFAULT_LOSS_PATTERN, read_printed_metrics
from .profiling import overlap_intervals, read_allreduce_launches, read_trace_intervals, step_breakdown, trace_files
from .replica_records import ReplicaRecords, read_replica_records, steps_table
from .run_logs import (FatalError, agent_failures, collective_fingerprints, count_log_matches, fatal_errors,
                       lost_connection, rank_errors, read_output_log, workers_started)
from .rundir import available_scripts, new_run_dir, read_command, script_path, write_script

__all__ = ["DEFAULT_LOSS_PATTERN", "FatalError", "ObservedRank", "ObservedRun", "ReplicaRecords", "agent_failures",
           "available_scripts", "checkpoint_costs", "checkpoint_dir", "checkpoint_files", "collective_fingerprints",
           "count_log_matches", "diff_state_dicts", "fatal_errors", "gpipe_bubble", "idle_fractions", "in_flight",
           "last_steps", "latest_checkpoint", "list_checkpoints", "load_checkpoint_state", "load_trained_hf",
           "loss_curves", "lost_connection", "measured_idle", "new_run_dir", "order_violations", "overlap_intervals",
           "pipeline_events", "rank_errors", "read_allreduce_launches", "read_collectives", "read_command",
           "read_loaded_state", "read_memory_notes", "read_memory_samples", "read_metrics", "read_observed",
           "read_output_log", "read_printed_metrics", "read_rank_json", "read_rank_tensors", "read_replica_records",
           "read_trace_intervals", "replay_slots", "script_path", "step_breakdown", "steps_table", "summarize_runs",
           "trace_files", "workers_started", "write_script"]
