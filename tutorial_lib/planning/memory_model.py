"""The analytic memory model of data-parallel training: bytes of parameters, gradients and optimizer state per rank.

Bytes per parameter, for one rank (``N`` = world size):

=========================  ==========  =========  =====================  ==============
strategy                   parameters  gradients  AdamW state (2 moments)  total (AdamW)
=========================  ==========  =========  =====================  ==============
DDP, fp32                  4           4          8                      16
DDP, bf16 autocast         4           4          8                      16
FSDP (1 or 2), fp32        4 / N       4 / N      8 / N                  16 / N
FSDP, bf16 mixed precision 4 / N       4 / N      8 / N                  16 / N
DDP + ZeroRedundancyOpt.   4           4          8 / N                  8 + 8 / N
=========================  ==========  =========  =====================  ==============

``"zero1"`` is DDP with ``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO stage 1: the optimizer state is
partitioned, parameters and gradients are not). It partitions *whole* parameters, not elements: sorted largest first
(a stable sort), each goes to the rank with the fewest elements so far (the first such rank on a tie), as torch's
``_partition_parameters`` does; a rank keeps the two moments and the step of the parameters it owns, so ``8 / N`` per
parameter holds on average, not on every rank.

Mixed precision does not shrink this *persistent* state: FSDP's ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)`` keeps fp32 shards ("master weights"), fp32 sharded gradients and fp32 optimizer state,
and autocast under DDP keeps fp32 parameters. What bf16 halves is the all-gathered (unsharded) copy of a
unit while it runs, the all-gather traffic, and the activations. AdamW also keeps a 4-byte ``step`` tensor per
parameter tensor (per flat parameter in FSDP1). SGD without momentum keeps no state.

Sharding details that make the prediction exact:

* FSDP2 shards every parameter on dim 0 like ``torch.chunk(world_size)``: rank ``r`` holds rows
  ``[r*c, (r+1)*c)`` with ``c = ceil(dim0 / N)``, so when dim 0 does not divide, the last ranks hold fewer
  rows (possibly none). ``p.to_local()`` shows those rows; the storage FSDP2 allocates is padded to ``c``
  rows on every rank (``padded=True`` predicts that).
* FSDP1 flattens each wrapped unit into one flat parameter padded to a multiple of ``N``; without the unit
  boundaries the model uses ``ceil(total / N)`` elements per rank, at most ``units * (N - 1)`` elements off.

Sources: PyTorch docs of ``torch.distributed.fsdp.fully_shard`` and ``MixedPrecisionPolicy``; the ZeRO
paper (Rajbhandari et al., 2020) for the 2 + 2 + 12 bytes-per-parameter accounting of mixed precision with
fp32 master weights (here the fp32 "master" is the parameter itself).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from ..errors import ConfigError

STRATEGIES = ("ddp", "fsdp2", "fsdp1", "zero1")
OPTIMIZERS = ("adamw", "sgd")
PRECISIONS = ("fp32", "bf16", "fp16")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
STEP_TENSOR_BYTES = 4  # AdamW's per-tensor ``step`` counter: a float32 scalar tensor


@dataclass(frozen=True)
class StateBytes:
    """Predicted bytes one rank holds (a DataFrame row via ``as_dict``).

    Attributes:
        strategy, precision, optimizer, world_size, rank: what was predicted.
        param_bytes, grad_bytes, optimizer_state_bytes: bytes of this rank's parameters, gradients and
            optimizer state (local shards for FSDP).
        unsharded_param_bytes: transient: the all-gathered parameters of the largest FSDP unit in the compute
            dtype (0 for DDP, whose parameters are never sharded; 0 when units are not given).
    """

    strategy: str
    precision: str
    optimizer: str
    world_size: int
    rank: int
    param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    unsharded_param_bytes: int = 0

    @property
    def state_bytes(self) -> int:
        """Parameters + gradients + optimizer state (the persistent part)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_state_bytes

    def as_dict(self) -> dict:
        return {**asdict(self), "state_bytes": self.state_bytes}


