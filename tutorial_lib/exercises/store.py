"""What this learner has done with the exercises, kept beside the run directories (never in a notebook).

One JSON file, ``<runs folder>/exercises/progress.json``: per exercise id, the checks run, whether one passed (and
when first), the hints opened and whether the solution was shown. It is rewritten whole on each event (a temporary
file renamed over it), so an interrupted kernel leaves the old or the new file, never half of one. ``progress()``
reads it into one table beside every exercise that exists.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..errors import ConfigError
from ..runs.rundir import default_runs_root

FILE = Path("exercises") / "progress.json"


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


def _update(runs_root: str | os.PathLike, exercise_id: str, change) -> dict:
    data = read_store(runs_root)
    entry = data.setdefault(exercise_id, {"checks": 0, "solved": False, "first_solved": None, "hints_opened": 0,
                                          "solution_opened": False})
    change(entry)
    path = progress_path(runs_root)
    path.parent.mkdir(parents=True, exist_ok=True)
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


def record_hint(runs_root: str | os.PathLike, exercise_id: str) -> int:
    """One more hint of ``exercise_id`` opened; returns how many have been opened now (1 for the first)."""
    return _update(runs_root, exercise_id, lambda e: e.__setitem__("hints_opened", e["hints_opened"] + 1))["hints_opened"]


def record_solution_opened(runs_root: str | os.PathLike, exercise_id: str) -> None:
    """The solution of ``exercise_id`` was shown."""
    _update(runs_root, exercise_id, lambda e: e.__setitem__("solution_opened", True))
