"""Inspect the checkpoints ``checkpoint_train.py`` writes: which are complete, who wrote which bytes, their contents.

Layout (the contract with the script, as in torchtitan): ``<checkpoint-dir>/step-<N>/`` is a
checkpoint only when it holds ``checkpoint.json``, which rank 0 writes last, after every rank has
finished writing, just before renaming ``.tmp-step-<N>/`` to ``step-<N>/``. Anything else (a
``.tmp-step-<N>/`` left by a crash, a ``step-<N>/`` without the marker) is incomplete and never loaded.

Files inside a step folder:
    ``__<rank>_<i>.distcp`` + ``.metadata``  sharded ``torch.distributed.checkpoint`` (``--format dcp``)
    ``model_optim.pt``                        the full state dict, one ``torch.save`` file (``--format full``)
    ``extra_rank<R>.pt``                      rank R's RNG states, LR scheduler, scaler, sampler position

In a run directory the script's default ``--checkpoint-dir`` is ``checkpoints/`` (``checkpoint_dir``), and
``--dump-loaded-state`` writes what it loaded to ``metrics/loaded_state.pt`` (``read_loaded_state``).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from ..errors import ConfigError, MetricsError
from .metrics import read_rank_json
from .rundir import CHECKPOINTS_SUBDIR, METRICS_SUBDIR

COMPLETE_MARKER = "checkpoint.json"
FULL_FILE = "model_optim.pt"
LOADED_STATE = "loaded_state.pt"
_STEP_DIR = re.compile(r"^(?P<tmp>\.tmp-)?step-(?P<step>\d+)$")
_RANK_FILE = re.compile(r"^(?:__(?P<shard>\d+)_\d+\.distcp|extra_rank(?P<extra>\d+)\.pt)$")


def checkpoint_dir(run_dir: str | os.PathLike, step: int | None = None) -> Path:
    """The checkpoint folder of a run (``checkpoints/``: the default ``--checkpoint-dir`` of ``checkpoint_train.py`` and
    ``train_lm.py``, where ``train_lm.py --create-seed-checkpoint checkpoints`` puts its seed), or one step in it.

    Args:
        run_dir: the run directory.
        step: ``None``: the folder of all steps (for ``list_checkpoints``); a step: its ``step-<step>/`` folder (for
            ``load_checkpoint_state``, ``checkpoint_files``, or a later run's ``--resume``).

    Raises:
        ConfigError: the folder does not exist (the run saved nothing, or not there); for a step, the steps there are
            named.
    """
    folder = Path(run_dir) / CHECKPOINTS_SUBDIR
    if not folder.is_dir():
        raise ConfigError(f"{str(run_dir)!r} has no {CHECKPOINTS_SUBDIR}/ folder: the run saved no checkpoint there "
                          "(checkpoint_train.py --save-every N, default --checkpoint-dir)")
    if step is None:
        return folder
    path = folder / f"step-{step}"
    if not path.is_dir():
        raise ConfigError(f"no step-{step} in {str(folder)!r}; there: {list(list_checkpoints(folder)['name'])}")
    return path


def read_loaded_state(run_dir: str | os.PathLike) -> dict:
    """The full model and optimizer state a ``checkpoint_train.py --dump-loaded-state`` run had right after it loaded
    its checkpoint (gathered from every rank, written by rank 0 to ``metrics/loaded_state.pt``); compare it with
    ``load_checkpoint_state`` of the checkpoint it loaded (``diff_state_dicts``).

    Returns:
        ``{"model": {name: tensor}, "optim": {...}}``, as ``load_checkpoint_state`` returns.

    Raises:
        MetricsError: the run wrote no such file (it ran without ``--dump-loaded-state``, or loaded nothing).
    """
    import torch

    path = Path(run_dir) / METRICS_SUBDIR / LOADED_STATE
    if not path.is_file():
        raise MetricsError(f"no {LOADED_STATE} in {str(path.parent)!r}: run checkpoint_train.py with --resume and "
                           "--dump-loaded-state")
    return torch.load(path, map_location="cpu", weights_only=True)


def list_checkpoints(folder: str | os.PathLike) -> pd.DataFrame:
    """Every step folder in ``folder``, complete or not, sorted by step.

    Args:
        folder: a ``--checkpoint-dir`` (a run's: ``checkpoint_dir(run_dir)``).

    Returns:
        One row per ``step-N`` or ``.tmp-step-N`` folder: ``name``, ``step``, ``complete`` (bool: named
        ``step-N`` and holding ``checkpoint.json``), ``format`` and ``world_size`` (from the marker, else
        ``None``), ``files`` (count) and ``bytes`` (total size). Empty (with these columns) if none.

    Raises:
        ConfigError: ``folder`` does not exist.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"checkpoint folder {str(folder)!r} does not exist")
    rows = []
    for path in folder.iterdir():
        match = _STEP_DIR.match(path.name)
        if not match or not path.is_dir():
            continue
        marker = path / COMPLETE_MARKER
        info = json.loads(marker.read_text()) if marker.is_file() else {}
        files = [p for p in path.iterdir() if p.is_file()]
        rows.append({"name": path.name, "step": int(match["step"]),
                     "complete": not match["tmp"] and marker.is_file(), "format": info.get("format"),
                     "world_size": info.get("world_size"), "files": len(files),
                     "bytes": sum(p.stat().st_size for p in files)})
    columns = ["name", "step", "complete", "format", "world_size", "files", "bytes"]
    table = pd.DataFrame(rows, columns=columns).astype({"world_size": "Int64"})  # None stays <NA>, not NaN
    return table.sort_values(["step", "name"], ignore_index=True)


def latest_checkpoint(folder: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in ``folder`` (what ``--resume latest`` loads), or ``None``."""
    table = list_checkpoints(folder)
    complete = table[table["complete"]]
    return Path(folder) / complete["name"].iloc[-1] if len(complete) else None


def _require_complete(path: Path) -> dict:
    if not (path / COMPLETE_MARKER).is_file():
        raise ConfigError(f"{str(path)!r} is not a complete checkpoint (no {COMPLETE_MARKER}); "
                          "pick one from list_checkpoints(folder) with complete == True")
    return json.loads((path / COMPLETE_MARKER).read_text())


def checkpoint_files(path: str | os.PathLike) -> pd.DataFrame:
    """The files of one step folder and the rank that wrote each.

    Returns:
        Columns ``file``, ``bytes``, ``rank``: ``__R_i.distcp`` and ``extra_rankR.pt`` are rank R's;
        ``.metadata``, ``model_optim.pt`` and ``checkpoint.json`` are written by rank 0.

    Raises:
        ConfigError: ``path`` is not a folder.
    """
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{str(path)!r} is not a checkpoint folder")
    rows = []
    for p in sorted(path.iterdir()):
        if p.is_file():
            m = _RANK_FILE.match(p.name)
            rank = int(m["shard"] or m["extra"]) if m else 0
            rows.append({"file": p.name, "bytes": p.stat().st_size, "rank": rank})
    return pd.DataFrame(rows, columns=["file", "bytes", "rank"])


def load_checkpoint_state(path: str | os.PathLike) -> dict:
    """The full model and optimizer state of one complete checkpoint, in this process, for inspection.

    A ``full`` checkpoint is read with ``torch.load``; a sharded one is first converted to a single
    ``torch.save`` file with ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` (which
    needs no process group), as one would do to ship a model for inference. See
    https://pytorch.org/docs/stable/distributed.checkpoint.html

    Returns:
        ``{"model": {name: tensor}, "optim": {"state": {name: {...}}, "param_groups": [...]}}`` with
        parameter names without a ``module.`` prefix (``get_state_dict`` keys, for DDP and FSDP alike).

    Raises:
        ConfigError: ``path`` is not a complete checkpoint.
    """
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = Path(path)
    info = _require_complete(path)
    if info["format"] == "full":
        return torch.load(path / FULL_FILE, map_location="cpu", weights_only=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "converted.pt"
        dcp_to_torch_save(path, out)
        return torch.load(out, map_location="cpu", weights_only=False)


def flatten_state(state: Mapping, prefix: str = "") -> dict:
    """``{"a": {"b": t}}`` -> ``{"a.b": t}``; lists become ``name.<index>`` keys."""
    flat = {}
    items = state.items() if isinstance(state, Mapping) else enumerate(state)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (Mapping, list, tuple)):
            flat.update(flatten_state(value, name + "."))
        else:
            flat[name] = value
    return flat


def diff_state_dicts(a: Mapping, b: Mapping) -> list[str]:
    """Names (flattened, see ``flatten_state``) whose values differ between two state dicts; ``[]`` if equal.

    Tensors must be bitwise equal (``torch.equal``: same shape and values); other values ``==``.
    A name present in one dict only is reported as ``"<name> (only in a)"`` / ``"(only in b)"``.
    """
    import torch

    fa, fb = flatten_state(a), flatten_state(b)
    diffs = [f"{k} (only in a)" for k in fa.keys() - fb.keys()] + [f"{k} (only in b)" for k in fb.keys() - fa.keys()]
    for key in fa.keys() & fb.keys():
        x, y = fa[key], fb[key]
        if torch.is_tensor(x) or torch.is_tensor(y):
            same = torch.is_tensor(x) and torch.is_tensor(y) and x.shape == y.shape and torch.equal(x, y)
        else:
            same = x == y
        if not same:
            diffs.append(key)
    return sorted(diffs)


def checkpoint_costs(runs: Mapping[str, str | os.PathLike]) -> pd.DataFrame:
    """Save and load time and bytes per rank, from the ``checkpoint_rank<R>.json`` files of several runs.

    Args:
        runs: label -> run directory of a ``checkpoint_train.py`` run.

    Returns:
        One row per (run, rank, event): ``run``, ``rank``, ``world_size``, ``event`` (``save`` or
        ``load``), ``format``, ``step``, ``attempt``, ``time_s`` (wall time of that rank inside the save or
        load, barriers included) and ``bytes`` (what that rank wrote, or read).

    Raises:
        MetricsError: a run wrote no ``checkpoint_rank*.json`` (it never saved or loaded).
    """
    rows = []
    for label, run_dir in runs.items():
        for record in read_rank_json(run_dir, "checkpoint"):
            for event in record["events"]:
                rows.append({"run": label, "rank": record["rank"], "world_size": record["world_size"],
                             **{k: event.get(k) for k in ("event", "format", "step", "attempt", "time_s", "bytes")}})
    if not rows:
        raise MetricsError(f"no save or load events in {list(runs)}")
    return pd.DataFrame(rows)


def load_trained_hf(model: str | os.PathLike, checkpoint: str | os.PathLike):
    """A ``train_hf.py`` DCP checkpoint's model in this process, as a ``transformers`` model: the architecture and
    its config from ``model`` (the folder the run trained from, ``AutoModelForCausalLM.from_pretrained``), then every
    tensor of the checkpoint's ``app.model`` (however many ranks saved it; DCP reads their shards) in place of its
    weights. For a look at one step in a notebook, or to check an export (``export_hf``) against the trained weights.
    A LoRA run's checkpoint holds peft's names: export it instead (merged, or ``adapter=True``).

    Raises:
        ConfigError: ``checkpoint`` is not a complete DCP checkpoint (no ``.metadata``).
    """
    import warnings

    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    if not (Path(checkpoint) / ".metadata").is_file():
        raise ConfigError(f"{str(checkpoint)!r} is not a complete DCP checkpoint (no .metadata in it): pass a step-N "
                          "folder of a train_hf.py run (checkpoint_dir(run_dir, step=N))")
    trained = AutoModelForCausalLM.from_pretrained(Path(model).expanduser())
    state = {"app": {"model": trained.state_dict()}}  # train_hf.py saves the model's tensors under app.model
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    trained.load_state_dict(state["app"]["model"])
    return trained.eval()
