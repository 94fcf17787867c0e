"""The doctor on what fresh users reported: runs stopped on request, syntax errors, printed steps.

``tests/fixtures/run_dirs/user-reports/`` holds the run directories those launches left (torch 2.13, trimmed to
what the doctor reads: metrics cut to their last lines); the other cases are run directories built here.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest

import tutorial_lib as tl
from tutorial_lib.diagnosis.causes import CauseId
from tutorial_lib.i18n import _
from tutorial_lib.launcher.devices import DevicePlan
from tutorial_lib.launcher.outcome import timeout_error
from tutorial_lib.launcher.output import OutputPump, ThrottledPrinter
from tutorial_lib.launcher.plan import plan_launch
from tutorial_lib.notebook.script_source import check_script_syntax
from tutorial_lib.runs.printed_metrics import last_printed_steps, parse_loss_line
from tutorial_lib.runs.rundir import RunRecord, RunStatus

REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "run_dirs" / "user-reports"


def copy(case: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(REPORTS / case, tmp_path / case))


def set_run_json(run_dir: Path, **fields: object) -> None:
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, **fields}))


@pytest.fixture(autouse=True)
def english_after():
    yield
    tl.set_language("en")


# --- 1. a run stopped on request is no crash ----------------------------------------------------------------------


def test_an_interrupted_run_is_reported_as_interrupted_not_as_a_killed_rank(tmp_path):
    """Ctrl-C in the launching process: run.json says "interrupted"; the ranks' output (torchrun's SignalException,
    faulthandler's stacks on SIGTERM) looks like a rank that died, which the doctor said before reading run.json."""
    run_dir = copy("torch-2.13-interrupted-ddp", tmp_path)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    d = tl.diagnose(run_dir)
    assert (d.cause_id, d.failed, d.rank) == (CauseId.INTERRUPTED, False, None), str(d)
    assert d.fix.startswith("nothing to fix: you stopped it") and "command.txt" in d.fix, d.fix
    assert d.last_steps == {0: 255, 1: 255}, d.last_steps
    assert set(d.where) == {0, 1} and d.where[1].innermost.function == "all_reduce", d.where
    assert str(d.where[1]) == "ddp_train.py:219 in train -> distributed_c10d.py:3252 in all_reduce", "today's text"
    text = str(d)
    assert "SIGKILL" not in text and "died without" not in text and "interrupted" in text.splitlines()[0], text
    tl.set_language("zh")
    chinese = str(d)
    assert "被中断" in chinese and "无需修复" in chinese and "修复建议" in chinese, chinese


def test_a_run_stopped_by_the_launching_process_names_its_error(tmp_path):
    run_dir = copy("torch-2.13-interrupted-ddp", tmp_path)
    set_run_json(run_dir, status="stopped", summary="stopped by ValueError", stopped_by="ValueError")
    d = tl.diagnose(run_dir)
    assert (d.cause_id, d.failed) == (CauseId.STOPPED, False), str(d)
    assert "raised ValueError while it waited" in d.fix and "ValueError" in d.fix_text.render("zh"), d.fix


SBATCH_REFUSED = ("sbatch: error: Memory specification can not be satisfied\n"
                  "sbatch: error: Batch job submission failed: Requested node configuration is not available")


def test_a_run_whose_job_sbatch_refused_says_so_with_sbatchs_message_not_that_output_log_is_missing(tmp_path):
    """Issue 34: the doctor said the folder "holds no output.log" beside an empty output.log. A refused sbatch leaves
    command.txt, job.sh, an empty output.log and run.json (status "refused", sbatch's message: slurm_job's launcher
    writes it; tests/integration/test_slurm_launch.py refuses a real one)."""
    run_dir = tmp_path / "20261202-050000-ddp_train"
    run_dir.mkdir()
    for name, text in (("command.txt", "cd x && sbatch --parsable --mem=999999 job.sh\n"), ("job.sh", "#!/bin/bash\n"),
                       ("output.log", "")):
        (run_dir / name).write_text(text)
    RunRecord(RunStatus.REFUSED, 0.1, summary="ddp_train.py was not submitted", submit_error=SBATCH_REFUSED
              ).write(run_dir)
    d = tl.diagnose(run_dir)
    assert (d.failed, d.submitted, d.cause_id, d.evidence) == (True, False, CauseId.SBATCH_REFUSED, SBATCH_REFUSED)
    assert str(d).splitlines() == [
        f"failed           {run_dir.name}: sbatch refused the job, so no SLURM job ran",
        "sbatch said      sbatch: error: Memory specification can not be satisfied",
        "                 sbatch: error: Batch job submission failed: Requested node configuration is not available",
        "output.log       empty: no step ran (the job was never submitted)",
        "suspected cause  sbatch refused the job",
        f"fix              {d.fix}"]
    assert d.fix.startswith("nothing ran, so output.log is empty and there is no logs/: change what sbatch's message")
    tl.set_language("zh")
    chinese = str(d)
    assert "sbatch 拒绝了这个作业" in chinese and "为空：没有任何一步运行过" in chinese and SBATCH_REFUSED.splitlines()[1] in chinese
    tl.set_language("en")
    (run_dir / "run.json").unlink()  # without run.json: what is there, not "holds no output.log"
    with pytest.raises(tl.ConfigError, match="holds an empty output.log and no logs/: the launch did not start"):
        tl.diagnose(run_dir)


