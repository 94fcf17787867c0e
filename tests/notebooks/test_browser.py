"""What a person sees in JupyterLab, checked in a real browser (Debian's chromium, driven by playwright).

The first test, end to end: JupyterLab on loopback with a token and its own config/data/runtime/settings/workspace
folders; ``01_ddp.ipynb`` (a copy, with a failing run and a long run appended) opened in headless chromium;
Run All; the live widget reaches the last step on every rank, the plot renders, no cell shows an error; the
failing run's red box names the rank, the cause and the logs; then the long run is interrupted from the
notebook toolbar, the cell says so, and no worker or torchrun process remains. The second: the Chinese edition's
``zh/00_environment_check.ipynb`` (issue 31) runs to the end the same way, its Chinese title on the page drawn with
real CJK glyphs (a CJK font installed on the system: Debian's ``fonts-wqy-microhei``, which ``.ci/run`` installs).
Then a learner solves exercise 01.1 with the keyboard (issue 36) and 04.4's predict-then-run exercise
(issue 44: the prediction worked out from the inputs the page shows, typed, recorded, checked), and JupyterLab started
by ``make lab EDITION=zh`` shows its own menus in Chinese, ``make lab`` in English (issue 38).

Screenshots and the server log go to ``<tmp_path>/artifacts`` and, when ``$TUTORIAL_LIB_ARTIFACTS_DIR`` is
set, are copied there. The tests skip only where chromium (``apt-get install -y chromium``) or the
``playwright`` package (the ``test`` extra) is missing; it never downloads a browser. The ``make lab`` test fails
where JupyterLab's zh_CN language pack is missing (the ``test`` extra has it, so ``make install`` in ``.ci/run`` does).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from conftest import job_processes
from tutorial_lib.child.protocol import set_parent_death_signal
from tutorial_lib.probes.ports import free_port  # below the ephemeral range: the Jupyter server binds it a moment later

pytestmark = [pytest.mark.browser, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("TUTORIAL_LIB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
LONG_RUN_LABEL = "long-run"
# JupyterLab settings: keep every cell in the DOM (no windowing) and fetch no news.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}


def sync_playwright_or_skip():
    if not CHROMIUM.is_file():
        pytest.skip(f"no chromium at {CHROMIUM}: install it with `apt-get install -y chromium` (.ci/run does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        pytest.skip(f"the playwright package is not importable ({e}): pip install -e '.[test]'")
    return sync_playwright


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback only
        return json.loads(r.read())


class Lab:
    """A JupyterLab server on 127.0.0.1 whose state lives under ``base``; stopped with ``close()``."""

    def __init__(self, base: Path, notebook_dir: Path, runs_dir: Path, log_path: Path) -> None:
        self.port, self.token = free_port(), secrets.token_hex(16)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "TUTORIAL_LIB_LIVE")}
        for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR",
                    "JUPYTERLAB_WORKSPACES_DIR"):
            env[var] = str(base / var.lower())
            Path(env[var]).mkdir(parents=True)
        for name, values in LAB_SETTINGS.items():
            plugin, file = name.rsplit("/", 1)
            (Path(env["JUPYTERLAB_SETTINGS_DIR"]) / plugin).mkdir(parents=True, exist_ok=True)
            (Path(env["JUPYTERLAB_SETTINGS_DIR"]) / plugin / file).write_text(json.dumps(values))
        env.update(TUTORIAL_LIB_RUNS_DIR=str(runs_dir), MPLBACKEND="Agg")  # live view "auto": widgets
        command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                   f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                   f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={notebook_dir}",
                   "--LabApp.expose_app_in_browser=True"]  # window.jupyterapp: read the cells' outputs exactly
        if os.geteuid() == 0:
            command.append("--allow-root")
        self.log = open(log_path, "w")
        # If pytest itself is killed (a CI time limit), the server gets SIGTERM and shuts its kernels down, whose
        # launches stop their jobs: nothing of this test outlives the test process.
        self.proc = subprocess.Popen(command, env=env, cwd=notebook_dir, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=set_parent_death_signal)
        self.url = f"http://127.0.0.1:{self.port}"

    def api(self, path: str):
        return get_json(f"{self.url}{path}?token={self.token}")

    def wait_up(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyter lab exited with {self.proc.returncode}; see {self.log.name}")
            try:
                self.api("/api/status")
                return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"jupyter lab not up after {timeout_s} s; see {self.log.name}")

    def wait_kernel_idle(self, notebook: str, timeout_s: float = 90) -> dict:
        """Until the notebook's kernel is started and idle ("Run All" before that is silently dropped)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for s in self.api("/api/sessions"):
                if s.get("path", "").endswith(notebook) and s["kernel"]["execution_state"] == "idle":
                    return s
            time.sleep(0.3)
        raise AssertionError(f"no idle kernel for {notebook} after {timeout_s} s: {self.api('/api/sessions')}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the server shuts its kernels down
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


def notebook_with_a_long_run(notebook_dir: Path) -> tuple[Path, int]:
    """Copy 01_ddp.ipynb (nothing in the repository is modified) and append a run that outlasts the test."""
    nb = nbformat.read(ROOT / "notebooks" / "01_ddp.ipynb", as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    max_steps = int(re.search(r"^MAX_STEPS: int = (\d+)", params.source, re.M).group(1))
    nb.cells += [
        nbformat.v4.new_markdown_cell("## Added by tests/notebooks/test_browser.py: a failing run (caught), and a long run to "
                                      "interrupt from the toolbar"),
        nbformat.v4.new_code_cell(
            'try:\n'
            '    tl.run_script("ddp_train", ["--max-steps", 20, "--fail-rank", 1, "--fail-step", 2], runs_dir=RUNS_DIR,\n'
            '                  label="fails", nproc_per_node=2, device=plan.device, timeout_s=TIMEOUT_S)\n'
            'except tl.LaunchError as e:\n'
            '    print(f"caught as expected: {e.summary}")'),
        nbformat.v4.new_code_cell(
            f'long_run = tl.run_script("ddp_train", ["--max-steps", 100000, "--step-delay-s", 0.1], runs_dir=RUNS_DIR,\n'
            f'                         label="{LONG_RUN_LABEL}", nproc_per_node=plan.nproc_per_node, device=plan.device,\n'
            f'                         timeout_s=600)'),
    ]
    path = notebook_dir / "01_ddp.ipynb"
    nbformat.write(nb, path)
    return path, max_steps


# The error outputs of every code cell of the open notebook, from JupyterLab's own model (in the DOM an
# error renders like any stderr text).
CELL_ERRORS_JS = """() => window.jupyterapp.shell.currentWidget.content.widgets
    .filter(cell => cell.model.type === 'code')
    .map(cell => cell.model.outputs.toJSON().filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue))"""


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@contextlib.contextmanager
def lab_page(lab, path: str, failure_png: Path | None = None):
    """A page of headless chromium on ``lab`` at ``path`` (``/lab`` or ``/lab/tree/<notebook>``), 1400 x 1000, each
    action waiting 60 s at most; when the block raises, what the page showed goes to ``failure_png``."""
    sync_playwright = sync_playwright_or_skip()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(f"{lab.url}{path}?token={lab.token}")
            try:
                yield page
            except BaseException:
                if failure_png is not None:
                    with contextlib.suppress(Exception):
                        page.screenshot(path=failure_png)
                raise
        finally:
            browser.close()


def run_all_cells(page) -> None:
    """Run > Run All Cells, from JupyterLab's menu bar."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


def replace_line(page, cell, starts_with: str, text: str) -> None:
    """In ``cell``'s editor, the line showing ``starts_with`` replaced by ``text``, typed as a learner types it."""
    cell.locator(".cm-line", has_text=starts_with).click()
    page.keyboard.press("End")
    page.keyboard.press("Shift+Home")
    page.keyboard.type(text)


@pytest.fixture
def artifacts(tmp_path):
    folder = tmp_path / "artifacts"
    folder.mkdir()
    yield folder
    target = os.environ.get("TUTORIAL_LIB_ARTIFACTS_DIR")
    if target:
        shutil.copytree(folder, Path(target) / "test_browser", dirs_exist_ok=True)


def test_jupyterlab_runs_01_ddp_live_and_the_toolbar_interrupt_stops_the_job(tmp_path, artifacts):
    sync_playwright_or_skip()  # skips here, before a server starts, where there is no browser
    notebook_dir, runs_dir = tmp_path / "notebooks", tmp_path / "runs"
    notebook_dir.mkdir()
    runs_dir.mkdir()
    path, max_steps = notebook_with_a_long_run(notebook_dir)
    original = (ROOT / "notebooks" / "01_ddp.ipynb").read_bytes()
    started = time.monotonic()
    marks = {}  # seconds since the start of the test, for the artifacts' timings.json
    lab = Lab(tmp_path / "lab", notebook_dir, runs_dir, artifacts / "jupyterlab.log")
    try:
        lab.wait_up()
        marks["lab_up"] = time.monotonic() - started
        assert "python3" in lab.api("/api/kernelspecs")["kernelspecs"], "the project's kernel is found"
        with lab_page(lab, f"/lab/tree/{path.name}", artifacts / "failure.png") as page:
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            lab.wait_kernel_idle(path.name)
            marks["kernel_idle"] = time.monotonic() - started
            run_all_cells(page)

            # The first launch's live widget: every rank at the last step, then "finished".
            live = page.locator(".tutorial-lib-live").first
            live.wait_for(timeout=120_000)
            wait_until(lambda: "finished in" in live.inner_text(), 180, "the first run to finish")
            marks["first_run_finished"] = time.monotonic() - started
            text = live.inner_text()
            for rank in (0, 1):
                assert re.search(rf"rank {rank}\s+step {max_steps}/{max_steps}", text), text
            assert "loss" in text and "samples/s" in text and "[rank 1] step" in text, text
            bars = live.locator(".progress-bar")
            assert bars.count() == 2 and bars.evaluate_all("bs => bs.map(b => b.style.width)") == ["100%", "100%"]
            assert all("progress-bar-success" in c for c in bars.evaluate_all("bs => bs.map(b => b.className)"))
            launch_cell = page.locator(".jp-CodeCell", has=page.locator(".tutorial-lib-live")).first
            image = launch_cell.locator(".jp-RenderedImage img")
            assert image.count() == 1, "one plot, redrawn in place"
            wait_until(lambda: image.evaluate("img => img.complete && img.naturalWidth > 0"), 30,
                       "the plot image to render")
            launch_cell.scroll_into_view_if_needed()
            launch_cell.screenshot(path=artifacts / "01_live_view_finished.png")

            # Everything up to the appended long run has executed: no cell shows an error.
            long_dir = wait_until(lambda: next(runs_dir.glob(f"*{LONG_RUN_LABEL}*"), None), 180,
                                  "the long run to start")
            wait_until(lambda: len([f for f in (long_dir / "metrics").glob("rank*.jsonl") if f.stat().st_size]) == 2,
                       120, "both ranks of the long run to log a step")
            errors = page.evaluate(CELL_ERRORS_JS)
            assert len(errors) > 10 and not any(errors), errors
            failing_cell = page.locator(".jp-CodeCell").nth(-2)
            box = failing_cell.locator(".tutorial-lib-failure")
            text = box.inner_text()
            for expected in ("ddp_train.py failed on rank 1 (exit code 1)",
                             "cause: RuntimeError: injected failure on rank 1 at step 2", "output.log", "logs/"):
                assert expected in text, text
            assert box.evaluate("b => getComputedStyle(b).color") == "rgb(183, 28, 28)", "the summary is red"
            assert "caught as expected" in failing_cell.locator(".jp-OutputArea").inner_text()
            failing_cell.scroll_into_view_if_needed()
            page.screenshot(path=artifacts / "02_failure_summary.png")
            marks["failure_box_checked"] = time.monotonic() - started
            long_cell = page.locator(".jp-CodeCell").last  # the appended cell
            long_live = long_cell.locator(".tutorial-lib-live")
            wait_until(lambda: re.search(r"rank 1\s+step \d+/100000", long_live.inner_text()), 60,
                       "the long run's progress in the widget")
            long_cell.scroll_into_view_if_needed()
            page.screenshot(path=artifacts / "03_long_run_running.png")
            assert job_processes(str(long_dir)), "the long run's processes are running"

            clicked = time.monotonic()
            marks["interrupt_clicked"] = clicked - started
            page.locator('[data-command="notebook:interrupt-kernel"]').first.click()
            wait_until(lambda: not job_processes(str(long_dir)), 30, "no process of the long run")
            gone_s = time.monotonic() - clicked
            said = long_cell.locator(".jp-OutputArea-output", has_text="interrupted: stopped torchrun")
            said.wait_for(timeout=30_000)
            said_s = time.monotonic() - clicked
            long_cell.locator(".jp-OutputArea-output", has_text="KeyboardInterrupt").first.wait_for(timeout=30_000)
            errors = page.evaluate(CELL_ERRORS_JS)
            assert errors[-1] == ["KeyboardInterrupt: "] and not any(errors[:-1]), errors
            wait_until(lambda: "interrupted" in long_live.locator(".tutorial-lib-failure").inner_text(), 30,
                       "the red box saying the job was interrupted")
            long_cell.scroll_into_view_if_needed()
            page.screenshot(path=artifacts / "04_interrupted.png")
    finally:
        lab.close()
    timings = {"interrupt_to_no_process_s": round(gone_s, 2), "interrupt_to_message_s": round(said_s, 2),
               "test_s": round(time.monotonic() - started, 1), **{k: round(v, 1) for k, v in marks.items()}}
    (artifacts / "timings.json").write_text(json.dumps(timings))
    print(timings)
    assert gone_s < 10, f"the job stopped {gone_s:.1f} s after the interrupt (FACTS: under 1 s)"
    assert (ROOT / "notebooks" / "01_ddp.ipynb").read_bytes() == original, "the repository's notebook is untouched"
    wait_until(lambda: not job_processes(str(tmp_path)), 30, "no process (kernel, torchrun, worker) of the test left")


# Whether a heading's Chinese characters are drawn with real glyphs: two different CJK characters, drawn on a canvas
# in the heading's own font, give two different images; without a CJK font both are the same "tofu" box. Controls:
# two Latin letters differ, two code points no font has (U+10FFFC, U+10FFFD) draw the same box.
GLYPHS_JS = """(el) => {
  const s = getComputedStyle(el), font = `${s.fontWeight} ${s.fontSize} ${s.fontFamily}`;
  const draw = (ch) => { const c = document.createElement('canvas'); c.width = c.height = 96;
    const g = c.getContext('2d'); g.font = font; g.textBaseline = 'top'; g.fillText(ch, 8, 8); return c.toDataURL(); };
  const cjk = [...new Set(el.textContent.match(/[\\u4e00-\\u9fff]/g) || [])].slice(0, 2);
  return {font, cjk, cjk_same: cjk.length === 2 && draw(cjk[0]) === draw(cjk[1]), latin_same: draw('a') === draw('b'),
          missing_same: draw('\\u{10FFFC}') === draw('\\u{10FFFD}')};
}"""
# Every code cell of the open notebook has run (an execution count), from JupyterLab's model.
ALL_EXECUTED_JS = """() => window.jupyterapp.shell.currentWidget.content.widgets
    .filter(cell => cell.model.type === 'code').every(cell => cell.model.executionCount !== null)"""


def test_jupyterlab_runs_a_chinese_notebook_and_draws_its_text(tmp_path, artifacts):
    """The Chinese edition (notebooks/zh/, issue 31) as a reader opens it: 00's twin runs to the end in JupyterLab with
    its live view, whose status line is in Chinese (the kernel runs in a folder named zh), no cell shows an error, and
    its Chinese title is on the page drawn with real CJK glyphs."""
    sync_playwright_or_skip()  # skips here, before a server starts, where there is no browser
    source = ROOT / "notebooks" / "zh" / "00_environment_check.ipynb"
    nb = nbformat.read(source, as_version=4)
    title = nb.cells[0].source.splitlines()[0].removeprefix("# ").strip()
    assert re.search(r"[\u4e00-\u9fff]", title), f"the twin's title is Chinese: {title!r}"
    notebook_dir, runs_dir = tmp_path / "notebooks" / "zh", tmp_path / "runs"  # a zh folder: the library speaks Chinese
    notebook_dir.mkdir(parents=True)
    runs_dir.mkdir()
    path = Path(shutil.copy(source, notebook_dir / source.name))
    lab = Lab(tmp_path / "lab", notebook_dir, runs_dir, artifacts / "jupyterlab.log")
    try:
        lab.wait_up()
        with lab_page(lab, f"/lab/tree/{path.name}", artifacts / "zh_failure.png") as page:
            heading = page.locator(".jp-MarkdownCell h1").first
            heading.wait_for()
            assert heading.inner_text().replace("¶", "").strip() == title
            glyphs = heading.evaluate(GLYPHS_JS)
            assert not glyphs["latin_same"] and glyphs["missing_same"], f"the glyph comparison works: {glyphs}"
            assert len(glyphs["cjk"]) == 2 and not glyphs["cjk_same"], (
                f"the Chinese title is drawn as empty boxes: no CJK font in this browser's system ({glyphs}); "
                "apt-get install -y fonts-wqy-microhei (.ci/run does)")
            page.screenshot(path=artifacts / "zh_00_opened.png")
            lab.wait_kernel_idle(path.name)
            run_all_cells(page)

            live = page.locator(".tutorial-lib-live").first
            live.wait_for(timeout=120_000)
            wait_until(lambda: "运行结束" in live.inner_text(), 180, "the collectives check to finish (status in Chinese)")
            wait_until(lambda: page.evaluate(ALL_EXECUTED_JS), 180, "every code cell to run")
            lab.wait_kernel_idle(path.name)
            errors = page.evaluate(CELL_ERRORS_JS)
            assert len(errors) == sum(c.cell_type == "code" for c in nb.cells) and not any(errors), errors
            assert list(runs_dir.glob("*-collectives")), "the launch wrote its run directory under RUNS_DIR"
            page.locator(".jp-CodeCell").last.scroll_into_view_if_needed()
            page.screenshot(path=artifacts / "zh_00_finished.png")
    finally:
        lab.close()
    wait_until(lambda: not job_processes(str(tmp_path)), 30, "no process (kernel, torchrun, worker) of the test left")


# The index (among all cells) of the cell whose nbformat id is given, from JupyterLab's model.
CELL_INDEX_JS = """(id) => window.jupyterapp.shell.currentWidget.content.widgets.findIndex(cell => cell.model.id === id)"""


def notebook_with_exercises_only(notebook_dir: Path) -> tuple[Path, nbformat.NotebookNode]:
    """01_ddp.ipynb's setup cells and its exercises section (a copy; the lessons in between are left out)."""
    nb = nbformat.read(ROOT / "notebooks" / "01_ddp.ipynb", as_version=4)
    start = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## Exercises"))
    setup = next(i for i, c in enumerate(nb.cells) if "tl.setup_notebook" in c.source)
    nb.cells = nb.cells[:setup + 1] + nb.cells[start:]
    path = notebook_dir / "01_ddp_exercises.ipynb"
    nbformat.write(nb, path)
    return path, nb


class MakeLab(Lab):
    """JupyterLab started by `make lab` itself (EDITION=en or zh), on this test's Python environment as the Makefile's
    VENV (its install stamp marked up to date with `make -o`, so make installs nothing), or on ``venv`` (a venv `make
    env` made: make runs as it would for a user), on a free port with a token; the Jupyter folders, the learner's
    working copy of the notebooks (LAB_DIR) and the lab's workspaces under ``base``. For EDITION=zh the Makefile
    points JUPYTERLAB_SETTINGS_DIR at LAB_SETTINGS_DIR (here ``base/lab-settings-zh``) and writes the translation
    setting there."""

    def __init__(self, base: Path, edition: str, log_path: Path, env_extra: dict | None = None,
                 venv: Path | None = None) -> None:
        self.port, self.token = free_port(), secrets.token_hex(16)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "TUTORIAL_LIB_LIVE", "MAKEFLAGS")}
        env.update(env_extra or {})
        for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR",
                    "JUPYTERLAB_WORKSPACES_DIR"):
            env[var] = str(base / var.lower())
            Path(env[var]).mkdir(parents=True)
        self.settings_dir = base / "lab-settings-zh" if edition == "zh" else Path(env["JUPYTERLAB_SETTINGS_DIR"])
        for name, values in LAB_SETTINGS.items():  # no news prompt; the translation setting is left to make
            plugin, file = name.rsplit("/", 1)
            (self.settings_dir / plugin).mkdir(parents=True, exist_ok=True)
            (self.settings_dir / plugin / file).write_text(json.dumps(values))
        self.lab_dir = base / "my-notebooks"
        installed = [] if venv is not None else ["-o", f"{sys.prefix}/.installed"]
        command = ["make", "--no-print-directory", "-C", str(ROOT), *installed, "lab",
                   f"EDITION={edition}", f"VENV={venv or sys.prefix}", f"LAB_SETTINGS_DIR={base / 'lab-settings-zh'}",
                   f"LAB_DIR={self.lab_dir}", f"LAB_WORKSPACES_DIR={env['JUPYTERLAB_WORKSPACES_DIR']}",
                   f"LAB_ARGS=--no-browser --ServerApp.port={self.port} --ServerApp.port_retries=0 "
                   f"--IdentityProvider.token={self.token} --LabApp.expose_app_in_browser=True"]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=set_parent_death_signal)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self.proc.poll() is None:  # make and the jupyter server it started: the whole process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):  # the server, if it outlived make
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.log.close()