def _check(strategy: str, precision: str, optimizer: str, world_size: int, rank: int) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be an integer >= 1, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be an integer in 0..{world_size - 1}, got {rank!r}")


def shard_rows(dim0: int, world_size: int, rank: int, *, padded: bool = False) -> int:
    """Rows of a dim-0 ``Shard(0)`` parameter on ``rank`` (``torch.chunk`` semantics, as FSDP2 shards).

    Args:
        dim0: size of the parameter's first dimension.
        world_size: ranks sharing it (>= 1).
        rank: 0..world_size-1.
        padded: the rows allocated (``ceil(dim0 / world_size)`` on every rank) instead of the rows held.

    Example: ``dim0=5, world_size=2``: rank 0 holds 3 rows, rank 1 holds 2 (both allocate 3).
    ``dim0=3, world_size=4``: ranks 0-2 hold 1 row, rank 3 none.
    """
    chunk = -(-dim0 // world_size)
    if padded:
        return chunk
    return max(0, min(chunk, dim0 - rank * chunk))


def local_numel(shape: Sequence[int], strategy: str, world_size: int, rank: int, *, padded: bool = False) -> int:
    """Elements of one parameter of ``shape`` held by ``rank`` under ``strategy`` (``fsdp1`` as ``fsdp2``).

    Raises ``ConfigError`` for a 0-dimensional parameter under sharding (it has no dim 0 to split; not modelled).
    """
    if strategy in ("ddp", "zero1") or world_size == 1:  # zero1 replicates parameters (its optimizer state: below)
        return math.prod(shape)
    if len(shape) == 0:
        raise ConfigError("a 0-dimensional parameter has no dim 0 to shard; the model covers parameters with >= 1 dim")
    return shard_rows(shape[0], world_size, rank, padded=padded) * math.prod(shape[1:])


def predict_state_bytes(shapes: Mapping[str, Sequence[int]] | Iterable[Sequence[int]], *, strategy: str,
                        world_size: int = 1, rank: int = 0, precision: str = "fp32", optimizer: str = "adamw",
                        padded: bool = False, fsdp1_units: int = 1,
                        units: Mapping[str, Sequence[str]] | None = None) -> StateBytes:
    """Predict the bytes of parameters, gradients and optimizer state on one rank.

    Args:
        shapes: the model's parameter shapes, ``{name: shape}`` (e.g. ``{n: list(p.shape) for n, p in
            model.named_parameters()}``) or a list of shapes.
        strategy: ``"ddp"`` (replicated), ``"fsdp2"`` (per-parameter ``Shard(0)``), ``"fsdp1"`` (flat
            parameters padded to a multiple of ``world_size``), ``"zero1"`` (DDP + ``ZeroRedundancyOptimizer``:
            parameters and gradients replicated, AdamW state of the whole parameters this rank owns).
        world_size: ranks (>= 1); rank: which rank (0..world_size-1).
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``: the compute dtype. Persistent state stays fp32 in
            every case (see the module docstring); it sizes ``unsharded_param_bytes``.
        optimizer: ``"adamw"`` (two fp32 moments per element + a 4-byte step per tensor) or ``"sgd"`` (none).
        padded: FSDP2 only: count the allocated (padded) shard instead of the rows held (``to_local()``).
        fsdp1_units: FSDP1 only: number of flat parameters (wrapped units), for AdamW's step tensors.
        units: optional ``{unit_name: [parameter names]}`` for the transient ``unsharded_param_bytes``.

    Returns:
        ``StateBytes`` for that rank.

    Raises:
        ConfigError: an unknown strategy, precision or optimizer, or a rank outside 0..world_size-1.
    """
    _check(strategy, precision, optimizer, world_size, rank)
    named = dict(shapes) if isinstance(shapes, Mapping) else {str(i): s for i, s in enumerate(shapes)}
    if strategy == "fsdp1" and world_size > 1:
        total = sum(math.prod(s) for s in named.values())
        numel = -(-total // world_size)  # every rank holds the same padded flat shard size
        n_tensors = fsdp1_units
    else:
        numel = sum(local_numel(s, strategy, world_size, rank, padded=padded) for s in named.values())
        n_tensors = len(named) if strategy != "fsdp1" else fsdp1_units
    param_bytes = DTYPE_BYTES["fp32"] * numel
    optimizer_numel = numel
    if strategy == "zero1" and world_size > 1:
        owned = zero1_partition(named, world_size)[rank]
        optimizer_numel, n_tensors = sum(math.prod(named[n]) for n in owned), len(owned)
    optimizer_state = 0
    if optimizer == "adamw":
        optimizer_state = 2 * DTYPE_BYTES["fp32"] * optimizer_numel + STEP_TENSOR_BYTES * n_tensors
    unsharded = 0
    if units and strategy not in ("ddp", "zero1"):
        unsharded = max(sum(math.prod(named[n]) for n in names) for names in units.values()) * DTYPE_BYTES[precision]
    return StateBytes(strategy=strategy, precision=precision, optimizer=optimizer, world_size=world_size, rank=rank,
                      param_bytes=param_bytes, grad_bytes=param_bytes, optimizer_state_bytes=optimizer_state,
                      unsharded_param_bytes=unsharded)


def bytes_per_parameter(strategy: str, *, world_size: int = 1, optimizer: str = "adamw") -> dict[str, float]:
    """The textbook numbers: bytes per model parameter held by one rank (ignoring padding and step counters).

    Returns ``{"params": ..., "grads": ..., "optimizer_state": ..., "total": ...}``, e.g. DDP/AdamW 4, 4, 8, 16,
    FSDP/AdamW at ``world_size=2`` 2, 2, 4, 8 and zero1/AdamW at ``world_size=2`` 4, 4, 4, 12 (its optimizer state
    on average over the ranks). Raises ``ConfigError`` as ``predict_state_bytes``.
    """
    _check(strategy, "fp32", optimizer, world_size, 0)
    share = 1 if strategy == "ddp" else 1 / world_size
    state_share = share
    if strategy == "zero1":
        share = 1
    row = {"params": 4 * share, "grads": 4 * share,
           "optimizer_state": (8 if optimizer == "adamw" else 0) * state_share}
    row["total"] = sum(row.values())
    return row


def zero1_partition(shapes: Mapping[str, Sequence[int]] | Iterable[Sequence[int]],
                    world_size: int) -> list[list[str]]:
    """The parameters each rank owns under ``ZeroRedundancyOptimizer`` (one parameter group), as torch assigns them.

    Args:
        shapes: ``{name: shape}`` in the order of ``model.parameters()`` (the optimizer's parameter group), or a list
            of shapes (named ``"0"``, ``"1"``, ...).
        world_size: ranks (>= 1).

    Returns:
        ``[names owned by rank 0, names owned by rank 1, ...]``: largest first (a stable sort by element count), each
        to the rank with the fewest elements so far, the first such rank on a tie (torch's ``_partition_parameters``
        and ``_get_min_index``, torch 2.8 and 2.13).
    """
    _check("zero1", "fp32", "adamw", world_size, 0)
    named = dict(shapes) if isinstance(shapes, Mapping) else {str(i): s for i, s in enumerate(shapes)}
    owned: list[list[str]] = [[] for _ in range(world_size)]
    sizes = [0] * world_size
    for name in sorted(named, key=lambda n: math.prod(named[n]), reverse=True):
        rank = sizes.index(min(sizes))
        owned[rank].append(name)
        sizes[rank] += math.prod(named[name])
    return owned


def block_units(names: Iterable[str], prefix: str = "blocks.") -> dict[str, list[str]]:
    """Group parameter names into FSDP units as ``--wrap block`` does: ``blocks.<i>.*`` each, the rest the root."""
    units: dict[str, list[str]] = {}
    for name in names:
        key = ".".join(name.split(".")[:2]) if name.startswith(prefix) else "root"
        units.setdefault(key, []).append(name)
    return units
