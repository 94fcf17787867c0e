"""Execute every notebook of the workbook in order with papermill and print a summary table.

    python scripts/run_workbook.py                      # all notebooks, CPU default (2 ranks on gloo)
    python scripts/run_workbook.py -p NPROC 4 -p DEVICE cuda
    python scripts/run_workbook.py --only 01_ddp --output-dir outputs

    python scripts/run_workbook.py -y 'RANK_ENV: {NCCL_P2P_DISABLE: "1"}' -f my_params.yaml

Executed notebooks go to ``<output-dir>/<name>.ipynb``, run directories of the training jobs to
``<output-dir>/runs/``. Parameters are given as papermill's own CLI takes them, and merged in its order
(later wins): ``-f FILE`` (YAML file), ``-y YAML``, ``-p NAME VALUE`` (``2`` an int, ``1e-5`` a float,
``None``/``True``/``False`` what they say, anything else a string), ``-r NAME VALUE`` (always a string).
They reach the notebooks' ``parameters`` cell and through it the training subprocesses. A parameter that none of
the notebooks to run declares (a typo such as ``-p NPROCS 3``) is refused before anything runs, naming the closest
declared one (papermill itself only warns and runs the notebook with its default). Every notebook gets a row in the
summary table, whatever it raised. A notebook whose modules this interpreter cannot import (``REQUIRES``: notebook 15
needs torchft, whose wheels are for Linux x86_64 and which the torch 2.8 compat venv lacks) is skipped, the reason
printed in its row; exits 1 if any notebook fails or a parameter is refused, 2 for a bad option (an
output folder that would overwrite the lesson notebooks, a limit that is not > 0) before anything runs.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import platform
import re
import subprocess
import sys
import textwrap
import time
import uuid
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import papermill as pm
import yaml
from papermill.inspection import inspect_notebook
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.paths import jupyter_runtime_dir

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


# Modules a notebook needs beyond the workbook's own: without them it is skipped, not failed, its reason printed.
REQUIRES = {"15_fault_tolerance": ("torchft", "numpy")}


def missing_modules(name: str, find_spec=importlib.util.find_spec) -> list[str]:
    """The modules ``REQUIRES`` lists for notebook ``name`` (a stem) that this interpreter cannot import."""
    return [module for module in REQUIRES.get(name, ()) if find_spec(module) is None]


def skip_reason(name: str, find_spec=importlib.util.find_spec) -> str | None:
    """Why notebook ``name`` cannot run with this interpreter, or ``None`` when it can."""
    missing = missing_modules(name, find_spec)
    if not missing:
        return None
    return (f"skipped: {' and '.join(missing)} not importable in {sys.executable} (pip install "
            f"{' '.join(REQUIRES[name])}; torchft's wheels are for Linux x86_64, see pyproject.toml)")


def positive_seconds(text: str) -> int:
    """``--timeout-s``'s type: a whole number of seconds > 0 (argparse exits with status 2 naming the value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds; e.g. --timeout-s 600") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds (a limit per cell), got {value}; e.g. --timeout-s 600")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output-dir", type=Path, default=ROOT / "outputs", help="executed notebooks and runs/ go here")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="notebook parameter, e.g. -p NPROC 2 (typed like papermill's -p)")
    p.add_argument("-r", "--parameter-raw", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="notebook parameter taken as a string, e.g. -r DEVICE cpu")
    p.add_argument("-y", "--parameters-yaml", action="append", default=[], metavar="YAML",
                   help="parameters as YAML, e.g. -y 'RANK_ENV: {NCCL_P2P_DISABLE: \"1\"}'")
    p.add_argument("-f", "--parameters-file", type=Path, action="append", default=[], metavar="FILE",
                   help="parameters from a YAML file")
    p.add_argument("--notebooks-dir", type=Path, default=NOTEBOOKS, help="folder of NN_name.ipynb notebooks")
    p.add_argument("--only", nargs="+", default=None, help="notebook names (without .ipynb) to run")
    p.add_argument("--timeout-s", type=positive_seconds, default=600, help="limit per cell (seconds, > 0)")
    return p.parse_args(argv)


