"""What each rank of an observed launch really did, as torch saw it: its records in ``observed/``, read into values.

A launch with ``observe=True`` (``LaunchSpec``, ``run_script(..., observe=True)``) runs an observer in every rank, in
front of the script (``tutorial_lib/child/observer.py``: how, why that way, and what it cannot prevent). It writes one
JSON line per event to ``<run_dir>/observed/rank<R>.jsonl``, never to stdout. This module reads them::

    result = tl.run_script("my_train.py", nproc_per_node=2, observe=True)
    run = result.observed()                        # or tl.runs.read_observed(result.run_dir)
    rank0 = run[0]
    rank0.per_step("all_reduce")                   # all-reduces between optimizer steps: [3, 3, 3] (3 DDP buckets)
    run.per_step_counts("all_gather", "reduce_scatter")  # [{"rank": 0, "step": 1, "all_gather": 9, ...}, ...]
    [c.input_bytes for c in rank0.collectives_of("all_reduce", backward=1)]   # the first backward's bucket sizes
    rank0.ddp_settings()["find_unused_parameters"] # False: the DDP wrap as torch holds it
    rank0.steps[0].params[0].grad.tensor()         # the first parameter's gradient at the first step, exactly
    rank0.losses()                                 # what each backward() ran on: [0.71, 0.64, ...]
    run.gathered(1, 0, "grad")                     # an FSDP2 parameter's gradient, its ranks' shards put together

The numbering, on every rank: optimizer steps count from 1 (``OptimizerStep.step``); a collective, a backward or a seed
carries the step it led up to (``step``: the optimizer steps finished before it, plus one), and a collective issued
inside a ``backward()`` call carries that call's number (``backward``, from 1). Counts are exact: each collective is one
call of torch's ``c10d`` (or functional) op, by the script, DDP's reducer, FSDP2 or DTensor alike.

A record is checked as it is read: numbered lines from 1 without a gap, one ``start`` first, the rank its file is named
for, the schema this reader knows (``SCHEMA``). A rank that crashed has no ``end`` (``ObservedRank.complete`` is
``False``); its last, cut line is left out.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MetricsError
from .rundir import observed_dir, observed_name

SCHEMA = 1  # the records' version the observer writes (child/observer.py's SCHEMA; a test holds them equal)
STEP_MARK = b'"record": "optimizer_step"'  # how the observer's json.dumps writes a step record's kind
_FILE = re.compile(r"rank(\d+)(?:\.restart(\d+))?\.jsonl")


@dataclass(frozen=True)
class TensorRecord:
    """A tensor as the observer wrote it: always its shape, dtype, size, norm and sum (float64) and a SHA-1 digest of
    its bytes (equal digests: equal tensors, bit for bit); the bytes themselves (``data``, base64; ``tensor()``) when
    it had at most ``full_numel`` elements (``start``'s setting, default 4096), its norm and sum then worked out here.
    For a DTensor, the numbers are this rank's local shard; ``placements`` (``["S(0)"]``, ``["R"]``),
    ``global_shape`` and ``mesh`` say where it sits in the whole."""

    shape: tuple[int, ...]
    dtype: str
    numel: int
    bytes: int
    sha1: str
    norm: float | None = None
    sum: float | None = None
    data: str | None = None
    placements: tuple[str, ...] | None = None
    global_shape: tuple[int, ...] | None = None
    mesh: dict | None = None

    @classmethod
    def of(cls, data: dict | None) -> TensorRecord | None:
        if data is None:
            return None
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for name in ("shape", "placements", "global_shape"):
            if known.get(name) is not None:
                known[name] = tuple(known[name])
        record = cls(**known)
        if record.data is not None and record.norm is None and not record.dtype.startswith("complex"):
            import torch

            wide = record.tensor().to(torch.float64)
            record = dataclasses.replace(record, norm=float(torch.linalg.vector_norm(wide)), sum=float(wide.sum()))
        return record

    def tensor(self):
        """The tensor as a CPU tensor of the recorded shape and dtype, bit for bit (its bytes were written).

        Raises:
            MetricsError: the tensor had more than ``full_numel`` elements, so only its norm, sum and digest were
                written: compare those, or launch with ``env={"TUTORIAL_LIB_OBSERVE_FULL_NUMEL": "N"}``.
        """
        import torch

        if self.data is None:
            raise MetricsError(f"this tensor ({self.numel} elements, shape {list(self.shape)}) was recorded as its "
                               "norm, sum and digest only: compare those, or launch with env={'TUTORIAL_LIB_OBSERVE_"
                               f"FULL_NUMEL': '{self.numel}'}} to record its values")
        raw = bytearray(base64.b64decode(self.data))
        dtype = getattr(torch, self.dtype)
        return (torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)).reshape(self.shape)


@dataclass(frozen=True)
class CallSite:
    """One frame of the script's own code where it called torch (``path``, ``line``, ``function``); ``where`` shows it
    as ``"train.py:22"``."""

    path: str
    line: int
    function: str

    @property
    def where(self) -> str:
        """``"<file name>:<line>"``."""
        return f"{Path(self.path).name}:{self.line}"


def _stack(r: dict) -> tuple[CallSite, ...]:
    return tuple(CallSite(str(path), int(line), str(function)) for path, line, function in r.get("stack") or ())


@dataclass(frozen=True)
class Collective:
    """One collective a rank issued (one call of torch's op), in the order it issued them.

    Attributes:
        seq: its line number in the rank's record (orders it among the rank's other records).
        op: the ``torch.distributed`` name of the call (``all_reduce``, ``all_gather_into_tensor``,
            ``reduce_scatter_tensor``, ``broadcast``, ``barrier``, ``send``, ...).
        kind: its family, what a lesson counts: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``,
            ``barrier``, ``all_to_all``, ``reduce``, ``gather``, ``scatter``, ``send``, ``recv``, ``p2p``.
        torch_op: the dispatcher op that ran (``c10d::allreduce_``, ``_c10d_functional::all_gather_into_tensor``).
        group, group_size, group_seq: the process group's name, its number of ranks, and this collective's number
            among the rank's collectives on that group (from 1).
        input_bytes, output_bytes: what this rank sent in and got out (an all-gather's output is ``group_size`` times
            its input; a reduce-scatter's input ``group_size`` times its output; 0 for a barrier).
        dtype: the first input's dtype (``"float32"``); shapes: the inputs' shapes (up to 16).
        reduce_op: ``"sum"``, ``"avg"``, ... where torch tells it (torch 2.13, functional ops), else ``None``.
        step: the optimizer step it led up to (from 1). backward: the ``backward()`` call it ran in, else ``None``.
        stack: where the script called it from, its own frames outermost first (``()``: none, e.g. autograd's thread
            on CUDA; a record written before the observer kept it).
    """

    seq: int
    op: str
    kind: str
    torch_op: str
    group: str
    group_size: int | None
    group_seq: int
    input_bytes: int
    output_bytes: int
    dtype: str | None
    shapes: tuple
    reduce_op: str | None
    step: int
    backward: int | None
    thread: str = ""
    stack: tuple[CallSite, ...] = ()


@dataclass(frozen=True)
class Wrap:
    """A module wrapped for distribution, as torch held it when the observer described it (written again whenever
    that changed: the latest is what the rank ended with).

    Attributes:
        id: the wrapping module (the same id in every description of it).
        wrapper: ``"DistributedDataParallel"``, ``"fully_shard"``, ``"FullyShardedDataParallel"``,
            ``"parallelize_module"`` or ``"DataParallel"``.
        module: the wrapped module's class (``"Sequential"``).
        step: the optimizer step it was described before.
        settings: the rest: DDP's ``bucket_cap_mb``, ``find_unused_parameters``, ``gradient_as_bucket_view``,
            ``static_graph``, ``comm_hooks``, ``bucket_sizes_bytes`` (DDP's own logging data: its first buckets,
            then the rebuilt ones once DDP logs them, some iterations late; the all-reduces of each ``backward()``
            are the buckets that ran), ``parameters``; ``fully_shard``'s ``root`` and ``units`` (each: ``path``,
            ``mesh``, ``reshard_after_forward``, ``mp_policy``, ``parameters``); ``parallelize_module``'s ``mesh``
            and ``plan``.
    """

    id: int
    wrapper: str
    module: str
    step: int
    settings: dict


@dataclass(frozen=True)
class ParamRecord:
    """One parameter at an optimizer step: ``index`` in the optimizer's order, ``name`` as the wrapped module names it
    (``None`` outside a wrapped module), its gradient before the step (``None``: it had none) and value after it."""

    index: int | None
    name: str | None
    param_group: int | None
    grad: TensorRecord | None
    value: TensorRecord


@dataclass(frozen=True)
class OptimizerStep:
    """One ``optimizer.step()`` that ran (a step ``GradScaler`` skipped is not one): ``step`` counts every optimizer's
    steps on the rank from 1; ``state_bytes``: the optimizer state's bytes after it (a DTensor's local shard);
    ``seq`` and ``stack`` as ``Collective``'s: its place in the record, where the script called ``step()``."""

    step: int
    optimizer: str
    optimizer_id: int
    lr: tuple
    state_bytes: int
    params: tuple[ParamRecord, ...]
    seq: int = 0
    stack: tuple[CallSite, ...] = ()

    def param(self, name: str) -> ParamRecord:
        """The parameter called ``name``; ``MetricsError`` naming those there are if none is."""
        for p in self.params:
            if p.name == name:
                return p
        raise MetricsError(f"no parameter {name!r} at step {self.step}; names: {[p.name for p in self.params]}")


