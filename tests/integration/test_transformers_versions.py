"""tl.planning.plan_hf on each transformers the workbook installs (issue 43): no torch-internal warning reaches a learner's cell,
the bytes are the same with and without the ``kernels`` package whose modules made torch's tracker warn, and the
compat environment (Python 3.10 + torch 2.8, the seeds' image: the lock's older transformers) holds the locked
versions and plans without a warning too."""

import contextlib
import json
import os
import subprocess
import sys
import warnings

import pytest

import tutorial_lib as tl
from conftest import ROOT
from tutorial_lib.notebook.script_source import import_script
from tutorial_lib.planning import hf_plan
from tutorial_lib.planning.tracker_counting import HIERARCHY_WARNING

pytestmark = pytest.mark.integration

hf = import_script("train_hf")
COMPAT_PYTHON = ROOT / ".venv-torch2.8" / "bin" / "python"
PLAN_KWARGS = dict(world_size=2, seq_len=64, layout="bf16")
# Run by another interpreter: {prelude} first (hide a package), then every warning an error, then the plan.
PLAN_PROGRAM = """
import json, sys, warnings
{prelude}
import torch, transformers
import tutorial_lib as tl
from transformers.models.qwen2 import modeling_qwen2
warnings.simplefilter("error")
plan = tl.planning.plan_hf(sys.argv[1], **json.loads(sys.argv[2]))
print(json.dumps({{"peak_bytes": dict(plan.peak_bytes), "transformers": transformers.__version__,
                   "torch": torch.__version__, "rotary": type(modeling_qwen2.apply_rotary_pos_emb).__name__}}))
"""


def tiny_folder(tmp_path):
    """A tiny Qwen2 config.json (planning needs no weights), written by this environment's transformers."""
    from transformers import AutoConfig
    AutoConfig.for_model("qwen2", **hf.TINY, tie_word_embeddings=True).save_pretrained(tmp_path)
    return tmp_path


def plan_in(python, folder, prelude=""):
    """The plan (and the versions it ran on) from ``python`` in a process of its own, every warning an error."""
    done = subprocess.run([str(python), "-c", PLAN_PROGRAM.format(prelude=prelude), str(folder),
                           json.dumps(PLAN_KWARGS)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, f"{python}: rc {done.returncode}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def rotary_is_a_kernels_module():
    from transformers.models.qwen2 import modeling_qwen2
    return type(modeling_qwen2.apply_rotary_pos_emb).__name__ == "Func"


def test_the_planner_warns_nothing_and_its_control_shows_the_trackers_warning_once_per_layer(tmp_path, monkeypatch):
    import transformers
    folder = tiny_folder(tmp_path)
    formatwarning = warnings.formatwarning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tl.planning.plan_hf(folder, **PLAN_KWARGS)
    assert warnings.formatwarning is formatwarning, "the tracker's replacement of warnings.formatwarning stayed"
    # The control: the same plan without the silencing. With the kernels package's Func modules (transformers 5.25)
    # torch's tracker warns once per attention layer of the tracked forward; without them (5.20) never.
    monkeypatch.setattr(hf_plan, "hierarchy_warning_silenced", contextlib.nullcontext)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tl.planning.plan_hf(folder, **PLAN_KWARGS)
    warnings.formatwarning = formatwarning  # the tracker replaced it, unsilenced
    hierarchy = [w for w in caught if HIERARCHY_WARNING in str(w.message)]
    expected = hf.TINY["num_hidden_layers"] if rotary_is_a_kernels_module() else 0
    print(f"transformers {transformers.__version__}: rotary embedding a kernels Func: {rotary_is_a_kernels_module()}; "
          f"{len(hierarchy)} hierarchy warnings without the silencing")
    assert len(hierarchy) == expected, [str(w.message) for w in caught]


def test_the_plan_is_the_same_byte_for_byte_without_the_kernels_package(tmp_path):
    folder = tiny_folder(tmp_path)
    here = tl.planning.plan_hf(folder, **PLAN_KWARGS)
    # sys.modules["kernels"] = None: transformers finds no kernels package and keeps apply_rotary_pos_emb a function.
    without = plan_in(sys.executable, folder, prelude='sys.modules["kernels"] = None')
    assert without["rotary"] == "function"
    assert without["peak_bytes"] == dict(here.peak_bytes)
    print(f"rotary embedding here a {'kernels Func' if rotary_is_a_kernels_module() else 'function'}, without kernels "
          f"a function: {here.total_bytes} bytes both")


def test_the_compat_environment_holds_the_locked_versions_and_plans_without_a_warning(tmp_path):
    """The seeds' pair (torch 2.8, Python 3.10) in ``make compat``'s venv: CI builds it in leg 1, before this runs
    (``TUTORIAL_LIB_REQUIRE_COMPAT=1`` there turns the skip into a failure)."""
    if not COMPAT_PYTHON.exists():
        message = f"no {COMPAT_PYTHON.parent.parent.name}/: `make compat` builds it (torch 2.8, Python 3.10)"
        if os.environ.get("TUTORIAL_LIB_REQUIRE_COMPAT") == "1":
            pytest.fail(f"TUTORIAL_LIB_REQUIRE_COMPAT=1 but {message}")
        pytest.skip(message)
    check = subprocess.run([str(COMPAT_PYTHON), "scripts/check_lock.py", "--extras", "", "--json"],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    report = json.loads(check.stdout)
    assert report["differences"] == [] and "transformers" in report["checked"], report
    plan = plan_in(COMPAT_PYTHON, tiny_folder(tmp_path))
    import transformers
    print(f"compat: Python {report['python']}, torch {plan['torch']}, transformers {plan['transformers']} "
          f"(rotary embedding a {plan['rotary']}), {len(report['checked'])} distributions as locked; "
          f"this venv: transformers {transformers.__version__}")
    assert plan["transformers"] == report["checked"]["transformers"]
