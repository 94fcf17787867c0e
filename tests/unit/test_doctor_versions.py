"""The doctor on the real run directories of the failures notebooks 01, 02, 05, 06 and 07 make, per torch version.

``tests/fixtures/run_dirs/torch-<major.minor>/<case>/`` holds what each failure left on that torch: captured from
a workbook run by ``scripts/capture_doctor_runs.py`` (torch 2.8 with Python 3.10 in the compat venv CI's first
leg uses, torch 2.13 in the main one), trimmed to what the doctor reads. Every case is a test on every version:
a message that one version prints and another does not (gloo's "doesn't match expected size" is gone in 2.8)
shows up here as a failing case.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

import tutorial_lib as tl
from tutorial_lib.diagnosis.cause_ids import CauseId

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "run_dirs"
VERSIONS = sorted(p.name for p in FIXTURES.glob("torch-*") if p.is_dir())
FAIL_RANK = 1  # notebooks 05 and 07 make rank 1 misbehave

# case -> what the doctor must say (cause: its CauseId; fields: its cause_fields, if any). Which rank is named first
# is left open where it is a race between the culprit and the peer that lost it (07's skipped collective, DETAIL:
# both ranks raise).
EXPECTED = {
    "01-unused-parameters": dict(cause=CauseId.UNUSED_PARAMETERS, exit_code=1),
    "02-uneven-inputs-without-join": dict(cause=CauseId.COLLECTIVE_TIMEOUT, exit_code=1),
    "05-rank0-only-fsdp-save": dict(cause=CauseId.COLLECTIVE_TIMEOUT, exit_code=1),
    "05-rank-killed-during-save-then-restarted": dict(cause=CauseId.KILLED_BY_SIGNAL, fields={"signal": "SIGKILL"},
                                                      rank=FAIL_RANK, exit_code=-9, recovered=True),
    "06-missing-node": dict(cause=CauseId.RENDEZVOUS_TIMEOUT, rank=None),
    "06-taken-port": dict(cause=CauseId.PORT_IN_USE, rank=None),
    "07-hang-stall-timeout": dict(cause=CauseId.HANG_NO_PROGRESS),
    "07-hang-collective-timeout": dict(cause=CauseId.COLLECTIVE_TIMEOUT, rank=0, exit_code=1),  # the waiting rank
    "07-skipped-collective": dict(cause=CauseId.COLLECTIVE_MISMATCH),
    "07-detail-mismatch": dict(cause=CauseId.COLLECTIVE_MISMATCH, exit_code=1),
    "07-crashing-rank": dict(cause=CauseId.PYTHON_EXCEPTION, fields={"name": "RuntimeError"}, rank=FAIL_RANK,
                             exit_code=1),
    "07-out-of-memory": dict(cause=CauseId.OUT_OF_MEMORY, rank=FAIL_RANK, exit_code=1),
    # notebook 14's compile failures (compile_train.py); every rank fails alike, so which is named first is open
    "14-compile-bucket-split": dict(cause=CauseId.COMPILE_BUCKET_SPLIT, exit_code=1),
    "14-compile-no-cxx": dict(cause=CauseId.COMPILE_NO_CXX, exit_code=1),
    "14-compile-recompile-limit": dict(cause=CauseId.COMPILE_RECOMPILE_LIMIT, exit_code=1),
    "14-compile-fullgraph-break": dict(cause=CauseId.COMPILE_GRAPH_BREAK, exit_code=1),
}


def restore(version: str, case: str, tmp_path: Path) -> Path:
    """A copy of the fixture run with its error files' modification times as they were written."""
    run_dir = Path(shutil.copytree(FIXTURES / version / case, tmp_path / case))
    base = 1_700_000_000 * 10**9
    for relative, offset_ns in json.loads((run_dir / "mtimes.json").read_text()).items():
        os.utime(run_dir / relative, ns=(base + offset_ns, base + offset_ns))
    return run_dir


def test_both_ci_versions_have_every_case():
    assert {"torch-2.8", "torch-2.13"} <= set(VERSIONS), VERSIONS
    for version in VERSIONS:
        assert {p.name for p in (FIXTURES / version).iterdir()} == set(EXPECTED), version


@pytest.mark.parametrize("case", sorted(EXPECTED))
@pytest.mark.parametrize("version", VERSIONS)
def test_the_doctor_recognises_each_notebook_failure_on_each_version(tmp_path, version, case):
    d = tl.diagnose(restore(version, case, tmp_path))
    want = EXPECTED[case]
    assert (d.cause_id, d.cause_fields) == (want["cause"], want.get("fields", {})), f"{version} {case}:\n{d}"
    recovered = want.get("recovered", False)
    assert (d.failed, d.recovered) == (not recovered, recovered), str(d)
    for name in ("rank", "exit_code"):
        if name in want:
            assert getattr(d, name) == want[name], f"{name}: {d}"
    assert d.fix and re.search(r"\((0\d|1\d), section", d.fix), "every fix points to a notebook section"
    assert "[Gloo] Rank" not in d.evidence, "start-up noise is never evidence"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_compile_failure_of_a_lesson_script_gets_the_fix_in_its_own_flags(tmp_path, version):
    """inductor without a C++ compiler: compile_train.py is told its flag (--compile-backend aot_eager); the fix of
    every compile cause is worded in Chinese too."""
    d = tl.diagnose(restore(version, "14-compile-no-cxx", tmp_path))
    assert "--compile-backend aot_eager" in d.fix and "no-such-g++" in d.evidence, str(d)
    for case in ("14-compile-no-cxx", "14-compile-recompile-limit", "14-compile-fullgraph-break"):
        d = tl.diagnose(restore(version, case, tmp_path / "zh"))
        assert d.fix_text.render("zh") != d.fix and "14" in d.fix_text.render("zh"), case


