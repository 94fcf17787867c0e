"""A PyPI mirror reaches every pip that `make` runs (README.zh-CN.md, issue 38).

The Chinese README tells readers behind a slow route to PyPI to export ``PIP_INDEX_URL`` (Tsinghua's or Aliyun's
mirror) before ``make``: pip reads it from the environment, make hands its environment to every recipe, and no
recipe names an index of its own. Here the mirror is a stand-in: a small HTTP server on 127.0.0.1 that answers
every PEP 503 project page with an empty list (a mirror that has not synced yet) and logs what pip asked for.
``make install`` runs in a copy of the Makefile, pyproject.toml and the lock with a fresh VENV and no pip configuration
file (this machine's own indexes out of the way); it creates the venv, then its first pip asks the stand-in and
stops there, so nothing is downloaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class StandInIndex:
    """A PEP 503 simple index on 127.0.0.1 with no files; ``requests`` lists (path, User-Agent) of each GET."""

    def __init__(self) -> None:
        requests: list[tuple[str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                requests.append((self.path, self.headers.get("User-Agent", "")))
                name = re.fullmatch(r"/simple/([^/]+)/?", self.path)
                body = (f"<!DOCTYPE html><html><body><!-- {name[1]}: not synced yet --></body></html>" if name
                        else "<!DOCTYPE html><html><body></body></html>").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.requests = requests
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_no_make_recipe_names_a_pip_index():
    """Every pip command in the Makefile takes its index from pip's environment and configuration."""
    pip_lines = [line for line in (ROOT / "Makefile").read_text().splitlines() if "pip install" in line]
    assert len(pip_lines) >= 5, pip_lines  # install (torch, the project), compat (2), lab, bench
    for line in pip_lines:
        assert not re.search(r"--index-url|--extra-index-url|--no-index|--find-links|\s-i\s|\s-f\s", line), line


@pytest.mark.timeout(120)
def test_make_install_asks_the_index_in_pip_index_url(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "requirements", project / "requirements")  # the lock every install takes (-c)
    (project / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "check_index.py", project / "scripts")  # make asks the index first
    venv = tmp_path / "fresh-venv"
    dropped = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PYTHONPATH", "PYTHONWARNINGS")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in dropped}
    with StandInIndex() as index:
        env.update(PIP_INDEX_URL=index.url, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PIP_DEFAULT_TIMEOUT="5", PIP_RETRIES="0")
        out = subprocess.run(["make", "--no-print-directory", "install", f"PYTHON={sys.executable}", f"VENV={venv}"],
                             cwd=project, env=env, capture_output=True, text=True, timeout=100)
    said = out.stdout + out.stderr
    assert out.returncode != 0, f"the stand-in has no files, so the install cannot finish:\n{said}"
    assert f"pip index (PIP_INDEX_URL): {index.url}" in said, f"make says which index pip is given:\n{said}"
    assert (venv / "bin" / "python").exists(), said
    assert f"Looking in indexes: {index.url}" in said, f"pip, run by make's recipe, used the stand-in:\n{said}"
    asked = [(path, agent) for path, agent in index.requests if agent.startswith("pip/")]
    # The first pip of the install recipe: torch where the new venv imports none, else the project's build backend.
    assert any(re.fullmatch(r"/simple/(torch|setuptools)/", path) for path, _ in asked), index.requests
    assert not (venv / ".installed").exists()
