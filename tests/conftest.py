"""Shared by every test folder: isolated run folders, text live view, and a check that no process is left behind.

The folders say how their tests run: ``unit/`` in this process only (pure functions, fixture run directories);
``integration/`` with real launches, kernels or child processes (marked ``integration`` here, so ``-m "not
integration"`` is the quick set); ``notebooks/`` over the workbook's notebooks (papermill, the browser).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Fixture notebooks are meant to fail; tests run them with papermill, nbval must not collect them.
collect_ignore_glob = ["fixtures/notebooks/*.ipynb"]


def pytest_configure(config):
    # A shell starts background jobs with SIGINT ignored (`make test &`, nohup), and children inherit that: the
    # interrupt tests would then test nothing. Restore Python's handler, as in a terminal or CI.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # A SIGTERM (a CI's or a user's timeout, `kill`) ended pytest at once, skipping every finalizer: the session's
    # SLURM cluster outlived the run (issue 34). The first one now interrupts the run as Ctrl-C does, so the session's
    # fixtures tear down; a second one ends it (the cluster's watchdog then stops the cluster).
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    # Inherited by the kernels nbval and papermill start: runs go to a temporary folder, live view as text.
    runs = Path(os.environ.get("TMPDIR", "/tmp")) / f"tutorial_lib-test-runs-{os.getpid()}"
    config.stash[_RUNS_DIR] = runs
    os.environ["TUTORIAL_LIB_RUNS_DIR"] = str(runs)
    os.environ["TUTORIAL_LIB_LIVE"] = "text"
    os.environ.setdefault("MPLBACKEND", "Agg")
    # Deprecated torch APIs (torch.cuda.amp, FSDP1's state_dict_type, ...) warn with FutureWarning or
    # DeprecationWarning: in the scripts the tests launch and the kernels nbval starts they are errors.
    # One exception, torch's own: inductor's first import on torch 2.13 decorates with its deprecated
    # torch.jit.script_method (notebook 14's cold start with CXX unset); the learner's code cannot change it.
    # And torchft 0.2.0's two (issue 47), as errors fatal to every run: its Manager logs with the deprecated
    # logger.warn (manager.py, _ManagerLogger.warn: every quorum's process-group configure failed, no step committed),
    # and a healing group unpickles the sender's pytree spec, whose LeafSpec torch 2.13 deprecates (pg_transport.py's
    # recv_checkpoint: the heal failed and both groups died).
    os.environ["PYTHONWARNINGS"] = ("error::FutureWarning,error::DeprecationWarning,"
                                    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning,"
                                    "ignore:The 'warn' method is deprecated:DeprecationWarning:torchft.manager,"
                                    # (a prefix of its message: the variable's filters are split at commas)
                                    "ignore:`isinstance(treespec:FutureWarning:torchft.checkpointing.pg_transport")


_SESSION_PID = os.getpid()
_RUNS_DIR = pytest.StashKey[Path]()


def pytest_sessionfinish(session, exitstatus):
    # Every run the session launched wrote to this folder (about 100 MB a session); twenty sessions' worth filled a CI
    # machine's /tmp. A passing session removes it; a failing one keeps it for its logs and says where they are.
    runs = session.config.stash.get(_RUNS_DIR, None)
    if runs is None or not runs.exists() or os.getpid() != _SESSION_PID:
        return
    if exitstatus == 0:
        shutil.rmtree(runs, ignore_errors=True)
    else:
        print(f"\nthe runs this session launched (their logs) are kept in {runs}", file=sys.stderr)


def _interrupt_on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if os.getpid() != _SESSION_PID:  # a child forked from pytest (multiprocessing): SIGTERM ends it, as before
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise KeyboardInterrupt(f"SIGTERM (signal {signum}): interrupted, tearing down the session's fixtures")


def job_processes(marker: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose command line mentions ``marker`` (a run folder: torchrun and workers),
    or that work in a folder under it (warm starts: a forked agent or rank has the warm-start helper's command
    line, and the run folder as its working folder)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status", "cwd"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(p.info["cmdline"] or [])
        if marker in cmdline or (p.info["cwd"] or "").startswith(marker):
            found.append(p)
    return found


def wait_no_job_processes(marker: str, within_s: float = 30.0) -> list[psutil.Process]:
    """Poll until no job process remains (returns []) or ``within_s`` passes (returns the survivors)."""
    deadline = time.monotonic() + within_s
    while True:
        left = job_processes(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def printed_before_stacks(run_dir: Path, text: str) -> bool:
    """Whether a rank printed a line containing ``text`` before the first stack dump in ``output.log``.

    Tests of a limit (a timeout, a stopped job) ask this for the state a rank was in when the limit fired, so
    they assert what follows from that state instead of assuming how far a rank gets in a number of seconds.
    """
    log = (Path(run_dir) / "output.log").read_text().splitlines()
    dump = next((i for i, line in enumerate(log) if "(most recent call first)" in line), len(log))
    return any(text in line for line in log[:dump])


def slurm_unavailable_reason() -> str | None:
    """Why a notebook's SLURM section skips here (``tl.slurm.connect_slurm`` finds no cluster: no ``SLURM_CONF`` and the
    local cluster cannot start), or ``None``."""
    from tutorial_lib.errors import SlurmUnavailable
    from tutorial_lib.slurm import check_can_run

    if os.environ.get("SLURM_CONF"):
        return None
    try:
        check_can_run()
    except SlurmUnavailable as e:
        return str(e)
    return None


# nbval executes these Chinese twins (notebooks/zh/) in full; the others' cells are deselected (issue 34: CI that
# stays affordable). A twin's code cells are the English ones (tests/notebooks/test_twins.py) and no checked output of
# a twin differs from its English notebook's (test_twins also asserts that, so a twin that gains a language-dependent
# checked output must be added here): executing all 13 again proved the same asserts a second time, ~5 minutes of CI.
# These two show the language layer through real failures: 01 (the live view and the failure box on a first
# failure), 07 (the doctor's report and its table for every failure kind). Give a twin's path (or notebooks/zh) to
# pytest to execute it anyway; TUTORIAL_LIB_NBVAL_ALL_TWINS=1 executes all of them.
EXECUTED_TWINS = ("01_ddp.ipynb", "07_troubleshooting.ipynb")


def deselected_twins(config, items) -> list:
    """The nbval items of the Chinese twins that are not in ``EXECUTED_TWINS`` (none under
    ``TUTORIAL_LIB_NBVAL_ALL_TWINS=1``, and none of a twin or folder named on the command line)."""
    if os.environ.get("TUTORIAL_LIB_NBVAL_ALL_TWINS") == "1":
        return []
    twins = ROOT / "notebooks" / "zh"
    named = {Path(arg.split("::")[0]).resolve() for arg in config.invocation_params.args if not arg.startswith("-")}
    if twins in named:
        return []
    return [item for item in items
            if Path(str(item.fspath)).parent == twins and Path(str(item.fspath)).suffix == ".ipynb"
            and Path(str(item.fspath)).name not in EXECUTED_TWINS and Path(str(item.fspath)) not in named]


def pytest_collection_modifyitems(config, items):
    dropped = deselected_twins(config, items)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        dropped_ids = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in dropped_ids]
    integration = ROOT / "tests" / "integration"
    slurm_reason = ...
    for item in items:
        if integration in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
        # nbval: a notebook's cells tagged "slurm" print what the cluster did; where there is none they print why
        # they skipped instead, which no stored output can match (papermill runs them and checks the reason).
        # nbval: notebook 15 needs torchft and numpy (issue 47; torchft's wheels are Linux x86_64 only), as
        # scripts/run_workbook.py's REQUIRES says: where they are missing its cells skip, naming them.
        if Path(str(item.fspath)).stem == "15_fault_tolerance" and getattr(item, "cell", None) is not None:
            missing = [m for m in ("torchft", "numpy") if importlib.util.find_spec(m) is None]
            if missing:
                item.add_marker(pytest.mark.skip(reason=f"{' and '.join(missing)} not importable in {sys.executable}"))
        if "slurm" in getattr(getattr(item, "cell", None), "metadata", {}).get("tags", []):
            slurm_reason = slurm_unavailable_reason() if slurm_reason is ... else slurm_reason
            if slurm_reason is not None:
                item.add_marker(pytest.mark.skip(reason=f"no SLURM cluster here: {slurm_reason}"))


@pytest.fixture
def run_root(tmp_path):
    """A private runs folder; after the test, assert that no process of its jobs survives."""
    root = tmp_path / "runs"
    root.mkdir()
    yield root
    left = wait_no_job_processes(str(tmp_path))
    assert not left, f"processes left behind: {[(p.pid, p.info['cmdline']) for p in left]}"


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture(scope="module")
def forked_python():
    """``[python, warm_start.py, "run"]`` and the environment that makes it fork from a warm-start helper of this
    module's own (torch imported once, not in every process): ``subprocess.run([*command, script, *args],
    env=env)`` runs ``python script args`` as a launch's rank would, with the same exit status, stdout and stderr.
    For tests that start many short script processes whose point is the script's output, not its start-up. A
    request the helper refuses runs cold (the client execs ``python`` itself), never differently."""
    from tutorial_lib.child import protocol
    from tutorial_lib.launcher import warm

    helper = warm.WarmHelper(sys.executable, dict(os.environ))
    try:
        assert helper.wait_ready() is None, helper.failure
        yield ([sys.executable, str(warm.WARM_START), protocol.CLIENT_COMMAND],
               {**os.environ, protocol.SOCKET_ENV: helper.socket_path})
    finally:
        helper.close()


SLURM_TEST_PREFIX = "tutorial_lib-slurm-test-"  # the state folders of the clusters the tests start (.ci/run checks)


def private_slurm_cluster():
    """A ``LocalCluster`` in a new folder under /tmp (munged needs every folder above its socket searchable by all,
    which pytest's ``/tmp/pytest-of-<user>`` is not), or a skip (a failure under ``TUTORIAL_LIB_REQUIRE_SLURM=1``,
    which CI sets once slurm-wlm is installed) where SLURM cannot run here."""
    import tempfile

    from tutorial_lib.errors import SlurmUnavailable
    from tutorial_lib.slurm import LocalCluster, check_can_run

    try:
        check_can_run()
    except SlurmUnavailable as e:
        if os.environ.get("TUTORIAL_LIB_REQUIRE_SLURM") == "1":
            pytest.fail(f"TUTORIAL_LIB_REQUIRE_SLURM=1 but the local SLURM cluster cannot run: {e}")
        pytest.skip(f"no local SLURM cluster: {e}")
    folder = Path(tempfile.mkdtemp(prefix=SLURM_TEST_PREFIX, dir="/tmp"))
    folder.chmod(0o755)
    return LocalCluster(folder)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local two-node SLURM cluster for the session: the one already up in ``$TUTORIAL_LIB_SLURM_DIR`` (or the
    default folder) if any, left running; else one started in a private folder, owned by this process (its watchdog
    stops it if the run is killed) and stopped after the last test, with a check that none of its processes is
    left."""
    import shutil

    from tutorial_lib.errors import SlurmError
    from tutorial_lib.slurm import LocalCluster

    shared = LocalCluster.default()
    if shared.is_up() and not shared.owner_gone():
        yield shared
        return
    cluster = private_slurm_cluster()
    try:
        cluster.up(owner_pid=os.getpid())  # a watchdog stops it if this run is killed before its teardown
    except SlurmError as e:
        shutil.rmtree(cluster.state_dir, ignore_errors=True)
        if os.environ.get("TUTORIAL_LIB_REQUIRE_SLURM") == "1":
            pytest.fail(f"TUTORIAL_LIB_REQUIRE_SLURM=1 but the local SLURM cluster did not start: {e}")
        pytest.skip(f"the local SLURM cluster did not start: {e}")
    try:
        yield cluster
    finally:
        cluster.down()
        left = cluster.leftovers()
        assert not left, f"local SLURM cluster processes left: {[(p.pid, p.name()) for p in left]}"
        shutil.rmtree(cluster.state_dir, ignore_errors=True)
