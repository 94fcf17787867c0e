"""Every exception the library raises, under one base class.

Modelled on papermill's ``exceptions.py``: structured attributes for programs, a readable
``__str__`` for people. ``ConfigError`` is raised *before* anything is launched;
``LaunchError`` and its subclasses describe a job that ran and failed. A ``LaunchError`` carries the
``RankFailure`` torchrun's files tell (defined with the reader that finds it, ``tutorial_lib.torchrun.root_cause``,
and importable from here) and reads tracebacks and stack dumps with ``tutorial_lib.torchrun.stacks``.
"""

from __future__ import annotations

from pathlib import Path

from .torchrun.root_cause import RankFailure
from .torchrun.stacks import last_meaningful_line, places, without_tracebacks

__all__ = ["ConfigError", "JobWaitTimeout", "LaunchError", "LaunchTimeout", "MetricsError", "RankFailure", "SlurmError",
           "SlurmUnavailable", "TutorialError"]


class TutorialError(Exception):
    """Base class of every error raised by ``tutorial_lib``."""


class ConfigError(TutorialError, ValueError):
    """Bad input, detected before any process is started.

    The message names the parameter, the bad value and what to do instead.
    """


class MetricsError(TutorialError):
    """Metrics or memory samples that a run should have written are missing or unreadable."""


