"""The library's texts in every language (issues 31 and 34): one gettext catalogue per language, in which every
message the code marks has its translation, keeping the English's fields, names and notebook references; the doctor's
report and the live view speak the chosen language; the language is chosen as a Chinese notebook needs (its code
cells are the English ones: it cannot ask for it itself); and a third language is one new ``.po`` file."""

from __future__ import annotations

import html
import io
import re
import shutil
import string
import unicodedata

import pytest

import tutorial_lib as tl
from tutorial_lib.diagnosis.cause_ids import CauseId
from conftest import FIXTURES
from conftest import ROOT
from tutorial_lib import LaunchSpec, i18n
from tutorial_lib.diagnosis import causes
from tutorial_lib.i18n import LANG_ENV, N_, Message, has_cjk, notebook_language, render
from tutorial_lib.launcher.environment import rank_env
from tutorial_lib.launcher.live import NotebookView, Outcome, TerminalView
from tutorial_lib.launcher.outcome import failure_error
from tutorial_lib.launcher.output import OutputPump, ThrottledPrinter
from tutorial_lib.launcher.plan import plan_launch
from tutorial_lib.runs.rundir import RunStatus

RUN_DIRS = FIXTURES / "run_dirs"
CASES = sorted(p for version in RUN_DIRS.glob("torch-*") for p in version.iterdir() if p.is_dir())

# What a Chinese text keeps exactly from its English: code in backticks, flags, dotted and underscored names
# (API, files, variables), and upper-case names (signals, env vars, NCCL, OOM, ...).
_NAMES = re.compile(r"`[^`]+`|--[\w-]+|\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\b|\b\w*_\w+\b|\b[A-Z][A-Z0-9]{2,}\b")
_SECTION = re.compile(r"\b(\d\d), section (\d+[a-z]?)\b")  # "(07, section 2 'A crashing rank')"


def names(text: str) -> set[str]:
    """The names ``text`` holds, less those in the quoted English section titles (a Chinese text names the section
    by its number: the Chinese notebooks' titles differ)."""
    text = re.sub(r"(section \d+[a-z]?) '[^']*'", r"\1", text)
    return {n for n in _NAMES.findall(text) if n not in ("e.g",)}


def fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def assert_translates(en: str, zh: str, what: str) -> None:
    """``zh`` is Chinese, keeps every name of ``en``, its {fields} and every notebook section it points to."""
    assert zh.strip() and has_cjk(zh), f"{what}: no Chinese: {zh!r}"
    assert not (missing := sorted(n for n in names(en) if n not in zh)), f"{what}: drops {missing}"
    assert fields(zh) == fields(en), what
    for notebook, section in _SECTION.findall(en):
        assert f"{notebook} 第 {section} 节" in zh, f"{what}: no reference to {notebook}, section {section}"


@pytest.fixture(autouse=True)
def english_after(monkeypatch):
    monkeypatch.delenv(LANG_ENV, raising=False)
    yield
    tl.set_language("en")


# --- every text has its Chinese -----------------------------------------------------------------------------------


def _catalogue_tool():
    """``scripts/catalogue.py`` as a module (the check CI runs)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("catalogue", ROOT / "scripts" / "catalogue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def zh_entries():
    """(msgid, msgstr) of every message of the Chinese catalogue (a plural: its singular and its one form)."""
    catalogue = _catalogue_tool()
    entries = []
    for message in catalogue.read(catalogue.catalogue_path("zh")):
        if message.id:
            en = message.id[0] if isinstance(message.id, tuple) else message.id
            zh = message.string[0] if isinstance(message.string, tuple) else message.string
            entries.append((en, zh))
    return entries


def test_every_message_the_code_marks_has_its_chinese_with_its_fields_and_the_catalogue_compiles():
    """Babel extracts every ``_()``, ``ngettext``, ``N_``, ``Nn_`` and ``Message`` of the package: each has its
    translation in the one Chinese ``.po``, with the English's fields; no entry is left that no code uses."""
    catalogue = _catalogue_tool()
    assert catalogue.check() == []
    assert [p.relative_to(ROOT).as_posix() for p in sorted((i18n.LOCALE_DIR / "zh").rglob("*.po"))] == [
        "tutorial_lib/i18n/locale/zh/LC_MESSAGES/tutorial_lib.po"], "one .po file for Chinese"
    template = catalogue.extract()
    marked = {m.id[0] if isinstance(m.id, tuple) else m.id for m in template if m.id}
    assert {c.name for c in causes.CAUSES} | {c.fix for c in causes.CAUSES} <= marked
    assert set(causes.SIGNAL_FIXES.values()) <= marked and causes.EXIT_FIX in marked
    assert len(marked) > 150, len(marked)


