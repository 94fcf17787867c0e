"""Issue 48: the tests compare the doctor's cause as a value (``Diagnosis.cause_id`` and its ``cause_fields``: the
exception's class, the signal, the exit code), never as its English words (``Diagnosis.cause``), which a catalogue
edit or a new wording changes without the doctor concluding anything else.

The check reads every test file's syntax tree (nothing is run). A test that checks the wording itself on purpose is
named in ``KEPT`` with the reason; a ``KEPT`` entry that no longer matches anything fails too, so the list stays true.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tutorial_lib.diagnosis.causes import CAUSE_NAMES

TESTS = Path(__file__).resolve().parents[1]
TEXT_OPS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)  # not `is`: the same object is no reading of words
STRING_METHODS = {"startswith", "endswith", "split", "rsplit", "partition", "removeprefix", "removesuffix",
                  "replace", "find", "index", "count"}


def _pattern(name: str) -> re.Pattern:
    """A cause name (its msgid) as a pattern of the names it shows: a field in parentheses any text but them
    ("Python exception (KeyError)"), another one word or a list ("killed by SIGKILL", "rank 0, 1")."""
    parts = re.split(r"(\(\{\w+\}\)|\{\w+\})", name)  # odd items: the fields
    return re.compile("".join(re.escape(part) if i % 2 == 0 else r"\([^()]+\)" if part.startswith("(")
                              else r"\S+(?:, \S+)*" for i, part in enumerate(parts)))


# One-word names ("none", "interrupted") are left out: the same word names run statuses and other things.
CAUSE_NAME_PATTERNS = [_pattern(str(name)) for name in CAUSE_NAMES.values() if " " in str(name)]

# (test file, test function, expression) -> why the text is compared there on purpose.
KEPT = {
    ("integration/test_troubleshooting.py",
     "test_a_rank_that_ends_without_a_traceback_is_named_not_the_peer_that_lost_it", "e.cause"):
        "LaunchError.cause is the launcher's one line from the rank's own log, not the doctor's cause: no id",
    ("integration/test_troubleshooting.py",
     "test_resuming_a_checkpoint_into_a_model_of_another_shape_names_the_key_and_both_shapes", "e.cause"):
        "LaunchError.cause is the root-cause traceback's exception line as logged, not the doctor's cause",
    ("integration/test_live_view.py", "test_the_red_box_survives_a_failure_that_left_no_traceback_or_log",
     "error.cause"): "LaunchError.cause, the line the red box shows: what it is for an empty traceback or log",
    ("integration/test_doctor_launches.py", "test_a_timeout_shows_the_learners_frames_not_the_runners", "e.cause"):
        "LaunchError.cause (a log line) must not show the runner's frames",
    ("unit/test_i18n.py", "test_the_doctors_report_speaks_the_chosen_language", "again.cause"):
        "the test of translation: Diagnosis.cause stays English whatever tl.language() is",
    ("unit/test_i18n.py", "test_the_doctors_report_speaks_the_chosen_language", "d.cause"):
        "the same comparison's other side",
    ("unit/test_doctor_torchft.py",
     "test_the_drills_kills_are_named_as_kills_on_purpose_and_the_failed_heal_says_where_it_stood",
     "reports[0, 0].diagnosis.cause"):
        "the wording of KILLED_ON_PURPOSE in English, beside its Chinese below (its id and fields are checked above)",
}


def _flat(node: ast.AST) -> list[ast.AST]:
    """``node``, or the items of a tuple, list or set (nested ones too)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [item for element in node.elts for item in _flat(element)]
    return [node]


def _is_cause_name(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and any(p.fullmatch(node.value) for p in CAUSE_NAME_PATTERNS))


