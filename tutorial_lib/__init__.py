"""tutorial_lib: launch real torchrun jobs from a notebook, watch them live, and read back what they measured.

The handful of names the notebooks use::

    import tutorial_lib as tl
    run_dir = tl.new_run_dir("ddp")
    script = tl.write_script("ddp_train", run_dir)
    result = tl.launch(tl.LaunchSpec(script, args=["--max-steps", 30]))
    tl.plot_run(result.metrics(), result.memory_samples())
"""

from .cluster import node_commands, slurm_script
from .devices import DevicePlan, resolve_device
from .doctor import Diagnosis, diagnose
from .env import EnvironmentReport, environment_report
from .errors import ConfigError, LaunchError, LaunchTimeout, MetricsError, RankFailure, TutorialError
from .launcher import LaunchResult, LaunchSpec, launch, run_script
from .live import enable_inline_figures
from .metrics import read_collectives, read_memory_samples, read_metrics, read_rank_json, summarize_runs
from .plots import (plot_bandwidth, plot_compare, plot_index_assignment, plot_loss, plot_loss_scale, plot_memory,
                    plot_run, plot_tensor_bytes)
from .precision import autocast_op_dtypes, autocast_supported, cpu_low_precision_flags, float_formats
from .scripts import available_scripts, new_run_dir, show_script, write_script

__all__ = [
    "Diagnosis", "diagnose",
    "ConfigError", "DevicePlan", "autocast_op_dtypes", "autocast_supported", "cpu_low_precision_flags",
    "float_formats", "plot_loss_scale", "summarize_runs", "node_commands", "slurm_script", "EnvironmentReport", "LaunchError", "LaunchResult", "LaunchSpec",
    "LaunchTimeout", "MetricsError", "RankFailure", "TutorialError", "available_scripts",
    "environment_report", "launch", "new_run_dir", "plot_bandwidth", "plot_compare", "plot_index_assignment", "plot_loss",
    "plot_memory", "plot_run", "plot_tensor_bytes", "read_collectives", "read_memory_samples",
    "read_metrics", "read_rank_json", "resolve_device", "run_script", "show_script", "write_script",
]
__version__ = "0.1.0"

enable_inline_figures()