@dataclass(frozen=True)
class Backward:
    """One ``backward()``: its number (from 1), the step it led up to, and what it ran on (``loss``: its value when it
    was one number; under a ``GradScaler`` that is the scaled loss); ``seq`` and ``stack`` as ``Collective``'s."""

    index: int
    step: int
    loss: float | None
    tensors: int
    shape: tuple | None
    dtype: str | None
    seq: int = 0
    stack: tuple[CallSite, ...] = ()


@dataclass
class ObservedRank:
    """Everything one rank's record holds, in the order it happened.

    Attributes:
        rank, world_size, restart: from torchrun's environment (``restart``: the attempt, 0 unless the job restarted).
        torch_version: the rank's torch; ``None`` when the script never imported it.
        process_group: the ``init_process_group`` record (``backend``, ``world_size``, ``rank``, ``group``), or
            ``None``.
        groups: every process group the rank used, by name (``name``, ``desc``, ``size``, ``rank``, ``ranks``,
            ``backend``).
        collectives, wraps, steps, backwards: as their classes say. seeds: each ``torch.manual_seed`` value, in order.
        final: at the end, the parameters of each wrapped module no other one holds (FSDP2: the root), as
            ``[ParamRecord]`` with the gradients the script left, by wrap id (a script that never steps an optimizer).
        exit_code: the script's exit status (``None``: no ``end``, the rank crashed or was killed).
        initial_seed: ``torch.initial_seed()`` at the end. errors: what failed inside the observer, if anything.
        compiled: what ``torch.compile`` did in the rank, from dynamo's counters at the end (``graphs`` dynamo
            captured, before DDPOptimizer's cuts; ``graph_breaks``, ``frames`` compiled, ``break_reasons``: first
            lines), or ``None`` (dynamo never imported; a rank that crashed).
    """

    rank: int
    world_size: int
    restart: int
    torch_version: str | None = None
    process_group: dict | None = None
    groups: dict[str, dict] = field(default_factory=dict)
    collectives: list[Collective] = field(default_factory=list)
    wraps: list[Wrap] = field(default_factory=list)
    steps: list[OptimizerStep] = field(default_factory=list)
    backwards: list[Backward] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    final: dict[int, list[ParamRecord]] = field(default_factory=dict)
    exit_code: int | None = None
    initial_seed: int | None = None
    errors: list[str] = field(default_factory=list)
    compiled: dict | None = None

    @property
    def complete(self) -> bool:
        """Whether the record ends with the runner's ``end`` (the script returned or raised; not killed)."""
        return self.exit_code is not None

    def collectives_of(self, kind: str | None = None, *, op: str | None = None, step: int | None = None,
                       backward: int | None = None, group: str | None = None) -> list[Collective]:
        """The collectives of family ``kind`` (``None``: any), and of ``op``, ``step``, ``backward`` and ``group`` when
        given, in order."""
        return [c for c in self.collectives if (kind is None or c.kind == kind) and (op is None or c.op == op)
                and (step is None or c.step == step) and (backward is None or c.backward == backward)
                and (group is None or c.group == group)]

    def per_step(self, kind: str) -> list[int]:
        """How many collectives of family ``kind`` led up to each optimizer step: element ``s - 1`` is step ``s``'s
        (the forward, backward and step before it), for every step the rank took."""
        return [len(self.collectives_of(kind, step=s)) for s in range(1, len(self.steps) + 1)]

    def per_backward(self, kind: str) -> list[int]:
        """How many collectives of family ``kind`` each ``backward()`` issued: element ``b - 1`` is backward ``b``'s
        (DDP's buckets, FSDP2's reduce-scatters and re-gathers; 0 for a micro-batch under ``no_sync``)."""
        return [len(self.collectives_of(kind, backward=b.index)) for b in self.backwards]

    def losses(self) -> list[float | None]:
        """What each ``backward()`` ran on, its value (``None``: not one number), in order."""
        return [b.loss for b in self.backwards]

    def latest_wraps(self, wrapper: str | None = None) -> list[Wrap]:
        """Each wrapping module's latest description (of ``wrapper`` when given), in the order they were first seen."""
        latest: dict[int, Wrap] = {}
        for wrap in self.wraps:
            latest[wrap.id] = wrap
        return [w for w in latest.values() if wrapper is None or w.wrapper == wrapper]

    def ddp_settings(self) -> dict:
        """The settings of the rank's one DDP module, as it ended.

        Raises:
            MetricsError: the rank wrapped no module in DDP, or several (use ``latest_wraps``)."""
        found = self.latest_wraps("DistributedDataParallel")
        if len(found) != 1:
            raise MetricsError(f"rank {self.rank} wrapped {len(found)} modules in DistributedDataParallel "
                               f"(wraps seen: {[w.wrapper for w in self.latest_wraps()]}); expected one")
        return found[0].settings

    def fully_shard_units(self) -> list[dict]:
        """Every FSDP2 unit of the rank (its ``path``, ``mesh``, ``reshard_after_forward``, ``mp_policy``,
        ``parameters``, ``parameter_numel``), from each ``fully_shard`` call's latest description."""
        return [unit for w in self.latest_wraps("fully_shard") for unit in w.settings.get("units", [])]


