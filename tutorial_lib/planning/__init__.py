"""What a training step will need, per rank, before anything launches.

The rule: these modules predict memory in this process and launch nothing (``memory_model``: the analytic bytes of
parameters, gradients and optimizer state; ``memory_plan``: torch's own memory tracker run over ``train_lm.py``'s step
in fake mode, on a fake process group; ``memory_plan_tp``: the same for ``tensor_parallel.py``'s layouts;
``tracker_counting``: that fake process group, and how the tracker's counts stand for a CPU or a CUDA run; ``hf_plan``:
the same for ``train_hf.py``, a Hugging Face model built from its config.json; ``published``: figures other people
published (ZeRO's model states, torchtitan's reserved memory, Korthikanti et al.'s activations per layer) and the
planner's traced bytes beside them;
``layer_memory``: one transformer layer (``transformer_layers``) measured by torch's tracker in fake mode, tensor by
tensor). ``data/`` holds the stored tables that ``python -m tutorial_lib.planning.memory_plan`` and ``... .hf_plan
table`` write, and the shipped config.json of a few public models (``data/hf_configs/``). They import a lesson script
as a module (``script_source``) and read a run's measured peaks (``runs/``) to compare; never the launcher.
"""

# tl.planning: the planners, their layouts and stored tables (tl.planning.plan_memory(...), tl.planning.hf_plan)
from . import hf_plan, memory_plan
from .hf_plan import (HF_LAYOUTS, gpu_prediction_bytes, host_bytes, load_hf_config, plan_hf, read_hf_table,
                      recommend_layout)
from .memory_model import StateBytes, block_units, bytes_per_parameter, predict_state_bytes
from .memory_plan import (MemoryPlan, compare_plan, largest_fitting, matches_plan, memory_table, plan_memory,
                          read_memory_snapshots, read_memory_table)
from .memory_plan_tp import TP_LAYOUTS, compare_tp_plan, plan_tp_memory, read_tp_memory

__all__ = ["HF_LAYOUTS", "MemoryPlan", "StateBytes", "TP_LAYOUTS", "block_units", "bytes_per_parameter",
           "compare_plan", "compare_tp_plan", "gpu_prediction_bytes", "hf_plan", "host_bytes", "largest_fitting",
           "load_hf_config", "matches_plan", "memory_plan", "memory_table", "plan_hf", "plan_memory",
           "plan_tp_memory", "predict_state_bytes", "read_hf_table", "read_memory_snapshots", "read_memory_table",
           "read_tp_memory", "recommend_layout"]
