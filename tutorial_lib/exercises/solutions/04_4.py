# Exercise 04.4: the all-gathers rank 1 issues in one FSDP2 step of 04_4_units.py, for any round's variant.
# The model: --blocks blocks, each its own unit (fully_shard(block, reshard_after_forward=...)), then the root
# (fully_shard(model): the input and output Linear). Every unit is all-gathered before its forward. A block whose
# forward freed its gathered weights (reshard_after_forward=True) is gathered again before its backward; one that kept
# them (False) is not. The root keeps its own from its forward to its backward: one all-gather.


def answer(options):
    """The count for a round's flags: answer({"--blocks": "4", "--reshard-after-forward": "true"}) -> 9."""
    blocks = int(options["--blocks"])
    per_block = 2 if options["--reshard-after-forward"] == "true" else 1
    return per_block * blocks + 1  # 2B + 1 (2U - 1 with U = B + 1 units), or B + 1
