"""The language of what a learner reads from the library in a cell, and the gettext catalogues that word it.

Three texts follow the language: the doctor's report (``tl.diagnose``: its labels, the suspected cause and the fix),
the live view's status line and failure box (``tutorial_lib.launcher.live``), and the launcher's one-line failure
summary shown there. Everything else stays English: exceptions' messages, ``LaunchError.summary`` and
``Diagnosis.cause``/``fix`` (programs and the notebooks' asserts read them), log lines, tables and figures.

Every such text is a gettext message (https://docs.python.org/3/library/gettext.html): its English is the msgid, with
named fields (``_("rank {rank} exited with code {code}", rank=1, code=3)``; ``ngettext`` where a count decides the
form), and each other language is one catalogue, ``locale/<lang>/LC_MESSAGES/tutorial_lib.po`` beside this file (Chinese:
``locale/zh/``). A language is one new ``.po`` file: ``languages()`` lists every catalogue found, and
``python scripts/catalogue.py init LANG`` writes a new one with every message to translate (Babel extracts them from
the code; ``scripts/catalogue.py check`` and ``tests/unit/test_i18n.py`` fail on a message without its translation, a
translation that drops a field, a header left unfilled, or a catalogue that does not compile or that ``msgfmt
--check-format`` refuses). A catalogue is compiled when it is first used,
with Babel, in memory: no ``.mo`` file is built, installed or left stale, and an editable install or a source
checkout reads the same text.

A text kept to be shown later (a ``LaunchError``'s summary, a ``Diagnosis``'s cause and fix) is a ``Message``: the
msgid and its fields, worded in the language in use each time it is shown; ``str(message)`` is its English.

The Chinese notebooks (``notebooks/zh/``) have the English notebooks' code cells, so they cannot ask for Chinese in a
cell of their own. The language is chosen when ``tl.setup_notebook`` runs (every notebook's setup cell calls it;
``notebook_language``): ``$TUTORIAL_LIB_LANG`` if set, else ``"zh"`` when the kernel runs in a folder named ``zh``
(JupyterLab, nbval and ``scripts/run_workbook.py --notebooks-dir notebooks/zh`` start the kernel in the notebook's
folder), else ``"en"``. ``tl.set_language`` overrides it at any time. Importing the package changes nothing: until
one of them runs, ``language()`` is ``$TUTORIAL_LIB_LANG`` or ``"en"``.
"""

from __future__ import annotations

import functools
import gettext
import io
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

DOMAIN = "tutorial_lib"
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
SOURCE_LANGUAGE = "en"  # the msgids' language: no catalogue
LANG_ENV = "TUTORIAL_LIB_LANG"
LOCALE_DIR_ENV = "TUTORIAL_LIB_LOCALE_DIR"  # a catalogue folder other than LOCALE_DIR (active_locale_dir)
EDITION_FOLDER = "zh"  # notebooks/zh/: the Chinese edition's notebooks (scripts/twins.py)

_chosen: list[str] = []  # the language set by set_language or setup_notebook; empty until then


def languages(locale_dir: str | os.PathLike | None = None) -> tuple[str, ...]:
    """The languages the library speaks: English (the msgids) and every language with a catalogue
    (``<locale_dir>/<lang>/LC_MESSAGES/tutorial_lib.po``; default ``LOCALE_DIR``), e.g. ``("en", "zh")``."""
    folder = Path(locale_dir) if locale_dir is not None else active_locale_dir()
    found = sorted(p.parents[1].name for p in folder.glob(f"*/LC_MESSAGES/{DOMAIN}.po"))
    return (SOURCE_LANGUAGE, *[lang for lang in found if lang != SOURCE_LANGUAGE])


def check_language(lang: object, source: str = "language") -> str:
    """``lang`` if it is one of ``languages()``, else a ``ConfigError`` naming it (``source``: where it came from)."""
    known = languages()
    if lang not in known:
        raise ConfigError(f"{source} must be one of {', '.join(map(repr, known))} (a language other than English needs "
                          f"a catalogue in {active_locale_dir()}: python scripts/catalogue.py init LANG), got {lang!r}")
    return lang


def set_language(lang: str) -> None:
    """Choose the language of the doctor's report, the live view's status line and failure box, and the launcher's
    failure summary shown there; every other text stays English.

    Args:
        lang: ``"en"`` (English), ``"zh"`` (简体中文), or another language with a catalogue (``languages()``).

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


def has_cjk(text: str) -> bool:
    """Whether ``text`` holds a CJK ideograph (U+4E00..U+9FFF)."""
    return re.search(r"[\u4e00-\u9fff]", text) is not None


def N_(msgid: str) -> str:
    """Mark ``msgid`` as a message without translating it (``gettext_noop``): for texts kept in tables (a cause's
    name and fix) and worded when shown (``_(text)``, ``Message(text)``). Babel's extraction finds it."""
    return msgid


def Nn_(singular: str, plural: str) -> tuple[str, str]:
    """Mark a singular and plural pair as one message without translating it (for ``Message(singular, fields,
    plural, n)``, worded by ``ngettext`` when shown). Babel's extraction finds it."""
    return singular, plural


@functools.lru_cache(maxsize=None)
def _compiled(po_path: Path, mtime_ns: int) -> gettext.NullTranslations:
    """The catalogue ``po_path`` compiled in memory (Babel's ``read_po`` and ``write_mo``), cached per version."""
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    with open(po_path, "rb") as f:
        catalog = read_po(f)
    buffer = io.BytesIO()
    write_mo(buffer, catalog)
    buffer.seek(0)
    return gettext.GNUTranslations(buffer)


