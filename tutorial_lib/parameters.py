"""Check a notebook's papermill parameters before anything runs.

A notebook's ``parameters`` cell declares each parameter with its type, in a form papermill's own inspection
reads (``papermill --help-notebook``): ``NPROC: Optional[int] = None``. Papermill injects the values given on its
command line (or by ``scripts/run_workbook.py``) in a cell below; the first cell after them calls
``tl.check_parameters(globals())``, which compares every declared parameter's value with its annotation and
names the parameter and the flag to use when one does not match (``-p NPROC None`` typed as the string
``'None'`` by another tool, a dict given with ``-p``).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping

from .errors import ConfigError

_EXAMPLES = {int: "2", float: "0.5", str: "cpu", bool: "True"}


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
        ConfigError: a value of the wrong type; the message names the parameter, the value, what it accepts and
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
