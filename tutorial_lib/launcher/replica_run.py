"""torchft's replica groups run to the end with no failure, from a notebook cell: start, wait, stop, read the records.

``run_replica_groups`` is the comparison notebook 15 makes between DDP and DiLoCo (``ft_train.py --algorithm``): the
lighthouse on 127.0.0.1 waits for every group before it forms a quorum (``min_replicas = num_groups``), so no step
is taken by fewer groups than were started, and the groups (``replicas``) run ``ft_train.py`` until each has exited.
It waits on that state, never on a sleep: a group that exits with an error ends the wait at once. Both the lighthouse
and the groups are context managers here: an error, a timeout or an interrupt of the cell stops them before it
propagates, and ``ReplicaRun.left_running`` says what was still alive after the stop (nothing, if the clean-up worked).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, LaunchError
from ..runs.replica_records import ReplicaRecords, read_replica_records
from ..runs.rundir import new_run_dir
from .failure_drill import FT_SCRIPT
from .replicas import (TORCHRUN_LOG, ReplicaGroups, leftover_processes, lighthouse_command, start_lighthouse,
                       start_replica_groups)


@dataclass(frozen=True)
class ReplicaRun:
    """What one run of replica groups recorded (``run_replica_groups``).

    Attributes:
        run_dir: the run's folder (``lighthouse.log``, ``group<G>/attempt0/``, ``metrics/group<G>.jsonl``).
        records: every group's step records (``runs.replica_records``).
        num_groups: replica groups started.
        args: the arguments every group's ``ft_train.py`` ran with, as strings.
        exit_codes: group -> its torchrun's exit code (all 0: ``run_replica_groups`` raises otherwise).
        left_running: pids of the run's processes (lighthouse, torchruns, ranks) alive after it stopped them.
        run_s: the run's wall time (seconds; printed, never a claim).
        script: the lesson every group ran (``lessons/ft_train.py``), to show.
    """

    run_dir: Path
    records: ReplicaRecords
    num_groups: int
    args: list[str]
    exit_codes: dict[int, int]
    left_running: list[int]
    run_s: float
    script: Path = FT_SCRIPT


def wait_until_ended(groups: ReplicaGroups, timeout_s: float, poll_s: float = 0.1,
                     deadline: float | None = None) -> dict[int, int]:
    """Poll every ``poll_s`` seconds until every group's torchrun has exited; return each one's exit code.
    ``deadline`` (``time.monotonic()``): when ``timeout_s``, counted from an earlier start, runs out (default: now +
    ``timeout_s``).

    Raises:
        LaunchError: a group exited with a code other than 0 (at once, without waiting for the others), or
            ``timeout_s`` seconds passed; the message names the groups, their codes and each torchrun's last lines.
    """
    deadline = time.monotonic() + timeout_s if deadline is None else deadline
    while True:
        codes = {g: group.popen.poll() for g, group in sorted(groups.groups.items())}
        failed = {g: code for g, code in codes.items() if code not in (None, 0)}
        if not failed and None not in codes.values():
            return codes
        if failed or time.monotonic() > deadline:
            why = (f"group(s) {sorted(failed)} exited with code(s) {list(failed.values())}" if failed
                   else f"group(s) {[g for g, c in codes.items() if c is None]} still ran after {timeout_s:g} s")
            tails = {g: (group.folder / TORCHRUN_LOG).read_text(errors="replace").splitlines()[-5:]
                     for g, group in groups.groups.items()}
            first = min(failed) if failed else min(codes)
            raise LaunchError(f"replica groups of {groups.script.name}: {why}; the last lines of each group's "
                              f"torchrun: {tails}", run_dir=groups.run_dir, command=groups.groups[first].command,
                              returncode=failed.get(first))
        time.sleep(poll_s)


def run_replica_groups(args: Sequence[object] | Mapping[str, Sequence[object]] = (), *, num_groups: int = 2,
                       runs_dir: str | os.PathLike | None = None, label: str = "ft-groups",
                       heartbeat_timeout_ms: int = 5000,
                       timeout_s: float = 120.0) -> ReplicaRun | dict[str, ReplicaRun]:
    """Run ``ft_train.py`` as ``num_groups`` replica groups (torchft) until every group has trained and exited, with
    no failure injected; return what the groups recorded.

    The lighthouse forms a quorum only once all ``num_groups`` groups ask (``min_replicas = num_groups``), so every
    committed step or sync has every group in it, whichever group started first. Two runs with the same ``args`` but
    ``--algorithm ddp`` and ``--algorithm diloco`` train on the same data in the same order with the same seed: group
    ``g`` reads shard ``g`` of the dataset in both. Given a mapping ``{name: args}``, the runs happen side by side,
    each with its own lighthouse, groups and folder (``<label>-<name>``), and the result is ``{name: ReplicaRun}``:
    their start-ups overlap instead of following each other.

    Args:
        args: ``ft_train.py``'s arguments (``--algorithm``, ``--sync-every``, ``--max-steps``, ...), or a mapping of
            run names to such arguments; never ``--metrics-dir``: the records are read from ``<run_dir>/metrics``.
        num_groups: replica groups per run (count, >= 1), each one torchrun job of one gloo rank on this machine.
        runs_dir: the runs folder (``None``: ``$TUTORIAL_LIB_RUNS_DIR`` or ``./runs``); each run gets a new folder.
        label: the run folder's name after its time stamp.
        heartbeat_timeout_ms: the lighthouse's: a group silent this long leaves the quorum (milliseconds, >= 1;
            torchft's default 5,000).
        timeout_s: the longest wait for every group to exit (seconds, > 0).

    Raises:
        ConfigError: a value out of range, or ``--metrics-dir`` in ``args``, naming it.
        LaunchError: a lighthouse did not start, a group exited with an error, or the groups still ran after
            ``timeout_s`` (``wait_until_ended``); every run is stopped first.

    See torchft's lighthouse and Manager (https://pytorch.org/torchft/) and, for DiLoCo, arXiv 2311.08105.
    """
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ConfigError(f"num_groups must be an int >= 1, got {num_groups!r}")
    if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ConfigError(f"timeout_s must be > 0 (seconds), got {timeout_s!r}")
    variants = {name: [str(a) for a in v] for name, v in args.items()} if isinstance(args, Mapping) else {
        "": [str(a) for a in args]}
    for name, variant in variants.items():
        if any(a == "--metrics-dir" or a.startswith("--metrics-dir=") for a in variant):
            raise ConfigError(f"args must not set --metrics-dir (the records are read from <run_dir>/metrics), got "
                              f"{variant}")
    lighthouse_command(min_replicas=num_groups, heartbeat_timeout_ms=heartbeat_timeout_ms)  # its checks, before a start
    started = time.monotonic()
    running = {}
    with contextlib.ExitStack() as stack:  # every lighthouse and group stopped on leaving, however it is left
        for name, variant in variants.items():
            run_dir = new_run_dir(f"{label}-{name}" if name else label, runs_dir)
            lighthouse = stack.enter_context(start_lighthouse(run_dir / "lighthouse.log", min_replicas=num_groups,
                                                              heartbeat_timeout_ms=heartbeat_timeout_ms))
            groups = stack.enter_context(start_replica_groups(FT_SCRIPT, lighthouse=lighthouse, num_groups=num_groups,
                                                              run_dir=run_dir, args=variant))
            running[name] = (run_dir, lighthouse, groups)
        deadline = time.monotonic() + timeout_s
        exit_codes = {name: wait_until_ended(groups, timeout_s, deadline=deadline)
                      for name, (_, _, groups) in running.items()}
    results = {}
    for name, (run_dir, lighthouse, groups) in running.items():
        left = [p.pid for p in leftover_processes(groups)] + ([lighthouse.process.pid] if lighthouse.alive() else [])
        results[name] = ReplicaRun(run_dir, read_replica_records(run_dir / "metrics"), num_groups, variants[name],
                                   exit_codes[name], left, time.monotonic() - started)
    return results if isinstance(args, Mapping) else results[""]
