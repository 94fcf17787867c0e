"""The handle a notebook holds for one exercise (``Exercise``): its script, its check, its hints, its solution; and
``progress``, where this learner is with every exercise."""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

import pandas as pd

from ..diagnosis.doctor import diagnose
from ..errors import ConfigError, LaunchError
from ..i18n import N_, Message, _, joined, render
from ..runs.rundir import default_runs_root
from . import answers, store
from .core import HIDDEN, MISSING, SOLUTIONS, Context, Difference, load_all, notes_once
from .own_work import borrowed
from .verdict import Hint, Verdict

HINT_LEVELS = 3  # where to look, which API (Spec.hints), then: the solution is one call away
BETWEEN_FINDINGS = N_("; ")  # what separates the places a refused script borrows from


class Exercise:
    """The handle a notebook holds for one exercise: where its script goes, its check, its hints, its solution.

    Args:
        exercise_id: ``"<notebook>.<n>"`` (``"01.1"``).
        runs_dir: the runs folder (``None``: ``$TUTORIAL_LIB_RUNS_DIR`` or ``./runs``); the learner's scripts go to
            ``<runs_dir>/exercises/<id>/``, progress to ``<runs_dir>/exercises/progress.json``.
        timeout_s: the limit of each launch a check makes, seconds (an exercise may have a lower one of its own).

    Raises:
        ConfigError: an exercise id that does not exist (names the ones that do), a limit that is not > 0.
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

    def check(self, answer: object = MISSING, *, rank: object = MISSING, line: object = MISSING,
              cause: object = MISSING, timeout_s: float | None = None) -> Verdict:
        """Check the learner's work and record the attempt (``tl.progress()``).

        A script exercise launches ``self.script`` (write it first) on CPU ranks, observed, and compares what torch
        recorded in each rank with what the lesson says must hold (the shipped solution's record on the same inputs);
        each launch says first which of how many it is and its limit, and it refuses, before launching, a script that imports the workbook's library or reads the shipped solutions
        (``own_work``). A value exercise reads ``answer`` (``answers``: a number as people write it, a name, a tuple)
        and compares it with the derived value. The other kinds (``docs/exercises.md``): a *predict, then run*
        exercise runs this round's variant and shows the measurement beside your prediction (``predict`` first: it
        runs nothing before); a *find the bug* exercise launches a failing job and shows its output (no answer), or
        checks ``rank``, ``line`` and ``cause`` against that run; an *open challenge* launches your script and the
        starter's baseline and compares their measurements with the target.

        Args:
            answer: a value exercise's answer (the other kinds take none).
            rank, line, cause: a *find the bug* exercise's answer: the rank (int), the line of its script (int) and
                the cause (one of those the exercise lists, case and spaces aside).
            timeout_s: the limit of each launch, seconds, for this check only (default: the handle's).

        Returns:
            A ``Verdict``; never raises for a wrong answer, an answer in a form it cannot read (the verdict says which
            form is wanted; not counted as an attempt), a failed launch (the doctor's report is in the verdict) or a
            script not yet written.

        Raises:
            ConfigError: ``timeout_s`` not a number > 0.
        """
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ConfigError(f"timeout_s={timeout_s!r}: a limit per launch in seconds, > 0 (e.g. 120)")
        kind = self.spec.kind
        script = self.script if kind != "value" else self.runs_root / "exercises" / self.id / "-"
        limit = min(timeout_s or self.timeout_s, self.spec.limit_s or math.inf)
        ctx = Context(self.spec, script, self.runs_root, limit)
        if kind in ("predict", "find-bug", "challenge"):
            return self._check_kind(ctx, answer, rank, line, cause)
        if any(v is not MISSING for v in (rank, line, cause)):
            return Verdict(self.id, False, attempted=False, problem=Message(
                "rank=, line= and cause= are the answer of a find-the-bug exercise; exercise {id} is a {kind} "
                "exercise", {"id": self.id, "kind": kind}))
        verdict = self._check_answer(ctx, answer) if kind == "value" else self._check_script(ctx)
        verdict.run_dirs = list(ctx.runs)
        if verdict.attempted:
            try:
                store.record_attempt(self.runs_root, self.id, verdict.solved)
            except ConfigError as e:  # the verdict stands; only its record is lost
                verdict.warning = Message("this check was not recorded in your progress: {error}", {"error": str(e)})
        return verdict

    def _check_answer(self, ctx: Context, answer: object) -> Verdict:
        spec = self.spec
        if answer is MISSING or answer is None:
            return Verdict(spec.id, False, problem=Message("no answer yet: give yours, ex{n}.check(answer)",
                                                           {"n": spec.number}), answer=answer, attempted=False)
        try:
            expected = spec.expected(ctx)
        except (LaunchError, RuntimeError) as e:  # an answer measured on ranks (07.1) on a machine too busy
            return Verdict(spec.id, False, problem=Message(
                "the check could not work the answer out this time ({error}): run it again", {"error": str(e)[:300]}),
                answer=answer, attempted=False)
        reading = answers.read(answer, expected, byte_count=spec.byte_count)
        if reading.problem is not None:
            return Verdict(spec.id, False, problem=reading.problem, answer=answer, attempted=False)
        wrong = [msg for value, msg in spec.wrong.items() if reading.agrees(value)]
        if reading.agrees(expected, spec.tolerance):
            if reading.approximate and wrong:  # "6.76e5" is the answer, and a known mistake too, to 3 digits
                return Verdict(spec.id, False, answer=answer, attempted=False, problem=Message(
                    "{answer} agrees with the answer to the digits you gave, and so does a known mistake: give more "
                    "significant digits (or the whole number) to tell them apart", {"answer": reading.shown()}))
            return Verdict(spec.id, True, answer=answer, reading=_how_read(reading))
        note = Message(wrong[0]) if wrong else None
        return Verdict(spec.id, False, [Difference(Message("your answer"), HIDDEN, reading.shown(), note=note)],
                       answer=answer)

    def _check_kind(self, ctx: Context, answer: object, rank: object, line: object, cause: object) -> Verdict:
        """A check of the kinds that record what they measure themselves (``predicting``, ``bugs``, ``challenges``)."""
        spec, kind = self.spec, self.spec.kind
        if answer is not MISSING:
            how = {"predict": Message("your prediction goes in ex{n}.predict(...), before the check",
                                      {"n": spec.number}),
                   "find-bug": Message("answer with ex{n}.check(rank=..., line=..., cause=...)", {"n": spec.number}),
                   "challenge": Message("the check reads your script, {path}: ex{n}.check() takes no answer",
                                        {"path": ctx.script, "n": spec.number})}[kind]
            return Verdict(spec.id, False, attempted=False, problem=how)
        if kind == "predict":
            verdict = spec.verify.check(spec, self.runs_root, ctx)
        elif kind == "find-bug":
            verdict = spec.verify.check(spec, self.runs_root, ctx, rank=rank, line=line, cause=cause)
        else:
            refused = self._refused(ctx)
            if refused is not None:
                return refused
            try:
                verdict = spec.verify.check(spec, self.runs_root, ctx)
            except LaunchError as e:
                verdict = Verdict(spec.id, False, failure=diagnose(e))
                try:
                    store.record_attempt(self.runs_root, self.id, False)
                except ConfigError as err:
                    verdict.warning = Message("this check was not recorded in your progress: {error}",
                                              {"error": str(err)})
            except ConfigError as e:
                return Verdict(spec.id, False, attempted=False, problem=Message(
                    "your script was not launched: {error}", {"error": str(e)}))
        verdict.run_dirs = verdict.run_dirs or list(ctx.runs)
        return verdict

    def _refused(self, ctx: Context) -> Verdict | None:
        """Why a learner's script is not launched (not written yet; it borrows the library or a solution), or
        ``None``."""
        spec = self.spec
        if not ctx.script.is_file() or not ctx.script.read_text().strip():
            return Verdict(spec.id, False, problem=Message(
                "no script at {path} yet: run the %%writefile cell above first", {"path": ctx.script}), attempted=False)
        found = borrowed(ctx.script.read_text())
        if found:
            return Verdict(spec.id, False, attempted=False, problem=Message(
                "your script was not launched: {where}. A check runs your own code and compares what it did; a "
                "script that imports the workbook's library (the exercises, their checks and their solutions are in "
                "it) or reads the shipped solutions would pass by running the answer. ex{n}.solution() shows the "
                "solution when you want it.", {"where": joined([f.message() for f in found], BETWEEN_FINDINGS),
                                               "n": spec.number}))
        return None

    def predict(self, value: object = MISSING) -> Hint:
        """Record your prediction for this round of a *predict, then run* exercise, before ``check()`` runs it.

        The round's variant (the inputs the check will run) is shown by ``repr(ex)`` and by ``ex.predict()`` without
        a value. A value is read as a value exercise's answer is (``answers``: ``12``, ``"1.5 MiB"``); several before
        the check: the last counts. After the check showed a round's measurement, a value is refused (it would not
        be a prediction), kept in your progress as made after it, and the next round's variant is shown.

        Args:
            value: the predicted quantity (a count, or bytes as the exercise says), or nothing to see the variant.

        Returns:
            A ``Hint`` that says what was recorded, or why not.

        Raises:
            ConfigError: this exercise is not a *predict, then run* one; the runs folder cannot be written (the round
                and the prediction are kept there).
        """
        if self.spec.kind != "predict":
            raise ConfigError(f"exercise {self.id} is a {self.spec.kind} exercise: it takes no prediction "
                              f"(ex{self.spec.number}.check(...) checks it)")
        return self.spec.verify.predict(self.spec, self.runs_root, value)

    def _check_script(self, ctx: Context) -> Verdict:
        spec = self.spec
        refused = self._refused(ctx)
        if refused is not None:
            return refused
        try:
            differences = notes_once(spec.verify(ctx))
        except LaunchError as e:
            return Verdict(spec.id, False, failure=diagnose(e))
        except ConfigError as e:  # refused before anything ran: a syntax error in the script, say
            return Verdict(spec.id, False, problem=Message("your script was not launched: {error}", {"error": str(e)}))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # records it cannot compare
            return Verdict(spec.id, False, problem=Message(
                "what the observer recorded of your run cannot be compared with the reference ({error}): keep the "
                "starter's model, optimizer and training loop in the script, with their names", {
                    "error": type(e).__name__ + ": " + str(e)}))
        return Verdict(spec.id, not differences, differences)

    def hint(self, level: int | None = None) -> Hint:
        """A hint, recorded in the progress store (a kernel restart keeps every opened hint readable).

        Three levels: where to look, then which API or idea, then that the solution is one call away.

        Args:
            level: ``None`` (the default): the next level not opened yet, or the last one again once all are open;
                ``1`` ... ``3``: that level (an earlier one read again).

        Raises:
            ConfigError: ``level`` not a whole number from 1 to 3.
        """
        n = self.spec.number
        if level is not None and (isinstance(level, bool) or not isinstance(level, int)
                                  or not 1 <= level <= HINT_LEVELS):
            raise ConfigError(f"ex{n}.hint({level!r}): a hint's level, 1 to {HINT_LEVELS} (ex{n}.hint() opens the "
                              "next one)")
        shown = store.record_hint(self.runs_root, self.id, HINT_LEVELS, level)
        heading = _("Hint {k} of {n} for exercise {id}:", k=shown, n=HINT_LEVELS, id=self.id)
        if shown < HINT_LEVELS:
            return Hint(heading, _(self.spec.hints[shown - 1]), footer=_(
                "a stronger hint: ex{n}.hint(); this one again, later or after a restart: ex{n}.hint({k})", n=n,
                k=shown))
        return Hint(heading, _("The solution is one call away: ex{n}.solution(). Its first call says what it will "
                               "show; the second shows it, and your progress records that you opened it.", n=n),
                    footer=_("every hint is open: ex{n}.hint(1) and ex{n}.hint(2) read them again", n=n))

    def solution(self) -> Hint:
        """The solution (the file in ``tutorial_lib/exercises/solutions/``), shown on purpose.

        The first call shows nothing of it: it says what the next call will show and that the progress record keeps
        it (``solution_opened``); the next call (also after a kernel restart) shows it and records that it was opened.
        """
        path = SOLUTIONS / self.spec.solution
        if not store.record_solution_asked(self.runs_root, self.id):
            what = {"script": _("the whole fixed script ({name}), the fix explained in its comments", name=path.name),
                    "challenge": _("one fixed script that meets the target ({name}), explained in its comments; "
                                   "others meet it too", name=path.name),
                    "predict": _("the rule that gives the number for every variant, worked out ({name})",
                                 name=path.name),
                    "find-bug": _("how to read the failed run's output for the rank, the line and the cause ({name})",
                                  name=path.name),
                    }.get(self.spec.kind, _("the answer and how it is worked out ({name})", name=path.name))
            opened = store.entry_of(store.read_store(self.runs_root), self.id)["hints_opened"]
            hints = (_("hints opened so far: {opened} of {levels} (ex{n}.hint() gives the next)", opened=opened,
                       levels=HINT_LEVELS, n=self.spec.number) if opened < HINT_LEVELS else "")
            return Hint(_("Before the solution of exercise {id}:", id=self.id), _(
                "ex{n}.solution() again shows {what}, and your progress (tl.progress) will record that you opened it.",
                n=self.spec.number, what=what), footer=hints)
        return Hint(_("Solution of exercise {id} ({path}):", id=self.id, path=path), path.read_text(), code=True)

    def __repr__(self) -> str:
        n, kind = self.spec.number, self.spec.kind
        if kind in ("script", "challenge"):
            what = _("edit {path} (the %%writefile cell), then ex{n}.check()", path=self.script, n=n)
        elif kind == "predict":  # shows this round's inputs (opening the round: the learner needs them to predict)
            try:
                what = render(self.spec.verify.task(self.spec, self.runs_root))
            except ConfigError as e:  # an unwritable runs folder: the handle still says what it is
                what = str(e)
        elif kind == "find-bug":
            what = _("ex{n}.check() launches the failing job and shows its output; then answer with "
                     "ex{n}.check(rank=..., line=..., cause=...)", n=n)
        else:
            what = _("answer with ex{n}.check(answer)", n=n)
        return _("Exercise {id}: {title}", id=self.id, title=_(self.spec.title)) + "\n  " + what


def _how_read(reading: answers.Reading) -> Message | None:
    """What a solved verdict says about an answer read at a precision or in a unit (nothing for an exact one)."""
    if reading.number is None:
        return None
    return Message("read as {shown}: it agrees with the answer to its {digits} significant digits",
                   {"shown": reading.shown(), "digits": reading.digits})


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
    specs = load_all()
    found = [i for i, s in specs.items() if s.notebook == number]
    if not found:
        have = sorted({s.notebook for s in specs.values()})
        raise ConfigError(f"notebook {notebook!r} has no exercises; these do: {', '.join(have)}")
    return [Exercise(i, runs_dir, timeout_s) for i in found]


def progress(runs_dir: str | os.PathLike | None = None, notebook: str | None = None) -> pd.DataFrame:
    """Every exercise of the workbook and where this learner is with it: ``tl.progress(RUNS_DIR)``.

    Args:
        runs_dir: the runs folder the notebooks used (``None``: ``$TUTORIAL_LIB_RUNS_DIR`` or ``./runs``).
        notebook: only this notebook's exercises (``"01"``), else all of them.

    Returns:
        One row per exercise, indexed by its id (``"01.1"``), in order, with columns ``title``, ``kind``
        (``"script"``: launched on ranks; ``"value"``: an answer; ``"predict"``, ``"find-bug"``, ``"challenge"``:
        ``docs/exercises.md``), ``solved`` (bool), ``checks`` (checks run; a *find the bug* exercise's answers),
        ``hints_opened`` (the highest of the 3 hint levels opened), ``solution_opened``, ``first_solved`` (local
        time, or ``None``), ``prediction`` (the last prediction that counts), ``measured`` (the last measurement:
        a prediction's quantity, a challenge's target) and ``best`` (a challenge's best target measurement among the
        attempts that met its conditions); ``None`` where the kind has none. ``df.attrs["path"]`` is the file it was
        read from; the file keeps every prediction, measurement and answer. It is a ``ProgressTable``: shown (in
        Jupyter, or printed) under a summary, "N of M solved" for each notebook it shows (M: all of that notebook's
        exercises, tried or not) and for the whole workbook (``.summary()``; ``.counts()``, the numbers per notebook),
        without the columns ``prediction``, ``measured`` and ``best`` where no row has a value (``.shown()``).

    Raises:
        ConfigError: a notebook without exercises; a progress file that is not the store's JSON (names it).
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
        rows.append({"exercise": exercise_id, "title": _(spec.title), "kind": spec.kind,
                     **{k: entry[k] for k in store.SHOWN}})
    table = pd.DataFrame(rows, columns=["exercise", "title", "kind", *store.SHOWN]).set_index("exercise")
    table["first_solved"] = table["first_solved"].astype(object).where(table["first_solved"].notna(), None)
    table = ProgressTable(table)
    table.attrs["path"] = str(store.progress_path(runs_dir))
    solved = {}
    for exercise_id, spec in specs.items():  # every notebook's, whichever the table shows
        counts = solved.setdefault(spec.notebook, [0, 0])
        counts[0] += bool(store.entry_of(data, exercise_id)["solved"])
        counts[1] += 1
    table.attrs["solved"] = solved
    table.attrs["notebooks"] = sorted({specs[i].notebook for i in table.index})
    return table


class ProgressTable(pd.DataFrame):
    """``progress()``'s table: a ``pandas.DataFrame`` like any other (what pandas derives from it is a plain
    ``DataFrame``), shown with a short summary above it: per notebook of the table, "N of M solved" (M: all its
    exercises, tried or not), then the whole workbook's. ``attrs["solved"]``: notebook -> ``[solved, exercises]``
    for every notebook of the workbook; ``attrs["notebooks"]``: the notebooks the table shows."""

    @property
    def _constructor(self):
        return pd.DataFrame

    def counts(self) -> pd.DataFrame:
        """Solved and all exercises per notebook of the workbook (index ``"01"`` ...; columns ``solved``,
        ``exercises``), whichever notebooks the table shows."""
        solved = self.attrs.get("solved", {})
        return pd.DataFrame([{"notebook": k, "solved": v[0], "exercises": v[1]} for k, v in sorted(solved.items())],
                            columns=["notebook", "solved", "exercises"]).set_index("notebook")

    def summary(self, lang: str | None = None) -> str:
        """The summary's lines, in ``lang`` (default: the language in use): one per notebook the table shows, then
        the workbook's total."""
        counts = self.counts()
        lines = [Message("notebook {notebook}: {solved} of {total} solved",
                         {"notebook": nb, "solved": int(counts.loc[nb, "solved"]),
                          "total": int(counts.loc[nb, "exercises"])})
                 for nb in self.attrs.get("notebooks", []) if nb in counts.index]
        lines.append(Message("the whole workbook: {solved} of {total} solved",
                             {"solved": int(counts["solved"].sum()), "total": int(counts["exercises"].sum())}))
        return "\n".join(render(line, lang) for line in lines)

    KIND_COLUMNS = ("prediction", "measured", "best")  # only a predict or challenge exercise has values here

    def shown(self) -> pd.DataFrame:
        """The table as shown: without the columns of ``KIND_COLUMNS`` that hold no value in any row (a notebook
        without predictions or challenges); the table itself keeps every column."""
        empty = [c for c in self.KIND_COLUMNS if c in self.columns and self[c].isna().all()]
        return pd.DataFrame(self).drop(columns=empty)

    def __repr__(self) -> str:  # one block, not wrapped at pandas' 80 columns: a row per exercise
        return self.summary() + "\n\n" + self.shown().to_string(max_colwidth=50)

    def _repr_html_(self) -> str | None:
        table = self.shown()._repr_html_()
        if table is None:
            return None
        lines = "<br>".join(html.escape(line) for line in self.summary().splitlines())
        return f'<p class="tutorial-lib-progress">{lines}</p>' + table
