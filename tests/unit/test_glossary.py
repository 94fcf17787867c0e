"""One glossary for the Chinese edition (issue 38): every twin's prose and every msgstr of the zh catalogue use the
renderings of ``docs/zh/glossary.md``, and none of the variants that page rejects.

The rules are read from the page's one table (columns: English, 译法, 不用, 范围, 说明), so the page and this test
cannot disagree. A twin's markdown is checked as prose: fenced code, code spans, URLs, link targets, file names,
paths, flags and identifiers are removed first, then each rule's accepted forms (``卡住（hang）``, the alias phrase of
激活检查点) are masked, then its rejected variants are searched. A variant made of ASCII letters matches as a whole
word, case-insensitively; any other matches literally. A rule whose 范围 names an English word (``job``) applies only
where the English text the Chinese renders (the English notebook's cell of the same id, or the msgid) holds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "docs" / "zh" / "glossary.md"
TWINS = ROOT / "notebooks" / "zh"
CATALOGUE = ROOT / "tutorial_lib" / "i18n" / "locale" / "zh" / "LC_MESSAGES" / "tutorial_lib.po"
HEADER = ["English", "译法", "不用", "范围", "说明"]


@dataclass(frozen=True)
class Rule:
    english: str
    accepted: tuple[str, ...]
    rejected: tuple[str, ...]
    scope: tuple[str, ...]  # English words: the rule applies only where the English source holds one
    note: str


def _spans(cell: str) -> tuple[str, ...]:
    return tuple(re.findall(r"`([^`]+)`", cell))


def load_rules(text: str) -> list[Rule]:
    """The rules of the page's table (the one whose header is ``HEADER``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if [c.strip() for c in line.strip().strip("|").split("|")] == HEADER)
    rules = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(HEADER), f"glossary row with {len(cells)} columns: {line}"
        english, accepted, rejected, scope, note = cells
        rules.append(Rule(english, _spans(accepted), _spans(rejected), _spans(scope), note))
    return rules


RULES = load_rules(GLOSSARY.read_text(encoding="utf-8"))

_NOT_PROSE = [
    re.compile(r"```.*?```", re.S),                                   # fenced code
    re.compile(r"`[^`\n]*`"),                                         # code spans
    re.compile(r"\]\([^)]*\)"),                                       # link targets
    re.compile(r"<?https?://\S+?>?(?=[\s）)，。；]|$)"),                 # URLs
    re.compile(r"\$[^$\n]+\$"),                                       # formulas
    re.compile(r"\{[A-Za-z_][\w.:!]*\}", re.A),                       # message placeholders
    re.compile(r"(?<![A-Za-z0-9])--?[A-Za-z][\w-]*", re.A),           # flags
    re.compile(r"[\w.~-]*/[\w./<>~-]*", re.A),                        # paths
    re.compile(r"[\w-]+\.(?:ipynb|py|md|json|jsonl|txt|sh|log|pt|po|cfg|toml|yml|safetensors|distcp)\b", re.A),
    re.compile(r"(?<![A-Za-z0-9])[A-Za-z_][A-Za-z0-9]*(?:[._][A-Za-z0-9_]+)+", re.A),  # identifiers, dotted names
]


def prose(markdown: str) -> str:
    for pattern in _NOT_PROSE:
        markdown = pattern.sub(" ", markdown)
    return markdown


def _variant(variant: str) -> re.Pattern:
    if re.fullmatch(r"[A-Za-z][A-Za-z -]*", variant):
        return re.compile(rf"(?<![A-Za-z]){re.escape(variant)}(?![A-Za-z])", re.I)
    return re.compile(re.escape(variant))


def rejected_in(text: str, english: str | None, rules=RULES) -> list[str]:
    """The rejected variants ``text`` (already prose) uses, one entry per variant found, each rule judged alone."""
    found = []
    for rule in rules:
        if rule.scope and english is not None and not any(_variant(w).search(english) for w in rule.scope):
            continue
        masked = text
        for form in sorted(rule.accepted, key=len, reverse=True):
            masked = _variant(form).sub("□", masked)
        found += [v for v in rule.rejected if _variant(v).search(masked)]
    return found


def twin_cells():
    """(twin name, cell id, Chinese markdown, English markdown) for every checked markdown cell."""
    for twin in sorted(TWINS.glob("[0-9][0-9]_*.ipynb")):
        english = {c.get("id"): c.source for c in nbformat.read(ROOT / "notebooks" / twin.name, as_version=4).cells}
        for cell in nbformat.read(twin, as_version=4).cells:
            if cell.cell_type == "markdown":
                yield twin.name, cell.get("id"), cell.source, english.get(cell.get("id"), "")


def _po_string(lines: list[str], i: int, keyword: str) -> tuple[str, int]:
    text = ""
    first = lines[i][len(keyword):].strip()
    text += eval(first)  # noqa: S307 - a .po string literal, written by us
    i += 1
    while i < len(lines) and lines[i].startswith('"'):
        text += eval(lines[i])  # noqa: S307
        i += 1
    return text, i


