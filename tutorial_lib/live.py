"""The live view of a running job: per-rank progress and the loss/memory figure, updated in place.

Modes (``LaunchSpec.live``, or the ``TUTORIAL_LIB_LIVE`` environment variable for ``"auto"``):

* ``"widgets"``: in a Jupyter kernel, an ipywidgets progress bar per rank plus the figure;
* ``"text"``: in a Jupyter kernel, a plain-text progress table plus the figure, both updated in
  place through display handles (what papermill and nbval store); in a terminal, a progress
  line every few seconds;
* ``"off"``: nothing.

``"auto"`` picks widgets in a Jupyter kernel with ipywidgets installed, else text.
"""

from __future__ import annotations

import os
import sys

import pandas as pd

from .errors import ConfigError
from .plots import plot_run

LIVE_MODES = ("auto", "widgets", "text", "off")
LIVE_ENV = "TUTORIAL_LIB_LIVE"


def in_jupyter_kernel() -> bool:
    """True when running inside an IPython kernel (a notebook), not a terminal IPython or plain Python."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and hasattr(shell, "kernel")


def progress_fields(record: dict) -> list[str]:
    """``step i/n``, and ``loss`` and ``samples/s`` when the script reports them, from one metrics record."""
    fields = [f"step {record.get('step')}/{record.get('max_steps', '?')}"]
    if "loss_local" in record:
        fields.append(f"loss {record['loss_local']:.4f}")
    if "samples_per_s" in record:
        fields.append(f"samples/s {record['samples_per_s']:.0f}")
    return fields


class LiveView:
    """Base view: collects records; subclasses draw them. ``update`` is called a few times a second."""

    def __init__(self) -> None:
        self.latest: dict[int, dict] = {}  # rank -> newest metrics record
        self.records: list[dict] = []

    def add(self, records: list[dict]) -> None:
        """Take new metrics records (one dict per rank per step, as the scripts write them)."""
        for r in records:
            self.records.append(r)
            if r.get("step", -1) >= self.latest.get(r.get("rank"), {}).get("step", -1):
                self.latest[r.get("rank")] = r

    def progress_lines(self, elapsed_s: float) -> list[str]:
        """One line per rank with its newest step, loss and samples/s."""
        lines = []
        for rank in sorted(self.latest):
            lines.append(f"rank {rank}: " + "  ".join(progress_fields(self.latest[rank])))
        return lines or [f"running, no step reported yet ({elapsed_s:.0f} s)"]

    def start(self) -> None:
        """Show the (empty) view, before the job starts."""

    def update(self, elapsed_s: float, rss_samples: list[dict], final: bool = False) -> None:
        """Redraw with the records so far; ``rss_samples`` are the memory sampler's rows; throttled by the view."""

    def finish(self, elapsed_s: float, rss_samples: list[dict], status: str) -> None:
        """Draw the final state with a one-line ``status`` ("finished in 4.2 s", "failed: ...")."""


class TerminalView(LiveView):
    """A progress line on stdout every ``interval_s`` seconds (and at the end)."""

    def __init__(self, interval_s: float = 3.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._last = 0.0

    def update(self, elapsed_s, rss_samples, final=False):
        if final or elapsed_s - self._last >= self.interval_s:
            self._last = elapsed_s
            sys.stdout.write(f"[progress {elapsed_s:5.1f} s] " + " | ".join(self.progress_lines(elapsed_s)) + "\n")

    def finish(self, elapsed_s, rss_samples, status):
        if self.latest:
            self.update(elapsed_s, rss_samples, final=True)
        sys.stdout.write(f"[launcher] {status}\n")


class NotebookView(LiveView):
    """Progress (widgets or text) and the loss/memory figure, each redrawn in place via a display handle."""

    def __init__(self, widgets: bool, plot_interval_s: float = 1.0) -> None:
        super().__init__()
        self.use_widgets = widgets
        self.plot_interval_s = plot_interval_s
        self._last_plot = -1e9
        self._plotted_records = -1
        self._bars: dict[int, tuple] = {}

    def start(self):
        from IPython.display import display

        if self.use_widgets:
            import ipywidgets as w

            self._box = w.VBox([w.HTML("<b>starting torchrun ...</b>")])
            display(self._box)
        else:
            self._progress = display(_Text("starting torchrun ..."), display_id=True)
        self._plot = display(_Text("(the loss and memory plot appears with the first step)"), display_id=True)

    def _draw_progress(self, elapsed_s, status=None):
        if not self.use_widgets:
            text = "\n".join(self.progress_lines(elapsed_s) + [f"elapsed {elapsed_s:.1f} s" + (f" - {status}" if status else "")])
            self._progress.update(_Text(text))
            return
        import ipywidgets as w

        for rank in sorted(self.latest):
            r = self.latest[rank]
            if rank not in self._bars:
                bar = w.IntProgress(min=0, max=int(r.get("max_steps") or 1), description=f"rank {rank}")
                label = w.HTML()
                self._bars[rank] = (bar, label)
            bar, label = self._bars[rank]
            bar.value = int(r.get("step", 0))
            label.value = " &nbsp; ".join(progress_fields(r) + [f"{elapsed_s:.1f} s"])
        header = w.HTML(f"<b>{status or 'running'}</b> ({elapsed_s:.1f} s)")
        self._box.children = [header] + [w.HBox(self._bars[k]) for k in sorted(self._bars)]
        if status and status.startswith("failed"):
            for bar, _ in self._bars.values():
                bar.bar_style = "danger"
        elif status:
            for bar, _ in self._bars.values():
                bar.bar_style = "success"

    def _draw_plot(self, rss_samples, final=False):
        if not self.records:
            if final:
                self._plot.update(_Text("(no per-step metrics: this script writes none)"))
            return
        fig = plot_run(pd.DataFrame(self.records), pd.DataFrame(rss_samples) if rss_samples else None)
        self._plot.update(fig)
        self._plotted_records = len(self.records)

    def update(self, elapsed_s, rss_samples, final=False):
        self._draw_progress(elapsed_s)
        if (final or elapsed_s - self._last_plot >= self.plot_interval_s) and len(self.records) != self._plotted_records:
            self._last_plot = elapsed_s
            self._draw_plot(rss_samples)

    def finish(self, elapsed_s, rss_samples, status):
        self._draw_progress(elapsed_s, status)
        self._plotted_records = -1
        self._draw_plot(rss_samples, final=True)


class _Text:
    """Plain text for a display handle (text/plain only, so no HTML escaping surprises)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def make_view(mode: str = "auto") -> LiveView:
    """Build the live view for ``mode`` (see the module docstring).

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
        return TerminalView()
    if mode in ("auto", "widgets"):
        try:
            import ipywidgets  # noqa: F401

            return NotebookView(widgets=True)
        except ImportError:
            if mode == "widgets":
                raise ConfigError("live='widgets' needs ipywidgets: pip install ipywidgets") from None
    return NotebookView(widgets=False)


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
