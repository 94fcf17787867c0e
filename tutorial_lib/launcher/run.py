"""Launch a training script with torchrun from the kernel, stream its output, watch it, and always clean up.

``launch(LaunchSpec(...))`` runs ``python -m torch.distributed.run`` (torchrun) as a subprocess in its own process
group, never forking the kernel and never through a shell, on a free loopback port. Every rank's output is streamed
into the cell prefixed by rank; memory is sampled; the live view shows progress and the loss/memory plot. On error,
timeout or KeyboardInterrupt (a kernel interrupt) the whole process tree is stopped and reaped.

A launch is four named steps: ``plan_launch`` (pure: every command and environment), ``Job.start`` (the port,
``command.txt``, the processes), ``Job.wait`` (pump the output, watch the limits), and the outcome
(``tutorial_lib.launcher.outcome``: the result, or the error to raise, its run.json and the view's last word). A launch
on SLURM takes the same steps: ``plan_slurm_launch``, then a ``SubmittedJob`` (sbatch, squeue, scancel) in place of
the local ``RunningJob``; ``run_job`` is the one loop both go through (the job interface: ``interface.Job``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError
from ..i18n import notebook_language, set_language
from ..notebook.script_source import check_script_args
from ..runs.rundir import (OUTPUT_LOG, RunRecord, RunStatus, available_scripts, closest_script, is_lesson_run_dir,
                           new_run_dir, removed_if_refused, shipped_script, write_script)
from . import warm
from .devices import DevicePlan
from .environment import build_env, set_rank_env
from .interface import Job, LimitReached
from .job import RunningJob
from .live import Outcome, enable_inline_figures, make_view, safe_draw
from .outcome import failure_error, stopped_outcome, timeout_error, with_diagnosis
from .output import ThrottledPrinter
from .plan import LaunchPlan, plan_launch
from .slurm_job import SlurmPlan, SubmittedJob, plan_slurm_launch
from .spec import LaunchResult, LaunchSpec, check_spec_fields, folder_given_as_script

# run_script's own arguments: given to it, never as LaunchSpec fields.
_RUN_SCRIPT_OWN = {"script": "the first argument", "args": "the second argument",
                   "run_dir": "run_script makes a fresh one: runs_dir= (its parent) and label= (its name)"}


def launch(spec: LaunchSpec) -> LaunchResult:
    """Run ``spec.script`` under torchrun and wait for it, streaming output and a live view.

    Several launches may run at once from several threads (a sweep, a thread pool): each has its own run directory,
    port, output, limits and processes, and none changes anything process-wide.

    Args:
        spec: the ``LaunchSpec``.

    Returns:
        ``LaunchResult`` of the successful run.

    Raises:
        ConfigError: bad spec, before anything is started.
        LaunchError: a rank failed (``.rank``, ``.exit_code``, ``.failure.traceback`` from torchrun's
            error file, ``.failure.log_tail``) or torchrun failed.
        LaunchTimeout: the job exceeded ``spec.timeout_s``; it names the last step of every rank and,
            before stopping the job, asks every rank for its Python stack (``.stacks``, ``.where``).
        KeyboardInterrupt: re-raised after the job was stopped (a kernel interrupt).
        In every case no process of the job survives.

    With ``spec.slurm`` (a ``SlurmSpec``) the job is submitted to SLURM instead (``slurm_job.SubmittedJob``, run by the
    same loop, ``run_job``): the same result and errors, and an interrupt or a limit cancels the job (``scancel``).
    """
    fresh = fresh_run_dir_for(spec)
    if fresh is None:
        return _run_any(_plan_any(spec))
    with removed_if_refused(fresh):
        plan = _plan_any(dataclasses.replace(spec, run_dir=fresh))
    return _run_any(plan)


def _plan_any(spec: LaunchSpec):
    """The plan of ``spec``: a SLURM submission's (``plan_slurm_launch``) or a local launch's (``plan_launch``)."""
    return plan_slurm_launch(spec) if spec.slurm is not None else plan_launch(spec)


def _run_any(plan: LaunchPlan | SlurmPlan) -> LaunchResult:
    """Run a plan ``_plan_any`` made, on SLURM or here: the one loop (``run_job``) with the plan's job."""
    view = make_view(plan.spec.live, run_dir=plan.run_dir, cwd=plan.cwd)
    printer = ThrottledPrinter(stream=view.log_stream, max_lines_per_s=plan.spec.max_output_lines_per_s,
                               log_name=str(plan.run_dir / OUTPUT_LOG),
                               keeps_full_tracebacks=view.log_stream is not None)  # the widget view's output area
    job_class = SubmittedJob if isinstance(plan, SlurmPlan) else RunningJob
    return run_job(job_class(plan, view, printer))


