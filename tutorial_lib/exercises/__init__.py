"""Exercises: what a learner fixes or answers at the end of each notebook, checked the way the lessons are checked.

A notebook's exercises section opens with ``ex1, ex2, ex3 = tl.exercises("01", RUNS_DIR)``: one ``Exercise`` handle
each (``core``). An exercise is of one of two kinds:

- a **script exercise**: the learner edits a short training script in a ``%%writefile {ex1.script}`` cell (the
  starter has the bug the lesson taught to find), and ``ex1.check()`` launches it on 2 real CPU ranks (gloo), reads
  what each rank printed (``check {json}`` lines) and compares it with what the lesson says must hold, rank by rank;
  a launch that fails is explained by the doctor (``tl.diagnose``);
- a **value exercise**: ``ex2.check(answer)`` compares a number (bytes, a rank, a count, a layout's name) with the
  value the check derives itself, exactly.

A check never raises for a wrong answer: it returns a ``Verdict`` (``solved``, and what differs: expected vs
measured, on which rank), so ``make workbook``, papermill and nbval run the notebooks with their starters in place
and report "not solved yet". Hints are opened on purpose (``ex1.hint()``: a hint, then a stronger one), and the
solution only by ``ex1.solution()``; the solutions live in ``solutions/`` beside this file, never in a notebook.
``progress`` keeps what this learner has solved in ``<runs folder>/exercises/progress.json`` (``tl.progress()``).

Each notebook's exercises are one module here (``nb01`` ... ``nb13``): their texts (gettext messages: the Chinese
edition shows the catalogue's wording) and their check functions. ``tests/integration/test_exercises.py`` runs every
exercise both ways: the notebook's starter fails its check, the solution passes.

Rules of this folder (``tests/unit/test_architecture.py``): it stands above the launcher (a check launches the
learner's script as a notebook cell would) and below the package's face; a lesson script is read only through ``notebook.script_source``.
"""

from .core import REGISTRY, Exercise, Verdict, exercise, exercises, progress

__all__ = ["REGISTRY", "Exercise", "Verdict", "exercise", "exercises", "progress"]
