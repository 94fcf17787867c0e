"""Device selection: which device, backend and number of ranks a launch uses, and which GPUs each rank sees."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from ..notebook.parameters import check_positive_int

DEVICES = ("auto", "cpu", "cuda")
CPU_DEFAULT_NPROC = 2


@dataclass(frozen=True)
class DevicePlan:
    """Resolved placement of a job.

    Attributes:
        device: ``"cuda"`` or ``"cpu"``.
        backend: process-group backend the scripts will pick: ``"nccl"`` on CUDA, ``"gloo"`` on CPU.
        nproc_per_node: number of ranks to start on this machine.
        gpu_count: CUDA devices visible to this process (0 on CPU-only machines).
    """

    device: str
    backend: str
    nproc_per_node: int
    gpu_count: int


def cuda_device_count() -> int:
    """Number of visible CUDA devices (0 without CUDA). Creates no CUDA context in this process."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver means no usable GPU here
        return 0


def resolve_device(
    device: str = "auto",
    nproc_per_node: int | None = None,
    *,
    max_gpus: int | None = None,
    backend: str | None = None,
    gpu_count: int | None = None,
) -> DevicePlan:
    """Decide device, backend and rank count, or explain why the request cannot run here.

    Args:
        device: ``"auto"`` (CUDA when GPUs exist, else CPU), ``"cpu"`` or ``"cuda"``.
        nproc_per_node: ranks on this machine. ``None``: one per GPU (capped by ``max_gpus``) on CUDA,
            2 on CPU. On CPU any positive number works (ranks share the cores).
        max_gpus: upper bound on the default number of GPU ranks.
        backend: ``None`` (pick from the device), ``"gloo"`` or ``"nccl"``; nccl needs CUDA.
        gpu_count: override the detected number of GPUs (for tests and planning).

    Returns:
        A ``DevicePlan``.

    Raises:
        ConfigError: unknown device or backend, a non-positive or non-integer count, more GPU ranks
            than GPUs, CUDA or nccl asked for on a machine without CUDA.
    """
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}")
    if nproc_per_node is not None:
        check_positive_int("nproc_per_node", nproc_per_node)
    if max_gpus is not None:
        check_positive_int("max_gpus", max_gpus)
    if backend not in (None, "gloo", "nccl"):
        raise ConfigError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
    gpus = cuda_device_count() if gpu_count is None else gpu_count
    if device == "auto":
        device = "cuda" if gpus > 0 else "cpu"
    if device == "cuda" and gpus == 0:
        raise ConfigError("device='cuda' but this machine has no usable CUDA GPU; use device='cpu' or 'auto'")
    if backend == "nccl" and device != "cuda":
        raise ConfigError("backend='nccl' needs CUDA GPUs; on CPU use backend='gloo' (or leave backend=None)")
    if device == "cuda":
        if nproc_per_node is None:
            nproc_per_node = min(gpus, max_gpus) if max_gpus else gpus
        if nproc_per_node > gpus:
            raise ConfigError(
                f"nproc_per_node={nproc_per_node} but only {gpus} GPU(s) are visible: each rank needs its "
                f"own GPU (device from LOCAL_RANK); use nproc_per_node<={gpus} or device='cpu'"
            )
        return DevicePlan("cuda", backend or "nccl", nproc_per_node, gpus)
    return DevicePlan("cpu", backend or "gloo", nproc_per_node or CPU_DEFAULT_NPROC, gpus)


NCCL_TIMEOUT_FLOOR_S = 30.0


def collective_timeout_s(seconds: float, plan: DevicePlan) -> float:
    """The process-group timeout to give a run that should turn a hang into an error quickly.

    Args:
        seconds: the timeout wanted, in seconds (a lesson uses 3 s to show a hang failing fast).
        plan: the run's ``DevicePlan``.

    Returns:
        ``seconds`` on gloo. On NCCL at least ``NCCL_TIMEOUT_FLOOR_S`` (30 s): there the same timeout also bounds
        the communicator's set-up inside the first collective (a CUDA context per rank, NCCL's bootstrap and
        topology search: several seconds on 8 GPUs, more on a cold machine), so a 3 s timeout would fail the
        healthy runs too. See ``torch.distributed.init_process_group`` (``timeout``).

    Raises:
        ConfigError: ``seconds`` is not a positive number.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ConfigError(f"collective timeout must be a positive number of seconds, got {seconds!r}")
    return max(float(seconds), NCCL_TIMEOUT_FLOOR_S) if plan.backend == "nccl" else float(seconds)


def parse_visible_devices(value: str | None) -> list[int | str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` as CUDA reads them (torch's ``_parse_visible_devices`` rules).

    Args:
        value: the variable's value, ``None`` when unset.

    Returns:
        ``None`` when unset (every GPU is visible); else the entries in order. A list that starts with
        ``GPU-`` (or ``MIG-``) holds UUIDs or unique prefixes of them, read up to the first entry without that
        prefix; otherwise indices, each read like ``strtoul`` (``"1gpu"`` is 1) up to the first that is not a
        number (``""``, ``-1``, ``"none"``: no GPU at all). A repeated entry hides every GPU (``[]``).
    """
    if value is None:
        return None
    prefix = next((p for p in ("GPU-", "MIG-") if value.startswith(p)), None)
    entries: list[int | str] = []
    for token in value.split(","):
        entry: int | str
        if prefix:
            if not token.startswith(prefix):
                break
            entry = token
        else:
            number = re.match(r"\+?\d+", token.strip())
            if number is None:
                break
            entry = int(number.group())
        if entry in entries:
            return []
        entries.append(entry)
    return entries


def node_visible_devices(env: Mapping[str, str], node: int, nproc_per_node: int, gpu_count: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` of simulated node ``node``: its own slice of the job's GPUs; pure.

    Args:
        env: the job's environment; its ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs) lists the GPUs
            the job may use; unset: GPUs ``0..gpu_count-1``.
        node: the node rank (0-based).
        nproc_per_node: ranks, so GPUs, per node.
        gpu_count: GPUs visible to the launching process (used when ``CUDA_VISIBLE_DEVICES`` is unset).

    Returns:
        Entries ``node * nproc_per_node`` to ``(node + 1) * nproc_per_node - 1`` of the job's GPUs, comma
        separated: that node's ranks see them as ``cuda:0..nproc_per_node-1``. Slicing the job's list, not
        counting from GPU 0, keeps a node inside the GPUs the user allowed.
    """
    visible = parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    entries = [str(e) for e in visible] if visible is not None else [str(i) for i in range(gpu_count)]
    return ",".join(entries[node * nproc_per_node:(node + 1) * nproc_per_node])