def test_a_run_stopped_at_its_timeout_is_a_hang_with_its_limit(tmp_path):
    """What run.json says when the launcher stops a run at timeout_s: status "timeout" with the limit."""
    run_dir = copy("torch-2.13-interrupted-ddp", tmp_path)
    set_run_json(run_dir, status="timeout", timeout_s=10.0, limit="timeout_s", summary="timed out")
    d = tl.diagnose(run_dir)
    assert (d.cause_id, d.failed, d.timeout_s, d.limit) == (CauseId.HANG_WALL_CLOCK, True, 10.0, "timeout_s"), str(d)
    assert "stopped at the wall-clock limit (10 s)" in str(d), str(d)


# --- 2. a syntax error: refused before the launch, named by the doctor after one ------------------------------------


def test_the_doctor_names_the_file_and_line_of_a_syntax_error_in_the_script(tmp_path):
    """A script launched with a SyntaxError (before run_script compiled it first): Python prints no traceback, only
    the file, the line, a caret and the error; @record writes no error file."""
    d = tl.diagnose(copy("torch-2.13-syntax-error", tmp_path))
    assert (d.cause_id, d.rank, d.exit_code) == (CauseId.SYNTAX_ERROR, 0, 1), str(d)
    assert d.evidence == "/tmp/doc2/syntax.py, line 1" and d.error == "SyntaxError: '(' was never closed", str(d)
    assert "`python -m py_compile /tmp/doc2/syntax.py`" in d.fix and "sys.exit" not in d.fix, d.fix
    fix_zh = d.fix_text.render("zh")
    assert "/tmp/doc2/syntax.py" in fix_zh and "第 1 行" in fix_zh, fix_zh


def test_a_syntax_error_in_an_imported_module_names_that_module(tmp_path):
    """The script imports a module Python cannot parse: a traceback ending in the SyntaxError; the frame of the
    import runs (", in <module>"), the module's line has no function."""
    run_dir = copy("torch-2.13-syntax-error", tmp_path)
    log = run_dir / "output.log"
    report = "".join(f"[default{r}]:{line}\n" for r in (0, 1) for line in (
        "Traceback (most recent call last):", '  File "/tmp/x/train.py", line 3, in <module>', "    import helper",
        '  File "/tmp/x/helper.py", line 7', "    if x = 1:", "       ^^^^^",
        "SyntaxError: invalid syntax. Maybe you meant '==' or ':=' instead of '='?"))
    text = log.read_text()
    start = text.index("E1201")  # torchrun's own lines stay: the report replaces the ranks' lines before them
    log.write_text(report + text[start:])
    d = tl.diagnose(run_dir)
    assert (d.cause_id, d.evidence) == (CauseId.SYNTAX_ERROR, "/tmp/x/helper.py, line 7"), str(d)
    assert "py_compile /tmp/x/helper.py" in d.fix, d.fix


def test_a_script_python_cannot_parse_is_refused_before_anything_is_launched(tmp_path):
    script = tmp_path / "syntax.py"
    script.write_text('import os\n\nprint("hi"\n')
    with pytest.raises(tl.ConfigError, match=r"syntax\.py:3: SyntaxError: '\(' was never closed in 'print\(\"hi\"'; "
                                             r"correct that line \(check it with: python -m py_compile .*syntax\.py\)"):
        check_script_syntax(script)
    with pytest.raises(tl.ConfigError, match=r"syntax\.py:3: SyntaxError"):
        tl.LaunchSpec(script, device="cpu", nproc_per_node=2).validate()
    (tmp_path / "indent.py").write_text("def f():\nreturn 1\n")
    with pytest.raises(tl.ConfigError, match=r"indent\.py:2: IndentationError: expected an indented block"):
        check_script_syntax(tmp_path / "indent.py")
    good = tmp_path / "good.py"
    good.write_text("raise SystemExit('never run: compile() runs nothing')\n")
    check_script_syntax(good)
    tl.LaunchSpec(good, device="cpu", nproc_per_node=2).validate()
    for name in tl.runs.available_scripts():  # every shipped script compiles
        check_script_syntax(Path(tl.__file__).parent / "lessons" / f"{name}.py")


