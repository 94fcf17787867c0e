"""The one run loop (``run_job``) over the job interface (``interface.Job``), with a job that starts nothing: the order
of its calls, and the error built once with what the job knows (its SLURM job, its words), never patched after."""

import io

import pytest

import tutorial_lib as tl
from tutorial_lib.launcher.interface import Job, LimitReached, Stopped
from tutorial_lib.launcher.job import RunningJob
from tutorial_lib.launcher.live import LiveView
from tutorial_lib.launcher.output import OutputPump, ThrottledPrinter
from tutorial_lib.launcher.plan import plan_launch
from tutorial_lib.launcher.run import run_job
from tutorial_lib.launcher.slurm_job import SubmittedJob
from tutorial_lib.i18n import Message
from tutorial_lib.runs.rundir import RunRecord, RunStatus


class Recorded(LiveView):
    """A view that keeps its last words."""

    def __init__(self) -> None:
        super().__init__()
        self.finished, self.failed = [], []

    def finish(self, rss_samples, outcome) -> None:
        self.finished.append(outcome)

    def fail(self, error) -> None:
        self.failed.append(error)


class ScriptedJob(Job):
    """A job whose ``wait`` returns or raises what the test says, and which says what a SLURM job would add."""

    def __init__(self, plan, *, wait=None, start_raises=None, knows_slurm=False, cannot_run=None) -> None:
        self.plan, self.view, self.command = plan, Recorded(), ["torchrun", "t.py"]
        self.pump = OutputPump(1, plan.run_dir, [0], ThrottledPrinter(io.StringIO()), io.StringIO())
        self.outcome, self.start_raises, self.knows_slurm, self.cannot = wait, start_raises, knows_slurm, cannot_run
        self.calls: list[str] = []
        self.is_started = False

    def start(self) -> None:
        self.calls.append("start")
        if self.start_raises is not None:
            raise self.start_raises
        (self.plan.run_dir / "output.log").write_text("")  # what a real start leaves for the doctor
        self.is_started = True

    @property
    def started(self) -> bool:
        return self.is_started

    def wait(self) -> dict[int, int]:
        self.calls.append("wait")
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def elapsed(self) -> float:
        return 1.5

    def read_records(self) -> list[dict]:
        return []

    def stop(self, ask_for_stacks: bool) -> Stopped:
        self.calls.append(f"stop(stacks={ask_for_stacks})")
        return Stopped([0], {}, None, "stopped it")

    def close(self) -> None:
        self.calls.append("close")

    def not_started(self, exc: BaseException) -> None:
        self.calls.append(f"not_started({type(exc).__name__})")

    def slurm_job(self):
        return tl.launcher.slurm_job.SlurmJob(7, "CANCELLED", "None", ("node0",)) if self.knows_slurm else None

    def said_stopped(self, headline, summary):
        return (Message("{failed}; and more", {"failed": headline}), f"{summary}; and more") if self.knows_slurm \
            else (headline, summary)

    def cannot_run(self, exc, elapsed):
        return self.cannot


@pytest.fixture
def plan(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    return plan_launch(tl.LaunchSpec(script, device="cpu", nproc_per_node=1, run_dir=tmp_path))


def test_the_local_and_the_slurm_job_implement_the_one_interface():
    assert issubclass(RunningJob, Job) and issubclass(SubmittedJob, Job)
    assert not RunningJob.__abstractmethods__ and not SubmittedJob.__abstractmethods__


def test_a_job_that_ended_well_is_started_waited_for_closed_and_recorded(plan):
    job = ScriptedJob(plan, wait={0: 0})
    result = run_job(job)
    assert job.calls == ["start", "wait", "close"]
    assert result.returncode == 0 and result.job is None and result.command == job.command
    record = RunRecord.read(plan.run_dir)
    assert record.status == RunStatus.FINISHED and record.slurm_job is None
    assert [o.status for o in job.view.finished] == [RunStatus.FINISHED]


def test_a_job_that_never_started_is_told_so_closed_and_the_error_goes_on(plan):
    job = ScriptedJob(plan, start_raises=tl.ConfigError("no run directory"))
    with pytest.raises(tl.ConfigError, match="no run directory"):
        run_job(job)
    assert job.calls == ["start", "not_started(ConfigError)", "close"]
    assert RunRecord.read(plan.run_dir) is None, "nothing ran: no run.json"


def test_at_a_limit_the_job_is_stopped_with_stacks_and_its_error_is_built_once_with_what_it_knows(plan):
    job = ScriptedJob(plan, wait=LimitReached("timeout_s"), knows_slurm=True)
    with pytest.raises(tl.LaunchTimeout) as caught:
        run_job(job)
    error = caught.value
    assert job.calls == ["start", "wait", "stop(stacks=True)", "close"]
    assert error.summary.endswith("; and more") and str(error.headline).endswith("; and more")
    assert error.job.job_id == 7 and error.diagnosis is not None
    record = RunRecord.read(plan.run_dir)
    assert record.status == RunStatus.TIMEOUT and record.summary == error.summary
    assert record.slurm_job["job_id"] == 7 and record.slurm_job["nodes"] == ["node0"]
    assert job.view.failed == [error]


def test_an_interrupt_stops_the_job_plainly_says_so_and_goes_on(plan, capsys):
    job = ScriptedJob(plan, wait=KeyboardInterrupt(), knows_slurm=True)
    with pytest.raises(KeyboardInterrupt):
        run_job(job)
    assert job.calls == ["start", "wait", "stop(stacks=False)", "close"]
    assert f"[launcher] interrupted: stopped it. Logs: {plan.run_dir}" in capsys.readouterr().out
    record = RunRecord.read(plan.run_dir)
    assert record.status == RunStatus.INTERRUPTED and record.slurm_job["job_id"] == 7


def test_a_failed_node_raises_the_launch_error_with_the_jobs_words(plan):
    job = ScriptedJob(plan, wait={0: 1}, knows_slurm=True)
    with pytest.raises(tl.LaunchError) as caught:
        run_job(job)
    error = caught.value
    assert error.job.job_id == 7 and error.returncode == 1
    record = RunRecord.read(plan.run_dir)
    assert record.status == RunStatus.FAILED and record.summary == error.summary and record.slurm_job["job_id"] == 7


def test_a_job_that_can_never_run_raises_its_own_error(plan):
    own = tl.LaunchError("cannot start", run_dir=plan.run_dir, command=["sbatch"], returncode=None)
    built = (own, RunRecord(RunStatus.FAILED, 1.5, summary="cannot start"), None)
    job = ScriptedJob(plan, wait=RuntimeError("pending for ever"), cannot_run=built)
    with pytest.raises(tl.LaunchError) as caught:
        run_job(job)
    assert caught.value is own and RunRecord.read(plan.run_dir).summary == "cannot start"
