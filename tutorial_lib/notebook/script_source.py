"""A script's source in the kernel: show it with line numbers, import it as a module, check arguments against it.

``show_script`` is how a notebook shows the lines it talks about; ``import_script`` gives a notebook a script's
classes (the model a checkpoint was saved from); ``check_script_args`` runs a script's own ``parse_args`` on the
arguments of a launch before anything starts, without touching this process's ``sys.stdout`` or ``sys.stderr``.
"""

from __future__ import annotations

import argparse
import ast
import html
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from ..errors import ConfigError
from ..runs.rundir import LESSONS_DIR, WORKBOOK_MODULE, available_scripts, closest_script, sibling_modules


class ScriptListing:
    """Parts of a source file shown with line numbers (text in a terminal, highlighted HTML in Jupyter).

    Args:
        path: the file.
        spans: ``(first_line, last_line)`` pairs, 1-based and inclusive; ``last_line`` ``None`` means the end.
    """

    def __init__(self, path: str | os.PathLike, spans: list[tuple[int, int | None]]) -> None:
        self.path = Path(path)
        lines = self.path.read_text().splitlines()
        self.parts = [(max(1, a), lines[max(1, a) - 1: b]) for a, b in spans]

    def __str__(self) -> str:
        width = len(str(max(a + len(body) for a, body in self.parts)))
        chunks = ["\n".join(f"{i:>{width}}  {line}" for i, line in enumerate(body, a)) for a, body in self.parts]
        return f"# {self.path.name}\n" + "\n...\n".join(chunks)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer
        except ImportError:
            return f"<pre>{html.escape(str(self))}</pre>"
        chunks = [highlight("\n".join(body), PythonLexer(), HtmlFormatter(linenos="inline", linenostart=a, noclasses=True))
                  for a, body in self.parts]
        return f"<b>{html.escape(self.path.name)}</b>" + "<div>...</div>".join(chunks)


def show_script(path: str | os.PathLike, *names: str, first_line: int = 1,
                last_line: int | None = None, between: tuple[str, str] | None = None) -> ScriptListing:
    """A displayable listing of ``path`` with line numbers.

    Args:
        path: the script.
        names: top-level functions or classes to show (each with its decorators), in this order;
            none: the lines ``first_line``..``last_line`` (1-based, inclusive; default the whole file). Names
            the script lacks and a file beside it that it imports has (``sibling_modules``: a lesson's model in
            ``lm_model.py``, its instruments in ``_workbook.py``) are shown from the first such file.
        between: ``(start_text, end_text)``: instead, the lines from the first one containing
            ``start_text`` to the next one containing ``end_text`` (inclusive), so an excerpt
            survives edits that move line numbers.

    Raises:
        ConfigError: a name that is not a top-level function or class of the script, or a
            ``between`` text that is not in the script.
    """
    if between is not None:
        start_text, end_text = between
        lines = Path(path).read_text().splitlines()
        start = next((i for i, line in enumerate(lines, 1) if start_text in line), None)
        end = next((i for i, line in enumerate(lines, 1) if start and i >= start and end_text in line), None)
        if start is None or end is None:
            missing = start_text if start is None else end_text
            raise ConfigError(f"{Path(path).name} has no line containing {missing!r}"
                              + ("" if start is None else f" after line {start}"))
        return ScriptListing(path, [(start, end)])
    if not names:
        return ScriptListing(path, [(first_line, last_line)])
    spans = _top_level_spans(path)
    if not set(names) & set(spans):
        for sibling in sibling_modules(path):  # the lesson's model, its instruments: beside it, as it imports them
            if set(names) <= set(_top_level_spans(Path(path).parent / sibling)):
                path, spans = Path(path).parent / sibling, _top_level_spans(Path(path).parent / sibling)
                break
    for name in names:
        if name not in spans:
            raise ConfigError(f"{Path(path).name} has no top-level function or class {name!r}; has {sorted(spans)}")
    return ScriptListing(path, [spans[name] for name in names])


