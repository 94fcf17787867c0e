"""A run directory's parts, by name: what the notebooks used to reach with ``run_dir / "..."`` paths (issue 27).

On the real run directories the failures of notebooks 05-07 left on torch 2.8 and 2.13 (tests/fixtures/run_dirs/),
and on folders laid out here the way the launcher and the lesson scripts lay them out."""

import json
from pathlib import Path

import pytest
import torch

import tutorial_lib as tl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "run_dirs"
VERSIONS = ["torch-2.8", "torch-2.13"]


def test_script_path_is_the_one_script_that_ran(tmp_path):
    written = tl.write_script("ddp_train", tmp_path)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "helper.py").write_text("# not at the top: not the run's script")
    assert tl.script_path(tmp_path) == written
    assert tl.show_script(tl.script_path(tmp_path), "setup").path == written
    (tmp_path / "other.py").write_text("")
    with pytest.raises(tl.ConfigError, match="exactly one script .*found ddp_train.py, other.py"):
        tl.script_path(tmp_path)
    with pytest.raises(tl.ConfigError, match="found none"):
        tl.script_path(tl.new_run_dir("empty", tmp_path))
    with pytest.raises(tl.ConfigError, match="does not exist"):
        tl.script_path(tmp_path / "missing")


@pytest.mark.parametrize("version", VERSIONS)
def test_read_command_gives_the_whole_file_or_one_nodes_command(version, tmp_path):
    one_node = FIXTURES / version / "07-crashing-rank"
    text = (one_node / "command.txt").read_text()
    assert tl.runs.read_command(one_node) == tl.runs.read_command(one_node, node=0) == text and text.count("\n") == 1
    with pytest.raises(tl.ConfigError, match=r"no command for node 1; nodes: \[0\]"):
        tl.runs.read_command(one_node, node=1)
    started = FIXTURES / version / "06-missing-node"  # 2 nodes, node 1 never started: one "# node 0" block
    assert tl.runs.read_command(started, node=0) == tl.runs.read_command(started).removeprefix("# node 0\n")
    with pytest.raises(tl.ConfigError, match=r"no command for node 1; nodes: \[0\]"):
        tl.runs.read_command(started, node=1)
    node0, node1 = (tl.runs.read_command(started, node=0).replace("node0", f"node{n}") for n in (0, 1))
    (tmp_path / "command.txt").write_text(f"# node 0\n{node0}# node 1\n{node1}")  # as the launcher writes 2 nodes
    assert [tl.runs.read_command(tmp_path, node=n) for n in (0, 1)] == [node0, node1] and node0 != node1


def test_read_command_of_a_folder_without_a_launch_says_so(tmp_path):
    with pytest.raises(tl.ConfigError, match="no command.txt in .*pass the folder a launch created"):
        tl.runs.read_command(tmp_path)


@pytest.mark.parametrize("version", VERSIONS)
def test_read_output_log_is_every_line_torchrun_and_the_ranks_printed(version, tmp_path):
    run_dir = FIXTURES / version / "07-skipped-collective"
    log = tl.runs.read_output_log(run_dir)
    assert log == (run_dir / "output.log").read_text() and "op.preamble.length <= op.nbytes" in log
    with pytest.raises(tl.ConfigError, match="no output.log in"):
        tl.runs.read_output_log(tmp_path)


@pytest.mark.parametrize("version", VERSIONS)
def test_workers_started_counts_every_rank_of_every_attempt_and_none_after_a_rendezvous_failure(version):
    assert tl.runs.workers_started(FIXTURES / version / "05-rank-killed-during-save-then-restarted") == 4  # 2 ranks x 2
    assert tl.runs.workers_started(FIXTURES / version / "07-crashing-rank") == 2
    assert tl.runs.workers_started(FIXTURES / version / "06-taken-port") == 0
    assert tl.runs.workers_started(FIXTURES / version / "06-missing-node") == 0


def test_workers_started_reads_the_log_folder_of_every_simulated_node(tmp_path):
    for node, ranks in ((0, 2), (1, 1)):  # node 1 started one rank when node 0 had two (a made-up layout)
        for rank in range(ranks):
            (tmp_path / "logs" / f"node{node}" / f"run_{node}" / "attempt_0" / str(rank)).mkdir(parents=True)
    assert tl.runs.workers_started(tmp_path) == 3


