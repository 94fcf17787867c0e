"""What this learner has done with the exercises, kept beside the run directories (never in a notebook).

One JSON file, ``<runs folder>/exercises/progress.json``: per exercise id, the checks run, whether one passed (and
when first), the hints opened and whether the solution was shown. It is rewritten whole on each event (a temporary
file renamed over it), so an interrupted kernel leaves the old or the new file, never half of one. ``progress()``
reads it into one table beside every exercise that exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from ..errors import ConfigError
from ..runs.rundir import default_runs_root

FILE = Path("exercises") / "progress.json"
TYPES = {"checks": int, "solved": bool, "first_solved": str, "hints_opened": int, "solution_opened": bool}
DEFAULTS = {"checks": 0, "solved": False, "first_solved": None, "hints_opened": 0, "solution_opened": False}


def progress_path(runs_root: str | os.PathLike | None = None) -> Path:
    """``<runs_root>/exercises/progress.json`` (``None``: ``$TUTORIAL_LIB_RUNS_DIR`` or ``./runs``)."""
    return (Path(runs_root) if runs_root is not None else default_runs_root()) / FILE


def read_store(runs_root: str | os.PathLike | None = None) -> dict[str, dict]:
    """``{exercise id: its record}``; ``{}`` when nothing was checked yet.

    Raises:
        ConfigError: the file exists but is not this store's JSON (names it; move it away to start afresh).
    """
    path = progress_path(runs_root)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not a readable progress file ({e}); move it away to start the record afresh") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds {type(data).__name__}, not the progress record; move it away")
    return data


def entry_of(data: dict, exercise_id: str) -> dict:
    """``exercise_id``'s record in ``data`` with every field present and of its type: a field that is missing, or
    that a person edited into something else, starts afresh (``DEFAULTS``)."""
    found = data.get(exercise_id)
    entry = dict(DEFAULTS)
    if isinstance(found, dict):
        entry.update({k: v for k, v in found.items() if k in TYPES and isinstance(v, TYPES[k])})
    return entry


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``<path>.lock`` (fcntl.flock): two kernels updating the record one after the other."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(f".{path.name}.lock"), "a")
    except OSError as e:
        raise ConfigError(f"cannot write the exercises' folder {str(path.parent)!r} ({e.strerror}): pass a writable "
                          "RUNS_DIR") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _update(runs_root: str | os.PathLike, exercise_id: str, change) -> dict:
    path = progress_path(runs_root)
    with _locked(path):
        data = read_store(runs_root)
        entry = data[exercise_id] = entry_of(data, exercise_id)
        change(entry)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    return entry


def record_attempt(runs_root: str | os.PathLike, exercise_id: str, solved: bool) -> None:
    """One check of ``exercise_id`` ran; ``solved``: it passed (the first pass's time is kept)."""
    def change(entry):
        entry["checks"] += 1
        if solved and not entry["solved"]:
            entry["solved"], entry["first_solved"] = True, time.strftime("%Y-%m-%d %H:%M:%S")
    _update(runs_root, exercise_id, change)


def record_hint(runs_root: str | os.PathLike, exercise_id: str, available: int) -> int:
    """One more of ``exercise_id``'s ``available`` hints opened; returns the number of the one to show now (1 for
    the first; ``available + 1`` once all were shown, which opens nothing more)."""
    shown = []

    def change(entry):
        shown.append(entry["hints_opened"] + 1)
        entry["hints_opened"] = min(entry["hints_opened"] + 1, available)

    _update(runs_root, exercise_id, change)
    return shown[0]


def record_solution_opened(runs_root: str | os.PathLike, exercise_id: str) -> None:
    """The solution of ``exercise_id`` was shown."""
    _update(runs_root, exercise_id, lambda e: e.__setitem__("solution_opened", True))
