"""The learner's own copy of the notebooks, outside the tracked files: what `make lab` and `make kernel` open.

    python scripts/working_copy.py                       # notebooks/*.ipynb -> my-notebooks/ (made on first use)
    python scripts/working_copy.py --edition zh          # notebooks/zh/*.ipynb -> my-notebooks/zh/
    python scripts/working_copy.py --to DIR              # another folder

JupyterLab saves a notebook as it is edited and run. Opened from ``notebooks/``, it wrote the learner's edits and
every output into the tracked files (04_fsdp.ipynb grew from 46 KB to 531 KB), and the next ``git pull`` conflicted.
So the lab opens a working copy instead (``my-notebooks/``, ignored by git), made on first use; the Chinese edition's
copy keeps its folder name ``zh`` (the notebooks pick their language from it).

Later runs take the workbook's new versions without losing the learner's work. A record beside the copies
(``.workbook-copies.json``) keeps the SHA-1 of each notebook as it was copied. For each notebook of the edition:

* not copied yet (a new notebook, or one the learner deleted to take it afresh): copied;
* unchanged in the workbook since it was copied: left alone;
* changed in the workbook, and the learner's copy is still byte for byte what was copied: replaced by the new version;
* changed in the workbook, and the learner's copy changed too (edited, or run and saved): kept; the new version is
  written to ``updates/NAME.ipynb`` beside it, and the script says how many cells differ from the learner's copy
  (delete the copy and run again to take the new version whole).

Standard library only (``json``, ``hashlib``): it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ".workbook-copies.json"
UPDATES = "updates"


def sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def cells_differing(mine: Path, new: Path) -> int:
    """How many cells (by cell id, else by position) differ in source between two notebooks, counting cells only
    one of them has."""
    def sources(path: Path) -> dict:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        return {c.get("id", str(i)): "".join(c.get("source", "")) for i, c in enumerate(cells)}
    a, b = sources(mine), sources(new)
    return sum(a.get(key) != b.get(key) for key in set(a) | set(b))


def update(source_dir: Path, target_dir: Path) -> list[str]:
    """Bring the working copy ``target_dir`` up to ``source_dir``'s notebooks (see the module docstring); returns one
    line per notebook that was copied, replaced or has a new version waiting (nothing for those left alone).

    Raises:
        FileNotFoundError: ``source_dir`` holds no notebook.
        OSError: ``target_dir`` cannot be written.
    """
    sources = sorted(source_dir.glob("*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no notebook in {source_dir}: run this from the workbook's checkout")
    target_dir.mkdir(parents=True, exist_ok=True)
    record_path = target_dir / RECORD
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    now = datetime.datetime.now().isoformat(timespec="seconds")
    said = []
    for source in sources:
        mine, new_sha = target_dir / source.name, sha1(source)
        copied = record.get(source.name, {})
        if not mine.exists():
            shutil.copyfile(source, mine)
            said.append(f"copied   {mine}")
        elif copied.get("sha1") == new_sha:
            continue
        elif sha1(mine) == new_sha:  # the learner's copy already is the new version (taken from updates/)
            said.append(f"updated  {mine} (your copy already is the new version)")
        elif copied.get("sha1") == sha1(mine):  # the learner never changed it: take the new version
            shutil.copyfile(source, mine)
            said.append(f"updated  {mine} (a new version; you had not changed your copy)")
        else:
            waiting = target_dir / UPDATES / source.name
            waiting.parent.mkdir(exist_ok=True)
            shutil.copyfile(source, waiting)
            n = cells_differing(mine, source)
            said.append(f"kept     {mine}: your copy has your work; the workbook's new version is {waiting} "
                        f"({n} cell{'s' if n != 1 else ''} differ from yours). Delete your copy and run this again to "
                        "take the new version whole.")
            continue  # the record keeps the version the learner's copy came from
        record[source.name] = {"sha1": new_sha, "copied": now}
    record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edition", choices=["en", "zh"], default="en",
                        help="en: notebooks/ -> DIR/; zh: notebooks/zh/ -> DIR/zh/")
    parser.add_argument("--to", default=str(ROOT / "my-notebooks"), help="the working copy's folder (default: "
                        "my-notebooks/ in the checkout, which git ignores)")
    args = parser.parse_args(argv)
    source = ROOT / "notebooks" / ("zh" if args.edition == "zh" else "")
    target = Path(args.to) / ("zh" if args.edition == "zh" else "")
    try:
        said = update(source, target)
    except OSError as e:
        print(f"working copy: {e}", file=sys.stderr)
        return 2
    for line in said:
        print(f"working copy: {line}")
    print(f"working copy: your notebooks are in {target} (edits and outputs stay there; notebooks/ is never written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
