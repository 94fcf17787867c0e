"""Read what a run wrote: per-rank step metrics, memory samples, collectives results.

The contract with the scripts is one JSON object per line per step per rank in
``<run_dir>/metrics/rank<R>.jsonl`` (nanoGPT's "one plain line per step", in JSON).

Step metrics schema
-------------------
Every shipped script that trains writes these keys, the same key and unit for the same quantity in every
script (units are in the names: ``_s`` seconds, ``_bytes`` bytes, ``_per_s`` per second). "all" is every
script that writes step records (``ALL``); "trainers" is ddp_train, fsdp_train, checkpoint_train, train_lm and
train_hf. A condition in parentheses: the key is written only then (``WHEN``); otherwise the script writes it on
every line. ``STEP_METRICS`` holds the same table for code, ``check_step_record`` checks a record against it, and
``tests/integration/test_metrics_schema.py`` checks every script's records (no key missing, none undocumented).

::

    key                    type  unit  written by                     meaning
    step                   int   -     all                            optimizer step, from 1
    max_steps              int   -     all                            steps this rank will run
    rank                   int   -     all                            global rank (RANK)
    world_size             int   -     all                            ranks in the job (WORLD_SIZE)
    loss_local             float -     all                            this rank's loss on its own batch
    step_time_s            float s     all                            wall time of the step on this rank
    loss_global            float -     all but grad_accum, uneven_inputs, unused_params
                                                                      mean of loss_local over ranks (an all_reduce)
    local_rank             int   -     ddp_train, checkpoint_train, train_lm, train_hf
                                                                      rank on this node (LOCAL_RANK)
    device                 str   -     ddp_train, fsdp_train, train_lm, train_hf
                                                                      the rank's device, e.g. cpu or cuda:0
    precision              str   -     ddp_train, fsdp_train, train_lm, train_hf
                                                                      fp32, bf16 or fp16 (--precision)
    strategy               str   -     fsdp_train, train_lm, train_hf the layout (--strategy; train_lm: --parallel; train_hf: fsdp or hsdp)
    samples_per_s          float 1/s   ddp_train, fsdp_train, grad_accum
                                                                      samples this rank processed per second
    global_samples_per_s   float 1/s   ddp_train                      samples all ranks processed per second
    elapsed_s              float s     ddp_train                      wall time since training started
    grad_scaler            bool  -     ddp_train, fsdp_train          whether a GradScaler ran (--grad-scaler)
    loss_scale             float -     ddp_train, fsdp_train          scale the backward used (1.0: no scaler)
    step_skipped           bool  -     ddp_train                      scaler skipped optimizer.step (inf/NaN grads)
    optimizer_steps        int   -     ddp_train                      optimizer steps applied so far
    grad_norm              float -     ddp_train, train_lm, train_hf  L2 norm of all gradients, before clipping
    grad_zero_fraction     float -     ddp_train                      fraction of gradient elements exactly 0
    grad_zero_elements     int   -     fsdp_train (fp16)              gradient elements exactly 0 (fp16 underflow)
    param_bytes            int   bytes trainers                       this rank's parameter tensors
    grad_bytes             int   bytes trainers                       this rank's gradient tensors
    optimizer_state_bytes  int   bytes trainers                       this rank's optimizer state tensors
    rss_bytes              int   bytes trainers (cpu)                 process resident set size now
    peak_rss_bytes         int   bytes trainers (cpu)                 process peak resident set size
    peak_allocated_bytes   int   bytes trainers (cuda)                torch.cuda.max_memory_allocated
    peak_reserved_bytes    int   bytes trainers (cuda)                torch.cuda.max_memory_reserved
    param_device           str   -     fsdp_train                     where parameters live (cpu under CPU offload)
    fsdp_units             int   -     fsdp_train                     modules wrapped as FSDP units (0 under DDP)
    activation_bytes       int   bytes fsdp_train                     largest forward's tensors saved for backward
    block_forwards         int   -     fsdp_train                     block forwards this step (recomputed ones too)
    accumulation           str   -     grad_accum                     every_micro_step or no_sync (--accumulation)
    grad_accum_steps       int   -     grad_accum                     micro-batches per optimizer step
    all_reduce_calls       int   -     grad_accum                     all-reduces in this step (DDP: one per gradient bucket)
    attempt                int   -     checkpoint_train               restart attempt (TORCHELASTIC_RESTART_COUNT)
    resumed_from_step      int   -     checkpoint_train, train_lm, train_hf
                                                                      step of the checkpoint loaded (0: none)
    lr                     float -     checkpoint_train, train_lm, train_hf
                                                                      learning rate this step used
    epoch                  int   -     checkpoint_train, train_lm, train_hf
                                                                      epoch of the batch order
    tokens_per_s           float 1/s   train_lm                       tokens this rank trained on per second
    mfu                    float -     train_lm (known gpu)           model FLOP/s / the device's peak FLOP/s
    eval_loss              float -     train_lm (eval)                held-out loss: mean over every rank's tokens
    skipped_collective     bool  -     collective_mismatch            this rank skipped a loss all_reduce (--fail-rank)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..errors import MetricsError
from .rundir import METRICS_SUBDIR, SAMPLES_SUBDIR



@dataclass(frozen=True)
class MetricKey:
    """One key of the per-step records: its JSON type, unit, meaning, the scripts that write it and when."""

    name: str
    type: str  # "int", "float", "bool" or "str" (a float key may hold a JSON integer)
    unit: str  # "-" for counts, flags, labels and ratios without a unit
    meaning: str
    writers: tuple[str, ...]
    when: str = "always"  # "always", or a condition from WHEN


ALL = ("ddp_train", "fsdp_train", "checkpoint_train", "grad_accum", "model_parallel", "collective_mismatch",
       "uneven_inputs", "unused_params", "train_lm", "train_hf")  # every script that writes per-step records
TRAINERS = ("ddp_train", "fsdp_train", "checkpoint_train", "train_lm", "train_hf")  # the scripts that log memory
# The conditions of keys not always written; every one names what decides it.
WHEN = {"cpu": "device is cpu", "cuda": "device is cuda", "fp16": "--precision fp16",
        "eval": "on evaluation steps (--eval-every N, and the last step)",
        "known gpu": "on a CUDA device whose peak FLOP/s the script knows (train_lm.py's PEAK_TFLOPS)"}

STEP_METRICS: tuple[MetricKey, ...] = (
    MetricKey("step", "int", "-", "optimizer step, from 1", ALL),
    MetricKey("max_steps", "int", "-", "steps this rank will run", ALL),
    MetricKey("rank", "int", "-", "global rank (RANK)", ALL),
    MetricKey("world_size", "int", "-", "ranks in the job (WORLD_SIZE)", ALL),
    MetricKey("loss_local", "float", "-", "this rank's loss on its own batch", ALL),
    MetricKey("step_time_s", "float", "s", "wall time of the step on this rank", ALL),
    MetricKey("loss_global", "float", "-", "mean of loss_local over ranks (an all_reduce)",
              ("ddp_train", "fsdp_train", "checkpoint_train", "model_parallel", "collective_mismatch", "train_lm",
               "train_hf")),
    MetricKey("local_rank", "int", "-", "rank on this node (LOCAL_RANK)", ("ddp_train", "checkpoint_train",
                                                                            "train_lm", "train_hf")),
    MetricKey("device", "str", "-", "the rank's device, e.g. cpu or cuda:0", ("ddp_train", "fsdp_train",
                                                                                "train_lm", "train_hf")),
    MetricKey("precision", "str", "-", "fp32, bf16 or fp16 (--precision)",
              ("ddp_train", "fsdp_train", "train_lm", "train_hf")),
    MetricKey("strategy", "str", "-", "the layout (--strategy; train_lm: --parallel; train_hf: fsdp or hsdp)",
              ("fsdp_train", "train_lm", "train_hf")),
    MetricKey("samples_per_s", "float", "1/s", "samples this rank processed per second",
              ("ddp_train", "fsdp_train", "grad_accum")),
    MetricKey("global_samples_per_s", "float", "1/s", "samples all ranks processed per second", ("ddp_train",)),
    MetricKey("elapsed_s", "float", "s", "wall time since training started", ("ddp_train",)),
    MetricKey("grad_scaler", "bool", "-", "whether a GradScaler ran (--grad-scaler)", ("ddp_train", "fsdp_train")),
    MetricKey("loss_scale", "float", "-", "scale the backward used (1.0: no scaler)",
              ("ddp_train", "fsdp_train")),
    MetricKey("step_skipped", "bool", "-", "scaler skipped optimizer.step (inf/NaN grads)", ("ddp_train",)),
    MetricKey("optimizer_steps", "int", "-", "optimizer steps applied so far", ("ddp_train",)),
    MetricKey("grad_norm", "float", "-", "L2 norm of all gradients, before clipping",
              ("ddp_train", "train_lm", "train_hf")),
    MetricKey("grad_zero_fraction", "float", "-", "fraction of gradient elements exactly 0", ("ddp_train",)),
    MetricKey("grad_zero_elements", "int", "-", "gradient elements exactly 0 (fp16 underflow)", ("fsdp_train",),
              "fp16"),
    MetricKey("param_bytes", "int", "bytes", "this rank's parameter tensors", TRAINERS),
    MetricKey("grad_bytes", "int", "bytes", "this rank's gradient tensors", TRAINERS),
    MetricKey("optimizer_state_bytes", "int", "bytes", "this rank's optimizer state tensors", TRAINERS),
    MetricKey("rss_bytes", "int", "bytes", "process resident set size now", TRAINERS, "cpu"),
    MetricKey("peak_rss_bytes", "int", "bytes", "process peak resident set size", TRAINERS, "cpu"),
    MetricKey("peak_allocated_bytes", "int", "bytes", "torch.cuda.max_memory_allocated", TRAINERS, "cuda"),
    MetricKey("peak_reserved_bytes", "int", "bytes", "torch.cuda.max_memory_reserved", TRAINERS, "cuda"),
    MetricKey("param_device", "str", "-", "where parameters live (cpu under CPU offload)", ("fsdp_train",)),
    MetricKey("fsdp_units", "int", "-", "modules wrapped as FSDP units (0 under DDP)", ("fsdp_train",)),
    MetricKey("activation_bytes", "int", "bytes", "largest forward's tensors saved for backward",
              ("fsdp_train",)),
    MetricKey("block_forwards", "int", "-", "block forwards this step (recomputed ones too)",
              ("fsdp_train",)),
    MetricKey("accumulation", "str", "-", "every_micro_step or no_sync (--accumulation)", ("grad_accum",)),
    MetricKey("grad_accum_steps", "int", "-", "micro-batches per optimizer step", ("grad_accum",)),
    MetricKey("all_reduce_calls", "int", "-", "all-reduces in this step (DDP: one per gradient bucket)",
              ("grad_accum",)),
    MetricKey("attempt", "int", "-", "restart attempt (TORCHELASTIC_RESTART_COUNT)", ("checkpoint_train",)),
    MetricKey("resumed_from_step", "int", "-", "step of the checkpoint loaded (0: none)",
              ("checkpoint_train", "train_lm", "train_hf")),
    MetricKey("lr", "float", "-", "learning rate this step used", ("checkpoint_train", "train_lm", "train_hf")),
    MetricKey("epoch", "int", "-", "epoch of the batch order", ("checkpoint_train", "train_lm", "train_hf")),
    MetricKey("tokens_per_s", "float", "1/s", "tokens this rank trained on per second", ("train_lm",)),
    MetricKey("mfu", "float", "-", "model FLOP/s / the device's peak FLOP/s", ("train_lm",),
              "known gpu"),
    MetricKey("eval_loss", "float", "-", "held-out loss: mean over every rank's tokens",
              ("train_lm",), "eval"),
    MetricKey("skipped_collective", "bool", "-", "this rank skipped a loss all_reduce (--fail-rank)",
              ("collective_mismatch",)),
)
METRIC_KEYS = {key.name: key for key in STEP_METRICS}


def _writers_text(key: MetricKey) -> str:
    if key.writers == ALL:
        text = "all"
    elif key.writers == TRAINERS:
        text = "trainers"
    elif len(key.writers) > len(ALL) / 2 and set(key.writers) <= set(ALL):
        text = "all but " + ", ".join(s for s in ALL if s not in key.writers)
    else:
        text = ", ".join(key.writers)
    return text if key.when == "always" else f"{text} ({key.when})"


def format_schema() -> str:
    """The step-metrics schema as the text table of this module's docstring (a test keeps them equal)."""
    lines = [f"{'key':<22} {'type':<5} {'unit':<5} {'written by':<30} meaning"]
    for key in STEP_METRICS:
        head = f"{key.name:<22} {key.type:<5} {key.unit:<5} "
        writers = _writers_text(key)
        if len(writers) <= 30:
            lines.append(f"{head}{writers:<30} {key.meaning}")
        else:  # the meaning goes on the next line, in its column
            lines += [f"{head}{writers}", f"{'':<{len(head) + 31}}{key.meaning}"]
    return "\n".join(lines)


