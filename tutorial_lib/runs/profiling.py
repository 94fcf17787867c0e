"""What ran when on each rank: the ``torch.profiler`` traces a training script wrote, read into intervals.

A script run with ``--profile-steps N`` (``ddp_train.py``) writes one Chrome trace per rank,
``<run_dir>/metrics/trace_rank<R>.json`` (``torch.profiler.profile(...).export_chrome_trace``). Each recorded
step is a ``ProfilerStep#k`` annotation on the training thread; inside it:

* forward: ``DistributedDataParallel.forward`` (DDP's own annotation);
* backward: the autograd engine's ``autograd::engine::evaluate_function: ...`` ops, from the first one's start to
  the last one's end (on CPU they run on the training thread, on CUDA on autograd's device thread);
* optimizer: ``Optimizer.step#AdamW.step`` (the optimizer's own annotation);
* all-reduce: on gloo, ``gloo:all_reduce`` on gloo's worker threads, from the moment a worker starts the
  collective to its end (waiting for the peer included); on NCCL, the ``AllReduce`` kernels on NCCL's stream.
  An all-reduce that starts before the optimizer is one of DDP's gradient buckets (DDP waits for every bucket
  before ``backward()`` returns); a later one (the script's logging all-reduce of the loss) is an
  ``other collective``.

On CUDA the compute intervals are the GPU kernels, each put in the phase during which the CPU launched it
(matched through the trace's ``correlation`` ids), so the overlap is the GPU's, not the CPU's.

The same event names were read from traces of torch 2.8.0 and 2.13.0 (CPU, gloo). Times are in milliseconds
from the start of the first recorded step of any rank: ranks on one machine share the clock the profiler reads.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd

from ..errors import MetricsError
from .rundir import METRICS_SUBDIR

TRACE_PREFIX = "trace"
PHASES = ("forward", "backward", "optimizer", "all-reduce", "other collective")
COMPUTE_PHASES = ("forward", "backward", "optimizer")
COMMUNICATION_PHASES = ("all-reduce", "other collective")
INTERVAL_COLUMNS = ["rank", "step", "phase", "lane", "where", "name", "start_ms", "end_ms", "duration_ms"]

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
_FORWARD = "DistributedDataParallel.forward"
_OPTIMIZER_PREFIX = "Optimizer.step#"
_CPU_COLLECTIVE = re.compile(r"^gloo:(\w+)$")  # gloo's collectives, on its worker threads: gloo:all_reduce, ...
_LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
# Events on the GPU's timeline; the rest are the host's. With CUDA activity the trace repeats every annotation
# (ProfilerStep#k, DistributedDataParallel.forward, ...) as a "gpu_user_annotation" spanning its kernels.
_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")


def trace_files(run_dir: str | os.PathLike) -> dict[int, Path]:
    """``{rank: path}`` of the traces in ``<run_dir>/metrics/trace_rank<R>.json``.

    Raises:
        MetricsError: no trace there (the script ran without ``--profile-steps``, or did not reach the end of its
            recorded steps).
    """
    folder = Path(run_dir) if Path(run_dir).name == METRICS_SUBDIR else Path(run_dir) / METRICS_SUBDIR
    files = {}
    for path in folder.glob(f"{TRACE_PREFIX}_rank*.json"):
        match = re.fullmatch(rf"{TRACE_PREFIX}_rank(\d+)\.json", path.name)
        if match:
            files[int(match.group(1))] = path
    if not files:
        raise MetricsError(f"no {TRACE_PREFIX}_rank*.json in {str(folder)!r}: run the script with --profile-steps N "
                           "(and --max-steps at least N + 2)")
    return dict(sorted(files.items()))


def _events(path: Path) -> list[dict]:
    try:
        trace = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise MetricsError(f"cannot read the profiler trace {str(path)!r}: {e}") from e
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise MetricsError(f"{str(path)!r} is not a Chrome trace (no traceEvents list)")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e]


def _span(events: list[dict]) -> tuple[float, float] | None:
    if not events:
        return None
    return min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events)


def _row(rank: int, step: int, phase: str, lane: str, where: str, name: str, start_us: float, end_us: float) -> dict:
    return {"rank": rank, "step": step, "phase": phase, "lane": lane, "where": where, "name": name,
            "start_us": start_us, "end_us": end_us}


def _cpu_phases(inside: list[dict]) -> dict[str, tuple[float, float]]:
    """The step's forward, backward and optimizer intervals on the CPU side (µs), those that are present."""
    phases = {
        "forward": _span([e for e in inside if e["name"] == _FORWARD]),
        "backward": _span([e for e in inside if e["name"].startswith(_BACKWARD_PREFIX)]),
        "optimizer": _span([e for e in inside if e["name"].startswith(_OPTIMIZER_PREFIX)]),
    }
    return {name: span for name, span in phases.items() if span is not None}


