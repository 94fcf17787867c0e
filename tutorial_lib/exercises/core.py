"""An exercise's definition (``Spec``), what its check works with (``Context``) and what it finds (``Difference``).

A notebook cell asks for its exercises with ``exercises("01", RUNS_DIR)`` and gets one ``Exercise`` each
(``handle``). A script exercise's learner edits ``ex.script`` (a ``%%writefile {ex.script}`` cell) and calls
``ex.check()``: the script is launched on CPU ranks (gloo) as ``tl.run_script`` launches a script of yours
(``Context.launch``, which says before each launch what it starts and for how long at most), observed, and the
exercise's ``verify`` (an ``observing.ObservedCheck``) turns what each rank's observer recorded into the
``Difference`` s between what the lesson says must hold and what was measured. A value exercise's ``ex.check(answer)`` reads the answer
(``answers``) and compares it with the value its ``expected`` function derives. Neither raises for a wrong answer.

A ``Difference`` says what differs, on which rank, by how much, and (its note) what that means the run did; it never
says which line to write: that is what the hints are for (``Spec.hints``: where to look, then which API), and then
the solution (``ex.solution()``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import os
import pkgutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..diagnosis.causes import CauseId
from ..i18n import Message, Nn_, render
from ..launcher.run import run_script
from ..launcher.spec import LaunchResult
from ..runs.run_logs import read_output_log
from ..torchrun.output_lines import rank_lines

SOLUTIONS = Path(__file__).resolve().parent / "solutions"
RECORD_PREFIX = "check "  # a rank's line the check reads: check {"step": 1, "grad_norm": 0.5}
# The live view's progress from the check lines: a line with a step and then a loss is a point of the rank's progress.
CHECK_PROGRESS_PATTERN = (r'^check \{.*?"step": (?P<step>\d+)\b.*?"loss": '
                          r"(?P<loss>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|NaN|-?Infinity)")
MISSING = object()  # ex.check() without an answer
HIDDEN = object()  # a value exercise's expected answer: not shown next to a wrong one
REGISTRY: dict[str, Spec] = {}


@dataclass(frozen=True)
class Difference:
    """One thing the check expected and did not measure.

    Attributes:
        what: what was compared (a ``Message``: worded in the language in use when shown).
        expected: the value the lesson says it must be (a number, a list, a text).
        measured: what the learner's run (or answer) gave.
        rank: the rank that measured it, or ``None`` (an answer; a value of the whole job).
        note: one line that explains this kind of difference (a ``Message``), or ``None``.
    """

    what: Message
    expected: object
    measured: object
    rank: int | None = None
    note: Message | None = None


@dataclass(frozen=True)
class Spec:
    """An exercise's definition (one ``register`` call in ``nbNN.py``).

    Attributes:
        id: ``"<notebook>.<n>"``, e.g. ``"01.1"``: the notebook's number and the exercise's number under its heading.
        title: the exercise's title (a gettext msgid: ``N_("...")``).
        hints: two levels of hints (msgids): where to look (the section, the measurement to compare), then which API
            or idea fixes it. A third level, the same for every exercise, says the solution is one call away
            (``ex.solution()``).
        verify: a script exercise's check: ``verify(ctx) -> list[Difference]`` (launches with ``ctx.launch``);
            ``None`` for a value exercise.
        expected: a value exercise's answer, derived: ``expected(ctx) -> value``; ``None`` for a script exercise.
        wrong: a value exercise's known wrong answers and what each one means (a msgid), shown when given.
        tolerance: a value exercise's relative tolerance (``0``: exact, the default).
        byte_count: a value exercise whose answer counts bytes: units (KiB, MB, ...) are read (``answers``).
        launches: the launches a script exercise's check makes (said before it starts them).
        withheld_fixes: the doctor's causes (``CauseId``) whose fix is what the exercise asks for: a failed launch with
            one of them shows the doctor's report without its fix line (the hints have it).
        limit_s: a script exercise's own limit per launch, seconds, when below the handle's (``None``: the handle's).
        script_name: a script exercise's file name in its folder (``<runs>/exercises/<id>/<script_name>``).
        solution: the file in ``solutions/`` (a script exercise's whole fixed script; a value exercise's ``answer =``).
    """

    id: str
    title: str
    hints: tuple[str, str]
    solution: str
    verify: Callable[[Context], list[Difference]] | None = None
    expected: Callable[[Context], object] | None = None
    wrong: Mapping[object, str] = field(default_factory=dict)
    tolerance: float = 0.0
    byte_count: bool = False
    launches: int = 0
    withheld_fixes: tuple[CauseId, ...] = ()
    limit_s: float | None = None
    script_name: str = "train.py"

    @property
    def notebook(self) -> str:
        return self.id.split(".")[0]

    @property
    def number(self) -> int:
        return int(self.id.split(".")[1])

    @property
    def kind(self) -> str:
        """``"script"``, ``"value"``, or the kind of its ``verify`` record when it has one of its own: ``"predict"``
        (``predicting.Prediction``), ``"find-bug"`` (``bugs.FindTheBug``), ``"challenge"``
        (``challenges.Challenge``)."""
        if self.verify is None:
            return "value"
        return getattr(self.verify, "kind", "script")


def register(spec: Spec) -> Spec:
    """Add ``spec`` to ``REGISTRY`` (an ``nbNN`` module's definitions); a second one with the same id is refused."""
    if spec.id in REGISTRY:
        raise ValueError(f"exercise {spec.id} is defined twice")
    if (spec.verify is None) == (spec.expected is None):
        raise ValueError(f"exercise {spec.id}: give verify (a script exercise) or expected (a value exercise)")
    if not (SOLUTIONS / spec.solution).is_file():
        raise ValueError(f"exercise {spec.id}: no solution file {SOLUTIONS / spec.solution}")
    if spec.kind != "value" and spec.launches < 1 and hasattr(spec.verify, "launches"):
        spec = dataclasses.replace(spec, launches=spec.verify.launches)  # an ObservedCheck knows its launches
    if spec.kind != "value" and spec.launches < 1:
        raise ValueError(f"exercise {spec.id}: say how many launches its check makes (launches=1 or more)")
    REGISTRY[spec.id] = spec
    return spec


def load_all() -> dict[str, Spec]:
    """Every exercise, in order (``"01.1"``, ``"01.2"``, ..., ``"13.3"``): imports each ``nbNN`` module once."""
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name.startswith("nb"):
            importlib.import_module(f"{__package__}.{info.name}")
    return dict(sorted(REGISTRY.items(), key=lambda kv: (kv[1].notebook, kv[1].number)))


@dataclass
class Context:
    """What a check works with: the learner's script, where runs go, and readers of what the ranks printed.

    Attributes:
        spec: the exercise.
        script: the learner's script (``Exercise.script``).
        runs_root: the runs folder (run directories and ``exercises/`` go there).
        timeout_s: the limit of each launch, seconds.
        runs: the run directories of the launches made so far, in order.
    """

    spec: Spec
    script: Path
    runs_root: Path
    timeout_s: float
    runs: list[Path] = field(default_factory=list)

    def launch(self, args: Sequence[object] = (), *, nproc_per_node: int = 2, script: str | os.PathLike | None = None,
               what: Message | None = None, streamed: bool = True, **spec: object) -> LaunchResult:
        """Launch the learner's script (or ``script``: a reference run, e.g. a shipped solution) on CPU ranks (gloo),
        as ``tl.run_script`` does, after one line that says which launch of the check this is, what it runs (``what``:
        how to name ``script`` when it is not a reference run) and its limit; the ranks' progress is the launcher's
        live view (the check lines' steps and losses are its points). ``streamed=False``: the ranks' lines go to
        ``output.log`` only, and the check shows what it reads from there when the job ends (a find-the-bug
        exercise's folded last lines, which would otherwise follow the same lines streamed). Raises its
        ``LaunchError`` (the check turns it into the doctor's verdict)."""
        spec.setdefault("timeout_s", self.timeout_s)
        spec.setdefault("loss_pattern", CHECK_PROGRESS_PATTERN)
        ranks = nproc_per_node * int(spec.get("nnodes", 1))
        n, limit_s = len(self.runs) + 1, format(spec["timeout_s"], "g")
        if what is None:
            what = Message("your script") if script is None else Message("a reference run ({name})",
                                                                         {"name": Path(script).name})
        if streamed:
            singular, plural = Nn_("[check {id}] launch {n} of {total}: {what} on {ranks} CPU rank (gloo), stopped "
                                   "after {limit_s} s at most; its output and progress follow",
                                   "[check {id}] launch {n} of {total}: {what} on {ranks} CPU ranks (gloo), stopped "
                                   "after {limit_s} s at most; their output and progress follow")
        else:
            singular, plural = Nn_("[check {id}] launch {n} of {total}: {what} on {ranks} CPU rank (gloo), stopped "
                                   "after {limit_s} s at most; what it printed follows when it ends",
                                   "[check {id}] launch {n} of {total}: {what} on {ranks} CPU ranks (gloo), stopped "
                                   "after {limit_s} s at most; what they printed follows when they end")
        print(render(Message(singular, {"id": self.spec.id, "n": n, "total": max(n, self.spec.launches),
                                        "what": what, "ranks": ranks, "limit_s": limit_s}, plural, ranks)),
              file=sys.stdout, flush=True)
        with contextlib.nullcontext() if streamed else contextlib.redirect_stdout(io.StringIO()):
            result = run_script(script if script is not None else self.script, list(args), runs_dir=self.runs_root,
                                label=f"exercise-{self.spec.id}", nproc_per_node=nproc_per_node, device="cpu", **spec)
        self.runs.append(result.run_dir)
        return result

    def note_reused(self, run_dir: Path, what: Message | None = None) -> None:
        """Count ``run_dir`` (a reference run kept from an earlier check of the same variant; ``what``: another kind of
        kept run, a challenge's baseline) as this check's next launch, saying so instead of launching it again."""
        n = len(self.runs) + 1
        fields = {"id": self.spec.id, "n": n, "total": max(n, self.spec.launches), "path": run_dir}
        if what is None:
            print(render(Message("[check {id}] launch {n} of {total}: the reference run on the same inputs, kept from "
                                 "an earlier check ({path})", fields)), file=sys.stdout, flush=True)
        else:
            print(render(Message("[check {id}] launch {n} of {total}: {what} on the same inputs, kept from an earlier "
                                 "check ({path})", {**fields, "what": what})), file=sys.stdout, flush=True)
        self.runs.append(run_dir)

    @staticmethod
    def records(result: LaunchResult | str | os.PathLike) -> dict[int, list[dict]]:
        """``{rank: [record, ...]}``: every ``check {json}`` line each rank printed, in order, parsed (what a script
        of the lessons prints for its live progress; the launcher's tests read it; no exercise check does)."""
        run_dir = result.run_dir if isinstance(result, LaunchResult) else Path(result)
        found: dict[int, list[dict]] = {}
        for rank, text in rank_lines(read_output_log(run_dir)):
            if rank is not None and text.startswith(RECORD_PREFIX):
                try:
                    record = json.loads(text[len(RECORD_PREFIX):])
                except json.JSONDecodeError:
                    continue  # a line the learner printed that only looks like one
                if isinstance(record, dict):
                    found.setdefault(rank, []).append(record)
        return found


def notes_once(differences: list[Difference]) -> list[Difference]:
    """``differences`` with each kind of note (its msgid) kept on its first difference only: two ranks that fail the
    same way are two lines, one explanation."""
    said, out = set(), []
    for d in differences:
        if d.note is not None and d.note.msgid in said:
            d = dataclasses.replace(d, note=None)
        elif d.note is not None:
            said.add(d.note.msgid)
        out.append(d)
    return out


def rounding_tolerance(dtype: torch.dtype, terms: int, scale: float = 1.0) -> float:
    """The largest difference rounding alone can make between two results of one reduction computed in ``dtype`` in
    different orders: two runs that split it differently over the ranks (2 ranks, then 1), each correct.

    A sum of ``n`` terms in floating point is off by at most ``(n - 1) u sum|x_i|`` (u = eps / 2: Higham, Accuracy and
    Stability of Numerical Algorithms, 2nd ed., eq. 4.4); two orders differ by at most twice that. With ``terms`` the
    values the reduction adds (and the roundings after it: a division, an all-reduce's additions) and ``scale`` the size
    of the result (a mean of non-negative terms: the mean itself), the bound is ``terms x eps x scale``.

    Args:
        dtype: the dtype the reduction runs in (``torch.float32``: the learner's script may keep it there).
        terms: the values added, plus the roundings after the sum (> 0).
        scale: the magnitude the error is relative to (> 0; the result, or its largest entry).

    Raises:
        ValueError: ``dtype`` not a floating dtype, ``terms`` or ``scale`` not > 0.
    """
    if not dtype.is_floating_point or terms <= 0 or not scale > 0:
        raise ValueError(f"rounding_tolerance({dtype}, terms={terms!r}, scale={scale!r}): a floating dtype, terms > 0 "
                         "and scale > 0")
    return terms * torch.finfo(dtype).eps * scale
