"""The doctor on a torchft run launched here (issue 47): a lighthouse that needs two replica groups while one runs, so
no quorum forms; the group's start is named with its group, the cause and what the lighthouse had and needed. The
other torchft failures are diagnosed from captured runs (``tests/unit/test_doctor_torchft.py``)."""

import importlib.util
import sys

import pytest

from tutorial_lib.diagnosis.causes import CauseId
from tutorial_lib.diagnosis.groups import diagnose_groups
from tutorial_lib.launcher.replicas import leftover_processes, start_lighthouse, start_replica_groups
from tutorial_lib.runs.rundir import LESSONS_DIR

pytestmark = pytest.mark.integration

MISSING = [name for name in ("torchft", "numpy") if importlib.util.find_spec(name) is None]
QUORUM_TIMEOUT_S = 5  # torchft's default is 60 s: how long the lone group waits for a quorum before it raises


@pytest.mark.skipif(bool(MISSING), reason=f"{' and '.join(MISSING)} not importable in {sys.executable}")
def test_a_lone_group_under_a_lighthouse_that_needs_two_is_a_quorum_timeout_named_with_its_group(tmp_path):
    with start_lighthouse(tmp_path / "lighthouse.log", min_replicas=2) as lighthouse, \
            start_replica_groups(LESSONS_DIR / "ft_train.py", lighthouse=lighthouse, num_groups=1, run_dir=tmp_path,
                                 env={"TORCHFT_QUORUM_TIMEOUT_SEC": str(QUORUM_TIMEOUT_S)},
                                 args=["--max-steps", 20]) as groups:
        assert groups.wait(timeout_s=120) == {0: 1}  # until it has ended: torchrun's exit code 1, its rank failed
    assert leftover_processes(groups) == []
    (report,) = diagnose_groups(tmp_path, lighthouse_log=lighthouse.log_path)
    assert (report.group, report.attempt, report.failed) == (0, 0, True)
    assert report.cause_id == CauseId.TORCHFT_QUORUM_TIMEOUT, str(report)  # what the group printed, if not
    assert report.diagnosis.error.startswith("TimeoutError: ")
    assert report.diagnosis.evidence == ("no quorum for ft_train_0 within its quorum timeout; the lighthouse had 1 "
                                         "group(s), needed min_replicas 2")
