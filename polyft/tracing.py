"""Tracing a FractalTensor program into an ETDG.

The user's function runs once on abstract values: `FTTracer` stands for a list (a view of a
buffer node through a piecewise quasi-affine access map) and `Value` for a static-shape tensor
element (an operation node). Every compute operator opens a block node with one iteration
dim and calls the user function once, symbolically, for all iterations; perfect nests are
merged into multi-dim block nodes afterwards. Access operators never copy: they rewrite the
view's access map.
"""
from __future__ import annotations

import ast
import collections
import contextlib
import inspect
import itertools
import math
import sys
import textwrap
import threading

import numpy as np

from . import errors, pytree
from .affine import Aff, Constraint, IterDim, Length, eq, ge
from .errors import (AccessError, DepthError, EmptyReduceError, IndexRangeError, InPlaceError, LengthMismatchError,
                     RaggedError, ReturnTypeError, StateTypeError, TracerControlFlowError, WindowError)
from .etdg import (ETDG, Assumption, BlockNode, Buffer, Captured, Gather, IndexCheck, OpNode, Piece,
                   drop_dead_ops, merge_perfect_nests, referenced, walk)
from .fractaltensor import (FractalTensor, ListBase, Zip, describe_operand, gather_indices, unzip,
                           window_args)
from .primitives import PRIMITIVES, newaxis_shape, permutation, reshaped
from .ragged import Ragged, RaggedInput, from_coordinates, lengths_of, ragged_length, to_coordinates
from .ragged import text as length_text
from .names import tuple_name
from .types import DTYPES, Spec

_DIM_LETTERS = "ijklmnpqrsuvw"
_RIGHT = ("foldr", "scanr")
_SCANS = ("scanl", "scanr")


class _TraceState:
    """The trace in progress: the open block and everything created so far."""

    def __init__(self):
        self.root = BlockNode([])
        self.block = self.root
        self.buffers: list[Buffer] = []
        self.n_buf = 0
        self.n_const = 0
        self.reemitted: dict = {}  # (Value, block, run) -> its reload in that statement
        self.materialized: dict = {}  # Value -> the buffer it was stored into
        self.assumptions: list = []  # etdg.Assumption: conditions on lengths the program relies on
        self.captured: dict = {}  # id -> etdg.Captured: the user's numpy arrays held as constants
        self.index_checks: list = []  # etdg.IndexCheck: ids given at call time, range-checked then
        self.const_buffers: dict = {}  # id of a constant array -> (its buffer, the array: kept alive)
        self.ragged: list = []  # ragged.RaggedInput: inputs whose last level's lengths are given at call time

    def capture(self, a) -> None:
        """Remember a numpy array or FractalTensor of the user's the program holds as a constant."""
        if isinstance(a, (np.ndarray, FractalTensor)) and id(a) not in self.captured:
            self.captured[id(a)] = Captured.of(a, errors.user_location())

    def assume(self, expr: Length, op: str, kind: str = "ge", d: int = 1) -> None:
        """Record that the program needs `expr >= 0` (or d | expr) for its symbolic lengths."""
        self.assumptions.append(Assumption(expr, kind, d, f"{op} at {errors.user_location()}"))

    def new_buffer(self, dims, shape, dtype, kind="intermediate", value=None, name=None, created_in=(), order=()):
        """`created_in`: the dims of the context in which the buffer is one list value; `order`: the
        dims/placeholders its coordinates stand for (where a ragged dim's lengths are read)."""
        dims = [to_coordinates(n, order) for n in dims]
        if name is None:
            if kind == "const":
                name = f"c{self.n_const}"
                self.n_const += 1
            else:
                name = f"t{self.n_buf}"
                self.n_buf += 1
        b = Buffer(name, dims, shape, dtype, kind, value, created_in)
        self.buffers.append(b)
        return b

    def emit(self, node: OpNode) -> OpNode:
        self.block.body.append(node)
        return node


_TRACING = threading.local()  # .state: this thread's trace in progress; threads trace independently


def tracing() -> bool:
    """Whether this thread is tracing a program."""
    return getattr(_TRACING, "state", None) is not None


def _state() -> _TraceState:
    st = getattr(_TRACING, "state", None)
    if st is None:
        raise errors.PolyftError("a traced value was used after its trace ended (or in another thread than its "
                                 "trace's)", op="trace")
    return st


# ---------------------------------------------------------------------------------------
# Element values


