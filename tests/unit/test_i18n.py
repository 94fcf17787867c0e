"""The Chinese edition's library texts (issue 31): every cause and fix of the doctor has a Chinese text that keeps the
English's names and notebook references, the doctor's report and the live view speak the chosen language, and the
language is chosen as a Chinese notebook needs (its code cells are the English ones: it cannot ask for it itself)."""

from __future__ import annotations

import html
import io
import re
import shutil
import string
import unicodedata

import pytest

import tutorial_lib as tl
from conftest import FIXTURES
from tutorial_lib import LaunchSpec, causes
from tutorial_lib.causes_zh import (CAUSES_ZH, FIXES_ZH, SIGNAL_FIXES_ZH, cause_name_zh, exit_code_meaning_zh,
                                    fix_texts)
from tutorial_lib.i18n import LANG_ENV, MESSAGES, has_cjk, notebook_language
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


def test_every_cause_has_a_chinese_name_and_fix_that_keep_its_names_and_references():
    assert [c.name for c in causes.CAUSES] == list(CAUSES_ZH), "a cause without Chinese (add it to causes_zh.py)"
    for cause in causes.CAUSES:
        name_zh, fix_zh = CAUSES_ZH[cause.name]
        assert has_cjk(name_zh), cause.name
        assert_translates(cause.fix, fix_zh, cause.name)


def test_every_fix_template_and_signal_fix_has_its_chinese():
    templates = sorted(n for n in dir(causes) if n.endswith(("_FIX", "_HINT")) and isinstance(getattr(causes, n), str))
    assert templates == sorted(FIXES_ZH), "a fix in causes.py without Chinese (add it to causes_zh.FIXES_ZH)"
    for name in templates:
        assert_translates(getattr(causes, name), FIXES_ZH[name], name)
    assert list(causes.SIGNAL_FIXES) == list(SIGNAL_FIXES_ZH)
    for signal, fix in causes.SIGNAL_FIXES.items():
        assert_translates(fix, SIGNAL_FIXES_ZH[signal], signal)


def test_the_doctors_fallback_causes_and_exit_code_meanings_have_their_chinese():
    fallbacks = {"Python exception (RuntimeError)": "Python 异常（RuntimeError）", "killed by SIGKILL": "被 SIGKILL 终止",
                 "exited with code 3 without a traceback": "以退出码 3 退出，没有 traceback"}
    for en, zh in fallbacks.items():
        assert cause_name_zh(en) == zh
    for en in ("died without a Python error", "hang (wall-clock timeout)", "hang (no progress)", causes.FINISHED_CAUSE,
               causes.INTERRUPTED_CAUSE, causes.STOPPED_CAUSE, causes.SYNTAX_CAUSE, "unknown", "none",
               *(c.name for c in causes.CAUSES)):
        assert has_cjk(cause_name_zh(en)), en
    assert cause_name_zh("a cause nobody wrote") == ""
    for code in (1, 2, 3, 126, 127, 137, 255):
        zh = exit_code_meaning_zh(code)
        assert has_cjk(zh) and str(code) in zh and names(causes.exit_code_meaning(code)) <= names(zh) | {"message"}, code
    en, zh = fix_texts("EXIT_FIX", rank=1, code=137)
    assert "128 + 9" in en and "SIGKILL" in zh and "sys.exit(137)" in zh and "rank 1" in zh


def test_every_message_has_both_languages_with_the_same_fields():
    for key, (en, zh) in MESSAGES.items():
        assert en and zh and fields(en) == fields(zh), key
        words = re.sub(r"\{[^}]*\}|rank", "", zh)  # "rank" is the Chinese texts' word too
        assert has_cjk(zh) or not re.search(r"[a-z]{3}", words), f"{key}: English words left: {zh!r}"
        assert names(en) <= names(zh), key


# --- the language ---------------------------------------------------------------------------------------------------


