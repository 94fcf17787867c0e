"""pyproject.toml and environment.yml list the same dependencies; CI keeps torch on the CPU pin."""

import re
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
    versions = (ROOT / "docs" / "torch-versions.md").read_text()  # the README links it
    assert f"torch {pinned[1]}.{pinned[2]}" in versions and "make compat" in versions, \
        "docs/torch-versions.md states what CI covers"