def _top_level_spans(path: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """Each top-level function and class of ``path``: its first line (decorators included) and last line."""
    tree = ast.parse(Path(path).read_text())
    return {node.name: (min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno)
            for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def import_script(script: str | os.PathLike) -> ModuleType:
    """A training script imported as a module, to use its classes and functions in the notebook (the model a
    checkpoint was saved from, say); its ``main()`` does not run (it runs under ``if __name__ == "__main__"``).

    Args:
        script: a script file (e.g. the copy ``write_script`` put in a run directory) or the name of a shipped
            script (``"checkpoint_train"``).

    Raises:
        ConfigError: no such file or shipped script, or Python cannot import it as a module.
    """
    path = Path(script)
    if not path.suffix and not path.exists() and str(script) in available_scripts():
        path = LESSONS_DIR / f"{script}.py"
    if not path.is_file():
        raise ConfigError(f"script {str(script)!r} is neither a file nor a shipped script; {closest_script(str(script))}"
                          f"shipped: {available_scripts()}")
    module_spec = importlib.util.spec_from_file_location(f"_tutorial_lib_script_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"{str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    # The script's ``import _workbook`` and ``from lm_model import GPT`` find the files beside it, as a rank does (or
    # none: ``import _workbook`` then raises ImportError), never another run's copy cached in sys.modules.
    names = dict.fromkeys([Path(name).stem for name in sibling_modules(path)] + [Path(WORKBOOK_MODULE).stem])
    before = {name: sys.modules.pop(name, None) for name in names}
    try:
        for name in names:
            sys.modules[name] = _load(path.parent / f"{name}.py")
        module_spec.loader.exec_module(module)
    finally:
        for name, cached in before.items():
            if cached is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = cached
    return module


def script_instruments(module: ModuleType) -> ModuleType:
    """The workbook's instruments of a script from ``import_script``: the ``_workbook.py`` it imported from beside it
    (its ``workbook``), or, for a copy without one, the shipped ``_workbook.py``."""
    return getattr(module, "workbook", None) or import_script(LESSONS_DIR / WORKBOOK_MODULE)


def _load(path: Path) -> ModuleType | None:
    """The module in ``path``, or ``None`` (which makes ``import`` of it raise ImportError) when there is no file."""
    if not path.is_file():
        return None
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


class _ArgsRejected(Exception):
    """``_CheckingParser`` refused the arguments (argparse's exit status and message)."""

    def __init__(self, status: int, message: str | None) -> None:
        super().__init__(message)
        self.status, self.message = status, (message or "").strip()


class _CheckingParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that raises where argparse would print and exit: ``error`` and ``exit`` are the methods
    argparse documents for overriding; ``_print_message`` is where its help, usage and version text go (no output
    at all: a check writes nothing, to no stream)."""

    def exit(self, status=0, message=None):
        raise _ArgsRejected(status, message)

    def error(self, message):
        raise _ArgsRejected(2, message)

    def _print_message(self, message, file=None):
        pass


def _checking_argparse():
    """``argparse`` with ``ArgumentParser`` replaced by ``_CheckingParser``, for one script module's globals."""
    module = type(argparse)("argparse", argparse.__doc__)
    module.__dict__.update({k: v for k, v in vars(argparse).items() if not k.startswith("__")})
    module.ArgumentParser = _CheckingParser
    return module


def check_script_args(script: str | os.PathLike, args: Sequence[object]) -> ModuleType | None:
    """Parse ``args`` with the script's own ``parse_args(argv)`` before anything is launched.

    The shipped scripts validate their flags in ``parse_args`` (argparse plus range checks); calling
    it here turns a typo or a bad value into an error in the cell at once, instead of a failed
    launch with one argparse message per rank. A script without a ``parse_args`` function is not
    checked. The script is imported under a private module name; its ``main()`` does not run.

    Nothing process-wide changes, so launches from several threads can check at once: instead of swapping
    ``sys.stdout`` and ``sys.stderr`` (which a second thread could leave swapped), the imported module's own
    ``argparse`` (or ``ArgumentParser``) is, for the check, one whose parser raises instead of printing and exiting.
    A script that builds its parser elsewhere is still checked, and its message reaches stderr as usual.

    Returns:
        The imported script module (``run_in_process`` calls its ``main()``), or ``None`` for a file
        Python cannot import as a module.

    Raises:
        ConfigError: the script rejects ``args``; the message is the script's own.
    """
    path = Path(script)
    try:
        module = import_script(path)
    except ConfigError:
        return None
    parse_args = getattr(module, "parse_args", None)
    if not callable(parse_args):
        return module
    swapped = {name: value for name, value in vars(module).items()
               if value is argparse or value is argparse.ArgumentParser}
    vars(module).update({name: _checking_argparse() if value is argparse else _CheckingParser
                         for name, value in swapped.items()})
    argv = [str(a) for a in args]
    try:
        parse_args(argv)
    except (_ArgsRejected, SystemExit) as e:
        status = e.status if isinstance(e, _ArgsRejected) else e.code
        if status not in (0, None):
            message = getattr(e, "message", "") or f"exit code {status}"
            reason = message.split("error: ", 1)[-1]  # argparse's exit message: "<prog>: error: <message>"
            raise ConfigError(f"{path.name}: {reason} (it was given {argv}; see python {path.name} --help)") from None
    finally:
        vars(module).update(swapped)  # run_in_process runs this module's main() with the real argparse
    return module


def check_script_syntax(script: str | os.PathLike) -> None:
    """Compile a script's source (``compile()``: nothing is imported or run) so that a file Python cannot parse is an
    error in the cell, before anything is launched, instead of one ``SyntaxError`` per rank.

    Only the script's own file is checked: a module it imports is parsed when a rank imports it (the doctor then
    names its file and line, cause "syntax error").

    Raises:
        ConfigError: ``SyntaxError`` (or ``IndentationError``, ``TabError``, a null byte), naming the file, the line,
            the offending text and Python's message; or a file that cannot be read.
    """
    path = Path(script)
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except SyntaxError as e:
        text = (e.text or "").strip()
        raise ConfigError(f"{e.filename or path}:{e.lineno}: {type(e).__name__}: {e.msg}"
                          + (f" in {text!r}" if text else "")
                          + f"; correct that line (check it with: python -m py_compile {path}) before launching") from None
    except ValueError as e:  # source with a null byte (Python < 3.12)
        raise ConfigError(f"{path} is not Python source ({e}); is it the right file?") from None
    except OSError as e:
        raise ConfigError(f"script {str(path)!r} cannot be read ({e.strerror})") from None
