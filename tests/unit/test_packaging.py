"""pyproject.toml and environment.yml list the same dependencies; CI keeps torch on the CPU pin; every install takes
the lock (requirements/lock.txt), and `make install` installed exactly its versions."""

import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest
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
    # What conda-forge lacks (torchft: PyPI wheels only) stands in its `pip:` list, markers and all.
    from_pip = [r for d in conda if isinstance(d, dict) for r in d.get("pip", [])]
    have = dict(split(d) for d in [*conda, *from_pip] if isinstance(d, str))
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


# The lock (issue 43): requirements/lock.txt, made by `make lock` (uv, universal, torch left out), used by every install.
# scripts/check_lock.py holds the comparison (a compat venv, without pytest, runs it too).
_spec = importlib.util.spec_from_file_location("check_lock", ROOT / "scripts" / "check_lock.py")
check_lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_lock)
LOCK = ROOT / "requirements" / "lock.txt"


def lock_environment(python: str) -> dict:
    """packaging's marker environment of CPython ``python`` ("3.10.13") on Linux x86_64."""
    from packaging.markers import default_environment
    return {**default_environment(), "python_version": python.rsplit(".", 1)[0], "python_full_version": python,
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}


def locked_for(python: str) -> dict[str, str]:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    pins = {}
    for line in LOCK.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(lock_environment(python)):
                pins[canonicalize_name(requirement.name)] = next(iter(requirement.specifier)).version
    return pins


@pytest.mark.parametrize("python", ["3.10.13", "3.11.7", "3.12.1"])
def test_the_lock_pins_every_dependency_within_the_projects_floors_and_never_torch(python):
    """The floors stay in pyproject.toml for a `pip install` into one's own environment; the lock, within them,
    holds one version of each for the seeds' Python 3.10, CI's 3.11 and a newer one."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = locked_for(python)
    assert "torch" not in pins, "the lock must never replace the torch a user has"
    for line in project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if name == "torch":
            continue
        assert name in pins, f"{name} is not locked for Python {python}: make lock"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside pyproject's {line}"


def test_every_install_of_the_makefile_takes_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "pip install" in line and " -e " in line]
    assert len(installs) >= 4, installs  # make install, compat, lab, bench
    assert all("$(LOCK_ARGS)" in line for line in installs), installs
    assert re.search(r"^LOCK \?= requirements/lock\.txt$", makefile, re.M)
    assert "$(STAMP): pyproject.toml $(LOCK)" in makefile and "$(COMPAT_STAMP): pyproject.toml $(LOCK)" in makefile


def test_make_install_installed_exactly_the_locked_versions():
    """Every distribution the project and its test extra need, through their dependencies (torch's excepted), at
    the version of the lock this venv's stamp names (`make install` writes it)."""
    lock = check_lock.stamped_lock()
    if lock is None:
        pytest.skip(f"{sys.prefix} was not made by `make install` from a lock (no .installed stamp naming one)")
    checked = check_lock.required_distributions()
    assert {"transformers", "pandas", "nbval", "jupyterlab", "huggingface-hub"} <= set(checked), sorted(checked)
    assert check_lock.differences(lock) == []
    print(f"{len(checked)} distributions equal {lock.relative_to(ROOT)}")


def test_the_lock_check_names_a_version_that_differs_and_a_package_the_lock_lacks(tmp_path):
    """The control of the test above: the same comparison against a lock with one version changed and one line
    removed must name both."""
    import pandas
    import transformers
    lines = []
    for line in LOCK.read_text().splitlines():
        if line.startswith(f"pandas=={pandas.__version__}"):
            line = line.replace(f"pandas=={pandas.__version__}", "pandas==0.0.1")
        if line.startswith(f"transformers=={transformers.__version__}"):
            continue
        lines.append(line)
    changed = tmp_path / "lock.txt"
    changed.write_text("\n".join(lines) + "\n")
    found = {d["name"]: d for d in check_lock.differences(changed)}
    assert found["pandas"] == {"name": "pandas", "installed": pandas.__version__, "locked": "0.0.1"}
    assert found["transformers"]["locked"] is None
    (tmp_path / "bad.txt").write_text("pandas>=2\n")
    with pytest.raises(ValueError, match=r"bad.txt:1: 'pandas>=2' is not name==version"):
        check_lock.locked_versions(tmp_path / "bad.txt")


def test_every_test_module_has_a_name_no_other_has():
    """pytest imports test modules by their file name (rootdir-relative, no packages here): two files of one name in
    tests/unit and tests/integration stop the whole collection of ``make test`` ("import file mismatch"), which a run
    of one folder alone never shows."""
    by_name: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if "fixtures" in path.relative_to(ROOT / "tests").parts:
            continue
        by_name.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    repeated = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not repeated, f"test modules sharing a name (rename one): {repeated}"


def test_torchft_asks_for_no_torch_newer_than_our_floor_so_installing_it_never_replaces_torch():
    """Issue 47: every install puts torch in first (the image's, or TORCH_SPEC / COMPAT_TORCH_SPEC), then the project
    with torchft; a torchft wanting a newer torch than our floor would make pip fetch one (a CUDA wheel of GBs)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.version import Version
    try:
        requires = metadata.requires("torchft") or []
    except metadata.PackageNotFoundError:
        pytest.skip(f"torchft is not installed in {sys.prefix} (Linux x86_64 only)")
    (torch,) = [Requirement(r) for r in requires if Requirement(r).name == "torch" and not Requirement(r).marker]
    floor = Version("2.8")  # pyproject's torch>=2.8 (test_the_torch_floor_is_the_oldest_torch_ci_runs)
    assert floor in torch.specifier and all(s.operator == ">=" for s in torch.specifier), str(torch)
    print(f"torchft {metadata.version('torchft')} asks {torch}; our floor is torch>={floor}")
