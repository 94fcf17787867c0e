"""Keep every notebook's Chinese twin (``notebooks/zh/NN_name.ipynb``) in step with the English notebook.

A twin has the English notebook's cells, in the same order and with the same cell ids: every code cell (source,
tags, stored reference outputs) is the English one, so one execution proves both editions; every markdown cell is
its translation, and records in its metadata the SHA-1 of the English text it translates
(``metadata.translation.source_sha1``). So a twin drifts in exactly two ways, and ``check`` names both:

* a code cell differs, is missing, or is out of order (the English code changed): ``sync`` fixes it;
* a markdown cell is untranslated (new English prose) or stale (the English prose changed since it was translated):
  a person translates it, with ``export``/``import`` or in JupyterLab.

Commands::

    python scripts/twins.py check                 # exit 1 and list every drift (tests/notebooks/test_twins.py runs it)
    python scripts/twins.py sync [NN_name ...]    # rebuild the twins' structure and code from the English notebooks
    python scripts/twins.py status [NN_name ...]  # untranslated and stale markdown cells per twin
    python scripts/twins.py export NN_name FILE   # the twin's prose as one text file to translate (English beside it)
    python scripts/twins.py import NN_name FILE   # the translated text file back into the twin

The text file of ``export``/``import`` has one block per markdown cell::

    <!-- cell 5ad1b2c3 source_sha1 0123abcd... -->
    <!-- en
    the English text, for reference (ignored by import)
    -->
    the Chinese text (what import stores)

``import`` records the block's ``source_sha1`` as the translated version, so translating from an export of stale
English marks the cell stale again. A translation whose English changed since is exported with a first line
``<!-- stale: ... -->`` above it; ``import`` refuses a block that still carries it, so a stale cell is never marked
up to date by an export and import that changed nothing.
"""

from __future__ import annotations

import copy
import hashlib
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
EDITION = "zh"  # the twins' folder under notebooks/ and their language
TWINS = NOTEBOOKS / EDITION
UNTRANSLATED = ""  # source_sha1 of a cell that holds English text waiting for its translation
STALE_MARK = "<!-- stale: the English above changed since this was translated; update, then delete this line -->"


def english_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def twin_path(english: Path) -> Path:
    return TWINS / english.name


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def _translated_sha(cell) -> str | None:
    return cell.metadata.get("translation", {}).get("source_sha1")


def _code_view(cell) -> tuple:
    """What must be equal between a code cell and its twin: id, source, tags."""
    return cell.get("id"), cell.source, tuple(cell.metadata.get("tags", []))


def drift(english: Path) -> list[str]:
    """Every way the twin of ``english`` differs from it; ``[]`` when it is in step.

    Code cells are compared by id, source and tags, in order; markdown cells must exist (same id, same position)
    and translate the current English text (their recorded SHA-1 equals the English source's).
    """
    twin = twin_path(english)
    if not twin.exists():
        return [f"{english.name}: no Chinese twin at {twin.relative_to(ROOT)} (python scripts/twins.py sync "
                f"{english.stem})"]
    en, zh = nbformat.read(english, as_version=4), nbformat.read(twin, as_version=4)
    problems = []
    en_code = [_code_view(c) for c in en.cells if c.cell_type == "code"]
    zh_code = [_code_view(c) for c in zh.cells if c.cell_type == "code"]
    if en_code != zh_code:
        first = next((i for i, (a, b) in enumerate(zip(en_code, zh_code)) if a != b), min(len(en_code), len(zh_code)))
        ids = " / ".join(dict.fromkeys(str(code[first][0]) for code in (en_code, zh_code) if first < len(code)))
        problems.append(f"{english.name}: code cells differ from the English notebook's from code cell {first + 1} "
                        f"(id {ids or 'none: one notebook has fewer code cells'}; {len(en_code)} English, "
                        f"{len(zh_code)} Chinese): python scripts/twins.py sync {english.stem}")
    if [c.get("id") for c in en.cells] != [c.get("id") for c in zh.cells]:
        problems.append(f"{english.name}: the twin's cells are not the English cells in the same order "
                        f"(python scripts/twins.py sync {english.stem})")
    zh_by_id = {c.get("id"): c for c in zh.cells}
    for cell in en.cells:
        if cell.cell_type != "markdown":
            continue
        mine = zh_by_id.get(cell.get("id"))
        recorded = _translated_sha(mine) if mine is not None and mine.cell_type == "markdown" else None
        if recorded in (None, UNTRANSLATED):
            problems.append(f"{english.name}: markdown cell {cell.get('id')} is not translated: "
                            f"{cell.source[:60]!r}...")
        elif recorded != sha1(cell.source):
            problems.append(f"{english.name}: markdown cell {cell.get('id')} changed in English since it was "
                            f"translated: {cell.source[:60]!r}...")
    return problems


def orphans() -> list[str]:
    """Twins whose English notebook is gone."""
    names = {p.name for p in english_notebooks()}
    return [f"{p.relative_to(ROOT)}: no English notebook of that name" for p in sorted(TWINS.glob("*.ipynb"))
            if p.name not in names]


