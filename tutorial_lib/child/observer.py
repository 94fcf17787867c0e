"""Observe what a rank really did, from torch itself, and write it to the rank's record file (``observe=True``).

    TUTORIAL_LIB_OBSERVE=<run_dir>/observed python rank_runner.py SCRIPT ARGS   # what the launcher sets up

The rank runner starts this before the script when ``$TUTORIAL_LIB_OBSERVE`` names a folder (``LaunchSpec(observe=
True)``; off, the runner never loads this file). It opens ``<folder>/rank<R>.jsonl`` (``record_name``) and, once the
script has imported torch (at once when the warm-start helper preloaded it), hooks into torch:

* **collectives**: a Python kernel on torch's dispatcher for every ``c10d::*`` and ``_c10d_functional::*`` op, at the
  ``BackendSelect`` key, which records the op and hands it on unchanged (``OpOverload.redispatch``); docs:
  https://pytorch.org/docs/stable/library.html (``torch.library.Library.impl``, ``with_keyset=True``). Every
  collective reaches those ops: ``dist.all_reduce``, DDP's C++ reducer (one ``allreduce_`` per bucket), FSDP2
  (``_allgather_base_``, ``_reduce_scatter_base_``), DTensor and tensor parallelism (``_c10d_functional``), barriers,
  object collectives, point-to-point. ``BackendSelect``, not ``Autograd``: under ``torch.inference_mode()`` tensors
  skip the autograd keys, and an autograd-key kernel missed those all-reduces (torch 2.8 and 2.13); ``BackendSelect``
  is in every dispatch. A collective nested in an observed one (2.8's functional ops call ``c10d`` ops) is not
  counted twice. Each collective, backward and optimizer step carries where the script called it from (``stack``:
  the script's own frames, ``observer_torch.CallSites``), what tells a rank that moved on from one still behind.
* **wraps**: DDP, FSDP1 and ``DataParallel`` are seen when they register the module they wrap (torch's global
  ``register_module_module_registration_hook``); FSDP2's ``fully_shard`` (and ``replicate``) units from torch's own
  registry of composable states; ``parallelize_module`` (tensor parallel) by wrapping that one function. Each is
  described from torch's state (DDP's ``_get_ddp_logging_data()``: bucket cap and sizes, flags, comm hook) and
  written again whenever the description changes (a comm hook registered later, buckets rebuilt).
* **optimizer steps** (``torch.optim.optimizer.register_optimizer_step_pre_hook``/``post_hook``, global): each
  parameter's gradient before the step and value after it, the optimizer state's bytes. A tensor of at most
  ``$TUTORIAL_LIB_OBSERVE_FULL_NUMEL`` elements (default 4096) is written whole (its bytes, base64: bit for bit),
  a larger one as its norm and sum; every tensor gets a SHA-1 digest of its bytes. A DTensor is written as this
  rank's local shard, with its placements, mesh and global shape: gathering it would be a collective the script never
  made.
* **losses** (``torch.autograd.backward``, which ``Tensor.backward`` calls): what each ``backward()`` ran on, its value
  when it is one number; every collective carries the backward and the optimizer step it happened in.
* ``init_process_group`` (backend, world size, rank), ``torch.manual_seed`` calls, ``torch.initial_seed()``, and
  at the end the parameters and gradients of the outermost wrapped modules (a script that never steps an optimizer)
  and, when the script imported dynamo, what ``torch.compile`` did (``compiled``: graphs, graph breaks, frames, from
  dynamo's own counters).

Why this mechanism (measured 2026-12-05 on this 2-core machine, 2 gloo ranks, torch 2.8.0 and 2.13.0; one script
with plain ``all_reduce`` (one under ``inference_mode``), DDP with ``bucket_cap_mb`` and ``no_sync``, FSDP2, DTensor
``distribute_tensor``/``redistribute``, ``parallelize_module``, functional collectives, a barrier):

* this dispatcher kernel recorded 23 collectives per rank, and torch's flight recorder (``TORCH_FR_BUFFER_SIZE=2000``,
  ``_dump_fr_trace_json``) the same 23, in the same order with the same bytes, on both versions. The flight recorder
  is cheaper, but it records what the *backend* ran: gloo runs FSDP2's reduce-scatter as an all-reduce of the whole
  input, so it cannot tell a reduce-scatter from an all-reduce, and its ring buffer overwrites old entries;
* an ``Autograd``-key kernel (the first try) missed the all-reduce under ``inference_mode`` on both versions: such
  tensors skip the autograd keys, while ``BackendSelect`` is in every dispatch. On 2.13 the functional collectives
  (DTensor's ``redistribute``) no longer go through ``c10d`` ops at all, hence the ``_c10d_functional`` kernels;
* torch's profiler (``ProfilerActivity.CPU``) sees the ``c10d`` ops, but records every op of the run (memory that
  grows with it), prints ``USDT: ... profiler_start/stop`` on stderr on 2.13 (FACTS.md, 2026-12-04), and cannot share
  the run with a script's own profiler (notebooks 04, 08, 09 profile): a profiler started inside another ends the
  outer session, which then holds 0 events on 2.13 and raises ``Can't disable Kineto profiler`` on 2.8;
* a ``TorchDispatchMode`` runs Python for every aten op; wrapping ``torch.distributed``'s functions misses DDP's C++
  reducer; wrapping ``fully_shard`` by name misses a name imported before the wrap (the warm-start helper
  preloads torch), where torch's own hooks and registries see every instance.

Cost: off, nothing (the runner reads one environment variable). On, one Python call and one ``os.write`` per
collective, backward and seed; 3 ms to hook into torch; and per optimizer step a pass over the parameters and their
gradients, about 10 ns per element on this machine (SHA-1, norm, sum; measured 2026-12-05: ``ddp_train.py``'s 85 K
parameters 1.8-2.8 ms per step, ``fsdp_train.py``'s 2.2 M on one rank 33-59 ms): small next to a lesson's step, a
few seconds per step for a model of 100 M parameters (``docs/benchmarks.md``). On CUDA each recorded tensor is a
device-to-host copy. The hooks never raise into the script: an error inside the observer is
written as an ``observer_error`` record and the script goes on.

The record: one JSON object per line, written with one ``os.write`` on a file opened ``O_APPEND`` before the script
ran, so a rank that crashes or is killed leaves every line written so far (the reader ignores a cut last line); the
file is created exclusively (``O_EXCL``, never overwritten) and read-only (mode 0444: a process that does not run
as root cannot open it for writing), each line numbered (``seq``); the runner writes ``end`` after the script. An
in-process observer cannot prevent what the script itself may do: a script can undo the hooks, write to this
process's descriptor, run as root and rewrite any file, or compute and print what it likes; it can also make the
collectives a check expects while computing something else. It makes cheating deliberate work, not a print.
Standard library only at import (torch is imported by the script; this file hooks in after); it imports nothing of
``tutorial_lib``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import json
import os
import sys
import threading
import time
import weakref

SCHEMA = 1  # the records' version; the reader (tutorial_lib.runs.observed) checks it
FULL_NUMEL_ENV = "TUTORIAL_LIB_OBSERVE_FULL_NUMEL"
DEFAULT_FULL_NUMEL = 4096


def load_sibling(name: str):
    """The program ``<name>.py`` of this folder as a module named ``_tutorial_lib_child_<name>``, loaded once per
    process: by its path, since this program runs where the package must not be imported, and under a private name,
    so it never shadows a learner's own module of that name. ``rank_runner.py`` and ``warm_start.py`` have the same
    function (a test)."""
    module_name = f"_tutorial_lib_child_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            module_name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


records = load_sibling("observer_torch")  # how torch's objects become record fields


def record_name(rank: int, restart: int = 0) -> str:
    """The record file of global rank ``rank`` in attempt ``restart`` (torchrun's restart count); the reader's
    ``tutorial_lib.runs.rundir.observed_name`` spells the same (a test holds them equal)."""
    return f"rank{rank}.jsonl" if restart == 0 else f"rank{rank}.restart{restart}.jsonl"


class Recorder:
    """The rank's record file: one JSON line per ``write``, numbered, appended with one ``os.write``."""

    def __init__(self, path: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        self.fd = os.open(path, flags, 0o444)
        self.path, self.seq, self.pid = path, 0, os.getpid()
        self._lock = threading.Lock()

    def write(self, record: str, **fields) -> None:
        if os.getpid() != self.pid:  # a process forked from the rank (a DataLoader worker) records nothing
            return
        with self._lock:
            self.seq += 1
            data = (json.dumps({"seq": self.seq, "record": record, **fields}, default=repr) + "\n").encode()
            while data:
                data = data[os.write(self.fd, data):]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once the module ``name`` has executed (the rank runner's ``_OnC10dImport``)."""

    def __init__(self, name: str, callback) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                self.callback(module)

            spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, callback) -> None:
    """``callback(module)`` now if ``name`` is imported, else right after the script imports it."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


class Observer:
    """One rank's observer: its record and what the hooks count (see the module docstring)."""

    def __init__(self, recorder: Recorder, full_numel: int) -> None:
        self.recorder, self.full_numel = recorder, full_numel
        self.steps = 0  # optimizer steps finished on this rank
        self.backwards = 0  # backward() calls started
        self.in_backward = 0  # the backward() running now (any thread: on CUDA, autograd's thread issues DDP's)
        self.collectives = 0
        self.groups: dict[str, int] = {}  # group name -> collectives issued on it
        self.wraps: dict[int, tuple] = {}  # id(module) -> (weakref, wrap id, last description written)
        self.optimizers: dict[int, tuple] = {}  # id(optimizer) -> (weakref, optimizer id)
        self.pending: dict[int, list] = {}  # id(optimizer) -> its gradients, read before its step
        self.errors: set[str] = set()
        self.local = threading.local()  # .depth: a collective nested in an observed one is not counted again
        self.torch = self.sites = None  # sites: where the script called from (records.CallSites), once torch is in

    def write(self, record: str, **fields) -> None:
        self.recorder.write(record, **fields)

    def error(self, where: str, exc: BaseException) -> None:
        """Write what went wrong inside the observer, once per place; the script goes on."""
        if where not in self.errors:
            self.errors.add(where)
            try:
                self.write("observer_error", where=where, error=f"{type(exc).__name__}: {exc}"[:500])
            except Exception:  # noqa: BLE001 - nothing may reach the script
                pass

    def guarded(self, where: str, fn, *args) -> None:
        """``fn(*args)``; an exception is written as an ``observer_error`` record, never raised into the script."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001
            self.error(where, e)

    def on_collective(self, namespace: str, name: str, bound: dict) -> None:
        found = records.collective_fields(self.torch, namespace, name, bound)
        if found is None:
            return
        group, fields = found
        group_name = self.group_name(group)
        self.collectives += 1
        self.groups[group_name] += 1
        self.write("collective", group=group_name, group_seq=self.groups[group_name], step=self.steps + 1,
                   backward=self.in_backward or None, thread=threading.current_thread().name,
                   stack=self.sites.stack(sys._getframe(1)), **fields)

    def group_name(self, group) -> str:
        """The group's name; its ``group`` record is written the first time it is seen."""
        name = str(getattr(group, "group_name", "?"))
        if name not in self.groups:
            self.groups[name] = 0
            if group is not None:
                self.write("group", **records.group_fields(self.torch, group))
        return name

    def on_init(self, args, kwargs) -> None:
        dist = self.torch.distributed
        self.write("init_process_group", backend=dist.get_backend(),
                   requested_backend=kwargs.get("backend", args[0] if args else None),
                   world_size=dist.get_world_size(), rank=dist.get_rank(), group=self.group_name(dist.group.WORLD),
                   initial_seed=self.torch.initial_seed())

    def on_seed(self, seed) -> None:
        self.write("seed", seed=int(seed), function="torch.manual_seed", step=self.steps + 1)

    def on_backward(self, tensors) -> None:
        self.scan_wraps()
        self.backwards += 1
        tensors = [tensors] if isinstance(tensors, self.torch.Tensor) else list(tensors or ())
        first = tensors[0] if tensors else None
        self.write("backward", index=self.backwards, step=self.steps + 1, tensors=len(tensors),
                   loss=float(first.detach()) if first is not None and first.numel() == 1 else None,
                   shape=list(first.shape) if first is not None else None,
                   dtype=records.dtype_name(first) if first is not None else None,
                   stack=self.sites.stack(sys._getframe(1)))

    def before_step(self, optimizer) -> None:
        self.scan_wraps()
        self.pending[id(optimizer)] = [records.summary(self.torch, p.grad, self.full_numel)
                                       if p.grad is not None else None for _, p in _params(optimizer)]

    def after_step(self, optimizer) -> None:
        self.steps += 1
        grads, names = self.pending.pop(id(optimizer), None) or [], self.parameter_names()
        params = [{"index": i, "param_group": group, "name": names.get(id(p)),
                   "grad": grads[i] if i < len(grads) else None,
                   "value": records.summary(self.torch, p, self.full_numel)}
                  for i, (group, p) in enumerate(_params(optimizer))]
        state_bytes = sum(records.nbytes(records.local_tensor(t)) for state in optimizer.state.values()
                          for t in state.values() if isinstance(t, self.torch.Tensor))
        entry = self.optimizers.get(id(optimizer))
        if entry is None or entry[0]() is not optimizer:
            entry = self.optimizers[id(optimizer)] = (weakref.ref(optimizer), len(self.optimizers) + 1)
        self.write("optimizer_step", step=self.steps, optimizer=type(optimizer).__name__, optimizer_id=entry[1],
                   lr=[g.get("lr") for g in optimizer.param_groups], state_bytes=state_bytes, params=params,
                   stack=self.sites.stack(sys._getframe(1)))

    def outermost(self) -> list[tuple[int, object]]:
        """``[(wrap id, module)]`` of the wrapped modules no other wrapped module holds (FSDP2's root, not its units),
        each as the module it wraps (DDP's ``module``), whose names are the script's."""
        alive = [(wrap_id, m) for m, wrap_id in ((ref(), wrap_id) for ref, wrap_id, _ in list(self.wraps.values()))
                 if m is not None]
        inner = {id(sub) for _, m in alive for sub in list(m.modules())[1:]}
        return [(wrap_id, getattr(m, "module", m)) for wrap_id, m in alive if id(m) not in inner]

    def parameter_names(self) -> dict[int, str]:
        """``{id(parameter): name}``, as the outermost wrapped modules name their parameters."""
        return {id(p): name for _, module in self.outermost() for name, p in module.named_parameters()}

    def track(self, module) -> int:
        """Remember a wrapping module (described at the next backward, step or the end: set up by then); its id."""
        entry = self.wraps.get(id(module))
        if entry is None or entry[0]() is not module:
            entry = self.wraps[id(module)] = (weakref.ref(module), len(self.wraps) + 1, None)
        return entry[1]

    def scan_wraps(self) -> None:
        """Write each wrapped module's description when it is new or changed (FSDP2's units from torch's registry)."""
        composable = sys.modules.get("torch.distributed._composable_state")
        for module in list(getattr(composable, "_module_state_mapping", {}).keys()):
            self.track(module)
        for key, (ref, wrap_id, last) in list(self.wraps.items()):
            module = ref()
            if module is None:
                continue
            try:
                desc = records.describe_wrap(self.torch, module, composable)
            except Exception as e:  # noqa: BLE001 - a torch whose private state differs
                self.error(f"describe {type(module).__name__}", e)
                continue
            if desc is not None and desc != last:
                self.wraps[key] = (ref, wrap_id, desc)
                self.write("wrap", id=wrap_id, step=self.steps + 1, **desc)

    def on_parallelize(self, module, bound) -> None:
        args = bound.arguments
        desc = records.describe_plan(self.torch, module, args.get("device_mesh"), args.get("parallelize_plan"))
        wrap_id = self.track(module)
        self.wraps[id(module)] = (self.wraps[id(module)][0], wrap_id, desc)
        self.write("wrap", id=wrap_id, step=self.steps + 1, **desc)

    def finish(self, code: int) -> None:
        """The last records: the wraps as they ended, the outermost wrapped modules' parameters, then ``end``
        (never raises: the rank leaves with the script's status whatever the record could take)."""
        if self.torch is not None:
            self.guarded("wraps at the end", self.scan_wraps)
            self.guarded("parameters at the end", self.write_final)
            self.guarded("compiled", self.write_compiled)
        self.guarded("end", lambda: self.write(
            "end", exit_code=code, collectives=self.collectives, optimizer_steps=self.steps, backwards=self.backwards,
            initial_seed=self.torch.initial_seed() if self.torch else None, time_ns=time.time_ns()))

    def write_compiled(self) -> None:
        counts = records.dynamo_counts(sys.modules)
        if counts is not None:  # the script compiled something (or imported dynamo): what torch.compile did
            self.write("compiled", **counts)

    def write_final(self) -> None:
        summary = records.summary
        for wrap_id, module in self.outermost():
            self.write("final", wrap=wrap_id, params=[
                {"name": name, "grad": summary(self.torch, p.grad, self.full_numel) if p.grad is not None else None,
                 "value": summary(self.torch, p, self.full_numel)} for name, p in module.named_parameters()])


def _params(optimizer) -> list:
    """``[(param group index, parameter)]`` in the optimizer's order."""
    return [(g, p) for g, group in enumerate(optimizer.param_groups) for p in group["params"]]


# ------------------------------------------------------------------------------------------------ installing

_LIBRARIES: list = []  # torch.library registrations last as long as their Library objects


def start(folder: str, argv: list[str]) -> Observer:
    """Open this rank's record in ``folder``, write ``start``, and hook into torch once the script imports it.

    Raises:
        OSError: the record cannot be created (it exists already, or the folder is not writable).
        ValueError: ``$TUTORIAL_LIB_OBSERVE_FULL_NUMEL`` is not a whole number >= 0.
    """
    rank, restart = int(os.environ.get("RANK", "0")), int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    text = os.environ.get(FULL_NUMEL_ENV) or str(DEFAULT_FULL_NUMEL)
    if not text.isdigit():
        raise ValueError(f"{FULL_NUMEL_ENV}={text!r}: the most elements of a tensor written whole, a whole number >= 0 "
                         f"(default {DEFAULT_FULL_NUMEL})")
    full_numel = int(text)
    os.makedirs(folder, exist_ok=True)
    observer = Observer(Recorder(os.path.join(folder, record_name(rank, restart))), full_numel)
    observer.write("start", schema=SCHEMA, rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                   world_size=int(os.environ.get("WORLD_SIZE", "1")), restart=restart, pid=os.getpid(),
                   argv=list(argv), full_numel=full_numel, python=sys.version.split()[0], time_ns=time.time_ns())
    after_import("torch", lambda torch: observer.guarded("install", install, observer, torch))
    return observer


def install(observer: Observer, torch) -> None:
    """Hook into an imported torch: the dispatcher's collectives, ``init_process_group``, ``manual_seed``,
    ``backward``, the optimizers' and modules' global hooks, and ``parallelize_module`` once it is imported."""
    observer.torch, observer.sites = torch, records.CallSites(torch)
    observer.write("torch", version=torch.__version__, initial_seed=torch.initial_seed())
    below = torch._C._after_ADInplaceOrView_keyset.remove(torch._C.DispatchKey.BackendSelect)
    for namespace, table in (("c10d", records.C10D_OPS), ("_c10d_functional", records.FUNCTIONAL_OPS)):
        library = torch.library.Library(namespace, "IMPL")
        _LIBRARIES.append(library)
        for name in table:
            try:
                op = getattr(getattr(torch.ops, namespace), name).default
            except (AttributeError, RuntimeError):  # an op this torch does not have
                continue
            library.impl(name, _kernel(observer, namespace, name, op, below), "BackendSelect", with_keyset=True)
    _wrap_functions(observer, torch)
    optim = importlib.import_module("torch.optim.optimizer")  # imported by torch, not an attribute of torch.optim
    optim.register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: observer.guarded("optimizer step", observer.before_step, optimizer))
    optim.register_optimizer_step_post_hook(
        lambda optimizer, args, kwargs: observer.guarded("optimizer step", observer.after_step, optimizer))

    def registration(module, name, submodule):  # DDP's self.module = module, FSDP1's _fsdp_wrapped_module
        if type(module).__name__ in records.WRAPPER_CLASSES and type(module).__module__.startswith("torch."):
            observer.guarded("track", observer.track, module)

    importlib.import_module("torch.nn.modules.module").register_module_module_registration_hook(registration)
    after_import("torch.distributed.tensor.parallel",
                 lambda package: observer.guarded("install parallelize_module", _wrap_parallelize, observer, package))


def _kernel(observer: Observer, namespace: str, name: str, op, below):
    """The ``BackendSelect`` kernel of one collective op: record the call (unless nested in an observed one), then
    run it, unchanged, on the kernels below (``OpOverload.redispatch``)."""
    names, local = [a.name for a in op._schema.arguments], observer.local

    def kernel(keyset, *args, **kwargs):
        depth = getattr(local, "depth", 0)
        if depth == 0:
            try:
                observer.on_collective(namespace, name, dict(zip(names, args), **kwargs))
            except Exception as e:  # noqa: BLE001 - the collective runs whatever the observer makes of it
                observer.error(f"{namespace}::{name}", e)
        local.depth = depth + 1
        try:
            return op.redispatch(keyset & below, *args, **kwargs)
        finally:
            local.depth = depth

    return kernel


def _wrap_functions(observer: Observer, torch) -> None:
    """``init_process_group``, ``manual_seed`` and ``autograd.backward`` (which ``Tensor.backward`` calls), wrapped
    where a script finds them; each records after (``backward``: around) torch's own call. Each name is wrapped as it
    is now: with the warm-start helper's preload, ``torch.manual_seed`` is already ``torch._dynamo``'s wrapper of
    ``torch.random.manual_seed``, another object (dynamo wraps it on import; a cold rank's dynamo wraps ours)."""
    def init_process_group(init):
        def wrapper(*args, **kwargs):
            result = init(*args, **kwargs)
            observer.guarded("init_process_group", observer.on_init, args, kwargs)
            return result
        return wrapper

    def manual_seed(seed):
        def wrapper(value):
            result = seed(value)
            observer.guarded("manual_seed", observer.on_seed, value)
            return result
        return wrapper

    def autograd_backward(backward):
        def wrapper(tensors, *args, **kwargs):
            observer.guarded("backward", observer.on_backward, tensors)
            previous, observer.in_backward = observer.in_backward, observer.backwards
            try:
                return backward(tensors, *args, **kwargs)
            finally:
                observer.in_backward = previous
        return wrapper

    made: dict[int, object] = {}  # id(original) -> its wrapper: one object where torch has one under two names
    for module, name, make in ((torch.distributed.distributed_c10d, "init_process_group", init_process_group),
                               (torch.distributed, "init_process_group", init_process_group),
                               (torch.random, "manual_seed", manual_seed), (torch, "manual_seed", manual_seed),
                               (torch.autograd, "backward", autograd_backward)):
        original = getattr(module, name, None)
        if original is None or getattr(original, "_observed", False):
            continue
        if id(original) not in made:
            made[id(original)] = functools.wraps(original)(make(original))
            made[id(original)]._observed = True
        setattr(module, name, made[id(original)])


def _wrap_parallelize(observer: Observer, package) -> None:
    """``torch.distributed.tensor.parallel.parallelize_module``, wrapped where scripts import it from; the plan it was
    given is written as a wrap (torch's own recursion inside ``api`` calls the original)."""
    original = package.parallelize_module
    signature = inspect.signature(original)

    @functools.wraps(original)
    def parallelize_module(*args, **kwargs):
        result = original(*args, **kwargs)
        observer.guarded("parallelize_module", observer.on_parallelize, result, signature.bind(*args, **kwargs))
        return result

    package.parallelize_module = parallelize_module
