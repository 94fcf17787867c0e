"""--compile in ddp_train.py and fsdp_train.py (issue 37), on 2 CPU ranks with backend aot_eager (graphs, no kernels):
the compiled run trains as the eager one does, and FSDP2 with each block compiled runs exactly eager's collectives."""

import pytest

import tutorial_lib as tl

from conftest import wait_no_job_processes

pytestmark = pytest.mark.integration

FP32_TOLERANCE = 1e-5  # relative: a compiled graph may order a sum differently from eager
FSDP_SMALL = ["--dim", 32, "--n-heads", 2, "--n-layers", 2, "--seq-len", 16, "--batch-size", 2, "--max-steps", 2]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("compile-runs")

    def launch(script, label, args, observe=False):
        result = tl.run_script(script, args, runs_dir=root, label=label, device="cpu", nproc_per_node=2, timeout_s=240,
                               live="off", observe=observe)
        metrics = result.metrics().sort_values(["rank", "step"]).reset_index(drop=True)
        return (metrics, result.observed()) if observe else metrics

    yield launch
    assert not wait_no_job_processes(str(root))


def close(a, b):
    return ((a - b).abs() <= FP32_TOLERANCE * b.abs().clip(lower=1)).all()


def test_ddp_train_compiled_trains_as_eager_and_without_the_graph_split_too(run):
    args = ["--max-steps", 3, "--batch-size", 8, "--hidden-dim", 32, "--bucket-cap-mb", 1]
    eager = run("ddp_train", "eager", args)
    compiled = run("ddp_train", "compiled", [*args, "--compile", "--compile-backend", "aot_eager"])
    one_graph = run("ddp_train", "one-graph", [*args, "--compile", "--compile-backend", "aot_eager",
                                               "--no-optimize-ddp"])
    assert close(compiled["loss_global"], eager["loss_global"]), (compiled["loss_global"], eager["loss_global"])
    assert close(one_graph["loss_global"], eager["loss_global"])


def test_fsdp2_with_each_block_compiled_runs_eagers_collectives_and_trains_as_eager(run):
    eager, eager_seen = run("fsdp_train", "fsdp2-eager", ["--strategy", "fsdp2", *FSDP_SMALL], observe=True)
    compiled, compiled_seen = run("fsdp_train", "fsdp2-compiled", ["--strategy", "fsdp2", *FSDP_SMALL, "--compile",
                                                                   "--compile-backend", "aot_eager"], observe=True)
    kinds = ("all_gather", "reduce_scatter", "all_reduce")  # what each rank issued in each step, as torch saw it
    counts = eager_seen.per_step_counts(*kinds)
    assert compiled_seen.per_step_counts(*kinds) == counts, (compiled_seen.per_step_counts(*kinds), counts)
    # 3 units (2 blocks + root): 2 * 3 - 1 all-gathers and 3 reduce-scatters a step, on both ranks and steps
    assert [(c["all_gather"], c["reduce_scatter"]) for c in counts] == [(5, 3)] * 4, counts
    assert close(compiled["loss_global"], eager["loss_global"]), (compiled["loss_global"], eager["loss_global"])
