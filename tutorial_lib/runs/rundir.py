"""Run directories: where they go, what a launch leaves in them, and ``run.json``.

Every launch gets a fresh folder ``<runs root>/<YYYYmmdd-HHMMSS>-<label>[-N]/`` (``new_run_dir``); nothing existing is
ever overwritten. What is in it, by the names below:

====================  =====================================================================================
``<script>.py``       the lesson script as it ran, copied unchanged from ``tutorial_lib/lessons/`` (``write_script``):
                      what a learner reads is exactly what ran, and can be copied to a cluster
``.tutorial-run``     ``new_run_dir``'s mark (``RUN_DIR_MARKER``): this folder is a run directory the library made, so a
                      script launched from it writes its launch's files here (``is_lesson_run_dir``)
``command.txt``       the cold command that reruns the launch by hand (one ``# node N`` block per simulated node)
``output.log``        every line torchrun and the ranks printed, also those the cell did not show
``run.json``          how the launch ended (``RunRecord``, below)
``logs/``             torchrun's ``--log-dir`` (simulated nodes: ``logs/node<N>/``; read by ``tutorial_lib.torchrun``)
``metrics/``          ``rank<R>.jsonl``, one JSON line per step per rank, and what else a script reports
                      (``tutorial_lib.runs.metrics``)
``samples/``          the launcher's memory samples: ``rss.jsonl``, ``gpu.jsonl``, ``gpu_info.json``
``observed/``         a launch with ``observe=True``: ``rank<R>.jsonl``, what each rank did as torch saw it (its
                      collectives, wraps, optimizer steps, losses), written by the rank runner's observer and read by
                      ``tutorial_lib.runs.observed``; absent from every other launch
``checkpoints/``      ``checkpoint_train.py``'s ``step-N/`` folders (its ``--checkpoint-dir``; ``tutorial_lib.runs.checkpoints``)
====================  =====================================================================================

A notebook names these with calls, never with ``run_dir / "..."`` paths: ``script_path`` and ``read_command`` (here),
``read_output_log`` and ``workers_started`` (``run_logs``), ``read_metrics``, ``read_rank_json``, ``read_rank_tensors``
and ``last_steps`` (``metrics``), ``read_observed`` (``observed``), ``trace_files`` (``profiling``), ``checkpoint_dir``
and ``read_loaded_state`` (``checkpoints``).

``run.json``: how a launch ended, one schema, written in one place.

Every run directory holds one ``run.json``, written when the launch ends (``launch`` and ``run_in_process``)
and read by the doctor (a run diagnosed from its folder alone), the benchmarks and the tests. Its fields:

====================  =====================================================================================
``status``            ``"finished"``, ``"failed"``, ``"timeout"``, ``"interrupted"`` (the kernel's interrupt),
                      ``"stopped"`` (another exception while the launcher waited) or ``"refused"`` (the batch
                      system refused the job at submission, ``sbatch``: nothing ran)
``returncode``        torchrun's exit code (the first failed node's); ``None`` when the launcher stopped it
``wall_time_s``       seconds from the launch to its end
``nnodes``            torchrun agents (simulated nodes share this machine)
``nproc_per_node``    ranks per node
``device``            ``"cpu"`` or ``"cuda"``
``summary``           the one-line summary the launcher printed (``""`` when it finished)
``timeout_s``         the limit that stopped the job, seconds (``status == "timeout"`` only)
``limit``             which limit: ``"timeout_s"`` (wall clock) or ``"stall_timeout_s"`` (no progress)
``where``             ``{rank: place}``: where each rank was when it was stopped (``torchrun.stacks.Place.as_dict``:
                      ``own`` and ``innermost``, each ``{file, line, function}``; older files: the text
                      ``"file:line in function"``, read as a ``Place`` too)
``in_process``        ``True`` for ``run_in_process`` (no torchrun)
``start``             ``"warm"`` (torchrun and the ranks forked from the kernel's warm-start helper, see
                      ``tutorial_lib.launcher.warm``) or ``"cold"`` (each imported torch itself)
``slurm_job``         a launch on SLURM: ``job_id``, ``state``, ``reason``, ``exit_code``, ``signal``, ``nodes`` (names,
                      in SLURM's order: node N is ``nodes[N]``, its files ``*-node<N>.out`` and ``logs/node<N>/``),
                      ``node_ranks`` (``{N: global ranks}``, from each node's rank folders), ``never_starts`` (the
                      pending reason it was cancelled for, if any); ``None`` otherwise
``submit_error``      what ``sbatch`` said when it refused the job (``status == "refused"`` only; ``""`` otherwise)
``stopped_by``        the exception's class that stopped the launch (``status == "stopped"`` only; ``""`` otherwise)
====================  =====================================================================================
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import functools
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path

from ..errors import ConfigError
from ..torchrun.stacks import Place

LESSONS_DIR = Path(__file__).resolve().parents[1] / "lessons"
RUNS_DIR_ENV = "TUTORIAL_LIB_RUNS_DIR"
COMMAND_TXT = "command.txt"
OUTPUT_LOG = "output.log"
RUN_RECORD = "run.json"
LOGS = "logs"
METRICS_SUBDIR = "metrics"
SAMPLES_SUBDIR = "samples"
CHECKPOINTS_SUBDIR = "checkpoints"
OBSERVED_SUBDIR = "observed"
# What a launch writes into its run directory: a folder holding any of them is refused (``launch_outputs_in``).
LAUNCH_OUTPUTS = (COMMAND_TXT, OUTPUT_LOG, RUN_RECORD, LOGS, METRICS_SUBDIR, SAMPLES_SUBDIR, OBSERVED_SUBDIR)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
# new_run_dir's mark in each folder it makes: only the library's own folders are run directories (is_lesson_run_dir),
# whatever their names; a learner's folder named like one (20250101-090000-proj/) stays theirs.
RUN_DIR_MARKER = ".tutorial-run"
# The workbook's instruments for the lessons (metrics, failures on purpose): a lesson imports it only when it sits beside
# it, so a lesson copied alone trains without it. Files whose names start with "_" are never a run's script.
WORKBOOK_MODULE = "_workbook.py"


def sibling_modules(script: str | os.PathLike, folder: str | os.PathLike | None = None) -> list[str]:
    """The files beside ``script`` that it imports by plain name (``from lm_model import GPT``, ``import _workbook``),
    in the order it imports them: ``["lm_model.py", "_workbook.py"]`` for ``train_lm.py``.

    Args:
        script: a Python file.
        folder: where the imported files are looked for (default: the script's own folder).

    Returns:
        File names (``<module>.py``) that exist in ``folder``; a file Python cannot parse imports nothing.
    """
    script = Path(script)
    folder = script.parent if folder is None else Path(folder)
    try:
        stat = script.stat()
    except OSError:
        return []
    names = _imported_names(str(script), stat.st_mtime_ns, stat.st_size)
    return [f"{name}.py" for name in names if f"{name}.py" != script.name and (folder / f"{name}.py").is_file()]


@functools.lru_cache(maxsize=256)
def _imported_names(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    """The plain module names ``path`` imports, in source order (cached per file version: parsing every lesson on
    each ``available_scripts()`` call would cost a quarter of a second)."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return ()
    imports = sorted((node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))),
                     key=lambda node: (node.lineno, node.col_offset))
    names = [name for node in imports for name in ([a.name for a in node.names] if isinstance(node, ast.Import)
                                                   else [node.module] if node.level == 0 else [])]
    return tuple(name for name in dict.fromkeys(names) if name and "." not in name)


