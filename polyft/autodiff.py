"""Reverse-mode differentiation of nested-list programs: `ft.vjp` and `ft.grad`.

The user's function runs on differentiable stand-ins (`ADValue` for a tensor element, `ADList`
for a list) whose primal values are numpy data or the tracer's values; every element operation,
access operator and compute operator they meet is computed on the primals by polyft itself and
recorded on a tape together with its adjoint rule. The adjoints are written with polyft's own
operators (see `autodiff_rules`): a map's adjoint is a map of the body's vjp, a scan's a reversed
scan (`scanr`) over the saved states, a view's the inverse view. The pullback is therefore
itself a nested-list program: called on numpy it runs eagerly; traced (`ft.compile(grad_fn, ...)`,
or `ft.compile(pullback, cotangent spec)`) it becomes an ETDG with the forward's states stored in
buffers and the backward's reversed scans scheduled like any other program.

A body function (of a map or a scan) is differentiated by running it again inside the backward
operator on fresh stand-ins; values it captures from an enclosing body (a layer's weight in a
time step) are found as operands that belong to another tape, and their cotangents are summed
over the iterations and handed out to the enclosing tape. A compute operator inside a body whose
result is the body's result (a layer's time scan) is not recomputed in the backward: its
primal is the enclosing operator's saved output (the replay plan).
"""
from __future__ import annotations

import numpy as np

from . import errors, pytree
from .recording import HANDLERS, recording, stack as _stack
from .fractaltensor import FractalTensor, ListBase, Zip, is_traced, unzip
from .primitives import PRIMITIVES


class DifferentiationError(errors.PolyftError):
    """A program, operator or value that cannot be differentiated (an integer output, argmax,
    a gather by data-dependent indices, a non-scalar `grad` output)."""


_FLOATS = ("float16", "float32", "float64")
class _Pushed:
    """`with _Pushed(tape):` records on `tape` (None pauses recording) inside the block."""

    def __init__(self, tape):
        self.tape = tape

    def __enter__(self):
        _stack().append(self.tape)
        return self.tape

    def __exit__(self, *exc):
        _stack().pop()


class _Entry:
    """One recorded operation: its stand-in inputs (None for constants), outputs, and `backward`
    (output cotangents -> input cotangents, None meaning zero)."""

    __slots__ = ("inputs", "outputs", "backward", "plan", "name")

    def __init__(self, name, inputs, outputs, backward, plan=None):
        self.name = name  # the operation, for reading a tape
        self.inputs = inputs  # None for a compute operator: its backward returns (stand-in, cotangent) pairs
        self.outputs = outputs
        self.backward = backward
        self.plan = plan  # compute operators: (the body's replay plan, the outputs' pytree structure)


class Tape:
    """The operations of one run of a function (the program, or one body of a compute operator)."""

    def __init__(self, replay=None, checkpoint=None):
        self.entries: list[_Entry] = []
        self.checkpoint = checkpoint  # k: scans keep every k-th state (None: all); body tapes inherit it
        self.n_compute = 0  # compute operators recorded so far (their index in a replay plan)
        self.replay = replay  # (plan, saved result leaves) while a body is run again in a backward

    def record(self, name, inputs, outputs, backward) -> None:
        self.entries.append(_Entry(name, list(inputs), list(outputs), backward))

    def record_compute(self, name, outputs, backward, plan) -> None:
        """A compute operator: its backward finds its inputs (and the values its body captured) itself."""
        self.entries.append(_Entry(name, None, list(outputs), backward, plan))

    def plan_for(self, result) -> list:
        """Per compute operator recorded: which of its outputs are leaves of `result` (those the
        backward takes from the enclosing operator's saved output instead of recomputing), and
        its own body's plan."""
        where = {id(leaf): m for m, leaf in enumerate(pytree.leaves(result)) if is_ad(leaf)}
        return [({j: where[id(o)] for j, o in enumerate(e.outputs) if id(o) in where}, e.plan[1], e.plan[0])
                for e in self.entries if e.plan is not None]

    def backward(self, outputs: list, cts: list) -> dict:
        """Sweep the tape backwards from `cts` on `outputs`: {id(stand-in): [stand-in, cotangent]}
        for every stand-in not produced here (the leaves, and values captured from outside)."""
        acc: dict = {}
        for o, c in zip(outputs, cts):
            if is_ad(o):
                _accumulate(acc, o, c)
        for e in reversed(self.entries):
            couts = [acc.pop(id(o), [None, None])[1] for o in e.outputs]
            if all(c is None for c in couts):
                continue
            cins = e.backward(couts)
            for x, c in (cins if e.inputs is None else zip(e.inputs, cins)):
                if x is not None:
                    _accumulate(acc, x, c)
        return acc


