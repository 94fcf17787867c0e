"""What to launch (``LaunchSpec``, checked before anything starts) and what a successful launch returns."""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import pandas as pd

from ..errors import ConfigError, MetricsError
from ..i18n import N_
from ..notebook.parameters import check_positive_int
from ..notebook.script_source import check_script_syntax
from ..runs.metrics import read_memory_notes, read_memory_samples, read_metrics
from ..runs.observed import ObservedRun, read_observed
from ..runs.printed_metrics import (DEFAULT_LOSS_PATTERN, MAX_LINE_CHARS, compile_loss_pattern, has_printed_metrics,
                                    read_printed_metrics)
from ..runs.rundir import OUTPUT_LOG, launch_outputs_in
from ..slurm.target import SlurmSpec
from ..torchrun.output_lines import rank_lines
from .devices import CPU_DEFAULT_NPROC, DevicePlan, resolve_device
from .live import LIVE_MODES
from .warm import WARM_ENV


@dataclass
class LaunchSpec:
    """What to launch and how.

    Attributes:
        script: path of the training script (normally from ``write_script``).
        args: the script's own arguments, e.g. ``["--max-steps", 20]`` (converted with ``str``).
        nproc_per_node: ranks to start (``None``: the default of ``device``: 2 on CPU, one per GPU).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"`` (see ``resolve_device``). With ``"cpu"`` on a GPU
            machine the workers see no GPU (``CUDA_VISIBLE_DEVICES=""``).
        run_dir: where logs, metrics and ``command.txt`` go. ``None``: the script's folder when it is a lesson's run
            directory (``write_script``'s copy in ``new_run_dir``'s folder, ``rundir.is_lesson_run_dir``), else a
            fresh run directory ``default_runs_root()/<stamp>-<script name>`` that ``launch`` makes, as ``run_script``
            does: a script of your own (``LaunchSpec("my_project/train.py")``) can be launched again and again, and
            nothing the launcher writes lands beside your files. A given folder must hold none of what a launch
            writes (``rundir.LAUNCH_OUTPUTS``: ``command.txt``, ``output.log``, ``run.json``, ``logs/``,
            ``metrics/``, ``samples/``; nothing is overwritten or read as this launch's).
        timeout_s: wall-clock limit for the whole job (seconds, > 0); past it the job is stopped
            and ``LaunchTimeout`` is raised.
        stall_timeout_s: a hang detector independent of start-up time (seconds, > 0, or ``None``: off):
            once a rank has logged its first metrics line, the job is stopped and ``LaunchTimeout``
            (``limit="stall_timeout_s"``) raised when no rank logs a new one for this long. For
            scripts that write per-step metrics (every training script here); choose it above the
            slowest step (and checkpoint save).
        env: extra environment variables for torchrun and the workers (the kernel's ``os.environ``
            is never modified).
        max_restarts: torchrun ``--max-restarts`` (elastic restarts of the whole group on failure).
        nnodes: simulated nodes on this host: one torchrun agent per node (``--nnodes``, c10d rendezvous
            on loopback, hosted by the launcher), each with ``nproc_per_node`` ranks; the rendezvous
            gives the agents their node ranks (``GROUP_RANK``). On CUDA each node gets its own GPUs.
        start_nodes: the node ranks this launch starts (``None``: all). Starting fewer than ``nnodes``
            simulates a node that never arrives: rendezvous fails after ``rendezvous_timeout_s``.
        rendezvous_timeout_s: how long an agent waits for the other nodes (``--rdzv-conf join_timeout=``,
            seconds; multi-node only).
        master_port: rendezvous port on 127.0.0.1 (1024-65535); ``None`` picks a free one.
        live: live view mode: ``"auto"``, ``"widgets"``, ``"text"`` or ``"off"`` (see ``tutorial_lib.launcher.live``).
        sample_memory_hz: memory samples per second (> 0).
        max_output_lines_per_s: lines per second shown in the cell; the rest go to ``output.log`` only.
        shutdown_grace_s: how long torchrun gets to stop its workers after SIGTERM before SIGKILL (s).
        warm: fork torchrun's agent and the ranks from this kernel's warm-start helper, which has imported
            torch once (``tutorial_lib.launcher.warm``; same processes, exit codes, error files and signals as cold
            starts, seconds faster); ``None``: ``$TUTORIAL_LIB_WARM`` (default on). Falls back to cold starts,
            saying why once, whenever the helper cannot serve the job.
        cwd: the ranks' working folder, where the script's relative paths (``open("data.txt")``, nanoGPT's
            ``data/``) resolve; ``None``: the script's own folder, as ``cd <its folder> && torchrun script.py`` would
            run it. A lesson script written into its run directory thus writes its ``metrics/`` there; a script of
            yours finds the files beside it. An existing folder, else ``ConfigError`` before anything starts. The
            launch says it in the cell's status and in ``command.txt`` (``cd <cwd> && ...``).
        loss_pattern: a regular expression that reads a loss from the lines the ranks print (groups ``step`` and
            ``loss``); each matching line is a point of the live loss curve and of ``metrics/printed_rank<R>.jsonl``
            (``tutorial_lib.runs.printed_metrics``: the default reads ``iter 10: loss 2.34`` and ``step 10 ... loss
            2.34``). The curve shows them while the script has written no metrics JSON. ``None``: off.
        slurm: a ``SlurmSpec`` to submit the job to SLURM instead of running it here
            (``tutorial_lib.launcher.slurm_job``).
        observe: record what each rank really does, from torch itself, into the run directory's ``observed/``
            (``tutorial_lib/child/observer.py``: every collective, DDP/FSDP/TP wraps, gradients and parameters at each
            optimizer step, losses, seeds, the process group); read it with ``result.observed()`` or
            ``tl.runs.read_observed(run_dir)``. For checks and lessons that count or compare what ran; off by default,
            when it costs nothing. Not on SLURM.
    """

    script: str | os.PathLike
    args: Sequence[object] = ()
    nproc_per_node: int | None = None
    device: str = "auto"
    run_dir: str | os.PathLike | None = None
    timeout_s: float = 300.0
    stall_timeout_s: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    nnodes: int = 1
    start_nodes: Sequence[int] | None = None
    rendezvous_timeout_s: float = 60.0
    master_port: int | None = None
    live: str = "auto"
    sample_memory_hz: float = 5.0
    max_output_lines_per_s: float = 20.0
    shutdown_grace_s: float = 5.0
    warm: bool | None = None
    cwd: str | os.PathLike | None = None
    loss_pattern: str | re.Pattern | None = DEFAULT_LOSS_PATTERN
    slurm: SlurmSpec | None = None
    observe: bool = False

    def validate(self, gpu_count: int | None = None) -> DevicePlan:
        """Check every field; return the device plan. Raises ``ConfigError`` naming the bad value.

        Reads only: whether ``run_dir`` can be written is found when the launch starts, by writing its
        ``command.txt`` (before any process starts)."""
        if not isinstance(self.script, (str, os.PathLike)) or os.fspath(self.script) in ("", b""):
            raise ConfigError(f"script must be the path of a .py file (str or Path), got {self.script!r}")
        script = Path(self.script)
        if script.is_dir():
            raise ConfigError(folder_given_as_script(script))
        if not script.is_file():
            raise ConfigError(f"script {str(script)!r} does not exist; create it with write_script(name, run_dir), or "
                              f"give the path of your own script")
        check_script_syntax(script)  # a SyntaxError in the cell, before anything starts
        for name in ("timeout_s", "sample_memory_hz", "max_output_lines_per_s", "shutdown_grace_s",
                     "rendezvous_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a number > 0, got {value!r}")
        stall = self.stall_timeout_s
        if stall is not None and (isinstance(stall, bool) or not isinstance(stall, (int, float)) or not stall > 0):
            raise ConfigError(f"stall_timeout_s must be a number > 0 (seconds) or None, got {stall!r}")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ConfigError(f"max_restarts must be an integer >= 0, got {self.max_restarts!r}")
        if self.master_port is not None and (
            isinstance(self.master_port, bool) or not isinstance(self.master_port, int)
            or not 1024 <= self.master_port <= 65535
        ):
            raise ConfigError(f"master_port must be an integer in 1024..65535 or None (free port), got {self.master_port!r}")
        if self.live not in LIVE_MODES:
            raise ConfigError(f"live must be one of {LIVE_MODES}, got {self.live!r}")
        if not isinstance(self.observe, bool):
            raise ConfigError(f"observe must be True (record what each rank does, in observed/) or False, "
                              f"got {self.observe!r}")
        if self.warm not in (None, True, False):
            raise ConfigError(f"warm must be True, False or None (${WARM_ENV}, default on), got {self.warm!r}")
        if isinstance(self.args, (str, bytes)):
            raise ConfigError(f"args must be a list of arguments, not one string: got {self.args!r}; "
                              f"use shlex.split({self.args!r})")
        if not isinstance(self.args, (list, tuple)):
            raise ConfigError(f"args must be a list of the script's arguments (e.g. ['--max-steps', 20]; [] for "
                              f"none), got {self.args!r}")
        if not isinstance(self.env, Mapping):
            raise ConfigError(f"env must be a dict of environment variables (str to str; {{}} for none), got "
                              f"{self.env!r}")
        for key, value in self.env.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ConfigError(f"env must map str to str, got {key!r}: {value!r}")
        run_dir = Path(self.run_dir) if self.run_dir is not None else script.parent
        if not run_dir.is_dir():
            raise ConfigError(f"run_dir {str(run_dir)!r} is not a writable directory")
        if launch_outputs_in(run_dir):
            raise ConfigError(already_launched(run_dir))
        self.working_folder()
        compile_loss_pattern(self.loss_pattern)
        if self.nproc_per_node is not None:
            check_positive_int("nproc_per_node", self.nproc_per_node)
        check_positive_int("nnodes", self.nnodes)
        if self.slurm is not None:
            return self._slurm_device_plan()
        if self.start_nodes is not None:
            if not isinstance(self.start_nodes, (list, tuple, range)):
                raise ConfigError(f"start_nodes must be a list of node ranks in 0..{self.nnodes - 1} or None (every "
                                  f"node), got {self.start_nodes!r}")
            nodes = list(self.start_nodes)
            if not nodes or len(set(nodes)) != len(nodes) or not set(nodes) <= set(range(self.nnodes)):
                raise ConfigError(f"start_nodes must be distinct node ranks in 0..{self.nnodes - 1} (nnodes="
                                  f"{self.nnodes}), got {self.start_nodes!r}; None starts every node")
        plan = resolve_device(self.device, self.nproc_per_node, gpu_count=gpu_count)
        if self.nnodes > 1 and plan.device == "cuda" and self.nnodes * plan.nproc_per_node > plan.gpu_count:
            raise ConfigError(f"nnodes={self.nnodes} x nproc_per_node={plan.nproc_per_node} simulated GPU ranks "
                              f"need as many GPUs, this machine has {plan.gpu_count}; use device='cpu' to "
                              "simulate nodes, or fewer ranks")
        return plan

    def working_folder(self) -> Path:
        """The ranks' working folder, absolute: ``cwd``, else the script's folder.

        Raises:
            ConfigError: ``cwd`` is not a path, or not a folder this process can enter.
        """
        if self.cwd is None:
            return Path(self.script).resolve().parent
        if not isinstance(self.cwd, (str, os.PathLike)) or str(self.cwd) == "":
            raise ConfigError(f"cwd must be a folder (str or path) or None (the script's folder), got {self.cwd!r}")
        cwd = Path(self.cwd).expanduser()
        if not cwd.is_dir():
            raise ConfigError(f"cwd {str(self.cwd)!r} is not a folder ({'a file' if cwd.exists() else 'missing'}): "
                              f"the ranks' working folder must exist (this process runs in {os.getcwd()!r}); "
                              "None runs them in the script's folder")
        if not os.access(cwd, os.X_OK):
            raise ConfigError(f"cwd {str(self.cwd)!r} cannot be entered (no execute permission); pick another folder")
        return cwd.resolve()

    def _slurm_device_plan(self) -> DevicePlan:
        """The device plan of a launch on SLURM: the nodes' devices, not this machine's."""
        if not isinstance(self.slurm, SlurmSpec):
            raise ConfigError(f"slurm must be a SlurmSpec or None, got {self.slurm!r}")
        for name, value in (("start_nodes", self.start_nodes), ("master_port", self.master_port)):
            if value is not None:
                raise ConfigError(f"{name}={value!r} does not apply to a launch on SLURM (SLURM starts every node; the "
                                  "rendezvous port is derived from the job id): leave it None")
        if self.warm:
            raise ConfigError("warm=True does not apply to a launch on SLURM: the nodes start torchrun and the ranks")
        if self.observe:
            raise ConfigError("observe=True is for launches on this machine: a SLURM job's ranks cannot write their "
                              "records into this run directory; launch it here (slurm=None) to observe it")
        self.slurm.validate()
        gpus = self.slurm.gpus_per_node
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise ConfigError(f"SlurmSpec.gpus_per_node must be an integer >= 0 (0: a CPU job), got {gpus!r}")
        device = self.device if self.device != "auto" else ("cuda" if gpus else "cpu")
        if device not in ("cpu", "cuda") or (device == "cuda") != (gpus > 0):
            raise ConfigError(f"device={self.device!r} with SlurmSpec.gpus_per_node={gpus}: a CUDA job asks for GPUs "
                              "(gpus_per_node > 0), a CPU job for none")
        nproc = self.nproc_per_node or gpus or CPU_DEFAULT_NPROC
        if gpus and nproc != gpus:
            raise ConfigError(f"nproc_per_node={nproc} with SlurmSpec.gpus_per_node={gpus}: one rank per GPU")
        return DevicePlan(device, "nccl" if device == "cuda" else "gloo", nproc, gpus)