# JupyterLab's menu bar in English; in Chinese the first menu is 文件 and no label is an English one (the rest is
# the language pack's wording, e.g. 标签页 for Tabs in 4.5.post3).
MENUS_EN = ["File", "Edit", "View", "Run", "Kernel", "Tabs", "Settings", "Help"]


def chinese_server_locale(folder: Path) -> dict:
    """LANG=zh_CN.UTF-8 for a server process, compiled into ``folder`` with glibc's localedef (LOCPATH), since
    containers seldom have it generated; skips where localedef or the zh_CN source is missing."""
    if not shutil.which("localedef") or not Path("/usr/share/i18n/locales/zh_CN").exists():
        pytest.skip("no localedef or /usr/share/i18n/locales/zh_CN to make a zh_CN.UTF-8 locale")
    folder.mkdir(parents=True)
    made = subprocess.run(["localedef", "-i", "zh_CN", "-f", "UTF-8", str(folder / "zh_CN.UTF-8")],
                          capture_output=True, text=True)  # exit 1 for warnings; the probe below decides
    env = {"LOCPATH": str(folder), "LANG": "zh_CN.UTF-8", "LC_ALL": ""}
    probe = subprocess.run([sys.executable, "-c", "import locale; print(locale.getlocale()[0])"],
                           env={**os.environ, **env}, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "zh_CN", (probe, made)
    return env


@pytest.mark.parametrize("edition, server_locale", [("zh", None), ("en", None), ("en", "zh_CN.UTF-8")],
                         ids=["zh", "en", "en-on-a-zh_CN-server"])
def test_make_lab_edition_zh_opens_jupyterlab_in_chinese(edition, server_locale, tmp_path, artifacts):
    """Issue 38: `make lab EDITION=zh` opens JupyterLab's own interface in Chinese (the zh_CN language pack of the
    `lab-zh` and `test` extras, and the translation setting the Makefile writes into the Chinese lab's settings folder):
    the first menu is 文件. The controls: `make lab` (English), in the same environment with the pack installed, shows
    File, also on a server whose locale is zh_CN.UTF-8 (JupyterLab's own default language is the server's locale,
    which with the pack installed shows Chinese menus: the Makefile runs the English lab with LC_CTYPE=C.UTF-8)."""
    sync_playwright_or_skip()
    import importlib.util

    assert importlib.util.find_spec("jupyterlab_language_pack_zh_CN"), (
        "JupyterLab's zh_CN language pack is not installed: pip install -e '.[test]' (the test extra has it)")
    env_extra = chinese_server_locale(tmp_path / "locale") if server_locale else {}
    lab = MakeLab(tmp_path / "lab", edition, artifacts / f"make_lab_{edition}.log", env_extra)
    try:
        lab.wait_up(timeout_s=120)
        with lab_page(lab, "/lab") as page:
            labels = page.locator(".lm-MenuBar-itemLabel")
            labels.first.wait_for()
            wait_until(lambda: labels.count() >= len(MENUS_EN), 30, "the menu bar")
            shown = [t.strip() for t in labels.all_inner_texts()]
            page.screenshot(path=artifacts / f"make_lab_{edition}.png")
    finally:
        lab.close()
    log = Path(lab.log.name).read_text()
    if edition == "zh":
        assert shown[0] == "文件" and not set(shown) & set(MENUS_EN), f"the Chinese lab's menu bar: {shown}"
    else:
        assert shown[:len(MENUS_EN)] == MENUS_EN, f"the English lab's menu bar: {shown}"
    setting = lab.settings_dir / "@jupyterlab/translation-extension/plugin.jupyterlab-settings"
    if edition == "zh":
        assert json.loads(setting.read_text()) == {"locale": "zh_CN"}, "make wrote the Chinese lab's translation setting"
        assert f'JUPYTERLAB_SETTINGS_DIR="{lab.settings_dir}"' in log, log
    else:
        assert not setting.exists() and "JUPYTERLAB_SETTINGS_DIR=" not in log, "the English lab's settings are left alone"
        assert "LC_CTYPE=C.UTF-8" in log, log
    assert "Obtaining file:" not in log and "Collecting " not in log, f"make lab ran pip: {log}"


def autodl_style_base(folder: Path) -> Path:
    """A stand-in for an AutoDL-style image's base interpreter (conda's, under /root/miniconda3 there): a prefix that
    holds torch and serves its own JupyterLab. Made as a hard-linked copy of this Python's base installation
    (``sys.base_prefix``, which holds the torch CI installs; pip writes new files and unlinks old ones, so the original
    is never changed), with JupyterLab installed into it at the locked version, the case where pip finds the venv's
    JupyterLab "already satisfied" and writes none into the venv. Skips where the copy cannot be hard-linked."""
    prefix = folder / "base"
    made = subprocess.run(["cp", "-al", sys.base_prefix, str(prefix)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot hard-link a copy of {sys.base_prefix} under {folder}: {made.stderr.strip()[:200]}")
    python = prefix / "bin" / "python3"
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True)
    assert probe.returncode == 0, f"the base interpreter's copy imports no torch: {probe.stderr[-500:]}"
    quiet = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # pip's own deprecations are not ours
    installed = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-c", str(ROOT / "requirements" /
                                "lock.txt"), "jupyterlab"], capture_output=True, text=True, timeout=600, env=quiet)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return prefix


