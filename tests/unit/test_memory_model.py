"""The analytic memory model against counts done by hand for a tiny model."""

import pytest

import tutorial_lib as tl
from tutorial_lib.planning.memory_model import block_units, bytes_per_parameter, predict_state_bytes, shard_rows

# a: Linear(4 -> 3) (weight 3x4, bias 3), b: Linear(3 -> 5, no bias): 12 + 3 + 15 = 30 parameters in 3 tensors.
TINY = {"a.weight": [3, 4], "a.bias": [3], "b.weight": [5, 3]}


def test_ddp_holds_everything_on_every_rank():
    for rank in (0, 1):
        s = predict_state_bytes(TINY, strategy="ddp", world_size=2, rank=rank)
        assert (s.param_bytes, s.grad_bytes) == (120, 120)  # 30 fp32 elements
        assert s.optimizer_state_bytes == 2 * 120 + 3 * 4  # exp_avg + exp_avg_sq + one 4-byte step per tensor
        assert s.state_bytes == 120 + 120 + 252


def test_fsdp2_shards_dim0_like_torch_chunk():
    r0 = predict_state_bytes(TINY, strategy="fsdp2", world_size=2, rank=0)
    r1 = predict_state_bytes(TINY, strategy="fsdp2", world_size=2, rank=1)
    # rank 0: a.weight rows 0-1 (8), a.bias 0-1 (2), b.weight rows 0-2 (9) = 19; rank 1: 4 + 1 + 6 = 11.
    assert (r0.param_bytes, r1.param_bytes) == (19 * 4, 11 * 4)
    assert r0.param_bytes + r1.param_bytes == 120, "shards add up to the whole model"
    assert r1.optimizer_state_bytes == 2 * 44 + 12, "every rank keeps a step tensor per parameter"
    padded = predict_state_bytes(TINY, strategy="fsdp2", world_size=2, rank=1, padded=True)
    assert padded.param_bytes == 19 * 4, "the allocation is padded to ceil(dim0 / N) rows on every rank"


def test_zero1_replicates_parameters_and_partitions_whole_parameters_optimizer_state():
    # ZeroRedundancyOptimizer: largest first, each to the rank with the fewest elements so far. b.weight (15) -> rank 0;
    # a.weight (12) -> rank 1; a.bias (3) -> rank 1 (12 < 15).
    r0 = predict_state_bytes(TINY, strategy="zero1", world_size=2, rank=0)
    r1 = predict_state_bytes(TINY, strategy="zero1", world_size=2, rank=1)
    assert (r0.param_bytes, r0.grad_bytes, r1.param_bytes) == (120, 120, 120)  # replicated, as DDP
    assert r0.optimizer_state_bytes == 2 * 15 * 4 + 4  # two fp32 moments of 15 elements + one step
    assert r1.optimizer_state_bytes == 2 * 15 * 4 + 2 * 4
    assert bytes_per_parameter("zero1", world_size=2) == {"params": 4, "grads": 4, "optimizer_state": 4, "total": 12}


def test_shard_rows_with_more_ranks_than_rows():
    assert [shard_rows(3, 4, r) for r in range(4)] == [1, 1, 1, 0]
    assert [shard_rows(5, 4, r) for r in range(4)] == [2, 2, 1, 0]
    assert [shard_rows(8, 4, r) for r in range(4)] == [2, 2, 2, 2]
    assert shard_rows(5, 4, 3, padded=True) == 2


def test_fsdp1_pads_the_flat_parameter_to_a_multiple_of_world_size():
    s = predict_state_bytes(TINY, strategy="fsdp1", world_size=4, rank=3, fsdp1_units=1)
    assert s.param_bytes == 8 * 4  # ceil(30 / 4) = 8 elements on every rank
    assert s.optimizer_state_bytes == 2 * 32 + 4  # one flat parameter: one step tensor


def test_sgd_keeps_no_state_and_precision_does_not_change_persistent_state():
    assert predict_state_bytes(TINY, strategy="ddp", optimizer="sgd").optimizer_state_bytes == 0
    fp32 = predict_state_bytes(TINY, strategy="fsdp2", world_size=2, units=block_units(TINY))
    bf16 = predict_state_bytes(TINY, strategy="fsdp2", world_size=2, precision="bf16", units=block_units(TINY))
    assert fp32.state_bytes == bf16.state_bytes
    assert (fp32.unsharded_param_bytes, bf16.unsharded_param_bytes) == (30 * 4, 30 * 2)  # one unit: the root


def test_world_of_one_equals_ddp_and_bytes_per_parameter():
    one = predict_state_bytes(TINY, strategy="fsdp2")
    assert one.state_bytes == predict_state_bytes(TINY, strategy="ddp").state_bytes
    assert bytes_per_parameter("ddp") == {"params": 4, "grads": 4, "optimizer_state": 8, "total": 16}
    assert bytes_per_parameter("fsdp2", world_size=2)["total"] == 8
    assert bytes_per_parameter("fsdp2", world_size=4, optimizer="sgd")["total"] == 2


def test_block_units_groups_blocks_and_root():
    units = block_units(["embed.weight", "blocks.0.qkv.weight", "blocks.0.qkv.bias", "blocks.1.fc1.weight",
                         "head.weight"])
    assert units == {"root": ["embed.weight", "head.weight"], "blocks.0": ["blocks.0.qkv.weight", "blocks.0.qkv.bias"],
                     "blocks.1": ["blocks.1.fc1.weight"]}


@pytest.mark.parametrize("kwargs, message", [
    (dict(strategy="zero3"), "strategy must be one of"),
    (dict(strategy="ddp", precision="fp8"), "precision must be one of"),
    (dict(strategy="ddp", optimizer="lion"), "optimizer must be one of"),
    (dict(strategy="ddp", world_size=0), "world_size must be an integer >= 1, got 0"),
    (dict(strategy="ddp", world_size=2, rank=2), "rank must be an integer in 0..1, got 2"),
])
def test_bad_arguments_name_the_value(kwargs, message):
    with pytest.raises(tl.ConfigError, match=message):
        predict_state_bytes(TINY, **kwargs)


def test_a_scalar_parameter_is_replicated_by_ddp_and_refused_under_sharding():
    assert predict_state_bytes([[]], strategy="ddp", world_size=2).param_bytes == 4
    with pytest.raises(tl.ConfigError, match="0-dimensional"):
        predict_state_bytes([[]], strategy="fsdp2", world_size=2)


def test_prediction_and_tradeoff_plots_draw_one_bar_pair_per_row_and_start_at_zero():
    import pandas as pd
    table = pd.DataFrame({"label": ["DDP rank 0", "FSDP2 rank 0"], "predicted_bytes": [2**21, 2**20],
                          "measured_bytes": [2**21, 2**20]})
    ax = tl.plots.plot_memory_prediction(table).axes[0]
    assert [len(c) for c in ax.containers] == [2, 2] and ax.containers[0][0].get_height() == 2.0  # MiB
    trade = pd.DataFrame({"label": ["plain", "checkpointed"], "activation_bytes": [8 * 2**20, 2**20],
                          "step_time_s": [1.0, 1.3]})
    ax = tl.plots.plot_tradeoff(trade, "activation_bytes", "step_time_s").axes[0]
    assert ax.get_ylim()[0] == 0 and ax.get_xlim()[0] == 0 and ax.get_xlabel() == "activation (MiB)"
    assert [t.get_text() for t in ax.texts] == ["plain", "checkpointed"]