class SlurmError(TutorialError):
    """A SLURM command failed, or the local SLURM cluster could not be started or stopped.

    Attributes:
        command: the argv that failed (``[]`` when no command is to blame).
        returncode: its exit status, or ``None``.
        stderr: what it printed on stderr (or the daemon's last log lines), stripped.
    """

    def __init__(self, message: str, *, command: list[str] | None = None, returncode: int | None = None,
                 stderr: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.command = list(command or [])
        self.returncode = returncode
        self.stderr = stderr

    def __str__(self) -> str:
        lines = [self.message]
        if self.stderr and self.stderr not in self.message:
            lines += ["", *("  " + line for line in self.stderr.splitlines()[-15:])]
        return "\n".join(lines)


class SlurmUnavailable(SlurmError):
    """The local SLURM cluster cannot run on this machine (not root, or slurm-wlm is not installed); the message
    says what to install or run instead."""


class JobWaitTimeout(SlurmError):
    """A SLURM job did not reach the awaited state in time.

    Attributes (besides ``SlurmError``'s): job_id; last_state: the job's state at the last look (a ``JobState``
    value, or ``None`` if the job was gone); reason: its pending reason then; timeout_s: the limit, in seconds.
    """

    def __init__(self, message: str, *, job_id: int, last_state: str | None, reason: str, timeout_s: float) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.last_state = last_state
        self.reason = reason
        self.timeout_s = timeout_s


class LaunchError(TutorialError):
    """A launched job failed: a rank raised, crashed, or torchrun itself failed.

    Attributes:
        run_dir: the run directory with the logs (``logs/``), metrics and ``command.txt``.
        command: the argv that was run.
        returncode: torchrun's exit code.
        failure: the root-cause ``RankFailure`` (first rank that failed), if one could be found.
        output_tail: the last lines of the combined output, for when no rank is to blame.
        stacks: ``{rank: text}``: the Python stack of every other rank that was still running when it was
            stopped (torchrun's SIGTERM after the failure; every rank prints it with ``faulthandler``, set up by
            ``tutorial_lib/child/rank_runner.py``, which runs each rank's script).
            After a collective timeout the rank that timed out is the *waiting* one: the culprit is the rank
            whose stack is not in a collective.
        where: ``{rank: Place}``: where each of those stacks was (``tutorial_lib.torchrun.stacks.Place``: the
            innermost frame of the script's own code, ``.own``, and the innermost frame overall, ``.innermost``, each a
            ``Frame`` with ``file``, ``line`` and ``function``; ``str()``: ``"train.py:12 in main"``).
        output: every line of ``output.log`` as the launcher wrote it (labelled, ``tutorial_lib.torchrun.output_lines``),
            held in memory: the doctor reads these, not the file (``[]`` for an error the launcher did not raise).
        job: the SLURM job of a launch on SLURM (``tutorial_lib.slurm.commands.SlurmJob``: its id, final state
            and pending reason, nodes, each node's ranks), else ``None``.
        diagnosis: the doctor's report (``tutorial_lib.diagnosis.report.Diagnosis``), made once when the launch failed, from
            the ranks' evidence: ``tl.diagnose(error)`` returns it without reading the run directory again (``None``
            for an error the launcher did not raise).
        headline: the summary's first part as a gettext message (``tutorial_lib.i18n.Message``), which the live view
            words in ``tl.language()``; ``None``: it shows ``summary``. ``summary`` and ``str(error)`` stay English.
    """

    def __init__(
        self,
        summary: str,
        *,
        run_dir: Path,
        command: list[str],
        returncode: int | None,
        failure: RankFailure | None = None,
        output_tail: list[str] | None = None,
        stacks: dict[int, str] | None = None,
        job: object | None = None,
        headline: object | None = None,
        output: list[str] | None = None,
    ) -> None:
        super().__init__(summary)
        self.summary = summary
        self.run_dir = Path(run_dir)
        self.command = list(command)
        self.returncode = returncode
        self.failure = failure
        self.output_tail = list(output_tail or [])
        self.stacks = dict(stacks or {})
        self.where = places(self.stacks)
        self.job = job
        self.headline = headline
        self.output = output if output is not None else []  # the launcher's list, not copied
        self.diagnosis = None

    @property
    def rank(self) -> int | None:
        """Global rank of the root-cause failure, or ``None``."""
        return self.failure.rank if self.failure else None

    @property
    def exit_code(self) -> int | None:
        """Exit code of the root-cause rank, or ``None``."""
        return self.failure.exit_code if self.failure else None

    @property
    def cause(self) -> str:
        """One line that says what went wrong, for a cell or a status line; ``""`` when the run left nothing.

        The exception line of the root-cause traceback; else, for a rank that exited with a code of its own and
        no traceback (``sys.exit(3)``), ``"exited with code 3 without a traceback"`` and its last line; else (a rank
        killed by a signal writes no traceback: NCCL's watchdog abort, the OOM killer) the last meaningful line of
        that rank's log; else of torchrun's output. Faulthandler's frame lines and its "Extension modules" list are
        skipped. Never raises, whatever is empty.
        """
        failure = self.failure
        if failure is not None and not (failure.traceback or "").strip() and (failure.exit_code or 0) > 0:
            last = last_meaningful_line(failure.log_tail)
            said = f"; its last line was {last!r}" if last else ""
            return f"exited with code {failure.exit_code} without a traceback{said}"
        for lines in ((failure.traceback or "").splitlines() if failure else [], failure.log_tail if failure else [],
                      self.output_tail):
            line = last_meaningful_line(lines)
            if line:
                return line
        return ""

    def __str__(self) -> str:
        lines = [self.summary]
        if self.failure is not None:
            if self.failure.traceback:
                lines += ["", f"Root-cause traceback (rank {self.failure.rank}):", self.failure.traceback.rstrip()]
            # What the rank printed, less any traceback (the root-cause one is printed in full above).
            tail = list(self.failure.log_tail)
            if self.failure.traceback:
                tail = without_tracebacks(tail, inside=bool(tail) and tail[0][:1].isspace())
            while tail and not tail[-1].strip():
                tail.pop()  # the tail ends with what the rank said last
            if tail:
                lines += ["", f"Last lines of rank {self.failure.rank}'s log" +
                          (" (before its traceback):" if self.failure.traceback else ":")]
                lines += ["  " + line for line in tail[-10:]]
        elif self.output_tail:
            lines += ["", "Last lines of output:"] + ["  " + line for line in self.output_tail]
        if self.where and not isinstance(self, LaunchTimeout):
            lines += ["", "Where the other ranks were when they were stopped:"]
            lines += [f"  rank {rank}: {place}" for rank, place in sorted(self.where.items())]
        lines += ["", f"Run directory (full logs in logs/, rerun with command.txt): {self.run_dir}"]
        return "\n".join(lines)


class LaunchTimeout(LaunchError):
    """The job ran past its wall-clock ``timeout_s``, or made no progress for ``stall_timeout_s``, and was stopped.

    Attributes (besides ``LaunchError``'s):
        timeout_s: the limit that was exceeded, in seconds.
        limit: which one: ``"timeout_s"`` (wall clock since the launch) or ``"stall_timeout_s"``
            (no rank logged a new step for that long).
        last_steps: the last metric step each rank reported, ``{rank: step}`` (ranks that reported
            nothing are absent), which shows which rank stopped making progress.
        stacks: ``{rank: text}``: each rank's Python stack at the timeout, as ``faulthandler`` prints it
            (most recent call first), for ranks that catch SIGUSR1 (every rank the launcher starts: its runner
            registers ``faulthandler`` before the script runs); empty where none answered.
        where: ``{rank: Place}``: where each rank's main thread was (see ``LaunchError``).
    """

    def __init__(self, summary: str, *, timeout_s: float, last_steps: dict[int, int],
                 stacks: dict[int, str] | None = None, limit: str = "timeout_s", **kwargs) -> None:
        super().__init__(summary, stacks=stacks, **kwargs)
        self.timeout_s = timeout_s
        self.limit = limit
        self.last_steps = dict(last_steps)

    def __str__(self) -> str:
        text = super().__str__()
        if not self.stacks:
            return text
        lines = ["", "Python stack of every rank at the timeout (most recent call first):"]
        for rank, stack in sorted(self.stacks.items()):
            lines += [f"rank {rank}:"] + ["  " + line for line in stack.splitlines()]
        return text + "\n" + "\n".join(lines)
