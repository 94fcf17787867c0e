"""No daemon outlives its owner (issue 34, item 7): a local SLURM cluster started by a process (a kernel through
``connect_slurm``, a test run through the ``slurm_cluster`` fixture) is stopped once that process is gone, however it
ended (SIGKILL, SIGTERM, a Jupyter kernel restarted between notebook 06's cells), by its watchdog; the next
``connect_slurm`` starts afresh a cluster whose owner ended and whose watchdog was killed too, instead of leaving it
"as it was"; a test run stopped with SIGTERM tears its cluster down before it exits. Every wait is for a state (no
process of the cluster alive, a zombie counting as ended), with a deadline of a minute."""

import os
import shutil
import signal
import subprocess
import sys
import importlib.util
import json
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, job_processes, private_slurm_cluster

import tutorial_lib as tl
from tutorial_lib.slurm import LocalCluster, owner as ownership, target
from tutorial_lib.slurm.processes import ProcessStamp

WITHIN_S = 60.0  # the acceptance: no daemon of the cluster lives a minute after its owner's end
START_TIMEOUT_S = 180.0  # the longest wait for an owner to start its cluster on this 2-core machine

OWNER = textwrap.dedent("""
    import os, sys, time
    from tutorial_lib.slurm import LocalCluster
    LocalCluster.default(sys.argv[1]).up(owner_pid=os.getpid())  # what connect_slurm() does in a kernel
    print("the owner started its cluster", flush=True)
    time.sleep(3600)
""")


def read_line_with(proc: subprocess.Popen, text: str, timeout_s: float) -> str:
    """The first line of ``proc``'s output that contains ``text``; fails with the output if ``proc`` ends first or
    ``timeout_s`` seconds pass (the read blocks on the pipe: an owner that hangs is ended by the test's finally)."""
    deadline, seen = time.monotonic() + timeout_s, []
    for line in proc.stdout:
        seen.append(line)
        if text in line:
            return line
        assert time.monotonic() < deadline, "".join(seen)
    pytest.fail(f"the owner exited with {proc.wait()} before printing {text!r}:\n{''.join(seen)}")


def start_owner(cluster: LocalCluster) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(cluster.state_dir)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env)
    read_line_with(owner, "the owner started its cluster", START_TIMEOUT_S)
    return owner


def stamps(cluster: LocalCluster) -> list[ProcessStamp]:
    """The cluster's daemons and its watchdog, each told from a later process that reuses its PID."""
    return [ProcessStamp(d.pid, d.create_time) for d in cluster.daemons()] + [
        ProcessStamp.of(p.pid) for p in watchdogs(cluster)]


def watchdogs(cluster: LocalCluster):
    return [p for p in job_processes(str(cluster.state_dir)) if str(ownership.WATCHDOG) in p.cmdline()]


def wait_until_none_lives(cluster: LocalCluster, processes: list[ProcessStamp], within_s: float, *,
                          daemons_too: bool = True) -> float:
    """Poll until none of ``processes`` lives (a zombie counts as ended: PID 1 here reaps nothing) and, with
    ``daemons_too``, no process names the cluster's folder (daemons, watchdog, its ``slurm down``) and no job step
    is left; the seconds that took. Fails after ``within_s`` seconds, listing the survivors."""
    start = time.monotonic()
    while True:
        alive = [s for s in processes if s.alive()]
        named = job_processes(str(cluster.state_dir)) if daemons_too else []
        if not alive and not named and (not daemons_too or cluster.leftovers() == []):
            return time.monotonic() - start
        assert time.monotonic() - start < within_s, (
            f"alive after {within_s:g} s: {[s.pid for s in alive]} {[(p.pid, p.cmdline()) for p in named]}")
        time.sleep(0.1)


def stop_everything(cluster: LocalCluster, *owners: subprocess.Popen) -> None:
    for owner in owners:
        owner.kill()
        owner.wait()
        owner.stdout.close()
    cluster.down()
    for proc in watchdogs(cluster):
        proc.kill()
    shutil.rmtree(cluster.state_dir, ignore_errors=True)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_no_daemon_lives_a_minute_after_its_owner_is_killed(sig):
    cluster = private_slurm_cluster()
    owner = start_owner(cluster)
    try:
        assert cluster.is_up() and cluster.owner() == ProcessStamp.of(owner.pid)
        assert f"owner: pid {owner.pid}: a watchdog stops the cluster" in cluster.status()
        processes = stamps(cluster)
        assert len(processes) == 5, processes  # munged, slurmctld, 2 x slurmd, the watchdog
        owner.send_signal(sig)  # not reaped: the owner stays a zombie, which counts as gone
        elapsed_s = wait_until_none_lives(cluster, processes, WITHIN_S)
        assert owner.poll() == -sig
        log = (cluster.log_dir / "watchdog.log").read_text()
        assert f"the owner (pid {owner.pid}) is gone: stopping the cluster" in log and "stopped munged" in log, log
        assert cluster.daemons() == [] and cluster.owner() is None and not cluster.is_up()
        assert (cluster.state_dir / "munge" / "munge.key").is_file(), "the watchdog removes nothing but PID files"
        print(f"{sig.name}: no daemon of the cluster {elapsed_s:.1f} s after the owner's end")
    finally:
        stop_everything(cluster, owner)