def _collective_phase(start_us: float, phases: dict[str, tuple[float, float]], is_all_reduce: bool) -> str:
    before_optimizer = "optimizer" not in phases or start_us < phases["optimizer"][0]
    return "all-reduce" if is_all_reduce and before_optimizer else "other collective"


def _gpu_rows(rank: int, step: int, events: list[dict], window: tuple[float, float],
              phases: dict[str, tuple[float, float]], launches: dict[object, float]) -> list[dict]:
    """Kernels launched during the step: NCCL's as collectives, the others in the phase that launched them."""
    rows = []
    for e in events:
        if e.get("cat") != "kernel":
            continue
        args = e.get("args", {})
        launched_at = launches.get(args.get("correlation"))
        if launched_at is None or not window[0] <= launched_at < window[1]:
            continue
        where = f"cuda:{args.get('device', '?')} stream {args.get('stream', e.get('tid'))}"
        if "nccl" in e["name"].lower():
            is_all_reduce = "allreduce" in e["name"].lower().replace("_", "")
            phase = _collective_phase(launched_at, phases, is_all_reduce)
            rows.append(_row(rank, step, phase, "communication", where, e["name"], e["ts"], e["ts"] + e["dur"]))
            continue
        phase = next((p for p, (a, b) in phases.items() if a <= launched_at <= b), None)
        if phase is not None:
            rows.append(_row(rank, step, phase, "compute", where, e["name"], e["ts"], e["ts"] + e["dur"]))
    return rows