def helper_modules(folder: str | os.PathLike) -> set[str]:
    """The ``.py`` files of ``folder`` that are not scripts: names starting with ``_`` and the files another ``.py``
    file there imports (a lesson's model, ``lm_model.py``, which ``train_lm.py`` imports as nanoGPT's train.py
    imports ``model.py``)."""
    files = [p for p in Path(folder).glob("*.py") if p.is_file()]
    return {p.name for p in files if p.name.startswith("_")} | {name for p in files for name in sibling_modules(p)}


def available_scripts() -> list[str]:
    """Names (without ``.py``) of the lesson scripts shipped with the package (``tutorial_lib/lessons/``); the modules
    a lesson imports (``helper_modules``: ``_workbook.py``, ``lm_model.py``) are not scripts."""
    helpers = helper_modules(LESSONS_DIR)
    return sorted(p.stem for p in LESSONS_DIR.glob("*.py") if p.name not in helpers)


def shipped_script(name: object) -> str:
    """The name (without ``.py``) of the shipped script ``name`` (``available_scripts()``; ``.py`` optional).

    Raises:
        ConfigError: no shipped script of that name; the message names the closest one (``difflib``) and lists them.
    """
    stem = name.removesuffix(".py") if isinstance(name, str) else name
    if stem not in available_scripts():
        raise ConfigError(f"unknown script {name!r}; {closest_script(name)}available: {', '.join(available_scripts())}")
    return stem