class Value:
    """A static-shape tensor inside a traced program: an operation node or a constant."""

    __array_priority__ = 1000
    __hash__ = object.__hash__  # by identity: `__eq__` records a comparison (a mask), it answers no question
    _traced = True

    def __init__(self, shape, dtype, node: OpNode | None = None, block=None, const=None):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = str(dtype)
        self.node = node
        self.block = block
        self.const = const

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def T(self):
        """numpy's `x.T`: every axis reversed (as the numpy element eagerly)."""
        return permute(self, permutation("x.T", self.shape, None), "x.T")

    def transpose(self, *axes):
        """numpy's `x.transpose(*axes)`; no axes: every axis reversed."""
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return permute(self, permutation("transpose", self.shape, axes or None), "transpose")

    def reshape(self, *shape):
        """numpy's `x.reshape(shape)` (one -1 inferred); compiled, the same elements in the same order."""
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return apply_op("reshape", (self,), {"shape": reshaped("reshape", self.shape, shape)})

    def flatten(self):
        """numpy's `x.flatten()`: a 1-D reshape (not the list operator `xss.flatten()`)."""
        return self.reshape(-1)

    def __repr__(self):
        return f"Value({self.dtype}{list(self.shape)})"

    def _binop(name, swap=False):
        def f(self, other):
            if getattr(other, "_ad", False) is True:  # a value being differentiated: its own operator records it
                return NotImplemented
            args = (other, self) if swap else (self, other)
            return apply_op(name, args, {})
        return f

    __add__, __radd__ = _binop("add"), _binop("add", True)
    __sub__, __rsub__ = _binop("sub"), _binop("sub", True)
    __mul__, __rmul__ = _binop("mul"), _binop("mul", True)
    __truediv__, __rtruediv__ = _binop("truediv"), _binop("truediv", True)
    __matmul__, __rmatmul__ = _binop("matmul"), _binop("matmul", True)
    __pow__, __rpow__ = _binop("pow"), _binop("pow", True)
    del _binop

    def __neg__(self):
        return apply_op("neg", (self,), {})

    def __abs__(self):
        return apply_op("abs", (self,), {})

    def astype(self, dtype):
        """The tile converted to `dtype` (numpy's `astype`)."""
        return apply_op("astype", (self,), {"dtype": np.dtype(dtype).name})

    def __getitem__(self, key):
        expand = newaxis_shape(key, self.shape)
        if expand is not None:  # x[None], x[:, None]: the rest of the key, then size-1 axes added
            return self[expand[0]].reshape(expand[1])
        return apply_op("getitem", (self,), {"key": key})

    def __setitem__(self, key, value):
        raise InPlaceError(f"`x[{_key_text(key)}] = ...` changes a traced {self.dtype}{list(self.shape)} value in "
                           "place; programs are functional: build the new value instead (ft.concat of slices, or "
                           "x * mask + value * (1 - mask) with a constant mask)", op="setitem")

    _compared = None  # a comparison's mask: (its symbol, its operands described), for the message below

    def _no_control_flow(self, *_):
        if self._compared is not None:
            symbol, a, b = self._compared
            raise TracerControlFlowError(
                f"`{symbol}` compares {a} with {b}: the result is a 0/1 mask known only when the program runs, "
                "so Python's if/while cannot branch on it; use ft.where(mask, a, b), multiply by the mask, "
                "or ft.maximum / ft.minimum", op="control flow")
        raise TracerControlFlowError(
            f"Python control flow on a traced {self.dtype}{list(self.shape)} value: its contents are known "
            "only when the program runs; use ft.where / ft.maximum / ft.relu / arithmetic instead of "
            "if/while/bool()", op="control flow")

    __bool__ = __int__ = __float__ = __index__ = __iter__ = _no_control_flow

    def _comparison(name, symbol):
        def f(self, other):
            if not isinstance(other, (Value, int, float, np.generic, np.ndarray)) or isinstance(other, bool):
                return NotImplemented  # `x == None`, `x == "a"`: Python's identity comparison
            mask = apply_op(name, (self, other), {})
            mask._compared = (symbol, describe_operand(self), describe_operand(other))
            return mask
        f.__name__ = name
        f.__doc__ = f"numpy's {name} as a 0/1 mask of the operands' dtype (compiled code has no bool type)."
        return f

    __lt__, __le__, __gt__, __ge__ = _comparison("less", "<"), _comparison("less_equal", "<="), \
        _comparison("greater", ">"), _comparison("greater_equal", ">=")
    __eq__, __ne__ = _comparison("equal", "=="), _comparison("not_equal", "!=")
    del _comparison

    def _logical(name, swap=False):
        def f(self, *other):
            if np.dtype(self.dtype).kind != "f" or any(isinstance(o, Value) and np.dtype(o.dtype).kind != "f"
                                                       for o in other):
                raise errors.DTypeError(f"`&`, `|`, `^` and `~` on traced values are logical operations on 0/1 "
                                        f"masks (a comparison's float result), not bitwise ones on "
                                        f"{describe_operand(self)}; use ft.{name} for a logical operation on "
                                        "integers", op=name)
            args = (other[0], self) if swap else (self,) + other
            return apply_op(name, args, {})
        return f

    __and__, __rand__ = _logical("logical_and"), _logical("logical_and", True)
    __or__, __ror__ = _logical("logical_or"), _logical("logical_or", True)
    __xor__, __rxor__ = _logical("logical_xor"), _logical("logical_xor", True)
    __invert__ = _logical("logical_not")
    del _logical

    def _reduction(name):
        def f(self, axis=None, keepdims=False):
            return apply_op(name, (self,), {"axis": axis, "keepdims": keepdims})
        f.__name__, f.__doc__ = name, f"numpy's `x.{name}(axis, keepdims)`, as `ft.{name}(x, axis, keepdims)`."
        return f

    sum, max, mean = _reduction("sum"), _reduction("max"), _reduction("mean")
    del _reduction

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """A numpy ufunc that is an operation of the table (`np.tanh(x)`, `np.add(x, y)`) is recorded
        as that operation, like `ft.tanh(x)`; any other numpy function cannot run on a traced value."""
        name = _UFUNCS.get(ufunc)
        if name is None or method != "__call__" or kwargs:
            how = (f".{method}" if method != "__call__" else "") + (f" with {', '.join(kwargs)}=" if kwargs else "")
            raise _numpy_error(ufunc.__name__, self, how)
        return apply_op(name, inputs, {})

    def __array_function__(self, func, types, args, kwargs):
        raise _numpy_error(func.__name__, self)

    def __array__(self, dtype=None, copy=None):  # np.asarray(x), np.array(x)
        raise _numpy_error("array", self)

    def __getattr__(self, name):
        """Only for names a tensor lacks: a list operator called on a tensor element is a depth error."""
        if name.startswith("_"):  # Python's and numpy's protocols (copy, pickle, __array__ ...)
            raise AttributeError(name)
        if hasattr(ListBase, name):
            raise DepthError(f"`.{name}` is a list operator, but this is a tensor element {self.dtype}"
                             f"{list(self.shape)} (depth 0), not a list: call it on the list itself, or map over "
                             "a deeper list whose elements are lists", op=name)
        raise AttributeError(f"a traced tensor {self.dtype}{list(self.shape)} has no attribute {name!r}")

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]


# numpy ufuncs that are exactly an operation of the table (`primitives.PRIMITIVES`)
_UFUNCS = {np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "truediv",
           np.negative: "neg", np.matmul: "matmul", np.tanh: "tanh", np.exp: "exp", np.log: "log",
           np.sqrt: "sqrt", np.maximum: "maximum", np.minimum: "minimum", np.power: "pow", np.absolute: "abs",
           np.log1p: "log1p", np.sin: "sin", np.cos: "cos", np.tan: "tan", np.sign: "sign", np.floor: "floor",
           np.greater: "greater", np.less: "less", np.greater_equal: "greater_equal", np.less_equal: "less_equal",
           np.equal: "equal", np.not_equal: "not_equal", np.logical_and: "logical_and", np.logical_or: "logical_or",
           np.logical_xor: "logical_xor", np.logical_not: "logical_not"}
# the table's operations that are Python operators or internal, not `ft.` functions
_NOT_FT = {"add", "sub", "mul", "truediv", "neg", "getitem", "copy", "astype", "permute", "greater", "less",
           "greater_equal", "less_equal", "equal", "not_equal"}
_FT_NAMES = {"amax": "max", "concatenate": "concat", "swapaxes": "transpose"}


def _numpy_error(func: str, value: Value, how: str = "") -> TracerControlFlowError:
    """numpy computes on arrays; a traced value's contents exist only when the program runs."""
    name = _FT_NAMES.get(func, func)
    hint = f"ft.{name}" if name in PRIMITIVES and name not in _NOT_FT else \
        "polyft's element math (ft.tanh, ft.exp, ft.maximum, ft.sum, ...) and + - * / @"
    return TracerControlFlowError(f"numpy's {func}{how} cannot compute on {describe_operand(value)}: its contents "
                                  f"are known only when the program runs; use {hint} instead", op=f"np.{func}")


def _key_text(key) -> str:
    """`:, 0:2` for the key (slice(None), slice(0, 2))."""
    def one(k):
        if isinstance(k, slice):
            return ":".join("" if v is None else str(v) for v in (k.start, k.stop)) + \
                (f":{k.step}" if k.step is not None else "")
        return "..." if k is Ellipsis else str(k)
    return ", ".join(one(k) for k in (key if isinstance(key, tuple) else (key,)))


def permute(x: Value, perm: tuple, op: str) -> Value:
    """`x` with its axes in the order `perm`: a swap of the last two is the batched 2-D transpose
    (the targets' blocked kernel, and what GEMMs read in place), any other order a permute."""
    n = len(perm)
    if perm == tuple(range(n)):
        return x
    if perm == tuple(range(n - 2)) + (n - 1, n - 2):
        return apply_op("transpose", (x,), {})
    return apply_op("permute", (x,), {"axes": tuple(perm)})


def _dummy(shape, dtype):
    """A stand-in for shape inference: ones, or zeros for integers (valid ids of scatter_add)."""
    return (np.zeros if np.issubdtype(np.dtype(dtype), np.integer) else np.ones)(shape, dtype=dtype)


def check_ids_at_call(ids: Value, bound: int, what: str, op: str) -> None:
    """Ids an operation indexes with (scatter_add's) must be read from a program input, which each
    call checks against `bound` before native code runs (etdg.IndexCheck); constants are checked now."""
    if ids.const is not None:
        bad = np.flatnonzero((ids.const < 0) | (ids.const >= bound))
        if bad.size:
            raise IndexRangeError(f"id {ids.const.ravel()[bad[0]]} at {bad[0]} is outside [0, {bound}) of {what}", op=op)
        return
    pieces = ids.node.pieces if ids.node.op == "load" else []
    buf = pieces[0].buffer.resolve() if len(pieces) == 1 and pieces[0].buffer is not None else None
    if buf is None or buf.kind != "input":
        raise AccessError(f"the ids {ids} must be read from a program input (checked on each call before the "
                          "program runs) or be a constant, not computed", op=op)
    _state().index_checks.append(IndexCheck(buf.name, Length.of(bound), what, errors.user_location(), op))


