"""How a launch stands, as the launcher tells the live view: ``Queued`` while a batch job waits, ``Outcome`` once it
ended. Values only; ``tutorial_lib.launcher.live`` draws them."""

from __future__ import annotations

from dataclasses import dataclass

from ..i18n import _, render
from ..runs.rundir import RunStatus


@dataclass(frozen=True)
class Outcome:
    """How a launch ended, as the launcher tells the live view (``LiveView.finish``).

    Attributes:
        status: ``RunStatus`` (the same value ``run.json`` records).
        elapsed_s: seconds from the launch to its end.
        cause: what ended a run that did not finish, in a few words, a gettext message worded when shown
            (``tutorial_lib.i18n.Message``; a plain string is shown as it is): the launcher's headline of a failure
            (``"t.py failed on rank 1 (exit code 1)"``), ``"timed out after 30 s"``, ``"interrupted"``,
            ``"stopped by RuntimeError"``; ``""`` for a finished run.
    """

    status: RunStatus
    elapsed_s: float
    cause: object = ""

    @property
    def failed(self) -> bool:
        """Whether the run did not finish (failed, timed out, interrupted or stopped)."""
        return self.status != RunStatus.FINISHED

    @property
    def text(self) -> str:
        """The one-line status the view shows: ``"finished in 4.2 s"`` or ``"failed: <cause>"``, in ``tl.language()``."""
        return (_("failed: {cause}", cause=render(self.cause)) if self.failed
                else _("finished in {elapsed_s:.1f} s", elapsed_s=self.elapsed_s))


@dataclass(frozen=True)
class Queued:
    """A job waiting in the batch system's queue with no rank started (SLURM's ``PENDING``): what the launcher tells
    the view (``LiveView.set_queued``) until the job runs, so that the view says "pending" with the reason.

    Attributes:
        job_id: the scheduler's id of the job.
        reason: why it waits, in the scheduler's own code (squeue's ``%r``: ``"Resources"``, ``"Priority"``);
            ``""`` while it has given none.
    """

    job_id: int
    reason: str = ""
