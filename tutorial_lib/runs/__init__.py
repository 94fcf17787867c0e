"""A run directory and what a finished run left in it, read into values.

The rule: these modules lay out a run directory (``rundir``: where it goes, its named files, ``run.json``) and read
what a run wrote there (``metrics``, ``printed_metrics``, ``run_logs``, ``profiling``, ``checkpoints``, ``pipeline``,
``replica_records``).
They start no process, display nothing and never import the launcher: the launcher, the doctor and the notebooks all
read a run through them. They import only ``errors`` and ``torchrun/`` (torchrun's own formats) from the package.
"""
