"""Find the bug (issue 44): a real failed run, its output without the doctor; the learner names the rank, the line and
the cause, and the answer is checked against what that run did.

An exercise of this kind is a ``FindTheBug`` record (``Spec.verify``): the failing program (a file of ``programs/``,
written into the exercise's folder as ``Spec.script_name``, so the lines a traceback names are lines of a file the
learner can open), the inputs a round may take (``Variants``: which rank fails, and how, follow from them), and the
short list of causes to pick from (the doctor's ``CauseId`` s). The rounds (``rounds``, kept in the progress store):

1. ``ex.check()`` with no answer launches the program on a fresh variant with the live view off (its failure box would
   name the rank and where the others were), then prints each rank's last lines from ``output.log``, rank-prefixed,
   without the workbook's own runner frames, says where the full log is, and lists the causes. The doctor's report
   is not shown: it is what the learner is asked to find;
2. ``ex.check(rank=1, line=17, cause="collective timeout")`` compares the answer with that run (``found_in``): the
   doctor's diagnosis of its run directory names the cause and the rank that failed first; for a hang (a collective
   timeout), the culprit is the rank the others waited for, the one torchrun stopped outside a collective, at the
   line its stack was at; for an error, the innermost line of the program in the failing rank's traceback (dynamo's
   ``from user code`` frames included). The verdict names each part that is wrong, nothing more. Solved when all
   three are right; the next ``ex.check()`` launches another variant.

The truth is read from the run every time it is needed, never kept in the record: an answer copied from an earlier
round is another run's, and fails where that run differs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..diagnosis.causes import CauseId
from ..diagnosis.doctor import diagnose
from ..diagnosis.report import in_collective
from ..errors import ConfigError, LaunchError
from ..i18n import Message, render
from ..runs.run_logs import read_output_log
from ..torchrun.formats import ANY_FRAME
from ..torchrun.output_lines import rank_lines
from . import rounds, store
from .core import MISSING, Context, Spec
from .observing import Variants
from .verdict import Verdict

HANGS = (CauseId.COLLECTIVE_TIMEOUT, CauseId.HANG_WALL_CLOCK, CauseId.HANG_NO_PROGRESS)
RUNNER_PATHS = ("/tutorial_lib/child/", "<frozen runpy>", "/runpy.py")  # the workbook's frames, not the program's


@dataclass(frozen=True)
class Found:
    """What a failed run did, as the check establishes it: the culprit ``rank``, the ``line`` of the program it was at
    (its innermost frame there), and the cause (``cause_id``: the doctor's)."""

    rank: int
    line: int
    cause_id: CauseId


def found_in(run_dir: str | Path, script_name: str) -> Found | None:
    """The rank, line and cause of the failed run in ``run_dir`` of the program ``script_name`` (see the module
    docstring), or ``None`` when the run does not say all three (it finished; no stack names a line of the program;
    a hang where no single rank was stopped outside a collective)."""
    diagnosis = diagnose(run_dir)
    if not diagnosis.failed or diagnosis.rank is None:
        return None
    if diagnosis.cause_id in HANGS:
        outside = {rank: place for rank, place in diagnosis.where.items()
                   if rank != diagnosis.rank and not in_collective(place)}
        if len(outside) != 1:
            return None
        (rank, place), = outside.items()
        frame = next((f for f in place.frames if f.name == script_name), None)
        return Found(rank, frame.line, diagnosis.cause_id) if frame else None
    if diagnosis.stack:  # a fatal signal: faulthandler's report, most recent call first
        lines = [frame.line for frame in reversed(diagnosis.stack) if frame.name == script_name]
    else:
        lines = [int(m["line"]) for m in (ANY_FRAME.search(text) for rank, text in rank_lines(read_output_log(run_dir))
                                          if rank == diagnosis.rank) if m and Path(m["path"]).name == script_name]
    return Found(diagnosis.rank, lines[-1], diagnosis.cause_id) if lines else None


def shown_lines(run_dir: str | Path, last: int, script_name: str) -> dict[int, list[str]]:
    """Each rank's last ``last`` lines of ``output.log`` as the learner reads them instead of the doctor's report: the
    workbook's runner frames left out, and each run of frames outside ``script_name`` (torch's, Python's) folded into
    one line that says how many there were, so a long traceback keeps the program's frames and the error in view.
    Nothing is interpreted: the lines are the run's, in its order."""
    by_rank: dict[int, list[str]] = {}
    state: dict[int, tuple[str, int]] = {}  # rank -> (the kind of frame being read, its indent)
    folded: dict[int, int] = {}  # rank -> library frames folded into the line last written
    for rank, text in rank_lines(read_output_log(run_dir)):
        if rank is None:
            continue
        lines = by_rank.setdefault(rank, [])
        body = text.split("]:", 1)[1] if text.startswith("[rank") and "]:" in text else text  # torch's own label
        indent = len(body) - len(body.lstrip())
        frame = ANY_FRAME.search(body)
        if frame is None and rank in state and body.strip() and indent > state[rank][1]:
            if state[rank][0] == "script":
                lines.append(text)  # the program's source line under its frame
            continue  # a left-out frame's source line, or its ^^^ marks
        state.pop(rank, None)
        if frame is None:
            folded.pop(rank, None)
            lines.append(text)
            continue
        kind = ("runner" if any(p in frame["path"] for p in RUNNER_PATHS)
                else "script" if Path(frame["path"]).name == script_name else "library")
        state[rank] = (kind, indent)
        if kind == "library":
            folded[rank] = folded.get(rank, 0) + 1
            line = render(Message("  ({n} frames of torch or Python here: output.log has them)", {"n": folded[rank]}))
            if folded[rank] > 1:
                lines[-1] = line
            else:
                lines.append(line)
        elif kind == "script":
            folded.pop(rank, None)
            lines.append(text)
    return {rank: lines[-last:] for rank, lines in sorted(by_rank.items())}


def fold(text: object) -> str:
    """A cause as the learner may write it, folded: case, spaces, ``_`` and ``-`` aside (``"Collective Timeout"``,
    ``"collective_timeout"``, ``CauseId.COLLECTIVE_TIMEOUT`` fold the same)."""
    text = text.value if isinstance(text, CauseId) else str(text)
    return re.sub(r"[\s_\-]+", "", text).casefold()


@dataclass(frozen=True)
class FindTheBug:
    """A *find the bug* exercise's check (``Spec.verify``); see the module docstring.

    Attributes:
        program: the failing script, a file of ``programs/``.
        causes: the causes the learner picks from (the doctor's ``CauseId`` s; every variant's cause is one of them).
        variants: the inputs a round may take (a fresh ``--seed``: which rank fails and how follow from it).
        last_lines: each rank's last lines shown after the launch.
    """

    program: str
    causes: tuple[CauseId, ...]
    variants: Variants
    last_lines: int = 40
    kind: ClassVar[str] = "find-bug"
    launches: ClassVar[int] = 1

    def __post_init__(self) -> None:
        if not (rounds.PROGRAMS / self.program).is_file():
            raise ValueError(f"FindTheBug: no program {rounds.PROGRAMS / self.program}")
        if len(self.causes) < 2:
            raise ValueError("FindTheBug: give at least two causes to choose from")

    def cause_names(self) -> str:
        """The causes as the learner may write them (``"collective timeout, python exception, ..."``)."""
        return ", ".join(c.value.replace("_", " ") for c in self.causes)

    def check(self, spec: Spec, runs_root, ctx: Context, rank=MISSING, line=MISSING, cause=MISSING) -> Verdict:
        """``ex.check()``: launch a new round's failing run and show it; ``ex.check(rank=, line=, cause=)``: check the
        answer against the current round's run. Records each answer (not the launch) in the progress store."""
        given = {"rank": rank, "line": line, "cause": cause}
        if all(v is MISSING or v is None for v in given.values()):
            return self._launch(spec, runs_root, ctx)
        missing = [name for name, v in given.items() if v is MISSING or v is None]
        if missing:
            return Verdict(spec.id, False, attempted=False, problem=Message(
                "give all three: ex{n}.check(rank=..., line=..., cause=...) ({missing} missing)",
                {"n": spec.number, "missing": ", ".join(missing)}))
        problem = self._unreadable(spec, rank, line, cause)
        if problem is not None:
            return Verdict(spec.id, False, attempted=False, problem=problem)
        rnd = store.entry_of(store.read_store(runs_root), spec.id)["round"]
        truth = found_in(rnd["run_dir"], spec.script_name) if rnd and rnd.get("run_dir") else None
        if truth is None:
            return Verdict(spec.id, False, attempted=False, problem=Message(
                "no failed run to answer about yet: ex{n}.check() launches the job and shows its output",
                {"n": spec.number}))
        right = {"rank": int(rank) == truth.rank, "line": int(line) == truth.line, "cause": fold(cause) == fold(
            truth.cause_id)}
        solved = all(right.values())

        def keep(entry):
            entry["answers"].append({"round": rnd["n"], "rank": int(rank), "line": int(line), "cause": str(cause),
                                     "right": right, "time": store.now(), "run_dir": rnd["run_dir"]})
            if solved and entry["round"] is not None and entry["round"]["n"] == rnd["n"]:
                entry["round"]["revealed"] = True  # answered: the next ex.check() launches another variant
        warning = None
        try:
            store.record_checked(runs_root, spec.id, solved, keep)
        except ConfigError as e:
            warning = Message("this check was not recorded in your progress: {error}", {"error": str(e)})
        report = [Message("rank {rank}: {r}; line {line}: {l}; cause {cause}: {c}", {
            "rank": rank, "line": line, "cause": cause,
            **{k[0]: Message("right") if ok else Message("wrong") for k, ok in right.items()}})]
        return Verdict(spec.id, solved, report=report, warning=warning, run_dirs=[Path(rnd["run_dir"])],
                       next_step=Message("another failed run to read: ex{n}.check()", {"n": spec.number})
                       if solved else None)

    def _unreadable(self, spec: Spec, rank, line, cause) -> Message | None:
        for name, value in (("rank", rank), ("line", line)):
            if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str)
                                                                          and value.strip().isdigit())):
                return Message("{name}={value}: a whole number, as the output shows it", {"name": name,
                                                                                          "value": repr(value)})
        if fold(cause) not in {fold(c) for c in self.causes}:
            return Message("cause={cause}: not one of the causes of this exercise; pick one of: {names}",
                           {"cause": repr(cause), "names": self.cause_names()})
        return None

    def _launch(self, spec: Spec, runs_root, ctx: Context) -> Verdict:
        def change(entry):
            rounds.open_round(entry, self.variants)
        rnd = store.update(runs_root, spec.id, change)["round"]
        variant = rounds.from_dict(rnd["variant"])
        script = rounds.program_copy(ctx.script.parent, self.program, spec.script_name)
        try:
            result = ctx.launch(list(variant.args), nproc_per_node=variant.world_size, script=script, live="off",
                                streamed=False, what=Message("the job to read ({name})", {"name": spec.script_name}))
            run_dir = result.run_dir
        except LaunchError as e:
            run_dir = e.run_dir
        truth = found_in(run_dir, spec.script_name) if run_dir is not None else None
        if truth is None or truth.cause_id not in self.causes:
            return Verdict(spec.id, False, attempted=False, run_dirs=[Path(run_dir)] if run_dir else [],
                           problem=Message("this launch did not fail the way the exercise needs (a busy machine can "
                                           "make it fail elsewhere): run ex{n}.check() again", {"n": spec.number}))

        def keep(entry):
            if entry["round"] is not None and entry["round"]["n"] == rnd["n"]:
                entry["round"]["run_dir"] = str(run_dir)
        store.update(runs_root, spec.id, keep)
        print(render(Message("the job failed. Each rank's last lines (output.log; the workbook's own runner frames "
                             "left out, the frames of torch and Python folded):")), flush=True)
        for rank, lines in shown_lines(run_dir, self.last_lines, spec.script_name).items():
            for text in lines:
                print(f"[rank {rank}] {text}", flush=True)
        return Verdict(spec.id, False, attempted=False, run_dirs=[Path(run_dir)], problem=Message(
            "which rank caused it, at which line of {script}, and why? The doctor's report is not shown: it is what "
            "this exercise asks you to find. Answer with ex{n}.check(rank=..., line=..., "
            "cause=...), the cause one of: {names}", {"script": script, "n": spec.number, "names": self.cause_names()}))
