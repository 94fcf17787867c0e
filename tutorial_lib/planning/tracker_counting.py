"""How torch's memory tracker counts a step planned in fake mode: the fake process group it runs on, and the device
its counts stand for.

``fake_world``: torch's fake process group (one process, no collective sent) as any rank of any world size.
``counted_as_cuda``: while active, the tracker counts CPU storages as torch's ``MemTracker`` counts CUDA ones: rounded
up to 512 bytes (``_PYTORCH_MIN_ALLOCATE`` in ``torch/distributed/_tools/mem_tracker.py``,
``_WeakRefInfo._calculate_mem_consumed``, torch 2.8 and 2.13) and filed under a ``cuda`` device, except AdamW's
``step`` counters, which a CUDA run keeps on the CPU (``foreach`` off, not ``capturable`` or ``fused``).
``device_snapshot``: one device's categories from the tracker's snapshot.
``hierarchy_warning_silenced``: the tracker's "module hierarchy tracking maybe be messed up" warning, which a
transformers model built with the ``kernels`` package raises for no fault of the plan, kept out of a learner's cell.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping

CUDA_MIN_ALLOCATE = 512  # torch's MemTracker rounds every CUDA storage up to this (mem_tracker._PYTORCH_MIN_ALLOCATE)
DEVICES = ("cpu", "cuda")  # the devices a plan can count for


def fake_world(world_size: int, rank: int = 0):
    """A fake process group of ``world_size`` ranks in this process, as rank ``rank``, destroyed on exit."""
    import torch.distributed as dist
    import torch.distributed._tools.fake_collectives  # noqa: F401  (c10d's collectives on fake tensors; torch 2.8)
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers torch's "fake" backend)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    @contextlib.contextmanager
    def world():
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        try:
            yield
        finally:
            dist.destroy_process_group()
    return world()


# torch/distributed/_tools/mod_tracker.py (torch 2.8 and 2.13), ModTracker._get_append_fn: the text of the one warning
# hierarchy_warning_silenced drops.
HIERARCHY_WARNING = "The module hierarchy tracking maybe be messed up"


@contextlib.contextmanager
def hierarchy_warning_silenced():
    """Run torch's memory trackers without their "The module hierarchy tracking maybe be messed up" warning (only
    that one, only from ``torch.distributed._tools.mod_tracker``), and restore ``warnings.formatwarning``, which the
    tracker replaces for the whole process before it warns.

    Why the plan stays right: with the ``kernels`` package installed (a dependency of transformers from 5.25 on,
    an option before), ``apply_rotary_pos_emb`` is an ``nn.Module`` of class ``Func`` shared by every model
    (transformers' ``use_kernel_forward_from_hub("rotary_pos_emb")``), and each attention layer holds a private
    ``Func`` it dispatches to (``use_kernelized_func``), so the shared one's forward calls the private one's.
    Neither is a submodule of the model, so torch's ``ModTracker`` names both by their class, "Func", and takes the
    inner call for the outer module entered again: it warns once per attention layer per forward. ``Func`` modules hold no parameters and no buffers,
    and the tracker files memory by what a tensor is (parameter, gradient, activation, ...), not by module name: the
    bytes are the same (``tests/integration/test_transformers_versions.py`` plans with and without ``kernels``
    and compares every category). Any other warning still shows.
    """
    formatwarning = warnings.formatwarning
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=HIERARCHY_WARNING, category=UserWarning,
                                module=r"torch\.distributed\._tools\.mod_tracker")
        try:
            yield
        finally:
            warnings.formatwarning = formatwarning


def device_snapshot(peak: Mapping, device: str) -> dict:
    """The ``{category: bytes}`` of ``device`` (``"cpu"`` or ``"cuda"``) in a tracker's ``{device: {...}}`` snapshot
    (every category 0 when the step put nothing there)."""
    for key, value in peak.items():
        if str(key).split(":")[0] == device:
            return {getattr(k, "name", str(k)): int(v) for k, v in value.items()}
    return {}


def largest_by_category(tracker, device: str) -> dict:
    """Each category at its largest over a tracker's snapshots: its peak and the snapshots torch's ``MemTracker``
    takes at every module's boundaries (``memory_tracking[module].snapshots``: before and after each forward and
    backward; ``FSDPMemTracker`` adds its units' all-gathers and reduce-scatters), ``{category: bytes}`` of ``device``.

    Categories can be at their largest at different moments (gathered parameters at the end of forward, gradients
    after backward): the sum is what a static count, such as ZeRO's model states, adds up; not a moment's total."""
    out = dict(device_snapshot(tracker.get_tracker_snapshot("peak"), device))
    for stats in tracker.memory_tracking.values():
        for snapshots in stats.snapshots.values():
            for snapshot in snapshots:
                for name, value in device_snapshot(snapshot, device).items():
                    out[name] = max(out.get(name, 0), value)
    return out


@contextlib.contextmanager
def counted_as_cuda(optimizer=None):
    """While active, torch's memory trackers count a CPU storage as a CUDA one: rounded up to 512 bytes
    (``_WeakRefInfo._calculate_mem_consumed``) and filed under a ``cuda`` device; AdamW's ``step`` counters of
    ``optimizer``, which a CUDA run keeps on the CPU, stay filed under the CPU."""
    import torch
    from torch.distributed._tools import mem_tracker

    on_cpu = set()
    for state in (optimizer.state.values() if optimizer is not None else ()):
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor):
            on_cpu.add(step.untyped_storage()._cdata)
    original = mem_tracker._WeakRefInfo.__dict__["create_winfo"]  # a classmethod
    cuda = torch.device("cuda")

    def create_winfo(cls, st, device, reftype, callback=None):
        if device.type == "cpu" and st._cdata not in on_cpu:
            device = cuda
        return original.__func__(cls, st, device, reftype, callback)

    mem_tracker._WeakRefInfo.create_winfo = classmethod(create_winfo)
    try:
        yield
    finally:
        mem_tracker._WeakRefInfo.create_winfo = original


__all__ = ["fake_world", "counted_as_cuda", "device_snapshot", "largest_by_category", "CUDA_MIN_ALLOCATE", "DEVICES"]