def sync(english: Path) -> Path:
    """Rebuild the twin's cell list from ``english``: its code cells copied, each markdown cell's translation kept
    (by cell id) or, for a new cell, the English text marked untranslated. Notebook metadata follows English too,
    with the twin's language recorded. Returns the twin's path."""
    en = nbformat.read(english, as_version=4)
    twin = twin_path(english)
    old = {c.get("id"): c for c in nbformat.read(twin, as_version=4).cells} if twin.exists() else {}
    cells = []
    for cell in en.cells:
        mine = old.get(cell.get("id"))
        if cell.cell_type == "markdown" and mine is not None and mine.cell_type == "markdown":
            cells.append(mine)
        elif cell.cell_type == "markdown":
            new = copy.deepcopy(cell)
            new.metadata["translation"] = {"source_sha1": UNTRANSLATED}
            cells.append(new)
        else:
            cells.append(copy.deepcopy(cell))
    out = copy.deepcopy(en)
    out.cells = cells
    out.metadata["language_edition"] = EDITION
    TWINS.mkdir(parents=True, exist_ok=True)
    nbformat.write(out, twin)
    return twin


def export_text(english: Path) -> str:
    """The twin's markdown cells as one text file to translate (see the module docstring)."""
    en = nbformat.read(english, as_version=4)
    twin = twin_path(english)
    zh = {c.get("id"): c for c in nbformat.read(twin, as_version=4).cells} if twin.exists() else {}
    blocks = []
    for cell in en.cells:
        if cell.cell_type != "markdown":
            continue
        mine = zh.get(cell.get("id"))
        translated = mine is not None and _translated_sha(mine) not in (None, UNTRANSLATED)
        body = mine.source if translated else ""
        if translated and _translated_sha(mine) != sha1(cell.source):
            body = f"{STALE_MARK}\n{body}"
        blocks.append(f"<!-- cell {cell.get('id')} source_sha1 {sha1(cell.source)} -->\n<!-- en\n"
                      f"{cell.source.replace('-->', '--&gt;')}\n-->\n{body}\n")
    return "\n".join(blocks)


_BLOCK = re.compile(r"<!-- cell (?P<id>\S+) source_sha1 (?P<sha>[0-9a-f]{40}) -->\n<!-- en\n.*?\n-->\n(?P<text>.*?)"
                    r"(?=\n<!-- cell |\Z)", re.S)


def import_text(english: Path, text: str) -> int:
    """Store the translations of an ``export_text`` file in the twin; returns how many cells it set.

    Raises:
        ValueError: a block names a cell that is not a markdown cell of the twin, or has no text.
    """
    twin = twin_path(english) if twin_path(english).exists() else sync(english)
    zh = nbformat.read(twin, as_version=4)
    by_id = {c.get("id"): c for c in zh.cells}
    count = 0
    for m in _BLOCK.finditer(text):
        cell = by_id.get(m["id"])
        if cell is None or cell.cell_type != "markdown":
            raise ValueError(f"{twin.name}: no markdown cell {m['id']} (run sync first, and export again)")
        translation = m["text"].strip("\n")
        if not translation.strip():
            continue  # not translated yet: left as it is
        if STALE_MARK in translation:
            raise ValueError(f"{twin.name}: cell {m['id']} still carries the mark {STALE_MARK!r}: bring the "
                             "translation up to date with the English above it, then delete the mark")
        cell.source = translation
        cell.metadata["translation"] = {"source_sha1": m["sha"]}
        count += 1
    nbformat.write(zh, twin)
    return count


def _chosen(names: list[str]) -> list[Path]:
    notebooks = english_notebooks()
    if not names:
        return notebooks
    chosen = []
    for name in names:
        match = [p for p in notebooks if p.stem == name.removesuffix(".ipynb") or p.stem.startswith(name + "_")]
        if len(match) != 1:
            raise SystemExit(f"no single English notebook named {name!r}; choose from: "
                             f"{', '.join(p.stem for p in notebooks)}")
        chosen += match
    return chosen


def main(argv: list[str]) -> int:
    command, names = (argv[0], argv[1:]) if argv else ("check", [])
    if command == "check":
        problems = [p for english in english_notebooks() for p in drift(english)] + orphans()
        print("\n".join(problems) or f"every notebook has its {EDITION} twin, in step")
        return 1 if problems else 0
    if command == "sync":
        for english in _chosen(names):
            print(f"synced {sync(english).relative_to(ROOT)}")
        return 0
    if command == "status":
        for english in _chosen(names):
            problems = drift(english)
            print(f"{english.stem}: " + ("in step" if not problems else f"{len(problems)} to do"))
            for p in problems:
                print("   ", p.split(": ", 1)[1])
        return 0
    if command in ("export", "import") and len(names) == 2:
        (english,), path = _chosen(names[:1]), Path(names[1])
        if command == "export":
            path.write_text(export_text(english), encoding="utf-8")
            print(f"wrote {path}")
        else:
            print(f"{import_text(english, path.read_text(encoding='utf-8'))} cell(s) translated in "
                  f"{twin_path(english).relative_to(ROOT)}")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
