"""A user's own program for `polyft inspect`: the function named on the command line
(`FILE.py:FUNCTION` or `package.module:function`) and its inputs as `--spec` type strings.

Everything that can go wrong here (no such file, an import that fails, no such function, a
spec that does not parse or does not fit the function's parameters) is a PolyftError with a
one-line message the CLI prints, since the traceback would point into polyft, not the mistake.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback

from .errors import PolyftError, SpecError
from .types import spec

_FORMS = "FILE.py:FUNCTION or package.module:function"


def command_line_error(message: str) -> PolyftError:
    """An inspect error whose place is the command line (not a line of Python)."""
    return PolyftError(message, op="inspect", where="")


def load_function(target: str):
    """The function `target` names: `path/to/file.py:fn` (imported as `python file.py` would
    find its neighbours) or `package.module:fn` (imported from the current directory first,
    as `python -m` does)."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise command_line_error(f"{target!r} names no function: write {_FORMS}")
    module = _import_file(where) if where.endswith(".py") else _import_module(where)
    fn = module
    for part in name.split("."):
        if not hasattr(fn, part):
            defined = sorted(k for k, v in vars(module).items()
                             if inspect.isfunction(v) and v.__module__ == module.__name__)
            raise command_line_error(f"{where} defines no {name!r}; its functions: "
                                     f"{', '.join(defined) or 'none'}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise command_line_error(f"{where}:{name} is {fn!r:.40} ({type(fn).__name__}), not a function")
    return fn


def _import_file(path: str):
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise command_line_error(f"no file {path!r} (from {os.getcwd()})")
    name = os.path.splitext(os.path.basename(full))[0]
    if getattr(sys.modules.get(name), "__file__", full) != full:  # random.py must not replace random
        name = f"_polyft_user_{name}"
    module_spec = importlib.util.spec_from_file_location(name, full)
    module = importlib.util.module_from_spec(module_spec)
    if os.path.dirname(full) not in sys.path:
        sys.path.insert(0, os.path.dirname(full))
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise command_line_error(f"importing {path} failed: {_why(e, full)}") from None
    return module


def _import_module(dotted: str):
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as e:
        raise command_line_error(f"no module {e.name!r} (for {dotted!r}, from {os.getcwd()}); "
                                 f"write {_FORMS}") from None
    except Exception as e:
        raise command_line_error(f"importing {dotted} failed: {_why(e)}") from None


def _why(e: Exception, path: str | None = None) -> str:
    """`SyntaxError: ... (line 3)`: the error with the line of the user's file it came from."""
    line = e.lineno if isinstance(e, SyntaxError) else next(
        (f.lineno for f in reversed(traceback.extract_tb(e.__traceback__)) if path is None or f.filename == path),
        None)
    msg = e.msg if isinstance(e, SyntaxError) else str(e)
    return f"{type(e).__name__}: {msg}" + (f" (line {line})" if line else "")


def parse_specs(fn, texts) -> tuple:
    """One `ft.spec` per positional parameter of `fn`, from `--spec` type strings; an error
    names the parameter and the string."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_more = any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(fn).parameters.values())
    required = [p for p in params if p.default is p.empty]
    texts = list(texts or ())
    if len(texts) < len(required) or (len(texts) > len(params) and not takes_more):
        names = ", ".join(p.name for p in params)
        raise command_line_error(f"{fn.__name__}({names}) takes {len(required)} input(s), got {len(texts)} --spec: "
                                 "give one type string per input, e.g. --spec \"[N, L]float32[1, 8]\" "
                                 "--spec \"float32[8, 8]\"")
    out = []
    for k, text in enumerate(texts):
        what = params[k].name if k < len(params) else f"input {k + 1}"
        try:
            out.append(spec(text))
        except SpecError as e:
            raise command_line_error(f"--spec for {what}: {e.detail}") from None
    return tuple(out)