def test_the_check_names_a_missing_translation_a_dropped_field_and_an_unused_entry(tmp_path):
    """The controls of the test above: the same check on a copy of the catalogue changed the ways it goes wrong."""
    catalogue = _catalogue_tool()
    folder = tmp_path / "locale"
    shutil.copytree(i18n.LOCALE_DIR, folder)
    path = catalogue.catalogue_path("zh", folder)
    po = catalogue.read(path)
    po.get("killed by {signal}").string = "被信号终止"  # the field dropped
    po.get("hang (no progress)").string = ""  # untranslated
    po.add("a message no code has", "没有代码用到的消息")
    catalogue.write(path, po)
    found = catalogue.check(folder)
    if shutil.which("msgfmt"):  # gettext's own check names the dropped field too
        assert [f for f in found if "msgfmt" in f] == [f for f in found if "'signal' doesn't exist in 'msgstr'" in f]
        found = [f for f in found if "msgfmt" not in f]
    assert len(found) == 3, found
    assert any("'killed by {signal}' has the fields [], its English ['signal']" in f for f in found), found
    assert any("no translation of 'hang (no progress)'" in f for f in found), found
    assert any("'a message no code has' is in the catalogue but no code uses it" in f for f in found), found


def test_every_chinese_translation_is_chinese_and_keeps_the_names_and_sections_of_its_english():
    for en, zh in zh_entries():
        words = re.sub(r"\{[^}]*\}|rank|SLURM|sbatch|torchrun|stall_timeout_s|timeout_s|traceback", "", zh)
        assert has_cjk(zh) or not re.search(r"[a-z]{3}", words), f"English words left in the Chinese of {en!r}: {zh!r}"
        assert not (missing := sorted(n for n in names(en) if n not in zh)), f"{en!r}: the Chinese drops {missing}"
        for notebook, section in _SECTION.findall(en):
            assert f"{notebook} 第 {section} 节" in zh, f"{en!r}: no reference to {notebook}, section {section}"


def test_the_doctors_causes_and_exit_code_meanings_are_worded_in_each_language():
    cases = [(Message(N_("Python exception ({name})"), {"name": "RuntimeError"}), "Python 异常（RuntimeError）"),
             (Message(N_("killed by {signal}"), {"signal": "SIGKILL"}), "被 SIGKILL 终止"),
             (Message(N_("exited with code {code} without a traceback"), {"code": 3}), "以退出码 3 退出，没有 traceback")]
    for message, zh in cases:
        assert message.render("zh") == zh and not has_cjk(str(message))
    for code in (1, 2, 3, 126, 127, 137, 255):
        meaning = causes.exit_code_meaning(code)
        assert has_cjk(meaning.render("zh")) and str(code) in meaning.render("zh") and str(code) in str(meaning), code
    fix = Message(causes.EXIT_FIX, {"rank": 1, "code": 137, "meaning": causes.exit_code_meaning(137)})
    assert "128 + 9" in str(fix) and "SIGKILL" in fix.render("zh") and "sys.exit(137)" in fix.render("zh")
    assert "rank 1" in fix.render("zh") and not has_cjk(str(fix))


