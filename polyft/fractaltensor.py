"""The eager FractalTensor: a nested list of static-shape numpy tensors, and its access operators.

A FractalTensor of depth d holds a Python list of items: numpy arrays of one static shape at
depth 1, FractalTensors of depth d-1 deeper. Siblings may differ in length (ragged). Access
operators build new FractalTensors whose items are the very same objects (views), so element
data is never copied: the paper's access operators "do not perform computations".

`ListBase` carries the method names shared with `Zip` and the tracer's lists
(`tracing.FTTracer`), so one user program runs unchanged eagerly and under tracing.
"""
from __future__ import annotations

import operator

import numpy as np

from . import pytree, recording
from .affine import Length
from .errors import (AccessError, DepthError, DTypeError, IndexRangeError, LengthMismatchError,
                     RaggedError, ShapeError, TracerControlFlowError, WindowError)
from .types import DTYPES, FTType, dtype_name


def is_traced(x) -> bool:
    """True for the tracer's lists and values (`tracing.FTTracer`, `tracing.Value`, zips of them).

    They all carry `_traced = True`; operators and element math dispatch on it.
    """
    return getattr(x, "_traced", False) is True


def describe_operand(x) -> str:
    """How an error names an operand: a list by its type, a tensor by dtype and shape, else its value."""
    if isinstance(x, ListBase):
        return f"the list {x!r}" if isinstance(x, Zip) else f"the list {x.type_string}"
    if isinstance(x, np.ndarray) or is_traced(x):
        return f"a {'traced ' if is_traced(x) else ''}{x.dtype}{list(x.shape)} " + \
            ("value" if is_traced(x) else "array")
    return f"the Python {type(x).__name__} {x!r}"


def unzip(value):
    """A zip of lists stands for the tuple of its lists (results, states, a program's outputs),
    at the top of a pytree or inside it."""
    return pytree.map(lambda leaf: tuple(leaf.components) if isinstance(leaf, Zip) else leaf, value)


def check_dtype(dtype, op: str) -> str:
    """The dtype's name, which must be one of `types.DTYPES` (what type strings can express)."""
    name = dtype_name(dtype)
    if name not in DTYPES:
        raise DTypeError(f"dtype {name} is not supported; use one of {', '.join(DTYPES)}", op=op)
    return name


def check_lists(lists, op: str) -> None:
    """Every operand of a list operator must be a list (depth >= 1), not a tensor or Python list."""
    if not lists:
        raise DepthError("needs at least one list", op=op)
    for x in lists:
        if isinstance(x, (np.ndarray, np.generic)):
            depths = ", ".join(f"depth={d} gives {FTType(x.shape[:d], x.shape[d:], x.dtype.name)}"
                               for d in range(1, min(x.ndim, 2) + 1))
            raise DepthError(f"expects a FractalTensor (depth >= 1), got the tensor "
                             f"{FTType((), x.shape, x.dtype.name)} (depth 0), a numpy array; make it a list with "
                             f"ft.FractalTensor.from_numpy(arr, depth=...)" + (f": {depths}" if depths else ""), op=op)
        if not isinstance(x, ListBase):
            raise DepthError(f"expects a FractalTensor (depth >= 1), got a Python {type(x).__name__}; build one "
                             "with ft.FractalTensor.from_list(items) or .from_numpy(arr, depth=...)", op=op)


def check_same_length(lists, op: str) -> None:
    """Lists combined element by element (zip, map over several lists) must have one length."""
    first = lists[0].length
    for k, xs in enumerate(lists[1:], 1):
        if xs.length != first:
            raise LengthMismatchError(
                f"list 0 ({lists[0]!r}) has length {first} but list {k} ({xs!r}) has length "
                f"{xs.length}", op=op)


