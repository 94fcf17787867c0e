"""A loss curve from the lines a script prints: for scripts of your own that write no metrics JSON.

The workbook's scripts write one JSON line per step per rank (``tutorial_lib.runs.metrics``). A script of your own, or
one you cloned (nanoGPT's ``train.py`` prints ``iter 10: loss 2.3456, time 41.20ms, mfu 1.23%``), usually prints a
line per step instead. The launcher reads every rank's printed lines through a regular expression (``LaunchSpec``'s
``loss_pattern``, by default ``DEFAULT_LOSS_PATTERN``), and each line that matches becomes a point of the live loss
curve and a JSON line in ``<run_dir>/metrics/printed_rank<R>.jsonl`` (one file per rank that printed: nanoGPT prints
on rank 0 only). ``read_printed_metrics(run_dir)`` reads them back; ``LaunchResult.metrics()`` returns them for a
script that wrote no metrics JSON. A printed point has the keys

====================  =====================================================================================
``step``              the step number the line printed (an int)
``rank``              the rank that printed it (the launcher's rank prefix, not the text)
``loss_local``        the loss the line printed: that rank's own loss, as the workbook's scripts name it
``time_s``            seconds from the launch to the moment the launcher read the line
``line``              the line as printed (at most 200 characters): what the pattern matched
====================  =====================================================================================

The default pattern reads the usual forms of a training log line: the word ``step``, ``global_step``, ``iter`` or
``iteration`` with a whole number, then later on the same line the word ``loss`` with a number (``iter 10: loss
2.3456, ...``, ``step 10/100 | loss=0.5``, ``Step 3: Loss: 1.2e-3``), in any case. A line that names a validation or
test loss (``val loss``, ``val_loss``, ``eval loss``, ``valid_loss``, ``test loss``) is an evaluation, not a training
step, and is left out: nanoGPT's ``step 0: train loss 4.1744, val loss 4.1718`` is, its ``iter 0: loss 4.1926`` is
read. ``loss_local 0.5`` and other longer words (the workbook's own lines) do not match: ``loss`` must stand alone.
Your own pattern (a string or compiled ``re.Pattern``) names its groups ``step`` and ``loss``, or has exactly two
groups, the step first.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd

from ..errors import ConfigError, MetricsError

PRINTED_PREFIX = "printed_rank"  # metrics/printed_rank<R>.jsonl: read_metrics' rank*.jsonl does not match it
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
DEFAULT_LOSS_PATTERN = (
    r"^(?!.*\b(?:val|valid|validation|eval|test)[ _]loss\b)"  # an evaluation line is no training step
    r".*?\b(?:global_step|step|iteration|iter)\s*[:=#]?\s*(?P<step>\d+)\b"  # step 10, iter 10:, step=10, step 10/100
    rf".*?\bloss\b\s*[:=]?\s*(?P<loss>{_NUMBER})"  # ... loss 2.34, loss: 2.34, loss=2.34
)
MAX_LINE_CHARS = 200


def compile_loss_pattern(pattern: str | re.Pattern | None) -> re.Pattern | None:
    """The compiled form of a ``loss_pattern``: case-insensitive when given as a string; ``None`` stays ``None`` (off).

    Raises:
        ConfigError: not a string or ``re.Pattern``, not a valid regular expression, or without the groups
            ``step`` and ``loss`` (named, or exactly two groups: the step, then the loss).
    """
    if pattern is None:
        return None
    if isinstance(pattern, str):
        try:
            pattern = re.compile(pattern, re.IGNORECASE)
        except re.error as e:
            raise ConfigError(f"loss_pattern {pattern!r} is not a regular expression ({e}); "
                              f"e.g. r'iter (?P<step>\\d+): loss (?P<loss>[\\d.]+)'") from None
    if not isinstance(pattern, re.Pattern) or not isinstance(pattern.pattern, str):
        raise ConfigError(f"loss_pattern must be a str or a compiled re.Pattern of str (or None: off), got {pattern!r}")
    if not {"step", "loss"} <= set(pattern.groupindex) and pattern.groups != 2:
        raise ConfigError(f"loss_pattern {pattern.pattern!r} needs the groups (?P<step>...) and (?P<loss>...), or "
                          f"exactly two groups (step, then loss); it has {pattern.groups}")
    return pattern


def parse_loss_line(pattern: re.Pattern, text: str) -> tuple[int, float] | None:
    """``(step, loss)`` from one printed line, or ``None`` when ``pattern`` does not match it (or its step is not a
    whole number, or its loss not a number)."""
    match = pattern.search(text)
    if match is None:
        return None
    named = {"step", "loss"} <= set(pattern.groupindex)
    step, loss = (match.group("step"), match.group("loss")) if named else match.group(1, 2)
    try:
        return int(step), float(loss)
    except (TypeError, ValueError):
        return None


def printed_metrics_path(run_dir: str | os.PathLike, rank: int) -> Path:
    """``<run_dir>/metrics/printed_rank<rank>.jsonl``: the points read from ``rank``'s printed lines."""
    return Path(run_dir) / "metrics" / f"{PRINTED_PREFIX}{rank}.jsonl"


