"""Check a notebook's papermill parameters before anything runs.

A notebook's ``parameters`` cell declares each parameter with its type, in a form papermill's own inspection
reads (``papermill --help-notebook``): ``NPROC: Optional[int] = None``. Papermill injects the values given on its
command line (or by ``scripts/run_workbook.py``) in a cell below; the first cell after them calls
``tl.check_parameters(globals())``, which compares every declared parameter's value with its annotation and
names the parameter and the flag to use when one does not match (``-p NPROC None`` typed as the string
``'None'`` by another tool, a dict given with ``-p``). The common parameters' values are checked too (``DOMAINS``:
``NPROC`` None or >= 1, ``DEVICE`` ``auto``/``cpu``/``cuda``, every ``*_S`` limit > 0, step and batch counts >= 1,
...), so ``-p NPROC 0`` stops at that cell naming ``NPROC``, not seconds later deep in a launch.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping

from ..errors import ConfigError

_EXAMPLES = {int: "2", float: "0.5", str: "cpu", bool: "True"}


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _each(test: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: isinstance(v, list) and len(v) > 0 and all(test(x) for x in v)


# Parameter -> (the test its value passes, what it accepts, a flag that gives a good value). A parameter named
# ``*_S`` (seconds) not listed here must be > 0 (``domain``).
DOMAINS: dict[str, tuple[Callable[[object], bool], str, str]] = {
    "NPROC": (lambda v: v is None or _count(v), "None (2 ranks on CPU, one per GPU) or an integer >= 1", "-p NPROC 2"),
    "DEVICE": (lambda v: v in ("auto", "cpu", "cuda"), "'auto', 'cpu' or 'cuda'", "-p DEVICE cpu"),
    "HIDDEN_DIM": (lambda v: v is None or _count(v), "None (the lesson's default) or an integer >= 1", "-p HIDDEN_DIM 256"),
    **{name: (_count, "an integer >= 1", f"-p {name} 4") for name in (
        "MAX_STEPS", "STEPS", "BATCH_SIZE", "ACCUM_STEPS", "GLOBAL_BATCH", "DATASET_SIZE", "NNODES", "PROFILE_STEPS",
        "SAVE_EVERY", "LARGE_HIDDEN_DIM", "WIDE_HIDDEN_DIM")},
    **{name: (lambda v: _number(v) and v >= 0, ">= 0", f"-p {name} 1") for name in (
        "GPUS_PER_NODE", "FAIL_RANK", "FAIL_STEP")},
    **{name: (lambda v: _number(v) and v > 0, "a number > 0", f"-p {name} 1e-5") for name in (
        "OVERFLOW_INIT_SCALE", "SMALL_LOSS_WEIGHT")},
    **{name: (_each(_count), "a non-empty list of integers >= 1", f"-y '{name}: [16, 64]'") for name in (
        "BATCH_SIZES", "LOADER_BATCH_SIZES")},
    "NUM_WORKERS": (_each(lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 0),
                    "a non-empty list of integers >= 0", "-y 'NUM_WORKERS: [0, 2]'"),
    "BUCKET_CAPS_MB": (_each(lambda x: _number(x) and x > 0), "a non-empty list of numbers > 0 (MiB)",
                       "-y 'BUCKET_CAPS_MB: [25, 1]'"),
}


def domain(name: str) -> tuple[Callable[[object], bool], str, str] | None:
    """The values parameter ``name`` may take beyond its type (``DOMAINS``; any other ``*_S``: seconds > 0), or
    ``None`` when only its type is checked: ``(test, what it accepts, a flag that gives a good value)``."""
    if name in DOMAINS:
        return DOMAINS[name]
    if name.endswith("_S"):
        return (lambda v: v is None or (_number(v) and v > 0), "seconds > 0", f"-p {name} 60")
    return None


def _allowed(annotation: object) -> tuple[type, ...]:
    """The classes ``annotation`` accepts: ``Optional[int]`` -> ``(int, NoneType)``; a float also takes an int."""
    if typing.get_origin(annotation) is typing.Union:
        return tuple(t for arg in typing.get_args(annotation) for t in _allowed(arg))
    if annotation is None or annotation is type(None):
        return (type(None),)
    origin = typing.get_origin(annotation) or annotation
    if not isinstance(origin, type):
        raise ConfigError(f"cannot check a parameter annotated {annotation!r}: use int, float, str, bool, list, "
                          "dict or Optional[...] of them")
    return (origin, int) if origin is float else (origin,)


def _matches(value: object, allowed: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in allowed:
        return False  # True is an int to Python, not to a learner passing -p NPROC True
    return isinstance(value, allowed)


def _flag(name: str, allowed: tuple[type, ...]) -> str:
    """The command-line flag that gives ``name`` a value of an allowed type."""
    kinds = [t for t in allowed if t is not type(None)]
    if kinds and kinds[0] in (dict, list):
        example = "{KEY: value}" if kinds[0] is dict else "[1, 2]"
        return f"-y '{name}: {example}'"
    return f"-p {name} {_EXAMPLES.get(kinds[0], 'VALUE') if kinds else 'None'}"


def _describe(allowed: tuple[type, ...]) -> str:
    names = list(dict.fromkeys("None" if t is type(None) else t.__name__ for t in allowed))
    if "float" in names and "int" in names:
        names.remove("int")
    return " or ".join(names)


def check_parameters(namespace: Mapping[str, object]) -> dict[str, object]:
    """Check every annotated parameter in ``namespace`` (a notebook's ``globals()``) against its annotation.

    Args:
        namespace: the variables of the notebook; its ``__annotations__`` (filled by the ``parameters`` cell's
            ``NAME: type = default`` lines) says which names are parameters and what each accepts: ``int``,
            ``float`` (an int is fine), ``str``, ``bool``, ``list``, ``dict`` or ``Optional[...]`` of them.

    Returns:
        ``{name: value}`` of the parameters checked, in declaration order.

    Raises:
        ConfigError: a value of the wrong type, or outside its parameter's domain (``domain``: ``NPROC`` 0,
            ``DEVICE`` 'gpu', ``TIMEOUT_S`` 0); the message names the parameter, the value, what it accepts and
            the papermill / ``run_workbook.py`` flag that gives it one (``-p NPROC 2``; ``-y 'RANK_ENV: {...}'``
            for a dict or list, since ``-p`` gives strings and numbers only).
    """
    annotations = namespace.get("__annotations__") or {}
    if not annotations:
        raise ConfigError("no annotated parameters found: the parameters cell declares each one as "
                          "NAME: type = default (e.g. NPROC: Optional[int] = None)")
    checked = {}
    for name, annotation in annotations.items():
        if name not in namespace:
            continue  # annotated but never assigned: not a parameter
        allowed, value = _allowed(annotation), namespace[name]
        if not _matches(value, allowed):
            raise ConfigError(f"parameter {name} must be {_describe(allowed)}, got {value!r} "
                              f"({type(value).__name__}); from the command line: {_flag(name, allowed)}")
        rule = domain(name)
        if rule is not None and not rule[0](value):
            raise ConfigError(f"parameter {name} must be {rule[1]}, got {value!r}; from the command line: {rule[2]}")
        checked[name] = value
    return checked


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive ``int`` (not a bool or a float), else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{name} must be a positive integer, got {value!r} ({type(value).__name__}); pass a number, e.g. 2"
        )
    if value <= 0:
        raise ConfigError(f"{name} must be >= 1, got {value}")
    return value