def _as_int(value, what: str, op: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise AccessError(f"{what} must be an int, not {type(value).__name__}", op=op) from None


class ListBase:
    """The operator methods shared by eager lists, traced lists and zips.

    Subclasses define `__len__`, `depth`, `__getitem__`, `window`, `gather`, `strided_split`,
    `strided_merge` and `_repeat`; the other access operators are built from those here.

    The compute operators as methods (`xs.map(f)`, `xs.reduce(f, init)`, `xs.foldl`, `xs.foldr`,
    `xs.scanl`, `xs.scanr`) are attached to this class by `polyft.operators`, the layer above
    that dispatches a compute operator to eager execution or to the tracer, as JAX attaches
    its array methods. This module cannot define them itself: eager execution and the tracer
    are built on these classes. Importing `polyft` imports `polyft.operators`, so every list
    has them.
    """

    _traced = False

    @property
    def length(self):
        """The length: an int for eager lists (the tracer may answer a symbolic `Length`)."""
        return len(self)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # -- access operators --------------------------------------------------------------
    def __getitem__(self, index):
        """`xs[i]` (negative ok): an element; `xs[a:b:s]`: a sub-list with Python's semantics."""
        raise NotImplementedError

    def window(self, size: int, stride: int = 1, padding=0, dilation: int = 1):
        """Depth +1: `ys[w][j] = xs[w*stride + j*dilation - pad_left]`; padded positions read zeros."""
        raise NotImplementedError

    def flatten(self):
        """Depth -1, the two outer list dims as one, row-major: `ys[i*J + j] = xss[i][j]`."""
        raise NotImplementedError

    def split(self, size: int):
        """Depth +1, chunks of `size` consecutive elements (the inverse of flatten):
        `ys[a][b] = xs[a*size + b]`; the length must be a multiple of size."""
        raise NotImplementedError

    def _permute_lists(self, perm: tuple):
        """The list dims in the order `perm` (`ft.transpose(xss)`: the outer two swapped)."""
        raise NotImplementedError

    def gather(self, indices):
        """Indirect access: `ys[i] = xs[indices[i]]`."""
        raise NotImplementedError

    def strided_split(self, d: int):
        """Depth +1, the constantly strided access: `ys[r][j] = xs[r + j*d]`."""
        raise NotImplementedError

    def strided_merge(self):
        """The inverse view of `strided_split`: `zs[t] = yss[t % d][t // d]`."""
        raise NotImplementedError

    def _repeat(self, n, inner: bool):
        """Depth +1 broadcast view (for `product`): each element n times (inner) or the list n times."""
        raise NotImplementedError

    def shift(self, k: int):
        """`ys[i] = xs[i + k]` over the valid positions only: length `L - |k|` (at least 0)."""
        k = _as_int(k, "the shift", "shift")
        return self[k:] if k >= 0 else self[:k]

    def reverse(self):
        """`ys[i] = xs[L-1-i]`."""
        return self[::-1]

    def shifted_slide(self, window: int, dilation: int = 1):
        """Listing 4's window centred on every element (zeros past the ends): same length; with a
        dilation d, `ys[i][j] = xs[i + (j - window // 2) * d]`."""
        window = _as_int(window, "the window", "shifted_slide")
        dilation = _as_int(dilation, "the dilation", "shifted_slide")
        if window < 1 or window % 2 == 0 or dilation < 1:
            raise WindowError(f"the window must be a positive odd size to be centred and the dilation positive, "
                              f"got {window} and {dilation}", op="shifted_slide")
        return self.window(window, 1, window // 2 * dilation, dilation)

    def enumerate(self, dtype: str = "float32"):
        """`ft.zip(ft.arange(len(xs), dtype), xs)`: each element with its index as a 0-d value
        (`for i, x` in a body: `ft.map(lambda ix: f(*ix), xs.enumerate())`); the length must be
        concrete, as arange's."""
        length = self.length
        if not isinstance(length, int) and not getattr(length, "is_concrete", False):
            raise TracerControlFlowError(f"the length {length} of {self!r} is symbolic; enumerate makes a list of "
                                         "its indices and needs a concrete length (trace with concrete inputs)",
                                         op="enumerate")
        return Zip([arange(int(length) if isinstance(length, int) else length.const, dtype), self])

    def join(self, other):
        """The lists one after the other along their outer dim (FractalTensor's join):
        `zs[i] = xs[i]` for i < len(xs), `ys[i - len(xs)]` after; both of one depth and element type."""
        if not isinstance(other, ListBase):
            raise DepthError(f"joins two lists, got {self!r} and {describe_operand(other)}", op="join")
        if getattr(self, "_ad", False) or getattr(other, "_ad", False):  # being differentiated (ft.vjp)
            return recording.HANDLERS["join"](self, other)
        if isinstance(self, Zip) or isinstance(other, Zip):
            if not (isinstance(self, Zip) and isinstance(other, Zip) and len(self.components) == len(other.components)
                    and self.depth == other.depth):
                raise DepthError(f"joins a zip with a zip of as many lists, got {self!r} and {other!r}", op="join")
            return Zip([a.join(b) for a, b in zip(self.components, other.components)], self.depth)
        if (self.depth, tuple(self.element_shape), str(self.dtype)) != \
                (other.depth, tuple(other.element_shape), str(other.dtype)):
            raise ShapeError(f"joins lists of one depth and element type, got {self.type_string} and "
                             f"{other.type_string}", op="join")
        if self._traced != other._traced:
            raise AccessError(f"joins two lists of the program (its inputs and views of them), got {self!r} and "
                              f"{other!r}; pass the other list as an input", op="join")
        return self._join(other)

    def _join(self, other):
        raise NotImplementedError

    # -- arithmetic belongs to the elements ---------------------------------------------
    def _elementwise_only(symbol):
        def f(self, *other):
            with_ = f" and {describe_operand(other[0])}" if other else ""
            raise DepthError(f"`{symbol}` works on tensors, not on {describe_operand(self)}{with_}; apply it to "
                             f"each element with map, e.g. xs.map(lambda x: ...)", op=symbol)
        return f

    __add__ = __radd__ = _elementwise_only("+")
    __sub__ = __rsub__ = _elementwise_only("-")
    __mul__ = __rmul__ = _elementwise_only("*")
    __truediv__ = __rtruediv__ = _elementwise_only("/")
    __matmul__ = __rmatmul__ = _elementwise_only("@")
    __pow__ = __rpow__ = _elementwise_only("**")
    __neg__ = _elementwise_only("-")
    del _elementwise_only

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """numpy's ufuncs (`np.tanh(xs)`, `array * xs`) work on tensors, as `ft.tanh` does."""
        raise DepthError(f"numpy's {ufunc.__name__} works on tensors, not on {describe_operand(self)}; apply "
                         "it to each element with map", op=f"np.{ufunc.__name__}")


class FractalTensor(ListBase):
    """An eager nested list of static-shape numpy tensors (paper §4.1)."""

    def __init__(self, items, depth: int, element_shape, dtype: str, dense=None):
        """Wrap items as they are, unchecked and uncopied; users build with from_numpy/from_list.

        `dense` (with items None): a read-only array whose leading `depth` axes are the list.
        Its items are made on first use: a compiled program's [16, 8, 32] output is one view
        per call, not 4,000 (a third of a small LSTM call went to making them), and it goes
        back to the generated code as that array, without a copy.
        """
        self._list = None if items is None else list(items)
        self._dense = dense
        self._depth = depth
        self._element_shape = tuple(element_shape)
        self._dtype = dtype

    @property
    def _items(self) -> list:
        if self._list is None:
            arr, depth = self._dense, self._depth
            self._list = [arr[i, ...] if depth == 1 else FractalTensor._wrap(arr[i], depth - 1, self._dtype)
                          for i in range(arr.shape[0])]
        return self._list

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_numpy(cls, arr, depth: int) -> "FractalTensor":
        """View the leading `depth` axes of arr as programmable; elements are read-only views into arr
        (a program never changes its inputs)."""
        arr = _read_only(np.asarray(arr))
        if not 1 <= depth <= arr.ndim:
            raise DepthError(f"cannot view an array of shape {list(arr.shape)} as a list of depth "
                             f"{depth} (need 1 <= depth <= {arr.ndim})", op="from_numpy")
        return cls._wrap(arr, depth, check_dtype(arr.dtype, "from_numpy"))

    @classmethod
    def _wrap(cls, arr, depth, dtype):
        """The read-only `arr` as a list of depth `depth` (its items made when first used)."""
        return cls(None, depth, arr.shape[depth:], dtype, dense=arr)

    @classmethod
    def zeros(cls, lengths, element_shape, dtype: str = "float32") -> "FractalTensor":
        """A regular list of zeros (read-only), e.g. the padding of a window."""
        lengths = tuple(lengths)
        data = np.zeros(lengths + tuple(element_shape), check_dtype(dtype, "zeros"))
        data.flags.writeable = False
        return cls.from_numpy(data, len(lengths))

    @classmethod
    def from_list(cls, items, element_shape=None, dtype=None) -> "FractalTensor":
        """Build from nested Python lists whose leaves are tensors (or FractalTensors).

        Siblings may differ in length; a list holding only empty lists needs element_shape.
        With dtype, tensor leaves are cast to it (copying only where they differ).
        """
        if not isinstance(items, (list, tuple)):
            raise DepthError(f"expects a Python list, got {type(items).__name__}", op="from_list")
        depth, _ = _nest_depth(items)
        signatures = set()
        nest = _convert_leaves(items, depth, dtype, signatures)
        shapes = {shape for shape, _ in signatures}
        dtypes = {name for _, name in signatures}
        if element_shape is not None:
            shapes.add(tuple(element_shape))
        if dtype is not None:
            dtypes.add(check_dtype(dtype, "from_list"))
        if not shapes:
            raise ShapeError("a list of empty lists needs element_shape=", op="from_list")
        if len(shapes) > 1:
            raise ShapeError(f"elements of different shapes {sorted(list(s) for s in shapes)}", op="from_list")
        if len(dtypes) > 1:
            raise DTypeError(f"elements of different dtypes {sorted(dtypes)}", op="from_list")
        return _wrap_nest(nest, depth, shapes.pop(), dtypes.pop() if dtypes else "float32")

    @classmethod
    def from_padded(cls, arr, lengths) -> "FractalTensor":
        """A ragged list from a padded array and the lengths of its last list level (as
        torch's pack_padded_sequence takes a batch): `lengths.shape` are the regular levels
        above, `arr.shape[lengths.ndim]` the longest, the rest the element shape. Elements are
        read-only views of arr (no copy)."""
        arr, lens = _read_only(np.asarray(arr)), np.asarray(lengths)
        check_dtype(arr.dtype, "from_padded")
        if not np.issubdtype(lens.dtype, np.integer) and lens.size:
            raise DTypeError(f"lengths must be integers, got {lens.dtype}", op="from_padded")
        nd = lens.ndim
        if arr.ndim <= nd or arr.shape[:nd] != lens.shape:
            raise ShapeError(f"lengths of shape {list(lens.shape)} do not lead the array's shape {list(arr.shape)} "
                             "(one length per list of the last level, then the padded level)", op="from_padded")
        width = arr.shape[nd]
        bad = (lens < 0) | (lens > width)
        if bad.any():
            k = tuple(int(v) for v in np.argwhere(bad)[0])
            raise RaggedError(f"length {int(lens[k])} at {list(k)} is outside [0, {width}] (the padded level of the "
                              f"array {list(arr.shape)})", op="from_padded")

        def build(prefix):
            if len(prefix) == nd:
                return cls([arr[prefix + (j,)] for j in range(int(lens[prefix]))], 1, arr.shape[nd + 1:],
                           arr.dtype.name)
            return cls([build(prefix + (i,)) for i in range(arr.shape[len(prefix)])], nd + 1 - len(prefix),
                       arr.shape[nd + 1:], arr.dtype.name)
        return build(())

    # -- inspection ----------------------------------------------------------------------
    def __len__(self):
        return len(self._items) if self._dense is None else self._dense.shape[0]

    def __iter__(self):
        return iter(self._items)

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def element_shape(self) -> tuple:
        return self._element_shape

    @property
    def dtype(self) -> str:
        return self._dtype

    def _level_lengths(self) -> list:
        """For each level, outermost first, the set of lengths its lists have (empty: none there)."""
        if self._dense is not None:  # a level below an empty one has no lists, as in a built one
            shape = self._dense.shape[:self._depth]
            return [{n} if all(shape[:k]) else set() for k, n in enumerate(shape)]
        levels, nodes = [], [self]
        for level in range(self._depth):
            levels.append({len(n) for n in nodes})
            if level + 1 < self._depth:
                nodes = [child for n in nodes for child in n._items]
        return levels

    @property
    def is_regular(self) -> bool:
        """True when every level's lists have one length (the list is a dense tensor)."""
        return all(len(lengths) <= 1 for lengths in self._level_lengths())

    def _regular_lengths(self, op: str) -> tuple:
        levels = self._level_lengths()
        if any(len(lengths) > 1 for lengths in levels):
            raise RaggedError(f"the list {self.type_string} is ragged", op=op)
        return tuple(min(lengths, default=0) for lengths in levels)

    @property
    def type_string(self) -> str:
        """The paper's notation, e.g. `[3, 5]float32[1, 4]`; `*` marks a ragged level."""
        levels = ", ".join(str(min(s, default=0)) if len(s) <= 1 else "*" for s in self._level_lengths())
        return f"[{levels}]{FTType((), self._element_shape, self._dtype)}"

    @property
    def ftype(self) -> FTType:
        lengths = self._regular_lengths("ftype")
        return FTType(tuple(Length.of(n) for n in lengths), self._element_shape, self._dtype)

    def __repr__(self):
        return self.type_string

    def to_numpy(self) -> np.ndarray:
        """A dense copy with the programmable axes first; ragged lists cannot be dense."""
        if self._dense is not None:
            return self.dense_view().copy()
        out = np.empty(self._regular_lengths("to_numpy") + self._element_shape, self._dtype)
        for i, item in enumerate(self._items):
            out[i] = item if self._depth == 1 else item.to_numpy()
        return out

    def dense_view(self) -> np.ndarray:
        """The list as one read-only array: the array it is a view of (from_numpy, a compiled
        program's output) without a copy, else a dense copy (to_numpy's)."""
        if self._dense is not None:  # (below an empty level every length reads 0, as for a built list)
            if all(self._dense.shape[:self._depth]):  # no empty level: the array as it is (a call's fast path)
                return self._dense
            return self._dense.reshape(self._regular_lengths("dense_view") + self._element_shape)
        arr = self.to_numpy()
        arr.flags.writeable = False
        return arr

    # -- access operators ----------------------------------------------------------------
    def _like(self, items, depth: int | None = None) -> "FractalTensor":
        return FractalTensor(items, self._depth if depth is None else depth, self._element_shape, self._dtype)

    def __getitem__(self, index):
        if isinstance(index, slice):
            if index.step == 0:
                raise WindowError("a slice step must not be zero", op="slice")
            return self._like(self._items[index])
        i = _as_int(index, "an index (or a slice)", "index")
        n = len(self._items)
        if not -n <= i < n:
            raise IndexRangeError(f"index {i} is out of range for the list {self.type_string}", op="index")
        return self._items[i]

    def window(self, size: int, stride: int = 1, padding=0, dilation: int = 1) -> "FractalTensor":
        size, stride, left, right, dilation = window_args(size, stride, padding, dilation)
        span = (size - 1) * dilation + 1
        padded_length = len(self._items) + left + right
        if span > padded_length:
            raise WindowError(f"a window of size {size}{f' dilated by {dilation}' if dilation > 1 else ''} does "
                              f"not fit the list {self.type_string} padded by ({left}, {right})", op="window")
        pad = [self._zero_item()] if left or right else []
        padded = pad * left + self._items + pad * right
        count = (padded_length - span) // stride + 1
        return self._like([self._like(padded[w * stride: w * stride + span: dilation]) for w in range(count)],
                          self._depth + 1)

    def flatten(self) -> "FractalTensor":
        if self._depth < 2:
            raise DepthError(f"needs a list of depth >= 2, got {self.type_string}", op="flatten")
        return FractalTensor([item for child in self._items for item in child._items], self._depth - 1,
                             self._element_shape, self._dtype)

    def split(self, size: int) -> "FractalTensor":
        size = _as_int(size, "the chunk size", "split")
        if size < 1 or len(self._items) % size:
            raise WindowError(f"chunks of {size} do not divide the list {self.type_string}", op="split")
        return self._like([self._like(self._items[a:a + size]) for a in range(0, len(self._items), size)],
                          self._depth + 1)

    def _permute_lists(self, perm: tuple) -> "FractalTensor":
        levels = self._level_lengths()[:len(perm)]
        if any(len(n) > 1 for n in levels):
            raise RaggedError(f"the list dims it permutes must be regular, got {self.type_string}", op="transpose")
        lengths = [min(n, default=0) for n in levels]

        def build(level, at):  # the result's list at result position `at` (its first `level` coordinates)
            if level == len(perm):
                src = [0] * len(perm)
                for k, a in enumerate(perm):
                    src[a] = at[k]
                node = self
                for i in src:
                    node = node._items[i]
                return node
            return self._like([build(level + 1, at + [i]) for i in range(lengths[perm[level]])],
                              self._depth - level)
        return build(0, [])

    def _zero_item(self):
        """An element of zeros; deeper elements must be regular to know their lengths."""
        if self._depth == 1:
            return FractalTensor.zeros((1,), self._element_shape, self._dtype)[0]
        lengths = self._regular_lengths("window")
        if not self._items:
            raise RaggedError("cannot pad an empty list of lists: its elements' lengths are unknown",
                              op="window")
        return FractalTensor.zeros(lengths[1:], self._element_shape, self._dtype)

    def gather(self, indices) -> "FractalTensor":
        if isinstance(indices, FractalTensor):  # ids as a list (given at call time when compiled)
            if indices.depth != 1 or indices.element_shape:
                raise DepthError(f"gather ids as a list must be [L] integer scalars, got {indices.type_string}",
                                 op="gather")
            indices = indices.to_numpy()
        idx = gather_indices(indices, len(self._items), self.type_string)
        return self._like([self._items[i] for i in idx.tolist()])

    def strided_split(self, d: int) -> "FractalTensor":
        d = _as_int(d, "the stride", "strided_split")
        if d < 1 or len(self._items) % d:
            raise WindowError(f"a stride of {d} does not divide the list {self.type_string}", op="strided_split")
        return self._like([self._like(self._items[r::d]) for r in range(d)], self._depth + 1)

    def strided_merge(self) -> "FractalTensor":
        if self._depth < 2:
            raise DepthError(f"needs a list of depth >= 2, got {self.type_string}", op="strided_merge")
        inner = {len(child) for child in self._items}
        if len(inner) > 1:
            raise RaggedError(f"needs sub-lists of one length, got {self.type_string}", op="strided_merge")
        d = len(self._items)
        merged = [self._items[t % d]._items[t // d] for t in range(d * min(inner, default=0))]
        return FractalTensor(merged, self._depth - 1, self._element_shape, self._dtype)

    def _repeat(self, n, inner: bool) -> "FractalTensor":
        if inner:
            return self._like([self._like([item] * n) for item in self._items], self._depth + 1)
        return self._like([self] * n, self._depth + 1)

    def _join(self, other) -> "FractalTensor":
        return self._like(self._items + list(other._items))


def gather_indices(indices, length, list_type: str) -> np.ndarray:
    """Gather's indices as int64, checked: a 1-D sequence of any integer dtype, each in
    [0, length) (`length` an int, or a symbolic `Length`: then only >= 0 and within int64)."""
    if is_traced(indices):
        raise AccessError(f"gather indices must be known while tracing (a numpy array or Python ints), not "
                          f"{describe_operand(indices)}: data-dependent indices are not supported", op="gather")
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise DepthError(f"gather indices must be a 1-D sequence, got shape {list(idx.shape)}", op="gather")
    if idx.size == 0:
        return idx.astype(np.int64)  # `[]` is a float array to numpy; it gathers nothing
    if not np.issubdtype(idx.dtype, np.integer):
        raise DTypeError(f"gather indices must have an integer dtype (int8 ... int64, uint8 ... uint64), "
                         f"got {idx.dtype}", op="gather")
    top = length.const if isinstance(length, Length) and length.is_concrete else length
    limit = top if isinstance(top, int) else np.iinfo(np.int64).max + 1
    # compared as Python ints: uint64 values past int64 and negative int8 values alike
    bad = [int(i) for i in (idx.min(), idx.max()) if not 0 <= int(i) < limit]
    if bad:
        bound = f"[0, {length})" if isinstance(top, int) else "[0, 2**63) (a 64-bit index)"
        raise IndexRangeError(f"gather index {bad[0]} is outside {bound} of the list {list_type} (indices of "
                              f"dtype {idx.dtype})", op="gather")
    return idx.astype(np.int64)


def window_args(size, stride, padding, dilation=1) -> tuple[int, int, int, int, int]:
    """A window's (size, stride, left, right, dilation), checked: `padding` is an int (both ends)
    or a (left, right) pair, each less than the window's span `(size - 1) * dilation + 1`: more
    padding only adds windows made entirely of zeros (a padding of 2**40 would add 2**41 of them)."""
    size = _as_int(size, "the window size", "window")
    stride = _as_int(stride, "the stride", "window")
    dilation = _as_int(dilation, "the dilation", "window")
    pair = (padding, padding) if np.ndim(padding) == 0 else tuple(padding)
    if len(pair) != 2:
        raise WindowError(f"padding must be an int or a (left, right) pair, got {padding!r}", op="window")
    left, right = (_as_int(p, "the padding", "window") for p in pair)
    span = (size - 1) * dilation + 1
    if size < 1 or stride < 1 or dilation < 1 or not (0 <= left < span and 0 <= right < span):
        raise WindowError(f"needs size >= 1, stride >= 1, dilation >= 1 and 0 <= padding < size on each side (< the "
                          f"span (size - 1) * dilation + 1 when dilated; more padding only adds windows of zeros), got "
                          f"size={size}, stride={stride}, padding=({left}, {right}), dilation={dilation}", op="window")
    return size, stride, left, right, dilation


def _nest_depth(node) -> tuple[int, bool]:
    """(depth, known) of a nested Python list; a nest of empty lists knows only a minimum depth."""
    if isinstance(node, FractalTensor):
        return node.depth, True
    if not isinstance(node, (list, tuple)):
        return 0, True
    subs = [_nest_depth(child) for child in node]
    known = {d for d, k in subs if k}
    if len(known) > 1:
        raise DepthError(f"siblings of different depths {sorted(known)}", op="from_list")
    if not known:
        return 1 + max((d for d, _ in subs), default=0), False
    depth = known.pop()
    if any(d > depth for d, _ in subs):
        raise DepthError(f"an empty list nested deeper than its siblings' depth {depth}", op="from_list")
    return depth + 1, True


def _read_only(arr: np.ndarray) -> np.ndarray:
    """A view of `arr` that cannot be written through (arr itself stays as writable as it was)."""
    view = arr.view()
    view.flags.writeable = False
    return view


def _convert_leaves(node, depth, dtype, signatures):
    """The nest with tensor leaves as arrays; collects each leaf's (shape, dtype)."""
    if isinstance(node, FractalTensor):
        signatures.add((node.element_shape, node.dtype))
        return node
    if depth == 0:
        arr = _read_only(np.asarray(node, dtype=dtype))
        signatures.add((arr.shape, check_dtype(arr.dtype, "from_list")))
        return arr
    if not isinstance(node, (list, tuple)):
        raise DepthError(f"a tensor where a list of depth {depth} was expected", op="from_list")
    return [_convert_leaves(child, depth - 1, dtype, signatures) for child in node]


def _wrap_nest(nest, depth, element_shape, dtype):
    if isinstance(nest, FractalTensor):
        return nest
    items = nest if depth == 1 else [_wrap_nest(child, depth - 1, element_shape, dtype) for child in nest]
    return FractalTensor(items, depth, element_shape, dtype)


class Zip(ListBase):
    """Lists of one length seen as one list of tuples; access operators apply to every component.

    `depth` is the number of zipped levels: 1 for `ft.zip` (an element is a tuple), 2 for
    `ft.product` (an element is a depth-1 Zip of pairs).
    """

    def __init__(self, components, depth: int = 1, element: bool = False):
        self.components = tuple(components)
        self._element = element  # an element of a deeper zip: unpacks into its lists (`__iter__`)
        check_lists(self.components, "zip")
        check_same_length(self.components, "zip")
        shallow = [c for c in self.components if c.depth < depth]
        if shallow:
            raise DepthError(f"cannot zip {depth} levels of {shallow[0]!r}", op="zip")
        self.depth = depth

    @property
    def _traced(self):
        return any(c._traced for c in self.components)

    def __len__(self):
        return len(self.components[0])

    def __iter__(self):
        """A zip's tuples, one per position; but an element of a deeper zip (a window, chunk or
        product row of zipped lists) unpacks into its lists, as FractalTensor's do: `wk, wv = win`
        for a window `win` over `ft.zip(ks, vs)` gives the keys' and the values' windows, not the
        window's first two pairs (`win[j]` is its j-th pair)."""
        if self._element:
            return iter(self.components)
        return super().__iter__()

    @property
    def length(self):
        return self.components[0].length

    def __repr__(self):
        return f"zip({', '.join(repr(c) for c in self.components)})"

    def _each(self, depth: int, method: str, *args) -> "Zip":
        return Zip([getattr(c, method)(*args) for c in self.components], depth)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._each(self.depth, "__getitem__", index)
        parts = [c[index] for c in self.components]
        if self.depth == 1:
            return tuple(parts)
        return Zip(parts, self.depth - 1, element=True)

    def window(self, size: int, stride: int = 1, padding=0, dilation: int = 1) -> "Zip":
        return self._each(self.depth + 1, "window", size, stride, padding, dilation)

    def flatten(self) -> "Zip":
        return self._each(max(self.depth - 1, 1), "flatten")

    def split(self, size: int) -> "Zip":
        return self._each(self.depth + 1, "split", size)

    def _permute_lists(self, perm: tuple) -> "Zip":
        return self._each(self.depth, "_permute_lists", perm)

    def gather(self, indices) -> "Zip":
        return self._each(self.depth, "gather", indices)

    def strided_split(self, d: int) -> "Zip":
        return self._each(self.depth + 1, "strided_split", d)

    def strided_merge(self) -> "Zip":
        return self._each(max(self.depth - 1, 1), "strided_merge")

    def _repeat(self, n, inner: bool) -> "Zip":
        return self._each(self.depth + 1, "_repeat", n, inner)


def arange(n: int, dtype: str = "float32") -> FractalTensor:
    """The list [0, 1, ..., n - 1] of 0-d values (indices as values: positions, masks by index);
    float32 by default, unlike numpy's int64, so that `x * i` keeps a float32 x float32. A constant
    of the program when traced: n must be an int."""
    n = _as_int(n, "the length of arange", "arange")
    if n < 0:
        raise WindowError(f"the length of arange must be >= 0, got {n}", op="arange")
    return FractalTensor.from_numpy(np.arange(n).astype(check_dtype(dtype, "arange")), 1)
