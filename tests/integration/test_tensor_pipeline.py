"""tensor_parallel.py, pipeline_parallel.py and context_parallel_float8.py under torchrun (notebook 12's claims, on
small sizes): collective counts, exact activation bytes, equality with one process, the bubble from the stages'
recorded orders, and the refusals.

Every test uses ``run_root``, which fails the test if any process of its jobs survives.
"""

import subprocess
from fractions import Fraction

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.runs.rundir import LESSONS_DIR

pytestmark = pytest.mark.integration

TP_SMALL = ["--dim", 32, "--n-heads", 4, "--vocab-size", 64, "--seq-len", 8, "--n-layers", 1, "--max-steps", 2]
EPS = torch.finfo(torch.float32).eps


def run(name, args, run_root, nproc=2):
    return tl.run_script(name, args, runs_dir=run_root, device="cpu", nproc_per_node=nproc, timeout_s=180, live="off")


def test_tensor_parallel_block_sequence_and_model_on_two_ranks(run_root):
    ranks = tl.runs.read_rank_json(run(
        "tensor_parallel", [*TP_SMALL, "--lessons", "block", "sequence", "model"], run_root).run_dir, "tp")
    none = {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0}
    for r in ranks:
        block, sp = r["block"], r["sequence"]["SP"]
        assert block["TP"]["collectives_forward"] == block["TP"]["collectives_backward"] == {**none, "all_reduce": 2}
        assert block["TP, q/k/v each ColwiseParallel"]["collectives_backward"] == {**none, "all_reduce": 4}
        assert sp["collectives_forward"] == sp["collectives_backward"] == {**none, "all_gather": 2, "reduce_scatter": 2}
        one = block["one_process"]["activation_bytes"]
        for module, nbytes in one.items():  # heads and hidden units split; the norms (and their outputs) whole
            whole_tp = module in {"norm1", "norm2", "attn.wq", "mlp.fc1"}
            assert block["TP"]["activation_bytes"][module] == (nbytes if whole_tp else nbytes / 2), module
            whole_sp = module in {"attn.wq", "mlp.fc1"}
            assert sp["activation_bytes"][module] == (nbytes if whole_sp else nbytes / 2), module
        tol = 4 * 32 * EPS
        for run_ in (block["TP"], sp):
            assert run_["output_max_abs_diff"] <= tol * run_["output_max_abs"]
            assert run_["param_grad_max_abs_diff"] <= tol * run_["param_grad_max_abs"]
        assert block["fused qkv, ColwiseParallel (wrong)"]["output_max_abs_diff"] > 0.1 * block["TP"]["output_max_abs"]
        assert block["shapes"]["attn.wq.weight"] == {"global": [32, 32], "local": [16, 32], "placements": ["Shard(0)"]}
        assert block["shapes"]["attn.wo.weight"]["placements"] == ["Shard(1)"]
        assert r["sequence"]["norm_grad_placements"] == ["Partial()"], "SP: each rank's norm gradient is a partial sum"
        for label, expected in [("TP", {"all_reduce": 4 + 1 + 3, "all_gather": 0, "reduce_scatter": 0}),
                                ("TP + SP", {"all_reduce": 3 + 2 * 3, "all_gather": 4 + 2, "reduce_scatter": 4 + 1})]:
            model = r["model"][label]
            assert model["steps"][0]["collectives"] == expected, (label, model["steps"][0])
            assert model["logits_local_shape"] == [4, 8, 32] and model["logits_placements"] == ["Shard(2)"]
            for s in model["steps"]:
                assert abs(s["loss"] - s["loss_one_process"]) <= 64 * EPS * s["loss_one_process"], (label, s)
        assert r["model"]["TP + SP"]["steps"][0]["activation_bytes"] < r["model"]["TP"]["steps"][0]["activation_bytes"]


def test_fsdp_by_tensor_parallel_on_a_two_by_two_mesh(run_root):
    ranks = tl.runs.read_rank_json(run("tensor_parallel", [*TP_SMALL, "--lessons", "2d"], run_root, nproc=4).run_dir, "tp")
    rows_of_q = set()
    for rank in ranks:
        r = rank["2d"]
        dp, tp = r["mesh_coordinate"]
        assert r["tp_group"] == [2 * dp, 2 * dp + 1] and r["dp_group"] == [tp, tp + 2], r
        rows_of_q.add(tuple(r["holdings"]["blocks.0.attn.wq.weight"][0]))
        assert r["holdings"]["blocks.0.attn.wq.weight"][0] == [(2 * tp + dp) * 8, (2 * tp + dp + 1) * 8]
        assert r["steps"][1]["collectives_by_group"] == {
            f"all_gather {r['dp_group']}": 3, f"all_gather {r['tp_group']}": 1, f"all_reduce {r['tp_group']}": 5,
            f"reduce_scatter {r['dp_group']}": 2}, r["steps"][1]["collectives_by_group"]
        for s in r["steps"]:
            assert abs(s["loss"] - s["loss_one_process_same_rows"]) <= 64 * EPS * s["loss"], s
    assert len(rows_of_q) == 4, "each rank holds its own quarter of q's rows"
    for step in range(2):
        mean = sum(r["2d"]["steps"][step]["loss"] for r in ranks) / 4
        assert abs(mean - ranks[0]["2d"]["steps"][step]["loss_one_process_whole_batch"]) <= 64 * EPS * mean


