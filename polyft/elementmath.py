"""Element math: functions on static-shape tensors inside user functions (`ft.tanh`, `ft.softmax`, ...).

Each function is an entry of the operator table (`primitives.PRIMITIVES`): on numpy values it
checks the static shapes by the entry's rule, so that a mismatch names the function and the
shapes instead of surfacing from deep inside numpy, then computes; on the tracer's values the
same call is recorded as an operation node (`tracing.apply_op`), so user code is written once.
"""
from __future__ import annotations

import numpy as np

from . import recording, tracing
from .errors import DepthError, ShapeError
from .fractaltensor import FractalTensor, ListBase, check_dtype, describe_operand, is_traced
from .primitives import PRIMITIVES, fmt_shape, normalize_axis, permutation, reshaped, squeezed, unsqueezed


def _bind(name: str, args: tuple, attrs: dict):
    """The operation `name` on args: recorded if any is traced, else checked and computed."""
    if any(getattr(a, "_ad", False) for a in args):  # a value being differentiated (ft.vjp)
        return recording.HANDLERS["bind"](name, args, attrs)
    if any(is_traced(a) for a in args):
        return tracing.apply_op(name, args, attrs)
    for a in args:
        _shape(a, name)
    return PRIMITIVES[name].apply(args, attrs)


def _shape(x, name: str) -> tuple:
    """The static shape of a tensor operand; a list's elements are the tensors (a DepthError)."""
    if isinstance(x, ListBase):
        raise DepthError(f"works on static-shape tensors, got {describe_operand(x)}; apply it to each "
                         "element with ft.map", op=name)
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


# -- elementwise ---------------------------------------------------------------------------
def tanh(x):
    return _bind("tanh", (x,), {})


def sigmoid(x):
    """Computed as 0.5 * (1 + tanh(x / 2)), which cannot overflow."""
    return _bind("sigmoid", (x,), {})


def exp(x):
    return _bind("exp", (x,), {})


def log(x):
    return _bind("log", (x,), {})


def sqrt(x):
    return _bind("sqrt", (x,), {})


def log1p(x):
    """log(1 + x), exact for x near 0 (where log(1 + x) rounds 1 + x first)."""
    return _bind("log1p", (x,), {})


def softplus(x):
    """log(1 + exp(x)) as numpy's logaddexp(0, x): no overflow for large x."""
    return _bind("softplus", (x,), {})


def sin(x):
    return _bind("sin", (x,), {})


def cos(x):
    return _bind("cos", (x,), {})


def tan(x):
    return _bind("tan", (x,), {})


def erf(x):
    """The error function (numpy has none: computed in float64 and rounded to x's dtype)."""
    return _bind("erf", (x,), {})


def gelu(x):
    """GELU in its exact (erf) form, x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt 2)), not the tanh
    approximation; computed as 0.5 * x * erfc(-x / sqrt 2) in float64, accurate for x < 0 too."""
    return _bind("gelu", (x,), {})


def rsqrt(x):
    """1 / sqrt(x) (rsqrt(0) is inf, rsqrt(-0) is -inf, as numpy's 1 / np.sqrt(x))."""
    return _bind("rsqrt", (x,), {})


def sign(x):
    """numpy's sign: -1, 0 or 1 (NaN stays NaN, -0 gives 0)."""
    return _bind("sign", (x,), {})


def floor(x):
    return _bind("floor", (x,), {})


def clip(x, lo=None, hi=None):
    """numpy's clip: minimum(maximum(x, lo), hi) (so hi wins where lo > hi; a NaN x stays NaN);
    None leaves that side open."""
    if lo is None and hi is None:
        raise ShapeError("needs lo or hi (or both); clip(x, None, None) would clip nothing", op="clip")
    out = x if lo is None else maximum(x, lo)
    return out if hi is None else minimum(out, hi)


def logical_and(a, b):
    """a and b, nonzero meaning true: a 0/1 mask (numpy's bool eagerly on bool masks)."""
    return _bind("logical_and", (a, b), {})


def logical_or(a, b):
    return _bind("logical_or", (a, b), {})


def logical_xor(a, b):
    return _bind("logical_xor", (a, b), {})


def logical_not(x):
    return _bind("logical_not", (x,), {})


def abs(x):
    """|x| (numpy's abs; `abs(x)` on a traced value is the same)."""
    return _bind("abs", (x,), {})


def pow(x, p):
    """x ** p elementwise (numpy's power, with its broadcasting and promotion)."""
    return _bind("pow", (x, p), {})


def where(mask, a, b):
    """numpy's where: `a` where mask is nonzero (NaN counts as nonzero), else `b`, all three
    broadcast; the mask is a numeric tensor (compiled code has no bool type)."""
    return _bind("where", (mask, a, b), {})


def relu(x):
    return _bind("relu", (x,), {})


def maximum(a, b):
    return _bind("maximum", (a, b), {})


def minimum(a, b):
    return _bind("minimum", (a, b), {})


# -- reductions ----------------------------------------------------------------------------
def max(x, axis=None, keepdims: bool = False):
    return _bind("max", (x,), {"axis": axis, "keepdims": keepdims})


def sum(x, axis=None, keepdims: bool = False):
    return _bind("sum", (x,), {"axis": axis, "keepdims": keepdims})


def mean(x, axis=None, keepdims: bool = False):
    return _bind("mean", (x,), {"axis": axis, "keepdims": keepdims})