def fresh_run_dir_for(spec: LaunchSpec) -> Path | None:
    """The fresh run directory ``launch`` makes for ``spec``, or ``None`` when it needs none.

    A spec with ``run_dir`` uses it; so does a script whose folder is a lesson's run directory (``is_lesson_run_dir``:
    ``write_script``'s copy in ``new_run_dir``'s folder). Any other script (``my_project/train.py``) gets a new folder
    ``default_runs_root()/<stamp>-<script name>`` (``new_run_dir``), as ``run_script`` gives it, while its ranks still
    run in the script's folder (``cwd``): a learner's folder stays theirs, and the script can be launched again and
    again. A script that does not exist makes nothing (``LaunchSpec.validate`` names it).

    Raises:
        ConfigError: the runs folder cannot be created (``new_run_dir``).
    """
    if spec.run_dir is not None or not isinstance(spec.script, (str, os.PathLike)):
        return None
    script = Path(spec.script)
    if not script.is_file() or is_lesson_run_dir(script.parent):
        return None
    return new_run_dir(_run_label(script.stem))


def _run_label(stem: str) -> str:
    """A run directory label from a script's name: what ``new_run_dir`` accepts (``"my train!"`` -> ``mytrain``)."""
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9._-]", "", stem)[:80] or "script"


def run_job(job: Job) -> LaunchResult:
    """The one run loop of every launch, local or on SLURM (``interface.Job`` gives the order of its calls): start the
    job, wait for it, stop it on any exception (asking its ranks for their stacks first at a limit), and finish.

    Returns:
        ``LaunchResult`` of a job that succeeded.

    Raises:
        LaunchError: the job failed, or can never run as asked; LaunchTimeout: it was stopped at a limit (each with
            the doctor's diagnosis, ``with_diagnosis``). Anything else (an interrupt, a refused start) is re-raised
            after the job was stopped.
    """
    try:
        job.start()
        returncodes = job.wait()
    except BaseException as exc:
        error = _stop(job, exc)
        if error is not None:
            raise with_diagnosis(error) from None
        raise
    finally:
        job.close()
    return _finish(job, returncodes)


def _stop(job: Job, exc: BaseException):
    """Stop the job (asking its ranks for their stacks first at a limit) and report why: the ``LaunchTimeout`` (or the
    job's own ``LaunchError``: ``cannot_run``) to raise, or ``None`` after saying that an interrupt or another
    exception stopped it (it is re-raised)."""
    plan, view = job.plan, job.view
    if not job.started:  # nothing runs: a bad run directory, a refused submission
        job.not_started(exc)
        return None
    at_limit = isinstance(exc, LimitReached)
    stopped = job.stop(ask_for_stacks=at_limit)
    elapsed = job.elapsed()
    view.add(job.read_records())
    built = job.cannot_run(exc, elapsed)
    if built is None and at_limit:
        last_steps = {rank: r["step"] for rank, r in view.latest.items()}
        built = timeout_error(plan, job.pump, exc.limit, elapsed, stopped.ranks_running, last_steps, stopped.stacks,
                              stopped.returncode, command=job.command, start=job.started_as, told=job)
    if built is not None:
        error, record, outcome = built
        record.write(plan.run_dir)
        safe_draw(view.finish, job.rss_samples, outcome)
        safe_draw(view.fail, error)  # the live view says where each rank was, or why the job cannot run
        return error
    record, outcome = stopped_outcome(plan, exc, elapsed, start=job.started_as, told=job)
    record.write(plan.run_dir)
    safe_draw(view.finish, job.rss_samples, outcome)
    sys.stdout.write(f"[launcher] {outcome.cause}: {stopped.how}. Logs: {plan.run_dir}\n")
    return None


