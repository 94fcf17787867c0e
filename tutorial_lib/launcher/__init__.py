"""The kernel's job control: launch a training script under torchrun, watch it, stop it, say how it ended.

A launch is a short sequence of named steps, one module each: ``spec`` (``LaunchSpec``, checked before anything starts),
``plan`` (``LaunchPlan``: every command and environment, pure), ``job`` (the start step and the watch), ``outcome`` (the
result, or the error to raise, and run.json), tied together by ``run`` (``launch``, ``run_script``, ``setup_notebook``,
and ``run_job``, the one loop of every launch, through the job interface of ``interface``: the local ``job.RunningJob``
and the SLURM ``slurm_job.SubmittedJob`` both implement it). Around them: ``output`` and ``live`` (what the cell shows),
``processes`` and ``sampler`` (the job's processes and their memory), ``devices`` and ``environment`` (what the ranks
get), ``warm`` (the kernel's side of warm starts) and ``in_process`` (a script run in the kernel itself); for torchft,
``replicas`` (a lighthouse and replica groups), ``failure_drill`` (a group killed and restarted) and ``replica_run``
(groups run to the end). It reads torchrun's formats through ``tutorial_lib.torchrun`` and starts the programs in
``tutorial_lib.child`` by their path.
"""
