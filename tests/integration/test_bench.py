"""scripts/bench.py runs end to end (its ratios are its own business)."""

import json
import subprocess
import sys

from conftest import ROOT


def test_the_benchmark_runs_and_prints_its_ratio_table(tmp_path):
    """scripts/bench.py's memory section end to end (two short 2-rank launches); the ratios are its own business."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--only", "memory", "--out",
                          str(tmp_path / "bench.json")], capture_output=True, text=True, timeout=300)
    assert "memory: FSDP2 / DDP state bytes per rank (N=2)" in out.stdout, out.stdout + out.stderr[-2000:]
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    ratio = next(r for r in rows if r["benchmark"].startswith("memory: FSDP2"))["value"]
    assert 0 < ratio < 1


def test_the_observe_benchmark_times_observed_launches_against_plain_ones(tmp_path):
    """--only observe: each job launched with and without observe=True (one repetition here); every observed run's
    records are read back complete, or the section fails."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--only", "observe", "--reps", "1",
                          "--out", str(tmp_path / "bench.json")], capture_output=True, text=True, timeout=600)
    assert out.returncode in (0, 1), out.stdout[-2000:] + out.stderr[-2000:]  # 1: a ratio over its target (load)
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [r["benchmark"] for r in rows] == ["observer: ddp_train.py, 20 steps, observed / not observed",
                                              "observer: fsdp_train.py (FSDP2), 5 steps, observed / not observed"]
    assert all(r["value"] > 0 and "KiB per run" in r["note"] for r in rows)


def test_the_nanogpt_benchmark_without_a_nanogpt_checkout_says_how_to_get_one(tmp_path):
    """--only nanogpt (or compile, its old name) reads nanoGPT from --nanogpt-dir; without a checkout it names the clone
    command and measures nothing (the measured run takes about 40 minutes on 2 cores: run by hand)."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--only", "compile", "--nanogpt-dir",
                          str(tmp_path / "none")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"git clone https://github.com/karpathy/nanoGPT {tmp_path / 'none'}" in out.stdout, out.stdout
    assert "nanogpt: nanoGPT checkout missing (--nanogpt-dir)" in out.stdout


def test_the_compile_benchmark_writes_train_lms_corpus_in_nanogpts_format(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    bench.write_nanogpt_data(tmp_path)
    folder = tmp_path / "data" / "stdlib"
    train, val = (folder / "train.bin").stat().st_size, (folder / "val.bin").stat().st_size
    assert (train + val) // 2 == 1 << 20 and val // 2 == int((1 << 20) * 0.1), (train, val)
    assert (folder / "meta.pkl").is_file()