@pytest.mark.timeout(1200)
def test_the_zh_readme_on_an_autodl_style_image_serves_jupyterlab_in_chinese_and_leaves_git_clean(tmp_path, artifacts):
    """Issue 45: the Chinese README's commands on an image whose base interpreter (found on PATH) holds torch and its
    own JupyterLab. An unreachable mirror fails at once, naming it; `make env` (no PYTHON=) makes the venv from that
    interpreter, reusing its torch, and the venv gets no `jupyter` script of its own (the review's mechanism); `make
    lab EDITION=zh` still serves JupyterLab, in Chinese, on the learner's copy of the notebooks; a notebook edited,
    run and saved there leaves `git status` of the checkout as it was."""
    sync_playwright_or_skip()  # skips here, before a server starts, where there is no browser
    base = autodl_style_base(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "PYTHONWARNINGS", "VIRTUAL_ENV")}
    env["PATH"] = f"{base / 'bin'}:{env['PATH']}"
    git_status = ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"]
    status_before = subprocess.run(git_status, capture_output=True, text=True, check=True).stdout

    unreachable = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "env", f"VENV={tmp_path / 'v0'}"],
                                 env={**env, "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}, capture_output=True,
                                 text=True, timeout=120)
    assert unreachable.returncode != 0 and not (tmp_path / "v0" / ".installed").exists()
    assert "PIP_INDEX_URL=http://127.0.0.1:9/simple could not be reached" in unreachable.stderr, unreachable.stderr
    assert "Collecting" not in unreachable.stdout, "pip ran against an index that does not answer"

    venv = tmp_path / "venv"
    made = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "env", f"VENV={venv}"], env=env,
                          capture_output=True, text=True, timeout=900)
    (artifacts / "make_env.log").write_text(made.stdout + made.stderr)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    assert f"making {venv} from {base / 'bin' / 'python'}: Python" in made.stdout, made.stdout[:2000]
    assert "torch" in made.stdout and "is reused" in made.stdout
    assert not (venv / "bin" / "jupyter").exists(), "JupyterLab came from the base: the venv has no script of its own"

    lab = MakeLab(tmp_path / "lab", "zh", artifacts / "make_lab_autodl.log", {"PATH": env["PATH"]}, venv=venv)
    notebook = "01_ddp.ipynb"
    try:
        lab.wait_up(timeout_s=300)
        with lab_page(lab, f"/lab/tree/{notebook}") as page:
            labels = page.locator(".lm-MenuBar-itemLabel")
            labels.first.wait_for()
            wait_until(lambda: labels.count() >= len(MENUS_EN), 30, "the menu bar")
            shown = [t.strip() for t in labels.all_inner_texts()]
            first_code = page.locator(".jp-Notebook .jp-CodeCell").first
            first_code.wait_for()
            lab.wait_kernel_idle(notebook, timeout_s=120)
            first_code.locator(".cm-content").click()
            page.keyboard.press("Control+End")
            page.keyboard.type("\nprint('edited in the working copy')")
            page.keyboard.press("Shift+Enter")
            wait_until(lambda: "edited in the working copy" in first_code.locator(".jp-OutputArea").inner_text(),
                       120, "the edited cell's output")
            page.keyboard.press("Control+s")
            wait_until(lambda: "edited in the working copy" in (lab.lab_dir / "zh" / notebook).read_text(), 30,
                       "the notebook saved in the working copy")
            page.screenshot(path=artifacts / "make_lab_autodl.png")
    finally:
        lab.close()
    assert shown[0] == "文件" and not set(shown) & set(MENUS_EN), f"the Chinese lab's menu bar: {shown}"
    assert "edited in the working copy" not in (ROOT / "notebooks" / "zh" / notebook).read_text()
    status_after = subprocess.run(git_status, capture_output=True, text=True, check=True).stdout
    assert status_after == status_before, f"the session changed the checkout:\n{status_after}"


