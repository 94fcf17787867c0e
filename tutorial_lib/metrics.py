"""Read what a run wrote: per-rank step metrics, memory samples, collectives results.

The contract with the scripts is one JSON object per line per step per rank in
``<run_dir>/metrics/rank<R>.jsonl`` (nanoGPT's "one plain line per step", in JSON).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from .errors import MetricsError

METRICS_SUBDIR = "metrics"
SAMPLES_SUBDIR = "samples"


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
