"""The house plan, held against the code: each folder's rules, an acyclic import graph without upward imports, small
modules, one reader per torchrun format, and tests that use only the library's public names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "tutorial_lib"
TESTS = ROOT / "tests"
# Floors, from the ground up: a module may import its own floor or lower ones, never a higher one.
#   child/ (programs run by path) and lessons/ (scripts a learner copies) import nothing of the package at all;
#   torchrun/ reads torchrun's formats and imports only child/ (the rank runner's marks);
#   errors.py holds the exception types (a LaunchError carries torchrun's RankFailure);
#   runs/ lays out a run directory and reads a finished run into values; probes/ measures this machine's torch;
#   i18n/ holds the language and the gettext catalogues; diagnosis/ reads a failure into one value (the doctor);
#   notebook/ checks and shows what a cell needs (parameters, a script's listing, figures), finding scripts in runs/;
#   planning/ predicts memory from torch in fake mode, importing lesson scripts through notebook/;
#   slurm/ speaks SLURM (its batch script, its commands, a local cluster and its watchdog, a program run by path),
#   checking values through notebook/ (below launcher/: a LaunchSpec holds a SlurmSpec; the SLURM job the launcher
#   runs is launcher/slurm_job.py, one class beside the local one behind the launcher's job interface);
#   the launcher (the kernel's job control) above them; exercises/ (checks that launch a learner's script) above
#   the launcher; the package's face (__init__, __main__) on top.
FLOORS = {"child": 0, "lessons": 0, "torchrun": 1, "errors": 2, "runs": 3, "probes": 3, "i18n": 3, "diagnosis": 4,
          "notebook": 4, "planning": 5,
          "slurm": 5, "launcher": 6, "exercises": 7, "__init__": 8, "__main__": 8}
STILL_FLAT = 3
# What may stand directly in tutorial_lib/: the face and the exception types; every other module is in a folder.
AT_THE_TOP = {"__init__.py", "__main__.py", "errors.py"}
STILL_TO_MOVE: set[str] = set()
# Each folder's rule, held against its imports: the package's folders (or top modules) it may import, and the
# outside modules it must not (no process started, nothing displayed, where the folder says so).
STARTS_A_PROCESS = {"subprocess", "multiprocessing", "signal", "threading"}
DISPLAYS = {"matplotlib", "IPython", "ipywidgets"}
FOLDER_RULES = {
    "runs": ({"errors", "torchrun", "runs"}, STARTS_A_PROCESS | DISPLAYS),
    "probes": ({"errors", "probes"}, STARTS_A_PROCESS | DISPLAYS),
    "i18n": ({"errors", "i18n"}, STARTS_A_PROCESS | DISPLAYS),
    # diagnosis/ names signals (signal.Signals(9).name), it sends none
    "diagnosis": ({"errors", "i18n", "runs", "torchrun", "diagnosis"}, (STARTS_A_PROCESS - {"signal"}) | DISPLAYS),
    "notebook": ({"errors", "i18n", "runs", "notebook"}, STARTS_A_PROCESS),  # i18n: the figures' Chinese glosses
    "planning": ({"errors", "runs", "notebook", "planning"}, STARTS_A_PROCESS | DISPLAYS),
    "slurm": ({"errors", "i18n", "notebook", "probes", "slurm"}, DISPLAYS),  # probes: free ports for the daemons
    # exercises/ launches a learner's script through the launcher, as a cell would; it starts nothing itself
    "exercises": ({"errors", "i18n", "runs", "torchrun", "diagnosis", "notebook", "planning", "launcher", "exercises"},
                  STARTS_A_PROCESS | DISPLAYS),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def floor(module: str) -> int:
    top = module.split(".")[1] if module != "tutorial_lib" else "__init__"
    return FLOORS.get(top, STILL_FLAT)


def imports_of(path: Path) -> set[str]:
    """The ``tutorial_lib`` modules ``path`` imports (relative imports resolved; ``from . import x`` names x)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "tutorial_lib"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "tutorial_lib":
                target = node.module
            else:
                continue
            names = {f"{target}.{a.name}" for a in node.names}
            found |= {n for n in names if _is_module(n)} or {target}
    return found


def _is_module(name: str) -> bool:
    path = ROOT / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_graph() -> dict[str, set[str]]:
    graph = {module_name(p): imports_of(p) for p in library_files()}
    return {m: {t for t in targets if t != m} for m, targets in graph.items()}