def notebook_with_a_script_and_a_prediction(notebook_dir: Path) -> tuple[Path, nbformat.NotebookNode]:
    """01_ddp.ipynb's setup cells and its exercises section, then exercise 4 of 04_fsdp.ipynb (predict, then run): its
    cells as notebook 04 has them, after a cell that makes its handle (a copy; the repository is not modified)."""
    path, nb = notebook_with_exercises_only(notebook_dir)
    nb04 = nbformat.read(ROOT / "notebooks" / "04_fsdp.ipynb", as_version=4)
    start = next(i for i, c in enumerate(nb04.cells) if c.source.startswith("### Exercise 4"))
    handle = nbformat.v4.new_code_cell('ex4 = tl.exercise("04.4", RUNS_DIR)  # notebook 04\'s exercise 4')
    nb.cells += [handle, *nb04.cells[start:start + 3]]
    path = path.with_name("01_ddp_and_a_prediction.ipynb")
    nbformat.write(nb, path)
    return path, nb


def cell_output(page, index: int) -> str:
    return page.locator(".jp-Cell").nth(index).locator(".jp-OutputArea").inner_text()


def test_a_learner_solves_a_script_exercise_and_a_predict_then_run_exercise_in_jupyterlab(tmp_path, artifacts):
    """Issues 36 and 44: the two kinds a learner meets first, as a learner solves them. Run All: 01.1's check says "not
    solved yet" and what differs; 04.4's prediction cell shows this round's inputs and its check says to predict first,
    running nothing. Then, with the keyboard: 01.1's starter is fixed (the line that scales the loss replaced by a
    comment; Shift+Enter writes it, Shift+Enter checks it: solved, and the script written is the edited one); the number of
    all-gathers is worked out from the inputs the page shows (2 per block that reshards after its forward, 1 per block
    that does not, 1 for the root) and typed into ex4.predict(...), Shift+Enter records it, Shift+Enter runs the check:
    solved, the prediction beside the measurement. progress.json records both, with the prediction and the measurement
    of 04.4's round."""
    sync_playwright_or_skip()  # skips here, before a server starts, where there is no browser
    notebook_dir, runs_dir = tmp_path / "notebooks", tmp_path / "runs"
    notebook_dir.mkdir()
    runs_dir.mkdir()
    path, nb = notebook_with_a_script_and_a_prediction(notebook_dir)
    ids = [c.id for c in nb.cells]
    starter_id = next(c.id for c in nb.cells if c.source.startswith("%%writefile {ex1.script}"))
    predict_id = next(c.id for c in nb.cells if c.source.startswith("ex4.predict(None)"))
    buggy = next(line for line in nb.cells[ids.index(starter_id)].source.splitlines()
                 if line.startswith("loss = loss / world_size"))
    lab = Lab(tmp_path / "lab", notebook_dir, runs_dir, artifacts / "jupyterlab.log")
    try:
        lab.wait_up()
        with lab_page(lab, f"/lab/tree/{path.name}", artifacts / "prediction_failure.png") as page:
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            lab.wait_kernel_idle(path.name)
            run_all_cells(page)
            wait_until(lambda: page.evaluate(ALL_EXECUTED_JS), 240, "every code cell to run")
            lab.wait_kernel_idle(path.name)
            assert not any(page.evaluate(CELL_ERRORS_JS)), page.evaluate(CELL_ERRORS_JS)

            starter, predict = page.evaluate(CELL_INDEX_JS, starter_id), page.evaluate(CELL_INDEX_JS, predict_id)
            before = cell_output(page, starter + 1)
            assert "not solved yet" in before and "0.5 times one process's" in before, before
            page.locator(".jp-Cell").nth(starter + 1).scroll_into_view_if_needed()
            page.screenshot(path=artifacts / "exercise_not_solved.png")
            shown = cell_output(page, predict)
            found = re.search(r"This round: 04_4_units\.py --blocks (\d+) --reshard-after-forward (true|false) "
                              r"on 2 ranks", shown)
            assert found and "no prediction yet" in shown, shown
            assert "predict first" in cell_output(page, predict + 1) and "Nothing was run" in cell_output(
                page, predict + 1)

            replace_line(page, page.locator(".jp-Cell").nth(starter), buggy.split("  #")[0],  # 01.1: loss scaled
                         "# DDP already averages the gradients: no scaling")
            page.keyboard.press("Shift+Enter")  # writes the script, moves to the check
            page.keyboard.press("Shift+Enter")  # runs the check
            wait_until(lambda: "solved" in (t := cell_output(page, starter + 1)) and "not solved" not in t, 120,
                       "01.1's check to say solved")
            lab.wait_kernel_idle(path.name)

            blocks, reshard = int(found[1]), found[2] == "true"
            prediction = (2 if reshard else 1) * blocks + 1  # what the lesson's section 6 says, worked out
            replace_line(page, page.locator(".jp-Cell").nth(predict), "ex4.predict(None)",
                         f"ex4.predict({prediction})  # my prediction")
            page.keyboard.press("Shift+Enter")  # records it, moves to the check
            wait_until(lambda: "recorded for" in cell_output(page, predict), 60, "the prediction to be recorded")
            page.keyboard.press("Shift+Enter")  # runs the program and shows the measurement
            wait_until(lambda: "solved" in (t := cell_output(page, predict + 1)) and "not solved" not in t, 120,
                       "04.4's check to say solved")
            lab.wait_kernel_idle(path.name)
            checked = cell_output(page, predict + 1)
            assert f"your prediction: {prediction}" in checked, checked
            assert f"measured: {prediction} all-gathers on rank 1" in checked, checked
            page.locator(".jp-Cell").nth(predict + 1).scroll_into_view_if_needed()
            page.screenshot(path=artifacts / "prediction_solved.png")
    finally:
        lab.close()
    written = (runs_dir / "exercises" / "01.1" / "train.py").read_text()
    assert buggy not in written and "# DDP already averages the gradients: no scaling" in written
    record = json.loads((runs_dir / "exercises" / "progress.json").read_text())
    assert record["01.1"]["solved"] and record["01.1"]["checks"] == 2, record["01.1"]
    mine = record["04.4"]
    assert mine["solved"] and mine["checks"] == 1 and mine["prediction"] == mine["measured"] == prediction, mine
    assert [(p["value"], p["counts"]) for p in mine["predictions"]] == [(prediction, True)], mine["predictions"]
    assert [m["agrees"] for m in mine["measurements"]] == [True] and mine["round"]["revealed"], mine
    wait_until(lambda: not job_processes(str(tmp_path)), 30, "no process (kernel, torchrun, worker) of the test left")