_JSON_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def check_step_record(record: Mapping, script: str, device: str = "cpu") -> list[str]:
    """What in one per-step record of ``script`` breaks the schema (``STEP_METRICS``); empty if nothing.

    Args:
        record: one JSON line of ``metrics/rank<R>.jsonl``, parsed.
        script: the script that wrote it (a name in ``ALL``).
        device: ``"cpu"`` or ``"cuda"``, the rank's device (decides the memory keys).

    Returns:
        One sentence per problem: a key the script always writes that is missing, a key not documented for
        this script (or for this device), a value of the wrong JSON type.

    Raises:
        MetricsError: ``script`` writes no step records, or ``device`` is neither cpu nor cuda.
    """
    if script not in ALL:
        raise MetricsError(f"script={script!r} writes no per-step records; those that do: {list(ALL)}")
    if device not in ("cpu", "cuda"):
        raise MetricsError(f"device must be 'cpu' or 'cuda', got {device!r}")
    other_device = "cuda" if device == "cpu" else "cpu"
    allowed = {k.name: k for k in STEP_METRICS if script in k.writers and k.when != other_device}
    problems = [f"missing key {name!r}" for name, k in allowed.items()
                if k.when in ("always", device) and name not in record]
    for name, value in record.items():
        key = allowed.get(name)
        if key is None:
            problems.append(f"undocumented key {name!r} (document it in tutorial_lib/runs/metrics.py's STEP_METRICS)")
        elif isinstance(value, bool) and key.type != "bool" or not isinstance(value, _JSON_TYPES[key.type]):
            problems.append(f"{name!r} should be {key.type}, got {value!r}")
    return problems


