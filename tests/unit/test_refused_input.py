"""Bad input is refused before anything is made or launched, naming the value and what to do; nothing a user made
is overwritten, and a refused call leaves no run directory behind. Nothing here starts a process."""

import os

import pytest

import tutorial_lib as tl
from tutorial_lib import ConfigError, LaunchSpec
from tutorial_lib.launcher.run import own_script
from tutorial_lib.launcher.spec import check_spec_fields
from tutorial_lib.runs.rundir import LAUNCH_OUTPUTS, launch_outputs_in, shipped_script


def snapshot(folder):
    """Every entry under ``folder`` with its content (files) or ``None`` (folders), by relative path."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture
def users_folder(tmp_path):
    """A learner's folder: their script beside their own output.log, run.json and metrics/rank0.jsonl."""
    folder = tmp_path / "x"
    (folder / "metrics").mkdir(parents=True)
    (folder / "myfmt.py").write_text("print('hello')\n")
    (folder / "output.log").write_text("my own log\n")
    (folder / "run.json").write_text('{"mine": true}\n')
    (folder / "metrics" / "rank0.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    return folder


def test_a_run_dir_holding_what_a_launch_writes_is_refused_naming_each_and_nothing_is_touched(users_folder):
    """A run_dir given explicitly is used as it is, so one that holds a launch's files is refused. (Without run_dir the
    launch goes to a fresh run directory: tests/integration/test_own_script.py.)"""
    before = snapshot(users_folder)
    with pytest.raises(ConfigError) as refused:
        tl.launch(LaunchSpec(users_folder / "myfmt.py", nproc_per_node=2, device="cpu", run_dir=users_folder))
    message = str(refused.value)
    assert f"run_dir {str(users_folder)!r} already holds a launch's files (output.log, run.json, metrics/)" in message
    assert "run_dir=new_run_dir(label)" in message and "run_script('path/to/script.py', args)" in message
    assert snapshot(users_folder) == before, "nothing the user made is overwritten, nothing is added"


@pytest.mark.parametrize("name", LAUNCH_OUTPUTS)
@pytest.mark.parametrize("kind", ["file", "folder"])
def test_each_name_a_launch_writes_is_refused_as_a_file_or_a_folder(tmp_path, name, kind):
    script = tl.write_script("ddp_train", tmp_path)
    (tmp_path / name).mkdir() if kind == "folder" else (tmp_path / name).write_text("mine")
    assert launch_outputs_in(tmp_path) == [name]
    with pytest.raises(ConfigError, match=f"already holds a launch's files \\({name}{'/' if kind == 'folder' else ''}\\)"):
        LaunchSpec(script, device="cpu").validate(gpu_count=0)


def test_the_launcher_writes_names_come_from_rundir():
    rundir = tl.runs.rundir
    assert set(LAUNCH_OUTPUTS) == {rundir.COMMAND_TXT, rundir.OUTPUT_LOG, rundir.RUN_RECORD, rundir.LOGS,
                                   rundir.METRICS_SUBDIR, rundir.SAMPLES_SUBDIR, rundir.OBSERVED_SUBDIR}


def test_a_fresh_run_dir_holding_only_the_copied_script_is_accepted(tmp_path):
    run_dir = tl.new_run_dir("fresh", tmp_path)
    script = tl.write_script("ddp_train", run_dir)
    assert launch_outputs_in(run_dir) == []
    assert LaunchSpec(script, device="cpu", nproc_per_node=2).validate(gpu_count=0).nproc_per_node == 2
    (run_dir / "notes.txt").write_text("a file a launch never writes")
    LaunchSpec(script, device="cpu").validate(gpu_count=0)


@pytest.mark.parametrize("given, field", [("nproc", "nproc_per_node"), ("nprocs", "nproc_per_node"),
                                          ("timeout", "timeout_s"), ("devices", "device"), ("rundir", "run_dir")])
def test_an_unknown_launchspec_field_is_a_config_error_naming_the_closest(tmp_path, given, field):
    with pytest.raises(ConfigError, match=f"unknown LaunchSpec field '{given}': did you mean {field}=...\\?"):
        LaunchSpec(tmp_path / "t.py", **{given: 2})
    with pytest.raises(ConfigError, match=f"did you mean {field}="):
        check_spec_fields([given])
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_field_with_no_close_one_lists_the_fields():
    with pytest.raises(ConfigError, match="unknown LaunchSpec field 'world_size': fields: script, args, nproc_per_node"):
        check_spec_fields(["world_size"])
    check_spec_fields(["nproc_per_node", "device", "timeout_s"])


@pytest.mark.parametrize("spec, match", [
    ({"nproc": 2}, "unknown LaunchSpec field 'nproc': did you mean nproc_per_node="),
    ({"timeout": 5}, "unknown LaunchSpec field 'timeout': did you mean timeout_s="),
    ({"device": "gpu"}, "device must be one of \\('auto', 'cpu', 'cuda'\\), got 'gpu'"),
    ({"nproc_per_node": 0}, "nproc_per_node must be >= 1, got 0"),
    ({"nproc_per_node": "2"}, "nproc_per_node must be a positive integer, got '2'"),
    ({"timeout_s": 0}, "timeout_s must be a number > 0, got 0"),
    ({"run_dir": "x"}, "run_script makes a fresh one: runs_dir="),
])
def test_run_script_refuses_a_bad_spec_and_leaves_no_run_directory(tmp_path, spec, match):
    root = tmp_path / "runs"
    with pytest.raises(ConfigError, match=match):
        tl.run_script("ddp_train", ["--max-steps", 2], runs_dir=root, **{"device": "cpu", **spec})
    assert not root.exists() or list(root.iterdir()) == [], "no run directory is left behind"


def test_run_script_refuses_a_bad_script_argument_and_leaves_no_run_directory(tmp_path):
    root = tmp_path / "runs"
    with pytest.raises(ConfigError, match="unrecognized arguments: --max-stepz"):
        tl.run_script("ddp_train", ["--max-stepz", 2], runs_dir=root, device="cpu")
    assert not root.exists(), "the runs folder made for the refused launch is gone with it"


def test_a_bad_spec_for_your_own_script_leaves_no_run_directory_and_your_folder_untouched(users_folder, tmp_path):
    root, before = tmp_path / "runs", snapshot(users_folder)
    with pytest.raises(ConfigError, match="device must be one of"):
        tl.run_script(users_folder / "myfmt.py", runs_dir=root, device="gpu")
    assert not root.exists() and snapshot(users_folder) == before


@pytest.mark.parametrize("call", [
    lambda root: tl.run_in_process("ddp_trian", [], runs_dir=root),
    lambda root: tl.run_script("ddp_trian", [], runs_dir=root),
    lambda root: tl.write_script("ddp_trian", root),
    lambda root: tl.import_script("ddp_trian"),
    lambda root: shipped_script("ddp_trian.py"),
])
def test_a_misspelt_script_name_says_did_you_mean_and_makes_nothing(tmp_path, monkeypatch, call):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    root.mkdir()
    with pytest.raises(ConfigError, match="ddp_trian.*did you mean 'ddp_train'\\?"):
        call(root)
    assert os.listdir(tmp_path) == ["runs"] and list(root.iterdir()) == []


def test_a_refused_launch_leaves_no_runs_folder_but_keeps_one_that_was_there(tmp_path, monkeypatch):
    """Issue 48: every refused launch left an empty ``runs/`` in the working folder; one that was there stays."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUTORIAL_LIB_RUNS_DIR", raising=False)
    for call in (lambda: tl.run_script("ddp_train", ["--bogus"]), lambda: tl.run_script("ddp_train", nproc_per_node=0)):
        with pytest.raises(ConfigError):
            call()
        assert os.listdir(tmp_path) == []
    (tmp_path / "runs").mkdir()  # the learner's own (empty) runs folder
    with pytest.raises(ConfigError):
        tl.run_script("ddp_train", ["--bogus"])
    assert os.listdir(tmp_path) == ["runs"] and os.listdir(tmp_path / "runs") == []


def test_run_in_process_refuses_bad_arguments_and_leaves_no_run_directory(tmp_path):
    with pytest.raises(ConfigError, match="unrecognized arguments: --bogus"):
        tl.run_in_process("ddp_train", ["--bogus"], runs_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_name_far_from_every_script_gets_no_guess():
    with pytest.raises(ConfigError) as refused:
        shipped_script("zzzz")
    assert "did you mean" not in str(refused.value) and "available: " in str(refused.value)


@pytest.mark.parametrize("given", ["path", "str", "slash", "bare"])
def test_a_folder_given_to_run_script_is_named_as_a_folder_with_its_scripts(tmp_path, monkeypatch, given):
    """Issue 48: a folder given as the script is named as a folder, with the .py files in it, as ``launch`` names it;
    nothing is made."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUTORIAL_LIB_RUNS_DIR", raising=False)
    folder = tmp_path / "myproj"
    folder.mkdir()
    tl.write_script("ddp_train", folder)
    script = {"path": folder, "str": str(folder), "slash": f"{folder}/", "bare": "myproj"}[given]
    before = snapshot(tmp_path)
    named = r"is a folder, not a script: give the .py file to run \(in it: ddp_train.py\)"
    with pytest.raises(ConfigError, match=named):
        tl.run_script(script, device="cpu")
    with pytest.raises(ConfigError, match=named):
        tl.launch(LaunchSpec(script, device="cpu"))
    (folder / "ddp_train.py").unlink()
    with pytest.raises(ConfigError, match=r"is a folder, not a script: give the .py file to run \(it holds no .py"):
        tl.run_script(script, device="cpu")
    assert snapshot(tmp_path) == {k: v for k, v in before.items() if k != "myproj/ddp_train.py"}, "nothing made"
    (folder / "train.py").write_text("print('mine')\n")
    assert own_script(folder / "train.py") == (folder / "train.py").resolve(), "the script in it is taken"


