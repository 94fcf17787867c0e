"""scripts/run_workbook.py refuses options that would overwrite the lessons or cannot work, before any kernel starts."""

import hashlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


@pytest.fixture(scope="module")
def run_workbook():
    spec = importlib.util.spec_from_file_location("run_workbook", ROOT / "scripts" / "run_workbook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.ipynb"))}


@pytest.mark.parametrize("output_dir, notebooks_dir, says", [
    (NOTEBOOKS, NOTEBOOKS, "holds the source notebook(s) 00_environment_check.ipynb"),
    (NOTEBOOKS / "zh" / "..", NOTEBOOKS, "holds the source notebook(s) 00_environment_check.ipynb"),
    (NOTEBOOKS / "zh", NOTEBOOKS / "zh", "holds the source notebook(s) 00_environment_check.ipynb"),
    (NOTEBOOKS, NOTEBOOKS / "zh", "is a folder of the lesson notebooks"),  # the twins would replace the English lessons
])
def test_an_output_folder_of_the_lesson_notebooks_is_refused_with_exit_code_2(run_workbook, capsys, output_dir,
                                                                               notebooks_dir, says):
    before = digests(NOTEBOOKS), digests(NOTEBOOKS / "zh")
    code = run_workbook.main(["--output-dir", str(output_dir), "--notebooks-dir", str(notebooks_dir),
                              "--only", "00_environment_check"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--output-dir {str(output_dir)!r} ({output_dir.resolve()}) {says}" in err, err
    assert "pass another folder, e.g. --output-dir outputs" in err
    assert (digests(NOTEBOOKS), digests(NOTEBOOKS / "zh")) == before, "no lesson was rewritten"


def test_a_folder_linking_to_a_source_notebook_is_refused(run_workbook, tmp_path):
    source = NOTEBOOKS / "00_environment_check.ipynb"
    (tmp_path / source.name).symlink_to(source)
    assert "holds the source notebook(s) 00_environment_check.ipynb" in run_workbook.overwrites_sources(
        tmp_path, NOTEBOOKS, [source])
    assert run_workbook.overwrites_sources(tmp_path / "elsewhere", NOTEBOOKS, [source]) is None
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / source.name).write_text("an earlier executed copy: replaced, as every run replaces it")
    assert run_workbook.overwrites_sources(tmp_path / "out", NOTEBOOKS, [source]) is None


@pytest.mark.parametrize("value, says", [("0", "must be > 0 seconds (a limit per cell), got 0"),
                                         ("-5", "must be > 0 seconds (a limit per cell), got -5"),
                                         ("ten", "'ten' is not a whole number of seconds")])
def test_a_timeout_that_is_not_positive_is_refused_by_argparse(run_workbook, capsys, value, says):
    with pytest.raises(SystemExit) as exited:
        run_workbook.parse_args(["--timeout-s", value])
    assert exited.value.code == 2
    assert f"argument --timeout-s: {says}; e.g. --timeout-s 600" in capsys.readouterr().err
    assert run_workbook.parse_args(["--timeout-s", "30"]).timeout_s == 30


def test_each_kernel_gets_its_own_absolute_socket_paths(run_workbook):
    """jupyter_client's IPC default, "kernel-ipc-N" in the working folder, let two workbook runs started at once in
    one notebooks folder share sockets: each kernel manager now names its own, absolute, in Jupyter's runtime folder."""
    first, second = (run_workbook.IPCKernelManager(kernel_name="python3") for _ in range(2))
    assert first.transport == second.transport == "ipc"
    assert Path(first.ip).is_absolute() and Path(first.ip).parent.is_dir() and first.ip != second.ip
    assert run_workbook.IPCKernelManager(kernel_name="python3", transport="tcp").ip == "127.0.0.1"



def test_notebook_15_is_skipped_with_its_reason_where_torchft_cannot_be_imported(run_workbook, capsys, tmp_path,
                                                                                  monkeypatch):
    """Issue 47: the torch 2.8 compat venv has no torchft; its workbook run skips notebook 15, naming what is
    missing, and still passes (the control: with every module importable nothing is skipped)."""
    assert run_workbook.REQUIRES["15_fault_tolerance"] == ("torchft", "numpy")
    without = lambda name: None if name == "torchft" else object()  # noqa: E731 - find_spec's stand-in
    assert run_workbook.missing_modules("15_fault_tolerance", without) == ["torchft"]
    assert run_workbook.skip_reason("15_fault_tolerance", lambda name: object()) is None
    assert run_workbook.skip_reason("14_compile", without) is None
    monkeypatch.setitem(run_workbook.REQUIRES, "15_fault_tolerance", ("torchft", "no_such_module_47"))
    code = run_workbook.main(["--output-dir", str(tmp_path / "out"), "--only", "15_fault_tolerance"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "skipped: no_such_module_47 not importable in " in out and "0 passed, 0 failed, 1 skipped" in out, out
    assert not (tmp_path / "out" / "15_fault_tolerance.ipynb").exists(), "no kernel ran it"
