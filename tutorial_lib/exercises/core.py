"""An exercise: its definition (``Spec``), the handle a notebook holds (``Exercise``) and a check's answer (``Verdict``).

A notebook cell asks for its exercises with ``exercises("01", RUNS_DIR)`` and gets one ``Exercise`` each. A script
exercise's learner edits ``ex.script`` (a ``%%writefile {ex.script}`` cell) and calls ``ex.check()``: the script is
launched on 2 CPU ranks (gloo) as ``tl.run_script`` launches a script of yours, and the exercise's ``verify`` reads what
each rank printed (``check {json}`` lines: ``Context.records``) into the ``Difference`` s between what the lesson says
must hold and what was measured. A value exercise's ``ex.check(answer)`` compares the answer with the value its
``expected`` function derives, exactly. Neither raises for a wrong answer.
"""

from __future__ import annotations

import dataclasses
import html
import importlib
import json
import math
import os
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..diagnosis.doctor import Diagnosis, diagnose
from ..errors import ConfigError, LaunchError
from ..i18n import Message, _, render
from ..launcher.run import run_script
from ..launcher.spec import LaunchResult
from ..runs.run_logs import read_output_log
from ..runs.rundir import default_runs_root
from ..torchrun.tee import rank_lines
from . import store

SOLUTIONS = Path(__file__).resolve().parent / "solutions"
RECORD_PREFIX = "check "  # a rank's line the check reads: check {"step": 1, "grad_norm": 0.5}
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
        hints: a hint, then a stronger hint (msgids); the solution comes after them, from ``solutions/``.
        verify: a script exercise's check: ``verify(ctx) -> list[Difference]`` (launches with ``ctx.launch``);
            ``None`` for a value exercise.
        expected: a value exercise's answer, derived: ``expected(ctx) -> value``; ``None`` for a script exercise.
        wrong: a value exercise's known wrong answers and what each one means (a msgid), shown when given.
        tolerance: a value exercise's relative tolerance (``0``: exact, the default).
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
    script_name: str = "train.py"

    @property
    def notebook(self) -> str:
        return self.id.split(".")[0]

    @property
    def number(self) -> int:
        return int(self.id.split(".")[1])

    @property
    def kind(self) -> str:
        return "script" if self.verify is not None else "value"


