"""tl.check_parameters checks the common parameters' values, not only their types: ``-p NPROC 0`` is refused at the
notebook's first cell, naming NPROC and a good flag, before anything is launched."""

from pathlib import Path
from typing import Optional

import nbformat
import pytest

import tutorial_lib as tl
from tutorial_lib.notebook.parameters import DOMAINS, domain

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
DECLARED = {"NPROC": Optional[int], "DEVICE": str, "TIMEOUT_S": float, "STALL_S": float, "MAX_STEPS": int,
            "HIDDEN_DIM": Optional[int], "FAIL_RANK": int, "SMALL_LOSS_WEIGHT": float, "BATCH_SIZES": list,
            "NUM_WORKERS": list, "BUCKET_CAPS_MB": list, "MODEL": list, "RANK_ENV": dict, "RUNS_DIR": Optional[str]}
DEFAULTS = {"NPROC": None, "DEVICE": "auto", "TIMEOUT_S": 120, "STALL_S": 5.0, "MAX_STEPS": 12, "HIDDEN_DIM": None,
            "FAIL_RANK": 0, "SMALL_LOSS_WEIGHT": 1e-5, "BATCH_SIZES": [16, 64], "NUM_WORKERS": [0, 2],
            "BUCKET_CAPS_MB": [25, 0.25], "MODEL": ["--dim", 8], "RANK_ENV": {}, "RUNS_DIR": None}


def namespace(**values):
    return {"__annotations__": dict(DECLARED), **DEFAULTS, **values}


def test_good_values_pass():
    assert tl.check_parameters(namespace()) == DEFAULTS
    good = dict(NPROC=1, DEVICE="cuda", TIMEOUT_S=0.5, MAX_STEPS=1, HIDDEN_DIM=64, NUM_WORKERS=[0], FAIL_RANK=1)
    assert tl.check_parameters(namespace(**good))["NPROC"] == 1


@pytest.mark.parametrize("name, value, message", [
    ("NPROC", 0, "parameter NPROC must be None (2 ranks on CPU, one per GPU) or an integer >= 1, got 0; "
                 "from the command line: -p NPROC 2"),
    ("NPROC", -2, "got -2; from the command line: -p NPROC 2"),
    ("DEVICE", "gpu", "parameter DEVICE must be 'auto', 'cpu' or 'cuda', got 'gpu'; from the command line: -p DEVICE cpu"),
    ("TIMEOUT_S", 0, "parameter TIMEOUT_S must be seconds > 0, got 0; from the command line: -p TIMEOUT_S 60"),
    ("TIMEOUT_S", -1.5, "parameter TIMEOUT_S must be seconds > 0, got -1.5"),
    ("STALL_S", 0, "parameter STALL_S must be seconds > 0, got 0"),
    ("MAX_STEPS", 0, "parameter MAX_STEPS must be an integer >= 1, got 0; from the command line: -p MAX_STEPS 4"),
    ("HIDDEN_DIM", 0, "parameter HIDDEN_DIM must be None (the lesson's default) or an integer >= 1, got 0"),
    ("FAIL_RANK", -1, "parameter FAIL_RANK must be >= 0, got -1"),
    ("SMALL_LOSS_WEIGHT", 0, "parameter SMALL_LOSS_WEIGHT must be a number > 0, got 0"),
    ("BATCH_SIZES", [], "parameter BATCH_SIZES must be a non-empty list of integers >= 1, got []; "
                        "from the command line: -y 'BATCH_SIZES: [16, 64]'"),
    ("BATCH_SIZES", [16, 0], "got [16, 0]"),
    ("NUM_WORKERS", [-1], "parameter NUM_WORKERS must be a non-empty list of integers >= 0, got [-1]"),
    ("BUCKET_CAPS_MB", [25, 0], "parameter BUCKET_CAPS_MB must be a non-empty list of numbers > 0 (MiB), got [25, 0]"),
])
def test_a_value_outside_its_domain_names_the_parameter_the_value_and_a_good_flag(name, value, message):
    with pytest.raises(tl.ConfigError) as refused:
        tl.check_parameters(namespace(**{name: value}))
    assert message in str(refused.value), str(refused.value)


def test_the_type_is_checked_before_the_value():
    with pytest.raises(tl.ConfigError, match="parameter NPROC must be int or None, got '0' \\(str\\)"):
        tl.check_parameters(namespace(NPROC="0"))


def test_any_seconds_parameter_must_be_positive_and_others_have_no_domain():
    assert domain("SOME_NEW_LIMIT_S")[0](3) and not domain("SOME_NEW_LIMIT_S")[0](0)
    assert domain("MODEL") is None and domain("RANK_ENV") is None and domain("RUNS_DIR") is None


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) + sorted(NOTEBOOKS.glob("zh/[0-9][0-9]_*.ipynb")),
                         ids=lambda p: str(p.relative_to(NOTEBOOKS)))
def test_every_notebooks_defaults_pass_the_value_checks(path):
    cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
    values: dict = {}
    exec("from typing import Optional\n" + cell.source, values)  # the parameters cell: plain assignments
    checked = tl.check_parameters(values)
    assert checked and all(name in values for name in checked)


def test_every_name_with_a_domain_is_a_parameter_of_some_notebook():
    declared = set()
    for path in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"):
        cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
        declared |= {line.split(":")[0].strip() for line in cell.source.splitlines() if ":" in line.split("=")[0]}
    assert set(DOMAINS) <= declared, set(DOMAINS) - declared