def closest_script(name: object) -> str:
    """``"did you mean 'ddp_train'? "`` for the shipped script closest to ``name`` (``difflib``), else ``""``."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name.removesuffix(".py"), available_scripts(), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def launch_outputs_in(run_dir: str | os.PathLike) -> list[str]:
    """The names of ``LAUNCH_OUTPUTS`` (``command.txt``, ``output.log``, ``run.json``, ``logs/``, ``metrics/``,
    ``samples/``, ``observed/``) already present in ``run_dir``: a launch there would overwrite them, or read them as
    its own."""
    return [name for name in LAUNCH_OUTPUTS if os.path.lexists(Path(run_dir) / name)]


def is_lesson_run_dir(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a run directory made for the script in it: a folder ``new_run_dir`` made (its
    ``RUN_DIR_MARKER``, not its ``<stamp>-<label>`` name), whatever a launch or the learner left in it since (a second
    launch there is refused);
    or a folder holding only copies ``write_script`` made (its ``WRITTEN_SCRIPTS`` list) and what a launch of them
    writes (``LAUNCH_OUTPUTS``, ``checkpoints/``). A folder holding anything else (a learner's project: ``train.py``
    beside ``data/``, their own ``output.log``, a lesson they copied by hand) is not: ``launch`` gives a script there
    a fresh run directory, so nothing the launcher writes lands beside the learner's files.

    Args:
        folder: an existing folder (a script's parent). Hidden entries and ``__pycache__`` are not counted.
    """
    folder = Path(folder)
    if (folder / RUN_DIR_MARKER).is_file():
        return True
    outputs = {*LAUNCH_OUTPUTS, CHECKPOINTS_SUBDIR}
    names = [p for p in folder.iterdir() if not p.name.startswith(".") and p.name != "__pycache__"]
    scripts = [p for p in names if p.suffix == ".py" and p.is_file() and p.name in _written_here(folder)]
    return bool(scripts) and all(p in scripts or p.name in outputs for p in names)


WRITTEN_SCRIPTS = ".written-scripts"  # write_script's list of the lesson copies it made in a folder, one name a line


def _written_here(folder: Path) -> set[str]:
    """The scripts ``write_script`` copied into ``folder`` (its ``WRITTEN_SCRIPTS`` list); a lesson a learner copied by
    hand is not among them, so the folder stays the learner's."""
    try:
        return set((folder / WRITTEN_SCRIPTS).read_text().split())
    except OSError:
        return set()


def default_runs_root() -> Path:
    """Where run directories go: ``$TUTORIAL_LIB_RUNS_DIR`` if set, else ``./runs``."""
    return Path(os.environ.get(RUNS_DIR_ENV) or "runs")