class JsonlTail:
    """Incrementally read JSON lines appended to the files matching ``pattern`` in ``folder``.

    Each ``read_new()`` returns only complete lines written since the previous call, so the
    live view can poll files that the ranks are still appending to.
    """

    def __init__(self, folder: str | os.PathLike, pattern: str) -> None:
        self.folder = Path(folder)
        self.pattern = pattern
        self._offsets: dict[Path, int] = {}

    def read_new(self) -> list[dict]:
        """Records appended since the last call (a line still being written waits for the next call)."""
        records: list[dict] = []
        if not self.folder.is_dir():
            return records
        for path in sorted(self.folder.glob(self.pattern)):
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1  # a half-written last line waits for the next call
            for line in chunk[:end].splitlines():
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
            self._offsets[path] = offset + end
        return records


def _metrics_dir(run_dir: str | os.PathLike) -> Path:
    run_dir = Path(run_dir)
    return run_dir if run_dir.name == METRICS_SUBDIR else run_dir / METRICS_SUBDIR


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise MetricsError(f"{path}:{n} is not a JSON line ({e.msg}): {line[:80]!r}") from e
    return rows


def read_metrics(run_dir: str | os.PathLike, ranks: int | None = None) -> pd.DataFrame:
    """All ranks' step metrics as one table, sorted by rank then step.

    Args:
        run_dir: a run directory (or its ``metrics/`` folder).
        ranks: if given, the number of ranks expected; a missing ``rank<R>.jsonl`` is an error.

    Returns:
        A DataFrame with one row per (rank, step): the JSON fields (``step``, ``rank``,
        ``loss_local``, ``loss_global``, ``step_time_s``, ``samples_per_s``, memory bytes, ...).

    Raises:
        MetricsError: the folder or an expected rank's file is missing, empty, or not JSON lines.
    """
    folder = _metrics_dir(run_dir)
    if not folder.is_dir():
        raise MetricsError(f"no metrics folder {str(folder)!r}: did the run start (see its output.log)?")
    files = sorted(folder.glob("rank*.jsonl"))
    if ranks is not None:
        missing = [f"rank{r}.jsonl" for r in range(ranks) if not (folder / f"rank{r}.jsonl").exists()]
        if missing:
            raise MetricsError(f"missing metrics file(s) {missing} in {str(folder)!r}")
    rows = [row for f in files for row in _read_jsonl(f)]
    if not rows:
        raise MetricsError(f"no metrics lines in {str(folder)!r} (files: {[f.name for f in files]})")
    return pd.DataFrame(rows).sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


