"""Run directories and scripts on disk: unique, confined, never overwritten, shown with line numbers."""

import shutil
import sys
from pathlib import Path

import pytest

import tutorial_lib as tl
from tutorial_lib import ConfigError
from tutorial_lib.runs.rundir import LESSONS_DIR


def test_shipped_scripts_are_listed():
    assert {"ddp_train", "collectives_check"} <= set(tl.runs.available_scripts())


def test_run_dirs_are_fresh_and_unique(tmp_path):
    a = tl.new_run_dir("ddp", tmp_path)
    b = tl.new_run_dir("ddp", tmp_path)
    assert a != b and a.is_dir() and b.is_dir() and a.parent == b.parent == tmp_path.resolve()
    assert [p.name for p in a.iterdir()] == [".tutorial-run"], "only the mark that the library made it"


def test_runs_root_defaults_to_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("TUTORIAL_LIB_RUNS_DIR", str(tmp_path / "from-env"))
    assert tl.new_run_dir("x").parent == (tmp_path / "from-env").resolve()


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", "", "-flag", "x" * 200, "sp ace", 3])
def test_run_dir_names_cannot_escape_the_root(tmp_path, name):
    with pytest.raises(ConfigError, match="run name"):
        tl.new_run_dir(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_root_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a user's file")
    with pytest.raises(ConfigError, match="runs folder"):
        tl.new_run_dir("x", blocker)
    assert blocker.read_text() == "a user's file"


def test_write_script_copies_unchanged_and_never_overwrites(tmp_path):
    path = tl.write_script("ddp_train", tmp_path)
    assert path == (tmp_path / "ddp_train.py").resolve()
    assert path.read_bytes() == (LESSONS_DIR / "ddp_train.py").read_bytes()
    path.write_text("# my edits")
    with pytest.raises(ConfigError, match="already exists"):
        tl.write_script("ddp_train.py", tmp_path)
    assert path.read_text() == "# my edits"


def test_write_script_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="unknown script 'nope'; available: .*ddp_train"):
        tl.write_script("nope", tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        tl.write_script("ddp_train", tmp_path / "missing")


def test_show_script_numbers_lines_and_finds_functions(tmp_path):
    path = tl.write_script("ddp_train", tmp_path)
    source = path.read_text().splitlines()
    listing = str(tl.show_script(path, "setup"))
    first = next(i for i, line in enumerate(source, 1) if line.startswith("def setup("))
    assert listing.splitlines()[1].lstrip() == f"{first}  def setup(args):"  # numbers right-aligned to the widest shown
    assert "@record" in str(tl.show_script(path, "main")), "decorators are part of the listing"
    both = str(tl.show_script(path, "make_model", "setup"))
    assert both.index("def make_model") < both.index("\n...\n") < both.index("def setup")
    assert str(tl.show_script(path, first_line=2, last_line=3)).splitlines()[1:] == [f"2  {source[1]}", f"3  {source[2]}"]
    assert "<span" in tl.show_script(path, "setup")._repr_html_()
    with pytest.raises(ConfigError, match="no top-level function or class 'nope'"):
        tl.show_script(path, "nope")
    instruments = str(tl.show_script(path, "make_profiler"))  # the lesson's instruments, in _workbook.py beside it
    assert instruments.startswith("# _workbook.py") and "def make_profiler" in instruments


def test_write_script_puts_the_instruments_beside_a_lesson_that_imports_them(tmp_path):
    tl.write_script("ddp_train", tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.py")) == ["_workbook.py", "ddp_train.py"]
    assert tl.script_path(tmp_path).name == "ddp_train.py", "a helper is never the run's script"
    assert tl.import_script(tmp_path / "ddp_train.py").workbook is not None
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "ddp_train.py").write_bytes((tmp_path / "ddp_train.py").read_bytes())
    assert tl.import_script(alone / "ddp_train.py").workbook is None, "no _workbook.py beside it: none, not a cached one"
    other = tmp_path / "other"
    other.mkdir()
    tl.write_script("sampler_demo", other)
    assert sorted(p.name for p in other.glob("*.py")) == ["sampler_demo.py"], "only for a lesson that imports them"


def test_a_lessons_plain_imports_travel_with_it_and_are_never_the_script(tmp_path):
    """train_lm.py imports its model, data and checkpoints as nanoGPT's train.py imports model.py (issue 48)."""
    siblings = ["lm_checkpoint.py", "lm_data.py", "lm_model.py"]
    assert not {Path(name).stem for name in siblings} & set(tl.runs.available_scripts()), "modules, not lessons"
    assert "train_lm" in tl.runs.available_scripts()
    tl.write_script("train_lm", tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.py")) == ["_workbook.py", *siblings, "train_lm.py"]
    assert tl.script_path(tmp_path).name == "train_lm.py", "a module the script imports is never the run's script"
    assert str(tl.show_script(tmp_path / "train_lm.py", "GPT")).startswith("# lm_model.py\n")
    assert str(tl.show_script(tmp_path / "train_lm.py", "build_model")).startswith("# train_lm.py\n")
    model = tmp_path / "lm_model.py"
    model.write_text(model.read_text() + "\nMARK = 'this run folder'\n")
    other = tmp_path / "other"
    other.mkdir()
    tl.write_script("train_lm", other)
    marked = [("MARK" in tl.import_script(folder / "train_lm.py").GPT.forward.__globals__)
              for folder in (tmp_path, other, tmp_path)]
    assert marked == [True, False, True], "each copy's GPT comes from the lm_model.py beside it, never a cached one"
    assert "lm_model" not in sys.modules, "nothing left behind in sys.modules"


def test_import_script_gives_the_scripts_classes_without_running_main(tmp_path):
    """Notebook 05 builds the plain model a checkpoint was saved from (issue 17: no importlib in the cell)."""
    by_name = tl.import_script("checkpoint_train")
    copy = tl.import_script(tl.write_script("checkpoint_train", tmp_path))
    assert by_name.MLP.__name__ == copy.MLP.__name__ == "MLP" and callable(copy.main)
    assert not (tmp_path / "metrics").exists(), "main() did not run"
    with pytest.raises(tl.ConfigError, match="'no_such_script' is neither a file nor a shipped script"):
        tl.import_script("no_such_script")


def test_checking_a_scripts_arguments_swaps_no_process_wide_stream(tmp_path, capsys):
    """Launches from several threads check their arguments at once: a check that swapped sys.stdout could leave it
    swapped for every later print (seen with two threads). The script's own parse_args sees the streams as they are,
    and a rejection is reported in the error, printed nowhere."""
    import sys

    from tutorial_lib.notebook.script_source import check_script_args
    script = tmp_path / "s.py"
    script.write_text("import argparse, sys\nSEEN = []\n\ndef parse_args(argv):\n    SEEN.append((sys.stdout, sys.stderr))\n"
                      "    p = argparse.ArgumentParser()\n    p.add_argument('--steps', type=int, required=True)\n"
                      "    args = p.parse_args(argv)\n    if args.steps < 1:\n        p.error('--steps must be >= 1')\n"
                      "    return args\n")
    out, err = sys.stdout, sys.stderr
    module = check_script_args(script, ["--steps", 3])
    assert module.SEEN == [(out, err)], "parse_args ran with this process's own streams"
    assert module.argparse.ArgumentParser is __import__("argparse").ArgumentParser, "the module is left as it was"
    with pytest.raises(ConfigError, match=r"s.py: argument --steps: invalid int value: 'x' \(it was given"):
        check_script_args(script, ["--steps", "x"])
    with pytest.raises(ConfigError, match="s.py: --steps must be >= 1"):
        check_script_args(script, ["--steps", 0])
    check_script_args(script, ["--help"])
    assert sys.stdout is out and sys.stderr is err
    assert capsys.readouterr() == ("", ""), "nothing printed: not the usage, not the help"


def test_a_lessons_run_directory_is_told_from_a_learners_folder(tmp_path):
    """``launch``'s default run directory (issue 34): the script's folder only when it holds lesson copies and what
    their launch wrote; any file of the learner's makes it theirs, and the launch then gets a fresh run directory."""
    from tutorial_lib.runs.rundir import is_lesson_run_dir

    lesson = tl.new_run_dir("lesson", tmp_path)
    tl.write_script("ddp_train", lesson)
    assert is_lesson_run_dir(lesson)
    (lesson / "command.txt").write_text("")
    (lesson / "metrics").mkdir()
    (lesson / ".ipynb_checkpoints").mkdir()
    assert is_lesson_run_dir(lesson), "a launched lesson's run directory is still one (a second launch is refused)"
    project = tmp_path / "my_project"
    project.mkdir()
    assert not is_lesson_run_dir(project), "an empty folder holds no lesson"
    (project / "train.py").write_text("print('mine')\n")
    assert not is_lesson_run_dir(project)
    tl.write_script("ddp_train", project)
    assert not is_lesson_run_dir(project), "a lesson copied beside the learner's own script: still the learner's"
    (project / "train.py").unlink()
    (project / "data").mkdir()
    assert not is_lesson_run_dir(project), "a data folder is the learner's"
    by_hand = tmp_path / "myproj"
    by_hand.mkdir()
    shutil.copy(LESSONS_DIR / "ddp_train.py", by_hand)  # issue 48: a lesson copied alone, by hand
    assert not is_lesson_run_dir(by_hand), "a lesson the learner copied by hand into their folder is theirs"
    written = tmp_path / "written"
    written.mkdir()
    tl.write_script("ddp_train", written)
    assert is_lesson_run_dir(written), "write_script's copy in a plain folder makes it a run directory"
    made = tl.new_run_dir("mine", tmp_path)
    (made / "mine.py").write_text("print('mine')\n")
    assert is_lesson_run_dir(made), "a script of one's own copied into a folder new_run_dir made for it"
    (made / "grads").mkdir()  # a lesson's own output folder (--save-grads-dir grads): still its run directory
    assert is_lesson_run_dir(made), "a folder new_run_dir made stays a run directory (a second launch is refused)"
    named_like_one = tmp_path / "20250101-090000-myproj"  # issue 48: the decision is the library's mark, not the name
    named_like_one.mkdir()
    shutil.copy(LESSONS_DIR / "ddp_train.py", named_like_one)
    assert not is_lesson_run_dir(named_like_one), "a learner's folder named like a run directory is still theirs"
    tl.write_script("collectives_check", named_like_one)
    assert not is_lesson_run_dir(named_like_one), "a lesson copy beside one copied by hand: still the learner's"
    (named_like_one / "ddp_train.py").unlink()
    assert is_lesson_run_dir(named_like_one), "holding only write_script's copy, it is one"
    (made / ".tutorial-run").unlink()
    assert not is_lesson_run_dir(made), "without new_run_dir's mark, the name alone makes no run directory"
