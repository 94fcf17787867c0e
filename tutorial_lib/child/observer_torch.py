"""How torch's objects become the observer's record fields: a collective's arguments, a wrapping module, a tensor.

Loaded by ``observer.py`` (``load_sibling``) in a rank whose launch asked to be observed. Standard library only at
import, and nothing of ``tutorial_lib``: every function takes the imported ``torch`` module as its first argument.
What is read from torch's private state (DDP's ``_get_ddp_logging_data``, FSDP2's param groups) is read the same way
on torch 2.8 and 2.13 (tested on both); a description that fails on another version becomes an ``observer_error``
record, never an error in the script.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import os
import sysconfig

# torch's op (without its namespace) -> (the torch.distributed function's name, its kind, the input and output
# arguments). Kinds count what a lesson counts: FSDP2's ``_allgather_base_`` is an all-gather.
C10D_OPS = {
    "allreduce_": ("all_reduce", "all_reduce", "tensors", "tensors"),
    "allreduce_coalesced_": ("all_reduce_coalesced", "all_reduce", "tensors", "tensors"),
    "allgather_": ("all_gather", "all_gather", "input_tensors", "output_tensors"),
    "_allgather_base_": ("all_gather_into_tensor", "all_gather", "input_tensor", "output_tensor"),
    "allgather_coalesced_": ("all_gather_coalesced", "all_gather", "input_list", "output_lists"),
    "allgather_into_tensor_coalesced_": ("all_gather_into_tensor_coalesced", "all_gather", "inputs", "outputs"),
    "reduce_scatter_": ("reduce_scatter", "reduce_scatter", "input_tensors", "output_tensors"),
    "_reduce_scatter_base_": ("reduce_scatter_tensor", "reduce_scatter", "input_tensor", "output_tensor"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced", "reduce_scatter", "inputs", "outputs"),
    "broadcast_": ("broadcast", "broadcast", "tensors", "tensors"),
    "reduce_": ("reduce", "reduce", "tensors", "tensors"),
    "gather_": ("gather", "gather", "input_tensors", "output_tensors"),
    "scatter_": ("scatter", "scatter", "input_tensors", "output_tensors"),
    "alltoall_": ("all_to_all", "all_to_all", "input_tensors", "output_tensors"),
    "alltoall_base_": ("all_to_all_single", "all_to_all", "input", "output"),
    "barrier": ("barrier", "barrier", None, None),
    "monitored_barrier_": ("monitored_barrier", "barrier", None, None),
    "send": ("send", "send", "tensors", None),
    "recv_": ("recv", "recv", None, "tensors"),
    "recv_any_source_": ("recv", "recv", None, "tensors"),
}
# The functional collectives (DTensor, tensor parallel, compiled code): (name, kind); their outputs are made inside
# torch, so their sizes follow from the inputs (``_functional_outputs``).
FUNCTIONAL_OPS = {
    "all_reduce": ("all_reduce", "all_reduce"), "all_reduce_": ("all_reduce", "all_reduce"),
    "all_reduce_coalesced": ("all_reduce_coalesced", "all_reduce"),
    "all_reduce_coalesced_": ("all_reduce_coalesced", "all_reduce"),
    "all_gather_into_tensor": ("all_gather_into_tensor", "all_gather"),
    "all_gather_into_tensor_out": ("all_gather_into_tensor", "all_gather"),
    "all_gather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", "all_gather"),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", "reduce_scatter"),
    "reduce_scatter_tensor_out": ("reduce_scatter_tensor", "reduce_scatter"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
    "all_to_all_single": ("all_to_all_single", "all_to_all"),
    "broadcast": ("broadcast", "broadcast"), "broadcast_": ("broadcast", "broadcast"),
    "isend": ("send", "send"), "irecv": ("recv", "recv"), "batch_p2p_ops": ("batch_isend_irecv", "p2p"),
}
# The modules that wrap another one (their class name, in a torch module): seen when they register it.
WRAPPER_CLASSES = ("DistributedDataParallel", "FullyShardedDataParallel", "DataParallel")


def collective_fields(torch, namespace: str, name: str, bound: dict):
    """``(process group, fields)`` of one call of the op ``namespace::name`` with arguments ``bound`` (by schema
    name), or ``None`` for a call on fake or meta tensors (``torch.compile`` tracing, not a collective that ran)."""
    if namespace == "c10d":
        op, kind, inputs, outputs = C10D_OPS[name]
        boxed = bound.get("process_group")
        group = torch._C._distributed_c10d.ProcessGroup.unbox(boxed) if boxed is not None else None
        ins, outs = tensors_in(torch, bound.get(inputs)), tensors_in(torch, bound.get(outputs))
        reduce_op = _reduce_op_name(torch, bound.get("reduce_op"))
    else:
        op, kind = FUNCTIONAL_OPS[name]
        group = _resolve_group(torch, bound.get("group_name"))
        ins = tensors_in(torch, next((bound[k] for k in ("input", "inputs", "tensors", "tensor") if k in bound), None))
        outs = _functional_outputs(kind, ins, bound, group)
        reduce_op = bound.get("reduce_op") if isinstance(bound.get("reduce_op"), str) else None
    if any(t.device.type == "meta" or type(t).__name__ == "FakeTensor" for t in ins + outs
           if t is not None and not isinstance(t, _Shape)):
        return None
    barrier, first = kind == "barrier", (ins or outs or [None])[0]
    return group, dict(op=op, kind=kind, torch_op=f"{namespace}::{name}", reduce_op=reduce_op,
                       input_bytes=0 if barrier else sum(nbytes(t) for t in ins),
                       output_bytes=0 if barrier else sum(nbytes(t) for t in outs),
                       dtype=None if barrier or first is None else dtype_name(first),
                       shapes=[] if barrier else [list(t.shape) for t in ins[:16]])


class _Shape:
    """A functional collective's output as its shape, dtype and element size (it is made inside torch)."""

    def __init__(self, shape, like) -> None:
        self.shape, self.dtype, self._size = tuple(shape), like.dtype, like.element_size()

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    def element_size(self) -> int:
        return self._size