def _rank_rows(rank: int, events: list[dict]) -> list[dict]:
    host = [e for e in events if e.get("cat") not in _DEVICE_CATEGORIES]
    steps = sorted((e for e in host if _STEP.match(e["name"])), key=lambda e: e["ts"])
    gpu = any(e.get("cat") == "kernel" for e in events)
    launches = {e.get("args", {}).get("correlation"): e["ts"] for e in events
                if e.get("cat") in _LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
    rows = []
    for step_event in steps:
        step = int(_STEP.match(step_event["name"]).group(1)) + 1  # ProfilerStep#0 is the script's step 1
        window = (step_event["ts"], step_event["ts"] + step_event["dur"])
        inside = [e for e in host if window[0] <= e["ts"] < window[1]]
        phases = _cpu_phases(inside)
        if gpu:
            rows += _gpu_rows(rank, step, events, window, phases, launches)
        else:
            rows += [_row(rank, step, phase, "compute", f"cpu thread {step_event.get('tid')}", phase, a, b)
                     for phase, (a, b) in phases.items()]
        for e in inside:
            match = _CPU_COLLECTIVE.match(e["name"])
            if match and not gpu:
                phase = _collective_phase(e["ts"], phases, match.group(1) in ("all_reduce", "allreduce"))
                rows.append(_row(rank, step, phase, "communication", f"gloo thread {e.get('tid')}", e["name"],
                                 e["ts"], e["ts"] + e["dur"]))
    return rows


def read_trace_intervals(run_dir: str | os.PathLike) -> pd.DataFrame:
    """Every rank's recorded steps as intervals: forward, backward, optimizer, all-reduce.

    Args:
        run_dir: a run directory whose ``metrics/`` holds ``trace_rank<R>.json`` (or that folder itself).

    Returns:
        One row per interval, columns ``rank``, ``step`` (the script's step, from 1), ``phase`` (one of
        ``PHASES``), ``lane`` (``"compute"`` or ``"communication"``), ``where`` (the CPU thread, gloo
        thread or CUDA stream), ``name`` (the phase on CPU; the kernel or collective's name otherwise),
        ``start_ms``, ``end_ms``, ``duration_ms`` (from the first recorded step of any rank). On CPU each step
        has one forward, one backward and one optimizer interval; on CUDA one row per kernel.

    Raises:
        MetricsError: no trace, a file that is not a Chrome trace, or a trace without a recorded step.
    """
    rows = []
    for rank, path in trace_files(run_dir).items():
        rank_rows = _rank_rows(rank, _events(path))
        if not rank_rows:
            raise MetricsError(f"{str(path)!r} holds no recorded step (no ProfilerStep#N event with ops in it)")
        rows += rank_rows
    table = pd.DataFrame(rows)
    zero = table["start_us"].min()
    table["start_ms"] = (table["start_us"] - zero) / 1e3
    table["end_ms"] = (table["end_us"] - zero) / 1e3
    table["duration_ms"] = table["end_ms"] - table["start_ms"]
    return table[INTERVAL_COLUMNS].sort_values(["rank", "start_ms"], kind="stable").reset_index(drop=True)


_LAUNCH = "c10d::allreduce_"  # the all-reduce as the training thread issues it (DDP's buckets too), every backend
_COMMS = "record_param_comms"  # NCCL's record of a collective (its dtype), inside the c10d op
_ELEMENT_BYTES = {"float": 4, "Float": 4, "double": 8, "Double": 8, "c10::Half": 2, "Half": 2,
                  "c10::BFloat16": 2, "BFloat16": 2}
LAUNCH_COLUMNS = ["rank", "step", "bucket", "issued_ms", "elements", "element_bytes", "bytes", "backward_ops_after"]


def _elements(event: dict) -> float:
    """Elements of the tensors a ``c10d::allreduce_`` op was given (its first argument, a tensor list), from the
    shapes the profiler recorded (``record_shapes=True``); NaN without them."""
    dims = event.get("args", {}).get("Input Dims") or []
    shapes = dims[0] if dims and isinstance(dims[0], list) else []
    if not shapes or not all(isinstance(shape, list) for shape in shapes):
        return float("nan")
    total = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return float(total)


def _rank_launches(rank: int, events: list[dict]) -> list[dict]:
    host = [e for e in events if e.get("cat") not in _DEVICE_CATEGORIES]
    rows = []
    for step_event in sorted((e for e in host if _STEP.match(e["name"])), key=lambda e: e["ts"]):
        step = int(_STEP.match(step_event["name"]).group(1)) + 1
        start, end = step_event["ts"], step_event["ts"] + step_event["dur"]
        inside = [e for e in host if start <= e["ts"] < end]
        optimizer = _cpu_phases(inside).get("optimizer", (end, end))[0]
        backward = sorted(e["ts"] for e in inside if e["name"].startswith(_BACKWARD_PREFIX))
        launches = sorted((e for e in inside if e["name"] == _LAUNCH and e["ts"] < optimizer), key=lambda e: e["ts"])
        gloo = sorted((e for e in inside if e["name"] in ("gloo:all_reduce", "gloo:allreduce") and e["ts"] < optimizer),
                      key=lambda e: e["ts"])
        comms = [e for e in inside if e["name"] == _COMMS]
        for bucket, e in enumerate(launches):
            nested = [c for c in comms if e["ts"] <= c["ts"] <= e["ts"] + e["dur"]]
            if nested:  # NCCL: the comms record inside the op carries the dtype
                dtype = nested[0].get("args", {}).get("dtype")
            else:  # gloo: its worker starts the launches in the order they were issued
                types = gloo[bucket].get("args", {}).get("Input type") if bucket < len(gloo) else None
                dtype = types[0] if types else None
            element_bytes = _ELEMENT_BYTES.get(dtype, float("nan"))
            elements = _elements(e)
            rows.append({"rank": rank, "step": step, "bucket": bucket, "issued_ms": (e["ts"] - start) / 1e3,
                         "elements": elements, "element_bytes": element_bytes, "bytes": elements * element_bytes,
                         "backward_ops_after": sum(t > e["ts"] for t in backward)})
    return rows


def read_allreduce_launches(run_dir: str | os.PathLike) -> pd.DataFrame:
    """DDP's gradient all-reduces as each rank's training thread issued them, step by step, from the traces.

    DDP issues a bucket's all-reduce from the autograd hook of the bucket's last gradient (a ``c10d::allreduce_`` op
    on the thread running backward) and lets backward go on. So a bucket issued while backward still had ops to run
    (``backward_ops_after > 0``) could overlap them; the last bucket is issued by the last gradient (0 ops after it),
    and a model whose gradients all fit in one bucket has nothing to overlap. This reads the order of events on the
    training thread, not durations: it does not depend on how busy the machine was.

    Args:
        run_dir: a run directory whose ``metrics/`` holds ``trace_rank<R>.json`` (or that folder itself), written
            with ``record_shapes=True`` for the sizes (``ddp_train.py --profile-steps N`` does).

    Returns:
        One row per gradient all-reduce (those issued before the step's optimizer; the loss's logging all-reduce
        after it is left out), columns ``LAUNCH_COLUMNS``: ``rank``, ``step``, ``bucket`` (0, 1, ...: the order of
        issue, the last layers' bucket first), ``issued_ms`` (from the start of the step), ``elements`` (the
        bucket's length), ``element_bytes`` (from the dtype gloo's ``gloo:all_reduce`` or NCCL's
        ``record_param_comms`` recorded; NaN when the trace has neither), ``bytes`` (elements x element_bytes: what
        the rank all-reduced), ``backward_ops_after`` (backward's autograd ops that started after the issue).

    Raises:
        MetricsError: no trace, or a file that is not a Chrome trace.
    """
    rows = []
    for rank, path in trace_files(run_dir).items():
        rows += _rank_launches(rank, _events(path))
    return pd.DataFrame(rows, columns=LAUNCH_COLUMNS)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in _union(intervals))


