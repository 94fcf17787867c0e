"""tl.check_parameters: a notebook's declared parameter types, checked after papermill injected the values."""

from __future__ import annotations

from typing import Optional

import pytest

import tutorial_lib as tl

DECLARED = {"NPROC": Optional[int], "DEVICE": str, "SMALL_LOSS_WEIGHT": float, "RANK_ENV": dict, "MODEL": list,
            "RUNS_DIR": Optional[str], "FLAG": bool}
DEFAULTS = {"NPROC": None, "DEVICE": "auto", "SMALL_LOSS_WEIGHT": 1e-5, "RANK_ENV": {}, "MODEL": ["--dim", 8],
            "RUNS_DIR": None, "FLAG": False}


def namespace(**values):
    return {"__annotations__": dict(DECLARED), **DEFAULTS, **values}


def test_the_defaults_and_well_typed_values_pass():
    assert tl.check_parameters(namespace()) == DEFAULTS
    assert tl.check_parameters(namespace(NPROC=4, SMALL_LOSS_WEIGHT=1, RUNS_DIR="/tmp/x", FLAG=True))["NPROC"] == 4


@pytest.mark.parametrize("name, value, message", [
    ("NPROC", "None", "parameter NPROC must be int or None, got 'None' (str); from the command line: -p NPROC 2"),
    ("NPROC", True, "parameter NPROC must be int or None, got True (bool)"),
    ("NPROC", 2.0, "parameter NPROC must be int or None, got 2.0 (float)"),
    ("SMALL_LOSS_WEIGHT", "1e-5", "parameter SMALL_LOSS_WEIGHT must be float, got '1e-5' (str); "
                                  "from the command line: -p SMALL_LOSS_WEIGHT 0.5"),
    ("RANK_ENV", '{"NCCL_P2P_DISABLE": "1"}', "parameter RANK_ENV must be dict, got '{\"NCCL_P2P_DISABLE\": \"1\"}' "
                                              "(str); from the command line: -y 'RANK_ENV: {KEY: value}'"),
    ("MODEL", "[1, 2]", "-y 'MODEL: [1, 2]'"),
    ("DEVICE", None, "parameter DEVICE must be str, got None (NoneType); from the command line: -p DEVICE cpu"),
])
def test_a_wrong_type_names_the_parameter_the_value_and_the_flag(name, value, message):
    with pytest.raises(tl.ConfigError) as info:
        tl.check_parameters(namespace(**{name: value}))
    assert message in str(info.value), str(info.value)


def test_a_notebook_without_annotations_is_told_how_to_declare_them():
    with pytest.raises(tl.ConfigError, match="NAME: type = default"):
        tl.check_parameters({"NPROC": None})


def test_every_notebook_declares_its_parameters_in_a_form_papermill_reads_and_checks_them_first():
    """papermill's own inspection (``papermill --help-notebook``) sees every parameter with its type, and the
    first cell after the parameters cell calls tl.check_parameters before anything else."""
    from pathlib import Path

    import nbformat
    import papermill as pm

    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        inferred = pm.inspect_notebook(str(path))
        assert inferred and all(p["inferred_type_name"] not in ("None", "") for p in inferred.values()), inferred
        code = [c for c in nb.cells if c.cell_type == "code"]
        index = next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
        assert code[index + 1].source.startswith("tl.check_parameters(globals())"), path.name


def test_every_notebook_makes_the_setup_call_before_it_launches_or_draws():
    """Importing tutorial_lib starts and registers nothing: each notebook calls tl.setup_notebook(RANK_ENV) (the rank
    environment for every launch, figures inline, the warm-start helper) in its setup, before any launch or figure."""
    import re
    from pathlib import Path

    import nbformat

    uses = re.compile(r"tl\.(run_script|launch|run_in_process|plot_\w+)\(")
    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        code = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        first_call = re.compile(r"(tl\.check_parameters\(globals\(\)\).*\n)?tl\.setup_notebook\(RANK_ENV\)")
        setup = next((i for i, c in enumerate(code) if first_call.match(c)), None)
        first_use = next((i for i, c in enumerate(code) if uses.search(c)), len(code))
        assert setup is not None and setup <= first_use, path.name  # its first line (after the parameter check), before what its cell defines
        assert not any("set_rank_env" in c for c in code), f"{path.name}: setup_notebook sets RANK_ENV"
