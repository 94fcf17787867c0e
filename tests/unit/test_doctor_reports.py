"""The doctor on what fresh users reported: runs stopped on request, syntax errors, printed steps.

``tests/fixtures/run_dirs/user-reports/`` holds the run directories those launches left (torch 2.13, trimmed to
what the doctor reads: metrics cut to their last lines); the other cases are run directories built here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tutorial_lib as tl

REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "run_dirs" / "user-reports"


def copy(case: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(REPORTS / case, tmp_path / case))


def set_run_json(run_dir: Path, **fields: object) -> None:
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, **fields}))


@pytest.fixture(autouse=True)
def english_after():
    yield
    tl.set_language("en")


# --- 1. a run stopped on request is no crash ----------------------------------------------------------------------


def test_an_interrupted_run_is_reported_as_interrupted_not_as_a_killed_rank(tmp_path):
    """Ctrl-C in the launching process: run.json says "interrupted"; the ranks' output (torchrun's SignalException,
    faulthandler's stacks on SIGTERM) looks like a rank that died, which the doctor said before reading run.json."""
    run_dir = copy("torch-2.13-interrupted-ddp", tmp_path)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    d = tl.diagnose(run_dir)
    assert (d.cause, d.failed, d.rank) == ("interrupted", False, None), str(d)
    assert d.fix.startswith("nothing to fix: you stopped it") and "command.txt" in d.fix, d.fix
    assert d.last_steps == {0: 255, 1: 255}, d.last_steps
    assert set(d.where) == {0, 1} and "all_reduce" in d.where[1], d.where
    text = str(d)
    assert "SIGKILL" not in text and "died without" not in text and "interrupted" in text.splitlines()[0], text
    tl.set_language("zh")
    chinese = str(d)
    assert "被中断" in chinese and "无需修复" in chinese and "修复建议" in chinese, chinese


def test_a_run_stopped_by_the_launching_process_names_its_error(tmp_path):
    run_dir = copy("torch-2.13-interrupted-ddp", tmp_path)
    set_run_json(run_dir, status="stopped", summary="stopped by ValueError")
    d = tl.diagnose(run_dir)
    assert (d.cause, d.failed) == ("stopped by the launching process", False), str(d)
    assert "raised ValueError while it waited" in d.fix and "ValueError" in d.fix_zh, d.fix


def test_a_run_stopped_at_its_timeout_is_a_hang_with_its_limit(tmp_path):
    """What run.json says when the launcher stops a run at timeout_s: status "timeout" with the limit."""
    run_dir = copy("torch-2.13-interrupted-ddp", tmp_path)
    set_run_json(run_dir, status="timeout", timeout_s=10.0, limit="timeout_s", summary="timed out")
    d = tl.diagnose(run_dir)
    assert (d.cause, d.failed, d.timeout_s, d.limit) == ("hang (wall-clock timeout)", True, 10.0, "timeout_s"), str(d)
    assert "stopped at the wall-clock limit (10 s)" in str(d), str(d)
