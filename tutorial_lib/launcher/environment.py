"""The environment of every launch: this process's, the launcher's defaults, and what the caller adds.

``build_env`` is pure (a new dict; ``os.environ`` is never modified by a launch).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..errors import ConfigError
from .devices import DevicePlan


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
