"""--compile in ddp_train.py and fsdp_train.py (issue 37), on 2 CPU ranks with backend aot_eager (graphs, no kernels):
the compiled run trains as the eager one does, and FSDP2 with each block compiled runs exactly eager's collectives."""

import pytest

import tutorial_lib as tl

from conftest import wait_no_job_processes

pytestmark = pytest.mark.integration

FP32_TOLERANCE = 1e-5  # relative: a compiled graph may order a sum differently from eager
FSDP_SMALL = ["--dim", 32, "--n-heads", 2, "--n-layers", 2, "--seq-len", 16, "--batch-size", 2, "--max-steps", 2,
              "--count-collectives"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("compile-runs")

    def launch(script, label, args):
        return tl.run_script(script, args, runs_dir=root, label=label, device="cpu", nproc_per_node=2, timeout_s=240,
                             live="off").metrics().sort_values(["rank", "step"]).reset_index(drop=True)

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
    eager = run("fsdp_train", "fsdp2-eager", ["--strategy", "fsdp2", *FSDP_SMALL])
    compiled = run("fsdp_train", "fsdp2-compiled", ["--strategy", "fsdp2", *FSDP_SMALL, "--compile",
                                                    "--compile-backend", "aot_eager"])
    counts = ["all_gather_calls", "reduce_scatter_calls", "all_reduce_calls"]
    assert compiled[counts].equals(eager[counts]), (compiled[counts], eager[counts])
    assert eager["all_gather_calls"].min() > 0 and eager["reduce_scatter_calls"].min() > 0
    assert close(compiled["loss_global"], eager["loss_global"]), (compiled["loss_global"], eager["loss_global"])
