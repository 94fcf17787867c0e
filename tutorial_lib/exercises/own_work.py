"""Whether a learner's script is their own work: a check refuses, before launching, a script that borrows the answer.

A script exercise's check launches the learner's script and compares what it did with what must hold. A script that
imports the workbook's library (``tutorial_lib``: the exercises and their checks are in it) or reads the shipped
solutions (``tutorial_lib/exercises/solutions/``) would pass by running the answer: 13.2's check launches the shipped
solution as its reference, and ``runpy.run_path(<that solution>)`` would match it exactly. ``borrowed(source)`` finds
that in the script's text before anything runs, from its syntax tree (``ast``):

- an ``import`` or ``from ... import`` of ``tutorial_lib`` or anything in it;
- a string anywhere in the code (an argument of ``open``, ``runpy.run_path``, ``importlib.import_module``,
  ``__import__``, ``exec(open(...).read())``, a ``Path``; an f-string's text) that names ``tutorial_lib``, the
  solutions' folder (``exercises/solutions``, or its absolute path) or one of the shipped solutions' file names
  (``13_2_train.py``).

Comments and docstrings (a string standing alone as a statement) run nothing and are not held against the script.

What a static scan cannot catch, and does not try to: a name built while the script runs (``"tutorial" + "_lib"``,
``chr``, ``base64``, a name read from a file or an environment variable), a search that finds the files without
naming them (``glob("**/*_train.py")``), code fetched from elsewhere and run with ``exec``, a copy of the package under
another name, and a solution's text typed or pasted into the script (``ex.solution()`` shows it, and the progress
record says it was opened). The scan stops honest shortcuts and mistakes, not someone set on fooling themselves; see
``docs/exercises.md``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from ..i18n import Message

PACKAGE = "tutorial_lib"
SOLUTIONS = Path(__file__).resolve().parent / "solutions"
_SOLUTIONS_FOLDER = re.compile(r"exercises[/\\]+solutions\b")


@dataclass(frozen=True)
class Borrowed:
    """One place where a script borrows what a check must not see.

    Attributes:
        line: the line of the script (1-based).
        what: what it names there, as written (``"tutorial_lib.exercises"``, a path).
        reads_solution: ``True`` when it names the shipped solutions, ``False`` for an import of the library.
    """

    line: int
    what: str
    reads_solution: bool

    def message(self) -> Message:
        """This finding, worded for the verdict."""
        if self.reads_solution:
            return Message("line {line} names the shipped solutions ({what})", {"line": self.line, "what": self.what})
        return Message("line {line} uses the workbook's library ({what})", {"line": self.line, "what": self.what})


def borrowed(source: str, solutions: str | Path = SOLUTIONS) -> list[Borrowed]:
    """Every place ``source`` (a learner's script) imports ``tutorial_lib`` or names the shipped solutions.

    Args:
        source: the script's text.
        solutions: the solutions' folder (its absolute path and its files' names are searched for).

    Returns:
        The findings in the order of their lines; empty for a script of the learner's own (a starter, a fix). A script
        that does not parse gives none: the launch refuses it with its ``SyntaxError``.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    folder = Path(solutions)
    names = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Borrowed(node.lineno, a.name, False) for a in node.names if _is_package(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and _is_package(node.module or ""):
            found.append(Borrowed(node.lineno, node.module, False))
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in prose:
            text = node.value.decode("utf-8", "replace") if isinstance(node.value, bytes) else node.value
            finding = _names(text, folder, names)
            if finding is not None:
                found.append(Borrowed(node.lineno, _clip(text), finding))
    return sorted(found, key=lambda b: b.line)


def _is_package(module: str) -> bool:
    return module.split(".")[0] == PACKAGE


def _names(text: str, folder: Path, names: set[str]) -> bool | None:
    """``True``: ``text`` names the solutions; ``False``: it names the package; ``None``: neither."""
    tail = re.split(r"[/\\]", text.strip())[-1]
    if str(folder) in text or _SOLUTIONS_FOLDER.search(text) or tail in names:
        return True
    if re.search(rf"(^|[^\w]){PACKAGE}($|[^\w])", text):
        return False
    return None


def _clip(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= n else text[:n - 3] + "...")