def _accumulate(acc: dict, x, c) -> None:
    if c is None:
        return
    if id(x) in acc:
        acc[id(x)][1] = add(acc[id(x)][1], c)
    else:
        acc[id(x)] = [x, c]


def is_ad(x) -> bool:
    return getattr(x, "_ad", False) is True


def primal(x):
    """The value a stand-in stands for (zips and pytrees of them too); other values as they are."""
    if isinstance(x, Zip):
        return Zip([primal(c) for c in x.components], x.depth)
    if isinstance(x, tuple):
        return tuple(primal(v) for v in x)
    return x.primal if is_ad(x) else x


def wrap(p, tape):
    """A stand-in for the primal value p (a tensor or a list), recorded on `tape`."""
    if isinstance(p, ListBase):
        return ADList(p, tape)
    return ADValue(p, tape)


# ---------------------------------------------------------------------------------------
# Compute operators for the adjoints: while a trace is in progress (a pullback being compiled)
# eager lists (the forward's saved values, masks) join it as constants, since the bodies compute on
# traced values even when every list is eager


def tracing_now() -> bool:
    """Whether a trace is in progress (the pullback is being compiled, not run on numpy)."""
    from . import tracing
    return getattr(tracing._TRACING, "state", None) is not None


def _traceable(x):
    from . import tracing
    if not tracing_now():
        return x
    if isinstance(x, Zip):
        return Zip([_traceable(c) for c in x.components], x.depth)
    return tracing._lift_leaf(x, "vjp") if isinstance(x, FractalTensor) else x


def ft_map(f, *lists):
    from . import operators
    return operators.map(f, *[_traceable(xs) for xs in lists])


def ft_aggregate(op: str, f, xs, init=None):
    """ft.reduce / ft.scanl / ft.scanr on `xs`, as `ft_map` does for map."""
    from . import operators
    return getattr(operators, op)(f, _traceable(xs), pytree.map(_traceable, init))


# ---------------------------------------------------------------------------------------
# Cotangent arithmetic on values and lists (None is a zero)


def _is_list(x) -> bool:
    return isinstance(x, ListBase)


def add(a, b):
    """a + b on tensors, element by element on lists (ft.map), None as zero."""
    if a is None:
        return b
    if b is None:
        return a
    if _is_list(a):
        return ft_map(add, a, b)
    return a + b


def scale(m, c):
    """m * c with m a scalar tensor, on every element of a list c."""
    if _is_list(c):
        return ft_map(lambda e: scale(m, e), c)
    return c * m


def zeros_like(p):
    """Zeros of p's type: a tensor, or a list of zeros (ft.map)."""
    if _is_list(p):
        return ft_map(zeros_like, p)
    if is_traced(p):
        from . import elementmath
        return elementmath.zeros_like(p)
    return np.zeros_like(np.asarray(p))


def _dtype_name(p) -> str:
    return str(p.dtype) if hasattr(p, "dtype") else np.asarray(p).dtype.name


def check_float(p, what, op: str, where: str | None = None) -> None:
    """Differentiation is defined on float data only: an integer value is a DifferentiationError
    (`what()` names the value; `where`, the line that made it, else the caller's)."""
    dtype = _dtype_name(p)
    if dtype not in _FLOATS:
        raise DifferentiationError(f"{what()} has the integer dtype {dtype}: only float values have gradients", op=op,
                                   where=where)


