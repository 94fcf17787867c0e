"""The small named readers notebooks 05 and 07 use instead of globbing torchrun's files and regexes in cells (issue 17),
on the real run directories each failure left on torch 2.8 and 2.13 (tests/fixtures/run_dirs/)."""

from pathlib import Path

import pytest

import tutorial_lib as tl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "run_dirs"
VERSIONS = ["torch-2.8", "torch-2.13"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_skipped_collective_shows_as_an_abort_inside_all_reduce(version):
    assert tl.runs.fatal_errors(FIXTURES / version / "07-skipped-collective") == [
        tl.runs.FatalError(rank=0, error="Aborted", function="all_reduce")]
    assert tl.runs.fatal_errors(FIXTURES / version / "07-crashing-rank") == [], "a Python exception is no fatal error"


@pytest.mark.parametrize("version", VERSIONS)
def test_detail_names_each_ranks_own_collective(version):
    assert tl.runs.collective_fingerprints(FIXTURES / version / "07-detail-mismatch") == [
        (0, "ALLREDUCE", ()), (1, "ALLREDUCE", (64, 64))]
    assert tl.runs.collective_fingerprints(FIXTURES / version / "07-crashing-rank") == []


@pytest.mark.parametrize("version", VERSIONS)
def test_a_rank_killed_during_a_save_left_no_error_file_and_its_peer_lost_the_connection(version):
    run_dir = FIXTURES / version / "05-rank-killed-during-save-then-restarted"
    first = tl.runs.rank_errors(run_dir, attempt=0)
    assert list(first) == [0] and tl.runs.lost_connection(first[0])
    assert tl.runs.rank_errors(run_dir, attempt=1) == {} and tl.runs.rank_errors(run_dir) == {}, "the restart finished"
    assert tl.runs.agent_failures(run_dir) == [(1, -9)]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_collective_timeout_is_in_the_error_files(version):
    errors = tl.runs.rank_errors(FIXTURES / version / "05-rank0-only-fsdp-save")
    assert errors and all("Timed out" in e for e in errors.values())
    assert not any(tl.runs.lost_connection(e) for e in errors.values())
    crash = tl.runs.rank_errors(FIXTURES / version / "07-crashing-rank")
    assert "RuntimeError: injected failure on rank 1" in crash[1] and not tl.runs.lost_connection(crash[1])
    assert tl.runs.lost_connection(crash[0]), "its peer failed on the lost connection"


def test_count_log_matches_counts_every_line_of_output_log(tmp_path):
    (tmp_path / "output.log").write_text("[default0]:[I1130 12:00:00] a\n[default1]:[I1130 12:00:01] b\nNCCL INFO x\n")
    assert tl.runs.count_log_matches(tmp_path, {"info": r"\[I\d{4} ", "nccl": "NCCL INFO", "none": "xyz"}) == {
        "info": 2, "nccl": 1, "none": 0}