def test_ranks_take_the_plural_in_english_and_the_one_form_in_chinese():
    singular, plural = causes.FINISHED_FIX
    one, two = (Message(singular, {"rank": 1, "waiting": w}, plural, n) for w, n in (("0", 1), ("0, 2", 2)))
    assert str(one).startswith("rank 1 returned (exit code 0) while rank 0 waited")
    assert str(two).startswith("rank 1 returned (exit code 0) while ranks 0, 2 waited")
    assert two.render("zh").startswith("rank 1 已返回（退出码 0），而 rank 0, 2 还在"), two.render("zh")


def test_a_third_language_is_one_new_po_file(tmp_path):
    """A language the package does not ship: ``scripts/catalogue.py init`` writes its catalogue with every message,
    a translator fills it, and the library speaks it (here a pseudo-translation: each English text in brackets)."""
    catalogue = _catalogue_tool()
    folder = tmp_path / "locale"
    shutil.copytree(i18n.LOCALE_DIR, folder)
    path = catalogue.init("fr", folder)
    po = catalogue.read(path)
    assert catalogue.check(folder), "a new catalogue is all untranslated"
    for message in po:
        if message.id:
            message.string = (tuple(f"«{message.id[min(i, 1)]}»" for i in range(po.num_plurals))
                              if isinstance(message.id, tuple) else f"«{message.id}»")
    catalogue.write(path, po)
    assert [f.split(": the header field ")[1].split()[0] for f in catalogue.check(folder)] == [
        "PO-Revision-Date", "Last-Translator", "Language-Team"], "the translator fills the header too"
    po.revision_date, po.last_translator, po.language_team = po.creation_date, "a translator", "French"
    catalogue.write(path, po)
    assert catalogue.check(folder) == []
    shipped = i18n.languages()
    assert "zh" in shipped and "fr" not in shipped
    try:
        i18n.use_locale_dir(folder)
        assert i18n.languages() == ("en", *sorted({*shipped[1:], "fr"}))
        tl.set_language("fr")
        assert Message(N_("killed by {signal}"), {"signal": "SIGSEGV"}).render() == "«killed by SIGSEGV»"
        assert i18n._("last step") == "«last step»"
    finally:
        tl.set_language("en")
        i18n.use_locale_dir(None)
    assert i18n.languages() == shipped
    with pytest.raises(tl.ConfigError, match="'fr'"):
        tl.set_language("fr")


def test_no_zh_names_and_no_module_binds_the_gettext_function():
    """One language layer (issue 34): no ``*_zh`` identifier is left in the package, and no module that words texts
    with ``_`` also binds ``_`` as a throwaway name (a ``for _ in`` would make ``_()`` fail in that function)."""
    import ast

    for path in sorted((ROOT / "tutorial_lib").rglob("*.py")):
        tree = ast.parse(path.read_text())
        named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
            a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs} | {
            n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not sorted(n for n in named if n.endswith("_zh")), f"{path}: {[n for n in named if n.endswith('_zh')]}"
        uses_gettext = any(isinstance(n, ast.ImportFrom) and any(a.name == "_" for a in n.names) for n in ast.walk(tree))
        if uses_gettext:
            stores = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "_"
                      and isinstance(n.ctx, ast.Store)]
            assert not stores, f"{path}: binds _ at lines {stores}"


# --- the language ---------------------------------------------------------------------------------------------------