def apply_op(name: str, args, attrs) -> Value:
    """Record the element operation `name` (`primitives.PRIMITIVES`) on traced values; shapes are
    checked by running its numpy implementation on dummies."""
    prim = PRIMITIVES[name]
    if prim.variadic:
        args = _variadic_operands(name, args)
    vals = [a if isinstance(a, Value) else _const_value(a, name) for a in args]
    if all(v.const is not None for v in vals):  # constant folding
        with np.errstate(all="ignore"):
            out = np.asarray(prim.apply([v.const for v in vals], attrs))
        return Value(out.shape, out.dtype, const=out)
    with np.errstate(all="ignore"):
        # a Python number stays one, so that numpy's promotion is eager execution's (float16 * 0.5
        # is float16, not float32)
        dummies = [_dummy(v.shape, v.dtype) if v.const is None else
                   a if isinstance(a, (int, float)) and not isinstance(a, bool) else v.const
                   for v, a in zip(vals, args)]
        try:
            out = prim.apply(dummies, attrs)
        except errors.PolyftError:
            raise
        except (ValueError, IndexError, TypeError) as e:  # numpy's shape rules said no
            shapes = " and ".join(f"{v.dtype}{list(v.shape)}" for v in vals)
            raise errors.ShapeError(f"{name} of {shapes}: {e}", op=name) from None
    out = np.asarray(out)
    vals = _promoted(name, vals, args, out.dtype)
    st = _state()
    node = OpNode(name, [_use(v) for v in vals], out.shape, out.dtype.name, attrs,
                  where=errors.user_location())
    st.emit(node)
    return Value(out.shape, out.dtype.name, node, st.block)


def _promoted(name, vals, args, dtype) -> list:
    """The operands as the generated code computes them, by numpy's promotion (what eager
    execution does): a Python number takes the result's dtype (int32 + 1 stays exact), and
    a matmul's operands are cast to the result's dtype first (float32 @ float64 multiplies
    doubles), so the kernels never mix element types inside a product."""
    out = []
    for v, a in zip(vals, args):
        if v.const is not None and isinstance(a, (int, float)) and not isinstance(a, bool):
            v = Value((), dtype.name, const=np.asarray(a, dtype=dtype))
        elif name == "matmul" and v.dtype != dtype.name:
            v = Value(v.shape, dtype.name, const=v.const.astype(dtype)) if v.const is not None else \
                apply_op("astype", (v,), {"dtype": dtype.name})
        out.append(v)
    return out


def _variadic_operands(name, args):
    """A variadic operation's operands (concat's): given one by one, as one tuple or list, or
    as a traced list of concrete length."""
    xs = args[0] if len(args) == 1 and not isinstance(args[0], Value) else args
    if isinstance(xs, FTTracer):
        return [xs[i] for i in range(xs._concrete_len(name))]
    return list(xs)


def _const_value(x, op="trace") -> Value:
    if isinstance(x, (int, float, np.generic)) and not isinstance(x, bool):
        arr = np.asarray(x) if isinstance(x, np.generic) else np.asarray(x, dtype=np.float32)
        return Value((), arr.dtype.name, const=arr)
    if isinstance(x, np.ndarray):
        _traceable_dtype(x, f"the captured array {x.dtype}{list(x.shape)}")
        _state().capture(x)
        return Value(x.shape, x.dtype.name, const=x)
    if isinstance(x, ListBase):
        raise DepthError(f"works on static-shape tensors, got {describe_operand(x)}; apply it to each element "
                         "with ft.map", op=op)
    raise ReturnTypeError(f"expected a tensor, got {type(x).__name__}", op=op)


def _traceable_dtype(a: np.ndarray, what: str) -> None:
    """A DTypeError for an array whose dtype generated code has no type for (bool, uint8, complex...)."""
    if a.dtype.name not in DTYPES:
        raise errors.DTypeError(f"{what} is {a.dtype.name}, which compiled code does not compute with; convert it "
                                f"with .astype(np.float32) (or another of {', '.join(DTYPES)})", op="trace")


# constants of more elements than this that are not the user's arrays stay inline (a scalar, a
# small init tile: the compiler may fold them); the rest are buffers of their own
INLINE_ELEMENTS = 64


def _use(v: Value):
    """The operand for `v` inside the open block: small constants inline, the user's arrays and
    large constants loaded from a buffer of their own (kind "const", passed to the generated
    code at call time: a 1024 x 1024 weight written into C as literals was 21.6 MB of source
    and a 10 s compile), values from enclosing blocks reloaded (loads) or materialized into a
    buffer (anything else)."""
    st = _state()
    if v.const is not None and (id(v.const) in st.captured or np.size(v.const) > INLINE_ELEMENTS):
        b = _const_buffer(v.const)
        key = ("const", b, st.block, _last_child(st.block))  # one load per statement
        if key not in st.reemitted:
            st.reemitted[key] = st.emit(OpNode("load", [], v.shape, v.dtype, pieces=[Piece((), b, ())]))
        return st.reemitted[key]
    if v.const is not None:
        return ("const", v.const)
    if v.block is st.block and not _child_block_since(v.node, st.block):
        return v.node
    key = (v, st.block, _last_child(st.block))  # one reload per statement; the key keeps v alive
    if key not in st.reemitted:
        st.reemitted[key] = st.emit(OpNode("load", [], v.shape, v.dtype, pieces=_pieces_of(v)))
    return st.reemitted[key]


def _const_buffer(a) -> Buffer:
    """The depth-0 "const" buffer holding the constant array `a` (one per array)."""
    st = _state()
    if id(a) not in st.const_buffers:
        st.const_buffers[id(a)] = (st.new_buffer([], np.shape(a), np.asarray(a).dtype.name, "const", np.asarray(a)), a)
    return st.const_buffers[id(a)][0]


def _last_child(block) -> int:
    """Position of the last child block node in the body (-1 if none)."""
    return max((k for k, n in enumerate(block.body) if isinstance(n, BlockNode)), default=-1)


def _child_block_since(node, block) -> bool:
    """Whether a child block node follows `node`: operation nodes on either side of it are
    different statements, so a value crossing it must be reloaded or materialized."""
    return _last_child(block) > block.body.index(node)


def _pieces_of(v: Value) -> list:
    """Where the value lives, as load pieces: a constant, the buffer it was loaded from, or
    a buffer it is stored into right after it is computed (materialization)."""
    st = _state()
    if v.const is not None:
        return [Piece((), None, (), v.const)]
    if v.block not in _ancestors(st.block):
        raise errors.PolyftError(f"a value computed inside another map/scan body escaped it: {v}",
                                 op="trace")
    if v.node.op == "load":
        return v.node.pieces
    buf = st.materialized.get(v)
    ctx = v.block.context()
    if buf is None:
        buf = st.new_buffer([d.extent for d in ctx], v.shape, v.dtype, order=ctx)
        body = v.block.body
        body.insert(body.index(v.node) + 1,
                    OpNode("store", [v.node], v.shape, v.dtype, buffer=buf,
                           index=tuple(Aff.of(d) for d in ctx)))
        st.materialized[v] = buf
    return [Piece((), buf, tuple(Aff.of(d) for d in ctx))]


def _ancestors(block):
    out = []
    while block is not None:
        out.append(block)
        block = block.parent
    return out


def _load(pieces, shape, dtype) -> Value:
    st = _state()
    pieces = [p for p in pieces if p is not None]
    if len(pieces) == 1 and pieces[0].buffer is None and not pieces[0].conds:
        return Value(shape, dtype, const=np.asarray(pieces[0].const, dtype=dtype))
    node = st.emit(OpNode("load", [], shape, dtype, pieces=pieces, where=errors.user_location()))
    return Value(shape, dtype, node, st.block)


