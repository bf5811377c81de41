"""Why an eagerly run user function failed, in the words tracing uses.

Eagerly, a user function's math is plain numpy: a shape mismatch is numpy's gufunc message and a
float64 weight shows only as a state whose dtype changed. Tracing the same function on the same
element values names the operation, its operands' types and the user's line (`matmul: inner
dims differ: [1, 8] @ [4, 4] at rnn.py:12`), and its constants are the arrays the function
captured. This runs only once eager execution has already failed: it never slows the eager path.
"""
from __future__ import annotations

import types

import numpy as np

from . import pytree
from .errors import PolyftError, ShapeError
from .etdg import ETDG, OpNode, ops
from .tracing import trace
from .types import FTType


def _trace(f, args):
    """f traced on these element values (tuples of them as tuples of traced values): its ETDG, the
    PolyftError tracing raised, or None where it cannot be traced (a Python value, a ragged list)."""
    leaves, shape = pytree.leaves(args), pytree.structure(args)

    def flat(*values):
        return f(*pytree.unflatten(shape, list(values)))

    flat.__name__ = getattr(f, "__name__", "f")
    try:
        return trace(flat, *leaves)
    except PolyftError as e:
        return e
    except Exception:  # noqa: BLE001  (an explanation is optional: the eager error stands without it)
        return None


def shape_error(f, args) -> ShapeError | None:
    """The ShapeError tracing f on args raises (the traced message: operator, shapes, line), if any."""
    found = _trace(f, args)
    return found if isinstance(found, ShapeError) else None


def promotion(f, args, old: str, new: str) -> str:
    """Where f turns values of dtype `old` into `new`: the first operation of f that mixes the two,
    its operands' types (a captured array by its name) and the user's line, with the fix; "" when
    tracing cannot tell."""
    etdg = _trace(f, args)
    if not isinstance(etdg, ETDG):
        return ""
    for node in ops(etdg.root):
        if node.op in ("load", "store", "astype") or node.dtype != new:
            continue
        operands = [_source(a) for a in node.inputs]
        if {old, new} <= {_dtype(a) for a in operands}:
            named = [(a, _name_of(_captured(a), f)) for a in operands]
            kinds = " and ".join(f"{name} {_type(a)}" if name else _type(a) for a, name in named)
            culprit = next((name for a, name in named if name and _dtype(a) == new), None)
            fix = f"{culprit}.astype(np.{old})" if culprit else f"an {old} operand"
            return f"{node.op} of {kinds} gives {new} (use {fix}), at {node.where}"
    return ""


def _source(a):
    """The operand before an astype the tracer inserted (numpy's promotion of a mixed operation)."""
    while isinstance(a, OpNode) and a.op == "astype":
        a = a.inputs[0]
    return a


def _dtype(a) -> str:
    if isinstance(a, OpNode):
        return a.dtype
    return np.asarray(a[1] if isinstance(a, tuple) else a).dtype.name


def _type(a) -> str:
    return str(FTType((), a.shape, a.dtype)) if isinstance(a, OpNode) else f"a constant of {_dtype(a)}"


def _captured(a):
    """The user's array a load of a constant buffer reads (None for any other operand)."""
    if isinstance(a, OpNode) and a.op == "load" and a.pieces and a.pieces[0].buffer is not None:
        return a.pieces[0].buffer.value
    return None


def _name_of(value, f, depth: int = 3) -> str | None:
    """The name under which f (or a function it captures) reads `value`: a closure cell or a global."""
    if value is None or not isinstance(f, types.FunctionType) or depth == 0:
        return None
    cells = zip(f.__code__.co_freevars, f.__closure__ or ())
    scopes = [(name, cell.cell_contents) for name, cell in cells if _filled(cell)]
    scopes += [(name, f.__globals__[name]) for name in _global_names(f.__code__) if name in f.__globals__]
    for name, held in scopes:
        if held is value:
            return name
    for _, held in scopes:
        found = _name_of(value, held, depth - 1)
        if found:
            return found
    return None


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a closure variable not yet assigned
        return False
    return True


def _global_names(code) -> set:
    """The global names a function's code (and the lambdas and functions defined in it) reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