def _finish(job: Job, returncodes: dict[int, int]) -> LaunchResult:
    """The ``LaunchResult`` of a job that ended; raises its ``LaunchError`` if a node failed."""
    plan, view = job.plan, job.view
    wall_time_s = job.elapsed()
    view.add(job.read_records())
    if any(returncodes[node] != 0 for node in plan.nodes):
        error, record, outcome = failure_error(plan, job.pump, returncodes, wall_time_s, command=job.command,
                                               start=job.started_as, told=job)
        safe_draw(view.finish, job.rss_samples, outcome)
        record.write(plan.run_dir)
        safe_draw(view.fail, error)  # the live view names the rank, the cause and the logs
        raise with_diagnosis(error)
    slurm_job = job.slurm_job()
    safe_draw(view.finish, job.rss_samples, Outcome(RunStatus.FINISHED, wall_time_s))
    RunRecord(RunStatus.FINISHED, wall_time_s, **plan.shape(job.started_as), returncode=0,
              slurm_job=slurm_job.as_dict() if slurm_job is not None else None).write(plan.run_dir)
    return LaunchResult(run_dir=plan.run_dir, command=job.command, returncode=0, wall_time_s=wall_time_s,
                        plan=plan.device_plan, job=slurm_job, loss_pattern=job.loss_pattern)


def run_script(script: str | os.PathLike, args: Sequence[object] = (), *, runs_dir: str | os.PathLike | None = None,
               label: str | None = None, **spec: object) -> LaunchResult:
    """Launch a script in a fresh run directory: a shipped lesson, or a script of your own, as often as you like.

    A shipped script (``run_script("ddp_train", ...)``) is written into the new run directory and runs there: the
    notebooks' one-liner. A script of yours (``run_script("train.py", ...)``, ``run_script("~/nanoGPT/train.py")``, a
    ``Path``) runs where it is, never copied or modified, and its ranks run in its folder (``cd <its folder> &&
    torchrun train.py``; ``cwd=`` for another), so the files it opens by relative path are found; what the launch
    writes (``command.txt``, ``output.log``, ``logs/``, ``run.json``, the loss points read from its printed lines)
    goes to the new run directory, so each launch of it gets its own.

    Args:
        script: a shipped script's name (``available_scripts()``, ``.py`` optional), or the path of your script: a
            ``Path``, a string with a ``/``, or the name of a file in this process's working folder.
        args: the script's arguments.
        runs_dir: parent of the run directory (``None``: ``default_runs_root()``).
        label: run directory label (default: the script's name).
        **spec: any other ``LaunchSpec`` field (``nproc_per_node``, ``device``, ``timeout_s``, ``env``, ``cwd``,
            ``loss_pattern``, ...).

    Returns and raises as ``launch``; a bad spec (an unknown field, a bad value) raises ``ConfigError`` before
    anything is started, as do arguments a shipped script's own ``parse_args`` rejects; no run directory is then left
    behind. A script of yours is not imported to check its arguments (importing runs its top-level code, the whole of
    nanoGPT's training). A bare name that is both a shipped script and a file here is refused: write ``"./name.py"``
    for your file.
    """
    for name in spec:
        if name in _RUN_SCRIPT_OWN:
            raise ConfigError(f"run_script(..., {name}=...): {_RUN_SCRIPT_OWN[name]}")
    check_spec_fields(spec)  # before any run directory is made
    own = own_script(script)
    if own is None:
        stem = shipped_script(str(script))
        run_dir = new_run_dir(label or str(script), runs_dir)
        with removed_if_refused(run_dir):
            path = write_script(stem, run_dir)
            launch_spec = LaunchSpec(path, args=args, **spec)
            plan = _plan_any(launch_spec)
            check_script_args(path, plan.spec.args)
        return _run_any(plan)
    run_dir = new_run_dir(label or _run_label(own.stem), runs_dir)
    with removed_if_refused(run_dir):
        launch_spec = LaunchSpec(own, args=args, run_dir=run_dir, **spec)
        plan = _plan_any(launch_spec)
    return _run_any(plan)


