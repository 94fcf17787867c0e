"""What the replica groups of a torchft run recorded: each group's steps, commits and heals, read into values.

``ft_train.py`` (the torchft lesson) appends one JSON line per event to ``<metrics-dir>/group<G>.jsonl``: ``start``
when a process of the group starts, ``step`` after every optimizer step (``step``: torchft's step count after it,
``committed``: whether that step reached the weights, ``batches_committed``, ``participants``: groups in the step's
quorum, ``loss_local``: the group's own loss, ``weights_sha256``: a hash of every parameter's bytes, ``local_step``: the
process's optimizer steps so far, from 1, ``sync_step``: whether the step ended in torchft's commit vote (DDP: every
step; DiLoCo: every ``--sync-every``-th), ``allreduce_bytes``: the bytes of the tensors the step handed to
``manager.allreduce``, counted, ``params_local``: the parameter elements the rank holds), ``heal`` when the group received its state from a live group (``step``: the step it
joined at, ``source_group``: who sent it), ``send_state`` when it was asked to send its state to a healing group, and
``killed_itself`` when it then SIGKILLed itself (``--die-sending-state-if``: a drill's machine dying mid-heal). A
restarted group appends to the same file, its lines told apart by ``pid``. A group SIGKILLed while writing may leave
half a last line: it is skipped. In a group of several ranks (HSDP: the model sharded over them), rank ``R > 0``
writes ``group<G>.rank<R>.jsonl``, the same records of its own shard (``read_replica_records(..., group_rank=R)``).

A start of a group that the workbook killed on purpose (``ReplicaGroups.kill``, or a drill's trigger) holds
``KILL_RECORD`` in its folder (``group<G>/attempt<A>/``): who killed it and when, so that the doctor names the kill
instead of guessing at the OOM killer.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from ..errors import ConfigError, MetricsError


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step of one group: ``time_s`` is ``time.time()`` in the rank (seconds since the epoch); ``step``
    is torchft's count of committed steps after it (DiLoCo: of syncs), ``local_step`` the process's own optimizer
    steps (DiLoCo's inner steps), ``allreduce_bytes`` the bytes handed to ``manager.allreduce`` in this step (these
    three are ``None`` in records of an ``ft_train.py`` that did not write them: the doctor's captured runs),
    ``params_local`` the parameter elements this rank holds (all of the model's, or its HSDP shard's)."""

    replica_group: int
    pid: int
    time_s: float
    step: int
    committed: bool
    batches_committed: int
    participants: int
    loss_local: float
    weights_sha256: str
    local_step: int | None = None
    sync_step: bool | None = None
    allreduce_bytes: int | None = None
    params_local: int | None = None


@dataclass(frozen=True)
class HealRecord:
    """A group took its state from a live group: it joined at ``step``, sent by group ``source_group``."""

    replica_group: int
    pid: int
    time_s: float
    step: int
    source_group: int


@dataclass(frozen=True)
class SendRecord:
    """A group was asked, at ``step``, to send its state to a healing group; ``killed_itself``: it died doing so."""

    replica_group: int
    pid: int
    time_s: float
    step: int
    killed_itself: bool = False


@dataclass(frozen=True)
class ReplicaRecords:
    """Every group's records, in the order each group wrote them.

    Attributes:
        steps: group -> its ``StepRecord``s (all its processes, in order).
        heals: every ``HealRecord``, in time order.
        starts: group -> the pids of its processes, in the order they started.
        sends: every ``SendRecord`` (a state sent to a healing group, or a death while sending it), in time order.
    """

    steps: dict[int, list[StepRecord]]
    heals: list[HealRecord]
    starts: dict[int, list[int]]
    sends: list[SendRecord] = field(default_factory=list)

    def committed(self, group: int, pid: int | None = None) -> list[StepRecord]:
        """Group ``group``'s committed steps (of process ``pid`` only, if given)."""
        return [r for r in self.steps.get(group, []) if r.committed and (pid is None or r.pid == pid)]

    def longest_commit_gap_s(self, group: int, after_s: float) -> float:
        """The time between group ``group``'s last commit before ``after_s`` and its first commit after it (seconds):
        how long it stalled after, say, another group was killed at ``after_s``.

        Raises:
            MetricsError: it committed no step before, or none after, ``after_s``.
        """
        times = [r.time_s for r in self.committed(group)]
        before = [t for t in times if t <= after_s]
        after = [t for t in times if t > after_s]
        if not before or not after:
            raise MetricsError(f"group {group} committed {len(before)} step(s) before and {len(after)} after "
                               f"time {after_s:.3f}: a gap needs one on each side")
        return min(after) - max(before)