def register(spec: Spec) -> Spec:
    """Add ``spec`` to ``REGISTRY`` (an ``nbNN`` module's definitions); a second one with the same id is refused."""
    if spec.id in REGISTRY:
        raise ValueError(f"exercise {spec.id} is defined twice")
    if (spec.verify is None) == (spec.expected is None):
        raise ValueError(f"exercise {spec.id}: give verify (a script exercise) or expected (a value exercise)")
    if not (SOLUTIONS / spec.solution).is_file():
        raise ValueError(f"exercise {spec.id}: no solution file {SOLUTIONS / spec.solution}")
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
    """

    spec: Spec
    script: Path
    runs_root: Path
    timeout_s: float
    runs: list[Path] = field(default_factory=list)

    def launch(self, args: Sequence[object] = (), *, nproc_per_node: int = 2, script: str | os.PathLike | None = None,
               **spec: object) -> LaunchResult:
        """Launch the learner's script (or ``script``: a shipped lesson's name, a reference run) on CPU ranks (gloo),
        as ``tl.run_script`` does; raises its ``LaunchError`` (the check turns it into the doctor's verdict)."""
        spec.setdefault("timeout_s", self.timeout_s)
        result = run_script(script if script is not None else self.script, list(args), runs_dir=self.runs_root,
                            label=f"exercise-{self.spec.id}", nproc_per_node=nproc_per_node, device="cpu", **spec)
        self.runs.append(result.run_dir)
        return result

    def per_rank(self, result: LaunchResult, nproc_per_node: int) -> tuple[dict[int, dict], list[Difference]]:
        """``({rank: its last check record}, differences)``: a rank that printed no ``check {json}`` line is a
        ``Difference`` (expected 1 line, measured 0), so a check can compare the ranks that did."""
        found = self.records(result)
        missing = [Difference(Message("lines the check reads (check ...) printed"), ">= 1", 0, rank=rank)
                   for rank in range(nproc_per_node) if not found.get(rank)]
        return {rank: lines[-1] for rank, lines in found.items() if lines}, missing

    @staticmethod
    def records(result: LaunchResult | str | os.PathLike) -> dict[int, list[dict]]:
        """``{rank: [record, ...]}``: every ``check {json}`` line each rank printed, in order, parsed."""
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


@dataclass
class Verdict:
    """What a check found. A notebook shows it (text, or HTML in JupyterLab); programs read its fields.

    Attributes:
        id: the exercise (``"01.1"``).
        solved: whether every comparison held.
        differences: what differs (empty when solved, and when the launch failed).
        failure: the doctor's report when the learner's launch failed (``solved`` is then False), else ``None``.
        problem: why nothing could be checked (no script written yet, no answer given), else ``None``.
        run_dirs: the run directories the check launched (the first is the learner's).
        answer: a value exercise's answer as given.
        attempted: ``False`` when there was nothing to check yet (no answer given, no script written): not counted
            as a check in the progress record.
        warning: why the attempt could not be recorded (an unwritable or damaged progress file), else ``None``.
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

    def lines(self) -> list[str]:
        """The verdict as a few lines in the language in use (what ``print`` and the notebook show)."""
        spec = REGISTRY[self.id]
        head = _("Exercise {id} ({title}): ", id=self.id, title=_(spec.title))
        if self.solved:
            out = [head + _("solved")]
        else:
            out = [head + _("not solved yet")]
            if self.problem is not None:
                out.append("  " + render(self.problem))
            if self.failure is not None:
                out.append("  " + _("the launch failed; the doctor:"))
                out += ["    " + line for line in str(self.failure).splitlines()[:8]]
                out.append("  " + _("full log: {path}", path=self.failure.run_dir / "output.log"))
            for d in self.differences:
                fields = dict(what=render(d.what), expected=_show(d.expected), measured=_show(d.measured), rank=d.rank)
                if d.expected is HIDDEN:
                    out.append("  " + _("{what}: {measured} is not it", **fields))
                elif d.rank is not None:
                    out.append("  " + _("{what} on rank {rank}: expected {expected}, measured {measured}", **fields))
                else:
                    out.append("  " + _("{what}: expected {expected}, measured {measured}", **fields))
                if d.note is not None:
                    out.append("    " + render(d.note))
            out.append("  " + _("a hint, when you want one: ex{n}.hint()", n=spec.number))
        if self.run_dirs:
            out.append("  " + _("run directory: {path}", path=self.run_dirs[0]))
        if self.warning is not None:
            out.append("  " + render(self.warning))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.solved else "#9a6700"
        body = "<br>".join(html.escape(line).replace("  ", "&nbsp;&nbsp;") for line in self.lines())
        return f'<div style="border-left: 4px solid {colour}; padding-left: 8px; font-family: monospace">{body}</div>'


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


def steps_reported(records: dict[int, list[dict]], steps: int,
                   nproc_per_node: int = 2) -> tuple[dict[int, list[dict]], list[Difference]]:
    """``({rank: its records}, differences)``: the ranks whose ``check`` records carry steps 1..``steps`` in order, and
    a ``Difference`` for each rank that reported other steps (or none)."""
    want, found, differences = list(range(1, steps + 1)), {}, []
    for rank in range(nproc_per_node):
        mine = records.get(rank, [])
        if [r.get("step") for r in mine] != want:
            differences.append(Difference(Message("steps reported (check ...)"), want,
                                          [r.get("step") for r in mine], rank))
        else:
            found[rank] = mine
    return found, differences


def _show(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)) and len(value) > 12:
        return f"{list(value[:12])}... ({len(value)})"
    return str(value)


class Exercise:
    """The handle a notebook holds for one exercise: where its script goes, its check, its hints, its solution.

    Args:
        exercise_id: ``"<notebook>.<n>"`` (``"01.1"``).
        runs_dir: the runs folder (``None``: ``$TUTORIAL_LIB_RUNS_DIR`` or ``./runs``); the learner's scripts go to
            ``<runs_dir>/exercises/<id>/``, progress to ``<runs_dir>/exercises/progress.json``.
        timeout_s: the limit of each launch a check makes, seconds.

    Raises:
        ConfigError: an exercise id that does not exist (names the ones that do).
    """

    def __init__(self, exercise_id: str, runs_dir: str | os.PathLike | None = None, timeout_s: float = 120.0) -> None:
        specs = load_all()
        if exercise_id not in specs:
            raise ConfigError(f"no exercise {exercise_id!r}; the exercises are {', '.join(specs)}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ConfigError(f"timeout_s={timeout_s!r}: a limit per launch in seconds, > 0 (e.g. 120)")
        self.spec = specs[exercise_id]
        self.runs_root = Path(runs_dir) if runs_dir is not None else default_runs_root()
        self.timeout_s = float(timeout_s)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def script(self) -> Path:
        """The learner's copy of the script (``%%writefile {ex.script}``); its folder is created."""
        folder = self.runs_root / "exercises" / self.id
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create the exercise's folder {str(folder)!r} ({e.strerror}): pass a writable "
                              "RUNS_DIR to tl.exercises") from e
        return (folder / self.spec.script_name).resolve()

    def check(self, answer: object = MISSING, *, timeout_s: float | None = None) -> Verdict:
        """Check the learner's work and record the attempt (``tl.progress()``).

        A script exercise launches ``self.script`` (write it first) on 2 CPU ranks and compares what its ranks
        printed with what the lesson says must hold; a value exercise compares ``answer`` with the derived value.

        Returns:
            A ``Verdict``; never raises for a wrong answer, a failed launch (the doctor's report is in the verdict)
            or a script not yet written.
        """
        script = self.script if self.spec.kind == "script" else self.runs_root / "exercises" / self.id / "-"
        ctx = Context(self.spec, script, self.runs_root, timeout_s or self.timeout_s)
        verdict = self._verdict(ctx, answer)
        verdict.run_dirs = list(ctx.runs)
        if verdict.attempted:
            try:
                store.record_attempt(self.runs_root, self.id, verdict.solved)
            except ConfigError as e:  # the verdict stands; only its record is lost
                verdict.warning = Message("this check was not recorded in your progress: {error}", {"error": str(e)})
        return verdict

    def _verdict(self, ctx: Context, answer: object) -> Verdict:
        spec = self.spec
        if spec.kind == "value":
            if answer is MISSING or answer is None:
                return Verdict(spec.id, False, problem=Message("no answer yet: give yours, ex{n}.check(answer)",
                                                               {"n": spec.number}), answer=answer, attempted=False)
            try:
                expected = spec.expected(ctx)
            except (LaunchError, RuntimeError) as e:  # an answer measured on ranks (07.1) on a machine too busy
                return Verdict(spec.id, False, problem=Message(
                    "the check could not work the answer out this time ({error}): run it again", {"error": str(e)[:300]}),
                    answer=answer, attempted=False)
            if _equal(answer, expected, spec.tolerance):
                return Verdict(spec.id, True, answer=answer)
            note = next((Message(msg) for value, msg in spec.wrong.items() if _equal(answer, value, 0)), None)
            return Verdict(spec.id, False, [Difference(Message("your answer"), HIDDEN, answer, note=note)], answer=answer)
        if not ctx.script.is_file() or not ctx.script.read_text().strip():
            return Verdict(spec.id, False, problem=Message(
                "no script at {path} yet: run the %%writefile cell above first", {"path": ctx.script}), attempted=False)
        try:
            differences = notes_once(spec.verify(ctx))
        except LaunchError as e:
            return Verdict(spec.id, False, failure=diagnose(e))
        except ConfigError as e:  # refused before anything ran: a syntax error in the script, say
            return Verdict(spec.id, False, problem=Message("your script was not launched: {error}", {"error": str(e)}))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # check lines it cannot read
            return Verdict(spec.id, False, problem=Message(
                "the check lines your script printed do not hold what the check reads ({error}): keep the "
                "starter's print(\"check\", ...) lines as they are", {"error": type(e).__name__ + ": " + str(e)}))
        return Verdict(spec.id, not differences, differences)

    def hint(self) -> Hint:
        """The next hint: the first call shows a hint, the second a stronger one, later calls say where the solution
        is (``solution()``). Recorded in the progress store."""
        shown = store.record_hint(self.runs_root, self.id, len(self.spec.hints))
        if shown <= len(self.spec.hints):
            return Hint(_("Hint {k} of {n} for exercise {id}:", k=shown, n=len(self.spec.hints), id=self.id),
                        _(self.spec.hints[shown - 1]))
        return Hint(_("No more hints for exercise {id}.", id=self.id),
                    _("The solution, when you want it: ex{n}.solution()", n=self.spec.number))

    def solution(self) -> Hint:
        """The solution (the file in ``tutorial_lib/exercises/solutions/``), shown on purpose; recorded."""
        store.record_solution_opened(self.runs_root, self.id)
        path = SOLUTIONS / self.spec.solution
        return Hint(_("Solution of exercise {id} ({path}):", id=self.id, path=path), path.read_text(), code=True)

    def __repr__(self) -> str:
        what = (_("edit {path} (the %%writefile cell), then ex{n}.check()", path=self.script, n=self.spec.number)
                if self.spec.kind == "script" else _("answer with ex{n}.check(answer)", n=self.spec.number))
        return _("Exercise {id}: {title}", id=self.id, title=_(self.spec.title)) + "\n  " + what


