"""Run a lesson script as one process inside this one, without torchrun: ``run_in_process``.

For per-process effects measured on many variants (fp16 underflow, a loss scaler's skipped steps), minus the seconds
a launch spends starting torchrun and importing torch in new processes. The script runs in this process, so for the
run it has this process's working folder, ``sys.argv``, ``sys.stdout``, torch's thread count and ``os.environ`` (with
the rank environment, ``set_rank_env``, as a launched rank would): one run at a time (a lock), each restored after.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..notebook.parameters import check_positive_int
from ..notebook.script_source import check_script_args
from ..runs.rundir import (COMMAND_TXT, OUTPUT_LOG, RunRecord, RunStatus, new_run_dir, removed_if_refused,
                           shipped_script, write_script)
from .devices import DevicePlan, resolve_device
from .environment import rank_env
from .spec import LaunchResult

# What a run changes for its duration belongs to this whole process: two runs from two threads would interleave them.
_ONE_AT_A_TIME = threading.Lock()


def run_in_process(name: str, args: Sequence[object] = (), *, runs_dir: str | os.PathLike | None = None,
                   label: str | None = None, device: str = "cpu", num_threads: int | None = 1) -> LaunchResult:
    """Run the shipped script ``name`` as one process, inside this Python process, without torchrun.

    What ``python NAME.py ARGS`` would do (a world of one: the scripts join no process group when
    ``RANK`` is unset), minus the ~5 s a launch spends starting torchrun and importing torch in new
    processes. Use it for per-process effects measured on many variants (fp16 underflow, a loss
    scaler's skipped steps, the speed of a matmul in bf16); use ``run_script`` for anything that
    involves ranks. The script runs with the run directory as working directory, so its
    ``metrics/`` land there exactly as in a launch; its printed lines go to ``output.log`` and to
    this cell; ``command.txt`` holds the equivalent ``python NAME.py ...`` command.

    This process outlives the run, so two things differ from a fresh ``python`` process. A script that
    makes a world of one (FSDP needs a process group even alone) gets ``--backend gloo``, also on
    CUDA (gloo moves CUDA tensors through host memory): NCCL would start its communicators and
    watchdog thread inside the notebook's kernel and keep them after the run, and a hang or abort
    there takes the kernel with it. And this process's CUDA context stays, with the allocator's
    cache and peak statistics: before each run, when CUDA is initialised here, the cache is
    emptied and the peak statistics are reset, so ``torch.cuda.max_memory_allocated`` /
    ``max_memory_reserved`` measure this run only.

    Args:
        name: a script from ``available_scripts()``.
        args: the script's arguments (checked by the script's ``parse_args`` first).
        runs_dir: parent of the run directory (``None``: ``default_runs_root()``).
        label: run directory label (default: ``name``).
        device: ``"cpu"`` or ``"cuda"``; passed as the script's ``--device`` when it has that flag and
            ``args`` do not set it (``cuda`` runs on GPU 0). Scripts with a ``--backend`` flag get
            ``--backend gloo`` on either device.
        num_threads: torch's intra-op CPU threads while the script runs (``torch.set_num_threads``);
            1, like every rank under torchrun (``OMP_NUM_THREADS=1``); ``None`` keeps this process's.

    Returns:
        A ``LaunchResult`` with ``plan.nproc_per_node == 1`` and ``plan.backend == "gloo"``;
        ``metrics()`` reads rank 0's lines.

    Raises:
        ConfigError: unknown script, bad arguments, ``device`` not ``cpu``/``cuda`` (or ``cuda``
            without a GPU), ``args`` asking for ``--backend nccl``, or this process is itself a rank
            of a job (``RANK`` set, or a process group already initialised): the script would then
            try to join it.
        Exception: whatever the script raises (its traceback is the script's own).
    """
    shipped_script(name)  # an unknown name is refused before any run directory is made
    argv = _in_process_argv(name, args, device, num_threads)
    plan = resolve_device(device, 1, backend="gloo")
    run_dir = new_run_dir(label or name, runs_dir)
    with removed_if_refused(run_dir):  # arguments the script refuses leave no run directory
        script = write_script(name, run_dir)
        source = script.read_text()
        if "--device" not in argv and '"--device"' in source:  # scripts that pick their device
            argv += ["--device", plan.device]
        if not any(a.startswith("--backend") for a in argv) and '"--backend"' in source:  # a world of one
            argv += ["--backend", plan.backend]
        module = check_script_args(script, argv)  # the script, imported once: checked here, run below
    command = [sys.executable, script.name, *argv]
    (run_dir / COMMAND_TXT).write_text(f"# run in the notebook's process, equivalent to:\ncd {shlex.quote(str(run_dir))}\n"
                                         + shlex.join(["python", *command[1:]]) + "\n")
    with _ONE_AT_A_TIME:
        wall_time_s = _run_main_here(module, [str(script), *argv], run_dir, plan, num_threads)
    return LaunchResult(run_dir=run_dir, command=command, returncode=0, wall_time_s=wall_time_s, plan=plan)


def _in_process_argv(name: str, args: Sequence[object], device: str, num_threads: int | None) -> list[str]:
    """``args`` as strings, once this process may run ``name`` (``run_in_process``'s checks); raises ``ConfigError``."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}: use 'cpu' or 'cuda'")
    if "RANK" in os.environ:
        raise ConfigError(f"RANK={os.environ['RANK']!r} is set in this process: run_in_process would make {name}.py "
                          "join that job's process group; use run_script, or unset RANK")
    import torch.distributed as dist  # only here: launching alone never imports torch in this process

    if dist.is_available() and dist.is_initialized():
        raise ConfigError("this process already has a torch.distributed process group; the script would use it. "
                          "Use run_script, or call dist.destroy_process_group() first")
    if num_threads is not None:
        check_positive_int("num_threads", num_threads)
    argv = [str(a) for a in args]
    if "--backend=nccl" in argv or any(a == "--backend" and b == "nccl" for a, b in zip(argv, argv[1:])):
        raise ConfigError(f"{name}: --backend nccl inside this process: run_in_process runs no NCCL in the notebook's "
                          "kernel (its communicators and watchdog would outlive the run); drop the flag (gloo is "
                          "used), or launch the script with run_script")
    return argv


def _run_main_here(module, argv: list[str], run_dir: Path, plan: DevicePlan, num_threads: int | None) -> float:
    """Run ``module.main()`` with ``sys.argv = argv`` in ``run_dir``, its printed lines in ``output.log`` and then this
    cell; write run.json and restore argv, working directory and threads. Returns the wall time; raises
    ``ConfigError`` if the script exited with an error code, or what the script raised."""
    import torch

    output = io.StringIO()
    if torch.cuda.is_initialized():  # an earlier run's cached blocks and peaks would count in this run's numbers
        torch.cuda.empty_cache()
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
    saved_argv, saved_cwd, saved_threads = sys.argv, os.getcwd(), torch.get_num_threads()
    start = time.monotonic()
    status, error = RunStatus.FAILED, None
    try:
        sys.argv = argv
        os.chdir(run_dir)
        torch.set_num_threads(num_threads or saved_threads)
        with contextlib.redirect_stdout(output), warnings.catch_warnings(), _environment(rank_env()):
            # @record enables faulthandler on sys.stderr, which in some hosts (pytest's capture) has no file
            # descriptor: torch then warns; the run itself is unaffected.
            warnings.filterwarnings("ignore", "Unable to enable fault handler", UserWarning)
            module.main()
        status = RunStatus.FINISHED
    except SystemExit as e:  # a script's own usage error or message
        if e.code not in (0, None):
            error = ConfigError(f"{Path(argv[0]).name} exited with {e.code!r}")
        else:
            status = RunStatus.FINISHED
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        torch.set_num_threads(saved_threads)
        wall_time_s = time.monotonic() - start
        (run_dir / OUTPUT_LOG).write_text(output.getvalue())
        RunRecord(status, wall_time_s, device=plan.device, returncode=0 if status == RunStatus.FINISHED else None,
                  in_process=True).write(run_dir)
        sys.stdout.write(output.getvalue())
    if error is not None:
        raise error
    return wall_time_s


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """``os.environ`` with ``values`` set while the block runs (a run in this process reads its variables there, as a
    launched rank does from its own environment); each variable is restored, or removed, afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def export_hf(checkpoint: str | os.PathLike, folder: str | os.PathLike, *, model: str | os.PathLike,
              adapter: bool = False, shard_gb: float = 5.0, runs_dir: str | os.PathLike | None = None) -> Path:
    """A ``train_hf.py`` DCP checkpoint (any step, saved on any number of ranks) as a Hugging Face folder, afterwards:
    ``python train_hf.py --model MODEL --export-from CHECKPOINT --export FOLDER`` run in this process
    (``run_in_process``; its run directory keeps the command and the output).

    The whole model is never in memory: DCP reads the tensors of one output file at a time (only the keys asked for; a
    LoRA base weight with its A and B), which are merged in fp32, cast once and written, then freed, on torch 2.8 and
    2.13 alike. This process grows by about twice the larger of ``shard_gb`` and the largest tensor (measured: 50 MB
    exporting a 273 MB model in 20 MB files, ``tests/integration/test_export_hf.py``). At the end of a run,
    ``--export`` writes the same folder from every rank without gathering the model (torch 2.13: DCP's
    ``HuggingFaceStorageWriter`` consolidates each rank's rows; torch 2.8: one tensor gathered at a time, one file
    written at a time).

    Args:
        checkpoint: a ``step-N/`` folder of the run's checkpoints (``checkpoint_dir(run_dir, step=N)``).
        folder: where the Hugging Face folder goes: new, or empty (nothing is overwritten).
        model: the folder the run trained from (``--model``): its config.json, dtype and tokenizer files.
        adapter: a LoRA run's adapters as a PEFT folder (``PeftModel.from_pretrained``) instead of merged weights.
        shard_gb: the largest safetensors file (GB, 1e9 bytes; Hugging Face's default 5): also about what the export
            holds in memory at a time.
        runs_dir: parent of the export's run directory (``None``: ``default_runs_root()``).

    Returns:
        ``folder``: ``AutoModelForCausalLM.from_pretrained(folder)`` loads it (config.json, the weights in config.json's
        dtype, sharded with ``model.safetensors.index.json`` past ``shard_gb``, the tokenizer files).

    Raises:
        ConfigError: the script refused its arguments (a folder that is not empty, no such checkpoint), naming them.
    """
    args = ["--model", str(model), "--export-from", str(checkpoint), "--export", str(folder),
            "--export-shard-gb", shard_gb, *(["--export-adapter"] if adapter else [])]
    run_in_process("train_hf", args, runs_dir=runs_dir, label="export-hf")
    return Path(folder)
