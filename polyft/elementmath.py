"""Element math: functions on static-shape tensors inside user functions (`ft.tanh`, `ft.softmax`, ...).

Every function checks static shapes before computing, so a mismatch names the function and
the shapes instead of surfacing from deep inside numpy. On the tracer's values the same call
is recorded as an operation node (`tracing.apply_op`), so user code is written once.
"""
from __future__ import annotations

import numpy as np

from .errors import DepthError, ShapeError
from .fractaltensor import FractalTensor, ListBase, check_dtype, is_traced


def _fmt(shape) -> str:
    return f"[{', '.join(str(n) for n in shape)}]"


def _shape(name: str, x) -> tuple:
    """The static shape of a tensor argument; lists are rejected (their elements are the tensors)."""
    if isinstance(x, ListBase):
        raise DepthError(f"works on static-shape tensors, got the list {x!r}; apply it to each "
                         "element with ft.map", op=name)
    return np.shape(x)


def _traced(name: str, args: tuple, attrs: dict):
    from . import tracing
    return tracing.apply_op(name, args, attrs)


def broadcast_shape(name: str, a: tuple, b: tuple) -> tuple:
    """numpy's broadcasting rule, as a ShapeError naming both shapes."""
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        raise ShapeError(f"cannot broadcast {_fmt(a)} with {_fmt(b)}", op=name) from None


def matmul_shape(a: tuple, b: tuple) -> tuple:
    """numpy.matmul's shape rule (1-D operands promoted, batch dims broadcast) as a ShapeError."""
    if not a or not b:
        raise ShapeError(f"operands must have at least 1 dim, got {_fmt(a)} @ {_fmt(b)}; use * for scalars",
                         op="matmul")
    a2 = a if len(a) > 1 else (1,) + a
    b2 = b if len(b) > 1 else b + (1,)
    if a2[-1] != b2[-2]:
        raise ShapeError(f"inner dims differ: {_fmt(a)} @ {_fmt(b)}", op="matmul")
    rows = (a2[-2],) if len(a) > 1 else ()
    cols = (b2[-1],) if len(b) > 1 else ()
    return broadcast_shape("matmul", a2[:-2], b2[:-2]) + rows + cols


def normalize_axis(name: str, shape: tuple, axis) -> tuple:
    """The axes named by axis (None: all), each checked against the tensor's rank."""
    axes = range(len(shape)) if axis is None else np.atleast_1d(axis).tolist()
    for ax in axes:
        if not -len(shape) <= ax < len(shape):
            raise ShapeError(f"axis {ax} is out of range for a tensor of shape {_fmt(shape)}", op=name)
    return tuple(ax % len(shape) for ax in axes)


# -- elementwise ---------------------------------------------------------------------------
def _unary(name: str, fn, x):
    if is_traced(x):
        return _traced(name, (x,), {})
    _shape(name, x)
    return fn(x)


def tanh(x):
    return _unary("tanh", np.tanh, x)


def sigmoid(x):
    """Computed as 0.5 * (1 + tanh(x / 2)), which cannot overflow."""
    return _unary("sigmoid", lambda v: 0.5 * (1 + np.tanh(0.5 * v)), x)


def exp(x):
    return _unary("exp", np.exp, x)


def log(x):
    return _unary("log", np.log, x)


def sqrt(x):
    return _unary("sqrt", np.sqrt, x)


def relu(x):
    return _unary("relu", lambda v: np.maximum(v, 0), x)


def _binary(name: str, fn, a, b):
    if is_traced(a) or is_traced(b):
        return _traced(name, (a, b), {})
    broadcast_shape(name, _shape(name, a), _shape(name, b))
    return fn(a, b)


def maximum(a, b):
    return _binary("maximum", np.maximum, a, b)


def minimum(a, b):
    return _binary("minimum", np.minimum, a, b)


# -- reductions ----------------------------------------------------------------------------
def _reduction(name: str, fn, x, axis, keepdims: bool):
    if is_traced(x):
        return _traced(name, (x,), {"axis": axis, "keepdims": keepdims})
    normalize_axis(name, _shape(name, x), axis)
    return fn(x, axis=axis, keepdims=keepdims)


def max(x, axis=None, keepdims: bool = False):
    return _reduction("max", np.max, x, axis, keepdims)


def sum(x, axis=None, keepdims: bool = False):
    return _reduction("sum", np.sum, x, axis, keepdims)


def mean(x, axis=None, keepdims: bool = False):
    return _reduction("mean", np.mean, x, axis, keepdims)


def softmax(x, axis: int = -1):
    """exp(x) / sum(exp(x)) along axis, shifted by the max for stability."""
    if is_traced(x):
        return _traced("softmax", (x,), {"axis": axis})
    normalize_axis("softmax", _shape("softmax", x), axis)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


# -- shape ---------------------------------------------------------------------------------
def concat(xs, axis: int = 0):
    """Join tensors (a tuple/list of them, or a depth-1 list) along an existing axis."""
    parts = tuple(xs) if isinstance(xs, (tuple, list)) else (xs,)
    if any(is_traced(p) for p in parts):
        return _traced("concat", parts, {"axis": axis})
    if isinstance(xs, FractalTensor) and xs.depth == 1:
        parts = tuple(xs)
    shapes = [_shape("concat", p) for p in parts]
    if not shapes:
        raise ShapeError("needs at least one tensor", op="concat")
    (ax,) = normalize_axis("concat", shapes[0], axis)
    rest = {s[:ax] + s[ax + 1:] if len(s) == len(shapes[0]) else None for s in shapes}
    if len(rest) > 1:
        raise ShapeError(f"shapes {', '.join(_fmt(s) for s in shapes)} differ off axis {axis}", op="concat")
    return np.concatenate(parts, axis=ax)


def matmul(a, b):
    if is_traced(a) or is_traced(b):
        return _traced("matmul", (a, b), {})
    matmul_shape(_shape("matmul", a), _shape("matmul", b))
    return np.matmul(a, b)


def transpose(x):
    """Reverse the axes, as numpy's `x.T`."""
    return _unary("transpose", np.transpose, x)


# -- constants -----------------------------------------------------------------------------
def zeros(shape, dtype: str = "float32"):
    return np.zeros(shape, check_dtype(dtype, "zeros"))


def ones(shape, dtype: str = "float32"):
    return np.ones(shape, check_dtype(dtype, "ones"))


def full(shape, value, dtype: str = "float32"):
    return np.full(shape, value, check_dtype(dtype, "full"))


def zeros_like(x):
    return _unary("zeros_like", np.zeros_like, x)
