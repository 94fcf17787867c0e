"""The CUDA branches of the scripts and of run_in_process, run here on CPU with a faked ``torch.cuda``.

Issue 15: these branches had never executed (the users run 1-8 RTX 4090D GPUs); each test fakes only what the
branch calls and records the order of the calls.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from tutorial_lib.scripts import SCRIPTS_DIR


def load_script(name: str):
    """A shipped script imported as a module (its ``if __name__ == "__main__"`` block does not run)."""
    spec = importlib.util.spec_from_file_location(f"_script_{name}", SCRIPTS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