def test_the_next_connect_restarts_a_cluster_whose_owner_and_watchdog_were_killed(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(target, "SYSTEM_CONFS", ())  # the local cluster even where a system slurm.conf exists
    cluster = private_slurm_cluster()
    owner = start_owner(cluster)
    connected = None
    try:
        dead_owner = cluster.owner()
        [watchdog] = watchdogs(cluster)
        watchdog.kill()  # the watchdog killed too (a `kill -9` of every process of the machine's user, say)
        wait_until_none_lives(cluster, [ProcessStamp.of(watchdog.pid)], within_s=10.0, daemons_too=False)
        owner.kill()
        owner.wait()
        old = stamps(cluster)
        assert cluster.is_up() and cluster.owner_gone() and "which has ended" in cluster.status()
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # an export line of that cluster: not reported usable
        pointed = tl.slurm.connect_slurm()
        assert pointed.kind == "unavailable" and f"belonged to pid {owner.pid}, which has ended" in pointed.reason
        monkeypatch.delenv("SLURM_CONF")
        connected = tl.slurm.connect_slurm(state_dir=cluster.state_dir)
        assert (connected.kind, connected.started) == ("local, started here", True), connected
        assert not any(s.alive() for s in old), "the dead owner's daemons were stopped, not adopted"
        assert cluster.is_up() and cluster.owner() == ProcessStamp.of(os.getpid()) and len(watchdogs(cluster)) == 1
        assert connected.local.down(if_owner=dead_owner) == [] and cluster.is_up(), "a late watchdog leaves it alone"
        new = stamps(cluster)
        assert connected.close()
        wait_until_none_lives(cluster, new, within_s=10.0)
    finally:
        if connected is not None:
            connected.close()
        stop_everything(cluster, owner)


CONNECT_CELL = """
import json, os
import tutorial_lib as tl
from tutorial_lib.slurm import target
target.SYSTEM_CONFS = ()  # the local cluster even where a system slurm.conf exists
os.environ.pop("SLURM_CONF", None)
slurm = tl.slurm.connect_slurm(state_dir=STATE_DIR)  # notebook 06's first SLURM cell
print("RESULT " + json.dumps({"kind": slurm.kind, "started": slurm.started, "reason": slurm.reason}))
"""


def connect_in_kernel(kc, cluster: LocalCluster) -> dict:
    printed = []

    def collect(message):
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])
        elif message["msg_type"] == "error":
            printed.append("\n".join(message["content"]["traceback"]))

    code = f"STATE_DIR = {str(cluster.state_dir)!r}\n{CONNECT_CELL}"
    reply = kc.execute_interactive(code, timeout=START_TIMEOUT_S, output_hook=collect)
    assert reply["content"]["status"] == "ok", "".join(printed)[-3000:]
    return next(json.loads(line[len("RESULT "):]) for line in "".join(printed).splitlines()
                if line.startswith("RESULT "))


def test_a_kernel_restarted_between_notebook_06s_cells_leaves_no_daemon_and_the_next_run_starts_afresh():
    from jupyter_client.manager import start_new_kernel

    cluster = private_slurm_cluster()
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        assert connect_in_kernel(kc, cluster) == {"kind": "local, started here", "started": True, "reason": ""}
        processes = stamps(cluster)
        assert len(processes) == 5 and cluster.owner() == ProcessStamp.of(km.provisioner.process.pid), processes
        km.restart_kernel(now=True)  # the kernel killed (SIGKILL), its cell after connect_slurm never run
        elapsed_s = wait_until_none_lives(cluster, processes, WITHIN_S)
        kc.wait_for_ready(timeout=START_TIMEOUT_S)
        again = connect_in_kernel(kc, cluster)
        assert again == {"kind": "local, started here", "started": True, "reason": ""}, "not 'left as it was'"
        processes = stamps(cluster)
        km.shutdown_kernel(now=True)
        wait_until_none_lives(cluster, processes, WITHIN_S)
        print(f"kernel restarted: no daemon of its cluster {elapsed_s:.1f} s later")
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)
        stop_everything(cluster)