def _functional_outputs(kind: str, ins: list, bound: dict, group) -> list:
    size = group.size() if group is not None else 1
    if bound.get("out") is not None:
        return [bound["out"]]
    if kind == "all_gather":
        return [_Shape((t.shape[0] * size, *t.shape[1:]), t) for t in ins]
    if kind == "reduce_scatter":
        return [_Shape((t.shape[0] // size, *t.shape[1:]), t) for t in ins]
    if kind == "all_to_all" and bound.get("output_split_sizes"):
        return [_Shape((sum(bound["output_split_sizes"]), *t.shape[1:]), t) for t in ins]
    return list(ins)


def _resolve_group(torch, name):
    """A functional collective's group: a name (torch 2.8), or on 2.13 a name or the boxed group itself."""
    if isinstance(name, str):
        return torch.distributed.distributed_c10d._resolve_process_group(name)
    if isinstance(name, torch.ScriptObject):
        return torch._C._distributed_c10d.ProcessGroup.unbox(name)
    return name


def _reduce_op_name(torch, boxed) -> str | None:
    """The reduction of a ``c10d`` op where torch tells it: 2.13's boxed ``ReduceOp`` has ``op()``, 2.8's none."""
    if boxed is None or not hasattr(boxed, "_has_method") or not boxed._has_method("op"):
        return None
    return torch.distributed.ReduceOp.RedOpType(boxed.op()).name.lower()


def group_fields(torch, group) -> dict:
    """A process group as the ``group`` record: name, description, size, this rank in it, its global ranks, backend."""
    dist = torch.distributed
    try:
        ranks, backend = dist.get_process_group_ranks(group), str(dist.get_backend(group))
    except Exception:  # noqa: BLE001 - a group outside torch's map (destroyed, or made by hand)
        ranks, backend = None, None
    return dict(name=str(group.group_name), desc=getattr(group, "group_desc", None), size=group.size(),
                rank=group.rank(), ranks=ranks, backend=backend)


def describe_wrap(torch, module, composable) -> dict | None:
    """What a wrapping module is, read from torch's state; ``None`` while it is not set up yet (DDP in ``__init__``).

    ``composable``: torch's ``torch.distributed._composable_state`` module, where ``fully_shard`` registers its units
    (``None`` when no script imported it)."""
    kind = type(module).__name__
    if kind == "DistributedDataParallel":
        if not hasattr(module, "reducer"):
            return None
        data = module._get_ddp_logging_data()
        logged = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes", "")  # the rebuilt ones once DDP logs them
        sizes = [int(s) for s in str(logged).replace(" ", "").split(",") if s]
        return dict(wrapper=kind, module=type(module.module).__name__, group=str(module.process_group.group_name),
                    world_size=module.process_group.size(), bucket_cap_bytes=int(module.bucket_bytes_cap),
                    bucket_cap_mb=module.bucket_bytes_cap / 2**20, bucket_sizes_bytes=sizes,
                    find_unused_parameters=bool(module.find_unused_parameters),
                    gradient_as_bucket_view=bool(module.gradient_as_bucket_view),
                    static_graph=bool(module.static_graph), broadcast_buffers=bool(module.broadcast_buffers),
                    comm_hooks=[getattr(h, "__qualname__", repr(h)) for h, _ in getattr(module, "_comm_hooks", [])],
                    parameters=_param_count(module.module))
    if kind == "FullyShardedDataParallel":
        return dict(wrapper=kind, module=type(module.module).__name__, world_size=module.world_size,
                    sharding_strategy=str(getattr(module, "sharding_strategy", None)),
                    mixed_precision=repr(getattr(module, "mixed_precision", None)), parameters=_param_count(module))
    if kind == "DataParallel":
        return dict(wrapper=kind, module=type(module.module).__name__, device_ids=list(module.device_ids or []))
    state_ref = getattr(composable, "_module_state_mapping", {}).get(module)
    state = state_ref() if state_ref is not None else None
    return _describe_fully_shard(module, state) if state is not None else None


def _describe_fully_shard(module, state) -> dict:
    """An FSDP2 (``fully_shard``) module: its units' meshes, resharding, mixed precision and parameters."""
    groups = getattr(state, "_fsdp_param_groups", None)  # torch 2.13: a list; 2.8: one, or None without parameters
    groups = groups if groups is not None else [g for g in [getattr(state, "_fsdp_param_group", None)] if g]
    original = next((c.__name__ for c in type(module).__mro__[1:] if c.__name__ != "FSDPModule"), type(module).__name__)
    units = []
    for group in groups:
        post, mesh_info = group.post_forward_mesh_info, group.mesh_info
        reshard = False if post is None else (True if post.shard_mesh_size == mesh_info.shard_mesh_size
                                              else post.shard_mesh_size)
        units.append(dict(path=getattr(group, "_module_fqn", None), mesh=mesh_fields(mesh_info.mesh),
                          reshard_after_forward=reshard,
                          mp_policy={k: _plain(v) for k, v in vars(group.mp_policy).items()},
                          offload_policy=type(group.offload_policy).__name__,
                          parameters=[fp._param_fqn for fp in group.fsdp_params],
                          parameter_numel=sum(fp._orig_size.numel() for fp in group.fsdp_params)))
    wrapper = "fully_shard" if type(state).__name__ == "FSDPState" else type(state).__name__
    return dict(wrapper=wrapper, module=original, root=getattr(state, "_is_root", None), units=units,
                parameters=_param_count(module))


def describe_plan(torch, module, mesh, plan) -> dict:
    """A ``parallelize_module`` call: the module, the mesh and each sub-module's parallel style with its settings."""
    styles = plan.items() if isinstance(plan, dict) else [("", plan)]
    return dict(wrapper="parallelize_module", module=type(module).__name__,
                mesh=mesh_fields(mesh) if mesh is not None else None,
                plan={path: dict(style=type(style).__name__, **{k: repr(v) for k, v in vars(style).items()})
                      for path, style in styles}, parameters=_param_count(module))


_MESHES: dict[int, tuple] = {}  # id(mesh) -> (mesh, its fields): every DTensor of a step names one of a few meshes
_PLACEMENTS: dict = {}  # placements -> their names


def mesh_fields(mesh) -> dict:
    """A ``DeviceMesh`` as its shape, dimension names, device type and global ranks (worked out once per mesh)."""
    cached = _MESHES.get(id(mesh))
    if cached is None or cached[0] is not mesh:
        fields = {"shape": list(mesh.mesh.shape), "dim_names": list(mesh.mesh_dim_names or []),
                  "device_type": mesh.device_type, "ranks": mesh.mesh.flatten().tolist()}
        cached = _MESHES[id(mesh)] = (mesh, fields)
    return cached[1]


def placement_names(placements) -> list[str]:
    """A DTensor's placements as torch prints them (``["S(0)"]``, ``["R"]``)."""
    try:
        return _PLACEMENTS.setdefault(placements, [str(p) for p in placements])
    except TypeError:  # a placement that is not hashable
        return [str(p) for p in placements]


def summary(torch, t, full_numel: int) -> dict:
    """A tensor as numbers: shape, dtype, size and a SHA-1 digest of its bytes; then, when it has at most
    ``full_numel`` elements, the bytes themselves (base64, as they lie in memory: bit for bit, -0.0 and NaN payloads
    included, and much faster to write than decimal numbers), else its norm and sum (float64). A DTensor as this
    rank's local shard, with its placements."""
    out = {}
    with torch.no_grad():
        if type(t).__name__ == "DTensor":
            out.update(placements=placement_names(t.placements), mesh=mesh_fields(t.device_mesh),
                       global_shape=list(t.shape))
            t = local_tensor(t)
        host = t if t.device.type == "cpu" and t.is_contiguous() else t.detach().to("cpu").contiguous()
        size = nbytes(host)
        out.update(shape=list(host.shape), dtype=dtype_name(host), numel=host.numel(), bytes=size)
        raw = ctypes.string_at(host.data_ptr(), size)
        # To tell equal tensors, not to resist an attacker: SHA-1 ran at twice BLAKE2's speed here (1.1 vs 2.2 ms for
        # 590 KB, 2026-12-05), and the digest is most of what a large tensor costs.
        out["sha1"] = hashlib.sha1(raw).hexdigest()
        if host.numel() <= full_numel:
            out["data"] = base64.b64encode(raw).decode("ascii")  # the reader works its norm and sum out of these
        elif not host.is_complex():
            wide = host.to(torch.float64)  # one copy for both (two conversions took 1.6 times as long)
            out.update(norm=float(wide.norm()), sum=float(wide.sum()))
    return out


def local_tensor(t):
    """A DTensor's local shard (this rank's part; its ``_local_tensor``, without ``to_local``'s autograd function),
    else the tensor itself."""
    if type(t).__name__ != "DTensor":
        return t
    local = getattr(t, "_local_tensor", None)
    return local if local is not None else t.to_local()


def tensors_in(torch, value) -> list:
    """The tensors of an argument (a tensor, a list, a list of lists), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(torch, v)]
    return []


class CallSites:
    """Where the script called torch from: the calling thread's frames of the script's own code (``[path, line,
    function]``, outermost first, the innermost ``limit``), without torch's, the standard library's, installed
    packages' or this folder's (the workbook's runner) frames. Whether a code object is the script's is decided once.
    A collective DDP issues during ``backward()`` on CPU has the script's ``loss.backward()`` line; one issued on
    autograd's own thread (CUDA) has no frame of the script: ``[]``."""

    def __init__(self, torch, limit: int = 12) -> None:
        paths = sysconfig.get_paths()
        folders = {os.path.dirname(torch.__file__), paths["stdlib"], paths["purelib"], paths["platlib"],
                   os.path.dirname(os.path.abspath(__file__))}
        self.skip = tuple({os.path.join(f, "") for folder in folders for f in (folder, os.path.realpath(folder))})
        self.limit, self.own = limit, {}

    def stack(self, frame) -> list:
        """The script's frames from ``frame`` outwards, outermost first."""
        found = []
        while frame is not None and len(found) < self.limit:
            code = frame.f_code
            own = self.own.get(code)
            if own is None:
                name = code.co_filename
                own = self.own[code] = not (name.startswith("<") or name.startswith(self.skip)
                                            or os.path.realpath(name).startswith(self.skip))
            if own:
                found.append([code.co_filename, frame.f_lineno, code.co_name])
            frame = frame.f_back
        return found[::-1]


def dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def nbytes(t) -> int:
    return t.numel() * t.element_size()


def _param_count(module) -> dict:
    params = list(module.parameters())
    return {"tensors": len(params), "numel": sum(p.numel() for p in params), "bytes": sum(nbytes(p) for p in params)}


def _plain(value):
    """A setting as JSON holds it: a dtype as its name (``"bfloat16"``), numbers and flags as they are."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value).removeprefix("torch.")


def dynamo_counts(modules) -> dict | None:
    """What ``torch.compile`` did in this process, from dynamo's own counters (``torch._dynamo.utils.counters``, the
    ones ``torch._dynamo.explain`` and ``TORCH_LOGS`` read; torch 2.8 and 2.13 alike): ``graphs`` dynamo captured
    (``stats.unique_graphs``: each graph break and each recompilation adds one; counted before DDPOptimizer cuts a
    graph at DDP's buckets, so a model compiled whole under DDP is one), ``graph_breaks`` (every one dynamo met),
    ``frames`` it compiled (``frames.total``: a recompilation is one more), and the first line of each distinct break
    reason (at most 8). ``None`` when dynamo was never imported (torch 2.13 imports it with torch: zeros then).
    ``modules``: ``sys.modules`` (dynamo is read only when it was imported, never imported here)."""
    utils = modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    counters = utils.counters
    reasons = [str(reason).strip().splitlines()[0][:160] for reason in counters["graph_break"]]
    return {"graphs": int(counters["stats"]["unique_graphs"]), "frames": int(counters["frames"]["total"]),
            "graph_breaks": int(sum(counters["graph_break"].values())), "break_reasons": reasons[:8]}
