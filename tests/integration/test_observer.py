"""observe=True: what each rank really did, recorded from torch inside the rank, not from what the script prints.

Each fixture in tests/fixtures/observe_*.py knows exactly what it does (its docstring says why); 2 gloo ranks through
``tl.run_script``, the records read with ``result.observed()``. The last tests run one script through the rank runner
alone, as torchrun starts a rank: a crash, a script without torch, a second observer, a forked child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.child import protocol
from tutorial_lib.errors import MetricsError
from tutorial_lib.launcher.plan import RANK_RUNNER
from tutorial_lib.torchrun.output_lines import rank_lines

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# observe_collectives.py's collectives on each rank, in order: (op, dtype, input bytes, output bytes).
COLLECTIVES = [("all_reduce", "float32", 40, 40), ("all_reduce", "float64", 56, 56),
               ("all_reduce", "float16", 2000, 2000), ("all_reduce", "int64", 24, 24),
               ("all_reduce", "float32", 20, 20), ("broadcast", "float32", 16, 16), ("all_gather", "float32", 24, 48)]
LAYER_BYTES = 32 * 32 * 4 + 32 * 4  # observe_ddp_no_sync.py's Linear(32, 32): one bucket each


def launch(run_root, name, args=(), **spec):
    return tl.run_script(str(FIXTURES / name), list(args), runs_dir=run_root, nproc_per_node=2, device="cpu",
                         live="off", **spec)


def printed(run_dir) -> dict[int, list[str]]:
    lines: dict[int, list[str]] = {}
    for rank, text in rank_lines(tl.runs.read_output_log(run_dir)):
        if rank is not None:
            lines.setdefault(rank, []).append(text)
    return lines


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_every_collective_is_recorded_in_order_with_its_size_and_dtype(run_root, start):
    run = launch(run_root, "observe_collectives.py", observe=True, warm=start == "warm").observed()
    assert sorted(run.ranks) == [0, 1]
    for rank in run:
        assert [(c.op, c.dtype, c.input_bytes, c.output_bytes) for c in rank.collectives] == COLLECTIVES
        assert {(c.group_size, c.group_seq) for c in rank.collectives} == {(2, n) for n in range(1, 8)}
        assert rank.process_group["world_size"] == 2 and rank.process_group["backend"] == "gloo"
        assert rank.groups[rank.process_group["group"]]["ranks"] == [0, 1]
        assert rank.seeds == [1234] and rank.initial_seed == 1234
        assert rank.complete and rank.exit_code == 0 and rank.errors == []
        # where the script called each one: its own line, at module level (torch's and the runner's frames left out)
        assert [[(Path(s.path).name, s.line, s.function) for s in c.stack] for c in rank.collectives] == \
            [[("observe_collectives.py", line, "<module>")] for line in (19, 19, 19, 19, 23, 26, 29)]


def test_observing_off_leaves_no_record_and_the_same_output(run_root):
    off = launch(run_root, "observe_collectives.py")
    on = launch(run_root, "observe_collectives.py", observe=True)
    assert not (off.run_dir / "observed").exists()
    assert sorted(p.name for p in (on.run_dir / "observed").iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
    assert printed(off.run_dir) == printed(on.run_dir) and len(printed(on.run_dir)[1]) == 7
    with pytest.raises(MetricsError, match="launch with observe=True"):
        off.observed()


def test_ddp_all_reduces_one_bucket_round_per_accumulated_step_not_per_micro_batch(run_root):
    """observe_ddp_no_sync.py: 3 steps of 4 micro-batches, the first 3 under no_sync. DDP's first synced backward
    all-reduces one bucket holding everything; it then rebuilds one bucket per layer (its docstring says why)."""
    run = launch(run_root, "observe_ddp_no_sync.py", [run_root], observe=True).observed()
    for rank in run:
        assert rank.per_backward("all_reduce") == [0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 3]
        assert rank.per_step("all_reduce") == [1, 3, 3]
        assert [c.input_bytes for c in rank.collectives_of("all_reduce", step=1)] == [3 * LAYER_BYTES]
        assert [c.input_bytes for c in rank.collectives_of("all_reduce", step=3)] == [LAYER_BYTES] * 3
        settings = rank.ddp_settings()
        assert settings["find_unused_parameters"] is False and settings["bucket_cap_bytes"] == 4000
        assert len(rank.backwards) == 12 and all(isinstance(loss, float) for loss in rank.losses())


def test_gradients_at_each_optimizer_step_are_exactly_what_the_script_stepped_with(run_root):
    result = launch(run_root, "observe_ddp_no_sync.py", [run_root], observe=True)
    run = result.observed()
    for rank in run:
        saved = torch.load(run_root / f"grads_rank{rank.rank}.pt")
        assert [s.step for s in rank.steps] == [1, 2, 3] and len(saved) == 3
        for step, grads in zip(rank.steps, saved):
            assert [p.name for p in step.params] == list(grads)
            for name, grad in grads.items():
                assert torch.equal(step.param(name).grad.tensor(), grad), (rank.rank, step.step, name)
    # DDP averaged the gradients: both ranks stepped with the same ones.
    assert all(torch.equal(a.grad.tensor(), b.grad.tensor()) for a, b in zip(run[0].steps[2].params,
                                                                             run[1].steps[2].params))


def test_find_unused_parameters_and_a_comm_hook_are_recorded_as_the_script_set_them(run_root):
    args = [run_root, "--find-unused", "--fp16-hook"]
    run = launch(run_root, "observe_ddp_no_sync.py", args, observe=True).observed()
    for rank in run:
        settings = rank.ddp_settings()
        assert settings["find_unused_parameters"] is True and settings["comm_hooks"] == ["fp16_compress_hook"]
        for step in (1, 2, 3):
            synced = rank.collectives_of("all_reduce", step=step)
            # the hook sends every gradient in float16, half its fp32 bytes; find_unused_parameters costs one more
            # all-reduce per synced backward: DDP's int32 flag per parameter tensor (6 of them), which no hook sees
            assert sum(c.input_bytes for c in synced if c.dtype == "float16") == 3 * LAYER_BYTES // 2
            assert [(c.dtype, c.input_bytes) for c in synced if c.dtype != "float16"] == [("int32", 6 * 4)]


def test_a_tensor_parallel_plan_is_recorded_with_the_collectives_it_makes(run_root):
    """observe_tensor_parallel.py: a column-wise then a row-wise Linear on a 2-rank mesh; the row-wise layer's partial
    sums are all-reduced once per forward and its input's gradient once per backward."""
    run = launch(run_root, "observe_tensor_parallel.py", observe=True).observed()
    for rank in run:
        (wrap,) = rank.latest_wraps("parallelize_module")
        assert {path: style["style"] for path, style in wrap.settings["plan"].items()} == {
            "up": "ColwiseParallel", "down": "RowwiseParallel"}
        assert wrap.settings["mesh"]["shape"] == [2]
        assert rank.per_step("all_reduce") == [2, 2]
        up, down = rank.steps[0].param("up.weight").value, rank.steps[0].param("down.weight").value
        assert (up.placements, up.global_shape, up.shape) == (("S(0)",), (16, 16), (8, 16))  # 8 output rows
        assert (down.placements, down.global_shape, down.shape) == (("S(1)",), (4, 16), (4, 8))  # 8 input columns