# ---------------------------------------------------------------------------------------
# Stand-ins


class ADValue:
    """A tensor element being differentiated: its primal (numpy or the tracer's `Value`) and the tape
    it was made on. Python's operators and polyft's element math on it are recorded."""

    _ad = True
    _traced = False
    origin = None  # an integer result's (operation, user line): what an error about it names
    __array_priority__ = 2000
    __hash__ = object.__hash__

    def __init__(self, primal_value, tape):
        self.primal = primal_value
        self.tape = tape

    @property
    def shape(self):
        return tuple(np.shape(self.primal)) if not is_traced(self.primal) else self.primal.shape

    @property
    def dtype(self):
        return self.primal.dtype if is_traced(self.primal) else np.asarray(self.primal).dtype

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return f"ADValue({self.dtype}{list(self.shape)})"

    # Python's binary operators (`x + y`, `2 * x`, ...): set below the class from their table names

    def __neg__(self):
        return bind("neg", (self,), {})

    def __abs__(self):
        return bind("abs", (self,), {})

    @property
    def T(self):
        if self.ndim < 2:
            return self
        if self.ndim > 2:
            raise errors.ShapeError(f"x.T reverses every axis of a {self.ndim}-D element; use ft.transpose(x)",
                                    op="x.T")
        return bind("transpose", (self,), {})

    def astype(self, dtype):
        return bind("astype", (self,), {"dtype": np.dtype(dtype).name})

    def transpose(self, *axes):
        """numpy's `x.transpose(*axes)`; no axes: every axis reversed."""
        from . import elementmath
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return elementmath.transpose(self, tuple(axes) if axes else tuple(range(self.ndim))[::-1])

    def reshape(self, *shape):
        from . import elementmath
        return elementmath.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list))
                                   else shape)

    def __getitem__(self, key):
        return bind("getitem", (self,), {"key": key})

    def sum(self, axis=None, keepdims=False):
        return bind("sum", (self,), {"axis": axis, "keepdims": keepdims})

    def max(self, axis=None, keepdims=False):
        return bind("max", (self,), {"axis": axis, "keepdims": keepdims})

    def mean(self, axis=None, keepdims=False):
        return bind("mean", (self,), {"axis": axis, "keepdims": keepdims})

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from .tracing import _UFUNCS
        name = _UFUNCS.get(ufunc)
        if name is None or method != "__call__" or kwargs:
            raise DifferentiationError(f"numpy's {ufunc.__name__} has no gradient rule; use polyft's element math "
                                       "(ft.tanh, ft.exp, ...) and + - * / @", op=f"np.{ufunc.__name__}")
        return bind(name, inputs, {})

    def __bool__(self):
        raise errors.TracerControlFlowError("Python control flow on a value being differentiated: use ft.maximum / "
                                            "ft.where / arithmetic instead of if/while/bool()", op="control flow")


def _binop(name: str, swap: bool):
    def f(self, other):
        return bind(name, (other, self) if swap else (self, other), {})
    return f


for _name in ("add", "sub", "mul", "truediv", "matmul", "pow"):
    setattr(ADValue, f"__{_name}__", _binop(_name, False))
    setattr(ADValue, f"__r{_name}__", _binop(_name, True))
# comparisons and logic: 0/1 masks without a gradient, as on traced values (`tracing.Value`)
for _name, _prim in (("gt", "greater"), ("lt", "less"), ("ge", "greater_equal"), ("le", "less_equal"),
                     ("eq", "equal"), ("ne", "not_equal")):
    setattr(ADValue, f"__{_name}__", _binop(_prim, False))
for _name in ("and", "or", "xor"):
    setattr(ADValue, f"__{_name}__", _binop(f"logical_{_name}", False))
    setattr(ADValue, f"__r{_name}__", _binop(f"logical_{_name}", True))
