"""What a training step will need, per rank, before anything launches.

The rule: these modules predict memory in this process and launch nothing (``memory_model``: the analytic bytes of
parameters, gradients and optimizer state; ``memory_plan``: torch's own memory tracker run over ``train_lm.py``'s step
in fake mode, on a fake process group; ``memory_plan_tp``: the same for ``tensor_parallel.py``'s layouts;
``tracker_counting``: that fake process group, and how the tracker's counts stand for a CPU or a CUDA run). ``data/``
holds the stored 24 GB table that ``python -m tutorial_lib.planning.memory_plan`` writes. They import a lesson script
as a module (``script_source``) and read a run's measured peaks (``runs/``) to compare; never the launcher.
"""