def _intersection(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(max(a, c), min(b, d)) for a, b in _union(xs) for c, d in _union(ys) if max(a, c) < min(b, d)]


def overlap_intervals(intervals: pd.DataFrame, first: str = "all-reduce", second: str = "backward") -> pd.DataFrame:
    """Where phase ``first`` and phase ``second`` ran at the same time, per rank and step.

    Args:
        intervals: from ``read_trace_intervals``.
        first, second: phases (``PHASES``).

    Returns:
        Columns ``rank``, ``step``, ``start_ms``, ``end_ms``: one row per stretch of time in which both ran.

    Raises:
        ValueError: an unknown phase.
    """
    for phase in (first, second):
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    rows = []
    for (rank, step), df in intervals.groupby(["rank", "step"]):
        spans = {p: list(zip(g["start_ms"], g["end_ms"])) for p, g in df.groupby("phase")}
        for a, b in _intersection(spans.get(first, []), spans.get(second, [])):
            rows.append({"rank": rank, "step": step, "start_ms": a, "end_ms": b})
    return pd.DataFrame(rows, columns=["rank", "step", "start_ms", "end_ms"])


def step_breakdown(intervals: pd.DataFrame) -> pd.DataFrame:
    """Per rank and recorded step: how long each phase ran, and how much of the all-reduce hid behind backward.

    Args:
        intervals: from ``read_trace_intervals``.

    Returns:
        Indexed by ``rank``, ``step``; columns (milliseconds, each the length of the union of the phase's
        intervals): ``forward_ms``, ``backward_ms``, ``optimizer_ms``, ``allreduce_ms`` (DDP's gradient
        buckets), ``overlap_ms`` (all-reduce while backward ran), ``exposed_allreduce_ms`` (all-reduce while
        neither forward nor backward ran: time the step waits for communication), and ``comm_compute_ratio``
        (``allreduce_ms / (forward_ms + backward_ms)``).
    """
    rows = []
    for (rank, step), df in intervals.groupby(["rank", "step"]):
        spans = {p: list(zip(g["start_ms"], g["end_ms"])) for p, g in df.groupby("phase")}
        get = lambda phase: spans.get(phase, [])  # noqa: E731
        allreduce, compute = get("all-reduce"), get("forward") + get("backward")
        row = {"rank": rank, "step": step, "forward_ms": _length(get("forward")),
               "backward_ms": _length(get("backward")), "optimizer_ms": _length(get("optimizer")),
               "allreduce_ms": _length(allreduce),
               "overlap_ms": _length(_intersection(allreduce, get("backward")))}
        row["exposed_allreduce_ms"] = row["allreduce_ms"] - _length(_intersection(allreduce, compute))
        compute_ms = row["forward_ms"] + row["backward_ms"]
        row["comm_compute_ratio"] = row["allreduce_ms"] / compute_ms if compute_ms > 0 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows).set_index(["rank", "step"])
