"""One transformer layer's activations, measured the planner's way and held against Korthikanti et al.'s count.

``layer_activations(s=2048, b=1, h=12288, a=96)`` builds one GPT layer in ``FakeTensorMode`` (no memory is allocated),
runs its forward under torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``, the tool of
``memory_plan`` and ``memory_plan_tp``) and reports the bytes the forward leaves for backward; with ``layout="tp"`` or
``"tp+sp"`` the layer is first split by ``parallelize_module`` over a fake process group of ``t`` ranks (as
``memory_plan_tp`` does) and rank 0 is measured. A second forward is walked through autograd's graph (every node's
``_saved_*`` tensors) to name each saved tensor: which module and op made it, which nodes saved it, and the paper's
term for it (``activation_breakdown``). Two layers:

* ``megatron_layer`` (``tutorial_lib.planning.transformer_layers``): Korthikanti et al.'s layer (arXiv:2205.05198, §4.1) as Megatron-LM writes it: 16-bit
  activations, dropout (a 1-byte mask, as CUDA's ``native_dropout`` saves), attention scores materialised, a 4h GeLU
  MLP, LayerNorm. Measured on torch 2.8 and 2.13: every one of the paper's terms exactly, plus LayerNorm's mean and
  rstd (4 sb values per layer), which the paper does not count; under tensor parallelism the same; under sequence
  parallelism PyTorch's ``ColwiseParallel`` saves the all-gathered input of QKV and fc1 where the paper counts their
  sequence shards (Megatron-LM all-gathers them again in backward): 4 sbh (1 - 1/t) more.
* ``workbook_layer``: ``train_lm.py``'s ``Block`` (fused ``scaled_dot_product_attention``, no dropout):
  32 sbh + 4asb (SDPA's fp32 logsumexp) + LayerNorm's statistics, against the paper's 34 sbh + 5as^2b.
  ``activation_comparison`` is notebook 13's one-cell table of the three.

Sources: Korthikanti et al. (2022), §4 and Table 2 (see ``tutorial_lib.planning.published``); torch's ``MemTracker``
docstring; Megatron-LM's ``ParallelAttention`` (the fused QKV layout with whole heads per rank, ``baddbmm`` scores).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError, MetricsError
from .published import KORTHIKANTI_TABLE_2, LAYOUTS, korthikanti_bytes, korthikanti_terms, zero_rows
from .transformer_layers import megatron_layer, tp_plan, workbook_layer


@dataclass(frozen=True)
class LayerActivations:
    """What one layer's forward leaves for its backward, on one rank.

    Attributes:
        layer: ``"megatron"`` or ``"workbook"``; layout: ``"none"``, ``"tp"`` or ``"tp+sp"``; t: ranks of the
            tensor-parallel mesh (1 without).
        s, b, h, a: sequence length, micro-batch, width, heads.
        activation_bytes: the planner's number: ``MemTracker``'s activations after the forward (the input made inside
            the tracker, so it counts) less the output's bytes (the next layer's input, counted there): the tensors
            a layer in a stack keeps for backward (bytes, this rank).
        tracker_bytes: ``MemTracker``'s activations after the forward, output included (bytes).
        rows: one dict per tensor storage autograd saved (``activation_breakdown``'s rows), which add up to
            ``activation_bytes``.
    """

    layer: str
    layout: str
    t: int
    s: int
    b: int
    h: int
    a: int
    activation_bytes: int
    tracker_bytes: int
    rows: tuple[dict, ...]

    @property
    def sbh(self) -> int:
        """s x b x h (elements): Korthikanti et al.'s unit."""
        return self.s * self.b * self.h


def layer_activations(*, s: int, b: int, h: int, a: int, layer: str = "megatron", dropout: str | None = "mask",
                      t: int = 1, layout: str = "none", dtype: str = "bf16") -> LayerActivations:
    """Measure one layer's activations with torch's ``MemTracker`` in ``FakeTensorMode`` (no memory, no GPU).

    The layer runs one forward on an input made inside the tracker; the tracker's activations at the end, less the
    output, are the bytes a layer in a stack keeps for its backward (its own input included). A second, identical
    forward is walked through autograd's graph (every ``_saved_*`` tensor of every node) to list those tensors one by
    one (``rows``); their sum is checked equal to the tracker's figure.

    Args:
        s: sequence length; b: micro-batch; h: width; a: attention heads (counts).
        layer: ``"megatron"`` (``megatron_layer``: Korthikanti et al.'s layer) or ``"workbook"`` (``workbook_layer``:
            ``train_lm.py``'s block; ``layout`` must be ``"none"``).
        dropout: the Megatron layer's dropout (``megatron_layer``'s ``dropout``: ``"mask"``, ``"module"``, None).
        t: tensor-parallel ranks (a fake process group of ``t`` ranks; rank 0 is measured, every rank holds the same).
        layout: ``"none"``, ``"tp"`` (``tp_plan``: Megatron's column/row split) or ``"tp+sp"`` (with sequence
            parallelism: the norms and dropouts on sequence shards).
        dtype: ``"bf16"`` (the paper's 16-bit activations), ``"fp16"`` or ``"fp32"``.

    Returns:
        ``LayerActivations``.

    Raises:
        ConfigError: an unknown layer, layout or dtype; a parallel layout for the workbook layer; t that does not
            divide a or s; a process group already exists in this process.
        MetricsError: the saved tensors and the tracker disagree (a torch whose ops save what this module does not
            know).
    """
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if dtype not in dtypes:
        raise ConfigError(f"dtype must be one of {sorted(dtypes)}, got {dtype!r}")
    if layer not in ("megatron", "workbook"):
        raise ConfigError(f"layer must be 'megatron' or 'workbook', got {layer!r}")
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "none" and t != 1 or layout != "none" and (t < 1 or a % t or s % t):
        raise ConfigError(f"t = {t} for layout {layout!r}: 1 without parallelism, else a divisor of a = {a} and s = {s}")
    if layer == "workbook" and layout != "none":
        raise ConfigError("the workbook's layer is measured without tensor parallelism (layout 'none')")
    if dist.is_available() and dist.is_initialized():
        raise ConfigError("this process already has a process group; layer_activations makes a fake one of its own")
    dt = dtypes[dtype]

    def build():
        if layer == "workbook":
            return workbook_layer(h=h, a=a, s=s, dtype=dt)
        return megatron_layer(h=h, a=a, s=s, dropout=dropout, dtype=dt)

    with _world(t if layout != "none" else 1) as mesh:
        with FakeTensorMode():
            model = build()
            if layout != "none":
                from torch.distributed.tensor.parallel import parallelize_module
                parallelize_module(model, mesh, tp_plan(layout))
            # Megatron's layout is [s, b, h] (a sequence shard under SP), the workbook's [b, s, h]
            local = (s // t if layout == "tp+sp" else s, b, h) if layer == "megatron" else (b, s, h)
            from .memory_plan_tp import propagation_in_its_own_fake_mode
            tracker = MemTracker()
            tracker.track_external(model)
            with tracker, propagation_in_its_own_fake_mode():
                x = torch.empty(local, dtype=dt, requires_grad=True)
                y = model(x)
                snapshot = next(iter(tracker.get_tracker_snapshot().values()))
            tracker_bytes = sum(v for k, v in snapshot.items() if _is_act(k))
            out_bytes = sum(st.nbytes() for st in _storages(y))
            del y, x
            rows = _saved_rows(model, local, dt, layer)
    activation_bytes = tracker_bytes - out_bytes
    listed = sum(r["bytes"] for r in rows)
    if listed != activation_bytes:
        raise MetricsError(f"the tensors autograd saved add up to {listed} bytes, the tracker counted {activation_bytes}: "
                          "a torch whose ops save other tensors than this module knows (see activation_breakdown)")
    return LayerActivations(layer=layer, layout=layout, t=t, s=s, b=b, h=h, a=a, activation_bytes=activation_bytes,
                            tracker_bytes=tracker_bytes, rows=tuple(rows))


@contextlib.contextmanager
def _world(t: int):
    """A fake process group of ``t`` ranks and a 1-D mesh over it (None for one rank without parallelism)."""
    if t == 1:
        yield None
        return
    from torch.distributed.device_mesh import init_device_mesh
    from .memory_plan import fake_world
    with fake_world(t):
        yield init_device_mesh("cpu", (t,), mesh_dim_names=("tp",))


def _is_act(key) -> bool:
    name = getattr(key, "name", str(key))
    return name.rsplit(".", 1)[-1] in ("ACT", "Activation")


def _storages(t) -> list:
    """The storages behind a tensor (a DTensor's or a wrapper's inner tensors)."""
    import torch
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        inner = [getattr(t, name) for name in attrs]
        return [st for x in inner if isinstance(x, torch.Tensor) for st in _storages(x)]
    return [t.untyped_storage()]


def _saved_rows(model, local_shape, dt, layer: str) -> list[dict]:
    """One forward under a recorder of which module and op made each storage, then autograd's saved tensors, named."""
    made, outputs, y, keep = _record_makers(model, local_shape, dt)
    params = {st._cdata for p in [*model.parameters(), *model.buffers()] for st in _storages(p)}
    out_storages = {st._cdata for st in _storages(y)}
    rows = []
    for key, row in _walk_saved(y, params).items():
        if key in out_storages:
            continue
        module, op, index = made.get(key, ("?", "?", 0))
        if op == "?" and row["bytes"] <= 8:  # a Python number autograd wrapped as a 0-d tensor: no allocation
            continue
        term = (_megatron_term if layer == "megatron" else _workbook_term)(module, op, index, outputs.get(key))
        rows.append({"term": term, "made by": f"{module or 'layer'}: {op}" + (f"[{index}]" if index else ""),
                     "saved by": ", ".join(sorted(row["saved by"])), "shape": row["shape"], "dtype": row["dtype"],
                     "bytes": row["bytes"]})
    del keep
    return rows


def _record_makers(model, local_shape, dt):
    """Run ``model`` once on a new input, recording for every storage the (module, op, output index) that made it and,
    for a module's output, the module: (made, outputs, the output, the storages kept alive while the ids are used)."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    made: dict[int, tuple[str, str, int]] = {}
    outputs: dict[int, str] = {}
    keep = []  # the storages, so that no id is reused while the tables are built
    stack = [""]

    def note(t, origin):
        for st in _storages(t):
            if st._cdata not in made:
                made[st._cdata] = origin
                keep.append(st)

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(tp is DTensor for tp in types):
                return NotImplemented  # let DTensor run its local ops, which come back here
            out = func(*args, **(kwargs or {}))
            for i, t in enumerate(tree_flatten(out)[0]):
                if isinstance(t, torch.Tensor):
                    note(t, (stack[-1], func.__name__.split(".")[0], i))
            return out

    names = {m: n for n, m in model.named_modules() if m is not model}

    def post(mod, args, out):
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                for st in _storages(t):
                    outputs.setdefault(st._cdata, names[mod])
        stack.pop()

    handles = [h for m in names for h in (
        m.register_forward_pre_hook(lambda mod, args: stack.append(names[mod]), prepend=True),  # before TP's hooks
        m.register_forward_hook(post))]
    x = torch.empty(local_shape, dtype=dt, requires_grad=True)
    note(x, ("", "input", 0))
    try:
        with Recorder():
            y = model(x)
    finally:
        for handle in handles:
            handle.remove()
    return made, outputs, y, keep


def _walk_saved(y, params: set) -> dict[int, dict]:
    """Every tensor storage autograd's graph behind ``y`` saved (``_saved_*`` of every node), parameters and buffers
    left out: ``{storage id: {"bytes", "saved by", "shape", "dtype"}}``."""
    import torch
    saved: dict[int, dict] = {}
    seen, todo = set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in sorted(a for a in dir(node) if a.startswith("_saved_")):
            try:
                value = getattr(node, attr)
            except Exception:  # a saved value that cannot be unpacked (freed): nothing to count
                continue
            for t in (value if isinstance(value, (tuple, list)) else (value,)):
                if not isinstance(t, torch.Tensor):
                    continue
                for st in _storages(t):
                    if st._cdata in params:
                        continue
                    row = saved.setdefault(st._cdata, {"bytes": st.nbytes(), "saved by": set(),
                                                       "shape": tuple(t.shape),
                                                       "dtype": str(t.dtype).replace("torch.", "")})
                    row["saved by"].add(f"{node.name()}.{attr[len('_saved_'):]}")
        todo.extend(next_node for next_node, _ in node.next_functions)
    return saved


def _megatron_term(module: str, op: str, index: int, output_of: str | None) -> str:
    """The paper's name for a tensor ``megatron_layer`` saved (or what it is where the paper has no such term)."""
    if op == "input":
        return "LayerNorm 1 input"
    if module in ("ln1", "ln2"):
        if index:
            return "LayerNorm statistics (mean, rstd): not in the paper's count"
        return "QKV linear input (LayerNorm 1 output)" if module == "ln1" else "fc1 input (LayerNorm 2 output)"
    if module in ("qkv", "fc1"):
        if output_of == module:
            return "Q, K and V (the QKV linear's output)" if module == "qkv" else "GeLU input (fc1 output)"
        return ("QKV linear input, all-gathered (Megatron keeps the shard)" if module == "qkv"
                else "fc1 input, all-gathered (Megatron keeps the shard)")
    drops = {"attn_drop": "attention dropout", "drop1": "attention residual dropout", "drop2": "MLP residual dropout"}
    if module in drops:
        if output_of == module:
            return drops[module] + " output" + (" (for attention over V)" if module == "attn_drop" else "")
        return drops[module] + " mask"
    if op.startswith("_softmax") or op == "softmax":
        return "softmax output"
    if op == "gelu":
        return "fc2 input (GeLU output)"
    if op == "add":
        return "LayerNorm 2 input"
    if module == "" and op in ("clone", "_unsafe_view", "view", "copy_", "_reshape_copy", "reshape", "contiguous"):
        return "output linear input"
    return f"{module or 'layer'}: {op} (not in the paper's count)"


def _workbook_term(module: str, op: str, index: int, output_of: str | None) -> str:
    """What a tensor saved by ``train_lm.py``'s block is, in the paper's words where one applies."""
    if op == "input":
        return "LayerNorm 1 input"
    if module in ("norm1", "norm2"):
        if index:
            return "LayerNorm statistics (mean, rstd): not in the paper's count"
        return "QKV linear input (LayerNorm 1 output)" if module == "norm1" else "fc1 input (LayerNorm 2 output)"
    if module == "attn.qkv":
        return "Q, K and V (the QKV linear's output)"
    if module == "mlp.fc":
        return "GeLU input (fc1 output)"
    if module == "attn" and "attention" in op:
        return ("output linear input (SDPA's output, saved by SDPA and, as a view, by the output linear)" if index == 0
                else "SDPA logsumexp, fp32 (in place of the paper's 5as^2b)" if index == 1
                else f"SDPA {op}[{index}]")
    if module == "attn" and op in ("clone", "_unsafe_view", "view", "_reshape_copy", "reshape", "contiguous"):
        return "output linear input"
    if module == "mlp" and op == "gelu":
        return "fc2 input (GeLU output)"
    if op == "add":
        return "LayerNorm 2 input"
    return f"{module or 'layer'}: {op}"


def activation_breakdown(measured: LayerActivations):
    """The tensors a layer saved, grouped by the paper's term, beside the paper's bytes (a DataFrame).

    Args:
        measured: a ``layer_activations`` result.

    Returns:
        A DataFrame indexed by term: ``measured (bytes)`` (this rank), ``paper (bytes)`` (``korthikanti_terms`` for
        the same s, b, h, a, t and layout; Q, K and V, one tensor in PyTorch, are compared with the paper's "Q and K"
        + "V"), ``difference (bytes)``, ``measured / sbh`` and ``made by`` / ``saved by`` (ops and autograd nodes),
        and a last row ``total``. Terms on one side only are what one counts and the other does not.
    """
    import pandas as pd

    m = measured
    paper = korthikanti_terms(s=m.s, b=m.b, h=m.h, a=m.a, t=m.t, layout=m.layout)
    paper["Q, K and V (the QKV linear's output)"] = paper.pop("Q and K (for QK^T)") + paper.pop(
        "V (for attention over V)")
    if m.layout == "tp+sp":  # Megatron keeps the sequence shard of these inputs; PyTorch's linear saves the gathered one
        for term in ("QKV linear input (LayerNorm 1 output)", "fc1 input (LayerNorm 2 output)"):
            paper[term.split(" (")[0] + ", all-gathered (Megatron keeps the shard)"] = 0.0
    grouped: dict[str, dict] = {}
    for row in m.rows:
        g = grouped.setdefault(row["term"], {"measured (bytes)": 0, "made by": set(), "saved by": set()})
        g["measured (bytes)"] += row["bytes"]
        g["made by"].add(row["made by"])
        g["saved by"].update(row["saved by"].split(", "))
    terms = list(paper) + [k for k in grouped if k not in paper]
    rows = []
    for term in terms:
        g = grouped.get(term, {"measured (bytes)": 0, "made by": set(), "saved by": set()})
        rows.append({"term": term, "measured (bytes)": g["measured (bytes)"], "paper (bytes)": paper.get(term, 0.0),
                     "made by": ", ".join(sorted(g["made by"])), "saved by": ", ".join(sorted(g["saved by"]))})
    table = pd.DataFrame(rows).set_index("term")
    table.loc["total"] = [table["measured (bytes)"].sum(), table["paper (bytes)"].sum(), "", ""]
    table["difference (bytes)"] = table["measured (bytes)"] - table["paper (bytes)"]
    table["measured / sbh"] = table["measured (bytes)"] / m.sbh
    return table[["measured (bytes)", "paper (bytes)", "difference (bytes)", "measured / sbh", "made by", "saved by"]]


def activation_comparison(*, s: int = 1024, b: int = 1, h: int = 1024, a: int = 16):
    """Korthikanti et al.'s count, their kind of layer measured, and the workbook's layer measured (a DataFrame).

    Args:
        s: sequence length; b: micro-batch; h: width; a: heads (defaults: a 1024-token sequence through a layer of
            width 1024 with 16 heads).

    Returns:
        A DataFrame with rows ``paper: sbh(34 + 5as/h)``, ``Megatron-style layer (dropout, scores materialised)``,
        ``the same without dropout``, ``workbook layer (train_lm.py: fused SDPA, no dropout)``; columns
        ``bytes per layer`` (bf16 activations), ``/ sbh`` and ``vs paper`` (ratio). Why the workbook's layer saves
        less: fused attention keeps no s x s scores (the paper's 5as^2b becomes SDPA's fp32 logsumexp, 4 bytes per
        head and token: 4asb), and without dropout there are no masks (2 sbh) and no dropped-out probabilities; its
        attention output is one tensor that SDPA and the output linear both save. Measured on torch 2.8 and 2.13:
        32 sbh + 4asb + LayerNorm's statistics, against the paper's 34 sbh + 5as^2b.
    """
    import pandas as pd

    sbh = s * b * h
    paper = korthikanti_bytes(s=s, b=b, h=h, a=a)
    rows = [("paper: sbh(34 + 5as/h)", paper)]
    for label, kwargs in (("Megatron-style layer (dropout, scores materialised)", {"layer": "megatron"}),
                          ("the same without dropout", {"layer": "megatron", "dropout": None}),
                          ("workbook layer (train_lm.py: fused SDPA, no dropout)", {"layer": "workbook"})):
        rows.append((label, layer_activations(s=s, b=b, h=h, a=a, **kwargs).activation_bytes))
    table = pd.DataFrame([{"layer": k, "bytes per layer": int(v), "/ sbh": v / sbh, "vs paper": v / paper}
                          for k, v in rows]).set_index("layer")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tutorial_lib.planning.layer_memory``: print ZeRO's rows (``published.zero_rows``: traced, about
    half a minute) and the Korthikanti breakdowns (GPT-3 175B's
    layer: s 2048, b 1, h 12288, a 96; no parallelism, TP and TP + SP at t = 2), then the workbook comparison."""
    import pandas as pd
    pd.set_option("display.width", 200)
    pd.set_option("display.max_colwidth", 60)
    print(zero_rows().drop(columns=["setup"]).to_string())
    for t, layout in ((1, "none"), (2, "tp"), (2, "tp+sp")):
        m = layer_activations(s=2048, b=1, h=12288, a=96, t=t, layout=layout)
        print(f"\n{KORTHIKANTI_TABLE_2[layout]}, t = {t}: measured {m.activation_bytes} bytes, paper "
              f"{korthikanti_bytes(s=2048, b=1, h=12288, a=96, t=t, layout=layout):.0f}")
        print(activation_breakdown(m).drop(columns=["saved by"]).to_string())
    print()
    print(activation_comparison().to_string())
    return 0


__all__ = ["megatron_layer", "workbook_layer", "tp_plan", "LayerActivations", "layer_activations",
           "activation_breakdown", "activation_comparison"]


if __name__ == "__main__":
    raise SystemExit(main())
