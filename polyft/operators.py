"""The public operators: compute (`ft.map`, `ft.reduce`, folds, scans) and combining (`ft.zip`, `ft.product`).

A compute operator runs eagerly on numpy (`eager`) unless one of its lists or its init is the
tracer's, in which case `tracing` records it into the ETDG instead; the user's code is the same.
This module also gives every list the compute operators as methods (`xs.map(f)`, ...).
"""
from __future__ import annotations

from . import eager, pytree, recording, tracing
from .fractaltensor import ListBase, Zip, check_lists, is_traced


def _compute(op: str, f, lists: tuple, init):
    if recording.recording() is not None:  # inside ft.vjp / ft.grad: recorded with its adjoint
        return recording.HANDLERS["compute"](op, f, lists, init)
    # inside a trace, lists the program captured (`ft.arange(n)`) are its constants: a body over them
    # may read the program's traced values, so it is traced too
    if tracing.tracing() or any(is_traced(x) for x in (*lists, *pytree.leaves(init))):
        return tracing.traced_compute(op, f, lists, init)
    return eager.compute(op, f, lists, init)


def map(f, xs, *more):
    """`[f(x0), ..., f(xm)]`; with several lists, `f(x, y, ...)` over their zip, like built-in map."""
    return _compute("map", f, (xs, *more), None)


def reduce(f, xs, init=None):
    """`s0 ⊕ x0 ⊕ ... ⊕ xm` with `f(state, x)`; foldl's order (⊕ is declared associative)."""
    return _compute("reduce", f, (xs,), init)


def foldl(f, xs, init=None):
    """`((s0 ⊕ x0) ⊕ x1) ... ⊕ xm` with `f(state, x)`."""
    return _compute("foldl", f, (xs,), init)


def foldr(f, xs, init=None):
    """`x0 ⊕ (x1 ⊕ ... (xm ⊕ s0))` with `f(x, state)`."""
    return _compute("foldr", f, (xs,), init)


def scanl(f, xs, init=None):
    """`[s0⊕x0, s0⊕x0⊕x1, ...]` (init not in the output); without init `[x0, x0⊕x1, ...]`."""
    return _compute("scanl", f, (xs,), init)


def scanr(f, xs, init=None):
    """`[x0⊕(...⊕(xm⊕s0)), ..., xm⊕s0]` with `f(x, state)`; without init the last output is xm."""
    return _compute("scanr", f, (xs,), init)


def zip(*lists) -> Zip:
    """One list of tuples over lists of one length; unequal lengths raise LengthMismatchError."""
    return Zip(lists)


def product(xs, ys) -> Zip:
    """The depth-2 list of pairs `[[(x_i, y_j) for j] for i]`, as a zip of two broadcast views."""
    check_lists((xs, ys), "product")
    return Zip([xs._repeat(ys.length, inner=True), ys._repeat(xs.length, inner=False)], depth=2)


def _list_method(fn):
    def method(self, f, *args):
        return fn(f, self, *args)
    method.__name__, method.__qualname__ = fn.__name__, f"ListBase.{fn.__name__}"
    method.__doc__ = f"`xs.{fn.__name__}(f, ...)` is `ft.{fn.__name__}(f, xs, ...)`: {fn.__doc__}"
    return method


# `xs.map(f)`, `xs.scanl(f, init)`, ...: attached here, where compute operators are dispatched,
# to the class every list derives from (see `ListBase`'s docstring)
for _fn in (map, reduce, foldl, foldr, scanl, scanr):
    setattr(ListBase, _fn.__name__, _list_method(_fn))
del _fn
