"""Tolerances that follow from the dtype and the computation (issue 44): a check that compares two runs of a float32
reduction split differently over the ranks allows what rounding alone can make (``rounding_tolerance``), so a correct
variant that differs by rounding passes and the starter still fails. The checks run here on the check lines the ranks
would print (a replayed launch: no process), as their own verify functions read them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.exercises.core import Context, load_all, rounding_tolerance

EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture(autouse=True)
def english():
    tl.set_language("en")
    yield
    tl.set_language("en")


@dataclass
class Replayed(Context):
    """A check's context whose launches print the given check records instead of running anything: one
    ``{rank: [record, ...]}`` per launch, in order."""

    outputs: list[dict[int, list[dict]]] = field(default_factory=list)

    def launch(self, args=(), *, nproc_per_node: int = 2, script=None, **spec) -> Path:
        run_dir = self.runs_root / f"launch-{len(self.runs)}"
        run_dir.mkdir(parents=True)
        printed = self.outputs[len(self.runs)]
        lines = [f"[default{rank}]:check {json.dumps(r)}" for rank, records in printed.items() for r in records]
        (run_dir / "output.log").write_text("\n".join(lines) + "\n")
        self.runs.append(run_dir)
        return run_dir


def verify(exercise_id: str, tmp_path: Path, *outputs: dict[int, list[dict]]) -> list:
    spec = load_all()[exercise_id]
    return spec.verify(Replayed(spec, tmp_path / "train.py", tmp_path, 60.0, outputs=list(outputs)))


def scaled(values: list[float], factor: float) -> list[float]:
    return [v * factor for v in values]


def test_rounding_tolerance_is_terms_times_epsilon_times_scale_and_refuses_what_it_cannot_bound():
    assert rounding_tolerance(torch.float32, 10, 2.0) == 10 * EPS32 * 2.0
    assert rounding_tolerance(torch.float64, 10) == 10 * torch.finfo(torch.float64).eps
    for bad in ((torch.int64, 1, 1.0), (torch.float32, 0, 1.0), (torch.float32, 3, 0.0)):
        with pytest.raises(ValueError, match="a floating dtype, terms > 0 and scale > 0"):
            rounding_tolerance(*bad)


# 01.1: the gradient, a float32 mean over 16 samples; 1e-6 of its largest entry was tighter than 18 roundings.
GRAD = [-0.23453062772750854, -2.72021484375, -2.1459169387817383, -1.8528152704238892, -0.5674710869789124,
        -2.5842702388763428, -2.367067575454712, -0.30821263790130615, -0.4372957944869995]


def observed_final(grads: list[float]):
    """An observed 2-rank run whose wrapped Linear(8, 1) left ``grads`` (its weight's 8 entries, then its bias) on
    every rank, as the observer records a script that never steps (``ObservedRank.final``)."""
    from tutorial_lib.child.observer_torch import summary
    from tutorial_lib.runs.observed import ObservedRank, ObservedRun, ParamRecord, TensorRecord

    def record(t):
        return TensorRecord.of(summary(torch, t, 4096))
    weight, bias = torch.tensor([grads[:8]]), torch.tensor(grads[8:])
    params = [ParamRecord(0, "weight", None, record(weight), record(torch.zeros_like(weight))),
              ParamRecord(1, "bias", None, record(bias), record(torch.zeros_like(bias)))]
    return ObservedRun(Path("."), {r: ObservedRank(r, 2, 0, process_group={"world_size": 2}, final={1: params})
                                   for r in (0, 1)})


def test_01_1_a_gradient_a_few_roundings_away_passes_and_the_starters_half_gradient_fails():
    """01.1 compares the gradients DDP left with the solution's on the same inputs (an observed run each):
    ``SameTensors`` allows 26 float32 roundings of the largest entry."""
    from tutorial_lib.exercises.observing import Variant
    from tutorial_lib.exercises.same_values import SameTensors
    same = next(p for p in load_all()["01.1"].verify.properties if isinstance(p, SameTensors))
    variant, reference = Variant(7, ("--seed", "7"), 2), observed_final(GRAD)
    assert 15 * EPS32 > 1e-6, "15 roundings: refused by the old 1e-6, within 26 x float32's epsilon"
    assert same.check(observed_final(scaled(GRAD, 1 + 15 * EPS32)), reference, variant) == []
    found = same.check(observed_final(scaled(GRAD, 0.5)), reference, variant)
    assert [d.rank for d in found] == [0, 1] and "0.5 times one process's" in str(found[0].note)
    assert found[0].measured > 1  # the weight's largest gap, whole units: far above rounding


def tensor_record(t: torch.Tensor):
    """``t`` as the observer records it (whole: up to 4096 elements)."""
    from tutorial_lib.child.observer_torch import summary
    from tutorial_lib.runs.observed import TensorRecord
    return TensorRecord.of(summary(torch, t, 4096))


def fabricated(ranks: dict[int, dict], world_size: int = 2):
    """An observed run: ``{rank: {"losses": [(step, loss), ...], "all_reduces": [(step, backward or None, bytes),
    ...], "grads": [[tensor per parameter] per step], "names": [name or None per parameter], "state_bytes": n}}``."""
    from tutorial_lib.runs.observed import (Backward, Collective, ObservedRank, ObservedRun, OptimizerStep,
                                            ParamRecord)
    out = {}
    for rank, given in ranks.items():
        backwards = [Backward(i, step, loss, 1, (), "float32") for i, (step, loss) in enumerate(given.get("losses", []),
                                                                                             start=1)]
        collectives = [Collective(n, "all_reduce" if kind == "all_reduce" else kind, kind, "c10d::op", "0", world_size,
                                  n, nbytes, nbytes, "float32", (), "sum", step, backward)
                       for n, (kind, step, backward, nbytes) in enumerate(given.get("collectives", []), start=1)]
        names = given.get("names")
        steps = [OptimizerStep(s, "SGD", 1, (0.1,), given.get("state_bytes", 0), tuple(
            ParamRecord(i, names[i] if names else f"p{i}", 0, tensor_record(g) if g is not None else None,
                        tensor_record(torch.zeros(1))) for i, g in enumerate(grads)))
                 for s, grads in enumerate(given.get("grads", []), start=1)]
        out[rank] = ObservedRank(rank, world_size, 0, process_group={"world_size": world_size},
                                 collectives=collectives, backwards=backwards, steps=steps)
    return ObservedRun(Path("."), out)


def prop(exercise_id: str, kind: str, index: int = 0):
    """The ``index``-th property of class ``kind`` in the exercise's check (inside a ``FirstDifference`` too)."""
    from tutorial_lib.exercises.properties import FirstDifference
    found = []
    for p in load_all()[exercise_id].verify.properties:
        found += list(p.properties) if isinstance(p, FirstDifference) else [p]
    return [p for p in found if type(p).__name__ == kind][index]


def variant_of(exercise_id: str, *args: str):
    from tutorial_lib.exercises.observing import Variant
    return Variant(7, ("--seed", "7", *args), 2)


# 02.1: 3 epochs of 2 batches per rank; the starter repeats epoch 0's batches, its losses differ from epoch 1 on.
LOSSES_21 = {0: [1.5, 0.9, 0.61, 0.42, 0.3, 0.21], 1: [1.2, 1.1, 0.7, 0.5, 0.33, 0.24]}


def epochs(losses: dict[int, list[float]]):
    return fabricated({r: {"losses": [(i + 1, v) for i, v in enumerate(vs)]} for r, vs in losses.items()})


def test_02_1_losses_a_few_roundings_away_pass_and_the_starters_epoch_1_fails():
    same, variant = prop("02.1", "LossesEpochByEpoch"), variant_of("02.1", "--epochs", "3")
    reference = epochs(LOSSES_21)
    rounded_off = {r: [v * (1 + 100 * EPS32) for v in vs] for r, vs in LOSSES_21.items()}
    assert same.check(epochs(rounded_off), reference, variant) == []
    starter = {r: vs[:2] + [v * 0.8 for v in vs[2:]] for r, vs in LOSSES_21.items()}
    found = same.check(epochs(starter), reference, variant)
    assert [d.rank for d in found] == [0, 1] and "epoch 1" in str(found[0].what)
    assert "epochs before matched the solution's batch for batch" in str(found[0].note)
    assert "set_epoch" not in str(found[0].note)
    other = {r: [v * 1.1 for v in vs] for r, vs in LOSSES_21.items()}
    assert "already epoch 0's batches differ" in str(same.check(epochs(other), reference, variant)[0].note)


# 02.3: K = 4 micro-batches, 2 steps; the gradient each step applied (a Linear(8, 1)) and DDP's bucket all-reduces.
GRADS_23 = [[torch.tensor([[0.31, -1.2, 0.05, 2.2, -0.7, 0.4, 1.1, -0.02]]), torch.tensor([0.6])],
            [torch.tensor([[0.21, -0.9, 0.07, 1.8, -0.5, 0.3, 0.8, -0.03]]), torch.tensor([0.4])]]


def accumulated(pattern: list[int], factor: float = 1.0, outside: int = 0):
    """2 ranks, 2 steps of 4 backward() calls: ``pattern`` the bucket all-reduces of each, ``outside`` all-reduces
    made after them, gradients ``factor`` times ``GRADS_23``."""
    collectives = [("all_reduce", step, (step - 1) * 4 + k + 1, 36) for step in (1, 2) for k, n in
                   enumerate(pattern) for _ in range(n)]
    collectives += [("all_reduce", step, None, 36) for step in (1, 2) for _ in range(outside)]
    given = {"losses": [(step, 0.5) for step in (1, 2) for _ in range(4)], "collectives": collectives,
             "grads": [[g * factor for g in step] for step in GRADS_23]}
    return fabricated({0: given, 1: given})


def test_02_3_gradients_a_few_roundings_away_pass_and_the_starters_all_reduce_per_micro_batch_fails():
    variant, reference = variant_of("02.3", "--micro-batches", "4"), accumulated([0, 0, 0, 1])
    calls, same = prop("02.3", "AllReducesPerMicroBatch"), prop("02.3", "SameTensors")
    fix = accumulated([0, 0, 0, 1], 1 + 30 * EPS32)
    assert 30 * EPS32 * 2.2 > 1e-6, "30 roundings of the largest entry: refused by the old 1e-6 absolute"
    assert calls.check(fix, reference, variant) == [] and same.check(fix, reference, variant) == []
    found = calls.check(accumulated([1, 1, 1, 1]), reference, variant)
    assert [d.rank for d in found] == [0, 1] and found[0].expected == [0, 0, 0, 1] and found[0].measured == [1] * 4
    assert "4 bucket all-reduces for 4 micro-batches" in str(found[0].note) and "4 x the communication" in str(
        found[0].note)
    weighted = same.check(accumulated([0, 0, 0, 1], 4.0), reference, variant)  # the loss left undivided by K
    assert weighted and "4 times the solution's" in str(weighted[0].note)


@pytest.mark.parametrize("calls, outside, said", [
    ([1, 1, 1, 1], 0, "every micro-batch synchronised its gradients, 4 x the communication"),
    ([0, 1, 0, 1], 0, "2 of them synchronised their gradients, 2 x the communication"),
    ([0, 0, 0, 0], 0, "no gradient all-reduce in this step"),
    ([0, 0, 0, 0], 2, "no all-reduce inside this step's backward() calls, and 2 outside them"),
    ([1, 0, 0, 0], 0, "all-reduced in micro-batch 1 of 4, before the last"),
])
def test_02_3_says_what_each_wrong_pattern_of_all_reduces_did_and_never_names_no_sync(calls, outside, said):
    found = prop("02.3", "AllReducesPerMicroBatch").check(accumulated(calls, outside=outside),
                                                          accumulated([0, 0, 0, 1]), variant_of("02.3"))
    assert found and said in str(found[0].note) and "no_sync" not in str(found[0].note), str(found[0].note)


# 03.1: 3 steps of a Linear(8, 16), Tanh, Linear(16, 1) under fp16 autocast; the solution scales its loss by 65536.
GRADS_31 = [[torch.linspace(-1, 1, 128).reshape(16, 8) * 1e-8 * (s + 1), torch.full((16,), 3e-9),
             torch.linspace(0.5, 2, 16).reshape(1, 16) * 1e-8, torch.tensor([4e-9])] for s in range(3)]


def scaled_run(scale: float, factor: float = 1.0, lost: int = 0):
    """2 ranks, 3 steps: backward() ran on ``scale`` x the unscaled loss; the gradients ``factor`` x ``GRADS_31``,
    their first ``lost`` weight entries 0."""
    grads = []
    for step in GRADS_31:
        first = step[0].clone() * factor
        first.view(-1)[:lost] = 0
        grads.append([first, *[g * factor for g in step[1:]]])
    given = {"losses": [(s + 1, 0.003 * (s + 1) * scale / 2**16) for s in range(3)], "grads": grads}
    return fabricated({0: given, 1: given})


def test_03_1_a_scale_of_1_lost_entries_and_other_gradients_fail_and_another_power_of_two_passes():
    check, variant = load_all()["03.1"].verify.properties[-1], variant_of("03.1", "--batch", "16")
    reference = scaled_run(2**16)
    assert check.check(scaled_run(2**20, 1 + 7e-4), reference, variant) == []  # 2**20: fp16 rounds elsewhere
    starter = check.check(scaled_run(1.0), reference, variant)
    assert [d.rank for d in starter] == [0, 1] and starter[0].measured == [1.0, 1.0, 1.0]
    assert starter[0].expected == [65536] * 3 and "a scale of 1" in str(starter[0].note)
    lost = check.check(scaled_run(2**10, lost=5), reference, variant)
    assert "entries exactly 0" in str(lost[0].what) and str(lost[0].measured) == "5 of 161"
    off = check.check(scaled_run(2**16, 1.05), reference, variant)  # 5 %: above 14 fp16 roundings
    assert "norm of the gradients" in str(off[0].what) and "1.05 times the solution's" in str(off[0].note)
    assert all("GradScaler" not in str(d.note) for d in starter + lost + off)


# 03.3: 5 steps clipped at --max-norm 1.0; the starter clips the scaled gradients, its optimizer gets 1/1024 of that.
def clipped(norms: list[float]):
    direction = [torch.linspace(-1, 1, 128).reshape(16, 8), torch.ones(16), torch.ones(1, 16), torch.ones(1)]
    whole = torch.cat([d.flatten() for d in direction]).norm()
    given = {"grads": [[d * (n / whole) for d in direction] for n in norms]}
    return fabricated({0: given, 1: given})


def test_03_3_clipped_norms_a_few_roundings_away_pass_and_the_starters_1_over_the_scale_fails():
    norms, variant = prop("03.3", "SameGradNorms"), variant_of("03.3", "--max-norm", "1.0")
    reference = clipped([1.0] * 5)
    assert norms.check(clipped([1.0 - 100 * EPS32] * 5), reference, variant) == []
    found = norms.check(clipped([1 / 1024] * 5), reference, variant)
    assert [d.rank for d in found] == [0, 1] and found[0].measured == [0.0009766] * 5
    assert "about 1/1024" in str(found[0].note) and "unscale_" not in str(found[0].note)
    unclipped = norms.check(clipped([12.0, 1.0, 1.0, 1.0, 1.0]), reference, variant)
    assert "at step 1" in str(unclipped[0].note) and "nothing bounded them" in str(unclipped[0].note)


# 04.1: the optimizer built before fully_shard steps 6 tensors that are not the model's (no name, no gradient).
def test_04_1_an_optimizer_of_other_tensors_fails_and_losses_a_few_roundings_away_pass():
    check, variant = load_all()["04.1"].verify.properties[-1], variant_of("04.1", "--batch", "8")
    grads = [torch.full((32, 16), 0.01), torch.full((32,), 0.02)]
    losses = [(1, 0.0142), (2, 0.0047), (3, 0.0056)]

    def run(names, stepped, loss_factor=1.0, state=1000):
        given = {"names": names, "grads": [stepped] * 3, "state_bytes": state,
                 "losses": [(s, v * loss_factor) for s, v in losses]}
        return fabricated({0: given, 1: given})
    reference = run(["0.weight", "0.bias"], grads)
    assert check.check(run(["0.weight", "0.bias"], grads, 1 + 200 * EPS32), reference, variant) == []
    starter = check.check(run([None, None], [None, None], state=0), reference, variant)
    assert [d.rank for d in starter] == [0, 1] and (starter[0].expected, starter[0].measured) == (2, 0)
    assert "0 of them the model's parameters" in str(starter[0].note)
    assert not any(k in str(starter[0].note) for k in ("build the optimizer", "built before fully_shard"))
    assert "optimizer state bytes" in str(check.check(run(["0.weight", "0.bias"], grads, state=2000), reference,
                                                      variant)[0].what)
    slower = check.check(run(["0.weight", "0.bias"], grads, 1.01), reference, variant)
    assert "the loss backward() 1 ran on" in str(slower[0].what)


# 04.3: --blocks 4: the solution's 9 all-gathers and 5 reduce-scatters per step, each of one unit's bytes.
def units(gathers: list[int], scatters: list[int]):
    given = {"losses": [(1, 0.1), (2, 0.09)], "grads": [[torch.ones(1)]] * 2,
             "collectives": [(kind, step, None, n) for step in (1, 2) for kind, sizes in
                             (("all_gather", gathers), ("reduce_scatter", scatters)) for n in sizes]}
    return fabricated({0: given, 1: given})


def test_04_3_one_unit_fails_and_made_up_collectives_of_other_sizes_fail_too():
    variant = variant_of("04.3", "--blocks", "4")
    gathers, scatters = prop("04.3", "UnitCollectives", 0), prop("04.3", "UnitCollectives", 1)
    block, root = 2112, 1096  # a block's Linear(32, 32) over 2 ranks; the root's two Linear layers
    reference = units([root] + [block] * 4 + [block] * 4, [block * 2] * 4 + [root * 2])
    assert gathers.check(reference, reference, variant) == [] and scatters.check(reference, reference, variant) == []
    one = units([root + 4 * block], [2 * (root + 4 * block)])
    found = gathers.check(one, reference, variant)
    assert found[0].expected == [9, 9] and found[0].measured == [1, 1]
    assert "1 all-gather per step for 4 blocks" in str(found[0].note)
    assert "1 reduce-scatter per step" in str(scatters.check(one, reference, variant)[0].note)
    made_up = units([root + 4 * block] + [4] * 8, [2 * (root + 4 * block)] + [8] * 4)  # counts copied, empty calls
    found = gathers.check(made_up, reference, variant)
    assert "bytes this rank put into each all_gather" in str(found[0].what) and "of other sizes" in str(found[0].note)
    assert not any(k in str(d.note) for d in found for k in ("fully_shard(block)", "fully_shard each block"))


def test_the_norm_each_step_applied_puts_a_sharded_gradient_together_across_the_ranks():
    """``grad_norms``: a ``Shard`` placement's norm is every rank's shard together (FSDP2), a replicated one the rank's
    own (DDP); rank 1's empty shard of a 1-row parameter adds nothing."""
    from tutorial_lib.exercises.same_values import grad_norms
    from tutorial_lib.runs.observed import ObservedRank, ObservedRun, OptimizerStep, ParamRecord, TensorRecord

    def shard(values: list[float], placements: list[str]):
        fields = {k: v for k, v in tensor_record(torch.tensor(values)).__dict__.items() if v is not None}
        return TensorRecord(**{**fields, "placements": tuple(placements), "global_shape": (2,)})

    def rank(r: int, sharded: list[float], replicated: list[float]):
        params = (ParamRecord(0, "w", 0, shard(sharded, ["S(0)"]), shard(sharded, ["S(0)"])),
                  ParamRecord(1, "b", 0, shard(replicated, ["R"]), shard(replicated, ["R"])))
        return ObservedRank(r, 2, 0, steps=[OptimizerStep(1, "AdamW", 1, (0.01,), 0, params)])
    norms = grad_norms(ObservedRun(Path("."), {0: rank(0, [3.0], [12.0]), 1: rank(1, [4.0], [12.0])}))
    assert norms == {0: [13.0], 1: [13.0]}  # sqrt(3^2 + 4^2 + 12^2)
    empty = grad_norms(ObservedRun(Path("."), {0: rank(0, [3.0, 4.0], [0.0]), 1: rank(1, [], [0.0])}))
    assert empty == {0: [5.0], 1: [5.0]}


# 08.3, 09.3, 10.3: their properties on fabricated observed runs (no launch), as the observer records them.
def recorded(t: torch.Tensor, **where):
    """``t`` as the observer records it (bit for bit), with a DTensor's ``placements``, ``mesh``, ``global_shape``."""
    from tutorial_lib.child.observer_torch import summary
    from tutorial_lib.runs.observed import TensorRecord

    return TensorRecord.of({**summary(torch, t, 4096), **where})


def all_reduce(elements: int, backward: int, step: int, dtype: str = "float32", kind: str = "all_reduce"):
    from tutorial_lib.runs.observed import Collective

    size = elements * getattr(torch, dtype).itemsize
    return Collective(seq=0, op=kind, kind=kind, torch_op=f"c10d::{kind}", group="0", group_size=2, group_seq=0,
                      input_bytes=size, output_bytes=size, dtype=dtype, shapes=((elements,),), reduce_op="sum",
                      step=step, backward=backward)


MLP_ELEMENTS = 529_416  # 08.3's Linear(512, 512), Linear(512, 512), Linear(512, 8) with biases
REBUILT = [266_760, 262_656]  # DDP's buckets from the second backward at a 1 MiB cap: output and hidden, then input


def ddp_run(buckets_per_backward: list[list[int]], logged: list[int], dtype: str = "float32", extra=()):
    """A 2-rank observed DDP run: backward ``b`` all-reduces ``buckets_per_backward[b - 1]`` (elements, in ``dtype``)
    and steps the optimizer; DDP logged buckets of ``logged`` elements (fp32) at the end; ``extra``: more collectives
    as ``(elements, backward, dtype)``."""
    from tutorial_lib.runs.observed import Backward, ObservedRank, ObservedRun, OptimizerStep, Wrap

    settings = {"parameters": {"tensors": 6, "numel": MLP_ELEMENTS, "bytes": 4 * MLP_ELEMENTS},
                "bucket_sizes_bytes": [4 * n for n in logged]}
    ranks = {}
    for rank in (0, 1):
        collectives = [all_reduce(n, b, b, dtype) for b, sizes in enumerate(buckets_per_backward, start=1)
                       for n in sizes] + [all_reduce(n, b, b, d) for n, b, d in extra]
        ranks[rank] = ObservedRank(
            rank, 2, 0, process_group={"world_size": 2}, collectives=collectives,
            wraps=[Wrap(1, "DistributedDataParallel", "Sequential", 1, settings)],
            steps=[OptimizerStep(b, "SGD", 1, (0.01,), 0, ()) for b in range(1, len(buckets_per_backward) + 1)],
            backwards=[Backward(b, b, 0.01, 1, (), "float32") for b in range(1, len(buckets_per_backward) + 1)])
    return ObservedRun(Path("."), ranks)


def property_of(exercise_id: str, kind):
    return next(p for p in load_all()[exercise_id].verify.properties if isinstance(p, kind))


def test_08_3_two_buckets_from_the_second_backward_pass_one_bucket_or_one_split_in_two_fails():
    from tutorial_lib.exercises.observing import Variant
    from tutorial_lib.exercises.properties import Buckets
    buckets, variant = property_of("08.3", Buckets), Variant(7, ("--seed", "7"), 2)
    assert buckets.check(ddp_run([[MLP_ELEMENTS], REBUILT, REBUILT], REBUILT), None, variant) == []
    # find_unused_parameters' int32 flags are not gradients; a run of 2 backwards has its rebuilt buckets unlogged
    flags = [(6, b, "int32") for b in (1, 2, 3)]
    assert buckets.check(ddp_run([[MLP_ELEMENTS], REBUILT, REBUILT], REBUILT, extra=flags), None, variant) == []
    assert buckets.check(ddp_run([[MLP_ELEMENTS], REBUILT], [MLP_ELEMENTS]), None, variant) == []
    starter = buckets.check(ddp_run([[MLP_ELEMENTS]] * 3, [MLP_ELEMENTS]), None, variant)
    assert [(d.rank, d.expected, d.measured) for d in starter] == [(0, ">= 2", 1), (1, ">= 2", 1)]
    assert "gradient all-reduces in backward() 2" == str(starter[0].what)
    assert "overlapped none of the computation" in str(starter[0].note) and "bucket_cap_mb" not in str(starter[0].note)
    half = MLP_ELEMENTS // 2  # the one bucket sent as two all-reduces by a hook, after the whole backward
    split = buckets.check(ddp_run([[MLP_ELEMENTS], [half, half], [half, half]], [MLP_ELEMENTS]), None, variant)
    assert [(d.expected, d.measured) for d in split] == [([MLP_ELEMENTS], [half, half])] * 2
    assert "something other than DDP's reducer" in str(split[0].note)
    added = buckets.check(ddp_run([[MLP_ELEMENTS], REBUILT, REBUILT], REBUILT, extra=[(1, 2, "float32")]), None,
                          variant)
    assert [(str(d.what), d.measured) for d in added][0] == ("gradient elements all-reduced in backward() 2",
                                                            MLP_ELEMENTS + 1)
    none = buckets.check(ddp_run([[MLP_ELEMENTS], [], []], [MLP_ELEMENTS]), None, variant)
    assert none[0].measured == 0 and "all-reduced no gradient" in str(none[0].note)


def test_10_3_a_16_bit_wire_passes_and_fp32_fails_and_a_gradient_bf16_rounding_away_passes_but_twice_it_fails():
    from tutorial_lib.exercises.observing import Variant
    from tutorial_lib.exercises.properties import Buckets
    from tutorial_lib.exercises.same_values import SameTensors
    variant = Variant(7, ("--seed", "7"), 2)
    wire = property_of("10.3", Buckets)
    assert wire.check(ddp_run([[MLP_ELEMENTS]], [MLP_ELEMENTS], "bfloat16"), None, variant) == []
    fp32 = wire.check(ddp_run([[MLP_ELEMENTS]], [MLP_ELEMENTS], "float32"), None, variant)
    assert fp32[0].measured == "float32" and "4 bytes each" in str(fp32[0].note)
    same = property_of("10.3", SameTensors)
    grad = [0.25 * (i % 7 - 3) + 0.01 for i in range(9)]  # a Linear(8, 1)'s weight and bias
    reference = observed_final(grad)
    # a cast to bf16 before the sum and the sum's rounding, on each side: 2**-8 of the largest entry, 4 times over
    assert same.check(observed_final(scaled(grad, 1 + 4 * 2**-8)), reference, variant) == []
    assert 4 * 2**-8 > 26 * EPS32, "what the float32 tolerance would refuse"
    found = same.check(observed_final(scaled(grad, 2.0)), reference, variant)
    assert [d.rank for d in found] == [0, 1] and "2 times the solution's" in str(found[0].note)


def fsdp_run(reduce_scatters: list[list[int]], grads: list[torch.Tensor]):
    """A 2-rank observed FSDP2 run of 3 units: step ``s`` has a backward per entry of ``reduce_scatters[s - 1]``, each
    with that many reduce-scatters, then an optimizer step with the parameters' gradients ``grads`` sharded on dim 0."""
    from tutorial_lib.runs.observed import Backward, ObservedRank, ObservedRun, OptimizerStep, ParamRecord, Wrap

    mesh = {"shape": [2], "ranks": [0, 1]}
    ranks = {}
    for rank in (0, 1):
        collectives, backwards = [], []
        for step, per_backward in enumerate(reduce_scatters, start=1):
            for count in per_backward:
                backwards.append(Backward(len(backwards) + 1, step, 0.5, 1, (), "float32"))
                collectives += [all_reduce(8, len(backwards), step, kind="reduce_scatter")] * count
        params = tuple(ParamRecord(i, f"p{i}", 0, recorded(g.chunk(2)[rank].contiguous(), placements=["S(0)"],
                                                                  mesh=mesh, global_shape=list(g.shape)),
                                   recorded(torch.zeros(1))) for i, g in enumerate(grads))
        ranks[rank] = ObservedRank(
            rank, 2, 0, process_group={"world_size": 2}, collectives=collectives, backwards=backwards,
            wraps=[Wrap(1, "fully_shard", "Sequential", 1, {"units": [{"path": p} for p in ("0", "2", "")]})],
            steps=[OptimizerStep(s, "SGD", 1, (0.1,), 0, params) for s in range(1, len(reduce_scatters) + 1)])
    return ObservedRun(Path("."), ranks)


@pytest.mark.parametrize("pattern, said", [
    ([3, 3, 3, 3], "every one of the step's 4 backward() calls reduce-scattered its gradients: 12 reduce-scatters "
                   "for 3 units, 4 x the communication"),
    ([0, 3, 0, 3], "2 of the step's 4 backward() calls reduce-scattered their gradients: 6 reduce-scatters for 3 "
                   "units, 2 x"),
    ([0, 0, 0, 0], "0 reduce-scatters for 3 units: the accumulated gradients of some units were never summed"),
])
def test_09_3_one_reduce_scatter_per_unit_passes_and_each_wrong_pattern_says_what_the_step_did(pattern, said):
    from tutorial_lib.exercises.nb09 import ReduceScattersPerStep
    from tutorial_lib.exercises.observing import Variant
    count, variant = property_of("09.3", ReduceScattersPerStep), Variant(7, ("--seed", "7"), 2)
    grads = [torch.arange(8.0).reshape(4, 2), torch.ones(2)]
    solution = fsdp_run([[0, 0, 0, 3], [0, 0, 0, 3]], grads)
    assert count.check(fsdp_run([[0, 0, 0, 3], [0, 0, 0, 3]], grads), solution, variant) == []
    found = count.check(fsdp_run([pattern, [0, 0, 0, 3]], grads), solution, variant)
    assert [(str(d.what), d.rank, d.expected) for d in found] == [("reduce-scatters in optimizer step 1", r, 3)
                                                                   for r in (0, 1)]
    assert said in str(found[0].note) and "set_requires_gradient_sync" not in str(found[0].note), str(found[0].note)


def test_09_3_fsdp2_gradients_put_together_a_few_roundings_away_pass_and_half_of_them_fails():
    """09.3's SameTensors compares the gradients each step was taken with, the ranks' shards put together: 67 float32
    terms (64 samples, 3 roundings after) of the largest entry."""
    from tutorial_lib.exercises.observing import Variant
    from tutorial_lib.exercises.same_values import SameTensors
    same, variant = property_of("09.3", SameTensors), Variant(7, ("--seed", "7"), 2)
    grads = [torch.tensor([[0.5, -1.25], [2.0, 0.75], [-0.3, 0.1], [1.5, -2.5]]), torch.tensor([0.2, -0.4])]
    solution = fsdp_run([[0, 0, 0, 3]], grads)
    assert same.check(fsdp_run([[0, 0, 0, 3]], [g * (1 + 40 * EPS32) for g in grads]), solution, variant) == []
    found = same.check(fsdp_run([[0, 0, 0, 3]], [g * 0.5 for g in grads]), solution, variant)
    assert len(found) == 1 and found[0].rank is None and "(step 1)" in str(found[0].what)
    assert "0.5 times the solution's" in str(found[0].note)
