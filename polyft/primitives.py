"""The operator table: every element operation an operation node can hold, at the bottom of the language.

One `Primitive` per name, after JAX's `core.Primitive`: its numpy implementation (eager
element math, constant folding, the ETDG interpreter, and the tracer's shape inference, which
runs it on stand-ins), its static shape rule (a `ShapeError` naming the operation and the
shapes, the same eagerly and under tracing), and whether its operands come as one sequence
(`concat`). `elementmath` (`ft.tanh`, ...), Python's operators on traced values, `tracing`
and `interpret` look operations up here, so what an operation computes is written once.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .errors import DTypeError, IndexRangeError, ShapeError


def fmt_shape(shape) -> str:
    return f"[{', '.join(str(n) for n in shape)}]"


# -- shape rules -----------------------------------------------------------------------------
def broadcast_shape(name: str, a: tuple, b: tuple) -> tuple:
    """numpy's broadcasting rule, as a ShapeError naming both shapes."""
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        raise ShapeError(f"cannot broadcast {fmt_shape(a)} with {fmt_shape(b)}", op=name) from None


def matmul_shape(a: tuple, b: tuple) -> tuple:
    """numpy.matmul's shape rule (1-D operands promoted, batch dims broadcast) as a ShapeError."""
    if not a or not b:
        raise ShapeError(f"operands must have at least 1 dim, got {fmt_shape(a)} @ {fmt_shape(b)}; "
                         "use * for scalars", op="matmul")
    a2 = a if len(a) > 1 else (1,) + a
    b2 = b if len(b) > 1 else b + (1,)
    if a2[-1] != b2[-2]:
        raise ShapeError(f"inner dims differ: {fmt_shape(a)} @ {fmt_shape(b)}", op="matmul")
    rows = (a2[-2],) if len(a) > 1 else ()
    cols = (b2[-1],) if len(b) > 1 else ()
    return broadcast_shape("matmul", a2[:-2], b2[:-2]) + rows + cols


def normalize_axis(name: str, shape: tuple, axis) -> tuple:
    """The axes named by axis (None: all), each checked against the tensor's rank."""
    axes = range(len(shape)) if axis is None else np.atleast_1d(axis).tolist()
    for ax in axes:
        if not -len(shape) <= ax < len(shape):
            raise ShapeError(f"axis {ax} is out of range for a tensor of shape {fmt_shape(shape)}", op=name)
    return tuple(ax % len(shape) for ax in axes)


def _broadcast_rule(name, shapes):
    broadcast_shape(name, *shapes)


def _matmul_rule(name, shapes):
    matmul_shape(*shapes)


def _axis_rule(name, shapes, axis=None, keepdims=False):
    normalize_axis(name, shapes[0], axis)


def _where_rule(name, shapes):
    """where(mask, a, b): the three shapes broadcast together, as numpy's."""
    broadcast_shape(name, broadcast_shape(name, shapes[0], shapes[1]), shapes[2])


def _scatter_rule(name, shapes, n, combine="sum"):
    """scatter_add(x, ids, n): x [L, ...] and ids [L]; `combine` sum or max."""
    x, ids = shapes
    if not x or ids != x[:1]:
        raise ShapeError(f"needs x [L, ...] and ids [L], got x {fmt_shape(x)} and ids {fmt_shape(ids)}", op=name)
    if combine not in ("sum", "max") or int(n) < 0:
        raise ShapeError(f"combine must be 'sum' or 'max' and n >= 0, got {combine!r} and {n}", op=name)


def _concat_rule(name, shapes, axis=0):
    if not shapes:
        raise ShapeError("needs at least one tensor", op=name)
    (ax,) = normalize_axis(name, shapes[0], axis)
    rest = {s[:ax] + s[ax + 1:] if len(s) == len(shapes[0]) else None for s in shapes}
    if len(rest) > 1:
        raise ShapeError(f"shapes {', '.join(fmt_shape(s) for s in shapes)} differ off axis {axis}", op=name)


