"""tutorial_lib: launch real torchrun jobs from a notebook, watch them live, and read back what they measured.

The handful of names the notebooks use::

    import tutorial_lib as tl
    tl.setup_notebook(rank_env={})  # once, at the top: figures inline, the warm-start helper starting
    run_dir = tl.new_run_dir("ddp")
    script = tl.write_script("ddp_train", run_dir)
    result = tl.launch(tl.LaunchSpec(script, args=["--max-steps", 30]))
    tl.plot_run(result.metrics(), result.memory_samples())

Importing the package starts no process, registers nothing with IPython and changes no environment variable.

The package's folders say what their files may do, and ``tests/unit/test_architecture.py`` holds each rule:
``launcher/`` is the kernel's job control; ``torchrun/`` reads what torchrun prints and leaves behind; ``child/``
holds the programs run by path in other processes, and ``lessons/`` the scripts a learner copies (neither imports
the package); ``runs/`` lays out a run directory and reads a finished run into values (``rundir``, ``metrics``,
``printed_metrics``, ``run_logs``, ``profiling``, ``checkpoints``, ``pipeline``, ``observed``); ``probes/`` measures
this machine's torch in the kernel (``env``, ``precision``, ``attention``); ``notebook/`` checks and shows what a cell
needs (``parameters``, ``script_source``, ``plots``: data in, figure out); ``planning/`` predicts a training step's
memory before anything launches (``memory_model``, ``memory_plan``, ``memory_plan_tp``, and ``data/``, the stored
table); ``slurm/`` speaks SLURM (``batch``: the batch script and per-node commands, as text; ``commands``; a local
two-node cluster, its owner and watchdog); ``diagnosis/`` reads a failure into one value (``cause_ids``: ``CauseId``,
what notebooks and tests compare; ``causes``: the known failures; ``waiting``; ``doctor``; ``report``: ``Diagnosis``); ``i18n/`` holds the language the doctor's report and the
live view speak (``tl.set_language``) and the gettext catalogues that word them. At the top stands only ``errors``.
"""

from .diagnosis.cause_ids import CauseId
from .diagnosis.doctor import Diagnosis, diagnose
from .diagnosis.groups import diagnose_groups
from .exercises import Exercise, Verdict, exercise, exercises, progress
from .errors import (ConfigError, LaunchError, LaunchTimeout, MetricsError, RankFailure, SlurmError, SlurmUnavailable,
                     TutorialError)
from .i18n import language, set_language
from .launcher.devices import DevicePlan, collective_timeout_s, resolve_device
from .launcher.environment import set_rank_env
from .launcher.failure_drill import FailureDrill, HardFailure, run_failure_drill, run_hard_failure
from .launcher.replica_run import ReplicaRun, run_replica_groups
from .launcher.in_process import export_hf, run_in_process
from .launcher.replicas import start_lighthouse, start_replica_groups
from .launcher.slurm_replicas import start_slurm_replica_groups
from .launcher.live import enable_inline_figures
from .launcher.run import launch, run_script, setup_notebook
from .launcher.spawn import SpawnOutcome, spawn_with_timeout
from .launcher.spec import LaunchResult, LaunchSpec
from .notebook.parameters import check_parameters
from .notebook.plots import (plot_bandwidth, plot_compare, plot_index_assignment, plot_loss, plot_loss_scale,
                             plot_memory, plot_memory_prediction, plot_mesh, plot_pipeline_timeline,
                             plot_reshard_tradeoff, plot_resume, plot_run, plot_tensor_bytes, plot_timeline,
                             plot_tradeoff)
from .notebook.script_source import import_script, show_script
from .planning import hf_plan, memory_plan  # tl.memory_plan.table_args (notebook 11), tl.hf_plan (notebook 13)
from .planning.memory_model import StateBytes, block_units, bytes_per_parameter, predict_state_bytes
from .planning.memory_plan import (MemoryPlan, compare_plan, largest_fitting, matches_plan, memory_table,
                                   plan_memory, read_memory_snapshots, read_memory_table)
from .planning.memory_plan_tp import TP_LAYOUTS, compare_tp_plan, plan_tp_memory, read_tp_memory
from .planning.hf_plan import (HF_LAYOUTS, gpu_prediction_bytes, host_bytes, load_hf_config, plan_hf, read_hf_table,
                               recommend_layout)
from .probes.attention import sdpa_backends
from .probes.env import EnvironmentReport, environment_report
from .probes.precision import autocast_op_dtypes, autocast_supported, cpu_low_precision_flags, float_formats
from .runs.checkpoints import (checkpoint_costs, checkpoint_dir, checkpoint_files, diff_state_dicts, latest_checkpoint,
                               list_checkpoints, load_checkpoint_state, load_trained_hf, read_loaded_state)
from .runs.metrics import (last_steps, loss_curves, read_collectives, read_memory_notes, read_memory_samples,
                           read_metrics, read_rank_json, read_rank_tensors, summarize_runs)
from .runs.observed import ObservedRank, ObservedRun, read_observed
from .runs.pipeline import (gpipe_bubble, idle_fractions, in_flight, measured_idle, order_violations, pipeline_events,
                            replay_slots)
