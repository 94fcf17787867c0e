"""The memory plan of a tensor-parallel training step: ``tensor_parallel.py``'s GPT, per rank, by category.

``plan_tp_memory(["--dim", 1024, ...], world_size=4, layout="tp+sp")`` does for tensor parallelism what
``plan_memory`` does for ``train_lm.py`` (see ``tutorial_lib.planning.memory_plan``): it builds the model of the lesson
script's ``model`` lesson (its own ``GPT``, ``model_plan``, ``batch`` and ``build_optimizer``, imported by path),
applies its ``parallelize_module`` plan on a 1-D ``DeviceMesh`` of ``world_size`` ranks, and runs the script's own
``train_step`` twice inside ``FakeTensorMode`` over a fake process group (one process, no tensor memory, no
collective sent): a warm-up step (the optimizer's state, DTensor's sharding caches), then one under torch's
``MemTracker``, whose peak by category (parameters, gradients, optimizer state, activations, temporaries) is the
plan. Every rank of a 1-D TP mesh holds the same shapes (``check_world`` refuses sizes the split cannot divide
evenly), so rank 0's plan is every rank's.

Checked against real runs (tests/integration/test_tensor_pipeline.py, notebook 12): ``tensor_parallel.py --lessons
model --track-memory`` runs the same tracker over the same second step with real tensors and real gloo collectives.
In most runs every category was equal, byte for byte, on every rank, TP and TP + SP, torch 2.8 and 2.13; parameters
and optimizer state always, and the total within one collective's buffer (``compare_tp_plan`` says why).

Not planned (``ConfigError``): the 2-D lesson (FSDP x TP: use ``plan_memory``'s FSDP path for the dp dimension; the
two are not combined here) and pipeline stages (``pipeline_parallel.py``'s stage memory is counted in the run, not
planned). Sources: torch.distributed._tools.mem_tracker (MemTracker's docstring); torch's fake process group
(torch.testing._internal.distributed.fake_pg); torch.distributed.tensor.parallel.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError
from .memory_plan import ORDER, MemoryPlan, categories_of
from .tracker_counting import DEVICES, counted_as_cuda, device_snapshot, fake_world
from ..notebook.script_source import import_script

TP_LAYOUTS = ("tp", "tp+sp")  # the model lesson's two layouts: "TP" and "TP + SP"
LESSON_LABELS = {"tp": "TP", "tp+sp": "TP + SP"}  # the keys of the lesson's result


def plan_tp_memory(args: Sequence[object] = (), *, world_size: int = 2, layout: str = "tp",
                   script: str | Path = "tensor_parallel", device: str = "cpu") -> MemoryPlan:
    """Plan one rank's peak memory in a step of ``tensor_parallel.py``'s model lesson on ``world_size`` TP ranks.

    Args:
        args: the script's flags (``--dim``, ``--n-heads``, ``--n-layers``, ``--vocab-size``, ``--seq-len``,
            ``--batch-size``, ``--optimizer``), checked by its own parser; the plan is of the ``model`` lesson
            (``--lessons 2d`` is refused).
        world_size: the tensor-parallel degree (ranks of the 1-D mesh, >= 1); it must divide ``--n-heads``,
            ``--vocab-size`` and ``--seq-len`` (the script's ``check_world``).
        layout: ``"tp"`` (Megatron-LM's column/row split, whole activations between blocks) or ``"tp+sp"`` (with
            sequence parallelism: the norms on sequence shards).
        script: the lesson script (a shipped name or a path).
        device: ``"cpu"`` or ``"cuda"``: the device the run uses, whose memory tracker the plan counts as
            (``plan_memory``'s ``device``: on ``"cuda"`` every storage rounded up to 512 bytes, AdamW's ``step``
            counters left out, as torch's ``MemTracker`` counts a CUDA run).

    Returns:
        A ``MemoryPlan`` (``parallel`` is the layout; ``peak_bytes``: rank 0's peak by category, bytes; every rank's
        is the same). ``state_bytes_analytic`` counts parameters + gradients (+ AdamW's two moments) of the local
        shards, fp32. ``unsimulated_bytes``: the largest buffer a collective of the step moves (batch x tokens x
        width, fp32), which a real run may still hold at its peak (``compare_tp_plan``).

    Raises:
        ConfigError: a layout it does not plan (2-D FSDP x TP, pipeline stages, anything not in ``TP_LAYOUTS``), bad
            flags (the script's own message), a world size the split cannot divide, a device not in ``DEVICES``, or
            a process group already exists in this process.
    """
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    if layout not in TP_LAYOUTS:
        raise ConfigError(f"plan_tp_memory plans the layouts {TP_LAYOUTS}, got {layout!r}; 2-D FSDP x TP and "
                          "pipeline stages are not planned (plan_memory plans FSDP2, DDP and HSDP of train_lm.py)")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"world_size must be an int >= 1, got {world_size!r}")
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}")
    module = import_script(script)
    argv = [str(a) for a in args]
    try:
        parsed = module.parse_args(argv)
    except SystemExit as e:
        raise ConfigError(f"{Path(str(script)).stem}: invalid flags {argv} (see the message above)") from e
    if "2d" in parsed.lessons:
        raise ConfigError("plan_tp_memory plans the model lesson's 1-D tensor-parallel layouts; --lessons 2d (FSDP x "
                          "TP on a 2-D mesh) is not planned: drop it")
    try:
        module.check_world(parsed, world_size)
    except ValueError as e:
        raise ConfigError(f"world_size {world_size}: {e}") from e
    if dist.is_available() and dist.is_initialized():
        raise ConfigError("this process already has a process group; plan_tp_memory makes a fake one of its own: "
                          "call it where no process group exists (e.g. the notebook, not a rank)")
    snapshot, n_params, local_numel = _traced_tp_step(module, parsed, world_size, layout == "tp+sp", device)
    per_element = 4 * (2 + 2 * (parsed.optimizer == "adamw"))  # fp32 parameter, gradient (+ 2 AdamW moments)
    # The largest tensor a collective of this plan moves: a residual-stream activation or its gradient, fp32 (a
    # bound written from the shapes, not traced: what the allowance in compare_tp_plan's check is).
    buffer = 4 * parsed.batch_size * parsed.seq_len * parsed.dim if world_size > 1 else 0
    if device == "cuda":
        buffer = -(-buffer // 512) * 512  # the CUDA tracker's rounding
    peak = categories_of(snapshot)
    return MemoryPlan(args=tuple(argv), parallel=layout, world_size=world_size, n_params=n_params,
                      peak_bytes=peak, state_bytes_analytic=float(per_element * local_numel),
                      plan_time_s=time.perf_counter() - start, torch_version=torch.__version__,
                      unsimulated_bytes=buffer, collective_buffer_bytes=buffer,
                      rank_peak_bytes={r: peak for r in range(world_size)}, device=device,
                      notes=(f"tensor parallel over {world_size} ranks ({layout}); every rank's peak is rank 0's",
                             f"not in the peak: one collective's buffer, {buffer} bytes, which a real run can hold "
                             "a moment longer (the headroom counts it)"))


def _traced_tp_step(module, parsed, world_size: int, sequence_parallel: bool, device: str = "cpu"
                    ) -> tuple[dict, int, int]:
    """The script's TP model and ``train_step`` in fake mode over ``world_size`` fake ranks: (the tracker's peak
    snapshot of the tracked step, the model's parameters, this rank's local parameter elements)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    cpu = torch.device("cpu")
    with fake_world(world_size):
        mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
        with FakeTensorMode():
            # the lesson's build() without its .to(device) (which cannot swap fake parameters): the CPU is the device
            model = module.GPT(parsed.vocab_size, parsed.dim, parsed.n_heads, parsed.n_layers, parsed.seq_len)
            n_params = sum(p.numel() for p in model.parameters())
            parallelize_module(model, mesh, module.model_plan(parsed.n_layers, sequence_parallel=sequence_parallel))
            local_numel = sum(module.local(p).numel() for p in model.parameters())
            optimizer = module.build_optimizer(parsed, model)
            # As the lesson: step 1 warms up (the optimizer's state, DTensor's caches), step 2 runs under the tracker.
            x, y = module.batch(parsed, 1, cpu)
            loss, logits = module.train_step(model, optimizer, x, y)  # the lesson keeps both until the next step
            x, y = module.batch(parsed, 2, cpu)
            counting = counted_as_cuda(optimizer) if device == "cuda" else contextlib.nullcontext()
            with counting:  # from before track_external registers the model and optimizer
                tracker = MemTracker()
                tracker.track_external(model, optimizer)
                with tracker, propagation_in_its_own_fake_mode():
                    module.train_step(model, optimizer, x, y)
            snapshot = device_snapshot(tracker.get_tracker_snapshot("peak"), device)
    return snapshot, n_params, local_numel


@contextlib.contextmanager
def propagation_in_its_own_fake_mode():
    """Make DTensor's sharding propagation run in a fake mode of its own, as it does in a real run.

    torch 2.13's ``ShardingPropagator`` computes an op's output metadata on global-shape fake tensors under
    ``detect_fake_mode() or FakeTensorMode()``: in a real run a fresh fake mode, which ``MemTracker`` skips (it
    tracks only ops under the fake mode active when it was entered: none in a real run); under the plan's
    ``FakeTensorMode`` that mode itself, so the tracker would count those global-shape tensors as temporaries. A
    ``detect_fake_mode`` that finds none here gives the propagation its own mode again. (torch 2.8's propagator
    does not look for an active mode.)
    """
    from torch.distributed.tensor import _sharding_prop
    if not hasattr(_sharding_prop, "detect_fake_mode"):
        yield
        return
    original = _sharding_prop.detect_fake_mode
    _sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = original


def read_tp_memory(ranks: Sequence[Mapping], layout: str = "tp") -> list[dict[str, int]]:
    """The peaks a ``tensor_parallel.py --lessons model --track-memory`` run measured, one ``{category: bytes}`` per
    rank, from its ranks' results (``tl.runs.read_rank_json(run_dir, "tp")``), in their order.

    Raises:
        ConfigError: ``layout`` is not one of ``TP_LAYOUTS``, or the run did not track memory (no ``memory_peak`` in
            its step 2: run it with ``--track-memory``).
    """
    if layout not in TP_LAYOUTS:
        raise ConfigError(f"layout must be one of {TP_LAYOUTS}, got {layout!r}")
    out = []
    for r in ranks:
        steps = r.get("model", {}).get(LESSON_LABELS[layout], {}).get("steps", [])
        peak = next((s["memory_peak"] for s in steps if "memory_peak" in s), None)
        if peak is None:
            raise ConfigError(f"rank {r.get('rank')}: no memory_peak in the model lesson's {LESSON_LABELS[layout]} "
                              "steps: run tensor_parallel.py with --lessons model --track-memory")
        out.append(categories_of(peak))
    return out


def compare_tp_plan(plan: MemoryPlan, measured: Mapping[str, int]):
    """A DataFrame, per category with bytes on either side: planned and measured bytes, their difference and
    relative error, and the total.

    Measured here (2 gloo ranks, SGD and AdamW, TP and TP + SP, torch 2.8 and 2.13; tests/integration/
    test_tensor_pipeline.py, notebook 12): in most runs every category equal byte for byte on every rank. Why it can
    be exact: parameters, gradients and optimizer state are local shards whose shapes the placements decide, and
    every activation and temporary is the output of the same local op on the same shapes (fake mode runs DTensor's
    dispatch, redistributions and functional collectives as a real run does). What is not exact: when a real
    collective's buffer is released. Now and then a real run frees one after the main thread's next allocation (most
    likely gloo's worker thread dropping its reference to the tensor it reduced after the work is marked done; not
    traced further): the real peak then holds one more buffer (at most ``plan.unsimulated_bytes``) and may fall at
    another moment, with another split into categories. Seen: rank 0's TP peak 14268 bytes above the plan, in
    backward (16128 bytes of temporaries more than the plan's own backward peak; one buffer is 16384), in 3 of 5
    nbval runs of notebook 12, 0 of 6 standalone runs. So
    parameters and optimizer state are always exact, and the total lies in ``[plan, plan + unsimulated_bytes]``.
    (The FSDP plan's reduce-scatter buffers, in ``tutorial_lib.planning.memory_plan``, are the same effect.) On torch
    2.13 the plan is exact only with DTensor's sharding propagation in a fake mode of its own
    (``propagation_in_its_own_fake_mode``).

    Args:
        plan: a ``plan_tp_memory`` result.
        measured: one rank's ``read_tp_memory`` entry ({category: bytes}) for the same layout.
    """
    import pandas as pd
    rows = [{"category": k, "planned_bytes": plan.peak_bytes[k], "measured_bytes": measured.get(k, 0),
             } for k in ORDER if plan.peak_bytes[k] or measured.get(k, 0)]
    rows.append({"category": "total", "planned_bytes": plan.total_bytes, "measured_bytes": sum(measured.values())})
    table = pd.DataFrame(rows).set_index("category")
    table["difference_bytes"] = table["planned_bytes"] - table["measured_bytes"]
    table["relative_error"] = table["difference_bytes"].abs() / table["measured_bytes"].where(
        table["measured_bytes"] > 0)
    return table


__all__ = ["plan_tp_memory", "read_tp_memory", "compare_tp_plan", "TP_LAYOUTS"]