class PrintedMetricsWriter:
    """Turns the lines of a running job into loss points: each matching line of a rank is appended, as one JSON line,
    to that rank's ``printed_rank<R>.jsonl`` and returned as a record. Holds no file open between lines.

    Args:
        run_dir: the run directory (its ``metrics/`` is created at the first point).
        pattern: from ``compile_loss_pattern``; ``None``: nothing is read.
    """

    def __init__(self, run_dir: str | os.PathLike, pattern: re.Pattern | None) -> None:
        self.run_dir, self.pattern = Path(run_dir), pattern

    def take(self, rank: int | None, text: str, time_s: float) -> dict | None:
        """The record of ``rank``'s line ``text`` if it holds a loss, appended to its file; else ``None``
        (``rank`` ``None``: torchrun's own line, never read)."""
        if self.pattern is None or rank is None:
            return None
        parsed = parse_loss_line(self.pattern, text)
        if parsed is None:
            return None
        record = {"step": parsed[0], "rank": rank, "loss_local": parsed[1], "time_s": round(time_s, 3),
                  "line": text[:MAX_LINE_CHARS]}
        path = printed_metrics_path(self.run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
        return record


def has_printed_metrics(run_dir: str | os.PathLike) -> bool:
    """Whether the launch in ``run_dir`` read any loss point from the printed lines."""
    folder = Path(run_dir) / "metrics"
    return folder.is_dir() and any(folder.glob(f"{PRINTED_PREFIX}*.jsonl"))


def read_printed_metrics(run_dir: str | os.PathLike) -> pd.DataFrame:
    """The loss points read from a run's printed lines (the module docstring has the columns), sorted by rank and
    step; one row per (rank, step): the last line printed for a step wins.

    Args:
        run_dir: a run directory (or its ``metrics/`` folder).

    Raises:
        MetricsError: no printed point in the run (no line matched ``loss_pattern``: see ``output.log`` for what the
            ranks printed, and pass a pattern that matches it), or a file that is not JSON lines.
    """
    run_dir = Path(run_dir)
    folder = run_dir if run_dir.name == "metrics" else run_dir / "metrics"
    rows = []
    for path in sorted(folder.glob(f"{PRINTED_PREFIX}*.jsonl")) if folder.is_dir() else []:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise MetricsError(f"{path}:{n} is not a JSON line ({e.msg}): {line[:80]!r}") from e
    if not rows:
        raise MetricsError(f"no loss read from the printed lines in {str(folder.parent)!r}: no line matched the "
                           "launch's loss_pattern (its output.log has every line; pass loss_pattern=r'...(?P<step>\\d+)"
                           "...(?P<loss>[\\d.]+)' matching yours)")
    table = pd.DataFrame(rows).drop_duplicates(["rank", "step"], keep="last")
    return table.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


def last_printed_steps(run_dir: str | os.PathLike) -> dict[int, int]:
    """``{rank: the last step it printed}`` from the loss points read from the ranks' printed lines (the live view's
    ``rank 1: step 2 loss 0.3333``); ``{}`` when no line matched ``loss_pattern``.

    Raises:
        MetricsError: a ``printed_rank<R>.jsonl`` that is not JSON lines.
    """
    if not has_printed_metrics(run_dir):
        return {}
    table = read_printed_metrics(run_dir)
    return {int(rank): int(step) for rank, step in table.groupby("rank")["step"].max().items()}