@pytest.mark.parametrize("version", VERSIONS)
def test_last_steps_per_rank_and_per_attempt(version):
    run_dir = FIXTURES / version / "05-rank-killed-during-save-then-restarted"
    lines = [json.loads(line) for r in (0, 1) for line in (run_dir / "metrics" / f"rank{r}.jsonl").read_text().splitlines()]
    expected = {a: {r: max(x["step"] for x in lines if x["rank"] == r and x["attempt"] == a) for r in (0, 1)} for a in (0, 1)}
    assert tl.runs.last_steps(run_dir, attempt=0) == expected[0] == {0: 6, 1: 6}  # killed in the step-6 save
    assert tl.runs.last_steps(run_dir, attempt=1) == tl.runs.last_steps(run_dir) == {0: 12, 1: 12}
    assert tl.runs.last_steps(run_dir, attempt=2) == {}
    with pytest.raises(tl.errors.MetricsError, match="no 'attempt' key"):
        tl.runs.last_steps(FIXTURES / version / "07-crashing-rank", attempt=0)


def test_read_rank_tensors_loads_each_ranks_file_in_rank_order(tmp_path):
    folder = tmp_path / "grads"
    folder.mkdir()
    for rank in (1, 0, 10, *range(2, 10)):  # rank 10 sorts before 2 by name: rank order is numeric
        torch.save({"w": torch.full((2,), float(rank))}, folder / f"grads_rank{rank}.pt")
    (folder / "grads_rank_x.pt").write_text("not a rank file")
    tensors = tl.runs.read_rank_tensors(tmp_path, "grads", folder="grads")
    assert [t["w"][0].item() for t in tensors] == list(range(11))
    assert len(tl.runs.read_rank_tensors(tmp_path, "grads", folder="grads", ranks=11)) == 11
    with pytest.raises(tl.errors.MetricsError, match="11 grads_rank.*expected 12 "):
        tl.runs.read_rank_tensors(tmp_path, "grads", folder="grads", ranks=12)
    (folder / "grads_rank3.pt").unlink()
    with pytest.raises(tl.errors.MetricsError, match=r"of ranks \[0, 1, 2, 4, .*not 0..N-1"):
        tl.runs.read_rank_tensors(tmp_path, "grads", folder="grads")
    with pytest.raises(tl.errors.MetricsError, match="no params_rank\\*.pt in .*metrics"):
        tl.runs.read_rank_tensors(tmp_path, "params")


def test_checkpoint_dir_names_the_folder_and_its_steps(tmp_path):
    with pytest.raises(tl.ConfigError, match="has no checkpoints/ folder"):
        tl.runs.checkpoint_dir(tmp_path)
    for name in ("step-3", ".tmp-step-6"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert tl.runs.checkpoint_dir(tmp_path) == tmp_path / "checkpoints"
    assert tl.runs.checkpoint_dir(tmp_path, 3) == tmp_path / "checkpoints" / "step-3"
    with pytest.raises(tl.ConfigError, match=r"no step-6 in .*there: \['step-3', '.tmp-step-6'\]"):
        tl.runs.checkpoint_dir(tmp_path, 6)


def test_read_loaded_state_is_what_the_run_dumped(tmp_path):
    with pytest.raises(tl.errors.MetricsError, match="--dump-loaded-state"):
        tl.runs.read_loaded_state(tmp_path)
    state = {"model": {"net.0.weight": torch.arange(4.0)}, "optim": {"state": {}, "param_groups": [
        {"lr": 1e-3, "betas": (0.9, 0.999), "params": ["net.0.weight"], "foreach": None}]}}
    (tmp_path / "metrics").mkdir()
    torch.save(state, tmp_path / "metrics" / "loaded_state.pt")
    assert tl.runs.diff_state_dicts(tl.runs.read_loaded_state(tmp_path), state) == []


def test_trace_files_are_each_ranks_chrome_trace(tmp_path):
    with pytest.raises(tl.errors.MetricsError, match="--profile-steps"):
        tl.runs.trace_files(tmp_path)
    (tmp_path / "metrics").mkdir()
    for rank in (1, 0):
        (tmp_path / "metrics" / f"trace_rank{rank}.json").write_text("{}")
    assert tl.runs.trace_files(tmp_path) == {0: tmp_path / "metrics" / "trace_rank0.json",
                                        1: tmp_path / "metrics" / "trace_rank1.json"}
