"""The live view of a running job: per-rank progress and the loss/memory figure, updated in place.

Modes (``LaunchSpec.live``, or the ``TUTORIAL_LIB_LIVE`` environment variable for ``"auto"``):

* ``"widgets"``: in a Jupyter kernel, an ipywidgets progress bar per rank, a red box naming the failed rank,
  its cause and the logs when the job fails, the rank-prefixed output in a collapsible area of limited
  height, and the figure (replaced in place, one image);
* ``"text"``: in a Jupyter kernel, a plain-text progress table plus the figure, both updated in
  place through display handles (what papermill and nbval store); in a terminal, a progress
  line every few seconds;
* ``"off"``: nothing.

``"auto"`` picks widgets in a Jupyter kernel with ipywidgets installed, else text. Each mode is its own class behind
the ``LiveView`` interface (``WidgetNotebookView``, ``TextNotebookView``, ``TerminalView``, and ``LiveView`` itself
for ``"off"``); the launcher tells a view how the run ended with an ``Outcome`` (below).
"""

from __future__ import annotations

import html
import logging
import os
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..errors import ConfigError, LaunchError
from ..i18n import _, render
from ..notebook.plots import plot_run
from ..runs.rundir import RunStatus
from .states import Outcome, Queued

log = logging.getLogger(__name__)

LIVE_MODES = ("auto", "widgets", "text", "off")
LIVE_ENV = "TUTORIAL_LIB_LIVE"


def safe_draw(draw, *args) -> None:
    """Call a live-view method; a drawing problem is logged, never allowed to fail or hide the job's outcome."""
    try:
        draw(*args)
    except Exception:  # noqa: BLE001
        log.warning("the live view could not draw", exc_info=True)


