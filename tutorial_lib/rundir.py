"""Run directories: where they go, what a launch writes into them, and ``run.json``.

The lesson scripts are real files shipped in ``tutorial_lib/lessons/``. ``write_script`` copies one,
unchanged, into a run directory, so what a learner reads is exactly what ran and can be copied
to a cluster. Each run gets its own directory; nothing existing is ever overwritten.

``run.json``: how a launch ended, one schema, written in one place.

Every run directory holds one ``run.json``, written when the launch ends (``launch`` and ``run_in_process``)
and read by the doctor (a run diagnosed from its folder alone), the benchmarks and the tests. Its fields:

====================  =====================================================================================
``status``            ``"finished"``, ``"failed"``, ``"timeout"``, ``"interrupted"`` (the kernel's interrupt)
                      or ``"stopped"`` (another exception while the launcher waited)
``returncode``        torchrun's exit code (the first failed node's); ``None`` when the launcher stopped it
``wall_time_s``       seconds from the launch to its end
``nnodes``            torchrun agents (simulated nodes share this machine)
``nproc_per_node``    ranks per node
``device``            ``"cpu"`` or ``"cuda"``
``summary``           the one-line summary the launcher printed (``""`` when it finished)
``timeout_s``         the limit that stopped the job, seconds (``status == "timeout"`` only)
``limit``             which limit: ``"timeout_s"`` (wall clock) or ``"stall_timeout_s"`` (no progress)
``where``             ``{rank: "file:line in function"}``: where each rank was when it was stopped
``in_process``        ``True`` for ``run_in_process`` (no torchrun)
``start``             ``"warm"`` (torchrun and the ranks forked from the kernel's warm-start helper, see
                      ``tutorial_lib.launcher.warm``) or ``"cold"`` (each imported torch itself)
====================  =====================================================================================
"""

from __future__ import annotations

import ast
import json
import contextlib
import html
import importlib.util
import io
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from types import ModuleType

from .errors import ConfigError

SCRIPTS_DIR = Path(__file__).resolve().parent / "lessons"
RUNS_DIR_ENV = "TUTORIAL_LIB_RUNS_DIR"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")


def available_scripts() -> list[str]:
    """Names (without ``.py``) of the training scripts shipped with the package."""
    return sorted(p.stem for p in SCRIPTS_DIR.glob("*.py") if not p.name.startswith("_"))


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
        The new, empty directory (absolute path).

    Raises:
        ConfigError: ``name`` is not a plain label, or ``root`` exists but is not a writable directory.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", ".."):
        raise ConfigError(
            f"run name {name!r} must be 1-81 letters, digits, '.', '_' or '-' starting with a letter or digit "
            "(no '/' or '..': a run directory stays inside its root)"
        )
    root = Path(root) if root is not None else default_runs_root()
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
        return candidate.resolve()
    raise ConfigError(f"could not find a free run directory name under {str(root)!r}")


def write_script(name: str, run_dir: str | os.PathLike) -> Path:
    """Copy the shipped training script ``name`` unchanged into ``run_dir``.

    Args:
        name: a script name from ``available_scripts()``, e.g. ``"ddp_train"`` (``.py`` optional).
        run_dir: an existing directory, normally from ``new_run_dir``.

    Returns:
        Path of the copy, ``run_dir/<name>.py``.

    Raises:
        ConfigError: unknown script name, ``run_dir`` missing, or a file of that name already
            exists there (it is never overwritten).
    """
    stem = name[:-3] if name.endswith(".py") else name
    if stem not in available_scripts():
        raise ConfigError(f"unknown script {name!r}; available: {', '.join(available_scripts())}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run_dir {str(run_dir)!r} does not exist; create one with new_run_dir(...)")
    target = run_dir / f"{stem}.py"
    if target.exists():
        raise ConfigError(f"{str(target)!r} already exists and is not overwritten; use a new run directory")
    shutil.copyfile(SCRIPTS_DIR / f"{stem}.py", target)
    return target.resolve()


class ScriptListing:
    """Parts of a source file shown with line numbers (text in a terminal, highlighted HTML in Jupyter).

    Args:
        path: the file.
        spans: ``(first_line, last_line)`` pairs, 1-based and inclusive; ``last_line`` ``None`` means the end.
    """

    def __init__(self, path: str | os.PathLike, spans: list[tuple[int, int | None]]) -> None:
        self.path = Path(path)
        lines = self.path.read_text().splitlines()
        self.parts = [(max(1, a), lines[max(1, a) - 1: b]) for a, b in spans]

    def __str__(self) -> str:
        width = len(str(max(a + len(body) for a, body in self.parts)))
        chunks = ["\n".join(f"{i:>{width}}  {line}" for i, line in enumerate(body, a)) for a, body in self.parts]
        return f"# {self.path.name}\n" + "\n...\n".join(chunks)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer
        except ImportError:
            return f"<pre>{html.escape(str(self))}</pre>"
        chunks = [highlight("\n".join(body), PythonLexer(), HtmlFormatter(linenos="inline", linenostart=a, noclasses=True))
                  for a, body in self.parts]
        return f"<b>{html.escape(self.path.name)}</b>" + "<div>...</div>".join(chunks)


