"""Does this environment hold exactly the locked versions?

    python scripts/check_lock.py                     # the lock this venv was installed from (its .installed stamp)
    python scripts/check_lock.py --lock requirements/lock.txt --extras test
    python scripts/check_lock.py --json              # the comparison as JSON (the tests read it)

Walks the project's requirements through the installed distributions (importlib.metadata): its dependencies, the
extras named (``test`` by default, none with ``--extras ''``), their dependencies and so on, without entering torch
(the torch you have is reused with whatever it brought; the lock leaves it out). Each distribution met must be in the
lock (``requirements/lock.txt``, made by ``make lock``; only its lines whose markers hold here count) at the version
installed. Exit status 0 when all are, 1 otherwise, each difference printed; 2 for a lock that cannot be read or
an environment without the project.

Needs only the standard library and ``packaging`` (every environment of the project has it: pip's resolver and
transformers depend on it), so a venv without the test extra (``make compat``'s) can run it too.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "distributed-workbook"
NOT_LOCKED = {"torch"}  # yours: requirements/torch-from-your-environment.txt


def stamped_lock(prefix: str = sys.prefix) -> Path | None:
    """The lock ``make install`` (or ``make compat``) installed the venv at ``prefix`` from: the path its
    ``.installed`` stamp names, relative to the repository. None: no stamp, or one from an install without a lock."""
    stamp = Path(prefix) / ".installed"
    if not stamp.is_file() or not stamp.read_text().strip():
        return None
    return ROOT / stamp.read_text().strip()


def locked_versions(lock: Path) -> dict[str, str]:
    """The lock's ``name==version`` lines whose environment markers hold for this interpreter: canonical name ->
    version.

    Raises:
        ValueError: a line that is not ``name==version [; marker]``, naming the file and the line number.
    """
    versions = {}
    for number, line in enumerate(Path(lock).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        requirement = Requirement(text)
        pins = [s for s in requirement.specifier if s.operator == "=="]
        if len(pins) != 1 or len(requirement.specifier) != 1:
            raise ValueError(f"{lock}:{number}: {text!r} is not name==version: make lock writes the lock")
        if requirement.marker is None or requirement.marker.evaluate():
            versions[canonicalize_name(requirement.name)] = pins[0].version
    return versions


def required_distributions(project: str = PROJECT, extras: tuple[str, ...] = ("test",)) -> dict[str, str]:
    """Every installed distribution ``project`` with ``extras`` needs, through its dependencies' dependencies,
    torch's excepted: canonical name -> installed version (``"missing"`` for one not installed). The project itself
    is not in it."""
    found: dict[str, str] = {}
    todo = [(project, frozenset(extras))]
    done: set[tuple[str, frozenset]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in done:
            continue
        done.add((name, wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name == canonicalize_name(project):
                raise ValueError(f"{project} is not installed in {sys.prefix}: make install installs it") from None
            found[name] = "missing"
            continue
        if name != canonicalize_name(project):
            found[name] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            needed = requirement.marker is None or any(
                requirement.marker.evaluate({"extra": extra}) for extra in (*wanted, ""))
            key = canonicalize_name(requirement.name)
            if needed and key not in NOT_LOCKED:
                todo.append((key, frozenset(requirement.extras)))
    return found


def differences(lock: Path, extras: tuple[str, ...] = ("test",)) -> list[dict]:
    """Each required distribution whose installed version is not the lock's: name, installed, locked (None: not in
    the lock for this interpreter)."""
    locked = locked_versions(lock)
    return [{"name": name, "installed": version, "locked": locked.get(name)}
            for name, version in sorted(required_distributions(extras=extras).items())
            if locked.get(name) != version]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", type=Path, help="the lock to compare with (default: the one this venv's "
                        ".installed stamp names, else requirements/lock.txt)")
    parser.add_argument("--extras", default="test", help="comma-separated extras of the project to include "
                        "(default: test; '' for the dependencies alone)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = parser.parse_args(argv)
    lock = args.lock or stamped_lock() or ROOT / "requirements" / "lock.txt"
    extras = tuple(e for e in args.extras.split(",") if e)
    try:
        diff = differences(lock, extras)
    except (OSError, ValueError) as e:
        print(f"check_lock: {e}", file=sys.stderr)
        return 2
    checked = required_distributions(extras=extras)
    if args.json:
        print(json.dumps({"lock": str(lock), "python": sys.version.split()[0], "checked": checked,
                          "differences": diff}))
    else:
        for d in diff:
            print(f"{d['name']}: installed {d['installed']}, locked {d['locked'] or '(not in the lock here)'}")
        print(f"{len(checked) - len(diff)} of {len(checked)} required distributions equal {lock} "
              f"(Python {sys.version.split()[0]}, extras {list(extras)})")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
