"""``run.json``: how a launch ended, one schema, written in one place.

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
                      ``tutorial_lib.warm``) or ``"cold"`` (each imported torch itself)
====================  =====================================================================================
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

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
