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


def test_a_short_collective_timeout_keeps_a_floor_on_nccl_that_covers_its_set_up():
    from tutorial_lib import collective_timeout_s
    assert collective_timeout_s(3, resolve_device("cpu", gpu_count=0)) == 3.0
    assert collective_timeout_s(3, resolve_device("cuda", gpu_count=8)) == 30.0, "NCCL's init is inside the timeout"
    assert collective_timeout_s(120, resolve_device("cuda", gpu_count=1)) == 120.0
    for bad in (0, -1, "3", None, True):
        with pytest.raises(ConfigError, match="collective timeout must be a positive number"):
            collective_timeout_s(bad, resolve_device("cpu", gpu_count=0))


def test_the_rank_env_is_kept_by_the_library_and_merged_into_every_launch_never_into_os_environ(request):
    import os

    from tutorial_lib.launcher.environment import set_rank_env
    from tutorial_lib.launcher.environment import build_env, rank_env
    request.addfinalizer(lambda: set_rank_env(None))
    before = dict(os.environ)
    assert set_rank_env({"NCCL_P2P_DISABLE": 1}) == {"NCCL_P2P_DISABLE": "1"} == rank_env()
    assert dict(os.environ) == before, "the kernel's environment is not touched"
    assert build_env(resolve_device("cuda", gpu_count=2))["NCCL_P2P_DISABLE"] == "1", "every launch gets it"
    assert build_env(resolve_device("cpu", gpu_count=0), {"NCCL_P2P_DISABLE": "0"})["NCCL_P2P_DISABLE"] == "0", \
        "a launch's own env= wins"
    assert "NCCL_P2P_DISABLE" not in build_env(resolve_device("cpu", gpu_count=0), base={}), "an explicit base is all"
    assert set_rank_env({"OTHER": "x"}) == {"OTHER": "x"} == rank_env(), "a call replaces the earlier one"
    assert set_rank_env(None) == {} == rank_env() and set_rank_env({}) == {}
    with pytest.raises(ConfigError, match="RANK_ENV must be a dict"):
        set_rank_env("NCCL_P2P_DISABLE=1")
    with pytest.raises(ConfigError, match=r"invalid variable name\(s\) \['BAD NAME'\]"):
        set_rank_env({"BAD NAME": "1"})
