"""The job interface: what every launch is to the one run loop (``tutorial_lib.launcher.run.run_job``), whether its
ranks run on this machine under torchrun (``job.RunningJob``) or on a SLURM cluster's nodes
(``slurm_job.SubmittedJob``).

The loop calls, in this order: ``start`` once, then ``wait`` until the job has ended. If either raised: ``not_started``
when the job never ``started`` (nothing runs: the exception goes on), else ``stop`` (asking the ranks for their stacks
first at a limit; an interrupt or the job's own reason, such as a SLURM job that can never start, stops it plainly),
``elapsed``, ``read_records`` (the last records, to the live view), then ``cannot_run``, and if it builds nothing the
timeout's error or the stopped outcome. Else ``elapsed``, ``read_records`` and the result, or the failure's error.
``close`` always, last. The error is built once, by
``tutorial_lib.launcher.outcome``'s builders, which ask the job (``told=job``) what it knows beyond torchrun's output:
its SLURM job (``slurm_job``), how it words a failure (``said_failure``) and a stop at a limit (``said_stopped``).
A local job knows nothing more: the defaults here are its answers.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from ..i18n import Message
from ..slurm.commands import SlurmJob
from ..torchrun.root_cause import RankFailure
from .outcome import when_stopped


class LimitReached(Exception):
    """A limit of the job was reached; ``limit`` names it (``"timeout_s"`` or ``"stall_timeout_s"``)."""

    def __init__(self, limit: str = "timeout_s") -> None:
        super().__init__(limit)
        self.limit = limit


@dataclass(frozen=True)
class Stopped:
    """What ``Job.stop`` did.

    Attributes:
        ranks_running: the ranks that were still running when it was stopped.
        stacks: ``{rank: text}``, each rank's Python stack when asked (``ask_for_stacks``), as ``faulthandler`` prints
            it; empty when not asked or none answered.
        returncode: the first node's exit code after the stop (``None``: not known here, as on SLURM).
        how: what the stop did, in English, for the ``[launcher] ...`` line of an interrupt (``"stopped torchrun and
            its workers (0 needed SIGKILL); nothing is left running"``).
    """

    ranks_running: list[int] = field(default_factory=list)
    stacks: dict[int, str] = field(default_factory=dict)
    returncode: int | None = None
    how: str = ""


class Job(abc.ABC):
    """One launch, as the run loop drives it (the module docstring gives the order of the calls).

    Attributes (set by the implementation):
        plan: the plan (``LaunchPlan`` or ``SlurmPlan``): ``spec``, ``script``, ``run_dir``, ``nodes``, ``device_plan``,
            ``node_log_dir(node)``, ``shape(start)``, ``cwd``.
        view: the live view (``live.make_view``); printer: the ``ThrottledPrinter`` the job's lines go through.
        pump: the job's ``OutputPump`` (its transcript, every rank's lines) once started, else ``None``.
        command: the argv that started it, as errors and results name it (torchrun's, or sbatch's).
        started_as: ``"warm"`` or ``"cold"``, how its ranks started (run.json's ``start``).
    """

    plan: object
    view: object
    pump: object | None = None
    command: list[str]
    started_as: str = "cold"

    @abc.abstractmethod
    def start(self) -> None:
        """Start the job (torchrun's agents here, ``sbatch`` on SLURM); called first, once.

        Raises:
            ConfigError: ``command.txt`` could not be written (nothing was started).
            SlurmError: sbatch refused the job.
        """

    @property
    @abc.abstractmethod
    def started(self) -> bool:
        """Whether ``start`` started (or submitted) the job: whether there is anything to stop."""

    @abc.abstractmethod
    def wait(self) -> dict[int, int]:
        """Stream the output, draw the view and watch the limits until the job has ended; each node's exit code.

        Raises:
            LimitReached: past ``timeout_s`` or ``stall_timeout_s`` (the job still runs: the loop stops it).
            Exception: the job's own reason to stop it (``cannot_run`` builds its error), or a failure to watch it.
        """

    @abc.abstractmethod
    def elapsed(self) -> float:
        """Seconds since the job was started (or submitted)."""

    @abc.abstractmethod
    def read_records(self) -> list[dict]:
        """The step records that arrived since the last call, for the live view."""

    @abc.abstractmethod
    def stop(self, ask_for_stacks: bool) -> Stopped:
        """Stop every process of the job (on SLURM: cancel it and wait until it has left the queue), after asking its
        ranks for their Python stacks when ``ask_for_stacks`` (at a limit). A second interrupt waits until the end."""

    @abc.abstractmethod
    def close(self) -> None:
        """On every path, last: read the last lines, close the files, show what the printer held back."""

    @property
    def rss_samples(self) -> list:
        """The memory samples the view's last figure draws (none: the ranks run where this process cannot look)."""
        return []

    @property
    def loss_pattern(self):
        """The pattern the job read the ranks' printed losses with (``LaunchResult.loss_pattern``); ``None``: none."""
        return None

    def not_started(self, exc: BaseException) -> None:
        """Called when ``start`` (or an interrupt during it) raised ``exc`` before the job ``started``: leave what a
        job that never ran leaves. A local job leaves nothing (``start`` stopped what it had started)."""

    def slurm_job(self) -> SlurmJob | None:
        """The SLURM job as last seen (``LaunchResult.job``, ``LaunchError.job``, run.json's ``slurm_job``)."""
        return None

    def said_failure(self, headline: Message, where: dict[int, str],
                     failure: RankFailure | None) -> tuple[Message, str]:
        """A failed job's headline (worded when shown) and summary (English), from the launcher's headline (the rank
        that failed first, or torchrun's failure) and where each stopped rank was (``{rank: "file:line in f"}``)."""
        return headline, f"{headline}{when_stopped(where)}"

    def said_stopped(self, headline: Message, summary: str) -> tuple[Message, str]:
        """A job stopped at a limit: its headline and summary, from the launcher's (the limit, every rank's place)."""
        return headline, summary

    def cannot_run(self, exc: BaseException, elapsed: float):
        """The error of a job stopped because it can never run as asked (``exc``, which ``wait`` raised), with its
        run.json and the view's outcome (``(LaunchError, RunRecord, Outcome)``); ``None``: ``exc`` is no such reason."""
        return None