# Programs run by path that stand beside the package's modules of their folder (each folder's __init__ says so).
PROGRAMS_ELSEWHERE = [PACKAGE / "slurm" / "watchdog.py"]


def test_the_child_programs_and_the_lessons_import_nothing_of_the_package():
    """They run by file path in other processes (every rank, the warm-start helper and its clients, a SLURM cluster's
    watchdog), where importing the package would cost seconds and its __init__ would run; a relative import would not
    even resolve there."""
    offenders = []
    for path in [*sorted((PACKAGE / "child").glob("*.py")), *sorted((PACKAGE / "lessons").glob("*.py")),
                 *PROGRAMS_ELSEWHERE]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("tutorial_lib")):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Import) and any(a.name.startswith("tutorial_lib") for a in node.names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_the_child_programs_load_their_shared_protocol_with_one_loader_held_equal():
    """rank_runner.py, warm_start.py and observer.py each carry ``load_sibling`` (they cannot import it: it is what
    loads the shared protocol, and the observer's own sibling), and the copies must not drift."""
    def loader(path: Path) -> str:
        tree = ast.parse(path.read_text())
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "load_sibling")
        node.body = node.body[1:]  # its docstring names the other copy
        return ast.dump(node)

    assert loader(PACKAGE / "child" / "rank_runner.py") == loader(PACKAGE / "child" / "warm_start.py")
    assert loader(PACKAGE / "child" / "rank_runner.py") == loader(PACKAGE / "child" / "observer.py")
    for name in ("rank_runner.py", "warm_start.py"):
        assert 'protocol = load_sibling("protocol")' in (PACKAGE / "child" / name).read_text(), name


def test_the_import_graph_is_acyclic():
    graph = import_graph()
    done, path_ = set(), []

    def visit(module: str) -> None:
        if module in path_:
            raise AssertionError("import cycle: " + " -> ".join(path_[path_.index(module):] + [module]))
        if module in done:
            return
        path_.append(module)
        for target in sorted(graph.get(module, ())):
            visit(target)
        path_.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_no_module_imports_from_a_higher_floor():
    upward = [f"{m} (floor {floor(m)}) -> {t} (floor {floor(t)})" for m, targets in import_graph().items()
              for t in targets if floor(t) > floor(m)]
    assert upward == []


def test_the_floors_hold_what_they_say():
    """The rules read off the layout: torchrun/ imports only child/; the readers never import the launcher."""
    graph = import_graph()
    assert {t for m, ts in graph.items() if m.startswith("tutorial_lib.torchrun") for t in ts
            if not t.startswith(("tutorial_lib.torchrun", "tutorial_lib.child"))} == set()
    assert {t for t in graph["tutorial_lib.diagnosis.doctor"] if t.startswith("tutorial_lib.launcher")} == set()


def test_only_the_face_the_errors_and_the_modules_still_to_move_stand_at_the_top():
    """Every other module lives in a folder whose __init__ states its rule; the flat list only shrinks."""
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == sorted(AT_THE_TOP | STILL_TO_MOVE)


def test_every_folder_of_modules_states_its_rule_in_its_docstring():
    """lessons/ holds standalone scripts (no package); every other folder's __init__ says what its files may do."""
    folders = {p.parent for p in PACKAGE.rglob("*.py")} - {PACKAGE, PACKAGE / "lessons"}
    assert {f.name for f in folders} >= set(FOLDER_RULES)
    silent = [f.name for f in sorted(folders)
              if not (f / "__init__.py").is_file() or not ast.get_docstring(ast.parse((f / "__init__.py").read_text()))]
    assert silent == []


def outside_imports(path: Path) -> set[str]:
    """The top-level names of the modules outside the package that ``path`` imports, at any depth (lazy ones too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
    return found - {"tutorial_lib"}


@pytest.mark.parametrize("folder", sorted(FOLDER_RULES))
def test_each_folder_imports_what_its_rule_allows(folder):
    """runs/: only errors and torchrun/ of the package; probes/: only errors; notebook/, planning/ and slurm/: no
    launcher; only notebook/ makes figures, and only slurm/ starts a process (SLURM's programs)."""
    allowed, forbidden = FOLDER_RULES[folder]
    graph = import_graph()
    taken = {t.split(".")[1] for m, ts in graph.items() if m.split(".")[1:2] == [folder] for t in ts
             if t != "tutorial_lib"}
    assert taken - allowed == set()
    assert {str(p.relative_to(PACKAGE)): sorted(outside_imports(p) & forbidden)
            for p in sorted((PACKAGE / folder).rglob("*.py")) if outside_imports(p) & forbidden} == {}


def test_no_library_module_is_over_500_lines():
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in library_files()
               if "lessons" not in p.parts}
    assert {name: n for name, n in lengths.items() if n > 500} == {}


