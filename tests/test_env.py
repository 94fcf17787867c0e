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