def new_run_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    """Create a fresh, uniquely named run directory ``<root>/<YYYYmmdd-HHMMSS>-<name>[-N]``.

    Args:
        name: a short label (letters, digits, ``.``, ``_``, ``-``); it cannot contain a path separator,
            so the run directory cannot escape ``root``.
        root: parent folder (created if missing); ``None`` means ``default_runs_root()``.

    Returns:
        The new directory (absolute path), holding only its ``RUN_DIR_MARKER`` (``.tutorial-run``).

    Raises:
        ConfigError: ``name`` is not a plain label, or ``root`` exists but is not a writable directory.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", ".."):
        raise ConfigError(
            f"run name {name!r} must be 1-81 letters, digits, '.', '_' or '-' starting with a letter or digit "
            "(no '/' or '..': a run directory stays inside its root)"
        )
    root = Path(root) if root is not None else default_runs_root()
    missing = [folder.resolve() for folder in (root, *root.parents) if not folder.exists()]
    _MADE_ROOTS.update(missing)  # removed_if_refused removes them again if the launch is refused
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the runs folder {str(root)!r}: {e}; pass another root") from e
    if not root.is_dir() or not os.access(root, os.W_OK):
        raise ConfigError(f"runs folder {str(root)!r} is not a writable directory; pass another root")
    stem = f"{datetime.now():%Y%m%d-%H%M%S}-{name}"
    for n in range(1000):
        candidate = root / (stem if n == 0 else f"{stem}-{n}")
        try:
            candidate.mkdir()  # exist_ok=False: an existing run is never reused
        except FileExistsError:
            continue
        (candidate / RUN_DIR_MARKER).write_text("a run directory made by tutorial_lib.new_run_dir\n")
        return candidate.resolve()
    raise ConfigError(f"could not find a free run directory name under {str(root)!r}")


_MADE_ROOTS: set[Path] = set()  # runs folders (and their parents) new_run_dir created in this process


@contextlib.contextmanager
def removed_if_refused(run_dir: Path):
    """Remove ``run_dir``, a fresh folder made by the caller (``new_run_dir``), when the ``with`` block (the checks
    and planning before anything starts) raises: input refused before anything was launched leaves no folder behind,
    nor the runs folder (and its parents) ``new_run_dir`` created for it when they are empty again. A folder that
    holds what a launch writes (``LAUNCH_OUTPUTS``) is kept."""
    try:
        yield run_dir
    except BaseException:  # a ConfigError, or a bug's or an interrupt's exception: nothing was started either way
        if not launch_outputs_in(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
            folder = Path(run_dir).resolve().parent
            while folder in _MADE_ROOTS and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()  # a folder new_run_dir made for this refused launch: gone with it
                _MADE_ROOTS.discard(folder)
                folder = folder.parent
        raise


def write_script(name: str, run_dir: str | os.PathLike) -> Path:
    """Copy the shipped training script ``name`` unchanged into ``run_dir``, with the shipped files it imports beside it
    (``sibling_modules``: a lesson's model, ``lm_model.py``, and ``_workbook.py``, the workbook's instruments) where the
    folder has none of that name yet.

    Args:
        name: a script name from ``available_scripts()``, e.g. ``"ddp_train"`` (``.py`` optional).
        run_dir: an existing directory, normally from ``new_run_dir``.

    Returns:
        Path of the copy, ``run_dir/<name>.py``.

    Raises:
        ConfigError: unknown script name, ``run_dir`` missing, or a file of that name already
            exists there (it is never overwritten).
    """
    stem = shipped_script(name)
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run_dir {str(run_dir)!r} does not exist; create one with new_run_dir(...)")
    target = run_dir / f"{stem}.py"
    if target.exists():
        raise ConfigError(f"{str(target)!r} already exists and is not overwritten; use a new run directory")
    shutil.copyfile(LESSONS_DIR / f"{stem}.py", target)
    copies = [target.name]
    for module in sibling_modules(LESSONS_DIR / f"{stem}.py"):
        if not (run_dir / module).exists():  # the lesson's model, its optional instruments: beside it, as it imports
            shutil.copyfile(LESSONS_DIR / module, run_dir / module)
            copies.append(module)
    if not (run_dir / RUN_DIR_MARKER).is_file():  # a folder new_run_dir made is a run directory anyway
        with open(run_dir / WRITTEN_SCRIPTS, "a") as written:  # is_lesson_run_dir tells this copy from a learner's
            written.write("".join(name + "\n" for name in copies))
    return target.resolve()


def script_path(run_dir: str | os.PathLike) -> Path:
    """The training script of a run: the one ``*.py`` file at the top of its run directory (the copy ``write_script``
    put there, exactly what ran), e.g. for ``show_script`` or ``import_script``; a module the script imports
    (``helper_modules``: ``_workbook.py``, ``lm_model.py``) is never the script.

    Args:
        run_dir: a run directory (``LaunchResult.run_dir``, ``LaunchError.run_dir``).

    Raises:
        ConfigError: ``run_dir`` is not a directory, or holds no script or several (then the names are listed).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run_dir {str(run_dir)!r} does not exist; pass the run directory of a launch")
    helpers = helper_modules(run_dir)
    scripts = sorted(p for p in run_dir.glob("*.py") if p.is_file() and p.name not in helpers)
    if len(scripts) != 1:
        found = ", ".join(p.name for p in scripts) or "none"
        raise ConfigError(f"{str(run_dir)!r} should hold exactly one script (*.py), the one that ran; found {found}")
    return scripts[0].resolve()


