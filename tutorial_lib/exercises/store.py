"""What this learner has done with the exercises, kept beside the run directories (never in a notebook).

One JSON file, ``<runs folder>/exercises/progress.json``: per exercise id, the checks run, whether one passed (and
when first), how many of its hint levels were opened (a kernel restart keeps them readable again), whether the learner
was told what the solution would show, and whether it was shown. The kinds that go in rounds keep more: a
*predict, then run* exercise its current round (``round``: the variant the learner predicts for), every prediction
(``predictions``: the value, the variant, when, and whether it was made before that variant's measurement was shown),
the variants whose measurement was shown (``revealed``) and each measurement (``measurements``); a *find the bug*
exercise the failed run it asks about (``round``) and the answers given (``answers``); an *open challenge* each
attempt's measurements and the best one (``best``). ``prediction``, ``measured`` and ``best`` are the latest counted
prediction, the latest measurement and the best measurement, for ``progress()``'s columns. It is rewritten whole on
each event (a temporary file renamed over it), under an exclusive lock, so an interrupted kernel leaves the old or the
new file, never half of one, and two kernels never lose each other's update. ``progress()`` reads it into one table
beside every exercise that exists.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import time
from pathlib import Path

from ..errors import ConfigError
from ..runs.rundir import default_runs_root

FILE = Path("exercises") / "progress.json"
NUMBER = (int, float)
TYPES = {"checks": int, "solved": bool, "first_solved": str, "hints_opened": int, "solution_asked": bool,
         "solution_opened": bool, "round": dict, "revealed": list, "predictions": list, "measurements": list,
         "answers": list, "prediction": NUMBER, "measured": NUMBER, "best": NUMBER}
DEFAULTS = {"checks": 0, "solved": False, "first_solved": None, "hints_opened": 0, "solution_asked": False,
            "solution_opened": False, "round": None, "revealed": [], "predictions": [], "measurements": [],
            "answers": [], "prediction": None, "measured": None, "best": None}
# progress()'s columns: prediction (predict, then run), measured (that and a challenge), best (a challenge)
SHOWN = ("checks", "solved", "first_solved", "hints_opened", "solution_opened", "prediction", "measured", "best")


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
    entry = copy.deepcopy(DEFAULTS)  # its lists are the entry's own, never the defaults'
    if isinstance(found, dict):
        entry.update({k: v for k, v in found.items() if k in TYPES and isinstance(v, TYPES[k])
                      and not (TYPES[k] is NUMBER and isinstance(v, bool))})
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


def record_hint(runs_root: str | os.PathLike, exercise_id: str, levels: int, level: int | None = None) -> int:
    """Open a hint of ``exercise_id`` (it has ``levels``) and return the level to show.

    Args:
        level: the level asked for (1 ... ``levels``: an earlier one is read again, a later one is opened), or
            ``None``: the next one not opened yet (the last level again once every level is open).

    Returns:
        The level to show; the record keeps the highest level ever opened (``hints_opened``).
    """
    shown = []

    def change(entry):
        opened = min(entry["hints_opened"], levels)
        shown.append(level if level is not None else min(opened + 1, levels))
        entry["hints_opened"] = max(opened, shown[0])

    _update(runs_root, exercise_id, change)
    return shown[0]


def record_solution_asked(runs_root: str | os.PathLike, exercise_id: str) -> bool:
    """The learner asked for the solution of ``exercise_id``: returns ``True`` when they had been told before what it
    shows (show it now, and record it opened), ``False`` on the first request (record that they were told)."""
    told = []

    def change(entry):
        told.append(entry["solution_asked"] or entry["solution_opened"])
        entry["solution_asked"] = True
        if told[0]:
            entry["solution_opened"] = True

    _update(runs_root, exercise_id, change)
    return told[0]


def now() -> str:
    """The local time as the record keeps it (``"2026-12-05 14:03:07"``)."""
    return time.strftime("%Y-%m-%d %H:%M:%S")


def update(runs_root: str | os.PathLike, exercise_id: str, change) -> dict:
    """Apply ``change(entry)`` to ``exercise_id``'s record under the store's lock and write the store (atomically);
    returns a copy of the entry as written. For the kinds that keep more than a count (``predicting``, ``bugs``,
    ``challenges``): a change that reads the entry and writes it back happens whole, between two kernels' changes.

    Raises:
        ConfigError: the exercises' folder cannot be written, or the store is not readable JSON.
    """
    return copy.deepcopy(_update(runs_root, exercise_id, change))


def record_checked(runs_root: str | os.PathLike, exercise_id: str, solved: bool, change=None) -> dict:
    """``record_attempt`` and ``change(entry)`` (what the attempt measured) in one update; returns the entry."""
    def both(entry):
        entry["checks"] += 1
        if solved and not entry["solved"]:
            entry["solved"], entry["first_solved"] = True, now()
        if change is not None:
            change(entry)
    return update(runs_root, exercise_id, both)