def test_torchruns_attempt_folders_are_globbed_in_exactly_one_function():
    """The "which attempt folder" rule, written once (``tutorial_lib.torchrun.attempts.attempts``); every reader of
    an attempt asks it. A glob, rglob or iglob whose pattern names ``attempt_``, anywhere in the library."""
    found = []
    for path in library_files():
        tree = ast.parse(path.read_text())
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                name = getattr(call.func, "attr", getattr(call.func, "id", ""))
                texts = [c.value for arg in call.args for c in ast.walk(arg)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                if name in ("glob", "rglob", "iglob") and any("attempt_" in t for t in texts):
                    found.append(f"{path.relative_to(ROOT)}:{function.name}")
    assert sorted(set(found)) == ["tutorial_lib/torchrun/attempts.py:attempts"]


@pytest.mark.parametrize("path", sorted(TESTS.rglob("*.py")), ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_imports_a_private_name_of_the_library(path):
    """Tests use the library as its users may: public modules, public names (a private one would pin a seam)."""
    private = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tutorial_lib"):
            parts = node.module.split(".") + [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            parts = [p for a in node.names if a.name.startswith("tutorial_lib") for p in a.name.split(".")]
        else:
            continue
        # ``_`` is gettext's function (tutorial_lib.i18n): public by convention, not a private name
        private += [p for p in parts if p.startswith("_") and p != "_" and not (p.startswith("__") and p.endswith("__"))]
    assert private == []


def test_no_library_module_imports_another_modules_private_names():
    """Seams: a name starting with "_" is its module's own; what another module needs is public (issue 17)."""
    offenders = []
    for path in library_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                offenders += [f"{path.name}: from .{node.module} import {a.name}" for a in node.names
                              if a.name.startswith("_") and a.name != "_"]  # _: gettext's function
    assert offenders == []


def test_library_functions_stay_short():
    """Seams (issue 17): launch() is a short sequence of named parts, and no library function runs past 80 lines."""
    lengths = {}
    for path in library_files():
        if "lessons" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths[f"{path.relative_to(PACKAGE)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert lengths["launcher/run.py:run_job"] < 60, lengths["launcher/run.py:run_job"]
    assert {name: n for name, n in lengths.items() if n > 80} == {}


# What marks a pattern as one of torchrun's (or Python's, or the process groups') output formats.
TORCHRUN_FORMAT_MARKS = (r"\[rank", 'File "', "Traceback", "Thread 0x", "Fatal Python error", "CollectiveFingerPrint",
                         r"\[Gloo\]", "Error|Exception", "--nproc", "error.json", r"\[default", "ChildFailedError")
REGEX_CALLS = {"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "split"}


def torchrun_format_patterns(source: str) -> list[str]:
    """The regular expressions in ``source`` (``re.compile(...)`` and the other ``re`` calls) that spell one of
    torchrun's text formats (``TORCHRUN_FORMAT_MARKS``), as ``"line N: pattern"``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REGEX_CALLS
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and any(mark in node.args[0].value for mark in TORCHRUN_FORMAT_MARKS)):
            found.append(f"line {node.lineno}: {node.args[0].value}")
    return found


def test_torchruns_text_formats_are_spelled_only_in_torchrun():
    """Issue 34: a change in what torchrun or Python prints is one edit in torchrun/ (formats.py), not a search through
    the launcher, the doctor and the run readers."""
    found = {str(p.relative_to(ROOT)): torchrun_format_patterns(p.read_text()) for p in library_files()
             if not {"torchrun", "lessons", "child"} & set(p.relative_to(PACKAGE).parts)}
    assert {name: patterns for name, patterns in found.items() if patterns} == {}
    control = 'import re\nLABEL = re.compile(r"^\\[rank(\\d+)\\]:")\nOK = re.compile(r"step (\\d+)")\n'
    assert torchrun_format_patterns(control) == ["line 2: ^\\[rank(\\d+)\\]:"], "the check finds a rank label"