def show_script(path: str | os.PathLike, *names: str, first_line: int = 1,
                last_line: int | None = None, between: tuple[str, str] | None = None) -> ScriptListing:
    """A displayable listing of ``path`` with line numbers.

    Args:
        path: the script.
        names: top-level functions or classes to show (each with its decorators), in this order;
            none: the lines ``first_line``..``last_line`` (1-based, inclusive; default the whole file).
        between: ``(start_text, end_text)``: instead, the lines from the first one containing
            ``start_text`` to the next one containing ``end_text`` (inclusive), so an excerpt
            survives edits that move line numbers.

    Raises:
        ConfigError: a name that is not a top-level function or class of the script, or a
            ``between`` text that is not in the script.
    """
    if between is not None:
        start_text, end_text = between
        lines = Path(path).read_text().splitlines()
        start = next((i for i, line in enumerate(lines, 1) if start_text in line), None)
        end = next((i for i, line in enumerate(lines, 1) if start and i >= start and end_text in line), None)
        if start is None or end is None:
            missing = start_text if start is None else end_text
            raise ConfigError(f"{Path(path).name} has no line containing {missing!r}"
                              + ("" if start is None else f" after line {start}"))
        return ScriptListing(path, [(start, end)])
    if not names:
        return ScriptListing(path, [(first_line, last_line)])
    tree = ast.parse(Path(path).read_text())
    spans = {node.name: (min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno)
             for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for name in names:
        if name not in spans:
            raise ConfigError(f"{Path(path).name} has no top-level function or class {name!r}; has {sorted(spans)}")
    return ScriptListing(path, [spans[name] for name in names])


def import_script(script: str | os.PathLike) -> ModuleType:
    """A training script imported as a module, to use its classes and functions in the notebook (the model a
    checkpoint was saved from, say); its ``main()`` does not run (it runs under ``if __name__ == "__main__"``).

    Args:
        script: a script file (e.g. the copy ``write_script`` put in a run directory) or the name of a shipped
            script (``"checkpoint_train"``).

    Raises:
        ConfigError: no such file or shipped script, or Python cannot import it as a module.
    """
    path = Path(script)
    if not path.suffix and not path.exists() and str(script) in available_scripts():
        path = SCRIPTS_DIR / f"{script}.py"
    if not path.is_file():
        raise ConfigError(f"script {str(script)!r} is neither a file nor a shipped script; shipped: "
                          f"{available_scripts()}")
    module_spec = importlib.util.spec_from_file_location(f"_tutorial_lib_script_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"{str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def check_script_args(script: str | os.PathLike, args: Sequence[object]) -> ModuleType | None:
    """Parse ``args`` with the script's own ``parse_args(argv)`` before anything is launched.

    The shipped scripts validate their flags in ``parse_args`` (argparse plus range checks); calling
    it here turns a typo or a bad value into an error in the cell at once, instead of a failed
    launch with one argparse message per rank. A script without a ``parse_args`` function is not
    checked. The script is imported under a private module name; its ``main()`` does not run.

    Returns:
        The imported script module (``run_in_process`` calls its ``main()``), or ``None`` for a file
        Python cannot import as a module.

    Raises:
        ConfigError: the script rejects ``args``; the message is the script's own.
    """
    path = Path(script)
    try:
        module = import_script(path)
    except ConfigError:
        return None
    parse_args = getattr(module, "parse_args", None)
    if not callable(parse_args):
        return module
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages), contextlib.redirect_stdout(io.StringIO()):
            parse_args([str(a) for a in args])
    except SystemExit as e:
        if e.code not in (0, None):
            last = (messages.getvalue().strip().splitlines() or [f"exit code {e.code}"])[-1]
            reason = last.split("error: ", 1)[-1]  # argparse writes "<prog>: error: <message>"
            raise ConfigError(f"{path.name}: {reason} (it was given {[str(a) for a in args]}; "
                              f"see python {path.name} --help)") from None
    return module


RUN_RECORD = "run.json"


class RunStatus(str, Enum):
    """How a launch ended (a ``str``: ``RunStatus.FAILED == "failed"``)."""

    FINISHED = "finished"
    FAILED = "failed"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"


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
    where: dict[int, str] = field(default_factory=dict)
    in_process: bool = False
    start: str = "cold"

    def write(self, run_dir: str | os.PathLike) -> Path:
        """Write ``<run_dir>/run.json``; returns its path."""
        data = asdict(self)
        data["status"] = RunStatus(self.status).value
        data["where"] = {str(rank): place for rank, place in sorted(self.where.items())}
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
        known["where"] = {int(rank): place for rank, place in (data.get("where") or {}).items()}
        record = cls(**{"wall_time_s": 0.0, **known})
        if "nproc_per_node" not in data:
            record.nproc_per_node = record.nnodes = None  # type: ignore[assignment]  # unknown, see docstring
        return record


@dataclass(frozen=True)
class Outcome:
    """How a launch ended, as the launcher tells the live view (``LiveView.finish``).

    Attributes:
        status: ``RunStatus`` (the same value ``run.json`` records).
        elapsed_s: seconds from the launch to its end.
        cause: what ended a run that did not finish, in a few words: the launcher's summary of a failure
            (``"t.py failed on rank 1 (exit code 1)"``), ``"timed out after 30 s"``, ``"interrupted"``,
            ``"stopped by RuntimeError"``; ``""`` for a finished run.
    """

    status: RunStatus
    elapsed_s: float
    cause: str = ""

    @property
    def failed(self) -> bool:
        """Whether the run did not finish (failed, timed out, interrupted or stopped)."""
        return self.status != RunStatus.FINISHED

    @property
    def text(self) -> str:
        """The one-line status the view shows: ``"finished in 4.2 s"`` or ``"failed: <cause>"``."""
        return f"failed: {self.cause}" if self.failed else f"finished in {self.elapsed_s:.1f} s"