# ---------------------------------------------------------------------------------------
# List values


class FTTracer(ListBase):
    """A list inside a traced program: own dims (placeholders) viewed onto buffers by pieces."""

    _traced = True

    def __init__(self, lengths, places, pieces, element_shape, dtype):
        self.lengths = [Length.of(n) for n in lengths]
        self.places = list(places)
        self.pieces = [p for p in pieces if p is not None]
        self._element_shape = tuple(element_shape)
        self._dtype = str(dtype)

    # -- the ListBase interface ---------------------------------------------------------
    @property
    def depth(self):
        return len(self.lengths)

    @property
    def element_shape(self):
        return self._element_shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def type_string(self):
        return f"[{', '.join(map(length_text, self.lengths))}]{self._dtype}[{', '.join(map(str, self._element_shape))}]"

    def __repr__(self):
        return f"FTTracer({self.type_string})"

    def _concrete_len(self, op) -> int:
        n = self.lengths[0]
        ragged_length(n, op)
        if not n.is_concrete:
            raise TracerControlFlowError(
                f"the length {n} of {self.type_string} is symbolic; {op} needs a concrete length "
                "(trace with concrete inputs, or use a compute operator instead of a Python loop)", op=op)
        return n.const

    @property
    def length(self) -> Length:
        return self.lengths[0]

    def __len__(self):
        return self._concrete_len("len")

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def _reindex(self, env, lengths, places, extra=()) -> "FTTracer":
        pieces = [pc.substitute(env) for pc in self.pieces]
        lengths = [n.substitute_dims(env) if isinstance(n, Ragged) else n for n in lengths]
        if extra:
            pieces = [pc.restrict(extra) if pc is not None else None for pc in pieces]
        out = FTTracer(lengths, places, pieces, self._element_shape, self._dtype)
        if not out.lengths:
            return _load(out.pieces, self._element_shape, self._dtype)
        return out

    def _bind(self, pos: Aff):
        """The element at position `pos` (an Aff over iteration dims)."""
        return self._reindex({self.places[0]: pos}, self.lengths[1:], self.places[1:])

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self._slice(key)
        if isinstance(key, (int, np.integer)):
            k = int(key)
            n = self.lengths[0]
            ragged_length(n, f"xs[{k}]")
            if n.is_concrete and not -n.const <= k < n.const:
                raise IndexRangeError(f"index {k} out of range for a list of length {n} ({self.type_string})",
                                      op="getitem")
            if not n.is_concrete:
                _state().assume(n + k if k < 0 else n - k - 1, f"xs[{k}]")
            return self._bind(Aff.of(n + k if k < 0 else Length.of(k)))
        raise TracerControlFlowError(f"lists are indexed by Python ints or slices, not {type(key).__name__}; "
                                     "use map/scan to visit elements, gather for data-dependent indices",
                                     op="getitem")

    def _new_place(self):
        return IterDim("_", 0)

    def _slice(self, s: slice):
        if any(isinstance(v, Value) for v in (s.start, s.stop, s.step)):
            raise TracerControlFlowError(
                f"a slice of {self.type_string} bounded by a traced value (xs[:i] over an index i): lengths that "
                "depend on an enclosing index are not supported compiled; mask by index instead, e.g. "
                "ft.map(lambda j, x: x * (j < i), ft.arange(n), xs)", op="slice")
        step = 1 if s.step is None else int(s.step)
        if step == 0:
            raise WindowError("slice step cannot be zero", op="slice")
        n = self.lengths[0]
        ragged_length(n, "a slice (or shift, reverse)")
        if n.is_concrete:
            start, stop, step = s.indices(n.const)
            length = Length.of(len(range(start, stop, step)))
            start = Length.of(start)
        else:
            def norm(v, default):
                if v is None:
                    return default
                return n + v if v < 0 else Length.of(v)
            # Python clamps out-of-range bounds; a symbolic length cannot be clamped, so the
            # program assumes each bound it was given lies inside the list
            what = f"xs[{s.start if s.start is not None else ''}:{s.stop if s.stop is not None else ''}:{step}]"
            for v, first in ((s.start, True), (s.stop, False)):
                if v is not None:
                    top = n - 1 if (first and step < 0) else n
                    _state().assume(n + v if v < 0 else top - v, what)
            if step > 0:
                start, stop = norm(s.start, Length.of(0)), norm(s.stop, n)
                length = (stop - start + (step - 1)) // step
            else:
                start, stop = norm(s.start, n - 1), norm(s.stop, Length.of(-1))
                length = (start - stop + (-step - 1)) // -step
            if s.start is not None or s.stop is not None:
                length = length.clamp0()
            # else xs[::step] (reverse() included): ceil(n / |step|) >= 0 as n is (a length the
            # trace assumes is) >= 0, so `xs.window(3).reverse()` keeps `L - 2`, not max(L - 2, 0)
        q = self._new_place()
        return self._reindex({self.places[0]: Aff.of(start) + Aff.of(q) * step},
                             [length] + self.lengths[1:], [q] + self.places[1:])

    def window(self, size: int, stride: int = 1, padding=0, dilation: int = 1):
        size, stride, lo, hi, dilation = window_args(size, stride, padding, dilation)
        span = (size - 1) * dilation + 1
        n = self.lengths[0]
        ragged_length(n, "window")
        if lo or hi:
            for m in self.lengths[1:]:
                ragged_length(m, "a padded window over the lists")
        if n.is_concrete and span > n.const + lo + hi:
            raise WindowError(f"a window of size {size}{f' dilated by {dilation}' if dilation > 1 else ''} does not "
                              f"fit the list {self.type_string} padded by ({lo}, {hi})", op="window")
        if not n.is_concrete:
            _state().assume(n + lo + hi - span, f"window({size})")
        w, j = self._new_place(), self._new_place()
        pos = Aff.of(w) * stride + Aff.of(j) * dilation - lo
        count = (n + lo + hi - span) // stride + 1
        env = {self.places[0]: pos}
        lengths = [count, Length.of(size)] + self.lengths[1:]
        places = [w, j] + self.places[1:]
        if not (lo or hi):
            return self._reindex(env, lengths, places)
        inside = self._reindex(env, lengths, places, extra=(ge(pos, 0), ge(Aff.of(n - 1), pos)))
        zero = np.zeros(self._element_shape, dtype=self._dtype)
        pad = [Piece((Constraint(Aff.of(-1) - pos),), None, (), zero),
               Piece((Constraint(pos - Aff.of(n)),), None, (), zero)]
        inside.pieces += [p.substitute({}) for p in pad]
        return inside

    def _join(self, other):
        """Piecewise: position q reads xs[q] where q < n, ys[q - n] from n on (an access map over
        the union of the parts' domains: a consumer reads both in place, nothing is copied)."""
        n, m = self.lengths[0], other.lengths[0]
        ragged_length(n, "join")
        ragged_length(m, "join")
        for a, b in zip(self.lengths[1:], other.lengths[1:]):
            ragged_length(a, "join")
            if a != b:
                raise LengthMismatchError(f"joins lists whose inner lengths agree, got {self.type_string} and "
                                          f"{other.type_string}", op="join")
        q = self._new_place()
        lengths, places = [n + m] + self.lengths[1:], [q] + self.places[1:]
        first = self._reindex({self.places[0]: Aff.of(q)}, lengths, places, extra=(ge(Aff.of(n - 1), Aff.of(q)),))
        env = {other.places[0]: Aff.of(q) - Aff.of(n), **dict(zip(other.places[1:], map(Aff.of, self.places[1:])))}
        second = other._reindex(env, lengths, places, extra=(ge(Aff.of(q), Aff.of(n)),))
        first.pieces += second.pieces
        return first

    def strided_split(self, d: int):
        n = self.lengths[0]
        ragged_length(n, "strided_split")
        if n.is_concrete and n.const % d:
            raise WindowError(f"strided_split({d}) needs a length divisible by {d}, got {n}", op="strided_split")
        if not n.is_concrete and d > 1:
            _state().assume(n, f"strided_split({d})", "mod", d)
        r, j = self._new_place(), self._new_place()
        return self._reindex({self.places[0]: Aff.of(r) + Aff.of(j) * d},
                             [Length.of(d), n // d] + self.lengths[1:], [r, j] + self.places[1:])

    def split(self, size: int):
        size = int(size)
        n = self.lengths[0]
        ragged_length(n, "split")
        if size < 1 or (n.is_concrete and n.const % size):
            raise WindowError(f"chunks of {size} do not divide the list {self.type_string}", op="split")
        if not n.is_concrete and size > 1:
            _state().assume(n, f"split({size})", "mod", size)
        a, b = self._new_place(), self._new_place()
        return self._reindex({self.places[0]: Aff.of(a) * size + b},
                             [n // size, Length.of(size)] + self.lengths[1:], [a, b] + self.places[1:])

    def flatten(self):
        """`ys[t] = xss[t // J][t % J]`: quasi-affine for a concrete inner length J."""
        if self.depth < 2:
            raise DepthError(f"flatten needs a list of depth >= 2, got {self.type_string}", op="flatten")
        inner = self.lengths[1]
        ragged_length(inner, "flatten")
        if not inner.is_concrete:
            raise AccessError(f"the inner length {inner} is symbolic, and t // {inner} is not quasi-affine; "
                              f"flatten a list whose inner length is concrete ({self.type_string})", op="flatten")
        t, J = self._new_place(), max(inner.const, 1)
        env = {self.places[0]: Aff.of(t).floordiv(J), self.places[1]: Aff.of(t).mod(J)}
        return self._reindex(env, [self.lengths[0] * inner.const] + self.lengths[2:], [t] + self.places[2:])

    def _permute_lists(self, perm: tuple):
        """A view: its lengths and placeholders reordered, the pieces unchanged."""
        k = len(perm)
        for n in self.lengths:
            ragged_length(n, "transpose")
        return FTTracer([self.lengths[a] for a in perm] + self.lengths[k:], [self.places[a] for a in perm]
                        + self.places[k:], self.pieces, self._element_shape, self._dtype)

    def strided_merge(self):
        if self.depth < 2:
            raise DepthError(f"strided_merge needs a list of depth >= 2, got {self.type_string}",
                             op="strided_merge")
        d = self.lengths[0]
        ragged_length(self.lengths[1], "strided_merge")
        if not d.is_concrete:
            raise AccessError(f"strided_merge over a symbolic outer length {d} is not quasi-affine",
                              op="strided_merge")
        t = self._new_place()
        env = {self.places[0]: Aff.of(t).mod(d.const), self.places[1]: Aff.of(t).floordiv(d.const)}
        inner = self.lengths[1]
        # floor(m/d)*d is m after strided_split(d), which requires (and assumes) d | m
        merged = inner.floors[0][1] if (not inner.terms and inner.const == 0 and len(inner.floors) == 1
                                        and inner.floors[0][0] == 1 and inner.floors[0][2] == d.const) \
            else inner * d.const
        return self._reindex(env, [merged] + self.lengths[2:], [t] + self.places[2:])

    def gather(self, indices):
        for n in self.lengths:
            ragged_length(n, "gather")
        if isinstance(indices, FTTracer):
            return self._runtime_gather(indices)
        _state().capture(indices)
        n = self.lengths[0]
        idx = gather_indices(indices, n, self.type_string)
        st = _state()
        if idx.size and not n.is_concrete:
            st.assume(n - int(idx.max()) - 1, "gather")
        q = self._new_place()
        buffers = {}  # index values -> their buffer, one per distinct list of positions

        def index_buffer(values):
            key = values.tobytes()
            if key not in buffers:
                buffers[key] = st.new_buffer([values.size], (), "int64", "index", values)
            return buffers[key]
        pieces = [_substitute_gather(pc, self.places[0], q, idx, index_buffer) for pc in self.pieces]
        return FTTracer([Length.of(idx.size)] + self.lengths[1:], [q] + self.places[1:], pieces,
                        self._element_shape, self._dtype)

    def _runtime_gather(self, ids: "FTTracer") -> "FTTracer":
        """`ys[q] = self[ids[q]]` with ids an input list read when the program runs: the coordinate
        reading this list's dim becomes a Gather of the ids buffer (a may-read of the whole dim in
        the model), and each call checks the ids against the length first (etdg.IndexCheck)."""
        if ids.depth != 1 or ids.element_shape or not np.issubdtype(np.dtype(ids.dtype), np.integer):
            raise AccessError(f"runtime gather ids must be a list of integer scalars ([L]int64[]), got "
                              f"{ids.type_string}", op="gather")
        (ipc,) = ids.pieces if len(ids.pieces) == 1 else (None,)
        buf = ipc.buffer.resolve() if ipc is not None and ipc.buffer is not None else None
        if buf is None or buf.kind != "input" or ipc.conds or \
                not all(isinstance(ix, Aff) for ix in ipc.index) or not _is_place(ipc.index[-1], ids.places[0]) or \
                any(ids.places[0] in ix.dims for ix in ipc.index[:-1]):
            raise AccessError(f"runtime gather ids must be a program input (or its elements inside a map), read as "
                              f"they are, not the view {ids.type_string} of {buf.name if buf else 'a computed list'}",
                              op="gather")
        place, q = self.places[0], self._new_place()
        pieces = []
        for pc in self.pieces:
            if any(place in c.expr.dims for c in pc.conds) or \
                    any(place in ix.dims and not _is_place(ix, place) for ix in pc.index):
                raise AccessError(f"runtime gather of a view that reads its list other than as it is ({pc}); "
                                  "gather from the list itself, then apply the view", op="gather")
            index = tuple(Gather(Aff.of(q), buf, ipc.index[:-1]) if place in ix.dims else ix for ix in pc.index)
            pieces.append(Piece(pc.conds, pc.buffer, index, pc.const))
        _state().index_checks.append(IndexCheck(buf.name, self.lengths[0], f"the list {self.type_string} it gathers "
                                                "from", errors.user_location()))
        return FTTracer([ids.lengths[0]] + self.lengths[1:], [q] + self.places[1:], pieces,
                        self._element_shape, self._dtype)

    def _repeat(self, n, inner: bool):
        q = self._new_place()
        n = Length.of(n)
        if inner:
            return FTTracer([self.lengths[0], n] + self.lengths[1:], [self.places[0], q] + self.places[1:],
                            self.pieces, self._element_shape, self._dtype)
        return FTTracer([n] + self.lengths, [q] + self.places, self.pieces, self._element_shape, self._dtype)


def _is_place(ix, place) -> bool:
    """Whether the index expression is the placeholder itself (`place`, not `2 * place + 1`)."""
    return isinstance(ix, Aff) and ix.terms == {place: 1} and not ix.divs and ix.offset.is_concrete \
        and ix.offset.const == 0


def _substitute_gather(pc: Piece, place, q, idx, index_buffer) -> Piece:
    """The piece read at `idx[q]` in place of the view's placeholder `place`. The coordinate reading
    `place` must be `c * place + o` (o concrete) and becomes the gather of `c * idx + o`; a
    coordinate that is already a gather `a[c * place + o]` becomes the gather of `a[c * idx + o]`."""
    if any(place in c.expr.dims for c in pc.conds):
        raise AccessError("gather of a padded or piecewise view is not supported", op="gather")
    index = []
    for ix in pc.index:
        if place not in ix.dims:
            index.append(ix)
            continue
        aff = ix.pos if isinstance(ix, Gather) else ix
        if set(aff.terms) != {place} or aff.divs or not aff.offset.is_concrete:
            raise AccessError(f"gather of a view that reads its list at {ix} (not c * i + constant) is not "
                              "supported; gather first", op="gather")
        positions = aff.terms[place] * idx + aff.offset.const
        index.append(Gather(Aff.of(q), index_buffer(ix.index.value[positions] if isinstance(ix, Gather)
                                                     else positions)))
    return Piece(pc.conds, pc.buffer, tuple(index), pc.const)


def _const_list(ft: FractalTensor) -> FTTracer:
    if not ft.is_regular:
        raise RaggedError(f"a ragged list {ft.type_string} captured as a constant cannot be traced (a ragged "
                          "list's lengths are call-time data): pass it to the program as an input", op="trace")
    arr = ft.to_numpy()
    st = _state()
    st.capture(ft)  # its values are compiled in: a change to them is an error at the next call
    b = st.new_buffer(list(arr.shape[:ft.depth]), ft.element_shape, ft.dtype, "const", arr)
    return _identity_view(b, ())


def _identity_view(b: Buffer, ctx) -> FTTracer:
    places = [IterDim("_", 0) for _ in b.dims[len(ctx):]]
    own = [from_coordinates(n, list(ctx) + places) for n in b.dims[len(ctx):]]
    index = tuple(Aff.of(d) for d in ctx) + tuple(Aff.of(p) for p in places)
    return FTTracer(own, places, [Piece((), b, index)], b.element_shape, b.dtype)


# ---------------------------------------------------------------------------------------
# Pytrees of values


def _lift(x, op):
    """Turn a user value into tracer form: a pytree of Values, FTTracers and Zips of them."""
    return pytree.map(lambda leaf: _lift_leaf(leaf, op), x)


def _lift_leaf(x, op):
    if isinstance(x, (Value, FTTracer)):
        return x
    if isinstance(x, FractalTensor):
        return _const_list(x)
    if isinstance(x, Zip):
        return Zip([_lift_leaf(c, op) for c in x.components], x.depth)
    if isinstance(x, (np.ndarray, np.generic)):
        return _const_value(np.asarray(x), op)
    if isinstance(x, list):
        raise ReturnTypeError("a Python list is not a FractalTensor; return a tuple, or build the list "
                              "with a compute operator", op=op)
    raise ReturnTypeError(f"expected a tensor, a FractalTensor or a tuple of them, got {type(x).__name__}",
                          op=op)


def _type_of(x) -> str:
    return pytree.describe(x, lambda leaf: f"{leaf.dtype}[{', '.join(map(str, leaf.shape))}]"
                           if isinstance(leaf, Value) else leaf.type_string)


# ---------------------------------------------------------------------------------------
# Compute operators: one block node with one new iteration dim each


def traced_compute(op: str, f, lists, init):
    """One compute operator on traced lists, recorded as a block node (`map`, scans, folds)."""
    srcs, n = _sources(lists, op)
    if op == "map":
        return _traced_map(f, srcs, n)
    if op in _SCANS:
        return _traced_scan(op, f, srcs, n, init)
    return _traced_fold(op, f, srcs, n, init)


def _traced_map(f, srcs, n: Length):
    """`f` on the element at the new dim's index of every list; each result leaf is written into
    a fresh buffer, whose identity view is the result."""
    t = _iter_dim("map", n)
    with _inside(t) as ctx_out:
        res = _result(f(*[_element(s, Aff.of(t)) for s in srcs]), "map")
        outs = [_write_leaf(leaf, ctx_out + [t], None, "map") for leaf in pytree.leaves(res)]
    return pytree.unflatten(pytree.structure(res), [_identity_view(b, ctx_out) for b in outs])


def _traced_scan(op: str, f, srcs, n: Length, init):
    """The states after every step; without init the first (last, for scanr) element joins them."""
    state0, views, _ = _aggregate(op, f, srcs, n, init)
    if init is None:
        views = [_prepend(v, first, op in _RIGHT, n) for v, first in zip(views, pytree.leaves(state0))]
    return pytree.unflatten(pytree.structure(state0), views)


def _traced_fold(op: str, f, srcs, n: Length, init):
    """The state after the last step, or the initial state when there is no step."""
    if init is None and n.is_concrete and n.const == 0:
        raise EmptyReduceError(f"{op} of an empty list without init", op=op)
    if init is None and not n.is_concrete:
        _state().assume(n - 1, f"{op} without init")
    state0, views, extent = _aggregate(op, f, srcs, n, init)
    if isinstance(extent, Ragged):  # the state after each element's last step: a gather at its length - 1
        _ragged_input(extent).minimum = 1
        _ragged_input(extent).why = f"{op} at {errors.user_location()} needs a last step"
        some = none = None
    else:
        last = Aff.of(0) if op in _RIGHT else Aff.of(extent - 1)
        some, none = ge(Aff.of(extent), 1), eq(Aff.of(extent), 0)
    results = []
    for v, leaf in zip(views, pytree.leaves(state0)):
        got = _bind_last(v, extent) if some is None else v._bind(last)
        if isinstance(got, Value):
            pieces = _pieces_of(got)
        else:  # a list state: its pieces must use the result's places (the init leaf's)
            pieces = [pc.substitute({g: Aff.of(p) for g, p in zip(got.places, leaf.places)})
                      for pc in got.pieces]
        if some is not None:
            pieces = [pc.restrict((some,)) for pc in pieces]
            pieces += _state_pieces(leaf, none) if not (extent.is_concrete and extent.const > 0) else []
        pieces = [p for p in pieces if p is not None]
        if isinstance(leaf, Value):
            results.append(_load(pieces, leaf.shape, leaf.dtype))
        else:
            results.append(FTTracer(leaf.lengths, leaf.places, pieces, leaf.element_shape, leaf.dtype))
    return pytree.unflatten(pytree.structure(state0), results)


def _ragged_input(n: Ragged) -> RaggedInput:
    """The input whose lengths the ragged length `n` reads."""
    return next(r for r in _state().ragged if r.lengths is n.lengths)


def _bind_last(view: FTTracer, n: Ragged):
    """The element of `view` (a carry buffer's identity view) at each element's last position
    `lengths[at] - 1`: an indirect index into the buffer of lengths - 1 (a may-read of the whole
    dim in the model, as a runtime gather's)."""
    q = view.places[0]
    last = Gather(n.at[-1], n.last, n.at[:-1])
    pieces = [Piece(pc.conds, pc.buffer, tuple(last if _is_place(ix, q) else ix for ix in pc.index), pc.const)
              for pc in view.pieces]
    if view.depth == 1:
        return _load(pieces, view.element_shape, view.dtype)
    return FTTracer(view.lengths[1:], view.places[1:], pieces, view.element_shape, view.dtype)


def _aggregate(op: str, f, srcs, n: Length, init):
    """The block node of a scan or fold: `f(state, x)` (`f(x, state)` for right aggregates) once,
    the state read as init on the first step and from the carry buffers (one state per step:
    array expansion) later. Without init the first (last) element is the initial state and the
    dim has one step fewer, none for an empty list (Table 1: a scan of [] is []).
    Returns (the initial state, a view of each state leaf's carry buffer, the dim's extent)."""
    right = op in _RIGHT
    if isinstance(n, Ragged) and (right or init is None):
        raise RaggedError(f"{op}{'' if right else ' without init'} over a ragged level {n.text} is not supported "
                          f"compiled (its first step would depend on the element's length); use "
                          f"{'scanl / foldl' if right else op} with init, or run eagerly", op=op)
    extent = n if init is not None else (n - 1).clamp0()
    t = _iter_dim(op, extent)
    skip = 1 if init is None and not right else 0  # the element that is the initial state
    if init is None:
        init = _element(srcs[0] if len(srcs) == 1 else Zip(srcs), Aff.of(n - 1) if right else Aff.of(0))
    state0 = _lift_init(init, op)
    with _inside(t) as ctx_out:
        ctx = ctx_out + [t]
        elems = [_element(s, Aff.of(t) + skip) for s in srcs]
        carries = [_carry_buffer(leaf, ctx) for leaf in pytree.leaves(state0)]
        first = eq(t, 0) if not right else eq(t, extent - 1)
        later = ge(t, 1) if not right else ge(Aff.of(extent - 2), t)
        prev = Aff.of(t) + (1 if right else -1)
        state = pytree.unflatten(pytree.structure(state0), [_state_view(leaf, buf, ctx_out, prev, first, later)
                                                            for leaf, buf in zip(pytree.leaves(state0), carries)])
        x = elems[0] if len(elems) == 1 else tuple(elems)
        res = _result(f(x, state) if right else f(state, x), op)
        _check_state(state, res, op)
        outs = [_write_leaf(leaf, ctx, buf, op) for leaf, buf in zip(pytree.leaves(res), carries)]
    return state0, [_identity_view(b, ctx_out) for b in outs], extent


def _iter_dim(op: str, extent: Length) -> IterDim:
    """The new dim of a compute operator, lettered after its depth (i, j, k, ...)."""
    depth = len(_state().block.context())
    return IterDim(_DIM_LETTERS[depth] if depth < len(_DIM_LETTERS) else f"i{depth}", extent, op)


@contextlib.contextmanager
def _inside(t: IterDim):
    """Trace inside a new block node with the one dim t, a child of the open block; yields the
    open block's dims (the context outside the new one)."""
    st = _state()
    outer = st.block
    block = BlockNode([t], parent=outer)
    outer.body.append(block)
    st.block = block
    try:
        yield outer.context()
    finally:
        st.block = outer


def _result(res, op):
    """The user function's result in tracer form; a returned zip is the tuple of its lists."""
    return unzip(_lift(res, op))


def _sources(lists, op):
    """The lists an operator iterates, each an FTTracer or a Zip of them, all of one length."""
    srcs = [_lift(l, op) for l in lists]
    flat = [c for s in srcs for c in (s.components if isinstance(s, Zip) else [s])]
    for c in flat:
        if not isinstance(c, FTTracer):
            raise DepthError(f"{op} iterates over lists, got a tensor {_type_of(c)}", op=op)
    n = flat[0].lengths[0]
    for c in flat[1:]:
        if c.lengths[0] != n:
            raise LengthMismatchError(
                f"lists of different lengths: {' vs '.join(x.type_string for x in flat)}", op=op)
    return srcs, n


def _element(src, pos: Aff):
    """The element at `pos`; a zip over several levels yields a zip one level shallower."""
    if isinstance(src, Zip):
        parts = [_element(c, pos) for c in src.components]
        return Zip(parts, src.depth - 1, element=True) if src.depth > 1 else tuple(parts)
    return src._bind(pos)


def _state_pieces(leaf, first: Constraint):
    """The pieces (restricted to the first iteration) of an init leaf."""
    pieces = _pieces_of(leaf) if isinstance(leaf, Value) else leaf.pieces
    return [pc.restrict((first,)) for pc in pieces]


def _fresh(leaf: FTTracer, ctx) -> Buffer | None:
    """The buffer a list result was freshly written to in this iteration, if it was."""
    if len(leaf.pieces) != 1 or leaf.pieces[0].conds or leaf.pieces[0].buffer is None:
        return None
    pc = leaf.pieces[0]
    b = pc.buffer.resolve()
    want = tuple(Aff.of(d) for d in ctx) + tuple(Aff.of(p) for p in leaf.places)
    if b.kind != "intermediate" or b.created_in != tuple(ctx) or len(pc.index) != len(want):
        return None
    if any(not isinstance(a, Aff) or str(a) != str(w) or a.dims != w.dims for a, w in zip(pc.index, want)):
        return None
    if [str(n) for n in b.dims[len(ctx):]] != [str(n) for n in leaf.lengths]:
        return None
    return b


def _write_leaf(leaf, ctx, target: Buffer | None, op):
    """Write a result leaf of one iteration into `target` (or a new buffer); return the buffer."""
    st = _state()
    if isinstance(leaf, Value):
        if target is None:
            target = st.new_buffer([d.extent for d in ctx], leaf.shape, leaf.dtype,
                                   created_in=tuple(ctx[:-1]), order=ctx)
        st.emit(OpNode("store", [_use(leaf)], leaf.shape, leaf.dtype, buffer=target,
                       index=tuple(Aff.of(d) for d in ctx)))
        return target
    fresh = _fresh(leaf, ctx)
    if fresh is None:  # a view of something else: copy it into a fresh buffer first
        copied = traced_compute("map", _copy, [leaf], None)
        fresh = _fresh(copied, ctx)
    if target is None:
        fresh.created_in = tuple(ctx[:-1])  # now the map's output, one level out
        return fresh
    fresh.alias_of = target
    return target


def _copy(x):
    return apply_op("copy", (x,), {}) if isinstance(x, Value) else traced_compute("map", _copy, [x], None)


def _check_state(state, res, op):
    if pytree.structure(state) != pytree.structure(res) or any(
            _type_of(a) != _type_of(b) for a, b in zip(pytree.leaves(state), pytree.leaves(res))):
        raise StateTypeError(f"the state has type {_type_of(state)} but the function returned {_type_of(res)}; "
                             "the state's type must be the same at every step", op=op)


def _lift_init(init, op):
    """The init in tracer form; anything but a tensor / list / tuple of them is a StateTypeError
    with the eager operators' hint (a Python number is not a tensor: use ft.zeros / ft.full)."""
    try:
        return _lift(init, op)
    except ReturnTypeError:
        bad = next((leaf for leaf in pytree.leaves(init) if not isinstance(
            leaf, (Value, FTTracer, FractalTensor, Zip, np.ndarray, np.generic))), init)
        hint = " (make a constant with ft.zeros(shape) or ft.full(shape, value))" \
            if isinstance(bad, (int, float)) else ""
        raise StateTypeError(f"init must be a tensor, a FractalTensor, or a tuple of them, not a Python "
                             f"{type(bad).__name__}{hint}", op=op) from None


def _carry_buffer(leaf, ctx) -> Buffer:
    """The scan output buffer, one state per iteration (array expansion of the carry)."""
    own = leaf.lengths if isinstance(leaf, FTTracer) else []
    shape = leaf.element_shape if isinstance(leaf, FTTracer) else leaf.shape
    places = leaf.places if isinstance(leaf, FTTracer) else []
    return _state().new_buffer([d.extent for d in ctx] + list(own), shape, leaf.dtype,
                               created_in=tuple(ctx[:-1]), order=list(ctx) + list(places))


def _state_view(leaf, buf: Buffer, ctx_out, prev: Aff, first: Constraint, later: Constraint):
    """The state inside the body: init on the first iteration, the previous output later."""
    base = tuple(Aff.of(d) for d in ctx_out) + (prev,)
    if isinstance(leaf, Value):
        pieces = _state_pieces(leaf, first) + [Piece((later,), buf, base).substitute({})]
        return _load(pieces, leaf.shape, leaf.dtype)
    places = list(leaf.places)
    pieces = _state_pieces(leaf, first) + [Piece((later,), buf, base + tuple(Aff.of(p) for p in places))]
    return FTTracer(leaf.lengths, places, pieces, leaf.element_shape, leaf.dtype)


def _prepend(view: FTTracer, first, right: bool, n: Length) -> FTTracer:
    """scan without init: the untouched first (last, for scanr) element joins the outputs."""
    q = view.places[0]
    if right:
        at_first, rest = eq(q, n - 1), ge(Aff.of(n - 2), q)
        pos_rest = Aff.of(q)
    else:
        at_first, rest = eq(q, 0), ge(q, 1)
        pos_rest = Aff.of(q) - 1
    moved = [pc.substitute({q: pos_rest}).restrict((rest,)) for pc in view.pieces]
    if isinstance(first, Value):
        head = [pc.restrict((at_first,)) for pc in _pieces_of(first)]
    else:  # a list element: its own dims follow q
        head = [pc.restrict((at_first,)) for pc in
                first._reindex(dict(zip(first.places, view.places[1:])), first.lengths, view.places[1:]).pieces]
    return FTTracer([n] + view.lengths[1:], view.places, head + moved, view.element_shape, view.dtype)


# ---------------------------------------------------------------------------------------
# Entry point


def _return_names(fn) -> list:
    """Names in the function's `return a` / `return a, b`, to name the output buffers."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return []
    func = tree.body[0]
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    for node in reversed(func.body):
        if isinstance(node, ast.Return) and node.value is not None:
            v = node.value
            items = v.elts if isinstance(v, ast.Tuple) else [v]
            return [x.id if isinstance(x, ast.Name) else None for x in items]
    return []


def _input(st, name, arg):
    if isinstance(arg, Spec):
        if math.prod(arg.element_shape) * np.dtype(arg.dtype).itemsize > 2 ** 63 - 1:
            raise errors.SpecError(f"input {name} {arg.type}: one element would pass 2**63 bytes, more than any array holds",
                                   op="trace")
        b = Buffer(name, _ragged_dims(st, name, list(arg.type.lengths)), arg.element_shape, arg.dtype, "input")
    elif isinstance(arg, FractalTensor):
        if arg.is_regular:
            b = Buffer(name, list(arg.ftype.lengths), arg.element_shape, arg.dtype, "input")
        else:
            level = arg.depth - 1
            lens = lengths_of(arg, level)  # RaggedError unless only the last level is ragged
            dims = [Length.of(n) for n in lens.shape] + [Ragged(int(lens.max(initial=0)))]
            b = Buffer(name, _ragged_dims(st, name, dims, lens), arg.element_shape, arg.dtype, "input")
    elif isinstance(arg, np.ndarray):
        _traceable_dtype(arg, f"input {name}")
        b = Buffer(name, [], arg.shape, arg.dtype.name, "input")
    else:
        return None, arg
    st.buffers.append(b)
    if b.depth == 0:
        return b, _load([Piece((), b, ())], b.element_shape, b.dtype)
    return b, _identity_view(b, ())


def _ragged_dims(st, name, dims, example=None) -> list:
    """An input's dims with its ragged last level (if any) reading its lengths from a buffer given
    at call time, `{name}_len` (and `{name}_last`, the lengths - 1, where folds end)."""
    if not dims or not isinstance(dims[-1], Ragged):
        return dims
    n = dims[-1]
    outer = dims[:-1]
    lens = st.new_buffer(outer, (), "int64", "lengths", name=f"{name}_len")
    last = st.new_buffer(outer, (), "int64", "lengths", name=f"{name}_last")
    st.ragged.append(RaggedInput(name, len(outer), n.bound, lens, last, example=example))
    at = [Aff.of(IterDim(f"e{r}", 0, "coord")) for r in range(len(outer))]
    return outer + [Ragged(n.bound, lens, at, last)]


def trace(fn, *args) -> ETDG:
    """Trace `fn` on concrete inputs or `ft.spec`s into an ETDG."""
    if getattr(_TRACING, "state", None) is not None:
        raise errors.PolyftError("trace() called while tracing", op="trace")
    st = _TRACING.state = _TraceState()
    try:
        try:
            names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            names = []
        names += [f"in{k}" for k in range(len(names), len(args))]
        names = [tuple_name(n) for n in names]  # ISL-readable (polyft.names)
        inputs, traced_args = [], []
        for name, arg in zip(names, args):
            b, v = _input(st, name, arg)
            inputs.append((name, b))
            traced_args.append(v)
        try:
            res = _result(fn(*traced_args), "return")
        except RecursionError as e:
            raise _endless_recursion(e) from None
        out_names = _return_names(fn)
        outputs = []
        out_leaves = pytree.leaves(res)
        for k, leaf in enumerate(out_leaves):
            b = _write_leaf(leaf, [], None, "return") if isinstance(leaf, Value) else \
                (_fresh(leaf, []) or _fresh(traced_compute("map", _copy, [leaf], None), []))
            if b.kind == "input" or b in outputs:  # an input, or a value returned twice: a copy of its own
                b = _fresh(traced_compute("map", _copy, [leaf], None), [])
            b.kind = "output"
            nm = out_names[k] if k < len(out_names) and out_names[k] else ("out" if len(out_leaves) == 1
                                                                           else f"out{k}")
            nm = tuple_name(nm)
            b.name = _unused(nm if nm not in names else f"{nm}_out", {*names, *(o.name for o in outputs)})
            outputs.append(b)
        drop_dead_ops(st.root)
        merge_perfect_nests(st.root)
        _name_blocks(st.root)
        used = referenced(st.root) | {b for _, b in inputs if b} | set(outputs)
        buffers = [b for b in st.buffers if b.alias_of is None and b in used]
        _rename_clashes(buffers, {*names, *(o.name for o in outputs)})
        fn_name = getattr(fn, "__name__", "program")
        if fn_name == "program":
            fn_name = getattr(fn, "__module__", "program").rsplit(".", 1)[-1]
        etdg = ETDG(fn_name, st.root, inputs, outputs, res, buffers)
        etdg.assumptions = list(dict.fromkeys(st.assumptions))  # in order, without repeats
        etdg.captured = list(st.captured.values())
        etdg.index_checks = list(dict.fromkeys(st.index_checks))
        etdg.ragged = st.ragged
        return etdg
    finally:
        _TRACING.state = None


def _unused(name: str, taken: set) -> str:
    """`name`, or `name_1`, `name_2`, ... where it is taken."""
    k, out = 0, name
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    return out


def _rename_clashes(buffers, user_names: set) -> None:
    """Internal buffers (t0, c0, ...) named like an input or output of the user's (`t0 = ...;
    return t0`) get another name: the model tells buffers apart by name."""
    taken = {b.name for b in buffers} | user_names
    for b in buffers:
        if b.kind not in ("input", "output") and b.name in user_names:
            b.name = _unused(b.name, taken)
            taken.add(b.name)


def _endless_recursion(e: RecursionError) -> TracerControlFlowError:
    """Tracing runs the user's Python once, so a recursion that stops only on a value known at run
    time never stops: name the user function that called itself most."""
    counts = collections.Counter(f.name for f in errors.user_frames(e.__traceback__))
    name, n = counts.most_common(1)[0] if counts else ("the program", 1)
    limit = f"Python's recursion limit ({sys.getrecursionlimit()})"
    if n < 2:  # no user function recursed: the program nests too deeply for the tracer's own recursion
        message = f"tracing {name} went past {limit}: the program nests too deeply (raise sys.setrecursionlimit)"
    else:
        message = (f"{name} recursed {n} times while tracing, past {limit}: a traced function runs once, on "
                   "values known only when the program runs, so a recursion must stop on Python values (ints, "
                   "concrete lengths); repeat with ft.map / ft.foldl / ft.scanl instead")
    return TracerControlFlowError(message, op="trace", where=errors.user_location(e.__traceback__))


def _name_blocks(root):
    # the root keeps no counter name: a fresh process's first root would be b0, like its
    # first child, and their statements would share a name
    root.name = "root"
    blocks, ops = itertools.count(), itertools.count()
    for n in itertools.islice(walk(root), 1, None):
        if isinstance(n, BlockNode):
            n.name = f"b{next(blocks)}"
        else:
            # op ids in program order from 0, not from the process-wide counter: generated
            # code names values by id, and the same program must give the same source (the
            # compile cache is keyed by it)
            n.id = next(ops)
