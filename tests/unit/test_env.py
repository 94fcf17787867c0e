import subprocess
import sys

import tutorial_lib as tl


def test_report_has_versions_backends_and_resources():
    report = tl.environment_report()
    import torch

    assert report.torch_version == torch.__version__
    assert report.backends["gloo"] is True
    assert report.cpu_cores_logical >= 1 and report.ram_total_bytes > 0 and report.disk_free_bytes > 0
    text = report.to_text()
    for key in ("torch", "cuda available", "nccl", "distributed backends", "gpus", "cpu cores", "ram", "disk free"):
        assert key in text
    assert report.cuda_available == torch.cuda.is_available() and len(report.gpus) == torch.cuda.device_count()


def test_report_never_raises_when_probes_fail(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # "import torch" now raises ImportError
    monkeypatch.setitem(sys.modules, "psutil", None)
    report = tl.environment_report(tmp_path / "does" / "not" / "exist")
    assert report.torch_version is None and report.ram_total_bytes is None
    assert any(p.startswith("torch:") for p in report.problems)
    assert any(p.startswith("ram:") for p in report.problems)
    assert report.disk_free_bytes > 0, "the nearest existing parent is measured"
    assert "not importable" in report.to_text() and "problems:" in report.to_text()


def test_cli_prints_the_report_and_the_scripts():
    out = subprocess.run([sys.executable, "-m", "tutorial_lib", "env"], capture_output=True, text=True, check=True)
    assert "distributed backends" in out.stdout and "gloo=yes" in out.stdout
    out = subprocess.run([sys.executable, "-m", "tutorial_lib", "scripts"], capture_output=True, text=True, check=True)
    assert "ddp_train" in out.stdout.split()


def fake_gpus(monkeypatch, count, peer):
    """``torch.cuda`` with ``count`` RTX 4090 D boards; ``peer(a, b)`` says whether a can access b."""
    import types

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    props = types.SimpleNamespace(name="NVIDIA GeForce RTX 4090 D", total_memory=24 * 2**30, major=8, minor=9)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", peer)


def test_report_names_the_gpu_pairs_without_peer_access(monkeypatch):
    """Issue 15 item 4: consumer boards without NVLink often lack (or break) P2P; NCCL then hangs."""
    fake_gpus(monkeypatch, 2, lambda a, b: (a, b) != (1, 0))  # one direction missing is enough
    report = tl.environment_report()
    assert [g.index for g in report.gpus] == [0, 1] and report.peer_access == {(0, 1): False}
    assert report.missing_peer_access() == [(0, 1)]
    line = next(line for line in report.to_text().splitlines() if line.startswith("peer access (P2P)"))
    assert "missing for 1 of 1 pairs: cuda:0<->cuda:1" in line and "NCCL_P2P_DISABLE=1" in line


def test_report_checks_every_pair_of_several_gpus(monkeypatch):
    fake_gpus(monkeypatch, 3, lambda a, b: {a, b} != {1, 2})
    report = tl.environment_report()
    assert report.peer_access == {(0, 1): True, (0, 2): True, (1, 2): False}
    assert "missing for 1 of 3 pairs: cuda:1<->cuda:2;" in report.peer_access_text()
    fake_gpus(monkeypatch, 3, lambda a, b: True)
    assert tl.environment_report().peer_access_text().startswith("yes, all 3 pairs")


def test_peer_access_on_cpu_says_no_gpus_and_a_failing_probe_is_a_problem(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = tl.environment_report()
    assert report.peer_access == {} and report.peer_access_text() == "no GPUs"
    assert "no GPUs" in report.to_text()

    def broken(a, b):
        raise RuntimeError("CUDA driver error: unknown error")

    fake_gpus(monkeypatch, 2, broken)
    report = tl.environment_report()
    assert report.peer_access_text() == "not checked (see problems)"
    assert any(p.startswith("peer access: RuntimeError") for p in report.problems)