def cause_text_uses(source: str) -> list[tuple[str, int, str, str]]:
    """Where ``source`` compares a cause's words: ``(function, line, expression, what)`` for each ``x.cause`` compared
    with ``==``, ``!=``, ``in`` or ``not in`` (alone or in a tuple), each ``x.cause.startswith(...)`` (or another
    string method), and each cause name written out (``"Python exception (KeyError)"``) that is compared equal or
    looked up in a collection (``c.name == "out of memory"``, ``x in ("port in use", ...)``). A substring check of a
    rendered text (``"NCCL error" in str(hint)``) is not one: that is a test of the wording."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            compared = {i + side for i, op in enumerate(node.ops) if isinstance(op, TEXT_OPS) for side in (0, 1)}
            causes = [item for i in sorted(compared) for item in _flat(operands[i])
                      if isinstance(item, ast.Attribute) and item.attr == "cause"]
            found.extend((function, node.lineno, ast.unparse(item), "compares .cause") for item in causes)
            for i, op in enumerate(node.ops if not causes else ()):  # one comparison of .cause is named once
                left, right = operands[i], operands[i + 1]
                if isinstance(op, (ast.Eq, ast.NotEq)):
                    names = [n for side in (left, right) for n in _flat(side) if _is_cause_name(n)]
                elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                    names = [n for n in _flat(right) if _is_cause_name(n)]
                else:
                    names = []
                found.extend((function, node.lineno, ast.unparse(n), "compares a cause name") for n in names)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STRING_METHODS
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "cause"):
            found.append((function, node.lineno, ast.unparse(node.func.value), f"parses .cause ({node.func.attr})"))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "<module>")
    return found


def test_no_test_compares_the_doctors_cause_as_english_text():
    """A test names the cause by ``CauseId`` and its fields; only the ``KEPT`` comparisons check words, on purpose."""
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        if "fixtures" in path.relative_to(TESTS).parts:
            continue
        name = path.relative_to(TESTS).as_posix()
        for function, line, expression, what in cause_text_uses(path.read_text()):
            found.setdefault((name, function, expression), []).append(f"line {line}: {what}")
    new = {f"{k[0]}::{k[1]}: {k[2]}": v for k, v in found.items() if k not in KEPT}
    assert new == {}, "compare cause_id and cause_fields instead (or add the test to KEPT, with why)"
    stale = [key for key in KEPT if key not in found]
    assert stale == [], "KEPT names comparisons that are gone: remove them"


def test_the_cause_text_check_finds_what_it_looks_for():
    """The control of the test above: each use it forbids, in a few lines, is found; the ways to say it are not."""
    source = ('def test_a():\n'
              '    assert d.cause == "out of memory"\n'
              '    assert (d.rank, d.cause) == (1, "Python exception (KeyError)")\n'
              '    assert d.cause.startswith("killed by")\n'
              '    assert next(c for c in CAUSES if c.name == "invalid device ordinal")\n'
              '    assert x in ("port in use", "rendezvous timeout")\n'
              '    assert outcome.cause is error.headline\n'
              'def test_b():\n'
              '    assert (d.cause_id, d.cause_fields) == (CauseId.PYTHON_EXCEPTION, {"name": "KeyError"})\n'
              '    assert "NCCL error" in str(hint) and f"suspected cause  {d.cause}" in text\n'
              '    assert status == "interrupted" and d.evidence == "rank 1: killed by SIGKILL at step 6"\n'
              '    assert failure.how == "killed by a signal" and "collective only rank 0, 1 calls" == x\n')
    found = cause_text_uses(source)
    assert found == [("test_a", 2, "d.cause", "compares .cause"),
                     ("test_a", 3, "d.cause", "compares .cause"),
                     ("test_a", 4, "d.cause", "parses .cause (startswith)"),
                     ("test_a", 5, "'invalid device ordinal'", "compares a cause name"),
                     ("test_a", 6, "'port in use'", "compares a cause name"),
                     ("test_a", 6, "'rendezvous timeout'", "compares a cause name"),
                     ("test_b", 12, "'collective only rank 0, 1 calls'", "compares a cause name")], found
