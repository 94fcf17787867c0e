"""torchrun's attempt folders, found in one place.

torchrun (``--log-dir LOG_DIR``) writes every start of the worker group, the first and each restart
(``--max-restarts``), into its own folder: ``LOG_DIR/<run id>/attempt_<N>/<local_rank>/``, holding the rank's
``stdout.log`` and ``stderr.log`` and, when the rank's ``@record`` caught an exception, ``error.json``
(https://pytorch.org/docs/stable/elastic/errors.html). ``attempts`` is the only function that looks for those
folders; every reader of an attempt (the root cause, the stacks in the ranks' logs, the doctor, the notebooks'
``rank_errors``) asks it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..child.protocol import EXIT_RECORD, RANK_RECORD

ERROR_FILE = "error.json"


@dataclass(frozen=True)
class Attempt:
    """One attempt folder: ``number`` (0: the first start, 1: the first restart, ...) and its ``path``."""

    number: int
    path: Path

    def rank_dirs(self) -> dict[int, Path]:
        """``{local_rank: folder}`` of every rank this attempt started."""
        return {int(p.name): p for p in self.path.iterdir() if p.name.isdigit() and p.is_dir()}

    def error_files(self) -> dict[int, Path]:
        """``{local_rank: error.json}`` of the ranks that wrote one (``@record`` caught an exception)."""
        return {rank: folder / ERROR_FILE for rank, folder in self.rank_dirs().items()
                if (folder / ERROR_FILE).is_file()}

    def stderr_logs(self) -> dict[int, Path]:
        """``{local_rank: stderr.log}`` of the ranks whose log exists."""
        return {rank: folder / "stderr.log" for rank, folder in self.rank_dirs().items()
                if (folder / "stderr.log").is_file()}


def failed_attempt(log_dir: str | os.PathLike, recovered: bool = False) -> Attempt | None:
    """The attempt whose failure is to be explained: the last one; for a run that finished after torchrun restarted
    the group (``recovered``), the one before the last (else the last in which a rank wrote an error file)."""
    found = attempts(log_dir)
    if recovered and len(found) >= 2:
        return found[-2]
    return last_attempt(log_dir, with_error_files=recovered)


def read_exit_record(rank_dir: str | os.PathLike) -> dict | None:
    """How the rank of torchrun's rank folder ``rank_dir`` ended, as the workbook's rank runner recorded it when
    it left (``{"rank", "local_rank", "exit_code", "time_ns"}``, ``child/protocol.py``'s ``EXIT_RECORD``); ``None``
    when there is none (a rank killed by a signal, or a script torchrun ran without the rank runner)."""
    try:
        data = json.loads((Path(rank_dir) / EXIT_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("exit_code"), int) else None


def read_rank_record(rank_dir: str | os.PathLike, local_rank: int) -> int | None:
    """The global rank of torchrun's rank folder ``rank_dir`` (that of local rank ``local_rank``), as the workbook's
    rank runner recorded it before the script ran (``child/protocol.py``'s ``RANK_RECORD``); ``None`` when there is
    none yet (the rank has not started, or torchrun ran a script without the rank runner) or it names another local
    rank."""
    try:
        data = json.loads((Path(rank_dir) / RANK_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("local_rank") != local_rank:
        return None
    rank = data.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None


def read_log_tail(path: str | os.PathLike, max_bytes: int = 256 * 1024) -> list[str]:
    """The last ``max_bytes`` of a rank's log (``stderr.log``, ``stdout.log``) as lines; ``[]`` if it cannot be read.
    The end is what says how a rank ended (its traceback, faulthandler's report), also after 100,000 lines."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    return lines[1:] if size > max_bytes else lines  # the first line may be cut


def attempts(log_dir: str | os.PathLike) -> list[Attempt]:
    """Every attempt folder under ``log_dir`` (torchrun's ``--log-dir``; any run id), in attempt order; ``[]`` when
    there is none (the folder is missing, or torchrun failed before it started a worker)."""
    found = [Attempt(int(p.name.removeprefix("attempt_")), p) for p in Path(log_dir).glob("*/attempt_*")
             if p.name.removeprefix("attempt_").isdigit() and p.is_dir()]
    return sorted(found, key=lambda a: (a.number, str(a.path)))


def last_attempt(log_dir: str | os.PathLike, with_error_files: bool = False) -> Attempt | None:
    """The last attempt under ``log_dir`` (``None``: none); ``with_error_files``: the last one in which a rank wrote
    an error file (a run that restarted and then finished: the attempt that failed)."""
    found = [a for a in attempts(log_dir) if not with_error_files or a.error_files()]
    return found[-1] if found else None


def last_attempt_error_files(log_dir: str | os.PathLike, failed_attempt: bool = False) -> dict[int, Path]:
    """``{local_rank: error.json}`` of torchrun's last attempt (``failed_attempt``: of the last one that has any)."""
    attempt = last_attempt(log_dir, with_error_files=failed_attempt)
    return attempt.error_files() if attempt is not None else {}


def read_error_file(path: str | os.PathLike) -> str:
    """The traceback (or message) in a torchrun error file written by ``@record``; ``""`` if it cannot be read."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return ""
    message = data.get("message", data)
    if isinstance(message, dict):
        extra = message.get("extraInfo", {})
        return extra.get("py_callstack") or message.get("message", "")
    return str(message)