# --- the watchdog alone: no SLURM needed ---------------------------------------------------------------------------

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def fake_cluster(state_dir: Path) -> subprocess.Popen:
    """A state folder whose one "daemon" (``run/slurmd-node0.json``) is a sleeping Python process in its own session."""
    (state_dir / "run").mkdir(parents=True)
    daemon = subprocess.Popen(SLEEPER, start_new_session=True)
    stamp = ProcessStamp.of(daemon.pid)
    (state_dir / "run" / "slurmd-node0.json").write_text(json.dumps(
        {"name": "slurmd-node0", "pid": stamp.pid, "create_time": stamp.create_time, "argv": SLEEPER}))
    return daemon


def test_the_watchdog_stops_the_recorded_daemons_once_its_owner_ends(tmp_path):
    state_dir = tmp_path / "cluster"
    daemon, owner = fake_cluster(state_dir), subprocess.Popen(SLEEPER)
    try:
        owner_stamp = ProcessStamp.of(owner.pid)
        ownership.record_owner(state_dir, owner_stamp)
        watchdog = ownership.start_watchdog(state_dir, owner_stamp, poll_s=0.2)
        processes = [ProcessStamp.of(daemon.pid), watchdog]
        assert all(p.alive() for p in processes)
        owner.kill()
        start, deadline = time.monotonic(), time.monotonic() + WITHIN_S
        while any(p.alive() for p in processes):
            assert time.monotonic() < deadline, (state_dir / "log" / "watchdog.log").read_text()
            time.sleep(0.1)
        log = (state_dir / "log" / "watchdog.log").read_text()
        assert f"the owner (pid {owner.pid}) is gone" in log, log
        assert not (state_dir / "run" / "slurmd-node0.json").exists() and ownership.read_owner(state_dir) is None
        print(f"the watchdog stopped the recorded daemon {time.monotonic() - start:.1f} s after the owner's end")
    finally:
        for proc in (daemon, owner):
            proc.kill()
            proc.wait()


def load_watchdog():
    spec = importlib.util.spec_from_file_location("slurm_watchdog_under_test", ownership.WATCHDOG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_watchdog_kills_the_recorded_daemons_itself_when_slurm_down_fails(tmp_path, monkeypatch):
    watchdog = load_watchdog()
    monkeypatch.setattr(watchdog, "run_down", lambda *args: False)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended_stamp = ProcessStamp.of(ended.pid)
    ended.wait()
    daemon = fake_cluster(tmp_path)
    try:
        assert watchdog.main([str(tmp_path), str(ended_stamp.pid), repr(ended_stamp.create_time)]) == 0
        assert daemon.wait(timeout=10) == -signal.SIGKILL
    finally:
        daemon.kill()
        daemon.wait()


def test_an_owner_that_does_not_run_is_refused():
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    with pytest.raises(tl.ConfigError, match=rf"owner_pid {ended.pid} names no running process: give the PID"):
        ProcessStamp.of(ended.pid)


# --- a test run as the owner ---------------------------------------------------------------------------------------

INNER_TEST = textwrap.dedent("""
    import time

    def test_holds_the_cluster(slurm_cluster):
        print("cluster up in", slurm_cluster.state_dir, flush=True)
        time.sleep(3600)
""")


def test_a_test_run_stopped_with_sigterm_tears_its_cluster_down_before_it_exits(tmp_path):
    shutil.rmtree(private_slurm_cluster().state_dir)  # it skips where no local cluster can run; the run makes its own
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"},  # the outer run's: for its kernels
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           "TUTORIAL_LIB_SLURM_DIR": str(tmp_path / "no-shared-cluster"), "TUTORIAL_LIB_REQUIRE_SLURM": "1"}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "conftest", "-s", "-q", "-p", "no:cacheprovider",
                            "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    cluster = None
    try:
        line = read_line_with(run, "cluster up in", START_TIMEOUT_S)
        cluster = LocalCluster(Path(line.split("cluster up in", 1)[1].strip()))
        processes = stamps(cluster)
        assert len(processes) == 5 and cluster.owner() == ProcessStamp.of(run.pid), processes
        start = time.monotonic()
        run.send_signal(signal.SIGTERM)
        output = run.stdout.read()
        assert run.wait(timeout=WITHIN_S) == 2, output  # pytest's "interrupted"
        elapsed_s = time.monotonic() - start
        alive = [s.pid for s in processes if s.alive()]
        assert alive == [], f"the run exited before its teardown stopped {alive}:\n{output}"
        assert "KeyboardInterrupt" in output and not cluster.state_dir.exists(), output  # the fixture's finalizer
        print(f"SIGTERM to pytest: its cluster torn down and the run ended {elapsed_s:.1f} s later")
    finally:
        run.kill()
        run.wait()
        run.stdout.close()
        if cluster is not None:
            stop_everything(cluster)
