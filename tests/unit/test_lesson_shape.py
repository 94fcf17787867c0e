"""The scripts a learner copies read lesson first (issues 27 and 48): everything the workbook adds to measure them is
in a fenced "Workbook instrumentation" section at the bottom (fsdp_train, checkpoint_train) or in the sibling module
``_workbook.py`` that the lesson imports only when it is there (ddp_train), and the lesson reaches it only from lines
marked ``# workbook``, so a learner reads the whole lesson before any instrumentation."""

from __future__ import annotations

import ast

import pytest

from tutorial_lib.runs.rundir import LESSONS_DIR

COPIED = ["fsdp_train", "checkpoint_train"]
INSTRUMENTED = ["ddp_train"]  # the instruments live in _workbook.py
MAX_TRAIN_LINES = 60
FENCE = "# Workbook instrumentation"
# parse_args hands the parser to the section's flag helpers: the flags a script has are part of its command line.
FLAG_HELPERS = {"add_workbook_flags", "check_args"}


def sections(name: str) -> tuple[list[str], int, ast.Module]:
    """The script's lines, the line number of its fence and its syntax tree."""
    source = (LESSONS_DIR / f"{name}.py").read_text()
    lines = source.splitlines()
    fences = [n for n, line in enumerate(lines, 1) if line.startswith(FENCE)]
    assert len(fences) == 1, f"{name}.py: one '{FENCE}' fence, found {len(fences)}"
    return lines, fences[0], ast.parse(source)


def header_end(statement: ast.stmt) -> int:
    """The last line of a simple statement, or of a compound statement's header (``if ...:``, ``with ...:``)."""
    body = getattr(statement, "body", None)
    return body[0].lineno - 1 if isinstance(body, list) and body else statement.end_lineno


def unmarked_uses(lines: list[str], fence: int, tree: ast.Module) -> list[str]:
    """Lines of the lesson (above the fence) that use a name defined in the instrumentation section and are not
    marked ``# workbook``."""
    below = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.lineno > fence}
    found = []
    for top in (node for node in tree.body if node.lineno < fence and isinstance(node, (ast.FunctionDef, ast.ClassDef))):
        for node in ast.walk(top):
            if isinstance(node, ast.Name) and node.id in below - FLAG_HELPERS:
                # the statement the name is in (a compound statement: its header), which may span several lines
                first, last = min(((st.lineno, header_end(st)) for st in ast.walk(top) if isinstance(st, ast.stmt)
                                   and st.lineno <= node.lineno <= header_end(st)), key=lambda span: span[1] - span[0])
                text = " ".join(lines[first - 1:last])
                if "# workbook" not in text:
                    found.append(f"{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


@pytest.mark.parametrize("name", COPIED)
def test_the_lesson_comes_first_and_reaches_the_instrumentation_only_from_marked_lines(name):
    lines, fence, tree = sections(name)
    defined = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert {"main", "train", "setup", "cleanup"} <= set(defined), sorted(defined)
    assert all(defined[n].lineno < fence for n in ("main", "train", "setup", "cleanup")), "the lesson is above the fence"
    assert any(isinstance(n, ast.ClassDef) and n.name == "StepRecorder" and n.lineno > fence for n in tree.body)
    assert unmarked_uses(lines, fence, tree) == []


@pytest.mark.parametrize("name", INSTRUMENTED)
def test_the_lesson_reaches_the_workbook_module_only_from_marked_lines_and_runs_without_it(name):
    source = (LESSONS_DIR / f"{name}.py").read_text()
    tree = ast.parse(source)
    assert "# Workbook instrumentation" not in source
    guarded = [node for node in tree.body if isinstance(node, ast.Try)
               and any(isinstance(s, ast.Import) and s.names[0].name == "_workbook" for s in node.body)]
    assert len(guarded) == 1 and [h.type.id for h in guarded[0].handlers] == ["ImportError"], "a guarded import"
    lines = source.splitlines()
    uses = sorted({node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                   and isinstance(node.value, ast.Name) and node.value.id in ("workbook", "recorder")})
    assert uses, "the lesson reaches its instruments somewhere"
    unmarked = [f"{n}: {lines[n - 1].strip()}" for n in uses
                if "# workbook" not in lines[n - 1] and "# workbook" not in lines[n]]  # a call may take two lines
    assert unmarked == []


@pytest.mark.parametrize("name", [*COPIED, *INSTRUMENTED])
def test_train_is_short_enough_to_read_at_once(name):
    tree = ast.parse((LESSONS_DIR / f"{name}.py").read_text())
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    assert train.end_lineno - train.lineno + 1 < MAX_TRAIN_LINES


def test_an_unmarked_call_into_the_instrumentation_is_found():
    source = ("def train():\n    recorder = StepRecorder()  # workbook\n    inject_failure(1)\n"
              "    measure(\n        2)  # workbook: a call over two lines\n\n"
              "# Workbook instrumentation\nclass StepRecorder:\n    pass\ndef inject_failure(x):\n    pass\n"
              "def measure(x):\n    pass\n")
    lines = source.splitlines()
    assert unmarked_uses(lines, lines.index("# Workbook instrumentation") + 1, ast.parse(source)) == [
        "3: inject_failure(1)"]