# -- the table -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Primitive:
    """One element operation: `impl(*operands, **attrs)` on numpy values (`impl(operands, **attrs)`
    when `variadic`), after `rule(name, operand shapes, **attrs)` has checked the shapes (None:
    numpy's own errors, as Python's operators on arrays give them)."""

    name: str
    impl: Callable
    rule: Callable | None = None
    variadic: bool = False

    def check(self, operands, attrs: dict) -> None:
        if self.rule is not None:
            self.rule(self.name, [np.shape(x) for x in operands], **attrs)

    def apply(self, operands, attrs: dict):
        """The operation on numpy operands (arrays or Python numbers), shapes checked first."""
        self.check(operands, attrs)
        return self.impl(list(operands), **attrs) if self.variadic else self.impl(*operands, **attrs)


def _sigmoid(x):
    """1 / (1 + e^-x) for x >= 0, else e^x / (1 + e^x): e^-|x| never overflows, and the negative
    tail is e^x's, not 0 (log(sigmoid(-20)) is -20 in float32); the compiled code computes the same."""
    with np.errstate(under="ignore"):  # e^-|x| reaching 0 (or a subnormal) is the answer, not a fault
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1, e) / (1 + e)


def _softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along axis, shifted by the max for stability."""
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _logsumexp(x, axis=None, keepdims=False):
    """log(sum(exp(x))) over axis, shifted by the max where it is finite (scipy's rule: all -inf
    gives -inf, a +inf gives +inf, a NaN gives NaN)."""
    x = np.asarray(x)
    m = np.max(x, axis=axis, keepdims=True)
    shift = np.where(np.isfinite(m), m, 0).astype(m.dtype)
    with np.errstate(divide="ignore"):  # log(0) = -inf, numpy's meaning for an all -inf row
        out = np.log(np.sum(np.exp(x - shift), axis=axis, keepdims=True)) + shift
    return out if keepdims else np.squeeze(out, axis=axis)


def _scatter_add(x, ids, n, combine="sum"):
    """Rows of x added (or maxed) into row ids[q] of n rows: numpy's add.at / maximum.at, from 0
    for sum and from the lowest value (-inf) for max, so a row no id names is 0 or -inf."""
    x, ids = np.asarray(x), np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise DTypeError(f"ids must be integers, got {ids.dtype}", op="scatter_add")
    bad = np.flatnonzero((ids < 0) | (ids >= n))
    if bad.size:
        raise IndexRangeError(f"id {ids[bad[0]]} at {bad[0]} is outside [0, {n}) of the rows it writes",
                              op="scatter_add")
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    out = np.full((int(n),) + x.shape[1:], 0 if combine == "sum" else low, x.dtype)
    (np.add if combine == "sum" else np.maximum).at(out, ids, x)
    return out


def _mask(ufunc):
    """A comparison or logical operation as a 0/1 tensor of the operands' dtype (numpy's promotion:
    float32 > 0 is a float32 mask), the form compiled code computes it in (it has no bool type);
    numpy's own NaN rule (NaN compares false, except `!=`)."""
    def impl(*xs):
        return ufunc(*xs).astype(np.result_type(*xs))
    impl.__name__ = ufunc.__name__
    return impl


def _in_float64(f):
    """An element function numpy lacks, computed per element in float64 by Python's math module
    and rounded once to the operand's dtype (the reference the targets' libm calls are held to)."""
    vec = np.frompyfunc(f, 1, 1)

    def impl(x):
        x = np.asarray(x)
        dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
        with np.errstate(invalid="ignore"):  # a NaN operand is a NaN result, as numpy's own functions
            return np.asarray(vec(x.astype(np.float64)), np.float64).astype(dtype)
    return impl


def _gelu(x: float) -> float:
    """GELU, the erf form x * Phi(x), as 0.5 * x * erfc(-x / sqrt 2): no cancellation for x < 0;
    below -40 (-inf too, where the product would be NaN) it is -0, the float64 value's underflow."""
    return -0.0 if x < -40 else 0.5 * x * math.erfc(-x * 0.7071067811865476)


