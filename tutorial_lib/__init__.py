"""tutorial_lib: launch real torchrun jobs from a notebook, watch them live, and read back what they measured.

The handful of names the notebooks use::

    import tutorial_lib as tl
    run_dir = tl.new_run_dir("ddp")
    script = tl.write_script("ddp_train", run_dir)
    result = tl.launch(tl.LaunchSpec(script, args=["--max-steps", 30]))
    tl.plot_run(result.metrics(), result.memory_samples())
"""

from . import warm as _warm

_warm.prestart_in_kernel()  # first: in a Jupyter kernel the warm-start helper imports torch while the rest loads

from .attention import sdpa_backends
from .checkpoints import (checkpoint_costs, checkpoint_files, diff_state_dicts, latest_checkpoint, list_checkpoints,
                          load_checkpoint_state)
from .cluster import node_commands, slurm_script
from .devices import DevicePlan, collective_timeout_s, resolve_device, set_rank_env
from .doctor import Diagnosis, diagnose
from .env import EnvironmentReport, environment_report
from .errors import ConfigError, LaunchError, LaunchTimeout, MetricsError, RankFailure, TutorialError
from .launcher import LaunchResult, LaunchSpec, launch, run_in_process, run_script
from .live import enable_inline_figures
from .parameters import check_parameters
from .memory_model import StateBytes, block_units, bytes_per_parameter, predict_state_bytes
from .memory_plan import (MemoryPlan, compare_plan, largest_fitting, memory_table, plan_memory, read_memory_snapshots,
                          read_memory_table)
from .metrics import (loss_curves, read_collectives, read_memory_notes, read_memory_samples, read_metrics,
                      read_rank_json, summarize_runs)
from .plots import (plot_bandwidth, plot_compare, plot_index_assignment, plot_loss, plot_loss_scale, plot_memory,
                    plot_memory_prediction, plot_resume, plot_run, plot_tensor_bytes, plot_timeline, plot_tradeoff)
from .precision import autocast_op_dtypes, autocast_supported, cpu_low_precision_flags, float_formats
from .profiling import overlap_intervals, read_trace_intervals, step_breakdown
from .scripts import available_scripts, import_script, new_run_dir, show_script, write_script
from .torchrun_logs import (FatalError, agent_failures, collective_fingerprints, count_log_matches, fatal_errors,
                            lost_connection, rank_errors)

__all__ = [
    "ConfigError", "DevicePlan", "Diagnosis", "EnvironmentReport", "LaunchError", "LaunchResult", "LaunchSpec", "LaunchTimeout",
    "MetricsError", "RankFailure", "StateBytes", "TutorialError", "autocast_op_dtypes", "autocast_supported",
    "available_scripts", "block_units", "bytes_per_parameter", "check_parameters", "checkpoint_costs", "checkpoint_files", "collective_timeout_s",
    "cpu_low_precision_flags", "diagnose", "diff_state_dicts", "environment_report", "float_formats", "latest_checkpoint",
    "launch", "list_checkpoints", "load_checkpoint_state", "new_run_dir", "node_commands", "plot_bandwidth",
    "plot_compare", "plot_index_assignment", "plot_loss", "plot_loss_scale", "plot_memory", "plot_memory_prediction",
    "plot_resume", "plot_run", "plot_tensor_bytes", "plot_tradeoff", "predict_state_bytes", "read_collectives",
    "read_memory_notes", "read_memory_samples", "read_metrics", "read_rank_json", "resolve_device", "run_in_process",
    "run_script", "set_rank_env", "show_script", "slurm_script", "summarize_runs", "write_script",
    "overlap_intervals", "plot_timeline", "read_trace_intervals", "sdpa_backends", "step_breakdown",
]
__all__ += ["MemoryPlan", "compare_plan", "largest_fitting", "loss_curves", "memory_table", "plan_memory",
            "read_memory_snapshots", "read_memory_table"]  # memory_plan: what fits, from torch's tracker in fake mode
__all__ += ["import_script", "FatalError", "agent_failures", "collective_fingerprints", "count_log_matches", "fatal_errors",
            "lost_connection", "rank_errors"]  # torchrun_logs: what a run's logs say
__version__ = "0.1.0"

enable_inline_figures()