from .runs.replica_records import ReplicaRecords, read_replica_records, steps_table
from .runs.printed_metrics import DEFAULT_LOSS_PATTERN, read_printed_metrics
from .runs.profiling import (overlap_intervals, read_allreduce_launches, read_trace_intervals, step_breakdown,
                             trace_files)
from .runs.run_logs import (FatalError, agent_failures, collective_fingerprints, count_log_matches, fatal_errors,
                            lost_connection, rank_errors, read_output_log, workers_started)
from .runs.rundir import available_scripts, new_run_dir, read_command, script_path, write_script
from .slurm.batch import node_commands, slurm_script
from .slurm.commands import SlurmJob
from .slurm.target import SlurmSpec, SlurmTarget, connect_slurm

__all__ = [
    "CauseId", "ConfigError", "DevicePlan", "Diagnosis", "EnvironmentReport", "LaunchError", "LaunchResult", "LaunchSpec", "LaunchTimeout",
    "MetricsError", "RankFailure", "StateBytes", "TutorialError", "autocast_op_dtypes", "autocast_supported",
    "available_scripts", "block_units", "bytes_per_parameter", "check_parameters", "checkpoint_costs", "checkpoint_files", "collective_timeout_s",
    "cpu_low_precision_flags", "diagnose", "diff_state_dicts", "environment_report", "float_formats", "latest_checkpoint",
    "launch", "list_checkpoints", "load_checkpoint_state", "new_run_dir", "node_commands", "plot_bandwidth",
    "plot_compare", "plot_index_assignment", "plot_loss", "plot_loss_scale", "plot_memory", "plot_memory_prediction",
    "plot_resume", "plot_run", "plot_tensor_bytes", "plot_tradeoff", "predict_state_bytes", "read_collectives",
    "read_memory_notes", "read_memory_samples", "read_metrics", "read_rank_json", "resolve_device", "run_in_process", "export_hf", "load_trained_hf",
    "run_script", "set_rank_env", "show_script", "slurm_script", "summarize_runs", "write_script",
    "overlap_intervals", "plot_timeline", "read_allreduce_launches", "read_trace_intervals", "sdpa_backends",
    "step_breakdown", "plot_mesh", "plot_reshard_tradeoff",
]
__all__ += ["gpipe_bubble", "idle_fractions", "in_flight", "measured_idle", "order_violations", "pipeline_events",
            "plot_pipeline_timeline", "replay_slots"]  # pipeline: what a pipeline's stages did
__all__ += ["MemoryPlan", "compare_plan", "largest_fitting", "loss_curves", "matches_plan", "memory_table",
            "plan_memory", "read_memory_snapshots", "read_memory_table"]  # memory_plan: what fits, torch's tracker
__all__ += ["TP_LAYOUTS", "compare_tp_plan", "plan_tp_memory", "read_tp_memory"]  # memory_plan_tp: the same for TP
__all__ += ["HF_LAYOUTS", "gpu_prediction_bytes", "host_bytes", "load_hf_config", "plan_hf", "read_hf_table",
            "recommend_layout"]  # hf_plan: your Hugging Face model on your GPUs (train_hf.py's step, fake mode)
__all__ += ["import_script", "FatalError", "agent_failures", "collective_fingerprints", "count_log_matches", "fatal_errors",
            "lost_connection", "rank_errors"]  # run_logs: what a run's logs say
__all__ += ["enable_inline_figures", "setup_notebook"]  # the notebook's setup call, and its figures part alone
__all__ += ["DEFAULT_LOSS_PATTERN", "SpawnOutcome", "read_printed_metrics",
            "spawn_with_timeout"]  # scripts of your own: their printed loss lines; mp.spawn from a notebook
__all__ += ["checkpoint_dir", "last_steps", "read_command", "read_loaded_state", "read_output_log", "read_rank_tensors",
            "script_path", "trace_files", "workers_started"]  # a run directory's parts, by name (no run_dir / paths)
__all__ += ["SlurmError", "SlurmJob", "SlurmSpec", "SlurmTarget", "SlurmUnavailable",
            "connect_slurm"]  # launches on SLURM (LaunchSpec(slurm=SlurmSpec(...))) and the cluster to use
__all__ += ["language", "set_language"]  # the language of the doctor's report and the live view (en, zh)
__all__ += ["Exercise", "Verdict", "exercise", "exercises", "progress"]  # exercises: checked on real ranks
__all__ += ["ObservedRank", "ObservedRun", "read_observed"]  # observe=True: what each rank did, as torch saw it
__all__ += ["FailureDrill", "HardFailure", "ReplicaRecords", "diagnose_groups", "read_replica_records",
            "run_failure_drill", "run_hard_failure", "start_lighthouse", "start_replica_groups",
            "start_slurm_replica_groups", "steps_table"]  # torchft: replica groups killed, restarted, healed (notebook 15); on SLURM, one job each
__all__ += ["ReplicaRun", "run_replica_groups"]  # torchft: groups run to the end, DDP beside DiLoCo (notebook 15)
__version__ = "0.1.0"
