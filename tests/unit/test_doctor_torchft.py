"""The doctor on torchft's failures (issue 47), from captured replica-group runs.

``tests/fixtures/run_dirs/torchft/`` holds real runs of ``ft_train.py`` under ``launcher/replicas.py`` (torch 2.13,
torchft 0.2.0), captured by ``scripts/capture_torchft_runs.py``: a lighthouse at a port nothing listens on, a
lighthouse SIGKILLed while a group trained, a lighthouse that needs two groups while one runs (quorum timeout 5 s), and
a group SIGKILLed then restarted with numpy hidden (a ``sitecustomize`` that puts ``None`` in ``sys.modules["numpy"]``).
``sender-killed-mid-heal`` is ``tl.run_hard_failure("sender_mid_heal")`` from notebook 15 (group 0's log cut to its
last 150 lines, the lighthouse's log left out): group 1 SIGKILLed, restarted, and group 0 SIGKILLing itself while it
sent its state; each killed start holds the drill's kill record.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import tutorial_lib as tl
from tutorial_lib.diagnosis.causes import CauseId
from tutorial_lib.diagnosis.groups import diagnose_groups
from tutorial_lib.errors import ConfigError
from tutorial_lib.i18n import language, set_language

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "run_dirs" / "torchft"


def causes(case: str) -> list[tuple[int, int, CauseId]]:
    return [(g.group, g.attempt, g.cause_id) for g in diagnose_groups(RUNS / case)]


def test_a_lighthouse_nothing_listens_at_is_named_with_its_address():
    (report,) = diagnose_groups(RUNS / "lighthouse-unreachable")
    assert (report.group, report.attempt, report.failed) == (0, 0, True)
    assert report.cause_id == CauseId.TORCHFT_LIGHTHOUSE_UNREACHABLE
    assert report.diagnosis.evidence == "the lighthouse at http://127.0.0.1:34789 refused the connection for 60s"
    assert "TORCHFT_LIGHTHOUSE" in report.diagnosis.fix


def test_a_lighthouse_killed_mid_run_is_unreachable_not_a_quorum_timeout():
    """The group's own traceback is the quorum's TimeoutError; its heartbeats failing first are the cause."""
    (report,) = diagnose_groups(RUNS / "lighthouse-killed")
    assert report.diagnosis.error.startswith("TimeoutError:")
    assert report.cause_id == CauseId.TORCHFT_LIGHTHOUSE_UNREACHABLE
    assert report.diagnosis.evidence.startswith("heartbeats to the lighthouse failed: ")


def test_a_quorum_timeout_says_how_many_groups_the_lighthouse_had_and_needed():
    (report,) = diagnose_groups(RUNS / "quorum-timeout")
    assert report.cause_id == CauseId.TORCHFT_QUORUM_TIMEOUT
    assert report.diagnosis.evidence == ("no quorum for ft_train_0 within its quorum timeout; the lighthouse had 1 "
                                         "group(s), needed min_replicas 2")
    assert "min_replicas" in report.diagnosis.fix and "TORCHFT_QUORUM_TIMEOUT_SEC" in report.diagnosis.fix


def test_a_heal_without_numpy_names_the_healing_group_and_the_healthy_one_it_took_down(tmp_path):
    assert causes("recovery-without-numpy") == [
        (0, 0, CauseId.TORCHFT_RECOVERY_FAILED),  # the healthy group, sending its state: the peer closed
        (1, 0, CauseId.DIED_WITHOUT_ERROR),  # SIGKILLed on purpose (torchrun and rank at once): no error left
        (1, 1, CauseId.TORCHFT_RECOVERY_WITHOUT_NUMPY),  # restarted without numpy: the heal failed
    ]
    sender, _killed, healing = diagnose_groups(RUNS / "recovery-without-numpy")
    # The restarted group fell behind (step 0 against 74) and could not catch up; the sender names whom it served.
    assert healing.diagnosis.evidence == "at step 0, behind the others' step 74: Numpy is not available"
    assert sender.diagnosis.evidence.startswith("at step 74, sending its state to replica rank(s) 1: ")
    assert "Connection closed by peer" in sender.diagnosis.evidence
    # The last step each start logged, read from torchft's log prefix ("[ft_train_1:.../0 - step 0]")
    assert (sender.diagnosis.last_steps, healing.diagnosis.last_steps) == ({0: 74}, {0: 0})
    assert "pip install numpy" in healing.diagnosis.fix
    assert healing.diagnosis.error == "AssertionError"  # what it raised: torchft's DDP hook after the failed heal


def test_the_heal_context_is_worded_in_the_language_in_use_and_the_log_line_stays_as_logged():
    before = language()
    set_language("zh")
    try:
        _sender, _killed, healing = diagnose_groups(RUNS / "recovery-without-numpy")
    finally:
        set_language(before)
    assert healing.diagnosis.evidence == "在第 0 步，落后于其他组的第 74 步: Numpy is not available"


def test_one_groups_start_is_a_run_directory_for_diagnose():
    folder = RUNS / "recovery-without-numpy" / "group1" / "attempt1"
    diagnosis = tl.diagnose(folder)
    assert (diagnosis.cause_id, diagnosis.rank, diagnosis.exit_code) == (CauseId.TORCHFT_RECOVERY_WITHOUT_NUMPY, 0, 1)
    assert diagnosis.evidence == "Numpy is not available"


def test_the_report_names_the_group_and_its_start_in_every_language():
    report = diagnose_groups(RUNS / "recovery-without-numpy")[2]
    assert str(report).splitlines()[0] == "replica group 1, start 1:"
    assert report.rows()[0] == ("replica group", "group 1, start 1")
    assert report._repr_html_().startswith("<table><caption style='text-align:left'>group 1, start 1</caption><tr>")
    try:
        set_language("zh")
        rows = dict(report.rows())
        assert report.rows()[0] == ("副本组（replica group）", "第 1 组，第 1 次启动")
        assert rows["修复建议"].startswith("重新加入的组无法完成恢复") and "pip install numpy" in rows["修复建议"]
    finally:
        set_language("en")


def test_a_folder_without_replica_groups_is_a_config_error(tmp_path):
    (tmp_path / "logs").mkdir()
    with pytest.raises(ConfigError, match="holds no group<G>/attempt<A>/ folder"):
        diagnose_groups(tmp_path)


def test_a_missing_lighthouse_log_leaves_the_quorum_evidence_as_the_group_logged_it(tmp_path):
    run_dir = Path(shutil.copytree(RUNS / "quorum-timeout", tmp_path / "run"))
    (run_dir / "lighthouse.log").unlink()
    (report,) = diagnose_groups(run_dir)
    assert report.diagnosis.evidence == "no quorum for ft_train_0 within its quorum timeout"


def test_replica_attempt_folders_are_listed_by_group_then_start_as_numbers(tmp_path):
    from tutorial_lib.runs.replica_records import replica_attempt_dirs
    for group, attempt in [(10, 0), (2, 1), (2, 0), (2, 10)]:
        (tmp_path / f"group{group}" / f"attempt{attempt}").mkdir(parents=True)
    (tmp_path / "group2" / "attempts").mkdir()  # not an attempt folder
    assert [(g, a) for g, a, _folder in replica_attempt_dirs(tmp_path)] == [(2, 0), (2, 1), (2, 10), (10, 0)]


def test_the_doctor_command_reports_every_start_of_a_replica_group_run(capsys):
    from tutorial_lib.__main__ import main
    assert main(["doctor", str(RUNS / "recovery-without-numpy")]) == 1
    out = capsys.readouterr().out
    starts = [line for line in out.splitlines() if line.startswith("replica group ")]
    assert starts == ["replica group 0, start 0:", "replica group 1, start 0:", "replica group 1, start 1:"]
    assert "torchft recovery without numpy: at step 0, behind the others' step 74: Numpy is not available" in out


def test_the_drills_kills_are_named_as_kills_on_purpose_and_the_failed_heal_says_where_it_stood():
    reports = {(g.group, g.attempt): g for g in diagnose_groups(RUNS / "sender-killed-mid-heal")}
    assert {k: g.cause_id for k, g in reports.items()} == {(0, 0): CauseId.KILLED_ON_PURPOSE,
                                                          (1, 0): CauseId.KILLED_ON_PURPOSE,
                                                          (1, 1): CauseId.TORCHFT_RECOVERY_FAILED}
    assert reports[0, 0].diagnosis.cause_fields == {"by": "ft_train.py --die-sending-state-if"}
    assert reports[1, 0].diagnosis.cause_fields == {"by": "ReplicaGroups.kill"}
    assert reports[0, 0].diagnosis.cause == "killed on purpose (ft_train.py --die-sending-state-if)"
    assert "OOM" not in reports[0, 0].diagnosis.fix and "SIGKILL" in reports[0, 0].diagnosis.fix
    assert reports[1, 1].diagnosis.evidence.startswith("at step 0, behind the others' step 107: ")
    assert "resume from your latest checkpoint" in reports[1, 1].diagnosis.fix
    try:
        set_language("zh")
        assert reports[0, 0].diagnosis.cause_text.render() == "被有意杀死（ft_train.py --die-sending-state-if）"
        assert dict(reports[0, 0].rows())["修复建议"].startswith("不是脚本的故障")
    finally:
        set_language("en")


def test_without_its_kill_record_the_same_start_is_a_death_without_an_error(tmp_path):
    """The control: the record, not the logs, makes a kill one on purpose."""
    shutil.copytree(RUNS / "sender-killed-mid-heal", tmp_path / "run")
    for record in (tmp_path / "run").rglob("killed.json"):
        record.unlink()
    assert causes_of(tmp_path / "run")[:2] == [(0, 0, CauseId.DIED_WITHOUT_ERROR), (1, 0, CauseId.DIED_WITHOUT_ERROR)]


def causes_of(run_dir):
    return [(g.group, g.attempt, g.cause_id) for g in diagnose_groups(run_dir)]


def test_the_records_hold_the_state_send_the_sender_died_in_at_its_last_committed_step():
    records = tl.runs.read_replica_records(RUNS / "sender-killed-mid-heal" / "metrics")
    deaths = [s for s in records.sends if s.killed_itself]
    assert [(d.replica_group, d.step) for d in deaths] == [(0, 107)] == [(0, records.committed(0)[-1].step)]
    rejoined = records.committed(1, pid=records.starts[1][-1])
    assert [(s.step, s.batches_committed, s.participants) for s in rejoined] == [(k, k, 1) for k in range(1, 7)]