def catalogue_messages(path: Path = CATALOGUE) -> list[tuple[str, str]]:
    """(msgid, msgstr) of every translated message of the catalogue (plural forms joined)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    messages, msgid, msgstr, i = [], None, [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("msgid "):
            if msgid:
                messages.append((msgid, "\n".join(msgstr)))
            msgid, i = _po_string(lines, i, "msgid")
            msgstr = []
            continue
        if line.startswith("msgid_plural "):
            plural, i = _po_string(lines, i, "msgid_plural")
            msgid += "\n" + plural
            continue
        m = re.match(r"msgstr(\[\d+\])? ", line)
        if m:
            text, i = _po_string(lines, i, m.group(0))
            msgstr.append(text)
            continue
        i += 1
    if msgid:
        messages.append((msgid, "\n".join(msgstr)))
    return messages


def test_the_glossary_page_has_its_rules():
    names = [r.english for r in RULES]
    assert len(RULES) >= 12 and len(set(names)) == len(names), names
    for rule in RULES:
        assert rule.accepted, f"{rule.english}: no rendering"
        for form in rule.accepted:
            assert not rejected_in(form, None, [rule]), f"{rule.english}: its rendering {form!r} is rejected"


@pytest.mark.parametrize("twin", sorted(p.name for p in TWINS.glob("[0-9][0-9]_*.ipynb")))
def test_twin_prose_uses_the_glossary(twin):
    problems = [f"{name} cell {cell_id}: {variant!r}"
                for name, cell_id, zh, en in twin_cells() if name == twin
                for variant in rejected_in(prose(zh), prose(en))]
    assert not problems, "rejected variants (docs/zh/glossary.md):\n" + "\n".join(problems)


ZH_PAGES = [ROOT / "README.zh-CN.md", *sorted((ROOT / "docs" / "zh").glob("*.md"))]


@pytest.mark.parametrize("page", [p for p in ZH_PAGES if p.name != "glossary.md"], ids=lambda p: p.name)
def test_the_chinese_readme_and_pages_use_the_glossary(page):
    """The Chinese README and docs/zh/ pages, paragraph by paragraph, against their English page where there is one
    (a scoped rule such as job's then applies where that page says "job")."""
    english = ROOT / "docs" / page.name if page.parent.name == "zh" else ROOT / "README.md"
    scope = prose(english.read_text(encoding="utf-8")) if english.is_file() else None
    text = prose(page.read_text(encoding="utf-8")).replace("distributed-workbook", "")  # the project's name
    problems = [f"{page.name}: {variant!r} in {paragraph[:60]!r}"
                for paragraph in text.split("\n\n") for variant in rejected_in(paragraph, scope)]
    assert not problems, "rejected variants (docs/zh/glossary.md):\n" + "\n".join(problems)


def test_catalogue_uses_the_glossary():
    problems = [f"msgid {msgid[:70]!r}: {variant!r}"
                for msgid, msgstr in catalogue_messages() if msgstr
                for variant in rejected_in(prose(msgstr), prose(msgid))]
    assert not problems, "rejected variants in tutorial_lib.po (docs/zh/glossary.md):\n" + "\n".join(problems)


def test_the_catalogue_reader_reads_every_message():
    messages = catalogue_messages()
    assert len(messages) > 100 and all(msgstr for _, msgstr in messages[1:]), len(messages)
    assert ("the job ran past timeout_s={timeout_s} s and was stopped" in dict(messages)), "a known msgid is read"


# Controls: a checker that cannot fail is a defect.

@pytest.mark.parametrize("rule", [r for r in RULES if r.rejected], ids=lambda r: r.english)
def test_the_checker_finds_each_rejected_variant(rule):
    english = " ".join(rule.scope) or None
    for variant in rule.rejected:
        sample = f"在一个很小的例子里，{variant} 出现了一次。"
        assert variant in rejected_in(prose(sample), english, [rule]), (rule.english, variant)
        assert variant in rejected_in(prose(sample), english), (rule.english, variant)


def test_the_checker_names_the_cell_and_spares_code_names_and_glosses():
    cells = {
        "a1": "本 notebook 的 batch 很小，作业会挂起。",
        "a2": "`notebook` 和 `batch_size` 是代码；见 [01_ddp](01_ddp.ipynb) 和 https://example.org/notebook 。",
        "a3": "作业会卡住（hang）；激活检查点（activation checkpointing，很多文章叫梯度检查点）；Jupyter 内核；操作系统内核。",
        "a4": "```python\nfor batch in loader:  # notebook\n    pass\n```\n微批次（micro-batch）；`--cpu-offload`；sbatch 提交。",
    }
    found = {cell_id: rejected_in(prose(text), "") for cell_id, text in cells.items()}
    assert found["a1"] == ["notebook", "batch", "挂起"], found
    assert found["a2"] == found["a3"] == found["a4"] == [], found


def test_a_scoped_rule_applies_only_where_the_english_says_so():
    assert rejected_in(prose("这个任务已被停止"), "the job was stopped") == ["任务"]
    assert rejected_in(prose("每个任务最多请求 4 个 CPU"), "at most 4 CPUs per task") == []


def test_a_twin_with_a_rejected_variant_is_reported_by_notebook_and_cell(tmp_path, monkeypatch):
    """The notebook test above, run on a copy of twin 00 with one rejected variant planted."""
    import sys

    module = sys.modules[__name__]
    (tmp_path / "notebooks" / "zh").mkdir(parents=True)
    name = "00_environment_check.ipynb"
    (tmp_path / "notebooks" / name).write_bytes((ROOT / "notebooks" / name).read_bytes())
    nb = nbformat.read(TWINS / name, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "markdown")
    cell.source += "\n\n这时作业会挂起。"
    nbformat.write(nb, tmp_path / "notebooks" / "zh" / name)
    monkeypatch.setattr(module, "TWINS", tmp_path / "notebooks" / "zh")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=rf"{name} cell {cell.get('id')}: '挂起'"):
        test_twin_prose_uses_the_glossary(name)


def test_notebook_06_title_gives_both_names_of_multi_node():
    title = nbformat.read(TWINS / "06_multi_node.ipynb", as_version=4).cells[0].source.splitlines()[0]
    assert "多节点" in title and "多机多卡" in title, title
