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
