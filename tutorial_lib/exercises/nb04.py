"""Notebook 04's exercises (FSDP): an optimizer that sees the shards, the all-gathers of a fine wrap, one unit per
block (2U - 1 all-gathers, U reduce-scatters, 1/N of the state)."""

from __future__ import annotations

from torch import nn

from ..i18n import N_, Message
from ..notebook.script_source import import_script
from ..planning.memory_model import predict_state_bytes
from .core import Context, Difference, Spec, register, steps_reported

STEPS_41, STEPS_43 = 3, 2  # the steps 04.1's and 04.3's scripts train
BLOCKS_43 = 4  # 04.3's blocks: one unit each, plus the root
LAYERS_42 = 6  # 04.2's question: fsdp_train.py --n-layers 6 --wrap fine




def _shapes(model: nn.Module) -> dict[str, list[int]]:
    return {name: list(p.shape) for name, p in model.named_parameters()}


def _model_41() -> nn.Module:
    """04.1's model, as its script builds it."""
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def _model_43() -> nn.Module:
    """04.3's model, as its script builds it."""
    blocks = [nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(BLOCKS_43)]
    return nn.Sequential(nn.Linear(8, 32), *blocks, nn.Linear(32, 1))


def optimizer_sees_the_shards(ctx: Context) -> list[Difference]:
    """04.1: on 2 ranks each rank holds half the parameters and AdamW's state for its shards exactly (the
    planner's FSDP2 prediction), and the loss goes down."""
    found, differences = steps_reported(ctx.records(ctx.launch(nproc_per_node=2)), STEPS_41)
    shapes = _shapes(_model_41())
    for rank, mine in sorted(found.items()):
        want = predict_state_bytes(shapes, strategy="fsdp2", world_size=2, rank=rank)
        last = mine[-1]
        if last.get("param_bytes") != want.param_bytes:
            differences.append(Difference(Message("parameter bytes"), want.param_bytes,
                                          last.get("param_bytes"), rank, note=Message(
                                              "keep fully_shard: each of 2 ranks holds half of every parameter")))
        if last.get("optimizer_bytes") != want.optimizer_state_bytes:
            differences.append(Difference(
                Message("AdamW state bytes"), want.optimizer_state_bytes, last.get("optimizer_bytes"),
                rank, note=Message("an optimizer built before fully_shard holds the old full tensors: they are no "
                                   "longer the model's parameters, never get a gradient, and it never steps")))
        losses = [r.get("loss") for r in mine]
        if not all(isinstance(v, (int, float)) for v in losses) or not losses[-1] < losses[0]:
            first = losses[0] if isinstance(losses[0], (int, float)) else None
            differences.append(Difference(Message("the last step's loss (below the first step's)"),
                                          f"< {first:.6g}" if first is not None else "< first", losses[-1], rank))
    return differences


def fine_wrap_all_gathers(ctx: Context) -> int:
    """04.2: the all-gathers per step of fsdp_train.py --n-layers 6 --wrap fine: U = every Linear + the root,
    2U - 1 (the root stays gathered from its forward to its backward)."""
    lesson = import_script("fsdp_train")
    args = lesson.parse_args(["--n-layers", str(LAYERS_42), "--wrap", "fine"])
    model = lesson.TinyTransformer(args.vocab_size, args.dim, args.n_layers, args.n_heads, args.seq_len)
    units = sum(isinstance(m, nn.Linear) for m in model.modules()) + 1  # wrap_fsdp2's fine units, then the root
    return 2 * units - 1


def one_unit_per_block(ctx: Context) -> list[Difference]:
    """04.3: one unit per block and the root: 2U - 1 all-gathers and U reduce-scatters per step, U = blocks + 1,
    and each rank holds its FSDP2 shard of the parameters."""
    found, differences = steps_reported(ctx.records(ctx.launch(nproc_per_node=2)), STEPS_43)
    units = BLOCKS_43 + 1
    shapes = _shapes(_model_43())
    for rank, mine in sorted(found.items()):
        want = predict_state_bytes(shapes, strategy="fsdp2", world_size=2, rank=rank)
        gathers, scatters = [r.get("all_gathers") for r in mine], [r.get("reduce_scatters") for r in mine]
        if gathers != [2 * units - 1] * len(mine):
            differences.append(Difference(
                Message("all-gathers per step"), [2 * units - 1] * len(mine), gathers, rank,
                note=Message("{units} units ({blocks} blocks and the root): each block is gathered before its "
                             "forward and again before its backward, the root once: 2U - 1",
                             {"units": units, "blocks": BLOCKS_43})))
        if scatters != [units] * len(mine):
            differences.append(Difference(
                Message("reduce-scatters per step"), [units] * len(mine), scatters, rank,
                note=Message("one reduce-scatter per unit: fully_shard each block first, then the model")))
        if mine[-1].get("param_bytes") != want.param_bytes:
            differences.append(Difference(Message("parameter bytes"), want.param_bytes,
                                          mine[-1].get("param_bytes"), rank))
    return differences


register(Spec("04.1", N_("An optimizer that sees the shards"), solution="04_1_train.py",
              verify=optimizer_sees_the_shards,
              hints=(N_("Section 1: what does fully_shard do to the module's parameters, and when must the optimizer "
                        "be built? Compare the loss from step to step."),
                     N_("fully_shard replaces each parameter with a new DTensor: build the optimizer after the last "
                        "fully_shard call, from model.parameters()."))))
register(Spec("04.2", N_("The all-gathers of a fine wrap"), solution="04_2.py", expected=fine_wrap_all_gathers,
              wrong={52: N_("2U counts the root twice: it stays gathered from its forward until its backward"),
                     26: N_("that is U, the units (and the reduce-scatters): each inner unit is gathered twice, "
                            "for its forward and again for its backward"),
                     49: N_("the root is a unit too: fully_shard(model) after the Linears")},
              hints=(N_("Section 6: a step issues 2U - 1 all-gathers for U units. Count the units --wrap fine makes: "
                        "section 6's table gives them for 4 blocks."),
                     N_("Each block has 4 Linear layers (qkv, proj, fc1, fc2); the head is a Linear too, and the "
                        "root is one more unit: U = 4 x 6 + 2."))))
register(Spec("04.3", N_("One unit per block"), solution="04_3_train.py", verify=one_unit_per_block,
              hints=(N_("Section 6: one fully_shard on the whole model makes one unit, gathered all at once. How many "
                        "units does this model need so that only one block is gathered at a time?"),
                     N_("Call fully_shard(block) for each of the 4 blocks, then fully_shard(model): 5 units, "
                        "9 all-gathers and 5 reduce-scatters per step."))))
