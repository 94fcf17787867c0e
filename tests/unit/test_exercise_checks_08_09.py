"""Exercises 08.4 and 09.4 on fabricated observed runs (issue 44), as their checks read what each rank did (no launch
here): 08.4's measure of what is left to all-reduce after backward (a queue on a wire as fast as backward), its count
of all-reduces and its guard of every gradient once in fp32; 09.4's all-gathers per step in forward and in backward,
each wrong pattern said as what the run did, never as the setting that fixes it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tutorial_lib as tl
from tutorial_lib.exercises.core import load_all
from tutorial_lib.exercises.observing import Variant
from tutorial_lib.runs.observed import Backward, Collective, ObservedRank, ObservedRun, OptimizerStep, Wrap

VARIANT = Variant(7, ("--seed", "7"), 2)
LAYERS = (8_224, 263_168, 525_312, 1_050_624, 526_336, 33_792)  # 08.4's layers, output first: fp32 weight + bias
DEFAULT = [1_847_328, 560_128]  # DDP's default buckets from the second backward: a 1 MiB first bucket, then the rest
DESIGNED = [796_704, 1_050_624, 526_336, 33_792]  # bucket_cap_mb=0.5: the 1 MiB layer alone


@pytest.fixture(autouse=True)
def english():
    tl.set_language("en")
    yield
    tl.set_language("en")


def collective(kind: str, step: int, backward: int | None, input_bytes: int = 4, dtype: str = "float32"):
    return Collective(seq=0, op=kind, kind=kind, torch_op=f"c10d::{kind}", group="0", group_size=2, group_seq=0,
                      input_bytes=input_bytes, output_bytes=input_bytes, dtype=dtype, shapes=(), reduce_op=None,
                      step=step, backward=backward)


def ddp_run(per_backward: list[list[int]], dtype: str = "float32") -> ObservedRun:
    """A 2-rank run of one backward() per optimizer step, backward ``b`` all-reducing ``per_backward[b - 1]`` (bytes,
    in ``dtype``), in that order."""
    ranks = {}
    for rank in (0, 1):
        observed = ObservedRank(rank, 2, 0, process_group={"world_size": 2})
        observed.collectives = [collective("all_reduce", b, b, size, dtype)
                                for b, sizes in enumerate(per_backward, 1) for size in sizes]
        observed.backwards = [Backward(b, b, 0.5, 1, (), "float32") for b in range(1, len(per_backward) + 1)]
        observed.steps = [OptimizerStep(b, "Adam", 1, (1e-3,), 0, ()) for b in range(1, len(per_backward) + 1)]
        ranks[rank] = observed
    return ObservedRun(Path("."), ranks)


def test_08_4_the_layers_are_read_from_the_baseline_and_a_layer_that_is_not_two_literals_is_refused(tmp_path):
    from tutorial_lib.exercises.nb08 import LAYERS_84, layer_bytes
    assert LAYERS_84 == LAYERS and sum(LAYERS) == sum(DEFAULT) == sum(DESIGNED) == 2_407_456
    model = tmp_path / "model.py"
    model.write_text("from torch import nn\nnet = nn.Sequential(nn.Linear(4, 2), nn.ReLU(), nn.Linear(2, 1))\n")
    assert layer_bytes(model) == ((2 + 1) * 4, (4 * 2 + 2) * 4)
    model.write_text("from torch import nn\nd = 4\nnet = nn.Linear(d, 2)\n")
    with pytest.raises(ValueError, match="model.py:3"):
        layer_bytes(model)


def test_08_4_what_is_left_after_backward_is_the_largest_bucket_of_whole_layers_and_a_layer_split_waits_whole():
    from tutorial_lib.exercises.nb08 import left_after_backward
    assert left_after_backward(DEFAULT, LAYERS) == (1_847_328, [1_847_328, 2_407_456])
    assert left_after_backward(DESIGNED, LAYERS) == (1_050_624, [796_704, 1_847_328, 2_373_664, 2_407_456])
    assert left_after_backward([sum(LAYERS)], LAYERS)[0] == sum(LAYERS), "one bucket: everything, after backward"
    assert left_after_backward(list(LAYERS), LAYERS)[0] == 1_050_624, "a bucket per layer: the largest layer"
    # the 1 MiB layer's bias closing the bucket before it: that bucket waits for the layer (weight and bias are ready
    # together), so the split gains nothing over DDP's default
    assert left_after_backward([798_752, 1_048_576, 560_128], LAYERS)[0] == 1_847_328
    # the queue: a bucket waits for the wire as well as for its gradients
    assert left_after_backward([10, 20], (10, 10, 10)) == (20, [10, 30])
    assert left_after_backward([20, 10], (10, 10, 10)) == (20, [20, 30])
    assert left_after_backward([10, 10, 10], (10, 10, 10)) == (10, [10, 20, 30])
    assert left_after_backward([], LAYERS) == (0, [])


def test_08_4_measures_read_each_backward_from_the_second_and_say_which_rank_and_backward_left_the_most():
    from tutorial_lib.exercises.nb08 import LAYERS_84, AllReducesPerBackward, LeftAfterBackward
    left, count = LeftAfterBackward(LAYERS_84), AllReducesPerBackward()
    run = ddp_run([[sum(LAYERS)], DESIGNED, DESIGNED])  # the first backward: DDP's buckets before it rebuilt them
    assert left.of(run) == 1_050_624 and count.of(run) == 4
    run.ranks[1].collectives = [c for c in run.ranks[1].collectives if c.backward != 3] + [
        collective("all_reduce", 3, 3, size) for size in DEFAULT]
    assert left.of(run) == 1_847_328 and count.of(run) == 4
    said = str(left.detail(run))
    assert said.startswith("yours on rank 1, backward() 3: all-reduces of 1,847,328 + 560,128 bytes") and (
        "1,847,328 bytes were left" in said) and "bucket_cap_mb" not in said
    flags = ddp_run([[sum(LAYERS)], DEFAULT])
    flags.ranks[0].collectives.append(collective("all_reduce", 2, 2, 24, "int32"))  # unused parameters' flags
    assert count.of(flags) == 2 and left.of(flags) == 1_847_328
    assert left.of(ddp_run([[sum(LAYERS)]])) is None and count.of(ddp_run([[sum(LAYERS)]])) is None
    assert "no gradient all-reduce" in str(left.detail(ddp_run([[], []])))


def test_08_4_the_guard_wants_every_gradient_once_in_fp32_inside_backward_and_says_what_the_run_did_instead():
    from tutorial_lib.exercises.nb08 import EveryGradientOnce
    once = EveryGradientOnce(elements=sum(LAYERS) // 4)
    assert once.check(ddp_run([[sum(LAYERS)], DEFAULT, DESIGNED]), None, VARIANT) == []
    half = once.check(ddp_run([[b // 2 for b in DEFAULT]] * 2, "float16"), None, VARIANT)
    assert [(d.rank, d.measured) for d in half] == [(0, "601864, float16"), (1, "601864, float16")]
    assert "crossed the wire in float16" in str(half[0].note)
    after = once.check(ddp_run([[], []]), None, VARIANT)
    assert str(after[0].what) == "gradient elements all-reduced in backward() 1, and their dtype"
    assert "ran after it, with no computation left to overlap" in str(after[0].note)
    twice = once.check(ddp_run([DEFAULT, DEFAULT + [4]]), None, VARIANT)
    assert [d.measured for d in twice] == ["601865, float32"] * 2 and "averaged more than once" in str(twice[0].note)


def test_08_4_a_starter_measurement_misses_the_target_and_the_shipped_solutions_meets_it():
    challenge = load_all()["08.4"].verify
    baseline, designed = ddp_run([[sum(LAYERS)], DEFAULT, DEFAULT]), ddp_run([[sum(LAYERS)], DESIGNED, DESIGNED])
    target = challenge.target
    assert not target.holds(target.measure.of(baseline), target.measure.of(baseline))
    assert target.holds(target.measure.of(designed), target.measure.of(baseline))
    per_tensor = ddp_run([[sum(LAYERS)], [4] * 12])  # what counts is each message, not its size
    count = next(b for b in challenge.conditions if b.measure.name.startswith("gradient all-reduces"))
    assert not count.holds(count.measure.of(per_tensor), None) and count.holds(4, None)


def fsdp_run(steps: list[list[tuple[int, int, int]]]) -> ObservedRun:
    """A 2-rank FSDP2 run of 3 units: step ``s`` has a backward() per entry of ``steps[s - 1]``, each ``(all-gathers
    in its forward, all-gathers in its backward, reduce-scatters in its backward)``, then an optimizer step."""
    ranks = {}
    for rank in (0, 1):
        observed = ObservedRank(rank, 2, 0, process_group={"world_size": 2})
        observed.wraps = [Wrap(1, "fully_shard", "Sequential", 1, {"units": [{"path": p} for p in ("0", "2", "")]})]
        for step, micro_batches in enumerate(steps, 1):
            for forward, backward, scatters in micro_batches:
                index = len(observed.backwards) + 1
                observed.collectives += [collective("all_gather", step, None)] * forward
                observed.backwards.append(Backward(index, step, 0.5, 1, (), "float32"))
                observed.collectives += [collective("all_gather", step, index)] * backward
                observed.collectives += [collective("reduce_scatter", step, index)] * scatters
            observed.steps.append(OptimizerStep(step, "SGD", 1, (0.05,), 0, ()))
        ranks[rank] = observed
    return ObservedRun(Path("."), ranks)


ONCE = [(3, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 3)]  # the solution's step of 4 micro-batches: gathered once, one sum


@pytest.mark.parametrize("first, second, said", [
    ([(3, 2, 3)] * 4, ONCE, ["the step's 4 forwards all-gathered 12 times for 3 units: each backward() left the "
                             "units as shards", "the step's 4 backward() calls all-gathered 8 times: units were freed "
                             "to their shards after their forward"]),
    ([(3, 0, 0)] * 3 + [(3, 0, 3)], ONCE, ["the step's 4 forwards all-gathered 12 times for 3 units"]),
    ([(3, 2, 0), (0, 2, 0), (0, 2, 0), (0, 2, 3)], ONCE, ["the step's 4 backward() calls all-gathered 8 times"]),
    (ONCE, [(0, 0, 0)] * 3 + [(0, 0, 3)], ["the step's forwards all-gathered 0 times for 3 units: the units kept what "
                                           "was gathered before optimizer step 1 changed the shards"]),
])
def test_09_4_gathered_once_per_step_passes_and_each_wrong_pattern_says_what_the_step_did(first, second, said):
    from tutorial_lib.exercises.nb09 import AllGathersPerStep
    gathers = next(p for p in load_all()["09.4"].verify.properties if isinstance(p, AllGathersPerStep))
    solution = fsdp_run([ONCE, ONCE])
    assert gathers.check(fsdp_run([ONCE, ONCE]), solution, VARIANT) == []
    found = gathers.check(fsdp_run([first, second]), solution, VARIANT)
    step = 1 if first != ONCE else 2
    assert {d.rank for d in found} == {0, 1} and all(f"optimizer step {step}" in str(d.what) for d in found)
    notes = [str(d.note) for d in found if d.rank == 0]
    assert len(notes) == len(said) and all(s in n for s, n in zip(said, notes)), notes
    for key in ("reshard_after_forward", "set_reshard_after_backward", "set_requires_gradient_sync"):
        assert all(key not in n for n in notes), (key, notes)


def test_09_4_checks_reduce_scatters_and_gradients_as_09_3_does():
    from tutorial_lib.exercises.nb09 import ReduceScattersPerStep
    from tutorial_lib.exercises.same_values import SameTensors
    kinds = [type(p).__name__ for p in load_all()["09.4"].verify.properties]
    assert kinds == ["Distributed", "SameSteps", "ReduceScattersPerStep", "AllGathersPerStep", "SameTensors"]
    same = next(p for p in load_all()["09.4"].verify.properties if isinstance(p, SameTensors))
    assert (same.what, same.at, same.terms) == ("grad", "steps", 67)
    scatters = next(p for p in load_all()["09.4"].verify.properties if isinstance(p, ReduceScattersPerStep))
    found = scatters.check(fsdp_run([[(3, 2, 3)] * 4]), fsdp_run([ONCE]), VARIANT)
    assert [(d.expected, d.measured) for d in found] == [(3, 12), (3, 12)]
    assert torch.finfo(torch.float32).eps * 67 < 1e-5, "what a gradient of old weights (a 1e-2 difference) exceeds"