def test_the_language_is_the_variable_else_the_notebooks_folder_else_english(tmp_path):
    zh_folder = tmp_path / "notebooks" / "zh"
    assert notebook_language({}, tmp_path / "notebooks") == "en"
    assert notebook_language({}, zh_folder) == "zh"
    assert notebook_language({LANG_ENV: "en"}, zh_folder) == "en", "the variable wins"
    assert notebook_language({LANG_ENV: "zh"}, tmp_path) == "zh"
    assert notebook_language({"JPY_SESSION_NAME": str(zh_folder / "01_ddp.ipynb")}, tmp_path) == "en", \
        "a kernel's working folder decides, not a variable a child kernel inherits from its parent notebook"
    with pytest.raises(tl.ConfigError, match=r"\$TUTORIAL_LIB_LANG must be one of 'en', .*'zh'.*got 'fr'"):
        notebook_language({LANG_ENV: "fr"}, tmp_path)


def test_set_language_takes_en_or_zh_and_names_a_bad_value():
    assert tl.language() == "en", "importing changes nothing: English until something chooses"
    tl.set_language("zh")
    assert tl.language() == "zh"
    for bad in ("cn", "ZH", None, ""):
        with pytest.raises(tl.ConfigError, match=re.escape(repr(bad))):
            tl.set_language(bad)
    assert tl.language() == "zh", "a refused value changes nothing"


def test_setup_notebook_chooses_chinese_in_a_folder_named_zh(tmp_path, monkeypatch, request):
    request.addfinalizer(lambda: tl.launcher.environment.set_rank_env(None))  # the rank environment set below is process-wide
    monkeypatch.setenv("TUTORIAL_LIB_WARM", "0")  # no helper process in a unit test
    (tmp_path / "zh").mkdir()
    monkeypatch.chdir(tmp_path / "zh")
    tl.setup_notebook({})
    assert tl.language() == "zh"
    monkeypatch.chdir(tmp_path)
    tl.setup_notebook({})
    assert tl.language() == "en"
    monkeypatch.setenv(LANG_ENV, "zh")
    tl.setup_notebook({})
    assert tl.language() == "zh"
    tl.setup_notebook({"A": 1})
    monkeypatch.setenv(LANG_ENV, "klingon")
    with pytest.raises(tl.ConfigError, match="klingon"):
        tl.setup_notebook({"B": 2})
    assert (tl.language(), rank_env()) == ("zh", {"A": "1"}), "a refused language sets nothing"
    tl.launcher.environment.set_rank_env(None)  # later tests' launches and plans get no A=1 (test_slurm_plan's command.txt)


# --- the doctor's report in both languages, on every recorded failure ---------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_doctors_report_speaks_the_chosen_language(tmp_path, case):
    d = tl.diagnose(shutil.copytree(case, tmp_path / case.name))
    english = str(d)
    assert "suspected cause" in english and d.fix in english and not has_cjk(english)
    cause_zh, fix_zh = d.cause_text.render("zh"), d.fix_text.render("zh")
    assert has_cjk(cause_zh) and has_cjk(fix_zh), d.cause
    tl.set_language("zh")
    chinese, table = str(d), d._repr_html_()
    again = tl.diagnose(tmp_path / case.name)
    assert (again.cause, again.fix) == (d.cause, d.fix), "the fields stay English: programs and asserts read them"
    assert re.search(f"^疑似原因 +{re.escape(cause_zh)}(：|$)", chinese, re.M), chinese
    assert re.search(f"^修复建议 +{re.escape(fix_zh)}$", chinese, re.M), chinese
    assert html.escape(fix_zh) in table and "suspected cause" not in chinese and "fix " not in chinese
    assert d.error[:100] in chinese, "the logged error line is shown as it was printed"
    assert re.search(r"见 [01]\d 第 \d+[a-z]? 节", fix_zh), "the fix points to a notebook section"
    assert [label for label, _ in d.rows()] != [label for label, _ in (tl.set_language("en") or d.rows())]
    assert str(d) == english