def steps_table(records: ReplicaRecords) -> pd.DataFrame:
    """Every group's step records as one table, a row per step record (``StepRecord``'s fields as columns), in
    each group's order."""
    rows = [asdict(r) for group in sorted(records.steps) for r in records.steps[group]]
    return pd.DataFrame(rows, columns=list(StepRecord.__dataclass_fields__))


def read_replica_records(metrics_dir: str | os.PathLike, group_rank: int = 0) -> ReplicaRecords:
    """Read every group's records in ``metrics_dir``: rank ``group_rank`` of each group's (``group<G>.jsonl`` for
    rank 0, ``group<G>.rank<R>.jsonl`` for rank ``R`` of an HSDP group).

    Raises:
        ConfigError: ``group_rank`` is not an int >= 0.
        MetricsError: the folder holds no such file, or a line other than a file's last is not a record (the file
            and line named).
    """
    if isinstance(group_rank, bool) or not isinstance(group_rank, int) or group_rank < 0:
        raise ConfigError(f"group_rank must be an int >= 0, got {group_rank!r}")
    pattern = re.compile(r"group\d+\.jsonl" if group_rank == 0 else rf"group\d+\.rank{group_rank}\.jsonl")
    files = sorted(p for p in Path(metrics_dir).glob("group*.jsonl") if pattern.fullmatch(p.name))
    if not files:
        name = "group<G>.jsonl" if group_rank == 0 else f"group<G>.rank{group_rank}.jsonl"
        raise MetricsError(f"no {name} in {metrics_dir}: did the groups run ft_train.py with this --metrics-dir"
                           + (f", with more than {group_rank} rank(s) each?" if group_rank else "?"))
    steps: dict[int, list[StepRecord]] = {}
    heals: list[HealRecord] = []
    starts: dict[int, list[int]] = {}
    sends: list[SendRecord] = []
    for path in files:
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                event, group = record.pop("event"), int(record["replica_group"])
            except (ValueError, KeyError) as e:
                if number == len(lines):  # a SIGKILL cut the last write short
                    continue
                raise MetricsError(f"{path}:{number} is not a record ({e}): {line[:80]!r}") from e
            if event == "start":
                starts.setdefault(group, []).append(int(record["pid"]))
            elif event == "step":
                steps.setdefault(group, []).append(StepRecord(**record))
            elif event == "heal":
                heals.append(HealRecord(**record))
            elif event in ("send_state", "killed_itself"):
                sends.append(SendRecord(group, int(record["pid"]), float(record["time_s"]), int(record["step"]),
                                        killed_itself=event == "killed_itself"))
    heals.sort(key=lambda h: h.time_s)
    sends.sort(key=lambda s: s.time_s)
    return ReplicaRecords(steps, heals, starts, sends)


KILL_RECORD = "killed.json"  # in group<G>/attempt<A>/: {"by": who killed it, "signal": ..., "time_s": ...}


def write_kill_record(folder: str | os.PathLike, by: str, time_s: float, signal: str = "SIGKILL") -> None:
    """Record in a group's start folder that it was killed on purpose: ``by`` whom (a short description), with which
    ``signal``, at ``time_s`` (``time.time()``, seconds since the epoch). ``read_kill_record`` reads it back."""
    (Path(folder) / KILL_RECORD).write_text(json.dumps({"by": by, "signal": signal, "time_s": time_s}))


def read_kill_record(folder: str | os.PathLike) -> dict | None:
    """The kill record of a group's start folder (``write_kill_record``), or ``None`` when it has none or it cannot
    be read."""
    try:
        return json.loads((Path(folder) / KILL_RECORD).read_text())
    except (OSError, ValueError):
        return None


GROUP_ATTEMPT = re.compile(r"group(?P<group>\d+)/attempt(?P<attempt>\d+)")  # launcher/replicas.py's layout


def replica_attempt_dirs(run_dir: str | os.PathLike) -> list[tuple[int, int, Path]]:
    """``[(group, attempt, folder), ...]`` of a replica-group run (``<run_dir>/group<G>/attempt<A>/``, each a torchrun
    job's folder: ``torchrun.log`` and ``logs/``), by group then attempt; empty when ``run_dir`` holds none."""
    found = []
    for folder in Path(run_dir).glob("group*/attempt*"):
        m = GROUP_ATTEMPT.fullmatch(folder.relative_to(run_dir).as_posix())
        if m and folder.is_dir():
            found.append((int(m["group"]), int(m["attempt"]), folder))
    return sorted(found, key=lambda found_: found_[:2])