BAD_TYPES = [
    ({"env": None}, r"env must be a dict of environment variables \(str to str; \{\} for none\), got None"),
    ({"args": None}, r"args must be a list of the script's arguments \(e.g. \['--max-steps', 20\]; \[\] for none\), "
                     r"got None"),
    ({"args": 5}, r"args must be a list of the script's arguments .*, got 5"),
    ({"start_nodes": 1}, r"start_nodes must be a list of node ranks in 0..0 or None \(every node\), got 1"),
    ({"nproc_per_node": 0}, "nproc_per_node must be >= 1, got 0"),
    ({"timeout_s": -1}, "timeout_s must be a number > 0, got -1"),
    ({"live": "nah"}, "live must be one of"),
]


@pytest.mark.parametrize("spec, match", BAD_TYPES, ids=[str(s) for s, _ in BAD_TYPES])
@pytest.mark.parametrize("how", ["launch", "run_script own", "run_script shipped"])
def test_a_refused_launch_writes_nothing_whatever_the_bad_value(tmp_path, monkeypatch, spec, match, how):
    """Issue 48: every refused launch writes nothing: a bad value of the wrong type (``env=None``, ``args=5``) was a
    TypeError or AttributeError from inside the planning that left the run directory made for it behind; now it is
    a ``ConfigError`` naming the value, and the folders made for the launch are removed again."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUTORIAL_LIB_RUNS_DIR", raising=False)
    folder = tmp_path / "myproj"
    folder.mkdir()
    (folder / "train.py").write_text("print('mine')\n")
    before = snapshot(tmp_path)
    call = {"launch": lambda: tl.launch(LaunchSpec(folder / "train.py", **{"device": "cpu", **spec})),
            "run_script own": lambda: tl.run_script(folder / "train.py", **{"device": "cpu", **spec}),
            "run_script shipped": lambda: tl.run_script("ddp_train", **{"device": "cpu", **spec})}[how]
    with pytest.raises(ConfigError, match=match):
        call()
    assert snapshot(tmp_path) == before, "no runs/ folder, no run directory, nothing in the learner's folder"


def test_a_refused_launch_removes_the_parents_it_made_for_its_runs_folder_and_keeps_the_rest(tmp_path):
    """Issue 48: ``runs_dir=a/b/runs`` made ``a/`` and ``a/b/`` too, and a refused launch left them behind."""
    with pytest.raises(ConfigError, match="nproc_per_node must be >= 1"):
        tl.run_script("ddp_train", nproc_per_node=0, runs_dir=tmp_path / "a" / "b" / "runs", device="cpu")
    assert os.listdir(tmp_path) == [], "a/, a/b/ and a/b/runs/ are gone"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mine.txt").write_text("the learner's")
    with pytest.raises(ConfigError, match="nproc_per_node must be >= 1"):
        tl.run_script("ddp_train", nproc_per_node=0, runs_dir=tmp_path / "a" / "b" / "runs", device="cpu")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["a", "a/mine.txt"], "a/ stays"


def test_an_exception_while_planning_removes_the_run_directory_made_for_it(tmp_path, monkeypatch):
    """Not only a ``ConfigError``: whatever stops a launch before it starts (a bug, an interrupt) leaves nothing."""
    import tutorial_lib.launcher.run as run

    def broken(spec):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "_plan_any", broken)
    with pytest.raises(KeyboardInterrupt):
        tl.run_script("ddp_train", runs_dir=tmp_path / "runs", device="cpu")
    assert os.listdir(tmp_path) == []