def test_fsdp2_all_gathers_and_reduce_scatters_per_unit_and_step(run_root):
    """observe_fsdp2_units.py: 4 blocks and the root, U = 5 units: 2U - 1 = 9 all-gathers, 5 reduce-scatters a step."""
    run = launch(run_root, "observe_fsdp2_units.py", [run_root], observe=True).observed()
    for rank in run:
        assert rank.per_step("all_gather") == [9, 9] and rank.per_step("reduce_scatter") == [5, 5]
        assert rank.per_backward("all_gather") == [4, 4] and rank.per_backward("reduce_scatter") == [5, 5]
        units = rank.fully_shard_units()
        assert [u["reshard_after_forward"] for u in units] == [True] * 4 + [False]  # the root stays gathered
        assert [u["mesh"]["shape"] for u in units] == [[2]] * 5
        first = rank.steps[0].param("0.weight")
        assert first.value.placements == ("S(0)",) and first.value.global_shape == (16, 8)
        assert first.value.shape == (8, 8)  # this rank's half of the rows
    saved = torch.load(run_root / "grads_rank0.pt")
    for index, (name, grad) in enumerate(saved.items()):
        assert torch.equal(run.gathered(2, index, "grad"), grad), name
    # at the end, the root's parameters once (its units are inside it), with the gradients the script left
    (final,) = run[0].final.values()
    assert [p.name for p in final] == list(saved)