def test_run_script_refuses_a_script_with_a_syntax_error_and_leaves_no_run_directory(tmp_path):
    script = tmp_path / "syntax.py"
    script.write_text('print("hi"\n')
    runs = tmp_path / "runs"
    with pytest.raises(tl.ConfigError, match=r"syntax\.py:1: SyntaxError"):
        tl.run_script(script, nproc_per_node=2, device="cpu", runs_dir=runs)
    assert not runs.exists() or list(runs.iterdir()) == [], "the run directory made for it is removed"


# --- 3. the steps a script printed are its last steps -----------------------------------------------------------------


def test_the_last_steps_include_the_ones_a_script_printed(tmp_path):
    """A script of your own printing `step N loss X`, then raising: the live view showed `rank 1: step 2 loss
    0.3333`; the doctor reads the same points (metrics/printed_rank<R>.jsonl)."""
    run_dir = copy("torch-2.13-printed-steps-then-raised", tmp_path)
    assert not list((run_dir / "metrics").glob("rank*.jsonl")), "no metrics JSON: only printed points"
    d = tl.diagnose(run_dir)
    assert d.last_steps == {0: 2, 1: 2}, str(d)
    assert (d.cause_id, d.cause_fields) == (CauseId.PYTHON_EXCEPTION, {"name": "RuntimeError"}), str(d)
    assert "rank 0: 2, rank 1: 2" in str(d) and "no rank logged a step" not in str(d), str(d)
    assert last_printed_steps(run_dir) == {0: 2, 1: 2}
    # A rank that wrote metrics JSON: its JSON steps win; a rank that only printed keeps its printed step.
    (run_dir / "metrics" / "rank0.jsonl").write_text(json.dumps({"step": 7, "rank": 0, "loss_local": 0.1}) + "\n")
    assert tl.diagnose(run_dir).last_steps == {0: 7, 1: 2}


def test_a_run_without_printed_points_has_no_printed_steps(tmp_path):
    assert last_printed_steps(tmp_path) == {}
    (tmp_path / "output.log").write_text("[default0]:it 3 -> 0.250\n")
    assert tl.diagnose(tmp_path).last_steps == {}


def test_a_stall_timeout_says_no_new_step_came_and_which_steps_had(tmp_path):
    """The stall clock starts at the first step logged: "no rank logged a step" contradicted the last steps listed
    beside it."""
    script = tmp_path / "train.py"
    script.write_text("print('step 1 loss 0.5')\n")
    plan = plan_launch(tl.LaunchSpec(script, device="cpu", nproc_per_node=2, stall_timeout_s=5))
    pump = OutputPump(1, tmp_path, [0], ThrottledPrinter(io.StringIO()), io.StringIO())
    error, record, _outcome = timeout_error(plan, pump, "stall_timeout_s", 8.6, [0, 1], {0: 2, 1: 2}, {}, None,
                                     command=["torchrun"])
    assert "made no progress for 5 s (no rank logged a new step for 5 s; limit stall_timeout_s)" in error.summary
    assert "last step per rank: {0: 2, 1: 2}" in error.summary and "no rank logged a step" not in error.summary
    assert record.summary == error.summary and (error.limit, error.last_steps) == ("stall_timeout_s", {0: 2, 1: 2})
    assert "no rank logged a new step for stall_timeout_s=5 s" in _("no rank logged a new step for stall_timeout_s={timeout_s} s: the job was stopped",
                                                                 timeout_s="5")


# --- 4. a script whose printed lines the loss pattern does not read ---------------------------------------------------