def test_a_finished_run_and_the_columns_of_a_chinese_report(tmp_path):
    run_dir = tmp_path / "ok"
    run_dir.mkdir()
    (run_dir / "output.log").write_text("[rank0]:step 1\n")
    tl.set_language("zh")
    d = tl.diagnose(run_dir)
    assert d.cause_id == CauseId.NONE and str(d).splitlines()[0] == "运行      ok 运行结束，没有错误", str(d)
    lines = str(tl.diagnose(shutil.copytree(CASES[0], tmp_path / "case"))).splitlines()
    columns = set()
    for line in lines:
        label = re.match(r"\S+(?: \S+)*? {2,}", line)[0]  # the label and the spaces after it
        columns.add(sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in label))
    assert len(columns) == 1, f"the texts start in one column (a Chinese character is two wide): {lines}"


# --- the live view and the launcher's summary -------------------------------------------------------------------------


def _failed_outcome(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    plan = plan_launch(LaunchSpec(script, device="cpu", nproc_per_node=2))  # before the launch's files, as in a launch
    log = io.StringIO()
    pump = OutputPump(1, tmp_path, [0], ThrottledPrinter(io.StringIO()), log)
    for line in (FIXTURES / "torchrun_failure_summary.txt").read_text().splitlines():
        pump.take(0, line)
    error_dir = tmp_path / "logs" / "none_abc" / "attempt_0" / "1"
    error_dir.mkdir(parents=True)
    (error_dir / "error.json").write_text((FIXTURES / "error.json").read_text())
    return failure_error(plan, pump, {0: 1}, 2.5, command=["torchrun"])


def test_the_status_line_and_the_failure_box_speak_the_chosen_language(tmp_path):
    error, record, outcome = _failed_outcome(tmp_path)
    assert error.summary.startswith("t.py failed on rank 1 (exit code 1)") and record.summary == error.summary
    assert error.headline.render("zh") == "t.py 在 rank 1 上失败（退出码 1）" and outcome.cause is error.headline
    boxes = []

    class Box(NotebookView):  # the failure box's words, without a kernel
        def _draw_alert(self, title, details):
            boxes.append((title, details))

    for lang in ("en", "zh"):
        tl.set_language(lang)
        Box(run_dir=tmp_path).fail(error)
    (en_title, en_details), (zh_title, zh_details) = boxes
    assert en_title == error.summary and "exited with code 1" in en_details[1]
    assert zh_title == error.headline.render("zh") and zh_details[0] == "原因：ValueError: boom on rank 1", zh_details
    assert zh_details[1:] == ["rank 1 以退出码 1 退出；其他 rank 已被停止", "最后报告的步：无"]
    assert outcome.text == "失败：t.py 在 rank 1 上失败（退出码 1）" and str(error) == str(error)
    assert "Root-cause traceback (rank 1)" in str(error), "the raised error's text stays English"
    assert Outcome(RunStatus.FINISHED, 4.25).text == "运行结束，用时 4.2 s"
    assert Outcome(RunStatus.TIMEOUT, 9.0, "timed out after 8 s").text == "失败：timed out after 8 s", \
        "a plain string is shown as it is"
    out = io.StringIO()
    view = TerminalView()
    monkey_stdout = pytest.MonkeyPatch()
    monkey_stdout.setattr("sys.stdout", out)
    try:
        view.finish([], outcome)
    finally:
        monkey_stdout.undo()
    assert out.getvalue() == "[launcher] 失败：t.py 在 rank 1 上失败（退出码 1）\n"
    tl.set_language("en")
    assert outcome.text == "failed: t.py failed on rank 1 (exit code 1)"


def test_every_reason_a_slurm_job_cannot_start_has_its_chinese():
    from tutorial_lib.slurm.target import CANNOT_START

    for reason, en in CANNOT_START.items():
        zh = Message(en).render("zh")
        assert has_cjk(zh) and names(en) <= names(zh), reason


DISPLAY_FIELDS = {"summary", "cause", "headline", "fix", "text"}  # attributes that hold (or word) display text
PARSING_METHODS = {"split", "rsplit", "removeprefix", "removesuffix", "replace", "partition", "startswith", "endswith"}


def display_text_uses(source: str, msgids: set[str]) -> list[str]:
    """Where ``source`` compares or parses display text: a comparison with a catalogue message (or a collection of
    them) or with a display field (``x.summary``, ``x.cause``, ...), and a string method that cuts a display field
    (``error.summary.split(";")``). Each as ``"line N: ..."``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                if any(isinstance(i, ast.Constant) and i.value in msgids for i in items):
                    found.append(f"line {node.lineno}: compares a message's text")
                if isinstance(operand, ast.Attribute) and operand.attr in DISPLAY_FIELDS:
                    found.append(f"line {node.lineno}: compares .{operand.attr}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PARSING_METHODS
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in DISPLAY_FIELDS):
            found.append(f"line {node.lineno}: .{node.func.value.attr}.{node.func.attr}(...) parses display text")
    return found


def test_no_display_text_is_compared_or_parsed_anywhere_in_the_library():
    """Issue 34: a failure is one typed value (``causes.CauseId``, ``Diagnosis`` and ``RankFailure`` fields) worded only
    when shown; code compares ids and fields, never the words (which change with the language and the catalogue)."""
    msgids = {en for en, _zh in zh_entries() if " " in en}  # one word ("run", "error") also names other things
    found = {}
    for path in sorted((ROOT / "tutorial_lib").rglob("*.py")):
        if "lessons" in path.parts:
            continue
        uses = display_text_uses(path.read_text(), msgids)
        if uses:
            found[str(path.relative_to(ROOT))] = uses
    assert found == {}


def test_the_display_text_check_finds_what_it_looks_for():
    """The control of the test above: each kind of use it forbids, in a few lines of code, is found."""
    source = ('if d.cause == "out of memory": pass\n'
              'if cause.name in ("port in use", "rendezvous timeout"): pass\n'
              'if error.summary != other: pass\n'
              'first = summary_zh = error.summary.split(";")[0]\n'
              'if cause.id == CauseId.OUT_OF_MEMORY: pass\n')
    found = display_text_uses(source, {"out of memory", "port in use", "rendezvous timeout"})
    assert sorted(found) == ["line 1: compares .cause", "line 1: compares a message's text",
                             "line 2: compares a message's text", "line 3: compares .summary",
                             "line 4: .summary.split(...) parses display text"], found


# --- issue 45: the review's catalogue problems ----------------------------------------------------------------------


def _observed_12_3(backward_all_reduces: int):
    """A 2-rank run of 12.3's block as the observer records it: 2 all-reduces outside backward(), then
    ``backward_all_reduces`` inside it."""
    from pathlib import Path

    from tutorial_lib.runs.observed import Collective, ObservedRank, ObservedRun

    calls = [("all_reduce", None)] * 2 + [("all_reduce", 1)] * backward_all_reduces
    ranks = {}
    for rank in (0, 1):
        ranks[rank] = ObservedRank(rank, 2, 0, process_group={"world_size": 2})
        ranks[rank].collectives = [Collective(n, kind, kind, f"c10d::{kind}_", "0", 2, n, 4, 4, "float32", (), None, 1,
                                              backward) for n, (kind, backward) in enumerate(calls, 1)]
    return ObservedRun(Path("."), ranks)


def test_a_chinese_verdict_of_12_3_names_the_rank_first_and_has_no_english_phase_in_it():
    """Items 2 and 3: the verdict's "{what} on rank {rank}" line is "rank R：{what}，应为 ……" in Chinese (no 的 glued to
    the what), and the phase a note names is 前向/反向 (a message), never the counts' key "forward"/"backward"."""
    from tutorial_lib.exercises.core import load_all
    from tutorial_lib.exercises.observing import Variant
    from tutorial_lib.exercises.properties import PhaseCounts
    from tutorial_lib.exercises.verdict import Verdict

    counts = next(p for p in load_all()["12.3"].verify.properties if isinstance(p, PhaseCounts))
    found = counts.check(_observed_12_3(4), _observed_12_3(2), Variant(7, ("--seed", "7"), 2))
    assert [d.rank for d in found] == [0, 1] and found[0].note is not None
    assert found[0].note.fields["phase"].render("zh") == "反向" and str(found[0].note.fields["phase"]) == "backward"
    assert Message(PhaseCounts.PHASE_NAMES["forward"]).render("zh") == "前向"
    verdict = Verdict("12.3", solved=False, differences=found)
    tl.set_language("zh")
    lines = [line.strip() for line in verdict.lines()[1:1 + 2 * len(found)]]  # each difference and its note
    assert lines[0].startswith("rank 0：backward() 之内的集合通信，应为 {'all_reduce': 2"), lines
    text = "\n".join(lines)
    assert not re.search(r"(?<![\w.])(forward|backward)(?!\(\))", text), text  # backward() is code: it stays
    assert "上的" not in text and has_cjk(lines[1]), lines
    tl.set_language("en")
    assert verdict.lines()[1].strip().startswith("collectives inside backward() on rank 0: expected")


