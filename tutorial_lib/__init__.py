"""tutorial_lib: launch real torchrun jobs from a notebook, watch them live, and read back what they measured.

The face: the names a notebook's flow calls, and a few namespaces by meaning (everything else stays importable from
its module)::

    import tutorial_lib as tl
    tl.setup_notebook(rank_env={})  # once, at the top: figures inline, the warm-start helper starting
    run_dir = tl.new_run_dir("ddp")
    script = tl.write_script("ddp_train", run_dir)
    result = tl.launch(tl.LaunchSpec(script, args=["--max-steps", 30]))
    tl.plots.plot_run(result.metrics(), result.memory_samples())

- a notebook's flow: ``setup_notebook``, ``check_parameters``, ``new_run_dir``, ``write_script``, ``show_script``,
  ``import_script``, ``script_path``, ``launch``, ``run_script``, ``LaunchSpec``, ``LaunchResult``,
  ``resolve_device``, ``collective_timeout_s``;
- the other launchers: ``run_in_process``, ``export_hf``, ``spawn_with_timeout``, and torchft's ``run_failure_drill``,
  ``run_hard_failure``, ``run_replica_groups``, ``start_lighthouse``, ``start_slurm_replica_groups``;
- a failure: ``diagnose``, ``CauseId``, and the errors ``TutorialError``, ``ConfigError``, ``LaunchError``,
  ``LaunchTimeout``, ``SlurmError``;
- exercises: ``exercises``, ``exercise``, ``progress``; this machine: ``environment_report``; the language of the
  doctor's report and the live view: ``language``, ``set_language``;
- ``tl.runs``: a finished run's files read into values (``read_metrics``, ``read_rank_json``, ``loss_curves``,
  ``read_collectives``, ``read_output_log``, ``checkpoint_dir``, ``read_trace_intervals``, ``steps_table``, ...);
  ``tl.plots``: every ``plot_*`` (data in, figure out); ``tl.planning``: the memory planners, their layouts and
  stored tables (``plan_memory``, ``plan_tp_memory``, ``plan_hf``, ``read_memory_table``, ``predict_state_bytes``,
  ...); ``tl.probes``: this machine's torch asked (``autocast_op_dtypes``, ``sdpa_backends``, ...); ``tl.slurm``:
  SLURM (``slurm_script``, ``node_commands``, ``connect_slurm``, ``SlurmSpec``, ...).

``tests/unit/test_face.py`` holds this list, and that every ``tl.`` name a notebook or a docs page uses resolves.
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
what notebooks and tests compare; ``causes``: the known failures; ``waiting``; ``doctor``; ``report``: ``Diagnosis``);
``i18n/`` holds the language the doctor's report and the live view speak (``tl.set_language``) and the gettext
catalogues that word them. At the top stands only ``errors``.
"""

from . import runs, planning, probes, slurm
from .diagnosis.cause_ids import CauseId
from .diagnosis.doctor import diagnose
from .errors import ConfigError, LaunchError, LaunchTimeout, SlurmError, TutorialError
from .exercises import exercise, exercises, progress
from .i18n import language, set_language
from .launcher.devices import collective_timeout_s, resolve_device
from .launcher.failure_drill import run_failure_drill, run_hard_failure
from .launcher.in_process import export_hf, run_in_process
from .launcher.replica_run import run_replica_groups
from .launcher.replicas import start_lighthouse
from .launcher.run import launch, run_script, setup_notebook
from .launcher.slurm_replicas import start_slurm_replica_groups
from .launcher.spawn import spawn_with_timeout
from .launcher.spec import LaunchResult, LaunchSpec
from .notebook import plots
from .notebook.parameters import check_parameters
from .notebook.script_source import import_script, show_script
from .probes.env import environment_report
from .runs.rundir import new_run_dir, script_path, write_script

__all__ = [
    # a notebook's flow
    "setup_notebook", "check_parameters", "new_run_dir", "write_script", "show_script", "import_script", "script_path",
    "launch", "run_script", "LaunchSpec", "LaunchResult", "resolve_device", "collective_timeout_s",
    # the other launchers (torchft's among them)
    "run_in_process", "export_hf", "spawn_with_timeout", "run_failure_drill", "run_hard_failure", "run_replica_groups",
    "start_lighthouse", "start_slurm_replica_groups",
    # a failure: the doctor, its causes, the errors
    "diagnose", "CauseId", "TutorialError", "ConfigError", "LaunchError", "LaunchTimeout", "SlurmError",
    # exercises, this machine, the language
    "exercises", "exercise", "progress", "environment_report", "language", "set_language",
    # namespaces: a finished run's readers, figures, memory planners, this machine's torch, SLURM
    "runs", "plots", "planning", "probes", "slurm",
]
__version__ = "0.1.0"
