"""The text a figure draws in the language in use: the Chinese edition's glosses.

Axis labels, legends and short titles stay English in every edition. In the Chinese edition (``tl.language()`` is
``"zh"``) the warning notes drawn inside the memory plot and the sentence-like titles (``GLOSSED_TITLES``) get their
Chinese from the catalogue on a second line, drawn with a CJK font: the first of ``CJK_FONTS`` installed (Debian:
``apt-get install fonts-wqy-microhei``; ``.ci/run`` installs it). Without one they stay English, and the first figure
that would have had a gloss warns once, in the language in use, naming the package to install.

Where a figure's text stands: legends outside the axes, never over the data (``legend_outside``), and whole-number
ticks on a step axis (``step_axis``).
"""

from __future__ import annotations

import functools
import textwrap
import warnings

import pandas as pd
from matplotlib.ticker import MaxNLocator

from ..i18n import N_, language, translations

# CJK fonts, in order of preference (matplotlib family names); the glyphs of the Chinese glosses come from the first found.
CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Noto Sans CJK JP",
             "SimHei", "Microsoft YaHei", "PingFang SC")
CJK_FONT_FILES = ("wqy", "notosanscjk", "sourcehansans", "simhei", "msyh", "pingfang")
# Titles that say something (not just name the axes): the Chinese edition shows each one's Chinese under it. The
# notebooks pass some of these (the same code in both editions); the library's own defaults are the others.
GLOSSED_TITLES = (
    N_("activation checkpointing: memory vs time"),
    N_("rank 1 killed in the step-6 save; restarted from step-3 (DCP)"),
    N_("communication vs computation (medians per step)"),
    N_("HSDP: who holds what, who reduces what"),
    N_("bucket_cap_mb: largest bucket against all-reduces per step (rank 0)"),
    N_("reshard_after_forward: memory held against all-gathers"),
    N_("state per rank: predicted vs measured"),
    N_("loss across attempts"),
    N_("pipeline schedule per stage"),
    N_("profiled steps per rank"),
)
# Worded in the notebook's language (a message: the reader of the Chinese edition reads Chinese).
NO_CJK_FONT_WARNING = N_("no CJK font is installed, so the figures' Chinese glosses are left out (English only); "
                         "install one, e.g. apt-get install fonts-wqy-microhei, and restart the kernel")


@functools.cache
def cjk_font() -> str | None:
    """The family name of an installed CJK font (``CJK_FONTS``, in order), or ``None``. Fonts installed after
    matplotlib built its font cache are found by file name (``CJK_FONT_FILES``) and added."""
    from matplotlib import font_manager

    def known() -> str | None:
        names = {f.name for f in font_manager.fontManager.ttflist}
        return next((name for name in CJK_FONTS if name in names), None)

    if known() is None:
        for path in font_manager.findSystemFonts():
            if any(key in path.lower().replace("-", "").replace("_", "") for key in CJK_FONT_FILES):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):
                    continue
    return known()


@functools.cache
def _warn_no_cjk_font(lang: str) -> None:
    """Warn once per language that the glosses are left out, in that language (``NO_CJK_FONT_WARNING``)."""
    warnings.warn(translations(lang).gettext(NO_CJK_FONT_WARNING), UserWarning, stacklevel=4)


def gloss(text: str, width: int = 0) -> tuple[str, dict]:
    """``text`` as a figure shows it in the language in use, and the text properties to draw it with.

    In the Chinese edition a text the catalogue translates (a note, a ``GLOSSED_TITLES`` title) gets its Chinese on
    the next line, drawn with ``cjk_font()`` as the fallback font; elsewhere, or without a CJK font (warned once), the
    English alone. ``width``: wrap the English at this many characters and the Chinese at half as many (0: no wrap).
    """
    english = textwrap.fill(text, width) if width else text
    lang = language()
    if lang == "en":
        return english, {}
    worded = translations(lang).gettext(text)
    if worded == text:
        return english, {}
    font = cjk_font()
    if font is None:
        _warn_no_cjk_font(lang)
        return english, {}
    chinese = "\n".join(textwrap.wrap(worded, max(width // 2, 1))) if width else worded
    return f"{english}\n{chinese}", {"fontfamily": ["DejaVu Sans", font]}


def set_title(ax, title: str, **kwargs) -> None:
    """``ax.set_title`` with the title's gloss in the Chinese edition (``gloss``)."""
    text, props = gloss(title)
    ax.set_title(text, **props, **kwargs)


def legend_outside(ax, title: str = "", **kwargs):
    """``ax``'s legend to the right of the axes, outside them, so it never covers the data; the figure's
    constrained layout makes room for it. ``title``: the legend's title, glossed in the Chinese edition
    (``gloss``); ``kwargs``: more of ``Axes.legend``'s (``fontsize`` 8 unless
    given). Returns the ``Legend``, or ``None`` when ``ax`` has nothing labelled."""
    if not ax.get_legend_handles_labels()[0] and "handles" not in kwargs:
        return None
    options = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0, "fontsize": 8, **kwargs}
    if title:
        text, props = gloss(title)
        options.update(title=text, title_fontproperties={"size": options["fontsize"],
                                                         **({"family": props["fontfamily"]} if props else {})})
        options.setdefault("alignment", "left")
    return ax.legend(**options)


def step_axis(ax, steps) -> None:
    """Whole-number ticks on ``ax``'s x axis of training steps (a 4-step run gets 1, 2, 3, 4, never 1.0, 1.5, ...);
    a run of one step gets that step as its only tick. ``steps``: the steps drawn."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    unique = pd.unique(pd.Series(steps).dropna())
    if len(unique) == 1:
        ax.set_xticks(unique)
    ax.set_xlabel("step")