def test_07_1s_last_hint_quotes_the_row_the_doctor_prints_in_each_language():
    """Item 4: the hint names the doctor's "rank R was in" row as that language's doctor prints it (report.py's
    label), with the frame verbatim."""
    from tutorial_lib.exercises.core import load_all

    hint = Message(next(h for h in load_all()["07.1"].hints if "train.py:L in <module>" in h))
    label = Message(N_("rank {rank} was in"), {"rank": "R"})
    for lang in ("en", "zh"):
        assert label.render(lang) in hint.render(lang) and "train.py:L in <module>" in hint.render(lang), lang
    assert label.render("zh") == "rank R 当时位于", "the control: the doctor's Chinese row"


def test_the_sigkill_fix_gives_the_container_caveat_in_each_language():
    """Item 16: in a container dmesg is often unreadable and the OOM kill is the cgroup's."""
    fix = Message(causes.SIGNAL_FIXES["SIGKILL"])
    assert "container" in str(fix) and "cgroup" in str(fix) and "'Out of memory: Killed process'" in str(fix)
    zh = fix.render("zh")
    assert "容器" in zh and "cgroup" in zh and "宿主机" in zh and "'Out of memory: Killed process'" in zh, zh
    hint = Message(causes.P2P_HINT)
    assert "NCCL error" in str(hint) and "NCCL 错误" in hint.render("zh") and "卡住（hang）" in hint.render("zh")


