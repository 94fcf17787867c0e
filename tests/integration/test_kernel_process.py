"""The library inside a real Jupyter kernel (jupyter_client, as papermill and JupyterLab start theirs): importing it
starts and changes nothing, and launches from several threads at once, as the kernel's first launches, all finish.

A learner's sweep or a thread pool launches from threads. Before this was fixed: two threads waiting for the warm-start
helper's one "ready" line left one blocked in readline() for good, its timeout_s never applying (4 of 4 kernels); two
helpers started and, the helper's parent-death signal firing when the *thread* that started it ended, a job was killed
with -9 after its steps (5 of 22); and run_script's argument check swapped sys.stdout, which two threads could leave
swapped (every later print lost).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
from jupyter_client.manager import start_new_kernel

pytestmark = pytest.mark.integration

LAUNCH_TIMEOUT_S = 240

IMPORT_CELL = """
import json, os, sys
import psutil
from IPython import get_ipython
from matplotlib.figure import Figure
before = dict(os.environ)
png = get_ipython().display_formatter.formatters["image/png"]
import tutorial_lib as tl
print("RESULT " + json.dumps({
    "children": [p.pid for p in psutil.Process().children(recursive=True)],
    "environ_unchanged": dict(os.environ) == before,
    "figure_formatter": Figure in png.type_printers,
}))
tl.setup_notebook({"TUTORIAL_LIB_TEST_RANK_VAR": "1"})
print("RESULT " + json.dumps({
    "children": [p.pid for p in psutil.Process().children(recursive=True)],
    "environ_unchanged": dict(os.environ) == before,
    "figure_formatter": Figure in png.type_printers,
}))
"""

THREADS_CELL = """
import json, os, sys, threading, time
import tutorial_lib as tl
from tutorial_lib.runs.rundir import RunRecord
stdout, environ, results = sys.stdout, dict(os.environ), {}

def one(i):
    start = time.monotonic()
    try:
        r = tl.run_script("collectives_check", ["--sizes-bytes", 4096, "--iters", 1, "--warmup-iters", 0],
                          runs_dir=RUNS, label=f"thread{i}", device="cpu", nproc_per_node=2, live="off",
                          timeout_s=TIMEOUT_S)
        ok = all(c["ok"] for record in tl.runs.read_collectives(r.run_dir) for c in record["checks"])
        results[i] = dict(outcome="finished" if ok else "wrong results", run_dir=str(r.run_dir),
                          port=r.command[r.command.index("--master-port") + 1],
                          start=RunRecord.read(r.run_dir).start, seconds=time.monotonic() - start)
    except tl.LaunchError as e:
        results[i] = dict(outcome=type(e).__name__, run_dir=str(e.run_dir), summary=e.summary,
                          seconds=time.monotonic() - start)

threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join(TIMEOUT_S + 60)
print("RESULT " + json.dumps({"alive": sum(t.is_alive() for t in threads), "results": results,
                              "same_stdout": sys.stdout is stdout, "same_environ": dict(os.environ) == environ}))
"""


def run_in_kernel(code: str, timeout_s: float) -> list[dict]:
    """Run ``code`` in a new kernel; the JSON after each ``RESULT `` it printed. The kernel is shut down after."""
    km, kc = start_new_kernel(kernel_name="python3")
    printed = []

    def collect(message):
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])
        elif message["msg_type"] == "error":
            printed.append("\n".join(message["content"]["traceback"]))

    try:
        reply = kc.execute_interactive(code, timeout=timeout_s, output_hook=collect)
        assert reply["content"]["status"] == "ok", "".join(printed)[-3000:]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    text = "".join(printed)
    return [json.loads(line[len("RESULT "):]) for line in text.splitlines() if line.startswith("RESULT ")]


def test_importing_the_library_starts_no_process_and_changes_nothing_in_a_plain_process():
    code = ("import json, os, psutil; before = dict(os.environ); import tutorial_lib; "
            "print(json.dumps([psutil.Process().children(recursive=True) == [], dict(os.environ) == before]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [True, True]


def test_importing_the_library_in_a_kernel_starts_nothing_and_the_setup_call_starts_the_helper():
    imported, set_up = run_in_kernel(IMPORT_CELL, timeout_s=300)
    assert imported == {"children": [], "environ_unchanged": True, "figure_formatter": False}
    assert len(set_up["children"]) == 1, "the warm-start helper, started by the setup call"
    assert set_up["environ_unchanged"] and set_up["figure_formatter"], "RANK_ENV kept by the library; figures inline"
    helper = set_up["children"][0]
    deadline = time.monotonic() + 60  # a guard against a helper that never ends, not a speed assumption
    while psutil.pid_exists(helper) and psutil.Process(helper).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the helper outlived its kernel"
        time.sleep(0.1)


@pytest.mark.reliability
@pytest.mark.parametrize("trial", range(20))
def test_four_launches_from_four_threads_as_a_kernels_first_launches_all_finish(run_root, trial):
    code = f"RUNS, TIMEOUT_S = {str(run_root)!r}, {LAUNCH_TIMEOUT_S}\n" + THREADS_CELL
    (result,) = run_in_kernel(code, timeout_s=LAUNCH_TIMEOUT_S + 180)
    runs = result["results"]
    assert result["alive"] == 0 and sorted(runs) == ["0", "1", "2", "3"], result
    assert {r["outcome"] for r in runs.values()} == {"finished"}, runs
    assert len({r["run_dir"] for r in runs.values()}) == 4 and len({r["port"] for r in runs.values()}) == 4, runs
    assert {r["start"] for r in runs.values()} == {"warm"}, f"every thread waited for the one helper: {runs}"
    assert result["same_stdout"] and result["same_environ"], "nothing process-wide changed"
