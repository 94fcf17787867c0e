"""The CUDA branches of the scripts and of run_in_process, run here on CPU with a faked ``torch.cuda``.

Issue 15: these branches had never executed (the users run 1-8 RTX 4090D GPUs); each test fakes only what the
branch calls and records the order of the calls.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from tutorial_lib.runs.rundir import LESSONS_DIR


def load_script(name: str):
    """A shipped script imported as a module (its ``if __name__ == "__main__"`` block does not run), the files it
    imports (train_lm.py's lm_model.py) from beside it, as a rank imports them."""
    from tutorial_lib.notebook.script_source import import_script
    return import_script(LESSONS_DIR / f"{name}.py")


@pytest.fixture
def fake_cuda(monkeypatch):
    """``torch.cuda`` says a GPU is there; ``set_device`` and ``synchronize`` only record their calls."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", torch.device(device))))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return calls


def test_dataloader_bench_sets_its_gpu_from_local_rank_before_any_pinned_loader(fake_cuda, monkeypatch, tmp_path):
    """Issue 15 item 5: without set_device, pin_memory=True made every rank open a CUDA context on GPU 0."""
    bench = load_script("dataloader_bench")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")

    def measure(config, dataset, sampler, args, device):
        fake_cuda.append(("measure", config["pin_memory"], device))
        return {**config, "samples": 1, "seconds": 1.0, "samples_per_s": 1.0}

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(sys, "argv", ["dataloader_bench.py", "--device", "cuda", "--num-workers", "1",
                                      "--metrics-dir", str(tmp_path)])
    bench.main()
    cuda1 = torch.device("cuda", 1)
    assert fake_cuda == [("set_device", cuda1), ("measure", False, cuda1), ("measure", False, cuda1),
                         ("measure", True, cuda1)], "the device is set once, first; the pinned configuration runs on it"
    assert json.loads((tmp_path / "loader_rank0.json").read_text())["device"] == "cuda:1"


def test_dataloader_bench_sets_the_device_before_joining_the_nccl_group(fake_cuda, monkeypatch):
    bench = load_script("dataloader_bench")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")  # node 1 of a 4-GPU-per-node job: the GPU is 1, not 5
    monkeypatch.setattr(bench.dist, "init_process_group",
                        lambda backend, **kw: fake_cuda.append(("init", backend, kw["device_id"])))
    monkeypatch.setattr(bench.dist, "get_rank", lambda: 5)
    monkeypatch.setattr(bench.dist, "get_world_size", lambda: 8)
    rank, world_size, device = bench.setup(bench.parse_args(["--device", "cuda"]))
    cuda1 = torch.device("cuda", 1)
    assert (rank, world_size, device) == (5, 8, cuda1)
    assert fake_cuda == [("set_device", cuda1), ("init", "nccl", cuda1)]


WORLD_OF_ONE = ["collectives_check", "compile_train", "ddp_knobs", "fsdp_knobs", "fsdp_train", "uneven_inputs", "unused_params", "sync_batchnorm",
                "tensor_parallel", "pipeline_parallel", "context_parallel_float8", "train_lm", "train_hf"]


def test_every_script_that_makes_a_world_of_one_takes_a_backend_flag():
    """run_in_process hands these scripts --backend gloo; a new script that makes a world of one needs the flag too."""
    makes_world_of_one = sorted(p.stem for p in LESSONS_DIR.glob("*.py") if "world_size=1" in p.read_text())
    assert makes_world_of_one == sorted(WORLD_OF_ONE)
    required = {"train_hf": ["--model", "a-model-folder"]}  # its one required flag
    for name in WORLD_OF_ONE:
        assert load_script(name).parse_args(["--backend", "gloo", *required.get(name, [])]).backend == "gloo", name


def test_run_in_process_on_cuda_uses_gloo_and_resets_the_kernels_cuda_peaks_each_run(monkeypatch, tmp_path):
    """Issue 15 item 8: no NCCL inside the kernel; max_memory_allocated must not carry an earlier run's peak."""
    import tutorial_lib as tl
    from tutorial_lib.launcher import devices, in_process

    calls = []
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # an earlier run left a CUDA context here
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", device)))

    class Script:  # stands in for fsdp_train.py: records what it was handed (a real one would need a GPU)
        @staticmethod
        def main():
            calls.append(("main", sys.argv[1:]))

    monkeypatch.setattr(in_process, "check_script_args", lambda script, argv: Script)
    for _ in range(2):
        result = tl.run_in_process("fsdp_train", ["--max-steps", 1], device="cuda", runs_dir=tmp_path)
    argv = ["--max-steps", "1", "--device", "cuda", "--backend", "gloo"]
    assert calls == ["empty_cache", ("reset", 0), ("reset", 1), ("main", argv)] * 2
    assert (result.plan.device, result.plan.backend, result.plan.nproc_per_node) == ("cuda", "gloo", 1)
    assert "fsdp_train.py --max-steps 1 --device cuda --backend gloo" in (result.run_dir / "command.txt").read_text()


def test_run_in_process_leaves_an_uninitialised_cuda_alone(monkeypatch, tmp_path):
    import tutorial_lib as tl

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: pytest.fail("CUDA touched"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: pytest.fail("CUDA touched"))
    result = tl.run_in_process("unused_params", ["--loss-uses", "both", "--max-steps", 2], runs_dir=tmp_path)
    assert result.plan.backend == "gloo"
    assert "--device cpu --backend gloo" in (result.run_dir / "command.txt").read_text()


def test_run_in_process_refuses_nccl_in_the_kernel(tmp_path):
    import tutorial_lib as tl

    for args in (["--backend", "nccl"], ["--backend=nccl"]):
        with pytest.raises(tl.ConfigError, match="runs no NCCL in the notebook's kernel"):
            tl.run_in_process("fsdp_train", args, runs_dir=tmp_path)
    assert not list(tmp_path.iterdir()), "refused before a run directory was made"