def printed_only_run(tmp_path: Path) -> Path:
    """A finished run of a script that wrote no metrics JSON and printed `it N -> X` (no `step`/`iter` + `loss`)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "output.log").write_text("".join(f"[default{r}]:it {s} -> {1 / (s + 1):.3f}\n"
                                                for r in (0, 1) for s in range(4)))
    return run_dir


def finished(run_dir: Path, loss_pattern) -> tl.LaunchResult:
    return tl.LaunchResult(run_dir=run_dir, command=["torchrun"], returncode=0, wall_time_s=1.0,
                           plan=DevicePlan("cpu", "gloo", 2, 0), loss_pattern=loss_pattern)


def test_metrics_of_a_script_whose_lines_the_pattern_does_not_read_says_so_and_shows_the_pattern(tmp_path):
    run_dir = printed_only_run(tmp_path)
    assert parse_loss_line(re.compile(tl.runs.DEFAULT_LOSS_PATTERN, re.I), "it 3 -> 0.250") is None
    with pytest.raises(tl.errors.MetricsError) as raised:
        finished(run_dir, tl.runs.DEFAULT_LOSS_PATTERN).metrics()
    message = str(raised.value)
    assert message.startswith("the script wrote no metrics JSON") and "did the run start" not in message, message
    assert f"no line it printed matched its loss_pattern, DEFAULT_LOSS_PATTERN r'{tl.runs.DEFAULT_LOSS_PATTERN}'" in message
    assert "(its last printed line: 'it 3 -> 0.250')" in message and "pass loss_pattern=" in message, message
    suggested = re.search(r"e\.g\. r'(.+?)' for", message)[1]  # the example it suggests reads such a line
    assert parse_loss_line(re.compile(suggested), "it 3 -> 0.250") == (3, 0.25)
    with pytest.raises(tl.errors.MetricsError, match=re.escape(r"matched its loss_pattern, r'epoch (\d+) loss ([\d.]+)'")):
        finished(run_dir, r"epoch (\d+) loss ([\d.]+)").metrics()
    with pytest.raises(tl.errors.MetricsError, match=r"its printed lines were not read for losses \(loss_pattern=None"):
        finished(run_dir, None).metrics()


def test_metrics_are_still_read_from_json_or_printed_points(tmp_path):
    run_dir = printed_only_run(tmp_path)
    (run_dir / "metrics").mkdir()
    (run_dir / "metrics" / "printed_rank0.jsonl").write_text(json.dumps({"step": 3, "rank": 0, "loss_local": 0.25}) + "\n")
    assert finished(run_dir, tl.runs.DEFAULT_LOSS_PATTERN).metrics()["step"].tolist() == [3]
    for r in (0, 1):
        (run_dir / "metrics" / f"rank{r}.jsonl").write_text(json.dumps({"step": 5, "rank": r, "loss_local": 0.1}) + "\n")
    assert finished(run_dir, tl.runs.DEFAULT_LOSS_PATTERN).metrics()["step"].tolist() == [5, 5], "metrics JSON wins"


def test_a_slurm_job_that_could_never_start_is_named_from_the_folder_alone(tmp_path):
    """A fresh user's report: the doctor said "unknown" (from the error) and "holds an empty output.log" (from the
    folder) for a job the launcher cancelled as never able to start (run.json: slurm_job.never_starts)."""
    from tutorial_lib.diagnosis.causes import CauseId

    run_dir = tmp_path / "20261202-063000-ddp_train"
    run_dir.mkdir()
    for name, text in (("command.txt", "cd x && sbatch --parsable job.sh\n"), ("job.sh", "#!/bin/bash\n"),
                       ("output.log", "")):
        (run_dir / name).write_text(text)
    summary = ("ddp_train.py cannot start: SLURM job 7 was pending with reason PartitionConfig (...); it was cancelled "
               "(scancel); to start it, ask for at most 2 CPUs per task")
    RunRecord(RunStatus.FAILED, 0.05, summary=summary, slurm_job={"job_id": 7, "state": "CANCELLED",
                                                                   "never_starts": "PartitionConfig"}).write(run_dir)
    d = tl.diagnose(run_dir)
    assert (d.failed, d.cause_id, d.cause_fields, d.evidence) == (True, CauseId.SLURM_NEVER_STARTS,
                                                                  {"reason": "PartitionConfig"}, summary)
    assert "SlurmSpec" in d.fix and "(06, section 6)" in d.fix
    tl.set_language("zh")
    assert "永远无法启动（PartitionConfig）" in str(d) and "见 06 第 6 节" in str(d)
    (run_dir / "run.json").unlink()  # the control: without run.json the folder says nothing of the job
    with pytest.raises(tl.ConfigError, match="holds an empty output.log and no logs/"):
        tl.diagnose(run_dir)


# --- 4. what the trials of issue 35 found: the message, not a traceback's source line; fixes per script -------------
# torch-<v>-train-lm-saved-on-2-resumed-on-3: train_lm.py as it was before it resumed on any world size, saved on 2
# ranks (fsdp) and resumed on 3 (tests/fixtures/own_strict_load.py and own_pipeline_uneven.py, with and without
# --cross-entropy, made the others), each launched with tl.run_script on torch 2.13 and 2.8 and kept (the first ones
# with scripts/capture_doctor_runs.py's capture(); the cross-entropy pair, issue 46, copied as the launch left it).
ISSUE_35 = sorted(p.name for p in REPORTS.iterdir() if "own-" in p.name or "train-lm" in p.name)


def test_issue_35_runs_are_kept_for_both_ci_versions():
    assert {name.split("-", 2)[2] for name in ISSUE_35 if name.startswith("torch-2.8-")} == \
        {name.split("-", 2)[2] for name in ISSUE_35 if name.startswith("torch-2.13-")} == \
        {"own-strict-load", "own-pipeline-uneven-microbatches", "own-pipeline-uneven-microbatches-cross-entropy",
         "train-lm-saved-on-2-resumed-on-3"}


@pytest.mark.parametrize("version", ["2.8", "2.13"])
def test_a_checkpoint_resumed_on_more_ranks_quotes_the_message_and_names_train_lms_own_remedy(tmp_path, version):
    d = tl.diagnose(copy(f"torch-{version}-train-lm-saved-on-2-resumed-on-3", tmp_path))
    assert d.cause_id == tl.diagnosis.causes.CauseId.CHECKPOINT_FEWER_RANKS, str(d)
    assert d.error == "RuntimeError: Missing key in checkpoint state_dict: rng_rank2.cpu."
    assert d.evidence == "rng_rank2.cpu: the checkpoint has no entry for rank 2", "the message, not `raise ...{fqn}`"
    assert "--nproc-per-node" in d.fix and "(11, section 5" in d.fix
    assert "checkpoint.json" not in d.fix and "another shape" not in d.fix, "train_lm.py writes no checkpoint.json"


@pytest.mark.parametrize("version", ["2.8", "2.13"])
def test_an_own_scripts_strict_load_gets_a_fix_without_the_lesson_scripts_flags_and_files(tmp_path, version):
    d = tl.diagnose(copy(f"torch-{version}-own-strict-load", tmp_path))
    assert d.cause_id == CauseId.CHECKPOINT_MISMATCH, str(d)
    assert d.evidence == '"2.weight", "2.bias": in this model, not in the checkpoint'
    assert "--resume" not in d.fix and "checkpoint.json" not in d.fix and "command.txt" not in d.fix, d.fix


def test_each_checkpoint_fix_names_only_what_its_script_has():
    from tutorial_lib.diagnosis.causes import CauseId, cause_by_id
    mismatch = cause_by_id(CauseId.CHECKPOINT_MISMATCH)
    lesson_05 = mismatch.fix_for("checkpoint_train")
    assert "checkpoint.json" in lesson_05 and "--resume" in lesson_05
    assert "--n-layers" in mismatch.fix_for("train_lm") and "checkpoint.json" not in mismatch.fix_for("train_lm")
    for script in (None, "my_train", "ddp_train"):  # a script of your own; a lesson without checkpoints
        assert mismatch.fix_for(script) == mismatch.fix and "--resume" not in mismatch.fix


@pytest.mark.parametrize("case", [f"{version}-own-pipeline-uneven-microbatches{loss}" for version in ("2.8", "2.13")
                                  for loss in ("", "-cross-entropy")])
def test_micro_batches_that_do_not_split_the_batch_are_named_in_english_and_chinese(tmp_path, case):
    """A batch of 10 in 3 micro-batches (GPipe): torch 2.13 fails in the last stage's loss (F.mse_loss's broadcast;
    F.cross_entropy's ValueError, issue 46), 2.8 in stage 0's shape check; the doctor said only "Python exception"."""
    d = tl.diagnose(copy(f"torch-{case}", tmp_path))
    assert d.cause_id == CauseId.UNEVEN_MICROBATCHES, str(d)
    assert d.evidence == "micro-batches of 4 and 3 samples" and "divide the batch size" in d.fix
    tl.set_language("zh")
    assert "微批次" in str(d) and "micro-batches do not" not in str(d), str(d)


def test_a_shape_error_outside_a_pipeline_is_not_called_a_micro_batch_split(tmp_path):
    run_dir = copy("torch-2.13-own-pipeline-uneven-microbatches", tmp_path)
    for path in (p for p in run_dir.rglob("*") if p.is_file()):  # the same failure, no pipelining frame in it
        path.write_text(path.read_text().replace("torch/distributed/pipelining/", "torch/nn/"))
    d = tl.diagnose(run_dir)
    assert (d.cause_id, d.cause_fields) == (CauseId.PYTHON_EXCEPTION, {"name": "RuntimeError"}), str(d)



def test_an_exception_line_right_after_a_frame_without_source_is_still_the_evidence(tmp_path):
    """A frame whose source Python cannot show (``File "<string>"``, a frozen module) is followed by the exception
    line itself: only a line indented deeper than its frame is source code."""
    run_dir = copy("torch-2.13-train-lm-saved-on-2-resumed-on-3", tmp_path)
    for path in (p for p in run_dir.rglob("*") if p.is_file()):
        path.write_text("".join(line for line in path.read_text().splitlines(keepends=True)
                                if 'raise RuntimeError(f"Missing key' not in line))
    assert 'raise RuntimeError(f"Missing key' not in (run_dir / "output.log").read_text()
    d = tl.diagnose(run_dir)
    assert d.evidence == "rng_rank2.cpu: the checkpoint has no entry for rank 2", str(d)


@pytest.mark.parametrize("version", ["2.8", "2.13"])
def test_a_graph_break_inside_ddps_own_forward_is_named_as_ddps_not_the_learners(tmp_path, version):
    """Issue 46: torch.compile(DDP(model), fullgraph=True) stops in DDP's _pre_forward (its logger); the doctor told
    the learner to move a print out of their module. tests/fixtures/compile_ddp_fullgraph.py made both runs (2 CPU
    ranks, tl.run_script). A break in the learner's own module stays the general cause (notebook 14's run)."""
    d = tl.diagnose(copy(f"torch-{version}-compile-ddp-fullgraph", tmp_path))
    assert d.cause_id == CauseId.COMPILE_DDP_GRAPH_BREAK, str(d)
    assert "then DDP(model)" in d.fix and "(14, section 1" in d.fix, d.fix
    own = tl.diagnose(shutil.copytree(REPORTS.parent / f"torch-{version}" / "14-compile-fullgraph-break", tmp_path / "own"))
    assert own.cause_id == CauseId.COMPILE_GRAPH_BREAK, str(own)  # the control: the same error, the learner's


@pytest.mark.parametrize("version", ["2.8", "2.13"])
def test_a_collective_timeout_while_a_peer_compiles_names_the_compiling_rank(tmp_path, version):
    """Issue 46: a rank recompiling alone (a new shape at step 2) while the other waited in an all-reduce with a 1 s
    timeout was named only "collective timeout (hang)". Its stack, printed when torchrun stopped it, is inside dynamo or
    inductor: the doctor names it and the fix points at 14's section on a rank that recompiles alone.
    tests/fixtures/compile_recompiling_rank.py made both runs (2 CPU ranks, TORCHINDUCTOR_FORCE_DISABLE_CACHES=1).
    The control: the same run with its compiler frames renamed is the plain collective timeout again."""
    d = tl.diagnose(copy(f"torch-{version}-compile-recompiling-rank", tmp_path))
    assert (d.rank, d.cause_id, d.cause_fields) == (0, CauseId.COMPILING_RANK, {"ranks": "1"}), str(d)
    assert "rank 1 was still compiling" in d.fix and "(14, section 7" in d.fix, d.fix
    control = copy(f"torch-{version}-compile-recompiling-rank", tmp_path / "control")
    for path in (p for p in control.rglob("*") if p.is_file()):
        path.write_text(path.read_text().replace("torch/_dynamo/", "torch/dynamo/").replace("torch/_inductor/",
                                                                                            "torch/inductor/"))
    assert tl.diagnose(control).cause_id == CauseId.COLLECTIVE_TIMEOUT


@pytest.mark.parametrize("line", [
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv "
    "operation to complete",
    "torch.distributed.DistBackendError: Wait timeout after 10000ms",
    # gloo, when its pair's timeout fires first (CI, 2026-12-07: an async save on the training group, rank 0)
    "RuntimeError: Application timeout caused pair closure",
])
def test_a_gloo_timeout_message_is_a_collective_timeout_and_no_earlier_cause(line):
    from tutorial_lib.diagnosis.causes import CAUSES
    first = next(c for c in CAUSES if c.pattern.search(line))
    assert first.id == CauseId.COLLECTIVE_TIMEOUT, first.id