def test_the_chinese_messages_say_损失_for_loss_and_keep_the_code_names():
    """Item 9: the lessons' prose says 损失; a msgstr says it too, and code (``scaler.scale(loss)``, ``loss_global``)
    stays verbatim."""
    prose = re.compile(r"(?<![\w.(])loss(?![\w)])", re.I)
    english_words = [(en, zh) for en, zh in zh_entries() if zh and prose.search(zh)]
    assert not english_words, english_words
    assert sum("损失" in zh for _, zh in zh_entries()) >= 30
    worded = dict(zh_entries())
    assert any("scaler.scale(loss)" in zh for zh in worded.values()), "code keeps its names"
    assert prose.search("每一步的 loss 缩放倍数") and not prose.search("scaler.scale(loss).backward() loss_global")


def _po_entries(text: str) -> list[tuple[str, str]]:
    """(flags line, msgid) of every entry of a .po file's text (the msgid's lines joined)."""
    out = []
    for block in text.split("\n\n"):
        flags = next((line for line in block.splitlines() if line.startswith("#,")), "")
        msgid = "".join(eval(s) for s in re.findall(r'^(?:msgid |)("(?:[^"\\]|\\.)*")$', block.split("msgstr")[0],
                                                     re.M))  # noqa: S307 - the .po's own string literals
        out.append((flags, msgid))
    return out


