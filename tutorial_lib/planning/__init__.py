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