def test_pipeline_bubble_memory_and_gradients_from_what_the_stages_did(run_root):
    pp = tl.runs.read_rank_json(run("pipeline_parallel", ["--microbatches", 1, 2, 4, "--batch-size", 8, "--input-dim", 32,
                                                     "--hidden-dim", 64], run_root).run_dir, "pp")
    events = tl.runs.pipeline_events(pp)
    seen = set()
    for (schedule, m), run_ in events.groupby(["schedule", "microbatches"]):
        seen.add((schedule, m))
        orders = {s: [f"{a}{i}" for a, i in zip(g["action"], g["microbatch"])]
                  for s, g in run_.sort_values("position").groupby("stage")}
        slots = tl.runs.replay_slots(orders)
        span = int(slots["end_slot"].max())
        busy = (slots["end_slot"] - slots["start_slot"]).groupby(slots["stage"]).sum()
        assert all(Fraction(span - int(b), span) == Fraction(1, m + 1) for b in busy), (schedule, m)
        assert tl.runs.order_violations(run_) == []
    assert seen == {("by hand", 1), ("gpipe", 2), ("gpipe", 4), ("1f1b", 2), ("1f1b", 4)}
    for r in pp:
        for run_ in r["runs"]:
            in_flight = {"gpipe": run_["microbatches"], "1f1b": min(run_["microbatches"], 2 - r["stage"]), "by hand": 1}
            assert run_["peak_saved_bytes"] == in_flight[run_["schedule"]] * run_["events"][0]["saved_bytes_after"]
            assert run_["p2p"] == {"send": run_["microbatches"], "recv": run_["microbatches"]}
            assert run_["grad_max_abs_diff"] <= 64 * EPS * run_["grad_max_abs"], run_
            if r["stage"] == 1:
                assert abs(run_["loss"] - r["loss_unsplit"]) <= 8 * 32 * EPS * r["loss_unsplit"]
        assert r["control_scale_grads_false"]["grad_norm_ratio"] == pytest.approx(4)
        verdicts = r["one_microbatch_accepted"]
        assert verdicts["1f1b"].startswith("ValueError: Number of microbatches (1) must be greater than or equal")
        if torch.__version__.startswith("2.8."):
            assert verdicts["gpipe"] == verdicts["1f1b"]
        elif torch.__version__.startswith("2.13."):
            assert verdicts["gpipe"] == "accepted"


def test_context_parallel_and_float8_record_why_they_do_not_run_on_cpu_and_leave_sdpa_alone(run_root):
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor
    sdpa, handlers = F.scaled_dot_product_attention, DTensor._op_dispatcher._custom_op_handlers
    result = tl.run_in_process("context_parallel_float8", ["--seq-len", 64], runs_dir=run_root)
    (r,) = tl.runs.read_rank_json(result.run_dir, "cp_float8")
    assert not r["context_parallel"]["ran"] and r["context_parallel"]["reason"] == (
        "NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a "
        "sharding strategy registered.")
    assert not r["float8"]["ran"] and "compute capability >= 8.9" in r["float8"]["reason"]
    # torch 2.8's context_parallel leaves both patched after the error; the script puts them back
    assert F.scaled_dot_product_attention is sdpa and DTensor._op_dispatcher._custom_op_handlers is handlers


def test_context_parallel_and_float8_under_torchrun_on_cpu_ranks_say_why_on_every_rank(run_root):
    ranks = tl.runs.read_rank_json(run("context_parallel_float8", ["--seq-len", 64], run_root).run_dir, "cp_float8")
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    for r in ranks:
        assert not r["context_parallel"]["ran"] and "for_cpu.default does not have a sharding strategy" in \
            r["context_parallel"]["reason"]
        assert r["context_parallel"]["local_shape"] == [2, 8, 32, 64], "each rank held half the sequence when it failed"
        assert not r["float8"]["ran"] and "this rank runs on cpu" in r["float8"]["reason"]