def no_metrics_message(run_dir: Path, loss_pattern: str | re.Pattern | None) -> str:
    """Why a finished run has no metrics: its script wrote no metrics JSON and no printed line gave a loss point; with
    the pattern in use and the last line a rank printed (from ``output.log``), to write a pattern against."""
    wrote = (f"the script wrote no metrics JSON ({run_dir / 'metrics'}/rank<R>.jsonl, tutorial_lib.runs.metrics' schema) "
             "and ")
    try:
        printed = [text for rank, text in rank_lines((run_dir / OUTPUT_LOG).read_text(errors="replace"))
                   if rank is not None and text.strip()]
    except OSError:
        printed = []
    example = f" (its last printed line: {printed[-1].strip()[:MAX_LINE_CHARS]!r})" if printed else ""
    if loss_pattern is None:
        return wrote + ("its printed lines were not read for losses (loss_pattern=None, or a launch on SLURM or in "
                        "this process); launch it with loss_pattern= a regular expression with the groups "
                        f"(?P<step>...) and (?P<loss>...) that matches its step lines{example}")
    pattern = loss_pattern.pattern if isinstance(loss_pattern, re.Pattern) else loss_pattern
    shown = f"r'{pattern}'" if "'" not in pattern else repr(pattern)
    shown = f"DEFAULT_LOSS_PATTERN {shown}" if pattern == DEFAULT_LOSS_PATTERN else shown
    return wrote + (f"no line it printed matched its loss_pattern, {shown}{example}: pass loss_pattern= a regular "
                    "expression with the groups (?P<step>...) and (?P<loss>...) that matches its step lines (e.g. "
                    "r'it (?P<step>\\d+) -> (?P<loss>[\\d.]+)' for 'it 3 -> 0.250'); output.log has every line")