ADValue.__invert__ = lambda self: bind("logical_not", (self,), {})


def bind(name: str, args, attrs: dict):
    """The element operation `name` on stand-ins: computed on the primals (eagerly or traced) and
    recorded with its adjoint rule (`autodiff_rules.RULES`)."""
    from . import elementmath, tracing
    prim = PRIMITIVES[name]
    if prim.variadic:  # concat's operands: one by one, as a tuple, or as a depth-1 list (its elements)
        one = len(args) == 1 and (isinstance(args[0], (tuple, list)) or is_ad(args[0]) and args[0].depth == 1)
        args = tuple(args[0]) if one else tuple(args)
    prims = [primal(a) for a in args]
    for p in prims:
        if isinstance(p, ListBase):
            raise errors.DepthError(f"works on static-shape tensors, got the list {p!r}; apply it to each element "
                                    "with ft.map", op=name)
    if any(is_traced(p) for p in prims):
        out = tracing.apply_op(name, prims, attrs)
    else:
        out = elementmath._bind(name, tuple(prims), attrs)
    rule = HANDLERS["rules"].get(name)
    live = [a if is_ad(a) else None for a in args]
    if rule is None:
        raise DifferentiationError(f"{name} has no gradient (not differentiable); compute it outside the "
                                   "differentiated function or from values that need no gradient", op=name)
    tape = recording() or args[[is_ad(a) for a in args].index(True)].tape
    for a, p in zip(args, prims):
        if is_ad(a):
            check_float(p, lambda: f"the operand {describe(p)}", name)
    result = ADValue(out, tape)
    if _dtype_name(out) not in _FLOATS:  # no gradient flows through it: an error only if it is an output
        result.origin = (name, errors.user_location())
    tape.record(name, live, [result], lambda cts: _in_dtypes(rule(cts[0], out, prims, attrs), prims))
    return result


def _in_dtypes(cts, prims):
    """Each cotangent in its operand's dtype: a float32 value times a float64 constant has a float32
    cotangent (as torch's), so that a scan's reversed state keeps the forward state's type."""
    return [c.astype(_dtype_name(p)) if c is not None and not _is_list(c) and not _is_number(p)
            and _dtype_name(p) in _FLOATS and _dtype_name(c) != _dtype_name(p) else c for c, p in zip(cts, prims)]


def _is_number(p) -> bool:
    return isinstance(p, (int, float)) and not isinstance(p, (bool, np.generic))


def describe(p) -> str:
    if isinstance(p, ListBase):
        return f"the list {p!r}"
    if is_traced(p):
        return f"{p.dtype}{list(p.shape)}"
    return f"{np.asarray(p).dtype}{list(np.shape(p))}"


class ADList(ListBase):
    """A list being differentiated: its primal list (a FractalTensor or the tracer's list) and its tape.
    Access operators on it are recorded with the inverse view as their adjoint; compute operators
    over it go to `compute`."""

    _ad = True

    def __init__(self, primal_value, tape):
        self.primal = primal_value
        self.tape = tape

    def __len__(self):
        return len(self.primal)

    # the primal list's type: length, depth, element_shape, dtype, type_string (set below the class)

    def __repr__(self):
        return f"ADList({self.primal!r})"

    def to_numpy(self):
        return self.primal.to_numpy()

    def _access(self, op, *args):
        return HANDLERS["access"](self, op, *args)

    def __getitem__(self, index):
        return self._access("getitem", index)

    def window(self, size, stride=1, padding=0, dilation=1):
        return self._access("window", size, stride, padding, *([dilation] if dilation != 1 else []))

    def gather(self, indices):
        return self._access("gather", indices)

    def strided_split(self, d):
        return self._access("strided_split", d)

    def strided_merge(self):
        return self._access("strided_merge")

    def flatten(self):
        return self._access("flatten")

    def split(self, size):
        return self._access("split", size)

    def _permute_lists(self, perm):
        return self._access("permute", tuple(perm))

    def _repeat(self, n, inner):
        return self._access("product", n, inner)


