"""A script of your own, launched as smoothly as a lesson script (issue 26): in place, from its own folder, as often as
you like, with a loss curve read from the lines it prints; and the ranks' working folder (``cwd``) of every launch.

``tests/fixtures/own_project/train.py`` is shaped like nanoGPT's ``train.py``: module-level code, ``data/`` by relative
path, ``iter N: loss X, time Tms`` printed on rank 0, no metrics JSON. The last test runs nanoGPT's own ``train.py``
when ``$NANOGPT_DIR`` names a checkout of karpathy/nanoGPT (it is not part of this project).
"""

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

import tutorial_lib as tl

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``folder``: its sha1 and modification time (ns), by relative path."""
    return {str(p.relative_to(folder)): (hashlib.sha1(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def expected_rank0_losses(iters: int, world_size: int = 2) -> list[float]:
    """The fixture's rank-0 losses, derived: loss_r = (w - 2)^2 mean(x_r^2), the averaged gradient 2 (w - 2) mean(x^2)
    over all values 1..8, lr 0.01, from w = 0."""
    xs = [float(v) for v in range(1, 9)]
    rank0 = xs[0::world_size]
    w, losses = 0.0, []
    for _ in range(iters):
        losses.append((w - 2) ** 2 * sum(x * x for x in rank0) / len(rank0))
        w -= 0.01 * 2 * (w - 2) * sum(x * x for x in xs) / len(xs)
    return losses


@pytest.fixture
def project(tmp_path) -> Path:
    """A learner's folder: the fixture script and its data, copied under the test's own folder."""
    return Path(shutil.copytree(FIXTURES / "own_project", tmp_path / "my project"))


def test_your_own_script_launches_twice_in_place_from_its_folder_with_its_printed_loss_curve(project, run_root,
                                                                                             capsys):
    before = snapshot(project)
    results = [tl.run_script(project / "train.py", ["--max_iters=6"], device="cpu", timeout_s=120, runs_dir=run_root)
               for _ in range(2)]
    assert snapshot(project) == before, "the script is not modified and nothing is written beside it"
    first, second = results
    assert first.run_dir != second.run_dir and first.run_dir.parent == second.run_dir.parent == run_root.resolve()
    assert sorted(p.name for p in run_root.iterdir()) == sorted([first.run_dir.name, second.run_dir.name])
    expected = expected_rank0_losses(6)
    for result in results:
        log = (result.run_dir / "output.log").read_text()
        for rank in (0, 1):  # each rank found data/values.txt: it ran in the script's folder
            assert f"[rank {rank}] rank {rank} works in {project}" in log, log[-2000:]
        command = (result.run_dir / "command.txt").read_text()
        assert command.startswith(f"# ranks run in {project}; logs, metrics, run.json: {result.run_dir}\n")
        assert f"cd '{project}' && " in command and f"'{project / 'train.py'}' --max_iters=6" in command
        points = result.metrics()  # no metrics JSON: the points read from the printed lines
        assert points["rank"].tolist() == [0] * 6 and points["step"].tolist() == list(range(6))
        assert points["loss_local"].tolist() == pytest.approx(expected, abs=5e-5)  # printed with 4 decimals
        assert points["line"].iloc[0].startswith("iter 0: loss 84.0000, time ")
        assert tl.runs.read_printed_metrics(result.run_dir).equals(points)
        assert not list((result.run_dir / "metrics").glob("rank*.jsonl"))
    shown = capsys.readouterr().out
    assert shown.count(f"[launcher] ranks run in {project}\n") == 2, "the status says where the ranks run"
    assert "[progress" in shown and "rank 0: step 5  loss " in shown, "the printed points reached the live view"


def test_a_launchspec_without_run_dir_leaves_your_folder_as_it_was_launch_after_launch(tmp_path, run_root,
                                                                                        monkeypatch):
    """Issue 34: ``tl.launch(tl.LaunchSpec("my_project/train.py"))``, the first call a learner reaches for, used to
    write command.txt, output.log, run.json, logs/ and metrics/ into the learner's folder and refuse the second launch
    there. Each launch now gets a fresh run directory (as ``run_script`` gives it); the ranks still run in the folder."""
    monkeypatch.setenv("TUTORIAL_LIB_RUNS_DIR", str(run_root))
    folder = tmp_path / "my project"
    folder.mkdir()
    (folder / "myfmt.py").write_text("import os\nprint(f\"step 0 loss {1 + int(os.environ['RANK'])} in {os.getcwd()}\","
                                     " flush=True)\n")
    (folder / "notes.txt").write_text("the learner's own file\n")
    before = snapshot(folder)
    results = [tl.launch(tl.LaunchSpec(folder / "myfmt.py", nproc_per_node=2, device="cpu", timeout_s=120))
               for _ in range(2)]
    assert snapshot(folder) == before and sorted(os.listdir(folder)) == ["myfmt.py", "notes.txt"], \
        "nothing the launcher writes lands beside the learner's files"
    first, second = (r.run_dir for r in results)
    assert first != second and first.parent == second.parent == run_root.resolve()
    assert first.name.endswith("-myfmt") and sorted(p.name for p in run_root.iterdir()) == sorted([first.name,
                                                                                                   second.name])
    for result in results:
        assert (result.run_dir / "command.txt").read_text().startswith(f"# ranks run in {folder}; ")
        assert result.metrics()[["rank", "step", "loss_local"]].values.tolist() == [[0, 0, 1.0], [1, 0, 2.0]]
        assert f"in {folder}" in (result.run_dir / "output.log").read_text(), "the ranks ran in the script's folder"


def test_a_lesson_copied_alone_into_your_folder_runs_there_and_each_launch_keeps_its_own_metrics(tmp_path, run_root,
                                                                                                 monkeypatch):
    """Issue 48: ``myproj/ddp_train.py``, a shipped lesson the learner copied by hand into an empty folder, was taken
    for a lesson's run directory (``tl.launch`` wrote command.txt, logs/, metrics/, output.log, run.json and samples/
    into it and refused the second launch), and through ``run_script`` its metrics piled up in ``myproj/metrics/``
    until ``result.metrics()`` raised. Now the folder stays the learner's (only ``write_script``'s copies make a run
    directory). The copy has no ``_workbook.py`` beside it, so it trains without the workbook's instruments (no
    ``--metrics-dir``): each launch's metrics are the losses it printed, read from its own run directory's log."""
    monkeypatch.setenv("TUTORIAL_LIB_RUNS_DIR", str(run_root))
    folder = tmp_path / "myproj"
    folder.mkdir()
    shutil.copy(tl.write_script("ddp_train", tl.new_run_dir("source", tmp_path)), folder)
    before = snapshot(folder)
    launched = tl.launch(tl.LaunchSpec(folder / "ddp_train.py", args=["--max-steps", 2, "--log-every", 1],
                                       nproc_per_node=2, device="cpu", timeout_s=120, live="off"))
    again = [tl.run_script(folder / "ddp_train.py", ["--max-steps", steps, "--log-every", 1], nproc_per_node=2,
                           device="cpu", timeout_s=120, runs_dir=run_root, live="off") for steps in (3, 4)]
    assert snapshot(folder) == before and os.listdir(folder) == ["ddp_train.py"], sorted(os.listdir(folder))
    for result, steps in zip([launched, *again], (2, 3, 4)):
        assert result.run_dir.parent == run_root.resolve()
        assert sorted(result.metrics().groupby("rank")["step"].count().tolist()) == [steps, steps], result.run_dir
        assert "--metrics-dir" not in (result.run_dir / "command.txt").read_text(), "a copy alone has no such flag"


def test_a_lesson_copied_into_your_folder_named_like_a_run_directory_stays_yours(tmp_path, run_root, monkeypatch):
    """Issue 48: a folder was a run directory when its name looked like ``new_run_dir``'s (``<stamp>-<label>``), so
    ``20250101-090000-myproj/ddp_train.py``, copied there by hand, had ``tl.launch`` write its files into the
    learner's folder and refuse the second launch. Now only ``new_run_dir``'s mark (``.tutorial-run``) makes one:
    both launches get run directories of their own under the runs folder, and the folder is unchanged."""
    monkeypatch.setenv("TUTORIAL_LIB_RUNS_DIR", str(run_root))
    folder = tmp_path / "20250101-090000-myproj"
    folder.mkdir()
    shutil.copy(tl.write_script("ddp_train", tl.new_run_dir("source", tmp_path)), folder)
    before = snapshot(folder)
    runs = [tl.launch(tl.LaunchSpec(folder / "ddp_train.py", args=["--max-steps", steps, "--dataset-size", 256,
                                                                   "--log-every", 1],
                                    nproc_per_node=2, device="cpu", timeout_s=120, live="off")) for steps in (1, 2)]
    assert snapshot(folder) == before and os.listdir(folder) == ["ddp_train.py"], sorted(os.listdir(folder))
    assert sorted(p.name for p in run_root.iterdir()) == sorted(run.run_dir.name for run in runs), "one folder each"
    for run, steps in zip(runs, (1, 2)):
        assert run.run_dir.parent == run_root.resolve() and (run.run_dir / ".tutorial-run").is_file()
        assert sorted(run.metrics().groupby("rank")["step"].count().tolist()) == [steps, steps], run.run_dir


def test_a_folder_holding_your_own_launch_files_is_kept_and_never_read_as_the_runs(tmp_path, run_root, monkeypatch):
    """A fresh user's report: launching a script whose folder (then the default run_dir) held their own output.log,
    run.json and metrics/rank0.jsonl replaced the first two and read the third as the run's metrics. Now the launch
    goes to a fresh run directory, both through ``launch`` and ``run_script``; the folder is neither read nor written."""
    monkeypatch.setenv("TUTORIAL_LIB_RUNS_DIR", str(run_root))
    folder = tmp_path / "x"
    (folder / "metrics").mkdir(parents=True)
    (folder / "myfmt.py").write_text("import os\nprint(f\"step 0 loss {1 + int(os.environ['RANK'])}\", flush=True)\n")
    (folder / "output.log").write_text("my own log\n")
    (folder / "run.json").write_text('{"mine": true}\n')
    (folder / "metrics" / "rank0.jsonl").write_text('{"step": 7, "loss": 9.0}\n')
    before = snapshot(folder)
    launched = tl.launch(tl.LaunchSpec(folder / "myfmt.py", nproc_per_node=2, device="cpu", timeout_s=120))
    result = tl.run_script(folder / "myfmt.py", nproc_per_node=2, device="cpu", timeout_s=120, runs_dir=run_root)
    assert snapshot(folder) == before, "the user's files are neither overwritten nor added to"
    for run in (launched, result):
        assert run.run_dir.parent == run_root.resolve()
        assert run.metrics()[["rank", "step", "loss_local"]].values.tolist() == [[0, 0, 1.0], [1, 0, 2.0]]


def test_a_lessons_run_directory_is_still_the_default_and_a_second_launch_there_is_refused(run_root):
    """``write_script`` into ``new_run_dir``'s folder, then ``LaunchSpec(script)``: the run directory is that folder
    (the notebooks' pattern, the lesson's metrics/ beside it); launched once, it is a record, and a second launch there
    is refused before anything starts, naming what it holds."""
    run_dir = tl.new_run_dir("lesson", run_root)
    script = tl.write_script("collectives_check", run_dir)
    result = tl.launch(tl.LaunchSpec(script, nproc_per_node=2, device="cpu", timeout_s=120))
    assert result.run_dir == run_dir.resolve() and (run_dir / "command.txt").is_file()
    assert sorted(p.name for p in run_root.iterdir()) == [run_dir.name], "no second run directory was made"
    with pytest.raises(tl.ConfigError, match=r"already holds a launch's files \(command.txt, output.log, run.json"):
        tl.launch(tl.LaunchSpec(script, nproc_per_node=2, device="cpu"))
    assert sorted(p.name for p in run_root.iterdir()) == [run_dir.name], "a refused launch makes no folder"


@pytest.mark.parametrize("warm", ["1", "0"], ids=["warm", "cold"])
def test_cwd_runs_the_ranks_in_the_folder_given_and_a_custom_pattern_reads_their_lines(tmp_path, run_root, warm,
                                                                                       monkeypatch):
    monkeypatch.setenv("TUTORIAL_LIB_WARM", warm)
    scripts, data = tmp_path / "scripts", tmp_path / "data folder"
    scripts.mkdir(), data.mkdir()
    (data / "data.txt").write_text("3\n")
    script = scripts / "mine.py"
    script.write_text(
        "import os\n"
        "rank = int(os.environ['RANK'])\n"
        "print(f'cwd={os.getcwd()}', flush=True)\n"
        "base = int(open('data.txt').read())\n"  # next to the notebook, not next to the script
        "for batch in range(1, 4):\n"
        "    print(f'epoch 0 | batch {batch} | train_loss={base * 10 + batch + rank / 10}', flush=True)\n")
    result = tl.launch(tl.LaunchSpec(script, device="cpu", timeout_s=120, run_dir=tl.new_run_dir("mine", run_root),
                                     cwd=data, loss_pattern=r"batch (\d+) \| train_loss=([\d.]+)"))
    log = (result.run_dir / "output.log").read_text()
    assert log.count(f"cwd={data}") == 2, log
    command = (result.run_dir / "command.txt").read_text()
    assert f"cd '{data}' && " in command and command.startswith(f"# ranks run in {data}; ")
    points = result.metrics()
    assert points[["rank", "step"]].values.tolist() == [[0, 1], [0, 2], [0, 3], [1, 1], [1, 2], [1, 3]]
    assert points["loss_local"].tolist() == [31.0, 32.0, 33.0, 31.1, 32.1, 33.1]
    assert sorted(os.listdir(data)) == ["data.txt"] and sorted(os.listdir(scripts)) == ["mine.py"]


def test_a_script_whose_lines_the_loss_pattern_does_not_read_gets_a_metrics_error_that_says_so(tmp_path, run_root):
    script = tmp_path / "arrows.py"
    script.write_text("for s in range(4):\n    print(f'it {s} -> {1 / (s + 1):.3f}', flush=True)\n")
    result = tl.run_script(script, device="cpu", nproc_per_node=2, timeout_s=120, runs_dir=run_root)
    assert result.loss_pattern == tl.runs.DEFAULT_LOSS_PATTERN
    with pytest.raises(tl.errors.MetricsError, match=r"^the script wrote no metrics JSON .* no line it printed matched its "
                                              r"loss_pattern, DEFAULT_LOSS_PATTERN r'.*' \(its last printed line: "
                                              r"'it 3 -> 0\.250'\): pass loss_pattern="):
        result.metrics()


@pytest.mark.parametrize("cwd, message", [
    ("missing", "is not a folder (missing)"),
    ("a file", "is not a folder (a file)"),
    (3, "cwd must be a folder (str or path) or None"),
])
def test_a_bad_working_folder_is_refused_before_anything_starts(tmp_path, run_root, project, cwd, message):
    (tmp_path / "a file").write_text("x")
    if isinstance(cwd, str):
        cwd = tmp_path / cwd
    with pytest.raises(tl.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tl.run_script(project / "train.py", device="cpu", cwd=cwd, runs_dir=run_root)
    assert list(run_root.iterdir()) == [], "the run directory made for the launch is removed, nothing started"
    run_dir = tl.new_run_dir("lesson", run_root)
    with pytest.raises(tl.ConfigError, match="cwd"):
        tl.launch(tl.LaunchSpec(tl.write_script("ddp_train", run_dir), device="cpu", cwd=cwd))
    assert sorted(os.listdir(run_dir)) == [".tutorial-run", "_workbook.py", "ddp_train.py"], "nothing was started"


def test_a_loss_pattern_without_step_and_loss_groups_is_refused_before_anything_starts(project, run_root):
    with pytest.raises(tl.ConfigError, match=r"needs the groups \(\?P<step>...\) and \(\?P<loss>...\)"):
        tl.run_script(project / "train.py", device="cpu", loss_pattern=r"loss (\d+)", runs_dir=run_root)
    with pytest.raises(tl.ConfigError, match="is not a regular expression"):
        tl.run_script(project / "train.py", device="cpu", loss_pattern=r"step (?P<step>\d+", runs_dir=run_root)
    assert list(run_root.iterdir()) == []


NANOGPT_ARGS = ["config/train_shakespeare_char.py", "--device=cpu", "--backend=gloo", "--compile=False",
                "--dtype=float32", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
                "--max_iters=10", "--eval_interval=1000", "--eval_iters=2", "--log_interval=1",
                "--gradient_accumulation_steps=2"]
# The two patches nanoGPT's DDP path needs on a machine without CUDA: it picks `cuda:LOCAL_RANK` and calls
# torch.cuda.set_device whatever --device says, and hands DDP device_ids, which a CPU module must not get.
NANOGPT_CPU_PATCHES = {
    "    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n":
        "    if device.startswith('cuda'):\n        device = f'cuda:{ddp_local_rank}'\n        torch.cuda.set_device(device)\n",
    "    model = DDP(model, device_ids=[ddp_local_rank])\n":
        "    model = DDP(model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None)\n",
}


@pytest.mark.skipif(not os.environ.get("NANOGPT_DIR"), reason="set NANOGPT_DIR to a checkout of karpathy/nanoGPT")
def test_nanogpt_train_py_launches_twice_from_its_folder_with_its_loss_curve(tmp_path, run_root):
    """nanoGPT's train.py with only the two CPU patches (in a copy): its relative config/ and data/ are found, it
    launches twice, and its `iter N: loss X` lines are its loss curve (its eval line `step 0: ... val loss` is not)."""
    import subprocess
    import textwrap

    nanogpt = Path(shutil.copytree(os.environ["NANOGPT_DIR"], tmp_path / "nanoGPT",
                                   ignore=shutil.ignore_patterns(".git", "*.bin", "*.pkl", "input.txt", "out*")))
    train = nanogpt / "train.py"
    source = train.read_text()
    for old, new in NANOGPT_CPU_PATCHES.items():
        assert source.count(old) == 1, f"nanoGPT changed: {old!r}"
        source = source.replace(old, new)
    train.write_text(source)
    data = nanogpt / "data" / "shakespeare_char"  # prepare.py downloads input.txt only when it is missing
    (data / "input.txt").write_text(textwrap.dedent("""\
        First Citizen:
        Before we proceed any further, hear me speak.
        All:
        Speak, speak.
        """) * 80)
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True, timeout=120)
    before = snapshot(nanogpt)
    args = NANOGPT_ARGS + [f"--out_dir={tmp_path / 'out'}"]
    env = {"PYTHONWARNINGS": "ignore"}  # its torch.cuda.amp.GradScaler warns (FutureWarning: an error in the tests)
    results = [tl.run_script(train, args, device="cpu", timeout_s=300, runs_dir=run_root, env=env) for _ in range(2)]
    assert snapshot(nanogpt) == before
    for result in results:
        points = result.metrics()
        assert points["step"].tolist() == list(range(11)) and set(points["rank"]) == {0}
        assert all(line.startswith(f"iter {s}: loss ") for s, line in zip(points["step"], points["line"]))
        assert "val loss" in (result.run_dir / "output.log").read_text(), "the eval line was printed, and left out"
