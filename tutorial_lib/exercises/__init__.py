"""Exercises: what a learner fixes or answers at the end of each notebook, checked the way the lessons are checked.

A notebook's exercises section opens with ``ex1, ex2, ex3 = tl.exercises("01", RUNS_DIR)``: one ``Exercise`` handle
each (``handle``). An exercise is of one of five kinds:

- a **script exercise**: the learner edits a short training script in a ``%%writefile {ex1.script}`` cell (the
  starter has the bug the lesson taught to find), and ``ex1.check()`` launches it on 2 real CPU ranks (gloo) with
  the observer in every rank (``observing``: what torch recorded, never what the script printed) and compares it,
  rank by rank, with the shipped solution's record on the same variant;
  a launch that fails is explained by the doctor (``tl.diagnose``);
- a **value exercise**: ``ex2.check(answer)`` reads an answer (bytes, a rank, a count, a layout's name) in the forms
  people write it (``answers``: ``"675,928"``, ``"660 KiB"``, ``"(1,12)"``) and compares it with the value the check
  derives itself;
- a **predict, then run** exercise (``predicting``): ``ex4.predict(12)`` records a prediction for this round's
  inputs, then ``ex4.check()`` runs the exercise's program observed and shows the measurement beside it;
- a **find the bug** exercise (``bugs``): ``ex4.check()`` launches a failing job and shows each rank's last lines
  without the doctor, and ``ex4.check(rank=, line=, cause=)`` is checked against that run;
- an **open challenge** (``challenges``): a working starter that misses a measured target; ``ex4.check()`` measures
  the learner's script against the starter's kept baseline, and the record keeps the best measurement.

A check never raises for a wrong answer: it returns a ``Verdict`` (``verdict``: ``solved``, and what differs:
expected vs measured, on which rank, and what that means the run did, never which line to write), so ``make
workbook``, papermill and nbval run the notebooks with their starters in place and report "not solved yet". A script
that imports this package or reads the solutions is refused before launching (``own_work``). Hints are opened on
purpose, in three levels (``ex1.hint()``: where to look, which API, then that the solution is one call away;
``ex1.hint(1)`` reads one again), and the solution only by ``ex1.solution()``, which says first what it will show;
the solutions live in ``solutions/`` beside this file, never in a notebook. ``store`` keeps what this learner has
done in ``<runs folder>/exercises/progress.json`` (``tl.progress()``).

Each notebook's exercises are one module here (``nb01`` ... ``nb14``): their texts (gettext messages: the Chinese
edition shows the catalogue's wording) and their check functions. ``tests/integration/test_exercises.py`` runs every
exercise both ways: the notebook's starter fails its check, the solution passes.

Rules of this folder (``tests/unit/test_architecture.py``): it stands above the launcher (a check launches the
learner's script as a notebook cell would) and below the package's face; a lesson script is read only through ``notebook.script_source``.
"""

from .core import REGISTRY
from .handle import Exercise, exercise, exercises, progress
from .verdict import Verdict

__all__ = ["REGISTRY", "Exercise", "Verdict", "exercise", "exercises", "progress"]