def read_memory_samples(run_dir: str | os.PathLike, kind: str = "rss") -> pd.DataFrame:
    """Memory sampled from outside the workers while the job ran.

    Args:
        run_dir: the run directory.
        kind: ``"rss"`` (per-rank resident set size, columns ``time_s, rank, pid, rss_bytes``; on CUDA also
            ``gpu`` and ``gpu_used_bytes`` where the worker was found in NVML's process list) or ``"gpu"``
            (per GPU, columns ``time_s, gpu, nvml_index, used_bytes, total_bytes``; ``gpu`` is the CUDA index
            the ranks see, ``cuda:LOCAL_RANK``; ``nvml_index`` is nvidia-smi's).

    Returns:
        The samples; ``.attrs["notes"]`` holds the sampler's notes on the GPU samples (``read_memory_notes``),
        which ``plot_memory`` / ``plot_run`` show in the figure.

    Raises:
        MetricsError: unknown kind, or the samples file is missing.
    """
    if kind not in ("rss", "gpu"):
        raise MetricsError(f"kind must be 'rss' or 'gpu', got {kind!r}")
    path = Path(run_dir) / SAMPLES_SUBDIR / f"{kind}.jsonl"
    if not path.exists():
        raise MetricsError(f"no memory samples {str(path)!r} (gpu samples exist only on NVIDIA machines)")
    samples = pd.DataFrame(_read_jsonl(path))
    samples.attrs["notes"] = read_memory_notes(run_dir)
    return samples