@dataclass(frozen=True)
class Hint:
    """A hint or a solution, as shown: a heading line and its text (``code``: shown as a listing)."""

    heading: str
    text: str
    code: bool = False

    def __str__(self) -> str:
        return f"{self.heading}\n{self.text}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        body = f"<pre>{html.escape(self.text)}</pre>" if self.code else f"<p>{html.escape(self.text)}</p>"
        return f"<b>{html.escape(self.heading)}</b>{body}"


def _equal(answer: object, expected: object, tolerance: float) -> bool:
    if hasattr(answer, "tolist") and not isinstance(answer, (str, bytes)):  # a numpy value or array, a pandas Series
        answer = answer.tolist()
    if isinstance(answer, list) and len(answer) == 1 and not isinstance(expected, (list, tuple)):
        answer = answer[0]  # the one row a filter left
    if isinstance(expected, (list, tuple)) and isinstance(answer, (list, tuple)):  # (rank, line) or [rank, line]
        return len(answer) == len(expected) and all(_equal(a, e, tolerance) for a, e in zip(answer, expected))
    if isinstance(expected, str) or isinstance(answer, str):
        return str(answer).strip().lower() == str(expected).strip().lower()
    if isinstance(expected, bool) or isinstance(answer, bool):
        return answer is expected
    if isinstance(expected, (int, float)) and isinstance(answer, (int, float)):
        return math.isclose(answer, expected, rel_tol=tolerance, abs_tol=0) if tolerance else answer == expected
    return answer == expected