def test_a_script_that_prints_check_lines_but_does_no_collective_is_observed_doing_none(run_root):
    result = launch(run_root, "observe_fake_check_lines.py", observe=True)
    assert all(text.startswith("check ") for lines in printed(result.run_dir).values() for text in lines)
    run = result.observed()
    for rank in run:
        assert rank.collectives == [] and rank.backwards == [] and rank.steps == [] and rank.wraps == []
        assert rank.process_group["world_size"] == 2 and rank.complete


def run_observed(tmp_path, source: str) -> subprocess.CompletedProcess:
    """``source`` run as rank 0 of 1 through the rank runner with the observer on (as torchrun starts a rank)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = {**os.environ, protocol.OBSERVE_ENV: str(tmp_path / "observed"), "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "1"}
    return subprocess.run([sys.executable, str(RANK_RUNNER), str(script)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_rank_killed_mid_run_leaves_what_was_recorded_so_far(tmp_path):
    ran = run_observed(tmp_path, """
        import os, signal, torch
        torch.manual_seed(3)
        torch.ones(2, requires_grad=True).sum().backward()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert ran.returncode == -signal.SIGKILL
    rank = tl.runs.read_observed(tmp_path)[0]
    assert rank.seeds == [3] and rank.losses() == [2.0] and not rank.complete


def test_a_script_without_torch_is_observed_without_importing_torch(tmp_path):
    ran = run_observed(tmp_path, """
        import sys
        print("torch imported:", "torch" in sys.modules)
        sys.exit(3)
    """)
    assert (ran.returncode, ran.stdout) == (3, "torch imported: False\n")
    rank = tl.runs.read_observed(tmp_path)[0]
    assert rank.torch_version is None and rank.exit_code == 3 and rank.collectives == []


def test_a_bad_full_tensor_limit_is_said_and_the_script_runs_unobserved(tmp_path, monkeypatch):
    monkeypatch.setenv("TUTORIAL_LIB_OBSERVE_FULL_NUMEL", "lots")
    ran = run_observed(tmp_path, "print('ran')\n")
    assert (ran.returncode, ran.stdout) == (0, "ran\n")
    assert "[observer] not observing this rank" in ran.stderr and "TUTORIAL_LIB_OBSERVE_FULL_NUMEL='lots'" in ran.stderr
    assert not (tmp_path / "observed" / "rank0.jsonl").exists()


def test_a_second_observer_never_overwrites_a_record_and_forked_processes_record_nothing(tmp_path):
    source = """
        import os, torch
        pid = os.fork()
        if pid == 0:  # a child of the rank (what a DataLoader worker is): its seed is not the rank's
            torch.manual_seed(5)
            os._exit(0)
        os.waitpid(pid, 0)
        torch.manual_seed(6)
    """
    assert run_observed(tmp_path, source).returncode == 0
    record = (tmp_path / "observed" / "rank0.jsonl").read_bytes()
    again = run_observed(tmp_path, source)
    assert again.returncode == 0 and "[observer] not observing this rank" in again.stderr
    assert (tmp_path / "observed" / "rank0.jsonl").read_bytes() == record
    assert tl.runs.read_observed(tmp_path)[0].seeds == [6]