def own_script(script: str | os.PathLike) -> Path | None:
    """``run_script``'s reading of ``script``: the path of a script of yours (absolute), or ``None`` for a shipped one.

    Raises:
        ConfigError: a path that is not a file, a bare name that is neither a shipped script nor a file here, or both.
    """
    text = os.fspath(script) if isinstance(script, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text:
        raise ConfigError(f"script must be a shipped script's name or a path to your script, got {script!r}")
    path = Path(text).expanduser()
    shipped = text.removesuffix(".py") in available_scripts() and not isinstance(script, os.PathLike)
    if not shipped or "/" in text or text.startswith("~"):
        if path.is_dir():
            raise ConfigError(folder_given_as_script(path))
        if not path.is_file():
            raise ConfigError(f"unknown script {text!r}: it is no file (looked in "
                              f"{os.getcwd()!r}) and no shipped script; {closest_script(text)}shipped: "
                              f"{', '.join(available_scripts())}")
        return path.resolve()
    if path.is_file():
        raise ConfigError(f"{text!r} is both a shipped script and a file in {os.getcwd()!r}: write "
                          f"{text.removesuffix('.py')!r} for the lesson, or {'./' + text!r} for your file")
    return None


def setup_notebook(rank_env: Mapping[str, object] | None = None) -> None:
    """The notebook's setup call (its first cell after the parameters): what importing the library no longer does.

    Importing ``tutorial_lib`` starts no process, registers nothing and changes no environment variable. This call,
    made once at the top of a notebook:

    * sets the rank environment every later launch gives its ranks (``set_rank_env(rank_env)``; the kernel's
      ``os.environ`` stays as it is);
    * chooses the language of the doctor's report and the live view (``tutorial_lib.i18n.notebook_language``:
      ``$TUTORIAL_LIB_LANG``, else Chinese for a notebook in a folder named ``zh``, the Chinese edition, else
      English; ``tl.set_language`` changes it later);
    * in a Jupyter kernel, shows matplotlib figures inline (``enable_inline_figures``: the library draws without
      pyplot, so IPython's inline backend never registers itself);
    * starts the warm-start helper (unless ``$TUTORIAL_LIB_WARM=0``; Linux only), so it imports torch while the next
      cells run instead of during the first launch, which would otherwise start it.

    Args:
        rank_env: the notebook's ``RANK_ENV`` (variable name -> value); ``None``: no extra variables.

    Raises:
        ConfigError: a bad ``rank_env`` (``set_rank_env``), a bad ``$TUTORIAL_LIB_WARM`` or ``$TUTORIAL_LIB_LANG``.
    """
    lang = notebook_language()  # checked before anything is set: a bad $TUTORIAL_LIB_LANG changes nothing
    variables = set_rank_env(rank_env)
    set_language(lang)
    enable_inline_figures()
    if warm.warm_enabled(None):
        env = build_env(DevicePlan("cpu", "gloo", 1, 0))  # the start-up variables a CPU launch will have
        warm.prestart(env, sources=warm.env_sources(env, rank_env=variables))