def test_the_language_is_the_variable_else_the_notebooks_folder_else_english(tmp_path):
    zh_folder = tmp_path / "notebooks" / "zh"
    assert notebook_language({}, tmp_path / "notebooks") == "en"
    assert notebook_language({}, zh_folder) == "zh"
    assert notebook_language({LANG_ENV: "en"}, zh_folder) == "en", "the variable wins"
    assert notebook_language({LANG_ENV: "zh"}, tmp_path) == "zh"
    assert notebook_language({"JPY_SESSION_NAME": str(zh_folder / "01_ddp.ipynb")}, tmp_path) == "en", \
        "a kernel's working folder decides, not a variable a child kernel inherits from its parent notebook"
    with pytest.raises(tl.ConfigError, match=r"\$TUTORIAL_LIB_LANG must be 'en' \(English\) or 'zh'.*'fr'"):
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
    request.addfinalizer(lambda: tl.set_rank_env(None))  # the rank environment set below is process-wide
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
    tl.set_rank_env(None)  # later tests' launches and plans get no A=1 (test_slurm_plan's command.txt)


# --- the doctor's report in both languages, on every recorded failure ---------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_doctors_report_speaks_the_chosen_language(tmp_path, case):
    d = tl.diagnose(shutil.copytree(case, tmp_path / case.name))
    english = str(d)
    assert "suspected cause" in english and d.fix in english and not has_cjk(english)
    assert has_cjk(d.cause_zh) and has_cjk(d.fix_zh), d.cause
    tl.set_language("zh")
    chinese, table = str(d), d._repr_html_()
    again = tl.diagnose(tmp_path / case.name)
    assert (again.cause, again.fix) == (d.cause, d.fix), "the fields stay English: programs and asserts read them"
    assert re.search(f"^疑似原因 +{re.escape(d.cause_zh)}(：|$)", chinese, re.M), chinese
    assert re.search(f"^修复建议 +{re.escape(d.fix_zh)}$", chinese, re.M), chinese
    assert html.escape(d.fix_zh) in table and "suspected cause" not in chinese and "fix " not in chinese
    assert d.error[:100] in chinese, "the logged error line is shown as it was printed"
    assert re.search(r"见 0\d 第 \d+[a-z]? 节", d.fix_zh), "the fix points to a notebook section"
    assert [label for label, _ in d.rows()] != [label for label, _ in (tl.set_language("en") or d.rows())]
    assert str(d) == english


def test_a_finished_run_and_the_columns_of_a_chinese_report(tmp_path):
    run_dir = tmp_path / "ok"
    run_dir.mkdir()
    (run_dir / "output.log").write_text("[rank0]:step 1\n")
    tl.set_language("zh")
    d = tl.diagnose(run_dir)
    assert d.cause == "none" and str(d).splitlines()[0] == "运行      ok 运行结束，没有错误", str(d)
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
    assert error.summary_zh == "t.py 在 rank 1 上失败（退出码 1）" and outcome.cause_zh == error.summary_zh
    boxes = []

    class Box(NotebookView):  # the failure box's words, without a kernel
        def _draw_alert(self, title, details):
            boxes.append((title, details))

    for lang in ("en", "zh"):
        tl.set_language(lang)
        Box(run_dir=tmp_path).fail(error)
    (en_title, en_details), (zh_title, zh_details) = boxes
    assert en_title == error.summary and "exited with code 1" in en_details[1]
    assert zh_title == error.summary_zh and zh_details[0] == "原因：ValueError: boom on rank 1", zh_details
    assert zh_details[1:] == ["rank 1 以退出码 1 退出；其他 rank 已被停止", "最后报告的步：无"]
    assert outcome.text == "失败：t.py 在 rank 1 上失败（退出码 1）" and str(error) == str(error)
    assert "Root-cause traceback (rank 1)" in str(error), "the raised error's text stays English"
    assert Outcome(RunStatus.FINISHED, 4.25).text == "运行结束，用时 4.2 s"
    assert Outcome(RunStatus.TIMEOUT, 9.0, "timed out after 8 s").text == "失败：timed out after 8 s", \
        "an outcome without Chinese shows its English"
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
    from tutorial_lib.launcher.slurm_outcome import CANNOT_START_ZH
    from tutorial_lib.slurm.target import CANNOT_START

    assert CANNOT_START_ZH.keys() == CANNOT_START.keys()
    for reason, en in CANNOT_START.items():
        assert has_cjk(CANNOT_START_ZH[reason]) and names(en) <= names(CANNOT_START_ZH[reason]), reason
