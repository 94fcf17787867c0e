"""``tl.progress()``'s summary (issue 45): per notebook "N of M solved", M counting every exercise of the notebook
(tried or not), and the whole workbook's; the table itself stays the DataFrame it was."""

import pandas as pd
import pytest

import tutorial_lib as tl
from tutorial_lib.exercises.core import load_all


@pytest.fixture(autouse=True)
def english():
    tl.set_language("en")
    yield
    tl.set_language("en")


def _solve(runs, exercise_id):
    ex = tl.exercise(exercise_id, runs)
    assert ex.check(ex.spec.expected(None)).solved


def test_the_summary_counts_solved_exercises_per_notebook_and_for_the_workbook_in_both_languages(tmp_path):
    specs = load_all()
    per_notebook = {nb: sum(s.notebook == nb for s in specs.values()) for nb in {s.notebook for s in specs.values()}}
    _solve(tmp_path, "01.2")
    _solve(tmp_path, "08.1")
    _solve(tmp_path, "08.2")
    assert not tl.exercise("02.2", tmp_path).check(-1).solved, "tried, not solved: not counted"
    table = tl.progress(tmp_path, notebook="08")
    assert isinstance(table, pd.DataFrame) and list(table.index) == [i for i, s in specs.items() if s.notebook == "08"]
    assert table.summary().splitlines() == [
        f"notebook 08: 2 of {per_notebook['08']} solved", f"the whole workbook: 3 of {len(specs)} solved"]
    assert table.summary("zh").splitlines() == [
        f"笔记本 08：{per_notebook['08']} 道练习已完成 2 道", f"整本练习册：{len(specs)} 道练习已完成 3 道"]
    counts = table.counts()
    assert counts.loc["01"].tolist() == [1, per_notebook["01"]]
    assert counts.loc["02"].tolist() == [0, per_notebook["02"]]
    assert counts["exercises"].sum() == len(specs) and list(counts.index) == sorted(per_notebook)


def test_the_whole_tables_summary_has_a_line_per_notebook_and_is_shown_above_the_table(tmp_path):
    _solve(tmp_path, "01.2")
    table = tl.progress(tmp_path)
    lines = table.summary().splitlines()
    assert len(lines) == len(table.counts()) + 1 and lines[0].startswith("notebook 01: 1 of ")
    assert repr(table).startswith(table.summary() + "\n\n") and "01.2" in repr(table)
    html = table._repr_html_()
    assert html.index("the whole workbook: 1 of") < html.index("<table")


def test_what_pandas_derives_from_the_table_is_a_plain_dataframe_as_before(tmp_path):
    table = tl.progress(tmp_path, notebook="01")
    solved = table[table["solved"]]
    assert type(solved) is pd.DataFrame and type(table.copy()) is pd.DataFrame
    assert not repr(solved).startswith("notebook") and table.attrs["path"].endswith("progress.json")
    assert table.loc["01.1", "checks"] == 0 and list(table.columns)[:3] == ["title", "kind", "checks"]


def test_the_shown_table_leaves_out_kind_columns_that_hold_no_value_and_the_table_keeps_them(tmp_path):
    """Issue 45 (07's outputs): a notebook without predictions or challenges showed three columns of None."""
    from tutorial_lib.exercises import store

    table = tl.progress(tmp_path, notebook="07")
    assert {"prediction", "measured", "best"} <= set(table.columns)  # the data keeps every column
    shown = table.shown()
    assert not {"prediction", "measured", "best"} & set(shown.columns) and "solved" in shown.columns
    assert "prediction" not in repr(table) and "prediction" not in table._repr_html_()

    def measured(entry):
        entry["measured"] = 1.5
    store.update(tmp_path, "07.2", measured)
    table = tl.progress(tmp_path, notebook="07")
    assert list(table.shown().columns) == [c for c in table.columns if c not in ("prediction", "best")]
    assert "measured" in repr(table) and "1.5" in repr(table)