def read_memory_notes(run_dir: str | os.PathLike) -> list[str]:
    """The memory sampler's notes on a run's GPU samples (``samples/gpu_info.json``), e.g. that no worker
    process matched NVML's process list (a container without the host's PID namespace), so GPU memory is
    known per device only. Empty when the run sampled no GPU or there is nothing to say."""
    try:
        return list(json.loads((Path(run_dir) / SAMPLES_SUBDIR / "gpu_info.json").read_text()).get("notes", []))
    except (OSError, ValueError, AttributeError):
        return []


def read_rank_json(run_dir: str | os.PathLike, prefix: str) -> list[dict]:
    """The per-rank result files ``<prefix>_rank<R>.json`` a script wrote into ``metrics/``, sorted by rank.

    Raises:
        MetricsError: no such file in the run's metrics folder.
    """
    folder = _metrics_dir(run_dir)
    files = sorted(folder.glob(f"{prefix}_rank*.json"))
    if not files:
        raise MetricsError(f"no {prefix}_rank*.json in {str(folder)!r}: did the script run to the end?")
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"])


def read_rank_tensors(run_dir: str | os.PathLike, prefix: str, folder: str = METRICS_SUBDIR,
                      ranks: int | None = None) -> list:
    """What each rank saved with ``torch.save`` as ``<folder>/<prefix>_rank<R>.pt`` (gradients, parameters, ...),
    loaded on the CPU, in rank order: element R is rank R's.

    Args:
        run_dir: the run directory.
        prefix: the files' name before ``_rank<R>.pt``, e.g. ``"grads"``, ``"params"``.
        folder: the folder inside the run directory the script wrote them to (the script's flag, e.g. ``ddp_train.py
            --save-grads-dir grads``); default ``metrics``.
        ranks: if given, the number of ranks expected (a file more or less is an error).

    Returns:
        One object per rank (what the script saved: a ``{name: tensor}`` dict, ...), loaded with
        ``torch.load(..., map_location="cpu", weights_only=True)`` (tensors and plain containers only).

    Raises:
        MetricsError: no such file, the ranks found are not 0..N-1 (one is missing), or not ``ranks`` of them.
    """
    import torch

    directory = Path(run_dir) / folder
    files = {int(m[1]): path for path in directory.glob(f"{prefix}_rank*.pt")
             if (m := re.fullmatch(rf"{re.escape(prefix)}_rank(\d+)\.pt", path.name))}
    if not files:
        raise MetricsError(f"no {prefix}_rank*.pt in {str(directory)!r}: did the script save them (and run to the end)?")
    if sorted(files) != list(range(len(files))):
        raise MetricsError(f"{prefix}_rank*.pt in {str(directory)!r} are of ranks {sorted(files)}, not 0..N-1: "
                           "a rank did not save its file")
    if ranks is not None and len(files) != ranks:
        raise MetricsError(f"{len(files)} {prefix}_rank*.pt in {str(directory)!r}, expected {ranks} (one per rank)")
    return [torch.load(files[rank], map_location="cpu", weights_only=True) for rank in range(len(files))]


