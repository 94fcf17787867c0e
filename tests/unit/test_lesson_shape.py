"""The scripts a learner copies read lesson first (issues 27 and 48): everything the workbook adds to measure them is
in the sibling module ``_workbook.py`` that the lesson imports only when it is there, and the lesson reaches it only from
lines marked ``# workbook``, so a copy alone trains without it and a learner reads the lesson, not instrumentation."""

from __future__ import annotations

import ast

import pytest

from tutorial_lib.runs.rundir import LESSONS_DIR

# their instruments are in _workbook.py
INSTRUMENTED = ["ddp_train", "fsdp_train", "checkpoint_train", "pipeline_parallel", "train_lm", "train_hf"]
TRAINERS = ["ddp_train", "fsdp_train", "checkpoint_train", "train_lm"]  # the lessons with a training loop, train()
MAX_TRAIN_LINES = 60


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


@pytest.mark.parametrize("name", TRAINERS)
def test_train_is_short_enough_to_read_at_once(name):
    tree = ast.parse((LESSONS_DIR / f"{name}.py").read_text())
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    assert train.end_lineno - train.lineno + 1 < MAX_TRAIN_LINES
