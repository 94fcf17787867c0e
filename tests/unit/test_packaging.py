"""pyproject.toml and environment.yml list the same dependencies; CI keeps torch on the CPU pin."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONDA_NAMES = {"torch": "pytorch"}  # PyPI name -> conda-forge name where they differ


def split(requirement: str) -> tuple[str, str]:
    name, spec = re.match(r"^([A-Za-z0-9_.-]+)\s*(.*)$", requirement).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def test_environment_yml_mirrors_pyproject_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    have = dict(split(d) for d in conda if isinstance(d, str))
    for requirement in wanted:
        name, spec = split(requirement)
        assert have.get(CONDA_NAMES.get(name, name)) == spec, f"{requirement} differs in environment.yml"
    assert project["requires-python"] == ">=3.10" and have["python"] == ">=3.10"


def test_torch_is_a_floor_in_the_project_and_the_cpu_pin_in_ci():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch>=2.8" in project["dependencies"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install --quiet "torch==2.13.0"' in ci and ci.index("torch==2.13.0") < ci.index("make test")
    assert "TORCH_SPEC ?= torch==2.13.0" in (ROOT / "Makefile").read_text()


def test_the_torch_floor_is_the_oldest_torch_ci_runs():
    """pyproject's and environment.yml's floor = the compat leg's pin, and CI runs that leg before the tests."""
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.search(r"^COMPAT_TORCH_SPEC \?= torch==(\d+)\.(\d+)\.\d+$", makefile, re.M)
    assert pinned, "the compat leg pins an exact torch"
    floor = f"{pinned[1]}.{pinned[2]}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"torch>={floor}" in project["dependencies"]
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    assert f"pytorch>={floor}" in conda
    assert re.search(r"^COMPAT_PYTHON \?= .*3\.10", makefile, re.M), "the image's Python 3.10"
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("make compat") < ci.index("make test")
    readme = (ROOT / "README.md").read_text()
    assert f"torch {pinned[1]}.{pinned[2]}" in readme and "make compat" in readme, "the README states what CI covers"


def test_the_benchmark_runs_and_prints_its_ratio_table(tmp_path):
    """scripts/bench.py's memory section end to end (two short 2-rank launches); the ratios are its own business."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--only", "memory", "--out",
                          str(tmp_path / "bench.json")], capture_output=True, text=True, timeout=300)
    assert "memory: FSDP2 / DDP state bytes per rank (N=2)" in out.stdout, out.stdout + out.stderr[-2000:]
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    ratio = next(r for r in rows if r["benchmark"].startswith("memory: FSDP2"))["value"]
    assert 0 < ratio < 1


def test_no_library_module_imports_another_modules_private_names():
    """Seams: a name starting with "_" is its module's own; what another module needs is public (issue 17)."""
    import ast

    offenders = []
    for path in sorted((ROOT / "tutorial_lib").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                offenders += [f"{path.name}: from .{node.module} import {a.name}" for a in node.names
                              if a.name.startswith("_")]
    assert offenders == []


def test_library_functions_stay_short():
    """Seams (issue 17): launch() is a short sequence of named parts, and no library function runs past 80 lines."""
    import ast

    lengths = {}
    for path in sorted((ROOT / "tutorial_lib").rglob("*.py")):
        if "lessons" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths[f"{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert lengths["run.py:launch"] < 60, lengths["run.py:launch"]
    assert {name: n for name, n in lengths.items() if n > 80} == {}
