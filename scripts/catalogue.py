"""The gettext catalogues of ``tutorial_lib`` (``tutorial_lib/i18n/locale/<lang>/LC_MESSAGES/tutorial_lib.po``).

Every text the library words for a learner is a gettext message in the code: ``_("...")``, ``ngettext(...)``,
``N_("...")`` (a text kept in a table, worded when shown), ``Nn_(singular, plural)`` and ``Message(...)``. Babel
extracts them (https://babel.pocoo.org/en/latest/messages.html); this script holds the catalogues against them:

    python scripts/catalogue.py check            # every message translated in every catalogue, fields kept, compiles,
                                                 # header filled in, msgfmt --check-format passes (if installed)
    python scripts/catalogue.py update           # add new messages (untranslated) to every catalogue, drop removed ones
    python scripts/catalogue.py init LANG        # a new language: a catalogue with every message, to translate

``check`` exits 1 naming each problem; ``tests/unit/test_i18n.py`` runs the same check.
"""

from __future__ import annotations

import argparse
import io
import re
import shutil
import string
import subprocess
import sys
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.extract import extract_from_dir
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tutorial_lib"
LOCALE_DIR = PACKAGE / "i18n" / "locale"
DOMAIN = "tutorial_lib"
# The marking functions (tutorial_lib.i18n) and which arguments are the msgid (and plural).
KEYWORDS = {"_": None, "N_": None, "Message": (1,), "ngettext": (1, 2), "Nn_": (1, 2)}
SKIP = ("lessons/*", "child/*", "exercises/solutions/*", "exercises/programs/*")  # run in other processes: English only


def extract(package: Path = PACKAGE) -> Catalog:
    """Every message the code marks, as a template catalogue (msgid -> the places that use it)."""
    template = Catalog(domain=DOMAIN, project="distributed-workbook")
    method_map = [(f"**/{pattern}", "ignore") for pattern in SKIP] + [("**.py", "python")]
    for filename, lineno, message, comments, context in extract_from_dir(package, method_map, keywords=KEYWORDS,
                                                                        strip_comment_tags=True):
        if message and (message[0] if isinstance(message, tuple) else message):
            template.add(message, None, [(filename, lineno)], auto_comments=comments, context=context)
    return template


def catalogue_path(lang: str, locale_dir: Path = LOCALE_DIR) -> Path:
    return locale_dir / lang / "LC_MESSAGES" / f"{DOMAIN}.po"


def read(path: Path) -> Catalog:
    with open(path, "rb") as f:
        return read_po(f)


def fields(text: str) -> set[str]:
    """The ``str.format`` fields of ``text`` (``{rank}`` -> ``rank``); none for a text without fields."""
    try:
        return {name for _, name, _, _ in string.Formatter().parse(text) if name}
    except ValueError:
        return set()


def problems(template: Catalog, catalog: Catalog, lang: str) -> list[str]:
    """What is wrong with ``catalog`` against ``template``: a message without its translation, a translation that
    drops or adds a field, a message no code uses any more, a catalogue that does not compile."""
    found = []
    for message in template:
        if not message.id:
            continue
        entry = catalog.get(message.id)
        key = message.id[0] if isinstance(message.id, tuple) else message.id
        where = ", ".join(f"{Path(f).as_posix()}:{n}" for f, n in message.locations[:2])
        if entry is None or not (entry.string if not isinstance(entry.string, tuple) else all(entry.string)):
            found.append(f"{lang}: no translation of {key!r} ({where})")
            continue
        if entry.fuzzy:
            found.append(f"{lang}: the translation of {key!r} is marked fuzzy: check it and remove the flag")
        ids = message.id if isinstance(message.id, tuple) else (message.id,)
        strings = entry.string if isinstance(entry.string, tuple) else (entry.string,)
        wanted = set().union(*map(fields, ids)) if any(map(fields, ids)) else set()
        for text in strings:
            if fields(text) != wanted and (wanted or fields(text)):
                found.append(f"{lang}: the translation of {key!r} has the fields {sorted(fields(text))}, its English "
                             f"{sorted(wanted)}")
    used = {m.id if not isinstance(m.id, tuple) else m.id[0] for m in template if m.id}
    for entry in catalog:
        key = entry.id[0] if isinstance(entry.id, tuple) else entry.id
        if entry.id and key not in used:
            found.append(f"{lang}: {key!r} is in the catalogue but no code uses it (python scripts/catalogue.py update)")
    try:
        write_mo(io.BytesIO(), catalog)
    except Exception as e:  # noqa: BLE001 - any failure to compile is the finding
        found.append(f"{lang}: the catalogue does not compile: {e}")
    return found