@dataclass
class ObservedRun:
    """Every rank's record of one observed launch (``read_observed``): ``run[0]`` is rank 0's ``ObservedRank``."""

    run_dir: Path
    ranks: dict[int, ObservedRank]

    def __getitem__(self, rank: int) -> ObservedRank:
        if rank not in self.ranks:
            raise MetricsError(f"no observed record of rank {rank} in {str(observed_dir(self.run_dir))!r}; ranks: "
                               f"{sorted(self.ranks)}")
        return self.ranks[rank]

    def __iter__(self):
        return iter(self.ranks[r] for r in sorted(self.ranks))

    def __len__(self) -> int:
        return len(self.ranks)

    def per_step_counts(self, *kinds: str) -> list[dict]:
        """One row per rank and optimizer step, ``{"rank": r, "step": s, kind: count, ...}``: the collectives of each
        family in ``kinds`` that led up to the step (``ObservedRank.per_step``), e.g. for ``pandas.DataFrame``."""
        rows = []
        for observed in self:
            counts = {kind: observed.per_step(kind) for kind in kinds}  # element s - 1: step s
            rows += [{"rank": observed.rank, "step": s + 1, **{kind: n[s] for kind, n in counts.items()}}
                     for s in range(len(observed.steps))]
        return rows

    def gathered(self, step: int, index: int, what: str = "grad"):
        """One parameter's gradient (``what="grad"``) or value (``"value"``) at optimizer step ``step``, whole: a
        DTensor's shards put together in mesh order along their ``Shard(d)`` dimension (FSDP2, a 1-D mesh), else rank
        0's tensor (a replicated one: DDP, ``Replicate``). Needs the values recorded (``TensorRecord.tensor``).

        Raises:
            MetricsError: a rank without that step or parameter, values not recorded, or a placement this cannot put
                together (a 2-D mesh, ``Partial``)."""
        import torch

        records = []
        for observed in self:
            steps = [s for s in observed.steps if s.step == step]
            if not steps or index >= len(steps[0].params):
                raise MetricsError(f"rank {observed.rank} has no parameter {index} at optimizer step {step}")
            record = getattr(steps[0].params[index], what)
            if record is None:
                raise MetricsError(f"rank {observed.rank}'s parameter {index} had no {what} at step {step}")
            records.append(record)
        first = records[0]
        placements = first.placements or ("R",)
        if len(placements) != 1 or not (placements[0] == "R" or re.fullmatch(r"S\(\d+\)", placements[0])):
            raise MetricsError(f"cannot put together placements {list(placements)}: only one Shard(d) or Replicate")
        if placements[0] == "R":
            return first.tensor()
        dim = int(placements[0][2:-1])
        order = first.mesh["ranks"] if first.mesh else sorted(self.ranks)
        by_rank = dict(zip(sorted(self.ranks), records))
        return torch.cat([by_rank[r].tensor() for r in order], dim=dim)


