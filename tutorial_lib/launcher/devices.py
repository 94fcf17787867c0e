"""Device selection: which device, backend and number of ranks a launch uses."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError

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


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive ``int`` (not a bool or a float), else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{name} must be a positive integer, got {value!r} ({type(value).__name__}); pass a number, e.g. 2"
        )
    if value <= 0:
        raise ConfigError(f"{name} must be >= 1, got {value}")
    return value


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


def set_rank_env(rank_env: Mapping[str, object] | None) -> dict[str, str]:
    """Put extra variables into this process's environment, which every later launch copies to its ranks.

    The notebooks' ``RANK_ENV`` parameter lands here, e.g. ``{"NCCL_P2P_DISABLE": "1"}`` on consumer GPU boards
    whose peer-to-peer path is broken (every multi-GPU collective then stalls until its timeout; ``python -m
    tutorial_lib env`` reports peer access), or ``{"NCCL_SOCKET_IFNAME": "eth0"}``. A launch's own ``env=``
    still wins for that launch.

    Args:
        rank_env: variable name -> value (numbers are written as text); ``None`` or ``{}`` changes nothing.

    Returns:
        The variables set, as text.

    Raises:
        ConfigError: ``rank_env`` is not a mapping, or a name is not a valid variable name.
    """
    if rank_env is None:
        return {}
    if not isinstance(rank_env, Mapping):
        raise ConfigError(f"RANK_ENV must be a dict of variable names to values, got {rank_env!r}; "
                          'e.g. {"NCCL_P2P_DISABLE": "1"}')
    bad = [name for name in rank_env if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name))]
    if bad:
        raise ConfigError(f"RANK_ENV has invalid variable name(s) {bad}; names are letters, digits and _")
    values = {name: str(value) for name, value in rank_env.items()}
    os.environ.update(values)
    return values


def build_env(plan: DevicePlan, extra: Mapping[str, str] = (), *, base: Mapping[str, str] | None = None,
              shutdown_grace_s: float = 5.0, max_restarts: int = 0) -> dict[str, str]:
    """The environment of torchrun and its workers: a copy of ``base`` (``os.environ``) plus settings.

    Never modifies ``os.environ``. Adds, unless already set:
    ``OMP_NUM_THREADS=1`` (ranks share the cores; also silences torchrun's banner),
    ``PYTHONUNBUFFERED=1`` (lines arrive as they are printed),
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (torchrun's SIGTERM-to-SIGKILL grace, seconds),
    ``GLOO_SOCKET_IFNAME=lo`` on every plan and ``NCCL_SOCKET_IFNAME=lo`` on CUDA plans (every launch
    is on this one host: one node, or simulated nodes that rendezvous on 127.0.0.1, so gloo and
    NCCL's bootstrap sockets stay on loopback; GPU jobs create gloo groups too: the sampler demo,
    the helper group of ``TORCH_DISTRIBUTED_DEBUG=DETAIL``), and with restarts
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (without it gloo reconnects to the previous
    attempt's port and half of elastic restarts failed on this kind of machine; it acts on the c10d
    rendezvous ``build_command`` uses with restarts: the workers then host their own store).
    On CPU with GPUs present, ``CUDA_VISIBLE_DEVICES=""`` hides them from the workers.
    ``extra`` is applied last and wins.
    """
    env = dict(os.environ if base is None else base)
    defaults = {
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": f"{shutdown_grace_s:g}",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    if plan.device == "cuda":
        defaults["NCCL_SOCKET_IFNAME"] = "lo"
    elif plan.gpu_count > 0:
        env["CUDA_VISIBLE_DEVICES"] = ""
    if max_restarts > 0:
        defaults["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    for key, value in defaults.items():
        env.setdefault(key, value)
    env.update(extra)
    return env