for _name in ("length", "depth", "element_shape", "dtype", "type_string"):
    setattr(ADList, _name, property(lambda self, _name=_name: getattr(self.primal, _name)))


# ---------------------------------------------------------------------------------------
# The public entry points


def _wrap_input(x, tape, k):
    """The stand-in for input k (a FractalTensor or a numpy array; tuples of them)."""
    if isinstance(x, tuple):
        return tuple(_wrap_input(v, tape, k) for v in x)
    if isinstance(x, Zip):
        return Zip([_wrap_input(c, tape, k) for c in x.components], x.depth)
    if isinstance(x, (ListBase, np.ndarray, np.generic)) or is_traced(x):
        if not isinstance(x, ListBase):
            x = x if is_traced(x) else np.asarray(x)
        check_float(x, lambda: f"input {k} ({describe(x)})", "vjp")
        return wrap(x, tape)
    raise DifferentiationError(f"input {k} is a Python {type(x).__name__}; differentiate with respect to "
                               "FractalTensors or numpy arrays (close over other arguments)", op="vjp")


def vjp(fn, *inputs, checkpoint=None):
    """`(outputs, pullback)`: fn run on `inputs` (recorded), and `pullback(cotangents)` -> one gradient
    per input (a tuple). The pullback computes with polyft operators only, so `ft.compile(pullback,
    *cotangent specs)` compiles the backward pass (the forward's results are its constants).
    `checkpoint=k`: every scan whose length is a multiple of k (and longer) keeps every k-th state
    only; the backward recomputes each segment of k steps from its checkpoint (less memory, one more
    forward's worth of element math)."""
    if checkpoint is not None and (isinstance(checkpoint, bool) or not isinstance(checkpoint, (int, np.integer))
                                   or checkpoint < 2):
        raise DifferentiationError(f"checkpoint must be an int >= 2 (keep every k-th state of a scan) or None, got "
                                   f"{checkpoint!r}", op="vjp")
    tape = Tape(checkpoint=None if checkpoint is None else int(checkpoint))
    with _Pushed(tape):
        ad_inputs = [_wrap_input(x, tape, k) for k, x in enumerate(inputs)]
        result = unzip(fn(*ad_inputs))
    out_leaves = pytree.leaves(result)
    for leaf in out_leaves:
        if not is_ad(leaf):
            raise DifferentiationError(f"the function returned {describe(leaf)}, which does not depend on the inputs "
                                       "being differentiated", op="vjp")
        op, where = getattr(leaf, "origin", None) or ("vjp", None)  # an ADList has none
        check_float(leaf.primal, lambda: f"the output {describe(leaf.primal)}", op, where)
    outputs = pytree.unflatten(pytree.structure(result), [o.primal for o in out_leaves])

    def pullback(*cotangents):
        cts = cotangents[0] if len(cotangents) == 1 else cotangents
        ct_leaves = pytree.leaves(unzip(cts))
        if len(ct_leaves) != len(out_leaves):
            raise DifferentiationError(f"the pullback takes one cotangent per output ({len(out_leaves)}), got "
                                       f"{len(ct_leaves)}", op="pullback")
        ct_leaves = [FractalTensor.from_numpy(c, o.primal.depth) if isinstance(c, np.ndarray) and _is_list(o.primal)
                     and c.ndim >= o.primal.depth else c for c, o in zip(ct_leaves, out_leaves)]
        for k, (c, o) in enumerate(zip(ct_leaves, out_leaves)):
            _check_cotangent(k, len(out_leaves), c, o.primal)
        with _Pushed(None):
            acc = tape.backward(out_leaves, ct_leaves)
            grads = tuple(pytree.map(lambda a: _grad_of(acc, a), x) for x in ad_inputs)
        return grads

    return outputs, pullback


