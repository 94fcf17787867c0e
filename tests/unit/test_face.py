"""The package's face (issue 48): ``tutorial_lib.__all__`` is the names a notebook's flow calls and a few namespaces
by meaning, each used by some notebook or docs page, and every ``tl.a.b...`` a notebook or a docs page writes resolves
on the imported package."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import nbformat
import pytest

import tutorial_lib as tl
from conftest import ROOT

FLOW = {"setup_notebook", "check_parameters", "new_run_dir", "write_script", "show_script", "import_script",
        "script_path", "launch", "run_script", "LaunchSpec", "LaunchResult", "resolve_device", "collective_timeout_s"}
LAUNCHERS = {"run_in_process", "export_hf", "spawn_with_timeout", "run_failure_drill", "run_hard_failure",
             "run_replica_groups", "start_lighthouse", "start_slurm_replica_groups"}
FAILURES = {"diagnose", "CauseId", "TutorialError", "ConfigError", "LaunchError", "LaunchTimeout", "SlurmError"}
REST = {"exercises", "exercise", "progress", "environment_report", "language", "set_language"}
NAMESPACES = {"runs", "plots", "planning", "probes", "slurm"}
FACE = FLOW | LAUNCHERS | FAILURES | REST | NAMESPACES

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted((ROOT / "notebooks" / "zh").glob("*.ipynb"))
DOCS = sorted((ROOT / "docs").glob("**/*.md")) + sorted(ROOT.glob("README*.md"))
TL_CHAIN = re.compile(r"(?<![\w.])tl((?:\.[A-Za-z_]\w*)+)")


def chains_in_code(source: str) -> list[str]:
    """Every attribute chain on ``tl`` in a code cell (``tl.runs.read_metrics`` -> ``"runs.read_metrics"``), read with
    ``ast``; IPython's line magics and shell lines are left out, and a cell magic's body (``%%writefile``: a script)
    is not Python of this kernel. A cell ``ast`` cannot read is read with the text pattern."""
    if source.lstrip().startswith("%%"):
        return []
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return chains_in_text(source)
    found = []
    for node in ast.walk(tree):
        names, value = [], node
        while isinstance(value, ast.Attribute):
            names.append(value.attr)
            value = value.value
        if names and isinstance(value, ast.Name) and value.id == "tl":
            found.append(".".join(reversed(names)))
    return found


def chains_in_text(text: str) -> list[str]:
    """Every ``tl.a.b`` in prose (markdown, a docs page): ``"a.b"``."""
    return [m.group(1)[1:] for m in TL_CHAIN.finditer(text)]


def uses() -> dict[str, list[str]]:
    """Where each chain is written: ``{chain: [place, ...]}`` over the notebooks (English and zh, code and markdown
    cells) and the docs pages (docs/, README*.md)."""
    found: dict[str, list[str]] = {}
    for path in NOTEBOOKS:
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            read = chains_in_code if cell.cell_type == "code" else chains_in_text
            for chain in read(cell.source):
                found.setdefault(chain, []).append(f"{path.relative_to(ROOT)} cell {i}")
    for path in DOCS:
        for chain in chains_in_text(path.read_text(encoding="utf-8")):
            found.setdefault(chain, []).append(str(path.relative_to(ROOT)))
    return found


def unresolved(chains: dict[str, list[str]]) -> dict[str, list[str]]:
    """The chains that do not resolve on the imported package, with where they are written."""
    missing = {}
    for chain, places in chains.items():
        target = tl
        for name in chain.split("."):
            if not hasattr(target, name):
                missing[chain] = places
                break
            target = getattr(target, name)
    return missing


def test_the_face_is_the_listed_names_and_namespaces():
    assert len(tl.__all__) == len(set(tl.__all__)), "a name listed twice"
    assert set(tl.__all__) == FACE, (sorted(set(tl.__all__) - FACE), sorted(FACE - set(tl.__all__)))
    assert len(FACE) <= 45, "a face of about 40 names: a reader goes to tl.runs, tl.plots, tl.planning, ..."
    assert all(hasattr(tl, name) for name in FACE)


def test_the_namespaces_hold_what_notebooks_reach_through_them():
    assert tl.plots.__name__ == "tutorial_lib.notebook.plots", "tl.plots is the plots module itself"
    for namespace in ("runs", "planning", "probes", "slurm"):
        module = getattr(tl, namespace)
        assert module.__name__ == f"tutorial_lib.{namespace}", "a namespace is the folder of the same name"
        assert all(hasattr(module, name) for name in module.__all__), namespace


def test_every_face_name_is_used_by_a_notebook_or_a_doc():
    used = {chain.split(".")[0] for chain in uses()}
    assert FACE - used == set(), f"on the face but used by no notebook or docs page: {sorted(FACE - used)}"


def test_every_tl_chain_in_the_notebooks_and_docs_resolves():
    missing = unresolved(uses())
    assert missing == {}, "\n".join(f"tl.{chain}: {places[:3]}" for chain, places in sorted(missing.items()))


def test_a_made_up_chain_is_caught_in_code_and_in_prose():
    """The control: the readers find a chain that does not resolve, in a code cell and in markdown."""
    code = "%matplotlib inline\nmetrics = tl.runs.read_metricz(run_dir)\nfig = tl.plots.plot_run(metrics)\n"
    prose = "Read it with `tl.read_metrics(run_dir)` (moved to `tl.runs.read_metrics`), then `tl.plots.plot_run`."
    assert sorted(chains_in_code(code)) == ["plots", "plots.plot_run", "runs", "runs.read_metricz"]
    assert chains_in_text(prose) == ["read_metrics", "runs.read_metrics", "plots.plot_run"]
    found = {chain: ["here"] for chain in chains_in_code(code) + chains_in_text(prose)}
    assert set(unresolved(found)) == {"runs.read_metricz", "read_metrics"}


@pytest.mark.parametrize("name", sorted(FACE - NAMESPACES))
def test_a_face_name_is_reached_where_it_is_defined_too(name):
    """The face re-exports: every name on it is the object its own module defines (nothing wrapped or copied)."""
    obj = getattr(tl, name)
    module = getattr(obj, "__module__", None)
    assert module and module.startswith("tutorial_lib."), name
    assert getattr(importlib.import_module(module), name) is obj
