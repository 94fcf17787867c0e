"""What a check found (``Verdict``) and a hint or solution as shown (``Hint``), worded in the language in use."""

from __future__ import annotations

import html
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from ..diagnosis.doctor import Diagnosis
from ..i18n import Message, _, render
from ..runs.rundir import LOGS, OUTPUT_LOG
from .core import HIDDEN, REGISTRY, Difference, Spec

DOCTOR_LINES = 12  # the doctor's report in a verdict: its first lines (the whole report is in the run directory)


@dataclass
class Verdict:
    """What a check found. A notebook shows it (text, or HTML in JupyterLab); programs read its fields.

    Attributes:
        id: the exercise (``"01.1"``).
        solved: whether every comparison held.
        differences: what differs (empty when solved, and when the launch failed).
        failure: the doctor's report when the learner's launch failed (``solved`` is then False), else ``None``.
        problem: why nothing could be checked (no script written yet, no answer given, an answer in a form the
            check does not read, a script that is not the learner's own), else ``None``.
        run_dirs: the run directories the check launched (the first is the learner's).
        answer: a value exercise's answer as given.
        attempted: ``False`` when there was nothing to check (no answer given, no script written, a form the check
            does not read, a script refused before launching): not counted as a check in the progress record.
        warning: why the attempt could not be recorded (an unwritable or damaged progress file), else ``None``.
        reading: how a value answer was read when that is worth saying (a unit converted, a precision), else ``None``.
        report: what the check measured and shows whatever the outcome (a prediction beside the measurement and what
            explains it; a challenge's measurements beside its baseline's; which parts of a found bug were right).
        next_step: what to do next (the next round's variant, how to answer), shown last, or ``None``.
    """

    id: str
    solved: bool
    differences: list[Difference] = field(default_factory=list)
    failure: Diagnosis | None = None
    problem: Message | None = None
    run_dirs: list[Path] = field(default_factory=list)
    answer: object = None
    attempted: bool = True
    warning: Message | None = None
    reading: Message | None = None
    report: list[Message] = field(default_factory=list)
    next_step: Message | None = None

    def lines(self) -> list[str]:
        """The verdict as a few lines in the language in use (what ``print`` and the notebook show)."""
        spec = REGISTRY[self.id]
        head = _("Exercise {id} ({title}): ", id=self.id, title=_(spec.title))
        out = [head + (_("solved") if self.solved else _("not solved yet"))]
        if self.reading is not None:
            out.append("  " + render(self.reading))
        out += ["  " + render(line) for line in self.report]
        if not self.solved:
            if self.problem is not None:
                out.append("  " + render(self.problem))
            if not self.attempted:
                out.append("  " + _("(not counted as an attempt)"))
            if self.failure is not None:
                out += ["  " + line for line in _stuck(self.failure)]
                out.append("  " + _("the launch failed; the doctor:"))
                out += ["    " + line for line in _doctor_lines(self.failure, spec)[:DOCTOR_LINES]]
                if not self.run_dirs or self.failure.run_dir != self.run_dirs[0]:  # else the line below names it
                    log = self.failure.run_dir / OUTPUT_LOG  # a replica group's start (15.1) has its ranks' logs only
                    out.append("  " + _("full log: {path}", path=log if log.exists() else self.failure.run_dir / LOGS))
            out += _difference_lines(self.differences)
            out.append("  " + _("a hint, when you want one: ex{n}.hint()", n=spec.number))
        if self.run_dirs and (self.run_dirs[0] / OUTPUT_LOG).exists():
            out.append("  " + _("run directory: {path} (output.log: every line of every rank)",
                                path=self.run_dirs[0]))
        elif self.run_dirs:  # replica groups (15.1): each start's logs in group<G>/attempt<A>/logs/
            out.append("  " + _("run directory: {path} (each replica group's start: group<G>/attempt<A>/, its ranks' "
                                "logs in logs/)", path=self.run_dirs[0]))
        if self.warning is not None:
            out.append("  " + render(self.warning))
        if self.next_step is not None:
            out.append("  " + render(self.next_step))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.solved else "#9a6700"
        body = "<br>".join(html.escape(line).replace("  ", "&nbsp;&nbsp;") for line in self.lines())
        return f'<div style="border-left: 4px solid {colour}; padding-left: 8px; font-family: monospace">{body}</div>'


def _difference_lines(differences: list[Difference]) -> list[str]:
    out = []
    for d in differences:
        fields = dict(what=render(d.what), expected=_show(d.expected), measured=_show(d.measured), rank=d.rank)
        if d.expected is HIDDEN:
            out.append("  " + _("{what}: {measured} is not it", **fields))
        elif d.rank is not None:
            out.append("  " + _("{what} on rank {rank}: expected {expected}, measured {measured}", **fields))
        else:
            out.append("  " + _("{what}: expected {expected}, measured {measured}", **fields))
        if d.note is not None:
            out.append("    " + render(d.note))
    return out


def _doctor_lines(failure: Diagnosis, spec: Spec) -> list[str]:
    """The doctor's report as its rows, aligned; for a cause whose fix is what the exercise asks for
    (``Spec.withheld_fixes``), the fix row says where it is instead (the hints)."""
    rows = failure.rows()
    if failure.cause_id in spec.withheld_fixes:
        fix = _("fix")
        rows = [(label, _("not shown here: it is what exercise {id} asks you to find (ex{n}.hint() when you want "
                          "it)", id=spec.id, n=spec.number) if label == fix else text) for label, text in rows]
    width = max(_width(label) for label, _text in rows)
    return [label + " " * (width - _width(label) + 2) + text for label, text in rows]


def _width(text: str) -> int:
    """Columns ``text`` takes in a terminal: a CJK character (or full-width sign) takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _stuck(failure: Diagnosis) -> list[str]:
    """A launch stopped at its limit: where each rank was stuck, said before the doctor's report (which may be long)."""
    if failure.timeout_s is None:
        return []
    timeout_s = format(failure.timeout_s, "g")
    out = [_("your script ran past the check's limit of {timeout_s} s per launch and was stopped", timeout_s=timeout_s)]
    if not failure.where:
        return out + [_("no rank's Python stack could be read: the doctor's report below says what each rank logged")]
    return out + [_("rank {rank} was stuck at {place}", rank=rank, place=place)
                  for rank, place in sorted(failure.where.items())]


def _show(value: object) -> str:
    if isinstance(value, Message):
        return render(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)) and len(value) > 12:
        return f"{list(value[:12])}... ({len(value)})"
    return str(value)


@dataclass(frozen=True)
class Hint:
    """A hint or a solution, as shown: a heading line and its text (``code``: shown as a listing), and a line after it
    (``footer``: how to read another hint, or to see the solution), if any."""

    heading: str
    text: str
    code: bool = False
    footer: str = ""

    def __str__(self) -> str:
        return "\n".join(t for t in (self.heading, self.text, self.footer) if t)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        body = f"<pre>{html.escape(self.text)}</pre>" if self.code else f"<p>{html.escape(self.text)}</p>"
        footer = f"<p><i>{html.escape(self.footer)}</i></p>" if self.footer else ""
        return f"<b>{html.escape(self.heading)}</b>{body}{footer}"