def exercise(exercise_id: str, runs_dir: str | os.PathLike | None = None, timeout_s: float = 120.0) -> Exercise:
    """One exercise's handle (``Exercise``): ``tl.exercise("01.2", RUNS_DIR)``."""
    return Exercise(exercise_id, runs_dir, timeout_s)


def exercises(notebook: str, runs_dir: str | os.PathLike | None = None, timeout_s: float = 120.0) -> list[Exercise]:
    """The handles of one notebook's exercises in order: ``ex1, ex2, ex3 = tl.exercises("01", RUNS_DIR)``.

    Args:
        notebook: the notebook's number, ``"01"`` ... ``"13"`` (or its file name, ``"01_ddp"``).
        runs_dir, timeout_s: as ``Exercise``.

    Raises:
        ConfigError: a notebook without exercises (names those with).
    """
    number = str(notebook).split("_")[0].zfill(2)
    found = [i for i, s in load_all().items() if s.notebook == number]
    if not found:
        have = sorted({s.notebook for s in REGISTRY.values()})
        raise ConfigError(f"notebook {notebook!r} has no exercises; these do: {', '.join(have)}")
    return [Exercise(i, runs_dir, timeout_s) for i in found]


def progress(runs_dir: str | os.PathLike | None = None, notebook: str | None = None) -> pd.DataFrame:
    """Every exercise of the workbook and where this learner is with it: ``tl.progress(RUNS_DIR)``.

    Args:
        runs_dir: the runs folder the notebooks used (``None``: ``$TUTORIAL_LIB_RUNS_DIR`` or ``./runs``).
        notebook: only this notebook's exercises (``"01"``), else all of them.

    Returns:
        One row per exercise, indexed by its id (``"01.1"``), in order, with columns ``title``, ``kind``
        (``"script"``: launched on ranks; ``"value"``: an answer), ``solved`` (bool), ``checks`` (checks run),
        ``hints_opened``, ``solution_opened`` and ``first_solved`` (local time, or ``None``).
        ``df.attrs["path"]`` is the file it was read from.
    """
    data = store.read_store(runs_dir)
    specs = load_all()
    if notebook is not None and not any(s.notebook == str(notebook).split("_")[0].zfill(2) for s in specs.values()):
        have = sorted({s.notebook for s in specs.values()})
        raise ConfigError(f"notebook {notebook!r} has no exercises; these do: {', '.join(have)}")
    rows = []
    for exercise_id, spec in specs.items():
        if notebook is not None and spec.notebook != str(notebook).split("_")[0].zfill(2):
            continue
        entry = store.entry_of(data, exercise_id)
        rows.append({"exercise": exercise_id, "title": _(spec.title), "kind": spec.kind, **entry})
    table = pd.DataFrame(rows, columns=["exercise", "title", "kind", *store.DEFAULTS]).set_index("exercise")
    table["first_solved"] = table["first_solved"].astype(object).where(table["first_solved"].notna(), None)
    table.attrs["path"] = str(store.progress_path(runs_dir))
    return table
