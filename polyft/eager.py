"""Eager semantics of the compute operators (paper Table 1), one element at a time on numpy.

This is the reference every compiled path is checked against, so it follows the definitions
literally: one sequential loop per operator, with the state's type checked at every step and
user errors reported at the user's line.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import diagnose, errors, pytree
from .errors import EmptyReduceError, InPlaceError, ReturnTypeError, StateTypeError
from .fractaltensor import FractalTensor, ListBase, Zip, check_lists, check_same_length, unzip
from .types import DTYPES, FTType

_VALUE_KINDS = "a tensor, a FractalTensor, or a tuple of them"
_ELEMENT_AS_STATE = "an element (the first state, without init)"


def compute(op: str, f, lists: tuple, init):
    """Run `op` in {map, reduce, foldl, foldr, scanl, scanr} as Table 1 and docs/design.md define it."""
    check_lists(lists, op)
    if len(lists) > 1:
        check_same_length(lists, op)
    xs = lists[0] if len(lists) == 1 else Zip(lists)
    if op == "map":
        return _map(f, xs, unpack=len(lists) > 1)
    return _aggregate(op, f, xs, init)


def _map(f, xs, unpack: bool):
    def apply(x):
        return _call("map", f, x if unpack else (x,))

    if len(xs) == 0:
        with np.errstate(all="ignore"):
            probe = apply(_zero_list(xs)[0])
        return _empty(_result_key("map", probe))
    results = [apply(xs[i]) for i in range(len(xs))]
    key = _result_key("map", results[0])
    for i, result in enumerate(results[1:], 1):
        if _result_key("map", result) != key:
            raise ReturnTypeError(f"the function returned {_describe(results[0])} for element 0 but "
                                  f"{_describe(result)} for element {i}; every result must have one type",
                                  op="map")
    return _assemble(results)


def _aggregate(op: str, f, xs, init):
    right, scan = op in ("foldr", "scanr"), op.startswith("scan")
    init = unzip(init)
    order = list(range(len(xs)))
    if right:
        order.reverse()
    if init is None and not order:
        if not scan:
            raise EmptyReduceError(f"{op} of an empty list needs an init value", op=op)
        return _empty(_state_key(op, _zero_list(xs)[0], _ELEMENT_AS_STATE))
    if init is None:
        state = xs[order.pop(0)]
        _state_key(op, state, _ELEMENT_AS_STATE)
        outputs = [state]
    else:
        _state_key(op, init, "init")
        state, outputs = init, []
    for i in order:
        args = (xs[i], state) if right else (state, xs[i])
        new = _call(op, f, args)
        if _result_key(op, new) != _structure(state):
            raise StateTypeError(f"the state has type {_describe(state)} but the function returned "
                                 f"{_describe(new)}; the state's type must be the same at every step"
                                 f"{_promoted(f, args, state, new)}", op=op)
        state = new
        outputs.append(state)
    if not scan:
        return state
    if right:
        outputs.reverse()
    return _assemble(outputs) if outputs else _empty(_structure(init))


def _call(op: str, f, args: tuple):
    """Call the user function on its own copies of the tensor elements (`x += 1` inside it changes
    its x only, never the caller's list, as when traced); a numpy error inside it is reported at
    the user's line."""
    args = tuple(pytree.map(_own_copy, a) for a in args)
    try:
        return unzip(f(*args))
    except (ValueError, IndexError) as exc:
        if "read-only" in str(exc):  # a write into an element of a list passed whole (depth > 1)
            raise InPlaceError(f"the user function writes into an element of a list ({exc}): a program never "
                               "changes its inputs; build a new value (x = x + 1, ft.concat) instead",
                               op=op, where=errors.user_location(exc.__traceback__)) from None
        raise (diagnose.shape_error(f, args) or errors.reraise_from_user_code(op, exc)) from exc


def _promoted(f, args, state, new) -> str:
    """For a state whose dtype changed (a float64 weight in a float32 scan): "; " and the operation
    that changed it, found by tracing f on the same values (diagnose.promotion); else ""."""
    pairs = [(a.dtype, b.dtype) for a, b in zip(pytree.leaves(_structure(state)), pytree.leaves(_structure(new)))
             if a.dtype != b.dtype]
    hint = diagnose.promotion(f, args, *pairs[0]) if pairs else ""
    return f"; {hint}" if hint else ""


def _own_copy(x):
    return x.copy() if isinstance(x, np.ndarray) else x


# -- values: types, descriptions, assembly ---------------------------------------------------
@dataclass(frozen=True)
class _Leaf:
    """The type of one leaf of a value, lengths ignored (depth 0: a tensor)."""

    depth: int
    shape: tuple
    dtype: str


def _leaf_type(x) -> _Leaf | None:
    if isinstance(x, (np.ndarray, np.generic)):
        return _Leaf(0, x.shape, x.dtype.name) if x.dtype.name in DTYPES else None
    if isinstance(x, FractalTensor):
        return _Leaf(x.depth, x.element_shape, x.dtype)
    return None


def _structure(value):
    """A hashable key of value's type (a pytree of `_Leaf`s); None if value is not a valid result."""
    key = pytree.map(_leaf_type, value)
    return None if None in pytree.leaves(key) else key


def _describe(value) -> str:
    return pytree.describe(value, _describe_leaf)


def _describe_leaf(x) -> str:
    if isinstance(x, (np.ndarray, np.generic)):
        return str(FTType((), x.shape, x.dtype.name))
    if isinstance(x, ListBase):
        return repr(x)
    return f"a Python {type(x).__name__}"


def _result_key(op: str, value):
    key = _structure(value)
    if key is None:
        raise ReturnTypeError(f"the function must return {_VALUE_KINDS} (dtype one of "
                              f"{', '.join(DTYPES)}), not {_describe(value)}", op=op)
    return key


def _state_key(op: str, value, what: str):
    key = _structure(value)
    if key is None:
        hint = " (make a constant with ft.zeros(shape) or ft.full(shape, value))" \
            if isinstance(value, (int, float)) else ""
        raise StateTypeError(f"{what} must be {_VALUE_KINDS}, not {_describe(value)}{hint}", op=op)
    return key


def _assemble(results: list):
    """Stack per-element results into lists; tuples of results become tuples of lists (unzip)."""
    return pytree.map(_stack, *results)


def _stack(*items):
    first = items[0]
    if isinstance(first, FractalTensor):
        return FractalTensor(list(items), first.depth + 1, first.element_shape, first.dtype)
    return FractalTensor([np.asarray(r) for r in items], 1, first.shape, first.dtype.name)


def _empty(key):
    """The empty list (or tuple of them) whose elements would have the type `key`."""
    return pytree.map(lambda leaf: FractalTensor([], leaf.depth + 1, leaf.shape, leaf.dtype), key)


def _zero_list(xs):
    """A list of length 1 at every level, of zeros, shaped like xs: stands in for an empty list's elements."""
    if isinstance(xs, Zip):
        return Zip([_zero_list(c) for c in xs.components], xs.depth)
    return FractalTensor.zeros((1,) * xs.depth, xs.element_shape, xs.dtype)