def folder_given_as_script(folder: Path) -> str:
    """The refusal of a folder given as the script to run, naming the ``.py`` files in it (the first five)."""
    scripts = sorted(p.name for p in folder.glob("*.py") if p.is_file() and not p.name.startswith("_"))[:5]
    return (f"script {str(folder)!r} is a folder, not a script: give the .py file to run"
            + (f" (in it: {', '.join(scripts)})" if scripts else " (it holds no .py file)"))


def already_launched(run_dir: Path) -> str:
    """The refusal of a launch into ``run_dir`` that holds what a launch writes, naming what it holds and what to do."""
    found = ", ".join(name + "/" * (run_dir / name).is_dir() for name in launch_outputs_in(run_dir)) or "command.txt"
    return (f"run_dir {str(run_dir)!r} already holds a launch's files ({found}); nothing is overwritten or read as a "
            "new launch's: give "
            "each launch a fresh run directory (run_dir=new_run_dir(label)); for a script of your own, "
            "run_script('path/to/script.py', args) does it, running the script in place in its own folder")


def check_spec_fields(names: Iterable[str], allowed: Iterable[str] | None = None) -> None:
    """Refuse a keyword that is no ``LaunchSpec`` field (``nproc=2`` for ``nproc_per_node=2``) before anything is made.

    Args:
        names: the keywords given.
        allowed: the accepted names (default: every ``LaunchSpec`` field).

    Raises:
        ConfigError: naming the first unknown keyword and the closest field (a field that contains it, else ``difflib``).
    """
    known = [f.name for f in fields(LaunchSpec)] if allowed is None else list(allowed)
    for name in names:
        if name in known:
            continue
        stem = str(name).rstrip("s")
        close = [k for k in known if stem and stem in k] or difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]}=...? " if close else ""
        raise ConfigError(f"unknown LaunchSpec field {name!r}: {hint}fields: {', '.join(known)}")