PRIMITIVES = {p.name: p for p in (
    # Python's operators (on traced values: `tracing.Value`'s dunder methods)
    Primitive("add", operator.add),
    Primitive("sub", operator.sub),
    Primitive("mul", operator.mul),
    Primitive("truediv", operator.truediv),
    Primitive("neg", operator.neg),
    Primitive("pow", np.power, _broadcast_rule),  # `x ** p`; numpy's promotion (float32 ** 2 stays float32)
    Primitive("abs", np.abs),  # `abs(x)`
    Primitive("matmul", np.matmul, _matmul_rule),
    Primitive("getitem", lambda x, key: x[key]),  # a static key: see `getitem_axes`
    Primitive("transpose", lambda x: np.swapaxes(x, -1, -2)),  # `x.T` of the 2-D tiles
    Primitive("permute", lambda x, axes: np.transpose(x, axes)),  # any other order (`permutation` checks it)
    Primitive("reshape", lambda x, shape: np.reshape(x, shape)),  # shape resolved by `reshaped`
    Primitive("copy", np.copy),  # the tracer's copy of a view into a fresh buffer
    Primitive("astype", lambda x, dtype: np.asarray(x).astype(dtype)),  # `x.astype(d)`; matmul's operands
    # element math (`ft.tanh`, ...)
    Primitive("tanh", np.tanh),
    Primitive("sigmoid", _sigmoid),
    Primitive("exp", np.exp),
    Primitive("log", np.log),
    Primitive("sqrt", np.sqrt),
    Primitive("log1p", np.log1p),  # log(1 + x), exact near 0
    Primitive("softplus", lambda x: np.logaddexp(0, x)),  # log(1 + e^x), without overflow
    Primitive("sin", np.sin),
    Primitive("cos", np.cos),
    Primitive("tan", np.tan),
    Primitive("erf", _in_float64(math.erf)),
    Primitive("gelu", _in_float64(_gelu)),  # the erf form (not the tanh approximation)
    Primitive("rsqrt", lambda x: 1 / np.sqrt(x)),  # 1 / sqrt(x), two roundings, as the targets compute it
    Primitive("sign", np.sign),  # numpy's: sign(NaN) is NaN, sign(-0) is +0
    Primitive("floor", np.floor),
    # comparisons and logic on traced values: 0/1 masks (`_mask`)
    Primitive("greater", _mask(np.greater), _broadcast_rule),
    Primitive("less", _mask(np.less), _broadcast_rule),
    Primitive("greater_equal", _mask(np.greater_equal), _broadcast_rule),
    Primitive("less_equal", _mask(np.less_equal), _broadcast_rule),
    Primitive("equal", _mask(np.equal), _broadcast_rule),
    Primitive("not_equal", _mask(np.not_equal), _broadcast_rule),
    Primitive("logical_and", _mask(np.logical_and), _broadcast_rule),
    Primitive("logical_or", _mask(np.logical_or), _broadcast_rule),
    Primitive("logical_xor", _mask(np.logical_xor), _broadcast_rule),
    Primitive("logical_not", _mask(np.logical_not)),
    Primitive("where", np.where, _where_rule),  # where(mask, a, b): a where mask is nonzero (NaN too)
    Primitive("relu", lambda x: np.maximum(x, 0)),
    Primitive("zeros_like", np.zeros_like),
    Primitive("maximum", np.maximum, _broadcast_rule),
    Primitive("minimum", np.minimum, _broadcast_rule),
    Primitive("max", np.max, _axis_rule),
    Primitive("sum", np.sum, _axis_rule),
    Primitive("mean", np.mean, _axis_rule),
    Primitive("softmax", _softmax, _axis_rule),
    Primitive("logsumexp", _logsumexp, _axis_rule),
    Primitive("scatter_add", _scatter_add, _scatter_rule),  # index_add: the dual of gather
    Primitive("concat", lambda xs, axis=0: np.concatenate(xs, axis=axis), _concat_rule, variadic=True),
)}