def var(x, axis=None, keepdims: bool = False, ddof: int = 0):
    """numpy's var: the mean of |x - mean(x)|^2 over axis (divided by n - ddof), as numpy computes it."""
    d = x - mean(x, axis=axis, keepdims=True)
    n = int(np.prod([_shape(x, "var")[a] for a in normalize_axis("var", _shape(x, "var"), axis)]))
    return sum(d * d, axis=axis, keepdims=keepdims) / float(n - ddof)


def logsumexp(x, axis=None, keepdims: bool = False):
    """log(sum(exp(x))) along axis, shifted by the max where it is finite (scipy's semantics)."""
    return _bind("logsumexp", (x,), {"axis": axis, "keepdims": keepdims})


def softmax(x, axis: int = -1):
    """exp(x) / sum(exp(x)) along axis, shifted by the max for stability."""
    return _bind("softmax", (x,), {"axis": axis})


def scatter_add(x, ids, n: int, combine: str = "sum"):
    """The dual of gather (index_add): `out[ids[q]] += x[q]` over the rows q of x, into n rows
    from 0 (combine="max": the max, from -inf; a row no id names stays 0 / -inf). Compiled, the
    ids must be read from a program input (each call checks them against n first) or be constants."""
    if is_traced(ids) and isinstance(ids, tracing.Value):
        tracing.check_ids_at_call(ids, int(n), f"the {int(n)} rows scatter_add writes", "scatter_add")
    return _bind("scatter_add", (x, ids), {"n": int(n), "combine": combine})


index_add = scatter_add


# -- shape ---------------------------------------------------------------------------------
def concat(xs, axis: int = 0):
    """Join tensors (a tuple/list of them, or a depth-1 list) along an existing axis."""
    parts = tuple(xs) if isinstance(xs, (tuple, list)) else (xs,)
    if isinstance(xs, FractalTensor) and xs.depth == 1:
        parts = tuple(xs)
    return _bind("concat", parts, {"axis": axis})


def stack(xs, axis: int = 0):
    """numpy's stack: tensors of one shape joined along a new axis (a tuple/list, or a depth-1 list)."""
    parts = tuple(xs) if isinstance(xs, (tuple, list)) or (isinstance(xs, ListBase) and xs.depth == 1) else (xs,)
    if not parts:
        raise ShapeError("needs at least one tensor", op="stack")
    shapes = {_shape(x, "stack") for x in parts}
    if len(shapes) > 1:
        raise ShapeError(f"all tensors must have one shape, got {', '.join(fmt_shape(s) for s in shapes)}", op="stack")
    (ax,) = normalize_axis("stack", (1,) * (len(next(iter(shapes))) + 1), axis)
    return concat(tuple(unsqueeze(x, ax) for x in parts), axis=ax)


def matmul(a, b):
    return _bind("matmul", (a, b), {})


def transpose(x, axes=None):
    """On a tensor: without axes, swap the last two axes (each 2-D tile of x transposed; numpy's
    `x.T` for a 2-D x); with axes, numpy's `np.transpose(x, axes)`. `x.T` is numpy's: every axis
    reversed. On a list (a FractalTensor, traced or not): its list dims, not its elements' — without
    axes the outer two swapped (`[I, J] -> [J, I]`), with axes the outer len(axes) in that order; a
    view, as the other access operators (no copy)."""
    if isinstance(x, ListBase):
        return _permute_lists(x, axes)
    if axes is None:
        return _bind("transpose", (x,), {})
    if isinstance(x, tracing.Value):
        return x.transpose(axes)
    perm = permutation("transpose", _shape(x, "transpose"), axes)
    if getattr(x, "_ad", False):  # recorded as the tracer records it: a swap of the last two is a transpose
        n = len(perm)
        if perm == tuple(range(n)):
            return x
        return _bind(*(("transpose", (x,), {}) if perm == tuple(range(n - 2)) + (n - 1, n - 2)
                       else ("permute", (x,), {"axes": perm})))
    return np.transpose(x, perm)


def _permute_lists(xs, axes):
    if xs.depth < 2 and axes is None:
        raise DepthError(f"swaps the two outer list dims of a list of depth >= 2, got {xs!r} (depth {xs.depth}); "
                         "ft.map(ft.transpose, xs) transposes its elements", op="transpose")
    perm = (1, 0) if axes is None else permutation("transpose", (0,) * len(tuple(axes)), axes)
    if len(perm) > xs.depth:
        raise DepthError(f"axes {list(axes)} name {len(perm)} list dims, but {xs!r} has {xs.depth}", op="transpose")
    return xs._permute_lists(perm)


def reshape(x, shape):
    """numpy's reshape (one -1 inferred); a ShapeError naming both shapes if the counts differ."""
    return _bind("reshape", (x,), {"shape": reshaped("reshape", _shape(x, "reshape"), shape)})


def squeeze(x, axis=None):
    """x without its size-1 axes (those named by axis; None: all), as a reshape."""
    return _bind("reshape", (x,), {"shape": squeezed(_shape(x, "squeeze"), axis)})


def unsqueeze(x, axis):
    """x with size-1 axes at `axis` (positions in the result: numpy's expand_dims), as a reshape."""
    return _bind("reshape", (x,), {"shape": unsqueezed(_shape(x, "unsqueeze"), axis)})


# -- constants -----------------------------------------------------------------------------
def zeros(shape, dtype: str = "float32"):
    return np.zeros(shape, check_dtype(dtype, "zeros"))


def ones(shape, dtype: str = "float32"):
    return np.ones(shape, check_dtype(dtype, "ones"))


def full(shape, value, dtype: str = "float32"):
    return np.full(shape, value, check_dtype(dtype, "full"))


def zeros_like(x):
    return _bind("zeros_like", (x,), {})
