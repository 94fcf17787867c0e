"""The environment of every launch: this process's, the rank environment, the launcher's defaults, what a spec adds.

The rank environment (``set_rank_env``: the notebooks' ``RANK_ENV``) is kept here and merged into each launch's
environment; ``build_env`` returns a new dict. Nothing here modifies ``os.environ``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..child import protocol
from ..errors import ConfigError
from .devices import DevicePlan


_rank_env: dict[str, str] = {}  # what every launch adds to its ranks' environment (set_rank_env)


def set_rank_env(rank_env: Mapping[str, object] | None) -> dict[str, str]:
    """Set the extra variables every later launch of this process gives its ranks (and ``run_in_process`` its run).

    The notebooks' ``RANK_ENV`` parameter lands here, e.g. ``{"NCCL_P2P_DISABLE": "1"}`` on consumer GPU boards
    whose peer-to-peer path is broken (every multi-GPU collective then stalls until its timeout; ``python -m
    tutorial_lib env`` reports peer access), or ``{"NCCL_SOCKET_IFNAME": "eth0"}``. They are kept by the library and
    merged into each launch's environment (``build_env``); this process's own ``os.environ`` is never changed. A
    call replaces what an earlier one set; a launch's own ``env=`` still wins for that launch.

    Args:
        rank_env: variable name -> value (numbers are written as text); ``None`` or ``{}``: no extra variables.

    Returns:
        The variables set, as text.

    Raises:
        ConfigError: ``rank_env`` is not a mapping, or a name is not a valid variable name.
    """
    global _rank_env
    if rank_env is None:
        rank_env = {}
    if not isinstance(rank_env, Mapping):
        raise ConfigError(f"RANK_ENV must be a dict of variable names to values, got {rank_env!r}; "
                          'e.g. {"NCCL_P2P_DISABLE": "1"}')
    bad = [name for name in rank_env if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name))]
    if bad:
        raise ConfigError(f"RANK_ENV has invalid variable name(s) {bad}; names are letters, digits and _")
    _rank_env = {name: str(value) for name, value in rank_env.items()}  # replaced whole: a reader sees one or the other
    return dict(_rank_env)


def rank_env() -> dict[str, str]:
    """The variables ``set_rank_env`` set (a copy)."""
    return dict(_rank_env)


def build_env(plan: DevicePlan, extra: Mapping[str, str] = (), *, base: Mapping[str, str] | None = None,
              shutdown_grace_s: float = 5.0, max_restarts: int = 0) -> dict[str, str]:
    """The environment of torchrun and its workers: a copy of ``base`` plus settings.

    ``base``: ``None`` for this process's environment (``os.environ``) with the rank environment (``set_rank_env``)
    over it. Never modifies ``os.environ``. Adds, unless already set:
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
    env = {**os.environ, **_rank_env} if base is None else dict(base)
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


def with_observer(env: Mapping[str, str], folder: str | os.PathLike | None) -> dict[str, str]:
    """``env`` with the rank runner's observer on, writing into ``folder`` (``protocol.OBSERVE_ENV``), or off
    (``folder=None``: the variable removed, whatever the caller's environment held)."""
    env = dict(env)
    env.pop(protocol.OBSERVE_ENV, None)
    if folder is not None:
        env[protocol.OBSERVE_ENV] = str(folder)
    return env