def _type_of(x) -> tuple | None:
    """(depth, lengths or None where symbolic, element shape, dtype) of a list or an array, None
    for anything else."""
    if _is_list(x):
        lengths = None if is_traced(x) or not x.is_regular else x.dense_view().shape[:x.depth]
        return x.depth, lengths, tuple(x.element_shape), np.dtype(x.dtype)
    if is_traced(x) or isinstance(x, (np.ndarray, np.generic)):
        return 0, (), tuple(x.shape), np.dtype(x.dtype)  # a traced value's static shape: not np.shape
    return None


def _check_cotangent(k: int, n: int, ct, primal) -> None:
    """A DifferentiationError unless the cotangent `ct` of output k is of its output's kind: a list
    of its depth, lengths (where both are known) and element shape, or an array of its shape; of
    a float dtype."""
    want, got = _type_of(primal), _type_of(ct)
    fits = got is not None and got[0] == want[0] and got[2] == want[2] and got[3].kind == "f" and \
        (got[1] is None or want[1] is None or tuple(got[1]) == tuple(want[1]))
    if fits:
        return
    which = "the output" if n == 1 else f"output {k}"
    shown = describe(ct) if got is not None else f"a Python {type(ct).__name__}"
    raise DifferentiationError(f"the cotangent of {which} must be of its type, {describe(primal)} (a float dtype); "
                               f"got {shown}", op="pullback")


def _argnums(argnums) -> tuple:
    """(positions, one) for grad's `argnums`: an int, or a tuple or list of ints."""
    def position(a) -> bool:
        return isinstance(a, (int, np.integer)) and not isinstance(a, bool)
    if position(argnums):
        return (int(argnums),), True
    if isinstance(argnums, (tuple, list)) and argnums and all(position(a) for a in argnums):
        return tuple(int(a) for a in argnums), False
    raise DifferentiationError(f"argnums must be an input's position (an int) or a non-empty tuple of them, got "
                               f"{argnums!r} ({type(argnums).__name__})", op="grad")


def _grad_of(acc, a):
    if isinstance(a, Zip):
        return tuple(_grad_of(acc, c) for c in a.components)
    ct = acc.get(id(a), [None, None])[1]
    return zeros_like(a.primal) if ct is None else ct


def grad(fn, argnums=0, checkpoint=None):
    """The function `(*inputs) -> gradient(s)` of fn's scalar output with respect to the inputs named
    by argnums (an int: one gradient; a tuple: a tuple). It is a polyft program too: eager on numpy,
    compiled by `ft.compile(ft.grad(fn), *specs)` (forward and backward in one program). `checkpoint`
    as for `vjp`."""
    nums, one = _argnums(argnums)

    def grad_fn(*inputs):
        for k in nums:
            if not -len(inputs) <= k < len(inputs):
                raise DifferentiationError(f"argnums {k} is out of range for {len(inputs)} inputs", op="grad")
        wanted = [k % len(inputs) for k in nums]

        def partial(*xs):
            full = list(inputs)
            for k, x in zip(wanted, xs):
                full[k] = x
            return fn(*full)

        out, pullback = vjp(partial, *[inputs[k] for k in wanted], checkpoint=checkpoint)
        leaves = pytree.leaves(unzip(out))
        if len(leaves) != 1 or _is_list(leaves[0]) or tuple(leaves[0].shape) not in ((), (1,), (1, 1)):
            raise DifferentiationError(f"grad needs a function with one scalar output, got {describe_tree(out)}; use "
                                       "ft.vjp for other outputs (or reduce them with ft.sum)", op="grad")
        seed = _ones_like(leaves[0])
        grads = pullback(seed)
        return grads[0] if one else grads

    grad_fn.__name__ = f"grad_{getattr(fn, '__name__', 'fn')}"
    return grad_fn


def describe_tree(value) -> str:
    return pytree.describe(value, describe)


def _ones_like(p):
    if is_traced(p):
        return zeros_like(p) + 1.0
    return np.ones_like(np.asarray(p))


HANDLERS["bind"] = bind
