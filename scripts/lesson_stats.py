"""How lean each lesson script is: lines, flags and the share of its code that is the lesson (issue 48).

    python scripts/lesson_stats.py            # a table of every shipped lesson, the issue's targets marked
    python scripts/bench.py --only lessons    # the same rows in the benchmarks' table

What is counted, per ``tutorial_lib/lessons/<name>.py``:

* ``lines``: the file's physical lines;
* ``flags``: ``add_argument(...)`` calls (its command-line flags, the workbook's included);
* ``code_lines``: lines that hold code: not blank, not only a comment, not inside a docstring;
* ``scaffold_lines``: the code lines that serve the workbook, not training: every code line below the
  ``# Workbook instrumentation`` banner, and above it each line whose comment starts with ``workbook``
  (``recorder.step(...)  # workbook``); ``lesson_lines`` the rest, and ``lesson_share`` their fraction of
  ``code_lines``.

The targets come from issue 48: ``ddp_train.py`` at most 200 lines, ``train_lm.py`` at most 450, every lesson at
least 75% lesson code. Counting reads the files only (``ast`` and ``tokenize``; the lessons' own modules by
``tutorial_lib.runs.rundir.sibling_modules``, which parses them); no lesson is imported or run.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

from tutorial_lib.runs.rundir import sibling_modules

LESSONS_DIR = Path(__file__).resolve().parent.parent / "tutorial_lib" / "lessons"
BANNER = "# Workbook instrumentation"
MAX_LINES = {"ddp_train": 200, "train_lm": 450}  # issue 48's targets
MIN_LESSON_SHARE = 0.75
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
             tokenize.ENDMARKER}


def docstring_lines(tree: ast.Module) -> set[int]:
    """The line numbers (1-based) of every module, class and function docstring in ``tree``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def lesson_stats(path: str | Path) -> dict:
    """Count ``path``'s lines, flags, code lines and scaffolding lines (the module docstring says how).

    Raises:
        SyntaxError: the file is not Python.
    """
    source = Path(path).read_text()
    tree = ast.parse(source)
    flags = sum(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"
                for n in ast.walk(tree))
    docstrings = docstring_lines(tree)
    code, workbook_comment = set(), set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.string.lstrip("#").strip().lower().startswith("workbook"):
            workbook_comment.add(token.start[0])
        elif token.type not in _NOT_CODE:
            code.update(range(token.start[0], token.end[0] + 1))
    code -= docstrings
    lines = source.splitlines()
    banner = next((i for i, line in enumerate(lines, 1) if line.startswith(BANNER)), len(lines) + 1)
    scaffold = {n for n in code if n > banner} | (code & workbook_comment)
    return {"lines": len(lines), "flags": flags, "code_lines": len(code), "scaffold_lines": len(scaffold),
            "lesson_lines": len(code) - len(scaffold),
            "lesson_share": (len(code) - len(scaffold)) / len(code) if code else 1.0}


def table(lessons_dir: Path = LESSONS_DIR) -> list[dict]:
    """One row per file: its name, ``lesson_stats``, its ``role`` and whether it meets issue 48's targets. A file that
    a lesson imports by plain name (``lm_model.py``, imported by ``train_lm.py``) is that lesson's module (role
    ``module of train_lm``) and meets the same share target; ``_workbook.py`` (the lessons' instruments, not a lesson)
    is counted on a row of its own at the end, with no target."""
    paths = sorted(lessons_dir.glob("*.py"), key=lambda p: (p.name.startswith("_"), p.name))
    owner = {Path(file).stem: path.stem for path in paths if not path.name.startswith("_")
             for file in sibling_modules(path)}
    rows = []
    for path in paths:
        stats = lesson_stats(path)
        limit = MAX_LINES.get(path.stem)
        stats.update(name=path.stem, max_lines=limit,
                     role=f"module of {owner[path.stem]}" if path.stem in owner else "lesson",
                     meets=(limit is None or stats["lines"] <= limit) and stats["lesson_share"] >= MIN_LESSON_SHARE)
        if path.name.startswith("_"):
            stats.update(role="instruments", meets=None)  # what the lessons import when present: no lesson target
        rows.append(stats)
    return rows


def main() -> int:
    rows = table()
    print(f"{'lesson':<24} {'lines':>6} {'flags':>6} {'code':>6} {'lesson':>7} {'workbook':>9} {'share':>6}  target")
    for r in rows:
        target = (f"<= {r['max_lines']} lines, " if r["max_lines"] else "") + f">= {MIN_LESSON_SHARE:.0%} lesson: "
        target = "the lessons' instruments, not a lesson" if r["meets"] is None else target + (
            "met" if r["meets"] else "MISSED") + ("" if r["role"] == "lesson" else f" ({r['role']})")
        print(f"{r['name']:<24} {r['lines']:>6} {r['flags']:>6} {r['code_lines']:>6} {r['lesson_lines']:>7} "
              f"{r['scaffold_lines']:>9} {r['lesson_share']:>6.0%}  {target}")
    lessons = [r for r in rows if r["role"] == "lesson"]
    modules = [r for r in rows if r["role"].startswith("module of ")]
    print(f"{sum(r['meets'] for r in lessons)} of {len(lessons)} lessons and {sum(r['meets'] for r in modules)} of "
          f"{len(modules)} lesson modules meet issue 48's targets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