@pytest.mark.parametrize("script, args, message", [
    ("tensor_parallel", ["--lessons", "block", "2d"], "--lessons 2d needs an even world of at least 4 ranks"),
    ("tensor_parallel", ["--dim", 30, "--n-heads", 4], "--n-heads must divide --dim, got --dim 30 --n-heads 4"),
    ("tensor_parallel", ["--max-steps", 1], "--max-steps must be >= 2"),
    ("pipeline_parallel", ["--microbatches", 3], "--microbatches must each be > 0 and divide --batch-size 32"),
    # issue 35: in torch a batch of 10 in 3 failed in the loss ("The size of tensor a (4) must match ... (3)")
    ("pipeline_parallel", ["--batch-size", 10, "--microbatches", 2, 3], "got [3]; 10 in 3 would be [4, 3, 3]"),
    ("context_parallel_float8", ["--matmul-size", 100], "--matmul-size must be a multiple of 16"),
])
def test_bad_input_is_refused_with_the_value_named(tmp_path, script, args, message, forked_python):
    python, env = forked_python  # the refusal is the point, not the start-up: torch imported once
    out = subprocess.run([*python, LESSONS_DIR / f"{script}.py", *map(str, args)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode in (1, 2) and message in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "metrics").exists()


def test_sizes_the_split_cannot_divide_and_a_third_stage_are_refused():
    tp = tl.import_script(LESSONS_DIR / "tensor_parallel.py")
    with pytest.raises(ValueError, match="--n-heads 8 is not divisible by the tensor-parallel size 3"):
        tp.check_world(tp.parse_args(["--lessons", "block"]), 3)
    tp.check_world(tp.parse_args(["--lessons", "block", "2d"]), 4)
    # notebook 12's choice of a TP size: the most ranks the check accepts (3 GPUs: TP on 2 of them), 0 for none
    assert [tp.largest_tp_size(n) for n in (1, 2, 3, 6, 8)] == [0, 2, 2, 4, 8]
    with pytest.raises(ValueError, match="WORLD_SIZE must be 2 \\(or 1: both halves in one stage\\), got 3"):
        tl.import_script(LESSONS_DIR / "pipeline_parallel.py").check_world(3)


def test_tensor_parallel_memory_plan_equals_torchs_tracker_on_two_real_ranks(run_root):
    """tl.planning.plan_tp_memory (fake mode, one process) against tensor_parallel.py --track-memory (the same MemTracker on
    2 real gloo ranks), AdamW, TP and TP + SP, every rank: parameters and optimizer state byte for byte; the total
    from the plan to the plan plus one collective's buffer (gloo's thread may free it after the next allocation:
    compare_tp_plan's docstring); usually every category equal (torch 2.8 and 2.13)."""
    args = [*TP_SMALL, "--optimizer", "adamw"]
    ranks = tl.runs.read_rank_json(run("tensor_parallel", [*args, "--lessons", "model", "--track-memory"],
                                  run_root).run_dir, "tp")
    for layout in tl.planning.TP_LAYOUTS:
        plan = tl.planning.plan_tp_memory(args, world_size=2, layout=layout)
        # fp32 parameter, gradient and 2 moments: 16 bytes per local element; AdamW's step: one fp32 per tensor
        assert plan.peak_bytes["parameters"] == plan.state_bytes_analytic / 4
        n_tensors = 2 + 16 * 1 + 3  # the embeddings, 16 per block (4 Linears, 2 norms: weight and bias), norm, head
        assert plan.peak_bytes["optimizer state"] == 2 * plan.peak_bytes["parameters"] + 4 * n_tensors
        assert plan.peak_bytes["activations"] > 0 and plan.peak_bytes["temporaries"] > 0, plan
        assert plan.unsimulated_bytes == 4 * 4 * 8 * 32  # batch x tokens x width, fp32
        for measured in tl.planning.read_tp_memory(ranks, layout):
            table = tl.planning.compare_tp_plan(plan, measured)
            assert (table.loc[["parameters", "optimizer state"], "difference_bytes"] == 0).all(), (layout, table)
            assert 0 <= -table.loc["total", "difference_bytes"] <= plan.unsimulated_bytes, (layout, table)
    # SP's norm gradients are Partial: AdamW's update reads each three times (the first moment once, the second
    # moment's addcmul twice) and each read all-reduces it; SGD reads it once (notebook 12 asserts that count).
    n_norm_params = 2 * (2 * 1 + 1)  # weight and bias of 2 norms per block (1 block) and the final norm
    for r in ranks:
        assert r["model"]["TP + SP"]["steps"][0]["collectives"]["all_reduce"] == 3 + 3 * n_norm_params, r["model"]
    one_rank = tl.planning.plan_tp_memory(args, world_size=1)  # a control: one rank holds the whole model
    D, V = 32, 64
    split = 3 * (D * D + D) + D * D + (4 * D * D + 4 * D) + 4 * D * D + V * D  # q, k, v, wo, fc1, fc2 weights; head
    assert one_rank.peak_bytes["parameters"] == 4 * plan.n_params
    assert plan.peak_bytes["parameters"] == 4 * (plan.n_params - split // 2), "each rank holds half the split ones"


@pytest.mark.parametrize("kwargs, message", [
    ({"layout": "pp"}, "pipeline stages are not planned"), ({"layout": "2d"}, "2-D FSDP x TP"),
    ({"args": ["--lessons", "2d"]}, "--lessons 2d"), ({"world_size": 3}, "--n-heads 8 is not divisible"),
    ({"args": ["--dim", 60]}, "invalid flags"), ({"world_size": 0}, "world_size must be an int >= 1")])
def test_the_tp_planner_refuses_layouts_it_does_not_plan(kwargs, message):
    with pytest.raises(tl.ConfigError, match=message):
        tl.planning.plan_tp_memory(**kwargs)
