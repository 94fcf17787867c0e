import pytest

from tutorial_lib import ConfigError, resolve_device


def test_auto_on_cpu_defaults_to_two_gloo_ranks():
    plan = resolve_device("auto", gpu_count=0)
    assert (plan.device, plan.backend, plan.nproc_per_node) == ("cpu", "gloo", 2)


def test_auto_with_gpus_uses_one_rank_per_gpu_capped_by_max_gpus():
    assert resolve_device("auto", gpu_count=4).nproc_per_node == 4
    plan = resolve_device("auto", max_gpus=2, gpu_count=4)
    assert (plan.device, plan.backend, plan.nproc_per_node) == ("cuda", "nccl", 2)


def test_cpu_accepts_any_positive_rank_count_even_with_gpus():
    plan = resolve_device("cpu", 3, gpu_count=8)
    assert (plan.device, plan.backend, plan.nproc_per_node) == ("cpu", "gloo", 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"device": "cuda", "gpu_count": 0}, "no usable CUDA GPU"),
        ({"device": "auto", "nproc_per_node": 3, "gpu_count": 2}, "nproc_per_node=3 but only 2 GPU"),
        ({"device": "cpu", "backend": "nccl", "gpu_count": 0}, "nccl"),
        ({"device": "auto", "backend": "nccl", "gpu_count": 0}, "nccl"),
        ({"device": "tpu"}, "device must be one of"),
        ({"device": "cpu", "nproc_per_node": 0}, "nproc_per_node must be >= 1, got 0"),
        ({"device": "cpu", "nproc_per_node": -2}, "got -2"),
        ({"device": "cpu", "nproc_per_node": "2"}, "positive integer, got '2'"),
        ({"device": "cpu", "nproc_per_node": 2.0}, "positive integer, got 2.0"),
        ({"device": "cpu", "nproc_per_node": True}, "positive integer"),
        ({"device": "cpu", "backend": "mpi"}, "backend must be"),
    ],
)
def test_bad_requests_are_refused_with_the_value_named(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        resolve_device(**kwargs)