def _checked_init(init):
    """``LaunchSpec.__init__`` that refuses an unknown keyword with ``ConfigError`` (``check_spec_fields``), not the
    ``TypeError`` of the dataclass's own ``__init__``."""
    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        check_spec_fields(kwargs)
        init(self, *args, **kwargs)
    return checked


LaunchSpec.__init__ = _checked_init(LaunchSpec.__init__)


@dataclass
class LaunchResult:
    """A finished, successful launch.

    Attributes:
        run_dir: the run directory (``metrics/``, ``samples/``, ``logs/``, ``output.log``, ``command.txt``).
        command: the argv that ran.
        returncode: torchrun's exit code (0).
        wall_time_s: from start to exit, seconds.
        plan: device, backend and rank count used (per node).
        job: the SLURM job of a launch on SLURM (``SlurmJob``: id, nodes, each node's ranks), else ``None``.
        loss_pattern: the ``loss_pattern`` the launch read the ranks' printed lines with (``None``: none read, as on
            SLURM and in this process).
    """

    run_dir: Path
    command: list[str]
    returncode: int
    wall_time_s: float
    plan: DevicePlan
    job: object | None = None
    loss_pattern: str | re.Pattern | None = None

    def metrics(self) -> pd.DataFrame:
        """The per-rank step metrics (``read_metrics``), every rank required; for a script that wrote no metrics
        JSON, the loss points read from the lines it printed (``read_printed_metrics``: the ranks that printed one).

        Raises:
            MetricsError: no metrics, neither written nor printed (a script of your own whose lines ``loss_pattern``
                does not read: the message shows the pattern and how to pass yours).
        """
        if not any((self.run_dir / "metrics").glob("rank*.jsonl")):
            if has_printed_metrics(self.run_dir):
                return read_printed_metrics(self.run_dir)
            raise MetricsError(no_metrics_message(self.run_dir, self.loss_pattern))
        return read_metrics(self.run_dir, ranks=self.plan.nproc_per_node * (self.job.node_count if self.job else 1))

    def observed(self) -> ObservedRun:
        """What each rank did as torch saw it (``read_observed``): its collectives, wraps, optimizer steps, losses.

        Raises:
            MetricsError: the launch was not observed (launch with ``observe=True``), or a rank left no record."""
        return read_observed(self.run_dir, ranks=self.plan.nproc_per_node * (self.job.node_count if self.job else 1))

    def memory_samples(self, kind: str = "rss") -> pd.DataFrame:
        """Memory sampled during the run (``read_memory_samples``; its ``.attrs["notes"]`` as ``memory_notes``).

        Raises:
            MetricsError: no samples: on SLURM none are taken (``memory_notes`` says why)."""
        if self.job is not None:
            raise MetricsError(" ".join(self.memory_notes()))
        return read_memory_samples(self.run_dir, kind)

    def memory_notes(self) -> list[str]:
        """What to know about the GPU memory samples (``read_memory_notes``): e.g. that no worker process
        matched NVML's process list, so GPU memory is known per device, not per process. Empty on CPU."""
        if self.job is not None:
            return [SLURM_MEMORY_NOTE]
        return read_memory_notes(self.run_dir)


SLURM_MEMORY_NOTE = N_("a SLURM job's ranks run on the cluster's nodes, where this kernel cannot sample their memory (psutil "
                     "sees this machine's processes only): the memory plot shows the tensor bytes each rank logs per "
                     "step (metrics()), not RSS or GPU memory")
