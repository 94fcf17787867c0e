"""The language of what a learner reads from the library in a cell: English, or Chinese for the Chinese edition.

Three texts follow the language: the doctor's report (``tl.diagnose``: its labels, the suspected cause and the fix;
the Chinese of every known cause is in ``tutorial_lib.causes_zh``), the live view's status line and failure box
(``tutorial_lib.launcher.live``), and the launcher's one-line failure summary shown there. Everything else stays
English: exceptions' messages, ``LaunchError.summary`` and ``Diagnosis.cause``/``fix`` (programs and the notebooks'
asserts read them; their Chinese is beside them, ``LaunchError.summary_zh``, ``Diagnosis.cause_zh``/``fix_zh``),
log lines, tables and figures.

The Chinese notebooks (``notebooks/zh/``) have the English notebooks' code cells, so they cannot ask for Chinese in a
cell of their own. The language is chosen when ``tl.setup_notebook`` runs (every notebook's setup cell calls it;
``notebook_language``): ``$TUTORIAL_LIB_LANG`` if set, else ``"zh"`` when the kernel runs in a folder named ``zh``
(JupyterLab, nbval and ``scripts/run_workbook.py --notebooks-dir notebooks/zh`` start the kernel in the notebook's
folder), else ``"en"``. ``tl.set_language`` overrides it at any time. Importing the package changes nothing: until
one of them runs, ``language()`` is ``$TUTORIAL_LIB_LANG`` or ``"en"``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from .errors import ConfigError

LANGUAGES = ("en", "zh")
LANG_ENV = "TUTORIAL_LIB_LANG"
EDITION_FOLDER = "zh"  # notebooks/zh/: the Chinese edition's notebooks (scripts/twins.py)

_chosen: list[str] = []  # the language set by set_language or setup_notebook; empty until then


def check_language(lang: object, source: str = "language") -> str:
    """``lang`` if it is one of ``LANGUAGES``, else a ``ConfigError`` naming it (``source``: where it came from)."""
    if lang not in LANGUAGES:
        raise ConfigError(f"{source} must be 'en' (English) or 'zh' (Chinese), got {lang!r}")
    return lang


def set_language(lang: str) -> None:
    """Choose the language of the doctor's report, the live view's status line and failure box, and the launcher's
    failure summary shown there; every other text stays English.

    Args:
        lang: ``"en"`` (English) or ``"zh"`` (简体中文).

    Raises:
        ConfigError: any other value.
    """
    check_language(lang)
    _chosen[:] = [lang]


def language() -> str:
    """The language in use: the one ``set_language`` or ``setup_notebook`` chose, else ``$TUTORIAL_LIB_LANG``, else
    ``"en"``.

    Raises:
        ConfigError: ``$TUTORIAL_LIB_LANG`` holds a value other than ``"en"`` or ``"zh"`` (and none was chosen).
    """
    if _chosen:
        return _chosen[0]
    value = os.environ.get(LANG_ENV)
    return check_language(value, f"${LANG_ENV}") if value else "en"


def notebook_language(environ: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None) -> str:
    """The language a notebook's setup call chooses: ``$TUTORIAL_LIB_LANG`` if set, else ``"zh"`` when the kernel's
    working folder is named ``zh`` (the Chinese edition's ``notebooks/zh/``), else ``"en"``.

    The working folder is the signal because every way the workbook runs a notebook starts its kernel there:
    JupyterLab (jupyter_server starts a notebook's kernel in the notebook's folder; it also sets
    ``$JPY_SESSION_NAME`` to the notebook's path, but a kernel started from inside a notebook, e.g. papermill's,
    inherits that variable from its parent, so it is not used), nbval (the notebook's folder), and
    ``scripts/run_workbook.py`` (papermill with ``cwd`` = ``--notebooks-dir``). Plain ``papermill`` from a shell runs
    the kernel in the shell's folder: set ``TUTORIAL_LIB_LANG=zh`` there (or pass ``--cwd notebooks/zh``).

    Args:
        environ: the environment to read (default ``os.environ``).
        cwd: the kernel's working folder (default ``os.getcwd()``).

    Raises:
        ConfigError: ``$TUTORIAL_LIB_LANG`` is set to a value other than ``"en"`` or ``"zh"``.
    """
    environ = os.environ if environ is None else environ
    if environ.get(LANG_ENV):
        return check_language(environ[LANG_ENV], f"${LANG_ENV}")
    return "zh" if Path(os.getcwd() if cwd is None else cwd).name == EDITION_FOLDER else "en"


def pick(en: str, zh: str) -> str:
    """``zh`` when the language in use is Chinese and ``zh`` is not empty, else ``en``."""
    return zh if zh and language() == "zh" else en


def say(key: str, **fields: object) -> str:
    """The message ``key`` of ``MESSAGES`` in the language in use, formatted with ``fields``."""
    en, zh = MESSAGES[key]
    return pick(en, zh).format(**fields)


def has_cjk(text: str) -> bool:
    """Whether ``text`` holds a CJK ideograph (U+4E00..U+9FFF)."""
    return re.search(r"[\u4e00-\u9fff]", text) is not None


# key -> (English, Chinese): the words of the doctor's report and of the live view. Both take the same fields.
MESSAGES: dict[str, tuple[str, str]] = {
    "sep": (", ", "，"),  # between the items of a list of phrases
    # the doctor's labels (Diagnosis.rows)
    "label.run": ("run", "运行"),
    "label.last step": ("last step", "最后一步"),
    "label.recovered": ("recovered", "已恢复"),
    "label.failed": ("failed", "失败"),
    "label.error": ("error", "错误"),
    "label.raised": ("raised", "各自报错"),
    "label.also killed": ("also killed", "也被终止"),
    "label.finished": ("finished", "已结束"),
    "label.stack": ("stack", "调用栈"),
    "label.was in": ("rank {rank} was in", "rank {rank} 当时位于"),
    "label.suspected cause": ("suspected cause", "疑似原因"),
    "label.fix": ("fix", "修复建议"),
    "label.stopped": ("stopped", "已停止"),
    "label.sbatch said": ("sbatch said", "sbatch 的输出"),
    "label.output": ("output.log", "输出（output.log）"),
    # the doctor's texts
    "doctor.finished": ("{run} finished without error", "{run} 运行结束，没有错误"),
    "doctor.refused": ("{run}: sbatch refused the job, so no SLURM job ran", "{run}：sbatch 拒绝了这个作业，因此没有任何 SLURM 作业运行"),
    "doctor.refused output": ("empty: no step ran (the job was never submitted)", "为空：没有任何一步运行过（作业从未提交成功）"),
    "doctor.none": ("none", "无"),
    "doctor.rank": ("rank {rank}", "rank {rank}"),
    "doctor.no rank": ("no rank (torchrun or the launch itself)", "没有 rank（是 torchrun 或启动本身）"),
    "doctor.exit code": (", exit code {code}", "，退出码 {code}"),
    "doctor.recovered": ("{run} finished after torchrun restarted the group",
                         "{run} 在 torchrun 重启整组 worker 进程后运行结束"),
    "doctor.before restart": ("before the restart: {who} first{code}", "重启之前：{who} 最先失败{code}"),
    "doctor.stall limit": ("no-progress limit, stall_timeout_s", "无进展限制 stall_timeout_s"),
    "doctor.wall limit": ("wall-clock limit", "墙钟时间限制"),
    "doctor.stopped": ("{run}: stopped at the {which} ({timeout_s} s), no rank had failed",
                       "{run}：达到{which}（{timeout_s} s）时被停止，没有 rank 失败"),
    "doctor.returned": ("{run}: {who} returned (exit code 0) while the others waited for it",
                        "{run}：{who} 已返回（退出码 0），其他 rank 仍在等待它"),
    "doctor.interrupted": ("{run} was interrupted ({evidence}); no rank had failed",
                           "{run} 被中断（{evidence}）；没有 rank 失败"),
    "doctor.stopped by": ("{run} was stopped by the process that launched it ({evidence}); no rank had failed",
                          "{run} 被启动它的进程停止（{evidence}）；没有 rank 失败"),
    "doctor.first": ("{run}: {who} first{code}", "{run}：{who} 最先失败{code}"),
    "doctor.raised": ("ranks {ranks} each raised an error of their own", "rank {ranks} 各自抛出了自己的错误"),
    "doctor.killed by": ("rank {rank} by {signal}", "rank {rank} 被 {signal} 终止"),
    "doctor.returned ranks": ("rank(s) {ranks} returned (exit code 0)", "rank {ranks} 已返回（退出码 0）"),
    "doctor.step": ("rank {rank}: {step}", "rank {rank}：{step}"),
    "doctor.no step": ("no rank logged a step", "没有 rank 记录过任何一步"),
    "doctor.evidence": (": {evidence}", "：{evidence}"),
    "doctor.never reached": (": never reached the collective the others waited in",
                             "：从未到达其他 rank 正在等待的集合通信（collective）"),
    # the live view (tutorial_lib.launcher.live)
    "live.finished": ("finished in {elapsed_s:.1f} s", "运行结束，用时 {elapsed_s:.1f} s"),
    "live.failed": ("failed: {cause}", "失败：{cause}"),
    "live.running": ("running", "运行中"),
    "live.elapsed": ("elapsed {elapsed_s:.1f} s", "已用时 {elapsed_s:.1f} s"),
    "live.no step yet": ("running, no step reported yet ({elapsed_s:.0f} s)",
                         "运行中，尚无 rank 报告任何一步（{elapsed_s:.0f} s）"),
    "live.queued": ("pending in the queue", "排队中"),
    "live.pending": ("pending: SLURM job {job_id} waits in the queue ({reason}), no rank started yet ({elapsed_s:.0f} s)",
                     "排队中：SLURM 作业 {job_id} 在队列中等待（{reason}），尚无 rank 启动（{elapsed_s:.0f} s）"),
    "live.pending, no reason": ("pending: SLURM job {job_id} waits in the queue, no rank started yet "
                                "({elapsed_s:.0f} s)", "排队中：SLURM 作业 {job_id} 在队列中等待，尚无 rank 启动"
                                "（{elapsed_s:.0f} s）"),
    "live.cause": ("cause: {cause}", "原因：{cause}"),
    "live.rank exited": ("rank {rank} exited with code {code}; the other ranks were stopped",
                         "rank {rank} 以退出码 {code} 退出；其他 rank 已被停止"),
    "live.last steps": ("last step reported: {steps}", "最后报告的步：{steps}"),
    "live.rank at step": ("rank {rank} at step {step}", "rank {rank} 在第 {step} 步"),
    "live.none": ("none", "无"),
    "live.interrupted": ("the kernel was interrupted: torchrun and every worker were stopped",
                         "Jupyter 内核被中断：torchrun 和所有 worker 进程都已停止"),
    "live.stalled": ("no rank logged a new step for stall_timeout_s={timeout_s} s: the job was stopped",
                     "在 stall_timeout_s={timeout_s} s 内没有 rank 记录新的一步：任务已被停止"),
    "live.timed out": ("the job ran past timeout_s={timeout_s} s and was stopped",
                       "任务运行超过 timeout_s={timeout_s} s，已被停止"),
    "live.rank was in": ("rank {rank} was in {place}", "rank {rank} 当时位于 {place}"),
    "live.full logs": ("full logs in {run_dir}: output.log (every line), logs/ (per rank), command.txt (the command "
                       "to rerun it)", "完整日志在 {run_dir}：output.log（每一行）、logs/（每个 rank 一份）、"
                       "command.txt（重新运行的命令）"),
}