def in_jupyter_kernel() -> bool:
    """True when running inside an IPython kernel (a notebook), not a terminal IPython or plain Python."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and hasattr(shell, "kernel")


def progress_fields(record: dict) -> list[str]:
    """``step i/n`` (``step i`` when the script does not say ``n``: a loss read from a printed line), and ``loss``
    and ``samples/s`` when the script reports them, from one metrics record; in the language in use."""
    step = record.get("step")
    fields = [_("step {step}/{max_steps}", step=step, max_steps=record["max_steps"]) if "max_steps" in record
              else _("step {step}", step=step)]
    if "loss_local" in record:
        fields.append(_("loss {value:.4f}", value=record["loss_local"]))
    if "samples_per_s" in record:
        fields.append(_("samples/s {rate:.0f}", rate=record["samples_per_s"]))
    return fields


class LiveView:
    """Base view: collects records; subclasses draw them. ``update`` is called a few times a second.

    ``log_stream`` is where the launcher's rank-prefixed output lines go: ``None`` means the cell's (or the
    terminal's) stdout; the widget view collects them in its own output area instead.
    """

    log_stream = None

    def __init__(self) -> None:
        self.latest: dict[int, dict] = {}  # rank -> newest metrics record
        self.records: list[dict] = []
        self.queued: Queued | None = None  # the job waits in a batch queue (SLURM), no rank started

    def add(self, records: list[dict]) -> None:
        """Take new metrics records (one dict per rank per step, as the scripts write them)."""
        for r in records:
            self.records.append(r)
            if r.get("step", -1) >= self.latest.get(r.get("rank"), {}).get("step", -1):
                self.latest[r.get("rank")] = r

    def set_queued(self, queued: Queued | None) -> None:
        """The job waits in the batch system's queue (``queued``: its id and reason), or no longer does (``None``)."""
        self.queued = queued

    def progress_lines(self, elapsed_s: float) -> list[str]:
        """One line per rank with its newest step, loss and samples/s; before any step, that the job is pending in
        the queue (and why) or that it runs without a step yet."""
        lines = []
        for rank in sorted(self.latest):
            lines.append(_("rank {rank}: {fields}", rank=rank, fields="  ".join(progress_fields(self.latest[rank]))))
        if lines:
            return lines
        if self.queued is not None and self.queued.reason:
            return [_("pending: SLURM job {job_id} waits in the queue ({reason}), no rank started yet ({elapsed_s:.0f} "
                      "s)", job_id=self.queued.job_id, reason=self.queued.reason, elapsed_s=elapsed_s)]
        if self.queued is not None:
            return [_("pending: SLURM job {job_id} waits in the queue, no rank started yet ({elapsed_s:.0f} s)",
                      job_id=self.queued.job_id, elapsed_s=elapsed_s)]
        return [_("running, no step reported yet ({elapsed_s:.0f} s)", elapsed_s=elapsed_s)]

    def start(self) -> None:
        """Show the (empty) view, before the job starts."""

    def update(self, elapsed_s: float, rss_samples: list[dict], final: bool = False) -> None:
        """Redraw with the records so far; ``rss_samples`` are the memory sampler's rows; throttled by the view."""

    def finish(self, rss_samples: list[dict], outcome: Outcome) -> None:
        """Draw the final state: how the run ended (``outcome``: status, cause, elapsed seconds)."""

    def fail(self, error: Exception) -> None:
        """Show why the job failed (``error``: the ``LaunchError`` the launcher is about to raise)."""


class TerminalView(LiveView):
    """A line saying where the ranks run (``cwd``, when known), then a progress line on stdout every ``interval_s``
    seconds (and at the end)."""

    def __init__(self, interval_s: float = 3.0, cwd: str | os.PathLike | None = None) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.cwd = cwd
        self._last = 0.0

    def start(self):
        if self.cwd is not None:
            sys.stdout.write(f"[launcher] {where_ranks_run(self.cwd)}\n")

    def update(self, elapsed_s, rss_samples, final=False):
        if final or elapsed_s - self._last >= self.interval_s:
            self._last = elapsed_s
            sys.stdout.write(f"[progress {elapsed_s:5.1f} s] " + " | ".join(self.progress_lines(elapsed_s)) + "\n")

    def finish(self, rss_samples, outcome):
        if self.latest:
            self.update(outcome.elapsed_s, rss_samples, final=True)
        sys.stdout.write(f"[launcher] {outcome.text}\n")


MIN_PLOT_STEPS = 2  # distinct steps before the live view draws the loss/memory figure


class NotebookView(LiveView):
    """What both notebook views share: the progress (drawn by the subclass) and the loss/memory figure, each redrawn
    in place through a display handle, and the words of the failure box.

    ``TextNotebookView`` (papermill, nbval, no ipywidgets) and ``WidgetNotebookView`` (JupyterLab) draw the
    progress, the outcome and the failure box; this class decides when and what.
    """

    def __init__(self, plot_interval_s: float = 1.0, run_dir: str | os.PathLike | None = None,
                 cwd: str | os.PathLike | None = None) -> None:
        super().__init__()
        self.plot_interval_s = plot_interval_s
        self.run_dir = run_dir
        self.cwd = cwd  # where the ranks run: said in the status
        self._last_plot = -1e9
        self._plotted_records = -1

    def start(self):
        from IPython.display import display

        enable_inline_figures()  # the figure below is drawn as an image (the notebook's setup call may not have run)
        self._start_progress()
        self._plot = display(_Text("(the loss and memory plot appears once two steps are logged)"), display_id=True)

    def _start_progress(self) -> None:
        """Show the progress area (before the figure's)."""
        raise NotImplementedError

    def _draw_progress(self, elapsed_s: float, outcome: Outcome | None = None) -> None:
        """Redraw every rank's progress; ``outcome`` once the run has ended."""
        raise NotImplementedError

    def _draw_alert(self, title: str, details: list[str]) -> None:
        """Show why the run failed: ``title``, then ``details`` (plain text)."""
        raise NotImplementedError

    def _draw_outcome(self, elapsed_s: float, outcome: Outcome) -> None:
        """The last redraw, after the progress, the figure and the failure box (nothing by default)."""

    def _draw_plot(self, rss_samples, final=False):
        steps = {r.get("step") for r in self.records}
        if len(steps) < MIN_PLOT_STEPS:  # one dot is no curve: a 1-step or early-failed run draws no figure
            if final:
                self._plot.update(_Text(_("(no per-step metrics: this script writes none)") if not self.records else
                                        _("({n} step logged: too few for a curve)", n=len(steps))))
            return
        fig = plot_run(pd.DataFrame(self.records), pd.DataFrame(rss_samples) if rss_samples else None)
        self._plot.update(fig)
        self._plotted_records = len(self.records)

    def update(self, elapsed_s, rss_samples, final=False):
        self._draw_progress(elapsed_s)
        if (final or elapsed_s - self._last_plot >= self.plot_interval_s) and len(self.records) != self._plotted_records:
            self._last_plot = elapsed_s
            self._draw_plot(rss_samples)

    def finish(self, rss_samples, outcome):
        # The figure first: when the status line says "finished", the final figure is already there.
        # After a success the memory curve is completed; after a failure only new steps are drawn, and after an
        # interrupt the figure stays as it is (at most plot_interval_s old) unless none was drawn yet, so the
        # cell says "interrupted" without waiting for a redraw.
        stale = len(self.records) != self._plotted_records
        interrupted = outcome.status == RunStatus.INTERRUPTED
        if not outcome.failed or (stale and (not interrupted or self._plotted_records < 0)):
            self._draw_plot(rss_samples, final=True)
        self._draw_progress(outcome.elapsed_s, outcome)
        if outcome.failed:
            details = [self._steps_line()]
            if interrupted:
                details.insert(0, _("the kernel was interrupted: torchrun and every worker were stopped"))
            self._draw_alert(render(outcome.cause), details)
        self._draw_outcome(outcome.elapsed_s, outcome)

    def _steps_line(self) -> str:
        steps = _(", ").join(_("rank {rank} at step {step}", rank=k, step=r.get("step"))
                             for k, r in sorted(self.latest.items()))
        return _("last step reported: {steps}", steps=steps or _("none"))

    def fail(self, error) -> None:
        """Name the failed rank and its cause in the failure box (``error``: the ``LaunchError`` about to be raised)."""
        failure = getattr(error, "failure", None)
        if getattr(error, "timeout_s", None) is not None:  # LaunchTimeout: where every rank was, if it says
            where = getattr(error, "where", None) or {}
            stalled = getattr(error, "limit", "") == "stall_timeout_s"
            timeout_s = f"{error.timeout_s:g}"
            details = [_("no rank logged a new step for stall_timeout_s={timeout_s} s: the job was stopped",
                         timeout_s=timeout_s) if stalled else
                       _("the job ran past timeout_s={timeout_s} s and was stopped", timeout_s=timeout_s)]
            details += [_("rank {rank} was in {place}", rank=rank, place=place) for rank, place in sorted(where.items())]
            self._draw_alert(self._title(error), details + [self._steps_line()])
            return
        cause = error.cause if isinstance(error, LaunchError) else ""  # survives empty tracebacks and logs
        details = [_("cause: {cause}", cause=cause)] if cause else []  # the log's own line: as it was printed
        if failure is not None and failure.rank is not None:
            details.append(_("rank {rank} exited with code {code}; the other ranks were stopped", rank=failure.rank,
                             code=failure.exit_code))
        details.append(self._steps_line())
        self._draw_alert(self._title(error), details)

    @staticmethod
    def _title(error) -> str:
        """The failure box's title: the error's headline worded in ``tl.language()`` (its summary when it has none)."""
        headline = getattr(error, "headline", None)
        return render(headline) if headline is not None else getattr(error, "summary", str(error))


class TextNotebookView(NotebookView):
    """Text mode in a kernel (papermill, nbval, no ipywidgets): a plain-text progress table, redrawn in place, above
    the figure. The output lines go to the cell's stdout (``log_stream`` is ``None``), throttled by the launcher; the
    failure is said by those lines and the raised error, so there is no failure box."""

    def _start_progress(self) -> None:
        from IPython.display import display

        self._progress = display(_Text(_("starting torchrun ...")), display_id=True)

    def _draw_progress(self, elapsed_s, outcome=None):
        status = _("elapsed {elapsed_s:.1f} s", elapsed_s=elapsed_s) + (f" - {outcome.text}" if outcome else "")
        where = [where_ranks_run(self.cwd)] if self.cwd is not None else []
        self._progress.update(_Text("\n".join(self.progress_lines(elapsed_s) + where + [status])))

    def _draw_alert(self, title, details):
        pass


class WidgetNotebookView(NotebookView):
    """The widget view in JupyterLab. The cell shows, from top to bottom: a status line (running / finished / failed,
    elapsed), one progress bar per rank (step / max steps, loss, samples/s, elapsed), a red summary box when the job
    fails or is interrupted (rank, cause, where the full logs are), and the rank-prefixed output lines in a
    collapsible area that keeps the last ``log_lines`` lines (all lines are in ``output.log``). Below it, the figure.
    """

    def __init__(self, plot_interval_s: float = 1.0, run_dir: str | os.PathLike | None = None,
                 log_lines: int = 200, cwd: str | os.PathLike | None = None) -> None:
        super().__init__(plot_interval_s, run_dir, cwd)
        self._bars: dict[int, tuple] = {}
        self.log_stream = LogBuffer(log_lines)
        self._log_version = -1

    def _start_progress(self) -> None:
        import ipywidgets as w
        from IPython.display import display

        self._header = w.HTML(f"<b>{html.escape(_('starting torchrun ...'))}</b>")
        self._where = html.escape(f" · {where_ranks_run(self.cwd)}") if self.cwd is not None else ""
        self._rows = w.VBox([])
        self._alert = w.HTML(layout=w.Layout(display="none"))
        self._log = w.HTML(_log_html([]))
        title = _output_title(self.log_stream.maxlen, self.run_dir)  # plain text, not HTML
        self._log_box = w.Accordion(children=[self._log], titles=(title,), selected_index=0)
        self._box = w.VBox([self._header, self._rows, self._alert, self._log_box], layout=w.Layout(width="100%"))
        self._box.add_class("tutorial-lib-live")
        self._box_handle = display(self._widget_bundle(_("starting torchrun ...")), raw=True, display_id=True)

    def _widget_bundle(self, text: str) -> dict:
        """The box's display data. Its ``text/plain`` is what a notebook saved without widget state shows (plain
        papermill, nbconvert, a diff, a code review; JupyterLab draws the widget instead): ``text``, then the lines of
        the output area, so the ranks' lines are text there too."""
        data = self._box._repr_mimebundle_()
        lines, head = self.log_stream.lines(), [text]
        if lines:
            head.append(_output_title(self.log_stream.maxlen, self.run_dir) + ":")
        data["text/plain"] = "\n".join(head + lines)
        return data

    def _draw_progress(self, elapsed_s, outcome=None):
        import ipywidgets as w

        new_rank = False
        for rank in sorted(self.latest):
            r = self.latest[rank]
            if rank not in self._bars:
                bar = w.IntProgress(min=0, max=int(r.get("max_steps") or 1), description=_("rank {rank}", rank=rank))
                self._bars[rank] = (bar, w.HTML())
                new_rank = True
            bar, label = self._bars[rank]
            bar.value = int(r.get("step", 0))
            label.value = " &nbsp;&middot;&nbsp; ".join(progress_fields(r) + [f"{elapsed_s:.1f} s"])
        if new_rank:
            self._rows.children = [w.HBox(self._bars[k]) for k in sorted(self._bars)]
        if outcome is None:
            state = _("pending in the queue") if self.queued is not None and not self.latest else _("running")
            elapsed = _("elapsed {elapsed_s:.1f} s", elapsed_s=elapsed_s)
            self._header.value = f"<b style='color:inherit'>{html.escape(state)}</b> &middot; {elapsed}{self._where}"
        else:
            colour = "#c62828" if outcome.failed else "#2e7d32"
            self._header.value = f"<b style='color:{colour}'>{html.escape(outcome.text)}</b>{self._where}"
            for bar, _label in self._bars.values():
                bar.bar_style = "danger" if outcome.failed else "success"
        if self.log_stream.version != self._log_version:
            self._log_version = self.log_stream.version
            self._log.value = _log_html(self.log_stream.lines())

    def _draw_alert(self, title, details):
        """The red failure box: ``title`` in bold, then ``details`` (plain text, escaped), then where the logs are."""
        if self.run_dir:
            details = details + [_("full logs in {run_dir}: output.log (every line), logs/ (per rank), command.txt (the "
                                   "command to rerun it)", run_dir=self.run_dir)]
        body = "".join(f"<div>{html.escape(d)}</div>" for d in details)
        self._alert.value = (f"<div class='tutorial-lib-failure' style='border:2px solid #c62828;background:#ffebee;"
                             f"color:#b71c1c;padding:6px 10px;margin:4px 0;border-radius:4px'>"
                             f"<b>&#10006; {html.escape(title)}</b>{body}</div>")
        self._alert.layout.display = None

    def _draw_outcome(self, elapsed_s, outcome):
        where = [where_ranks_run(self.cwd)] if self.cwd is not None else []
        self._box_handle.update(self._widget_bundle("\n".join(self.progress_lines(elapsed_s) + where + [outcome.text])),
                                raw=True)


class LogBuffer:
    """A file-like sink keeping the last ``maxlen`` lines written (the widget view's output area)."""

    def __init__(self, maxlen: int = 200) -> None:
        self.maxlen = maxlen
        self._lines: deque[str] = deque(maxlen=maxlen)
        self._partial = ""
        self._redrawn: dict[str, str] = {}  # label -> the latest state of the line that rank redraws
        self.version = 0  # bumped on every write, so the view redraws only when something arrived

    def write(self, text: str) -> int:
        parts = (self._partial + text).split("\n")
        self._partial = parts.pop()
        self._lines.extend(parts)
        self.version += 1
        return len(text)

    def flush(self) -> None:
        pass

    def redraw(self, label: str, text: str | None) -> None:
        """Show ``text`` as the line ``label`` (``"rank 0"``) redraws in place, below the others; ``None`` removes it."""
        if text is None:
            self._redrawn.pop(label, None)
        else:
            self._redrawn[label] = f"[{label}] {text}"
        self.version += 1

    def lines(self) -> list[str]:
        """The kept lines, then each line being redrawn in its latest state."""
        return list(self._lines) + ([self._partial] if self._partial else []) + list(self._redrawn.values())


def _log_html(lines: list[str]) -> str:
    """Lines in a scrolling box about 12 lines high that stays scrolled to the newest line (column-reverse)."""
    text = html.escape("\n".join(lines) if lines else _("(no output lines yet)"))
    return ("<div class='tutorial-lib-log' style='display:flex;flex-direction:column-reverse;max-height:15em;"
            "overflow-y:auto'><pre style='flex:none;overflow:visible;margin:0;font-size:12px;line-height:1.25'>" + text + "</pre></div>")


class _Text:
    """Plain text for a display handle (text/plain only, so no HTML escaping surprises)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _output_title(maxlen: int, run_dir: str | os.PathLike | None) -> str:
    """The output area's title: how many of the ranks' last lines it keeps, and where every line is."""
    if run_dir is None:
        return _("output, rank-prefixed (the last {n} lines)", n=maxlen)
    return _("output, rank-prefixed (the last {n} lines; every line in {path})", n=maxlen,
             path=Path(run_dir) / "output.log")


def where_ranks_run(cwd: str | os.PathLike) -> str:
    """The status's words for the ranks' working folder, in the language in use."""
    return _("ranks run in {cwd}", cwd=cwd)


def make_view(mode: str = "auto", run_dir: str | os.PathLike | None = None,
              cwd: str | os.PathLike | None = None) -> LiveView:
    """Build the live view for ``mode`` (see the module docstring); ``run_dir`` is named where logs are, ``cwd`` (the
    ranks' working folder) in the status.

    Raises:
        ConfigError: unknown mode.
    """
    if mode not in LIVE_MODES:
        raise ConfigError(f"live must be one of {LIVE_MODES}, got {mode!r}")
    if mode == "auto":
        mode = os.environ.get(LIVE_ENV, "auto")
        if mode not in LIVE_MODES:
            raise ConfigError(f"${LIVE_ENV} must be one of {LIVE_MODES}, got {mode!r}")
    if mode == "off":
        return LiveView()
    if not in_jupyter_kernel():
        return TerminalView(cwd=cwd)
    if mode in ("auto", "widgets"):
        try:
            import ipywidgets  # noqa: F401

            return WidgetNotebookView(run_dir=run_dir, cwd=cwd)
        except ImportError:
            if mode == "widgets":
                raise ConfigError("live='widgets' needs ipywidgets: pip install ipywidgets") from None
    return TextNotebookView(run_dir=run_dir, cwd=cwd)


def enable_inline_figures() -> None:
    """In a Jupyter kernel, render ``matplotlib.figure.Figure`` objects as PNG when displayed.

    The library builds figures without pyplot (no global state), so IPython's inline backend never
    registers itself; this registers just the PNG formatter for ``Figure``. A no-op elsewhere.
    """
    if not in_jupyter_kernel():
        return
    from IPython import get_ipython
    from IPython.core.pylabtools import print_figure
    from matplotlib.figure import Figure

    formatter = get_ipython().display_formatter.formatters["image/png"]
    formatter.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight", dpi=90))