def read_command(run_dir: str | os.PathLike, node: int | None = None) -> str:
    """The command that reruns a launch by hand, from its ``command.txt``.

    Args:
        run_dir: a run directory.
        node: ``None``: the whole file (a launch of simulated nodes: one ``# node N`` block per node); a node rank:
            that node's command alone, without its ``# node N`` line (a one-node launch has only node 0).

    Returns:
        The text, ending with a newline.

    Raises:
        ConfigError: no ``command.txt`` (the launch never started), or no block for ``node``.
    """
    path = Path(run_dir) / COMMAND_TXT
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"no {COMMAND_TXT} in {str(run_dir)!r} ({e.strerror}): pass the folder a launch created") from e
    if node is None:
        return text
    blocks = re.split(r"^# node (\d+)\n", text, flags=re.M)
    by_node = {int(n): body for n, body in zip(blocks[1::2], blocks[2::2])} or {0: text}
    if node not in by_node:
        raise ConfigError(f"{str(path)!r} has no command for node {node!r}; nodes: {sorted(by_node)}")
    return by_node[node]


def observed_dir(run_dir: str | os.PathLike) -> Path:
    """The folder of an observed launch's records, ``<run_dir>/observed`` (the launcher names it to the ranks)."""
    return Path(run_dir) / OBSERVED_SUBDIR


def observed_name(rank: int, restart: int = 0) -> str:
    """The record of global rank ``rank`` in torchrun's attempt ``restart``: ``rank<R>.jsonl``, after a restart
    ``rank<R>.restart<N>.jsonl``. The rank runner's observer (``child/observer.py``, ``record_name``) writes the same
    names; a test holds the two equal."""
    return f"rank{rank}.jsonl" if restart == 0 else f"rank{rank}.restart{restart}.jsonl"


def node_log_dir(run_dir: str | os.PathLike, node: int, nnodes: int) -> Path:
    """torchrun's ``--log-dir`` for node ``node`` of a launch of ``nnodes`` (simulated) nodes."""
    return Path(run_dir) / LOGS / f"node{node}" if nnodes > 1 else Path(run_dir) / LOGS


def node_log_dirs(run_dir: str | os.PathLike) -> dict[int, Path]:
    """``{node: log dir}`` of a launch of simulated nodes (``logs/node<N>/``); ``{}`` for one node (``logs/``)."""
    found = {int(p.name[4:]): p for p in (Path(run_dir) / LOGS).glob("node*") if p.name[4:].isdigit()}
    return dict(sorted(found.items()))


class RunStatus(str, Enum):
    """How a launch ended (a ``str``: ``RunStatus.FAILED == "failed"``)."""

    FINISHED = "finished"
    FAILED = "failed"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"
    REFUSED = "refused"  # the batch system (sbatch) refused the job: nothing ran


@dataclass
class RunRecord:
    """The content of ``run.json`` (the module docstring lists the fields)."""

    status: RunStatus
    wall_time_s: float
    nnodes: int = 1
    nproc_per_node: int = 1
    device: str = "cpu"
    returncode: int | None = None
    summary: str = ""
    timeout_s: float | None = None
    limit: str | None = None
    where: dict[int, Place] = field(default_factory=dict)
    in_process: bool = False
    start: str = "cold"
    slurm_job: dict | None = None
    submit_error: str = ""
    stopped_by: str = ""

    def write(self, run_dir: str | os.PathLike) -> Path:
        """Write ``<run_dir>/run.json``; returns its path."""
        data = asdict(self)
        data["status"] = RunStatus(self.status).value
        data["where"] = {str(rank): place.as_dict() for rank, place in sorted(self.where.items())}
        path = Path(run_dir) / RUN_RECORD
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> RunRecord | None:
        """The record of ``run_dir``, or ``None`` when it has none or it cannot be read (a launch that is still
        running, or a folder from before the launcher wrote one). Fields an older record lacks get their
        defaults; ``nproc_per_node`` and ``nnodes`` are then ``None`` (unknown), not 1."""
        try:
            data = json.loads((Path(run_dir) / RUN_RECORD).read_text())
            status = RunStatus(data["status"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        known["status"] = status
        read = {int(rank): Place.read(place) for rank, place in (data.get("where") or {}).items()}
        known["where"] = {rank: place for rank, place in read.items() if place is not None}
        record = cls(**{"wall_time_s": 0.0, **known})
        if "nproc_per_node" not in data:
            record.nproc_per_node = record.nnodes = None  # type: ignore[assignment]  # unknown, see docstring
        return record