def read_observed(run_dir: str | os.PathLike, ranks: int | None = None, restart: int | None = None) -> ObservedRun:
    """Read an observed launch's records (``<run_dir>/observed/rank<R>.jsonl``) into an ``ObservedRun``.

    Args:
        run_dir: the run directory of a launch with ``observe=True``.
        ranks: if given, the number of ranks expected (a record missing is an error).
        restart: the attempt to read (torchrun restarts the job's ranks); ``None``: the last one recorded.

    Raises:
        MetricsError: no ``observed/`` folder (the launch was not observed: ``observe=True``), a rank's record missing,
            or a record that is not the observer's (a line out of sequence, a second ``start``, another schema).
    """
    folder = observed_dir(run_dir)
    found = {(int(m[1]), int(m[2] or 0)): path for path in (folder.iterdir() if folder.is_dir() else ())
             if (m := _FILE.fullmatch(path.name))}
    if not found:
        raise MetricsError(f"no observed records in {str(folder)!r}: launch with observe=True (LaunchSpec or "
                           "run_script) to record what each rank does")
    attempt = max(r for _, r in found) if restart is None else restart
    paths = {rank: path for (rank, r), path in found.items() if r == attempt}
    expected = range(ranks) if ranks is not None else range(max(paths, default=-1) + 1)
    missing = [observed_name(r, attempt) for r in expected if r not in paths]
    if missing or not paths:
        have = sorted(path.name for path in paths.values())
        raise MetricsError(f"no {', '.join(missing) or 'record'} in {str(folder)!r} (found {have}): a rank that never "
                           "started its script writes none")
    return ObservedRun(Path(run_dir), {rank: _read_rank(path, rank) for rank, path in sorted(paths.items())})