# Header fields a translator fills (init leaves Babel's placeholders in them): a catalogue still holding one of these is
# reported by check.
HEADER_PLACEHOLDERS = {"PO-Revision-Date": "YEAR-MO-DA", "Last-Translator": "FULL NAME", "Language-Team": "<LL@li.org>"}


def header_problems(path: Path, lang: str) -> list[str]:
    """The header fields of the catalogue at ``path`` that still hold Babel's placeholder (``HEADER_PLACEHOLDERS``)."""
    text = path.read_text(encoding="utf-8")
    return [f"{lang}: the header field {name} is not filled in (it says {value!r}): set it to the date of the last "
            f"translation, the translator or team" for name, value in HEADER_PLACEHOLDERS.items()
            if re.search(rf'^"{re.escape(name)}: [^\n]*{re.escape(value)}', text, re.M)]


def msgfmt_problems(path: Path, lang: str) -> list[str]:
    """What GNU gettext's ``msgfmt --check-format`` finds in the catalogue at ``path`` (a flag such as
    ``python-format`` on a message whose ``%`` is not a directive fails it); none where msgfmt is not installed."""
    msgfmt = shutil.which("msgfmt")
    if msgfmt is None:
        return []
    result = subprocess.run([msgfmt, "--check-format", "-o", "/dev/null", str(path)], capture_output=True, text=True)
    if result.returncode == 0:
        return []
    return [f"{lang}: msgfmt --check-format: {line}" for line in result.stderr.splitlines()
            if line.strip() and not re.search(r"found \d+ fatal errors?$", line)]  # not its count of them


def check(locale_dir: Path = LOCALE_DIR) -> list[str]:
    """Every catalogue under ``locale_dir`` against the code's messages (``problems``), its header filled in, and
    ``msgfmt --check-format`` where gettext is installed."""
    template = extract()
    found = []
    for path in sorted(locale_dir.glob(f"*/LC_MESSAGES/{DOMAIN}.po")):
        lang = path.parents[1].name
        found += problems(template, read(path), lang) + header_problems(path, lang) + msgfmt_problems(path, lang)
    return found


def format_flags(catalog: Catalog) -> None:
    """No message is a %-format (the library fills fields with ``str.format``): Babel flags ``python-format`` on any
    msgid with a ``%`` that reads as a directive (``sinfo -o '%N %c %m'``, ``%%writefile``, ``within {percent:g}% of``),
    so msgfmt would check the msgstr's ``%`` against it. Such a message is flagged ``no-python-format`` instead, on
    every write (Babel adds the flag again whenever it reads or extracts the message)."""
    for message in catalog:
        if message.id and "python-format" in message.flags:
            message.flags.discard("python-format")
            message.flags.add("no-python-format")


def write(path: Path, catalog: Catalog) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    format_flags(catalog)
    with open(path, "wb") as f:
        write_po(f, catalog, width=120, omit_header=False, sort_output=False, include_lineno=False)


def update(locale_dir: Path = LOCALE_DIR) -> None:
    """Every catalogue: the code's messages added (untranslated), the ones no code uses dropped."""
    template = extract()
    for path in sorted(locale_dir.glob(f"*/LC_MESSAGES/{DOMAIN}.po")):
        catalog = read(path)
        catalog.update(template, no_fuzzy_matching=True)
        catalog.obsolete.clear()
        write(path, catalog)
        print(f"updated {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def init(lang: str, locale_dir: Path = LOCALE_DIR) -> Path:
    """A new catalogue for ``lang`` with every message to translate; an existing one is never overwritten."""
    if not re.fullmatch(r"[a-z]{2,3}(_[A-Z]{2})?", lang):
        raise SystemExit(f"language {lang!r}: use a code such as 'ja', 'fr' or 'pt_BR'")
    if lang == "en":
        raise SystemExit("'en' is the messages' own language (the msgids): it needs no catalogue")
    path = catalogue_path(lang, locale_dir)
    if path.exists():
        raise SystemExit(f"{path} exists already: python scripts/catalogue.py update adds new messages to it")
    catalog = Catalog(locale=lang, domain=DOMAIN, project="distributed-workbook", fuzzy=False)
    catalog.update(extract(), no_fuzzy_matching=True)
    write(path, catalog)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="every message translated in every catalogue, fields kept, compiles")
    sub.add_parser("update", help="add new messages to every catalogue, drop the ones no code uses")
    sub.add_parser("init", help="a new language's catalogue").add_argument("lang")
    args = parser.parse_args(argv)
    if args.command == "check":
        found = check()
        print("\n".join(found) or "every catalogue has every message, with its fields, and compiles")
        return 1 if found else 0
    if args.command == "update":
        update()
        return 0
    print(f"wrote {init(args.lang)}: translate its msgstr entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
