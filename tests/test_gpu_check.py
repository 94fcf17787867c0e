"""scripts/gpu_check.py's plan, printed by --dry-run without a GPU, and model_parallel.py's device assignment.

Issue 15: the users run 1, 2, 4 or 8 GPUs. Nothing here launches a job or touches CUDA.
"""

import importlib.util

import pytest

from tutorial_lib.scripts import SCRIPTS_DIR


def load_script(name):
    """A shipped script imported as a module (its ``main()`` does not run)."""
    spec = importlib.util.spec_from_file_location(f"_test_gpu_check_{name}", SCRIPTS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pick_devices = load_script("model_parallel").pick_devices


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("ranks_of", [lambda g: max(1, g // 2), lambda g: g], ids=["a pair per rank", "a rank per GPU"])
def test_model_parallel_ranks_never_share_a_gpu(gpus, ranks_of):
    # Issue 15 item 3: one rank per GPU on 4 GPUs gave ranks 1 and 2 both cuda:2, and NCCL refused the group.
    ranks = ranks_of(gpus)
    devices = [pick_devices(r, ranks, gpus) for r in range(ranks)]
    used = [d for pair in devices for d in set(pair)]
    assert len(used) == len(set(used)), devices
    assert all(int(d.split(":")[1]) < gpus for d in used), devices


def test_model_parallel_devices_for_each_machine():
    assert pick_devices(0, 1, 0) == ["cpu", "cpu"]
    assert pick_devices(0, 1, 1) == ["cuda:0", "cuda:0"]  # one GPU: both halves on it, a logical split
    assert pick_devices(0, 1, 2) == ["cuda:0", "cuda:1"]
    assert [pick_devices(r, 2, 4) for r in range(2)] == [["cuda:0", "cuda:1"], ["cuda:2", "cuda:3"]]
    assert [pick_devices(r, 4, 8) for r in range(4)] == [[f"cuda:{2 * r}", f"cuda:{2 * r + 1}"] for r in range(4)]
    assert [pick_devices(r, 2, 3) for r in range(2)] == [["cuda:0", "cuda:0"], ["cuda:1", "cuda:1"]]


def test_model_parallel_refuses_more_ranks_than_gpus():
    with pytest.raises(ValueError, match=r"LOCAL_WORLD_SIZE=2 ranks but only 1 GPU\(s\).*--nproc-per-node <= 1"):
        pick_devices(1, 2, 1)
