"""The doctor's report: ``Diagnosis``, what went wrong in a run in a few lines (``tutorial_lib.diagnosis.doctor`` fills it)."""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from ..i18n import Joined, Message, _, ngettext, render
from ..torchrun.stacks import Frame, Place
from .causes import CauseId, cause_message

# The functions of a collective (or of backward, where DDP's all-reduces run): a rank stopped there was in one. A
# native abort there, thrown by gloo's own checks, is a mismatched collective even where the message is gone (torch
# 2.8 prints no "doesn't match").
COLLECTIVE_FUNCTION = re.compile(r"all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|all_to_all\w*|"
                                 r"reduce|gather|scatter|_engine_run_backward|run_backward")


def in_collective(place: Place) -> bool:
    """Whether ``place``'s innermost frame is a collective's function (``COLLECTIVE_FUNCTION``)."""
    return COLLECTIVE_FUNCTION.fullmatch(place.innermost.function) is not None


def _elsewhere(place: Place) -> bool:
    """Whether a rank at ``place`` was outside torch.distributed: not in a collective, no frame of a file or function
    named for it."""
    return not in_collective(place) and not any("distributed" in f.name or "distributed" in f.function
                                                for f in place.frames)


@dataclass
class Diagnosis:
    """What went wrong in a run, in a few lines (``str(d)``; a table in a notebook).

    Attributes:
        run_dir: the run directory.
        failed: whether the run failed (False for a run that finished, and for one stopped on request: cause
            ``"interrupted"`` (Ctrl-C, a kernel interrupt) or ``"stopped by the launching process"``, from run.json).
        rank: global rank that failed first (``None``: no rank is to blame, e.g. torchrun itself failed).
        exit_code: that rank's exit code (negative: killed by signal ``-exit_code``), or ``None``.
        signal: the signal's name for a negative exit code (``"SIGKILL"``), else ``None``.
        error: the exception line of the root-cause traceback (``"RuntimeError: ..."``), or ``""``.
        traceback_tail: the last lines of the root-cause traceback (or of the rank's log).
        last_steps: ``{rank: last step}`` from the metrics JSON, else from the printed lines ``loss_pattern`` read
            (ranks that logged nothing are absent).
        where: ``{rank: Place}``: where each rank other than the failed one was when it was stopped (its innermost
            frames: ``tutorial_lib.torchrun.stacks.Place``, ``str()``: ``"train.py:12 in main"``), from the error's
            stacks, ``run.json`` or the stacks the ranks printed (else empty).
        cause_id: the suspected cause, one value (``causes.CauseId``): a known message's (``CAUSES``), or the
            doctor's own conclusion: ``PYTHON_EXCEPTION``, ``KILLED_BY_SIGNAL``, ``EXITED_WITHOUT_TRACEBACK``
            (``sys.exit(3)``, ``os._exit(3)``), ``DIED_WITHOUT_ERROR`` (no traceback, no exit code: its peers lost the
            connection), ``HANG_WALL_CLOCK``, ``HANG_NO_PROGRESS`` (``stall_timeout_s``), ``SYNTAX_ERROR``,
            ``INTERRUPTED``, ``STOPPED``, ``SBATCH_REFUSED``, ``UNKNOWN``, or ``NONE`` for a run that finished.
        cause_fields: the values its name shows (``{"name": "RuntimeError"}``, ``{"signal": "SIGKILL"}``,
            ``{"code": 3}``). ``cause_text`` is the name to show (worded when shown), ``cause`` its English
            (``"Python exception (RuntimeError)"``, ``"killed by SIGKILL"``, ``"out of memory"``).
        evidence: the line that points to the cause (as the logs say it: English).
        fix_text: one line on what to do, with the notebook section that shows it, worded when shown (``fix``: its
            English). Cause and fix are gettext messages (``tutorial_lib.i18n``): ``str(d)`` and the notebook's table
            show them in ``tl.language()``.
        timeout_s: the limit a ``LaunchTimeout`` exceeded, seconds (``None`` for other runs).
        limit: which one, ``"timeout_s"`` or ``"stall_timeout_s"`` (``""`` for other runs).
        recovered: the run finished (``failed`` is False) after torchrun restarted the group
            (``max_restarts``); the other fields then describe the failure it recovered from.
        raised: every rank that raised an exception of its own (not a lost connection), in rank order; more than
            one: the same code failed on several ranks, no peer's failure.
        signals: ``{rank: signal name}`` of every rank a fatal signal killed (``{0: "SIGFPE", 1: "SIGSEGV"}``).
        finished: the ranks whose script returned (exit code 0) while the others failed.
        stack: the Python stack faulthandler printed when a fatal signal killed the rank, as ``Frame`` values (most
            recent call first, the workbook's runner frames left out; the whole report is in the rank's log), else
            empty.
        submitted: ``False`` when the batch system refused the job at submission (run.json's status ``"refused"``):
            nothing ran, ``evidence`` is sbatch's message (``cause`` ``"sbatch refused the job"``).
    """

    run_dir: Path
    failed: bool
    rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    error: str = ""
    traceback_tail: list[str] = field(default_factory=list)
    last_steps: dict[int, int] = field(default_factory=dict)
    where: dict[int, Place] = field(default_factory=dict)
    cause_id: CauseId = CauseId.UNKNOWN
    cause_fields: dict[str, object] = field(default_factory=dict)
    evidence: str = ""
    fix_text: Message | Joined = field(default_factory=lambda: Joined(()))
    timeout_s: float | None = None
    limit: str = ""
    recovered: bool = False
    raised: list[int] = field(default_factory=list)
    signals: dict[int, str] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)
    stack: list[Frame] = field(default_factory=list)
    submitted: bool = True

    def rows(self) -> list[tuple[str, str]]:
        """The report as (label, text) rows, in ``tl.language()`` (the evidence and error lines as logged)."""
        steps = _(", ").join(_("rank {rank}: {step}", rank=r, step=s) for r, s in sorted(self.last_steps.items()))
        cause, fix = render(self.cause_text), render(self.fix_text)
        if not self.submitted:  # sbatch refused the job: nothing ran, its message is the whole story
            return [(_("failed"), _("{run}: sbatch refused the job, so no SLURM job ran", run=self.run_dir.name)),
                    *((_("sbatch said") if i == 0 else "", line) for i, line in enumerate(self.evidence.splitlines())),
                    (_("output.log"), _("empty: no step ran (the job was never submitted)")),
                    (_("suspected cause"), cause), (_("fix"), fix)]
        if self.cause_id in (CauseId.INTERRUPTED, CauseId.STOPPED):  # stopped on request: no rank failed
            stopped = (_("{run} was interrupted ({evidence}); no rank had failed", run=self.run_dir.name,
                         evidence=self.evidence) if self.cause_id == CauseId.INTERRUPTED else
                       _("{run} was stopped by the process that launched it ({evidence}); no rank had failed",
                         run=self.run_dir.name, evidence=self.evidence))
            rows = [(_("stopped"), stopped), (_("last step"), steps or _("no rank logged a step"))]
            rows += [(_("rank {rank} was in", rank=r), str(w)) for r, w in sorted(self.where.items())]
            return rows + [(_("suspected cause"), cause), (_("fix"), fix)]
        if not self.failed and not self.recovered:
            return [(_("run"), _("{run} finished without error", run=self.run_dir.name)),
                    (_("last step"), steps or _("none"))]
        run, failed = self.run_dir.name, _("failed")
        who = _("rank {rank}", rank=self.rank) if self.rank is not None else _("no rank (torchrun or the launch itself)")
        code = "" if self.exit_code is None else _(", exit code {code}", code=self.exit_code)
        code += f" ({self.signal})" if self.signal else ""
        if self.recovered:
            rows = [(_("recovered"), _("{run} finished after torchrun restarted the group", run=run)),
                    (failed, _("before the restart: {who} first{code}", who=who, code=code))]
        elif self.timeout_s is not None:
            which = (_("no-progress limit, stall_timeout_s") if self.limit == "stall_timeout_s"
                     else _("wall-clock limit"))
            timeout_s = f"{self.timeout_s:g}"
            rows = [(failed, _("{run}: stopped at the {which} ({timeout_s} s), no rank had failed", run=run,
                               which=which, timeout_s=timeout_s))]
        elif self.cause_id == CauseId.RANK_FINISHED:
            rows = [(failed, _("{run}: {who} returned (exit code 0) while the others waited for it", run=run,
                               who=who))]
        else:
            rows = [(failed, _("{run}: {who} first{code}", run=run, who=who, code=code))]
        if self.error:
            rows.append((_("error"), clip(self.error)))
        if len(self.raised) > 1:
            rows.append((_("raised"), _("ranks {ranks} each raised an error of their own",
                                        ranks=", ".join(map(str, self.raised)))))
        others = {r: name for r, name in self.signals.items() if r != self.rank}
        if others:
            rows.append((_("also killed"),
                         _(", ").join(_("rank {rank} by {signal}", rank=r, signal=name) for r, name in others.items())))
        if self.finished and self.cause_id != CauseId.RANK_FINISHED:
            rows.append((_("finished"), ngettext("rank {ranks} returned (exit code 0)",
                                                 "ranks {ranks} returned (exit code 0)", len(self.finished),
                                                 ranks=", ".join(map(str, self.finished)))))
        for i, frame in enumerate(self.stack[:4]):
            rows.append((_("stack") if i == 0 else "", str(frame)))
        rows.append((_("last step"), steps or _("no rank logged a step")))
        for r, w in sorted(self.where.items()):
            elsewhere = self.cause_id == CauseId.COLLECTIVE_TIMEOUT and r != self.rank and _elsewhere(w)
            rows.append((_("rank {rank} was in", rank=r),
                         str(w) + (_(": never reached the collective the others waited in") if elsewhere else "")))
        shown = self.evidence and self.evidence != self.error  # the error line is shown once, above
        rows.append((_("suspected cause"), cause + (_(": {evidence}", evidence=clip(self.evidence)) if shown else "")))
        rows.append((_("fix"), fix))
        return rows

    @property
    def cause_text(self) -> Message:
        """The suspected cause to show, worded in ``tl.language()`` (``causes.cause_message``)."""
        return cause_message(self.cause_id, **self.cause_fields)

    @property
    def cause(self) -> str:
        """The suspected cause in English (``str(cause_text)``): what programs and the notebooks' asserts read."""
        return str(self.cause_text)

    @property
    def fix(self) -> str:
        """The fix in English (``str(fix_text)``)."""
        return str(self.fix_text)

    def __str__(self) -> str:
        rows = self.rows()
        width = max(map(_width, (label for label, _text in rows)))
        return "\n".join(label + " " * (width - _width(label) + 2) + text for label, text in rows)

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython's text form: the rows, not a dataclass repr
        printer.text(str(self))

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
                       f"<td style='text-align:left'>{html.escape(text)}</td></tr>" for label, text in self.rows())
        return f"<table>{body}</table>"


def _width(text: str) -> int:
    """Columns ``text`` takes in a terminal: a CJK character (or full-width sign) takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def clip(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."