def last_steps(run_dir: str | os.PathLike, attempt: int | None = None) -> dict[int, int]:
    """``{rank: the last step it logged}`` from the run's step metrics (``read_metrics``); ranks that logged nothing are
    absent.

    Args:
        run_dir: the run directory.
        attempt: only the lines of this torchrun attempt (0: the first start, 1: the first restart; the ``attempt`` key
            ``checkpoint_train.py`` writes); ``None``: every line.

    Raises:
        MetricsError: no metrics, or ``attempt`` given and the lines have no ``attempt`` key.
    """
    metrics = read_metrics(run_dir)
    if attempt is not None:
        if "attempt" not in metrics:
            raise MetricsError(f"the metrics of {str(run_dir)!r} have no 'attempt' key: the script does not log attempts")
        metrics = metrics[metrics["attempt"] == attempt]
    return {int(rank): int(step) for rank, step in metrics.groupby("rank")["step"].max().items()}


def read_collectives(run_dir: str | os.PathLike) -> list[dict]:
    """The per-rank results of ``collectives_check.py``, sorted by rank (see ``read_rank_json``)."""
    return read_rank_json(run_dir, "collectives")


def summarize_runs(runs: Mapping[str, pd.DataFrame], baseline: str | None = None) -> pd.DataFrame:
    """One row per run: final loss, its distance to a baseline run, speed, peak memory and scaler counts.

    Args:
        runs: label -> that run's metrics table (``read_metrics`` / ``LaunchResult.metrics()``).
        baseline: label of the reference run for ``loss_diff_vs_baseline`` (``None``: no such column).

    Returns:
        Index: the labels. Columns: ``final_loss`` (rank 0's last ``loss_global``),
        ``loss_diff_vs_baseline`` (absolute), ``median_step_time_s`` and ``median_global_samples_per_s``
        (rank 0, steps after the first, which pays one-off costs), ``peak_memory_mib`` (largest over
        ranks of ``peak_allocated_bytes`` on CUDA, else ``peak_rss_bytes``; MiB = 2**20 bytes),
        ``skipped_steps`` and ``final_loss_scale`` where the script logs a gradient scaler.

    Raises:
        MetricsError: ``baseline`` is not one of the labels, or a run has no rows.
    """
    if baseline is not None and baseline not in runs:
        raise MetricsError(f"baseline={baseline!r} is not one of the runs {list(runs)}")
    rows = {}
    for label, df in runs.items():
        if df.empty:
            raise MetricsError(f"run {label!r} has no metrics rows")
        rank0 = df[df["rank"] == df["rank"].min()].sort_values("step")
        steady = rank0.iloc[1:] if len(rank0) > 1 else rank0
        memory_col = "peak_allocated_bytes" if df.get("peak_allocated_bytes", pd.Series([0])).max() > 0 else "peak_rss_bytes"
        row = {
            "final_loss": rank0["loss_global"].iloc[-1],
            "median_step_time_s": steady["step_time_s"].median(),
            "median_global_samples_per_s": steady["global_samples_per_s"].median()
            if "global_samples_per_s" in steady else float("nan"),
            "peak_memory_mib": df[memory_col].max() / 2**20 if memory_col in df else float("nan"),
        }
        if "step_skipped" in rank0:
            row["skipped_steps"] = int(rank0["step_skipped"].sum())
            row["final_loss_scale"] = rank0["loss_scale"].iloc[-1]
        rows[label] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    if baseline is not None:
        table.insert(1, "loss_diff_vs_baseline", (table["final_loss"] - table.loc[baseline, "final_loss"]).abs())
    return table


def loss_curves(runs: Mapping[str, pd.DataFrame], column: str = "loss_global") -> pd.DataFrame:
    """Several runs' curves side by side: one column per run, rank 0's ``column`` by step.

    Args:
        runs: label -> that run's metrics table (``read_metrics`` / ``LaunchResult.metrics()``).
        column: the per-step value to compare (``loss_global`` is the same on every rank).

    Returns:
        A DataFrame indexed by ``step``; a step a run did not reach is NaN in its column.

    Raises:
        MetricsError: a run without ``column``.
    """
    curves = {}
    for label, df in runs.items():
        if column not in df:
            raise MetricsError(f"run {label!r} has no {column!r} column; it has {sorted(df.columns)}")
        rank0 = df[df["rank"] == df["rank"].min()].dropna(subset=[column])
        curves[label] = rank0.set_index("step")[column]
    return pd.DataFrame(curves).sort_index()
