"""README.md and docs/: every page is linked from the README, and nothing a page names has rotted.

What a page names is checked against the repository: relative links resolve to files, repository paths in code
(`tutorial_lib/lessons/train_lm.py`, `notebooks/01_ddp.ipynb`, placeholders such as `<version>` or `NN` matching at
least one file), `make` targets are the Makefile's, `python scripts/X.py` and `python -m tutorial_lib X` name a
script, module or subcommand that exists, and a notebook named `NN_name` is in notebooks/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_ZH = ROOT / "README.zh-CN.md"
README_MAX_LINES = 200

# Where a repository path starts: a code token naming one of these is checked.
TOP_LEVEL = ("tutorial_lib/", "scripts/", "tests/", "notebooks/", "docs/", ".ci/")
TOP_FILES = ("Makefile", "pyproject.toml", "environment.yml", "README.md", "README.zh-CN.md")
# Folders a run creates (git ignores them): named as where things go, absent in a fresh clone.
GENERATED = ("notebooks/runs", "notebooks/zh/runs", "outputs")

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
MAKE = re.compile(r"\bmake((?:\s+[^\s`]+)+)")
PYTHON_SCRIPT = re.compile(r"\bpython3?\s+((?:scripts|tutorial_lib|tests)/[\w/.-]+\.py)")
PYTHON_MODULE = re.compile(r"\bpython3?\s+-m\s+(tutorial_lib[\w.]*)(?:\s+([\w-]+))?")
NOTEBOOK = re.compile(r"(?<![\w.-])(\d\d_[a-z][a-z0-9_]*[a-z0-9])(?:\.ipynb)?(?![\w-])")


def doc_pages(root: Path = ROOT) -> list[Path]:
    """docs/*.md and, when present, docs/zh/*.md (the Chinese pages)."""
    docs = root / "docs"
    return sorted(docs.glob("*.md")) + sorted((docs / "zh").glob("*.md"))


def make_targets(root: Path = ROOT) -> set[str]:
    text = (root / "Makefile").read_text()
    return {m[1] for m in re.finditer(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M)}


def cli_commands(root: Path = ROOT) -> set[str]:
    """The subcommands of ``python -m tutorial_lib`` (its argparse ``add_parser`` calls)."""
    text = (root / "tutorial_lib" / "__main__.py").read_text()
    return set(re.findall(r"add_parser\(\"([\w-]+)\"", text))


def code_spans(text: str) -> list[str]:
    """Fenced blocks and inline code spans, the places a page names paths and commands."""
    spans = [m[1] for m in FENCE.finditer(text)]
    return spans + [m[1] for m in INLINE.finditer(FENCE.sub("", text))]


def path_exists(token: str, root: Path) -> bool:
    """A repository path, with placeholders (`<version>`, `NN`, `*`) matching at least one file or folder."""
    token = token.rstrip("/")
    if token.startswith(GENERATED):
        return True
    if not re.search(r"<[^>]*>|NN|\*", token):
        return (root / token).exists()
    pattern = re.sub(r"<[^>]*>", "*", token).replace("NN_name", "NN_*").replace("NN", "[0-9][0-9]")
    return any(root.glob(pattern))


def repository_paths(span: str) -> list[str]:
    paths = []
    for token in re.split(r"[\s=,;()\"'\[\]{}]+", span):
        token = token.rstrip(".:").split("::")[0]
        if not token or "..." in token or "://" in token or token.startswith("~"):
            continue
        if token.startswith(TOP_LEVEL) or token in TOP_FILES:
            paths.append(token)
    return paths


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a markdown page's headings (lower case, punctuation dropped, spaces as hyphens)."""
    text = FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def problems(text: str, page: Path, root: Path = ROOT) -> list[str]:
    """Every link, path, make target, script, module and notebook ``text`` (the page at ``page``) names that is
    not in the repository at ``root``, one line each."""
    found = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][\w+.-]*:|#", target):  # https:, mailto:, an anchor on the same page
            continue
        path, _, anchor = target.partition("#")
        if not (page.parent / path).exists():
            found.append(f"link to a missing file: {target}")
        elif anchor and path.endswith(".md") and anchor not in anchors(page.parent / path):
            found.append(f"link to a missing heading: {target}")
    spans = code_spans(text)
    targets, commands = make_targets(root), cli_commands(root)
    for span in spans:
        for path in repository_paths(span):
            if not path_exists(path, root):
                found.append(f"missing path: {path}")
        for m in MAKE.finditer(span):
            words = [w for w in m[1].split() if "=" not in w]
            if words and not words[0].startswith(("-", ".", "<", "$")) and words[0] not in targets:
                found.append(f"unknown make target: make {words[0]}")
        for m in PYTHON_SCRIPT.finditer(span):
            if not (root / m[1]).is_file():
                found.append(f"missing script: python {m[1]}")
        for m in PYTHON_MODULE.finditer(span):
            module, sub = m[1], m[2]
            if module == "tutorial_lib":
                if sub and sub not in commands:
                    found.append(f"unknown command: python -m tutorial_lib {sub}")
                continue
            base = root / module.replace(".", "/")
            if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
                found.append(f"missing module: python -m {module}")
    notebooks = {p.stem for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    for name in NOTEBOOK.findall(text):
        if name not in notebooks:
            found.append(f"missing notebook: {name}")
    return sorted(set(found))


def test_readme_is_a_five_minute_page():
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines: move detail to docs/"


def test_the_docs_exist():
    names = {p.name for p in doc_pages()}
    assert {"torch-versions.md", "own-script.md", "live-view.md", "doctor.md", "planner.md", "slurm.md",
            "benchmarks.md", "layout.md", "gpus.md", "exercises.md", "notebooks.md"} <= names


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_docs_page_is_linked_from_the_readme_of_its_language(page):
    """An English page from README.md; a Chinese one (docs/zh/) from README.zh-CN.md, the Chinese readers' first page."""
    readme = README_ZH if page.parent.name == "zh" else README
    links = {(ROOT / target.split("#")[0]).resolve() for target in LINK.findall(readme.read_text())}
    assert page.resolve() in links, f"{readme.name} does not link {page.relative_to(ROOT)}"


def test_every_english_page_has_its_chinese_page():
    """Issue 38: the same docs/ pages in Chinese (docs/zh/), each linking back to its English page."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        twin = ROOT / "docs" / "zh" / page.name
        assert twin.is_file(), f"{page.relative_to(ROOT)} has no Chinese page {twin.relative_to(ROOT)}"
        assert f"(../{page.name})" in twin.read_text(), f"{twin.relative_to(ROOT)} does not link its English page"


@pytest.mark.parametrize("page", [README, README_ZH, *doc_pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_what_a_page_names_exists(page):
    assert problems(page.read_text(), page) == []


def test_every_notebook_has_a_line_in_the_readme():
    readme = README.read_text()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert f"`{path.stem}`" in readme or f"{path.name}" in readme, f"README.md's table misses {path.stem}"


def test_the_checker_reports_what_has_rotted():
    """The control: a page with a missing path, a bad link, an unknown make target, a missing script, module,
    command and notebook gets each reported; its good twin gets nothing."""
    good = ("Run `make workbook` and `make test WORKBOOK_ARGS=x`, read [the notebooks](docs/notebooks.md) and\n"
            "`tutorial_lib/lessons/train_lm.py`, open 01_ddp.ipynb and `notebooks/zh/NN_name.ipynb`.\n"
            "```bash\npython scripts/bench.py --only plan\npython -m tutorial_lib doctor RUN_DIR\n"
            "python -m tutorial_lib.planning.memory_plan\n```\n"
            "[site](https://pytorch.org), [next](README.md#where-to-go-next)\n")
    assert problems(good, README) == []
    bad = ("Run `make workbok`, read [the notebooks](docs/notebook.md) and `tutorial_lib/scripts/train_lm.py`,\n"
           "open 99_nowhere.ipynb and `tests/fixtures/run_dirs/torch-<nothing>/x`; see [next](README.md#nowhere).\n"
           "```bash\npython scripts/bench2.py\npython -m tutorial_lib doctr RUN_DIR\n"
           "python -m tutorial_lib.planning.nothing\n```\n")
    assert problems(bad, README) == sorted([
        "unknown make target: make workbok",
        "link to a missing file: docs/notebook.md",
        "link to a missing heading: README.md#nowhere",
        "missing path: tutorial_lib/scripts/train_lm.py",
        "missing notebook: 99_nowhere",
        "missing path: tests/fixtures/run_dirs/torch-<nothing>/x",
        "missing path: scripts/bench2.py",
        "missing script: python scripts/bench2.py",
        "unknown command: python -m tutorial_lib doctr",
        "missing module: python -m tutorial_lib.planning.nothing",
    ])