def permutation(name: str, shape: tuple, axes) -> tuple:
    """numpy's order of axes for a transpose of a `shape` tensor (axes None: all reversed, as `x.T`),
    checked to be a permutation."""
    if axes is None:
        return tuple(range(len(shape)))[::-1]
    perm = tuple(normalize_axis(name, shape, a)[0] for a in axes)
    if sorted(perm) != list(range(len(shape))):
        raise ShapeError(f"axes {list(axes)} are not a permutation of the {len(shape)} axes of a {fmt_shape(shape)} "
                         "tensor", op=name)
    return perm


def reshaped(name: str, shape: tuple, new) -> tuple:
    """numpy's reshape of a `shape` tensor into `new` (one -1 inferred), as a concrete shape; a
    ShapeError naming both shapes where the element counts differ."""
    new = tuple(int(n) for n in (new if isinstance(new, (tuple, list)) else (new,)))
    count = int(np.prod(shape))
    known = int(np.prod([n for n in new if n != -1]))
    if new.count(-1) > 1 or any(n < -1 for n in new):
        raise ShapeError(f"cannot reshape {fmt_shape(shape)} into {fmt_shape(new)}: one -1 at most, no other "
                         "negative size", op=name)
    if -1 in new and known and count % known == 0:
        new = tuple(count // known if n == -1 else n for n in new)
    if -1 in new or int(np.prod(new)) != count:
        raise ShapeError(f"cannot reshape {fmt_shape(shape)} ({count} elements) into {fmt_shape(new)}"
                         f"{'' if -1 in new else f' ({int(np.prod(new))} elements)'}", op=name)
    return new


def squeezed(shape: tuple, axis) -> tuple:
    """The shape without the size-1 axes named (None: all of them); a ShapeError for another size."""
    axes = tuple(d for d, n in enumerate(shape) if n == 1) if axis is None else normalize_axis("squeeze", shape, axis)
    for d in axes:
        if shape[d] != 1:
            raise ShapeError(f"axis {d} of {fmt_shape(shape)} has size {shape[d]}, not 1", op="squeeze")
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def unsqueezed(shape: tuple, axis) -> tuple:
    """The shape with size-1 axes at `axis` (positions in the result, numpy's expand_dims)."""
    rank = len(shape) + len(np.atleast_1d(axis))
    axes = set(normalize_axis("unsqueeze", (1,) * rank, axis))
    rest = iter(shape)
    return tuple(1 if d in axes else next(rest) for d in range(rank))


def newaxis_shape(key, shape: tuple):
    """For a static `x[key]` with None (numpy's newaxis) in it: (the key without them, the result's
    shape), since the Nones only add size-1 axes; None when the key has no None."""
    items = key if isinstance(key, tuple) else (key,)
    if not any(k is None for k in items):
        return None
    out = np.broadcast_to(np.zeros((), np.int8), shape)[key].shape  # numpy's own rule, nothing allocated
    return tuple(k for k in items if k is not None), out


def getitem_axes(key, shape) -> list | None:
    """How a static `x[key]` (ints and slices) reads x of `shape`: per axis of x, `(start, step,
    out_axis)`, x's coordinate being `start + step * out[out_axis]`; an int has step 0 and
    out_axis None. None when the key holds anything else (an array, None, Ellipsis)."""
    key = key if isinstance(key, tuple) else (key,)
    axes, out_axis = [], 0
    for d, n in enumerate(shape):
        item = key[d] if d < len(key) else slice(None)
        if isinstance(item, (int, np.integer)):
            axes.append((int(item) % n, 0, None))
        elif isinstance(item, slice):
            start, _, step = item.indices(n)
            axes.append((start, step, out_axis))
            out_axis += 1
        else:
            return None
    return axes
