"""scripts/lesson_stats.py (issue 48's lesson figures): what it counts as code, lesson and workbook lines."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("_test_lesson_stats", ROOT / "scripts" / "lesson_stats.py")
lesson_stats = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = lesson_stats
spec.loader.exec_module(lesson_stats)

LESSON = '''"""A lesson.

Its docstring spans lines 1-3 and is no code."""
import argparse  # code, line 4


def parse_args():
    """One line of docstring."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int)
    p.add_argument(
        "--lr", type=float)
    return p.parse_args()

# only a comment
x = parse_args()
record(x)  # workbook: a line of the workbook's inside the lesson

# ---------------------------------------------------------------------------------------------------------------
# Workbook instrumentation: not needed to train on a cluster.
# ---------------------------------------------------------------------------------------------------------------

def record(x):
    p = argparse.ArgumentParser()
    p.add_argument("--metrics-dir")
'''


def test_lines_flags_code_and_the_workbooks_share_are_counted_as_documented(tmp_path):
    path = tmp_path / "lesson.py"
    path.write_text(LESSON)
    stats = lesson_stats.lesson_stats(path)
    # code: 4, 7, 9, 10, 11 and 12 (one call on two lines), 13, 16, 17; then 23, 24, 25 below the banner
    assert stats == {"lines": 25, "flags": 3, "code_lines": 12, "scaffold_lines": 4, "lesson_lines": 8,
                     "lesson_share": 8 / 12}


def test_a_lesson_without_the_banner_counts_only_its_workbook_comments(tmp_path):
    path = tmp_path / "lesson.py"
    path.write_text(LESSON.split("# ----")[0])
    stats = lesson_stats.lesson_stats(path)
    assert (stats["code_lines"], stats["scaffold_lines"]) == (9, 1)


def test_every_shipped_lesson_gets_a_row_and_the_targets_are_the_issues():
    rows = {r["name"]: r for r in lesson_stats.table()}
    assert set(rows) == {p.stem for p in lesson_stats.LESSONS_DIR.glob("*.py")}
    assert {n: r["max_lines"] for n, r in rows.items() if r["max_lines"]} == {"ddp_train": 200, "train_lm": 450}
    assert all(0 < r["lesson_share"] <= 1 and r["lesson_lines"] + r["scaffold_lines"] == r["code_lines"]
               for r in rows.values())


def test_a_file_a_lesson_imports_by_plain_name_is_that_lessons_module_not_a_lesson():
    roles = {r["name"]: r["role"] for r in lesson_stats.table()}
    assert {n: r for n, r in roles.items() if r != "lesson"} == {
        "lm_model": "module of train_lm", "lm_data": "module of train_lm", "lm_checkpoint": "module of train_lm",
        "_workbook": "instruments"}


def test_a_lessons_modules_are_the_files_beside_it_that_it_imports_and_nothing_else(tmp_path):
    (tmp_path / "helper.py").write_text("X = 1\n")
    (tmp_path / "lesson.py").write_text("import os\nimport helper\nfrom helper import X\nfrom . import nothing\n"
                                        "from missing import Y\n")
    assert lesson_stats.sibling_modules(tmp_path / "lesson.py") == ["helper.py"]