def test_the_catalogue_header_is_filled_in_and_no_message_is_flagged_a_percent_format():
    """Item 18: the header names the translators and the date of the last translation, and a msgid whose ``%`` is
    not a directive (``sinfo -o '%N %c %m %G'``, ``%%writefile``) is flagged ``no-python-format``: the library fills
    fields with ``str.format``, and msgfmt --check-format would read ``%c`` as a directive."""
    catalogue = _catalogue_tool()
    text = catalogue.catalogue_path("zh").read_text(encoding="utf-8")
    header = text.split("\n\n")[0]
    for placeholder in ("YEAR-MO-DA", "FULL NAME", "FIRST AUTHOR", "EMAIL@ADDRESS", "LL@li.org"):
        assert placeholder not in header, placeholder
    assert re.search(r'^"PO-Revision-Date: \d{4}-\d\d-\d\d \d\d:\d\d[+-]\d{4}\\n"$', header, re.M), header
    assert '"Last-Translator: distributed-workbook maintainers\\n"' in header
    percent = [(flags, msgid) for flags, msgid in _po_entries(text) if "%" in msgid]
    assert len(percent) >= 8 and any("%c" in m for _, m in percent) and any("%%writefile" in m for _, m in percent)
    for flags, msgid in percent:
        assert "no-python-format" in flags and not re.search(r"(?<!no-)python-format", flags), (flags, msgid)


def test_a_write_flags_no_python_format_and_the_check_names_an_unfilled_header(tmp_path):
    """The controls of the test above: Babel flags python-format on a ``%c`` message (read or extracted), the
    script's write turns it into no-python-format; a new catalogue's header placeholders are named by the check, and
    (where gettext is installed) msgfmt --check-format refuses a python-format flag on such a message."""
    from babel.messages.catalog import Catalog

    catalogue = _catalogue_tool()
    catalog = Catalog(locale="zh", domain="tutorial_lib")
    catalog.add("sinfo -N -o '%N %c %m %G' lists what each node has", "sinfo -N -o '%N %c %m %G' 列出各节点的资源")
    catalog.add("within {percent:g}% of the baseline's {base}", "与基线的 {base} 相差不超过 {percent:g}%")
    assert all("python-format" in m.flags for m in catalog if m.id), "Babel's flag: '% o' reads as a directive"
    path = tmp_path / "zh" / "LC_MESSAGES" / "tutorial_lib.po"
    catalogue.write(path, catalog)
    flags = [f for f, m in _po_entries(path.read_text(encoding="utf-8")) if "%" in m]
    assert flags == ["#, no-python-format", "#, no-python-format, python-brace-format"], flags
    found = catalogue.header_problems(path, "zh")
    assert len(found) == 3 and any("PO-Revision-Date" in f for f in found), found
    if shutil.which("msgfmt"):
        assert catalogue.msgfmt_problems(path, "zh") == []
        path.write_text(path.read_text(encoding="utf-8").replace("#, no-python-format", "#, python-format"),
                        encoding="utf-8")
        assert any("msgfmt --check-format" in f for f in catalogue.msgfmt_problems(path, "zh"))


def test_the_chinese_messages_say_阶段_and_气泡_for_a_pipelines_stages_and_its_bubble():
    """Items 7 and 8: one word each, notebook 12's (阶段 0, 阶段 s; 气泡), never stage and 阶段 mixed or 空泡."""
    staged = [(en, zh) for en, zh in zh_entries() if re.search(r"\bstages?\b", en)]
    assert len(staged) >= 8, staged
    for en, zh in staged:
        assert "阶段" in zh and not re.search(r"(?<![\w.])stages?(?![\w(])", zh), (en, zh)
    assert not [zh for _, zh in zh_entries() if "空泡" in zh]
    assert "气泡" in dict(zh_entries())["Micro-batches for a bubble of at most 1/5 on 4 stages"]