def parameter_value(text: str) -> object:
    """A ``-p`` value typed exactly as papermill's CLI types it: ``True``/``False``/``None``, an int, a float, or
    the string itself (lists and dicts: use ``-y``)."""
    special = {"None": None, "True": True, "False": False}
    if text in special:
        return special[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def merged_parameters(args: argparse.Namespace) -> dict:
    """``-f`` files, then ``-y`` strings, then ``-p``, then ``-r`` (papermill's order; later wins).

    Raises:
        SystemExit: a file that cannot be read, or YAML that is not a mapping of names to values (the message
            names the file or the text).
    """
    parameters: dict = {}
    sources = [(f"-f {str(path)!r}", path) for path in args.parameters_file]
    sources += [(f"-y {text!r}", text) for text in args.parameters_yaml]
    for label, source in sources:
        try:
            text = source.read_text() if isinstance(source, Path) else source
            value = yaml.safe_load(text)
        except (OSError, yaml.YAMLError) as e:
            raise SystemExit(f"{label}: cannot read parameters: {e}") from None
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise SystemExit(f"{label}: parameters must be a YAML mapping of names to values, e.g. 'NPROC: 2'; "
                             f"got {type(value).__name__}")
        parameters.update(value)
    parameters.update({name: parameter_value(value) for name, value in args.parameter})
    parameters.update(dict(args.parameter_raw))
    return parameters


def undeclared_parameters(parameters: dict, notebooks: list[Path]) -> list[str]:
    """One message per name in ``parameters`` that no notebook of ``notebooks`` declares in its ``parameters`` cell
    (read as ``papermill --help-notebook`` reads it), naming the closest declared name (``difflib``) if one is close.

    Returns an empty list when every name is declared somewhere (papermill ignores a name a notebook does not declare,
    so a batch may pass a parameter that only some notebooks have).
    """
    declared = sorted({name for nb in notebooks for name in inspect_notebook(str(nb))})
    messages = []
    for name in parameters:
        if name in declared:
            continue
        close = difflib.get_close_matches(name, declared, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        messages.append(f"parameter {name!r}: no notebook to run declares it; {hint}declared: {', '.join(declared)}")
    return messages


def overwrites_sources(out_dir: Path, notebooks_dir: Path, notebooks: list[Path]) -> str | None:
    """Why ``out_dir`` would overwrite source notebooks, or ``None`` when it is safe.

    Refused: the folder being run (``notebooks_dir``), any folder of the workbook's own notebooks (``notebooks/``,
    ``notebooks/zh/``), whatever path resolves to one of them, and a folder whose ``<name>.ipynb`` is one of
    ``notebooks`` itself (a link). An executed copy would replace the lesson, its outputs stored for nbval with it.
    """
    out = out_dir.resolve()
    lessons = {notebooks_dir.resolve(), NOTEBOOKS.resolve()}
    lessons |= {nb.parent.resolve() for nb in NOTEBOOKS.glob("**/[0-9][0-9]_*.ipynb")}
    same = [nb.name for nb in notebooks if (out / nb.name).exists() and (out / nb.name).samefile(nb)]
    if out not in lessons and not same:
        return None
    what = f"holds the source notebook(s) {', '.join(same)}" if same else "is a folder of the lesson notebooks"
    return (f"--output-dir {str(out_dir)!r} ({out}) {what}: the executed copies would overwrite the lessons; pass "
            f"another folder, e.g. --output-dir outputs (the default, {ROOT / 'outputs'})")


def describe(name: str, message: object, width: int = 100) -> str:
    """``"AssertionError: first line of the message"``; a bare ``assert`` (empty message) gives the name alone."""
    lines = [line.strip() for line in str(message if message is not None else "").splitlines() if line.strip()]
    return f"{name}: {lines[0][:width]}" if lines else f"{name} (no message)"


ANSI = re.compile(r"\x1b\[[0-9;]*m")
ARROW = re.compile(r"^-+> *(\d+) (.*)$")


def failing_line(traceback: list[str] | None) -> tuple[int, str] | None:
    """``(line, source)`` of the cell line that raised, read from papermill's IPython traceback.

    IPython marks it with ``----> N code``; the last such arrow that belongs to the cell (the first frame,
    ``Cell In[k], line N``) is the cell's own line even when the error came from deeper in a library.
    Returns ``None`` when the traceback has no arrow (e.g. a kernel that died).
    """
    text = ANSI.sub("", "\n".join(traceback or []))
    for frame in text.split("\n\n"):  # IPython separates frames by a blank line
        if "Cell In[" in frame:
            for line in frame.splitlines():
                m = ARROW.match(line.strip())
                if m:
                    return int(m[1]), m[2].strip()
    return None


def clean_traceback(traceback: list[str] | None, max_lines: int = 40) -> str:
    """IPython's traceback without colour codes, its last ``max_lines`` lines, for the log under the table."""
    lines = ANSI.sub("", "\n".join(traceback or [])).splitlines()
    return "\n".join(lines[-max_lines:])


class IPCKernelManager(AsyncKernelManager):
    """A kernel that talks over Unix sockets in the runtime folder, not TCP on localhost, and exits in the background.

    Nothing listens on a port, and ipykernel no longer warns that it runs "over TCP without encryption".
    A graceful shutdown sends the kernel its shutdown request and returns: the kernel's exit (about 1 s here,
    mostly its interpreter tearing down torch) overlaps the next notebook instead of adding to the wall time.
    ``reap_kernels`` waits for every such kernel, and kills one still there after ``shutdown_wait_time``.
    """

    exiting: list[tuple[subprocess.Popen, float]] = []  # (kernel process, when its shutdown was requested)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("transport", "ipc")
        if kwargs["transport"] == "ipc" and "ip" not in kwargs:
            # Each kernel's own socket paths, absolute: jupyter_client's default is "kernel-ipc-1", "-2", ... in the
            # working folder, picked by which exist, so two workbook runs starting kernels at once in one notebooks
            # folder took the same sockets (the second client talked to the first run's kernel: "Invalid Signature").
            runtime = Path(jupyter_runtime_dir())
            runtime.mkdir(parents=True, exist_ok=True)
            kwargs["ip"] = str(runtime / f"kernel-{uuid.uuid4().hex[:16]}-ipc")
        super().__init__(*args, **kwargs)

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        process = getattr(self.provisioner, "process", None)
        if now or restart or not self.owns_kernel or process is None:
            return await super().shutdown_kernel(now=now, restart=restart)
        self.shutting_down = True
        self.stop_restarter()
        await self.request_shutdown()
        # Its reply says the request arrived: closing the control socket right away could drop it unsent.
        if await self._control_socket.poll(timeout=1000):
            await self._control_socket.recv_multipart()
        IPCKernelManager.exiting.append((process, time.monotonic() + self.shutdown_wait_time))
        await self.cleanup_resources()


def reap_kernels(block: bool = True) -> None:
    """Collect the kernels that were asked to exit (``IPCKernelManager``); with ``block``, wait for the rest and
    kill any still running past its ``shutdown_wait_time``."""
    still = []
    for process, deadline in IPCKernelManager.exiting:
        while process.poll() is None and block:
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                break
            time.sleep(0.05)
        if process.poll() is None:
            still.append((process, deadline))
    IPCKernelManager.exiting[:] = still


def run_notebooks(notebooks: list[Path], out_dir: Path, notebooks_dir: Path, parameters: dict,
                  timeout_s: int) -> list[tuple[str, str, float]]:
    """Execute ``notebooks`` in order into ``out_dir``; a ``(name, status, seconds)`` row each, whatever it raised."""
    rows = []
    for i, nb in enumerate(notebooks, 1):
        print(f"[{i}/{len(notebooks)}] {nb.name} ...", flush=True)
        skipped = skip_reason(nb.stem)
        if skipped:
            rows.append((nb.name, skipped, 0.0))
            print(f"    {skipped}", flush=True)
            continue
        start = time.monotonic()
        status = "ok"
        try:
            pm.execute_notebook(nb, out_dir / nb.name, parameters=parameters, cwd=str(notebooks_dir),
                                kernel_name="python3", progress_bar=False, execution_timeout=timeout_s,
                                kernel_manager_class=IPCKernelManager)
        except pm.PapermillExecutionError as e:
            where = failing_line(e.traceback)
            at = f", line {where[0]} ({where[1][:80]})" if where else ""
            status = f"FAILED in cell {e.exec_count}{at}: {describe(e.ename, e.evalue)}"
            print(textwrap.indent(clean_traceback(e.traceback), "    | "), flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on with the next notebook
            status = f"FAILED: {describe(type(e).__name__, e)}"
        seconds = time.monotonic() - start
        rows.append((nb.name, status, seconds))
        print(f"    {status} ({seconds:.1f} s)", flush=True)
        reap_kernels(block=False)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parameters = merged_parameters(args)
    notebooks_dir = args.notebooks_dir.resolve()
    notebooks = sorted(notebooks_dir.glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        print(f"no notebooks named NN_name.ipynb in {str(notebooks_dir)!r}; pass --notebooks-dir", file=sys.stderr)
        return 2
    if args.only:
        unknown = set(args.only) - {nb.stem for nb in notebooks}
        if unknown:
            print(f"unknown notebook(s) {sorted(unknown)}; available: {[nb.stem for nb in notebooks]}", file=sys.stderr)
            return 2
        notebooks = [nb for nb in notebooks if nb.stem in args.only]
    refusal = overwrites_sources(args.output_dir, notebooks_dir, notebooks)
    if refusal:  # before any kernel starts or any file is written
        print(refusal, file=sys.stderr)
        return 2
    refused = undeclared_parameters(parameters, notebooks)
    if refused:  # before anything runs: papermill would warn and run the notebook with the default
        print("\n".join(refused), file=sys.stderr)
        return 1
    out_dir = args.output_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    # The kernels inherit these: run directories under the output folder; progress as text (no widgets in files).
    os.environ["TUTORIAL_LIB_RUNS_DIR"] = str(out_dir / "runs")
    os.environ.setdefault("TUTORIAL_LIB_LIVE", "text")
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    print(f"torch {torch_version}, Python {platform.python_version()} ({sys.executable})", flush=True)
    try:
        rows = run_notebooks(notebooks, out_dir, notebooks_dir, parameters, args.timeout_s)
    finally:
        reap_kernels()
    width = max(len(r[0]) for r in rows) if rows else 8
    print(f"\n{'notebook':<{width}}  {'seconds':>7}  status")
    for name, status, seconds in rows:
        print(f"{name:<{width}}  {seconds:7.1f}  {status}")
    skipped = sum(1 for r in rows if r[1].startswith("skipped:"))
    failed = sum(1 for r in rows if r[1] != "ok") - skipped
    also = f", {skipped} skipped" if skipped else ""
    print(f"\n{len(rows) - failed - skipped} passed, {failed} failed{also}; executed notebooks in {out_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