@pytest.mark.parametrize("version", VERSIONS)
def test_a_skipped_collective_is_recognised_from_the_abort_and_its_stack_alone(tmp_path, version):
    """Without gloo's enforce line, what every version leaves still names it: SIGABRT inside all_reduce."""
    run_dir = restore(version, "07-skipped-collective", tmp_path)
    log = run_dir / "output.log"
    text = log.read_text()
    stripped = "\n".join(line for line in text.splitlines() if "what():" not in line) + "\n"
    assert stripped != text and "op.preamble.length" not in stripped
    log.write_text(stripped)
    d = tl.diagnose(run_dir)
    if d.rank == FAIL_RANK:  # the peer that lost its connection was named first: the aborted rank is 0
        pytest.skip("this capture names the peer first; the abort is covered by the other version")
    assert d.cause_id == CauseId.COLLECTIVE_MISMATCH and d.signal == "SIGABRT", str(d)
    assert re.search(r"Fatal Python error: Aborted at \S+:\d+ in \w+ -> distributed_c10d\.py:\d+ in all_reduce",
                     d.evidence), d.evidence


def test_a_restarted_run_that_finished_names_what_it_recovered_from():
    version = VERSIONS[0]
    text = str(tl.diagnose(FIXTURES / version / "05-rank-killed-during-save-then-restarted"))
    assert text.splitlines()[0].startswith("recovered") and "finished after torchrun restarted the group" in text
    assert "before the restart: rank 1 first, exit code -9 (SIGKILL)" in text
    assert "killed by SIGKILL in the middle of the step-6 save" in text, "evidence from before the restart"


RACES = FIXTURES / "races"


def test_a_restart_that_reported_only_the_peer_still_names_the_rank_that_died(tmp_path):
    """torch 2.8, under load: torchrun saw rank 0's lost connection first and reported only it ('failed (exitcode:
    1) local_rank: 0'); rank 1, SIGKILLed in the save, left neither an error file nor an exit code."""
    run_dir = Path(shutil.copytree(RACES / "torch-2.8-restart-reports-only-the-peer", tmp_path / "run"))
    d = tl.diagnose(run_dir)
    assert d.recovered and d.rank == 1 and d.exit_code is None and d.cause_id == CauseId.DIED_WITHOUT_ERROR, str(d)
    assert d.evidence.endswith("killed by SIGKILL in the middle of the step-6 save") and "(07" in d.fix


def test_a_warning_printed_after_the_rank_died_is_not_its_last_words(tmp_path):
    """torch 2.8 (CI, 2 of 5 runs of notebook 05): rank 1's stderr (DCP's TypedStorage warning, two lines) reached
    output.log after its stdout's 'killed by SIGKILL' line, and torchrun reported only the peer. The evidence is
    what the rank printed, not torch's deprecation warning."""
    run_dir = Path(shutil.copytree(RACES / "torch-2.8-dcp-warning-after-the-kill-line", tmp_path / "run"))
    output = (run_dir / "output.log").read_text().splitlines()
    kill = next(i for i, line in enumerate(output) if "killed by SIGKILL in the middle" in line)
    assert any("TypedStorage is deprecated" in line for line in output[kill + 1:kill + 4] if line.startswith("[default1]"))
    d = tl.diagnose(run_dir)
    assert d.recovered and d.rank == 1 and d.cause_id == CauseId.DIED_WITHOUT_ERROR, str(d)
    assert d.evidence == "rank 1: killed by SIGKILL in the middle of the step-6 save", d.evidence
    assert not any("TypedStorage" in line or "tensor.storage()" in line for line in d.traceback_tail), d.traceback_tail


def test_when_both_ranks_time_out_the_one_with_a_reported_exit_code_is_named(tmp_path):
    """torch 2.8: both ranks' collectives timed out within the same millisecond; torchrun SIGTERMed rank 0 after it
    wrote its error file and reported only rank 1's exit code. The named rank comes with its exit code."""
    run_dir = Path(shutil.copytree(RACES / "torch-2.8-both-time-out-one-reported", tmp_path / "run"))
    d = tl.diagnose(run_dir)
    assert (d.rank, d.exit_code, d.cause_id) == (1, 1, CauseId.COLLECTIVE_TIMEOUT), str(d)