def observed_steps(run_dir: str | os.PathLike, rank: int = 0, restart: int = 0) -> int:
    """The optimizer steps rank ``rank`` (of torchrun's attempt ``restart``) of an observed launch has recorded so far,
    counted in its record without reading it (cheap enough to poll while the rank runs: a check that waits for a
    running job to reach a step); 0 when it has no record yet. A line cut short by a crash is not counted."""
    try:
        data = (observed_dir(run_dir) / observed_name(rank, restart)).read_bytes()
    except OSError:
        return 0
    return data[:data.rfind(b"\n") + 1].count(STEP_MARK)


def _lines(path: Path) -> list[dict]:
    text = path.read_text()
    complete = text[:text.rfind("\n") + 1]  # a line cut by a crash mid-write is left out
    out = []
    for n, line in enumerate(complete.splitlines(), start=1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise MetricsError(f"{str(path)!r} line {n} is not JSON ({e}): not the observer's record") from e
    return out


def _read_rank(path: Path, rank: int) -> ObservedRank:
    records = _lines(path)
    if not records or records[0].get("record") != "start":
        raise MetricsError(f"{str(path)!r} does not begin with the observer's start record")
    start = records[0]
    if start.get("schema") != SCHEMA or start.get("rank") != rank:
        raise MetricsError(f"{str(path)!r} is of schema {start.get('schema')} and rank {start.get('rank')}; this "
                           f"reader reads schema {SCHEMA}, and the file is rank {rank}'s")
    observed = ObservedRank(rank, int(start["world_size"]), int(start.get("restart", 0)))
    for n, r in enumerate(records, start=1):
        if r.get("seq") != n or (n > 1 and r.get("record") == "start"):
            raise MetricsError(f"{str(path)!r} line {n} is out of the observer's sequence (seq {r.get('seq')}): the "
                               "record was changed after it was written")
        if observed.exit_code is not None:
            raise MetricsError(f"{str(path)!r} line {n} comes after the end record: the record was changed")
        _add(observed, r)
    return observed


def _add(observed: ObservedRank, r: dict) -> None:
    kind = r.get("record")
    if kind == "collective":
        size = observed.groups.get(r["group"], {}).get("size")
        observed.collectives.append(Collective(
            seq=r["seq"], op=r["op"], kind=r["kind"], torch_op=r["torch_op"], group=r["group"], group_size=size,
            group_seq=r["group_seq"], input_bytes=r["input_bytes"], output_bytes=r["output_bytes"], dtype=r["dtype"],
            shapes=tuple(tuple(s) for s in r["shapes"]), reduce_op=r["reduce_op"], step=r["step"],
            backward=r["backward"], thread=r.get("thread", ""), stack=_stack(r)))
    elif kind == "group":
        observed.groups[r["name"]] = {k: v for k, v in r.items() if k not in ("seq", "record")}
    elif kind == "wrap":
        settings = {k: v for k, v in r.items() if k not in ("seq", "record", "id", "wrapper", "module", "step")}
        observed.wraps.append(Wrap(r["id"], r["wrapper"], r["module"], r["step"], settings))
    elif kind == "optimizer_step":
        observed.steps.append(OptimizerStep(r["step"], r["optimizer"], r["optimizer_id"], tuple(r["lr"]),
                                            r["state_bytes"], tuple(_param(p) for p in r["params"]), r["seq"],
                                            _stack(r)))
    elif kind == "backward":
        observed.backwards.append(Backward(r["index"], r["step"], r["loss"], r["tensors"],
                                           tuple(r["shape"]) if r["shape"] is not None else None, r["dtype"],
                                           r["seq"], _stack(r)))
    elif kind == "init_process_group":
        observed.process_group = {k: v for k, v in r.items() if k not in ("seq", "record")}
    elif kind == "seed":
        observed.seeds.append(r["seed"])
    elif kind == "torch":
        observed.torch_version = r["version"]
    elif kind == "final":
        observed.final[r["wrap"]] = [_param(p) for p in r["params"]]
    elif kind == "compiled":
        observed.compiled = {k: v for k, v in r.items() if k not in ("seq", "record")}
    elif kind == "observer_error":
        observed.errors.append(f"{r['where']}: {r['error']}")
    elif kind == "end":
        observed.exit_code, observed.initial_seed = r["exit_code"], r["initial_seed"]


def _param(p: dict) -> ParamRecord:
    return ParamRecord(p.get("index"), p.get("name"), p.get("param_group"), TensorRecord.of(p.get("grad")),
                       TensorRecord.of(p.get("value")))
