"""Can pip reach the package index it was given? `make` runs this before pip installs anything.

    python scripts/check_index.py        # exit 0: every index in PIP_INDEX_URL / PIP_EXTRA_INDEX_URL answers

A mirror that cannot be reached (a typo, a mirror down, no route from the box) made pip retry for about 1.5 minutes
and then say only "No matching distribution found for nvidia-ml-py>=12.0", 79 lines below the one line naming the
index. This asks each index once (an HTTP GET of its page for pip, 15 s at most) and, when one does not answer, says
which and what to do, before pip starts. Any HTTP answer counts as reachable (a mirror may answer 404 for a page it
does not have); a ``file://`` index must be an existing folder. With neither variable set, pip's own configuration
decides and nothing is asked. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

TIMEOUT_S = 15.0


def masked(url: str) -> str:
    """``url`` with any ``user:password@`` hidden."""
    return re.sub(r"//[^/@]*@", "//***@", url)


def unreachable(url: str, timeout_s: float = TIMEOUT_S) -> str | None:
    """Why ``url`` (a PEP 503 simple index) cannot be reached, or ``None`` when it answers."""
    parts = urllib.parse.urlparse(url)
    if parts.scheme == "file":
        return None if os.path.isdir(urllib.request.url2pathname(parts.path)) else "no such folder"
    if parts.scheme not in ("http", "https"):
        return f"not an http(s) or file address (scheme {parts.scheme!r})"
    page = url.rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(urllib.request.Request(page, headers={"User-Agent": "pip"}), timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason


def main() -> int:
    found = []
    for variable in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        for url in os.environ.get(variable, "").split():
            why = unreachable(url)
            if why is not None:
                found.append(f"{variable}={masked(url)} could not be reached ({why})")
    for line in found:
        print(f"pip index: {line}.", file=sys.stderr)
    if found:
        print("Check the address (README.zh-CN.md, section 1, lists two mirrors), or unset the variable to use pip's "
              "own configuration: nothing was installed.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