def translations(lang: str | None = None, locale_dir: str | os.PathLike | None = None) -> gettext.NullTranslations:
    """The gettext translations of ``lang`` (default: ``language()``): English, the msgids, needs none
    (``NullTranslations``); another language's catalogue is compiled on first use.

    Args:
        lang: a language of ``languages(locale_dir)``.
        locale_dir: the folder of the catalogues (default ``LOCALE_DIR``).

    Raises:
        ConfigError: ``lang`` has no catalogue there.
        babel.messages.pofile.PoFileError: the catalogue does not parse (the test suite compiles every one).
    """
    lang = language() if lang is None else lang
    if lang == SOURCE_LANGUAGE:
        return gettext.NullTranslations()
    folder = Path(locale_dir) if locale_dir is not None else active_locale_dir()
    po_path = folder / lang / "LC_MESSAGES" / f"{DOMAIN}.po"
    if not po_path.is_file():
        raise ConfigError(f"no catalogue for language {lang!r}: {po_path} does not exist; languages: "
                          f"{', '.join(languages(folder))}")
    return _compiled(po_path.resolve(), po_path.stat().st_mtime_ns)


# A catalogue folder other than LOCALE_DIR (tests of a new language); None: LOCALE_DIR.
_locale_dir: list[Path] = []


def active_locale_dir() -> Path:
    """The folder the catalogues are read from: the one ``use_locale_dir`` set, else ``$TUTORIAL_LIB_LOCALE_DIR``
    (a kernel's, e.g. a notebook run under a test's pseudo-language catalogue), else ``LOCALE_DIR``."""
    if _locale_dir:
        return _locale_dir[0]
    value = os.environ.get(LOCALE_DIR_ENV)
    return Path(value) if value else LOCALE_DIR


def use_locale_dir(folder: str | os.PathLike | None) -> None:
    """Read the catalogues from ``folder`` (``None``: ``LOCALE_DIR`` again), e.g. to try a new language's ``.po`` in a
    folder of its own before it is added to the package."""
    _locale_dir[:] = [Path(folder)] if folder is not None else []


@dataclass(frozen=True)
class Message:
    """A text worded when shown: a gettext msgid (its English) and the values of its named fields.

    ``render()`` words it in the language in use (``render("zh")`` in that one); ``str(message)`` is the English.
    A field that is itself a ``Message`` (or ``Joined``) is worded in the same language.

    Attributes:
        msgid: the English text, a ``str.format`` template when ``fields`` is not empty (``"rank {rank} failed"``).
        fields: the fields' values (``{"rank": 1}``).
        plural: the English plural form for ``ngettext`` (``"ranks {ranks} failed"``), or ``""``.
        n: the count that picks singular or plural (with ``plural``).
    """

    msgid: str
    fields: Mapping[str, object] = field(default_factory=dict)
    plural: str = ""
    n: int = 1

    def render(self, lang: str | None = None) -> str:
        """This text in ``lang`` (default ``language()``), its fields filled in."""
        if not self.msgid:
            return ""  # gettext("") is the catalogue's header
        lang = language() if lang is None else lang
        catalogue = translations(lang)
        text = catalogue.ngettext(self.msgid, self.plural, self.n) if self.plural else catalogue.gettext(self.msgid)
        if not self.fields:
            return text
        return text.format(**{k: v.render(lang) if isinstance(v, (Message, Joined)) else v
                              for k, v in self.fields.items()})

    def __str__(self) -> str:
        return self.render(SOURCE_LANGUAGE)

    def __add__(self, other: object) -> Joined:
        return Joined((self, other))


@dataclass(frozen=True)
class Joined:
    """Texts shown one after the other, with a separator message between them (``", "``, worded as any message;
    ``""`` for none)."""

    parts: tuple
    sep: str = ""

    def render(self, lang: str | None = None) -> str:
        lang = language() if lang is None else lang
        sep = translations(lang).gettext(self.sep) if self.sep else ""
        return sep.join(render(p, lang) for p in self.parts)

    def __str__(self) -> str:
        return self.render(SOURCE_LANGUAGE)

    def __add__(self, other: object) -> Joined:
        return Joined((self, other))


def joined(parts: Iterable[object], sep: str = ", ") -> Joined:
    """``parts`` shown with ``sep`` between them (``sep`` is a message: ``", "`` is ``"，"`` in Chinese)."""
    return Joined(tuple(parts), sep)


def render(text: object, lang: str | None = None) -> str:
    """``text`` in ``lang`` (default ``language()``): a ``Message`` or ``Joined`` is worded, anything else (a path, a
    log line, a number) is shown as it is."""
    return text.render(lang) if isinstance(text, (Message, Joined)) else str(text)


def _(msgid: str, **fields: object) -> str:
    """``msgid`` in the language in use, its named fields filled in (``_("rank {rank} failed", rank=1)``)."""
    return Message(msgid, fields).render()


def ngettext(singular: str, plural: str, n: int, **fields: object) -> str:
    """``singular`` or ``plural`` (as the language's plural rule picks for ``n``) in the language in use, its named
    fields filled in (``ngettext("rank {ranks} returned", "ranks {ranks} returned", 2, ranks="0, 1")``)."""
    return Message(singular, fields, plural, n).render()
