"""The adjoint of every differentiable operator, written with polyft's own operators.

Element rules (`RULES`) take the output cotangent, the output, the primal operands and the
attributes, and return one cotangent per operand (None: zero, or a constant operand); they use
only + - * / @ and polyft's element math, so they compute on numpy and trace alike. Access
operators' adjoints are the inverse views; compute operators' adjoints (`compute`) are maps of
the body's vjp and reversed scans (`scanr`) over the states the forward scan saved.
"""
from __future__ import annotations

import functools
import types

import numpy as np

from . import elementmath as em
from . import pytree
from .autodiff import (_FLOATS, DifferentiationError, Tape, _is_list, _Pushed, _traceable, add, ft_aggregate, ft_map,
                       is_ad, primal, recording, scale, tracing_now, wrap, zeros_like)
from .fractaltensor import FractalTensor, ListBase, Zip, is_traced, unzip, window_args
from .primitives import getitem_axes, normalize_axis
from .recording import HANDLERS


# ---------------------------------------------------------------------------------------
# Element math


def _shape(x) -> tuple:
    return tuple(x.shape) if is_traced(x) else np.shape(x)


def _reshape(x, shape):
    shape = tuple(shape)
    if _shape(x) == shape:
        return x
    return em.reshape(x, shape) if is_traced(x) else np.reshape(x, shape)


def _unbroadcast(g, shape):
    """g summed over the axes numpy broadcast an operand of `shape` along (None for a Python number)."""
    if g is None or shape is None:
        return None
    gshape = _shape(g)
    if gshape == tuple(shape):
        return g
    lead = len(gshape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and gshape[lead + i] != 1)
    return _reshape(em.sum(g, axis=axes, keepdims=True), shape)


def _is_number(p) -> bool:
    """A Python number operand (a constant: no cotangent); numpy's 0-d values are tensors."""
    return isinstance(p, (int, float)) and not isinstance(p, (bool, np.generic))


def _operand_shape(p):
    return None if _is_number(p) else _shape(p)


def _binary(da, db):
    """A rule for a broadcasting binary operation from its two partial products."""
    def rule(ct, out, prims, attrs):
        a, b = prims
        return [_unbroadcast(da(ct, out, a, b), _operand_shape(a)), _unbroadcast(db(ct, out, a, b), _operand_shape(b))]
    return rule


def _unary(d):
    return lambda ct, out, prims, attrs: [d(ct, out, prims[0])]


def _kept(v, shape, axis, keepdims):
    """A reduction's result (or its cotangent) with the reduced axes kept as size 1."""
    if keepdims:
        return v
    axes = normalize_axis("sum", shape, axis)
    return _reshape(v, tuple(1 if i in axes else n for i, n in enumerate(shape)))


def _count(shape, axis) -> int:
    return int(np.prod([shape[a] for a in normalize_axis("mean", shape, axis)]))


def _matmul(ct, out, prims, attrs):
    a, b = prims
    if len(_shape(a)) < 2 or len(_shape(b)) < 2:
        raise DifferentiationError("the gradient of a matmul with a 1-D operand is not supported; make it [1, n]",
                                   op="matmul")
    return [_unbroadcast(ct @ em.transpose(b), _shape(a)), _unbroadcast(em.transpose(a) @ ct, _shape(b))]


def _permute(ct, out, prims, attrs):
    axes = attrs["axes"]
    return [em.transpose(ct, tuple(sorted(range(len(axes)), key=lambda k: axes[k])))]


def _scatter_add(ct, out, prims, attrs):
    """x's cotangent is ct read back at ids (`ct[ids]`): the one-hot matrix of ids (identity rows
    scattered by the same ids, [n, L]) transposed times ct; the ids have none. `combine="max"` has
    no gradient rule."""
    x, ids = prims
    if attrs.get("combine", "sum") != "sum":
        raise DifferentiationError("scatter_add with combine='max' has no gradient; use combine='sum'",
                                   op="scatter_add")
    shape, n = _shape(x), attrs["n"]
    onehot = em.scatter_add(np.eye(shape[0], dtype=np.dtype(str(x.dtype))), ids, n)
    rows = _reshape(ct, (n, int(np.prod(shape[1:], dtype=np.int64))))
    return [_reshape(em.transpose(onehot) @ rows, shape), None]


def _max(ct, out, prims, attrs):
    """Split among the maxima (ties share), as torch's amax."""
    x, shape = prims[0], _shape(prims[0])
    top = _kept(out, shape, attrs.get("axis"), attrs.get("keepdims", False))
    hit = em.where(top - x, zeros_like(x), zeros_like(x) + 1.0)
    hits = em.sum(hit, axis=attrs.get("axis"), keepdims=True)
    return [hit * _kept(ct, shape, attrs.get("axis"), attrs.get("keepdims", False)) / hits]


def _sum(ct, out, prims, attrs):
    x = prims[0]
    return [zeros_like(x) + _kept(ct, _shape(x), attrs.get("axis"), attrs.get("keepdims", False))]


def _mean(ct, out, prims, attrs):
    x = prims[0]
    return [zeros_like(x) + _kept(ct, _shape(x), attrs.get("axis"), attrs.get("keepdims", False))
            * (1.0 / _count(_shape(x), attrs.get("axis")))]


def _softmax(ct, out, prims, attrs):
    return [out * (ct - em.sum(ct * out, axis=attrs.get("axis", -1), keepdims=True))]


def _logsumexp(ct, out, prims, attrs):
    x, axis, keep = prims[0], attrs.get("axis"), attrs.get("keepdims", False)
    return [em.exp(x - _kept(out, _shape(x), axis, keep)) * _kept(ct, _shape(x), axis, keep)]


def _concat(ct, out, prims, attrs):
    axis = normalize_axis("concat", _shape(out), attrs.get("axis", 0))[0]
    cts, start = [], 0
    for p in prims:
        n = _shape(p)[axis]
        cts.append(ct[(slice(None),) * axis + (slice(start, start + n),)])
        start += n
    return cts


def _getitem(ct, out, prims, attrs):
    """The slice's cotangent padded back with zeros (ft.concat along each sliced axis)."""
    x, key = prims[0], attrs["key"]
    shape = _shape(x)
    axes = getitem_axes(key, shape)
    if axes is not None and all(step == 1 for _, step, _ in axes):
        g = ct
        for d, (start, _, _) in enumerate(axes):
            n = _shape(g)[d]
            if n == shape[d]:
                continue
            before = np.zeros(_shape(g)[:d] + (start,) + _shape(g)[d + 1:], np.dtype(str(x.dtype)))
            after = np.zeros(_shape(g)[:d] + (shape[d] - start - n,) + _shape(g)[d + 1:], np.dtype(str(x.dtype)))
            g = em.concat(_nonempty((before, g, after), d), axis=d)
        return [g]
    if not is_traced(ct):
        g = np.zeros(shape, np.asarray(x).dtype)
        np.add.at(g, key, ct)
        return [g]
    raise DifferentiationError(f"the gradient of x[{key!r}] (integer or strided indices) is only computed eagerly; "
                               "slice with start:stop", op="getitem")


def _nonempty(parts, d):
    return tuple(p for p in parts if not isinstance(p, np.ndarray) or p.shape[d])


def _select(mask, a, b=None):
    """`a` where mask is nonzero, else `b` (zeros of a's type by default): ft.where."""
    return em.where(mask, a, zeros_like(a) if b is None else b)


# x ** p: by the exponent, out * log(x), taken as 0 where x is 0 (as torch does)
_pow = _binary(lambda ct, o, x, p: ct * p * x ** (p - 1),
               lambda ct, o, x, p: em.where(x, ct * o * em.log(x), zeros_like(ct)))


def _astype(ct, out, prims, attrs):
    x = prims[0]
    dtype = str(x.dtype) if is_traced(x) else np.asarray(x).dtype.name
    return [ct.astype(dtype)]


def _where(ct, out, prims, attrs):
    mask, a, b = prims
    return [None, _unbroadcast(em.where(mask, ct, zeros_like(ct)), _operand_shape(a)),
            _unbroadcast(em.where(mask, zeros_like(ct), ct), _operand_shape(b))]


_TWO_OVER_SQRT_PI, _SQRT1_2, _INV_SQRT_2PI = 1.1283791670955126, 0.7071067811865476, 0.3989422804014327

RULES = {
    "add": _binary(lambda ct, o, a, b: ct, lambda ct, o, a, b: ct),
    "sub": _binary(lambda ct, o, a, b: ct, lambda ct, o, a, b: -ct),
    "mul": _binary(lambda ct, o, a, b: ct * b, lambda ct, o, a, b: ct * a),
    "truediv": _binary(lambda ct, o, a, b: ct / b, lambda ct, o, a, b: -ct * o / b),
    "neg": _unary(lambda ct, o, x: -ct),
    "matmul": _matmul,
    "transpose": _unary(lambda ct, o, x: em.transpose(ct)),
    "permute": _permute,
    "copy": _unary(lambda ct, o, x: ct),
    "astype": _astype,
    "reshape": _unary(lambda ct, o, x: _reshape(ct, _shape(x))),
    "getitem": _getitem,
    "concat": _concat,
    "tanh": _unary(lambda ct, o, x: ct * (1.0 - o * o)),
    "sigmoid": _unary(lambda ct, o, x: ct * o * (1.0 - o)),
    "exp": _unary(lambda ct, o, x: ct * o),
    "log": _unary(lambda ct, o, x: ct / x),
    "log1p": _unary(lambda ct, o, x: ct / (1.0 + x)),
    "sqrt": _unary(lambda ct, o, x: ct * 0.5 / o),
    "softplus": _unary(lambda ct, o, x: ct * em.sigmoid(x)),
    "relu": _unary(lambda ct, o, x: _select(o, ct)),
    "abs": _unary(lambda ct, o, x: _select(x, ct * x / em.where(x, o, zeros_like(o) + 1.0))),
    # the operand the result came from (a where o - b is nonzero: o is a) takes the cotangent
    "maximum": _binary(lambda ct, o, a, b: _select(o - b, ct), lambda ct, o, a, b: _select(o - b, zeros_like(ct), ct)),
    "minimum": _binary(lambda ct, o, a, b: _select(o - b, ct), lambda ct, o, a, b: _select(o - b, zeros_like(ct), ct)),
    "sin": _unary(lambda ct, o, x: ct * em.cos(x)),
    "cos": _unary(lambda ct, o, x: -ct * em.sin(x)),
    "tan": _unary(lambda ct, o, x: ct * (1.0 + o * o)),
    "erf": _unary(lambda ct, o, x: ct * _TWO_OVER_SQRT_PI * em.exp(-x * x)),
    # d/dx x Phi(x) = Phi(x) + x phi(x)
    "gelu": _unary(lambda ct, o, x: ct * (0.5 + 0.5 * em.erf(x * _SQRT1_2) + x * _INV_SQRT_2PI * em.exp(-0.5 * x * x))),
    "rsqrt": _unary(lambda ct, o, x: ct * -0.5 * o * o * o),
    # piecewise constant: zero almost everywhere (as torch's sign, floor and comparisons)
    **{name: lambda ct, out, prims, attrs: [None] * len(prims)
       for name in ("sign", "floor", "greater", "less", "greater_equal", "less_equal", "equal", "not_equal",
                    "logical_and", "logical_or", "logical_xor", "logical_not")},
    "max": _max,
    "sum": _sum,
    "mean": _mean,
    "softmax": _softmax,
    "logsumexp": _logsumexp,
    "pow": _pow,
    "where": _where,
    "scatter_add": _scatter_add,
    "zeros_like": lambda ct, out, prims, attrs: [None],
}


# ---------------------------------------------------------------------------------------
# Access operators: the inverse views


def access(xs, op: str, *args):
    """An access operator on a list being differentiated; its adjoint is the inverse view (a reversal,
    the strided merge of a strided split, sums over a broadcast) or, where the view drops or repeats
    positions (slices, indexing, windows), the cotangent read back at each position (`gather`) times a
    0/1 mask, summed over the view's columns (a window's overlap-add)."""
    p = xs.primal
    tape = recording() or xs.tape
    if op == "getitem":
        out, back = p[args[0]], lambda ct: _unview(ct, p, args[0])
    elif op == "window":
        out, back = p.window(*args), lambda ct: _unwindow(ct, p, *args)
    elif op == "gather":
        out, back = p.gather(args[0]), lambda ct: _scatter(ct, p, args[0])
    elif op == "strided_split":
        out, back = p.strided_split(args[0]), lambda ct: ct.strided_merge()
    elif op == "strided_merge":
        out, back = p.strided_merge(), lambda ct: ct.strided_split(_concrete_length(p, op))
    elif op == "flatten":
        out, back = p.flatten(), lambda ct: ct.split(_inner_length(p))
    elif op == "split":
        out, back = p.split(args[0]), lambda ct: ct.flatten()
    elif op == "permute":
        inverse = tuple(sorted(range(len(args[0])), key=lambda k: args[0][k]))
        out, back = p._permute_lists(args[0]), lambda ct: ct._permute_lists(inverse)
    else:  # "product": `_repeat(n, inner)`, each element n times (inner) or the list n times
        n, inner = args
        out = p._repeat(n, inner)
        back = (lambda ct: ft_map(lambda row: ft_aggregate("reduce", add, row), ct)) if inner else \
            (lambda ct: ft_aggregate("reduce", add, ct))
    result = wrap(out, tape)
    tape.record(op, [xs], [result], lambda cts: [back(cts[0])])
    return result


def join(xs, ys):
    """`xs.join(ys)` with either being differentiated; the cotangent splits where the parts meet."""
    px, py = primal(xs), primal(ys)
    tape = recording() or (xs if is_ad(xs) else ys).tape
    result = wrap(px.join(py), tape)
    n = _concrete_length(px, "join")
    tape.record("join", [xs if is_ad(xs) else None, ys if is_ad(ys) else None], [result],
                lambda cts: [cts[0][:n], cts[0][n:]])
    return result


def _concrete_length(p, op: str) -> int:
    length = p.length
    if isinstance(length, int):
        return length
    if getattr(length, "is_concrete", False):
        return length.const
    raise DifferentiationError(f"the gradient of {op} needs a concrete length, not {length}", op=op)


def _inner_length(p) -> int:
    """The one length of p's inner lists (flatten's adjoint splits into chunks of it); ragged inner
    lists have no such length and no gradient through flatten."""
    if isinstance(p, FractalTensor):
        lengths = {len(child) for child in p}
        if len(lengths) > 1:
            raise DifferentiationError(f"the gradient of flatten needs inner lists of one length, got the ragged "
                                       f"{p.type_string}", op="flatten")
        return lengths.pop() if lengths else 1
    length = p.lengths[1]
    if getattr(length, "is_concrete", False):
        return length.const
    raise DifferentiationError(f"the gradient of flatten needs a concrete inner length, not {length}", op="flatten")


def _place(ct, p, reads: dict):
    """The cotangent of list p from ct, a view that read p at `reads` {position in p: position in ct}."""
    n = _concrete_length(p, "getitem")
    if not reads:
        return None
    mask = np.zeros(n, np.dtype(p.dtype))
    where = np.zeros(n, np.int64)
    for i, k in reads.items():
        mask[i], where[i] = 1, k
    return ft_map(lambda m, c: scale(m, c), FractalTensor.from_numpy(mask, 1), ct.gather(where))


def _unview(ct, p, index):
    """The cotangent of list p given ct for `p[index]`."""
    if isinstance(index, slice) and index == slice(None, None, -1):
        return ct.reverse()
    positions = range(_concrete_length(p, "getitem"))
    if isinstance(index, slice):
        return _place(ct, p, {i: k for k, i in enumerate(positions[index])}) or zeros_like(p)
    mask = np.zeros(len(positions), np.dtype(p.dtype))
    mask[positions[index]] = 1
    return ft_map(lambda m: scale(m, ct), FractalTensor.from_numpy(mask, 1))


def _scatter(ct, p, ids):
    """The adjoint of `p.gather(ids)`: element i of p gets the sum of the cotangents of every q with
    ids[q] == i (a scatter-add by the same ids). Ids known now (numpy, or an eager list) are, on
    numpy, one `scatter_add` of the stacked cotangents and, traced, inverse gathers: rank r reads the
    r-th q that gathered i (as a window's overlap-add). Ids read when the program runs (an input
    list) are compared with every position i: a map over i of a sum over q of where(ids[q] == i)."""
    if is_traced(ids):
        return _scatter_by_runtime_ids(ct, p, ids)
    idx = np.asarray(ids.to_numpy() if isinstance(ids, FractalTensor) else ids, np.int64).reshape(-1)
    n = _concrete_length(p, "gather")
    if not idx.size:
        return zeros_like(p)
    if isinstance(ct, FractalTensor) and not tracing_now():
        return FractalTensor.from_numpy(em.scatter_add(ct.to_numpy(), idx, n), ct.depth)
    total, seen = None, {}
    ranks: list[dict] = []
    for q, i in enumerate(idx.tolist()):
        r = seen[i] = seen.get(i, -1) + 1
        if r == len(ranks):
            ranks.append({})
        ranks[r][i] = q
    for reads in ranks:
        total = add(total, _place(ct, p, reads))
    return total


def _scatter_by_runtime_ids(ct, p, ids):
    n = _concrete_length(p, "gather")
    positions = FractalTensor.from_numpy(np.arange(n, dtype=np.dtype(str(ids.dtype))), 1)
    zero = zeros_like(ct[0])

    def at(i):
        return ft_aggregate("reduce", lambda acc, c_id: add(acc, _select_list(c_id[1] - i, zeros_like(c_id[0]),
                                                                              c_id[0])), Zip([ct, ids]), zero)
    return ft_map(at, positions)


def _unwindow(ct, p, size, stride=1, padding=0, dilation=1):
    """Overlap-add: element i of p gets the cotangents of every window position that read it."""
    checked = window_args(size, stride, padding, dilation) if dilation != 1 else window_args(size, stride, padding)
    size, stride, lo = checked[:3]
    n, count = _concrete_length(p, "window"), _concrete_length(ct, "window")
    total = None
    for j in range(size):
        column = ft_map(lambda win, j=j: win[j], ct)
        reads = {w * stride + j * dilation - lo: w for w in range(count)
                 if 0 <= w * stride + j * dilation - lo < n}
        total = add(total, _place(column, p, reads))
    return zeros_like(p) if total is None else total


# ---------------------------------------------------------------------------------------
# Compute operators


def _components(xs) -> list:
    return list(xs.components) if isinstance(xs, Zip) else [xs]


def _regroup(lists, flat):
    """The elements of `lists` from the flat elements of their components: a zip's element is the
    tuple of its components' (a zip one level less deep for ft.product's)."""
    out, k = [], 0
    for xs in lists:
        n = len(_components(xs))
        if not isinstance(xs, Zip):
            out.append(flat[k])
        else:
            out.append(tuple(flat[k:k + n]) if xs.depth == 1 else Zip(flat[k:k + n], xs.depth - 1, element=True))
        k += n
    return out


def _flatten(elems, lists):
    return [e for x, xs in zip(elems, lists)
            for e in (x.components if isinstance(x, Zip) else x if isinstance(xs, Zip) else (x,))]


def _is_float(p) -> bool:
    return str(p.dtype) in _FLOATS


def _wrap_result(p, tape):
    return pytree.map(lambda v: wrap(v, tape) if _is_float(v) else v, p)


def _run_body(call, args, diff, replay=None, checkpoint=None):
    """`call(*stand-ins)` on a fresh tape: args wrapped where `diff`; (tape, stand-ins, result)."""
    tape = Tape(replay, checkpoint)
    with _Pushed(tape):
        ad = [wrap(a, tape) if d else a for a, d in zip(args, diff)]
        result = unzip(call(*ad))
    return tape, ad, result


def _body_vjp(call, args, diff, saved, cts, plan, checkpoint=None):
    """The body's vjp at `args`: (the cotangent of every differentiated arg, zeros for none, and
    the [stand-in, cotangent] pairs of the values it captured). Compute operators whose result is
    the body's take it from `saved` (the enclosing operator's saved output) instead of rerunning."""
    tape, ad, result = _run_body(call, args, diff, (plan, saved), checkpoint)
    with _Pushed(None):
        acc = tape.backward(pytree.leaves(result), cts)
        grads = [_ct_or_zero(acc.pop(id(a), [None, None])[1], a.primal) for a, d in zip(ad, diff) if d]
        captured = [[obj, ct] for obj, ct in acc.values()]
    return grads, captured


def _ct_or_zero(ct, p):
    return zeros_like(p) if ct is None else ct


def _planned(tape):
    """This compute operator's place in the replay plan: (saved outputs or None, the body's plan)."""
    if tape is None:
        return None, None
    k = tape.n_compute
    tape.n_compute += 1
    if tape.replay is None or k >= len(tape.replay[0]):
        return None, None
    saved, (leafmap, structure, subplan) = tape.replay[1], tape.replay[0][k]
    n = _n_leaves(structure)
    if len(leafmap) == n:
        return pytree.unflatten(structure, [saved[leafmap[j]] for j in range(n)]), subplan
    return None, subplan


def _n_leaves(structure) -> int:
    return 1 if structure is None else sum(_n_leaves(s) for s in structure)


def _frozen(f, memo=None):
    """f with the values its closure holds now: the backward runs a body again after the enclosing
    function may have rebound a captured name (`h = o * tanh(c)` after a map that read h)."""
    memo = {} if memo is None else memo
    if not isinstance(f, types.FunctionType) or not f.__closure__:
        return f
    if id(f) not in memo:
        memo[id(f)] = f
        cells = []
        for cell in f.__closure__:
            try:
                value = cell.cell_contents
            except ValueError:  # not assigned yet (a recursive inner function)
                cells.append(cell)
                continue
            cells.append(types.CellType(_frozen(value, memo)))
        g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, tuple(cells))
        g.__kwdefaults__ = f.__kwdefaults__
        memo[id(f)] = g
    return memo[id(f)]


def compute(op: str, f, lists: tuple, init):
    """A compute operator while differentiating: its primal computed by polyft, its adjoint recorded."""
    f = _frozen(f)
    if op in ("scanr", "foldr"):  # x ⊕ state over the reversed list is scanl/foldl of the swapped f
        out = compute(op.replace("r", "l", 1) if op == "scanr" else "foldl", lambda s, x: f(x, s),
                      tuple(xs.reverse() for xs in lists), init)
        return pytree.map(lambda v: v.reverse(), out) if op == "scanr" else out
    if op == "map":
        return _map(f, lists)
    if op == "reduce":
        op = "foldl"
    if init is None and op == "foldl":
        return compute("foldl", f, (lists[0][1:],), lists[0][0])
    if init is None:  # [x0, x0 ⊕ x1, ...]: x0 put in front of the scan of the rest from x0
        xs = lists[0]
        return _cons(xs[0], compute("scanl", f, (xs[1:],), xs[0]), xs)
    return _scan(f, lists[0], init, fold=op == "foldl")


def _empty(xs) -> bool:
    n = xs.length
    return n == 0 if isinstance(n, int) else n.is_concrete and n.const == 0


def _cons(first, rest, like):
    """The list `[first, *rest]` (a pytree of them), built from differentiable operators: element i
    of `rest.window(2, padding=(1, 1))` holds rest[i - 1], and a 0/1 indicator selects `first` at
    position 0. `like` is a list of the result's length (the scanned list)."""
    head = _components(like)[0]
    ones = ft_map(lambda _: np.ones((), np.dtype(str(head.dtype))), primal(head))
    at_first = ft_map(lambda w: 1.0 - w[0], ones.window(2, 1, (1, 0)))
    if _empty(pytree.leaves(rest)[0]):
        return pytree.map(lambda a: ft_map(lambda _: a, at_first), first)
    return pytree.map(lambda a, b: ft_map(lambda w, m: _select_list(m, a, w[0]), b.window(2, 1, (1, 1)), at_first),
                      first, rest)


def _map(f, lists):
    tape = recording()
    flat = [c for xs in lists for c in _components(xs)]
    diff = [is_ad(c) for c in flat]
    plan_box = []

    def call(*a):
        return f(*_regroup(lists, a))

    def body(*elems):
        t, _, result = _run_body(call, _flatten(elems, lists), diff, checkpoint=tape.checkpoint)
        plan_box[:] = [t.plan_for(result)]
        return primal(result)

    saved, plan = _planned(tape)
    if saved is None:
        with _Pushed(None):
            saved = ft_map(body, *[primal(xs) for xs in lists])
        plan = plan_box[0] if plan_box else []
    out = _wrap_result(saved, tape)
    out_leaves, saved_leaves = pytree.leaves(out), pytree.leaves(saved)

    captured = _captured(f)

    def backward(couts):
        present = [j for j, c in enumerate(couts) if c is not None]
        n_diff = sum(diff)
        if not n_diff and not captured:
            return []

        def body_bwd(*es):
            nf, no = len(flat), len(saved_leaves)
            cts = [None] * no
            for j, c in zip(present, es[nf + no:]):
                cts[j] = c
            grads, caps = _body_vjp(call, es[:nf], diff, list(es[nf:nf + no]), cts, plan, tape.checkpoint)
            return (*grads, *_captured_cts(caps, captured, "map"))

        with _Pushed(None):
            res = ft_map(body_bwd, *[primal(c) for c in flat], *saved_leaves, *[couts[j] for j in present])
            res = res if isinstance(res, tuple) else (res,)
            pairs = list(zip([c for c, d in zip(flat, diff) if d], res[:n_diff]))
            pairs += [(obj, ft_aggregate("reduce", add, lst)) for obj, lst in zip(captured, res[n_diff:])]
        return pairs

    tape.record_compute("map", out_leaves, backward, (plan, pytree.structure(saved)))
    return out


def _captured(f, out=None, seen=None) -> list:
    """The stand-ins a body function holds in its closure (through the functions, tuples and zips
    it captures): the values from enclosing bodies whose cotangents its backward hands out."""
    out, seen = ([], set()) if out is None else (out, seen)
    if id(f) in seen:
        return out
    seen.add(id(f))
    if is_ad(f):
        out.append(f)
    elif isinstance(f, types.FunctionType):
        for cell in f.__closure__ or ():
            try:
                _captured(cell.cell_contents, out, seen)
            except ValueError:  # an unassigned cell
                continue
    elif isinstance(f, (tuple, list)):
        for v in f:
            _captured(v, out, seen)
    elif isinstance(f, Zip):
        _captured(f.components, out, seen)
    return out


def _select_list(mask, a, b):
    """_select on tensors, element by element on lists (ft.map)."""
    if _is_list(a):
        return ft_map(lambda x, y: _select_list(mask, x, y), a, b)
    return _select(mask, a, b)


def _captured_cts(caps, captured, op: str) -> list:
    """The body's cotangents for its closure's stand-ins, in `captured`'s order (zeros for unused ones)."""
    got = {id(obj): ct for obj, ct in caps}
    stray = [obj for obj, _ in caps if not any(obj is c for c in captured)]
    if stray:
        raise DifferentiationError(f"the function reads {stray[0]!r} other than through its closure (a global, an "
                                   "attribute); pass it in the lists or the state", op=op)
    return [_ct_or_zero(got.get(id(c)), c.primal) for c in captured]


def _known_zero(p) -> bool:
    """Whether the primal p is zeros known before the program runs (eager data or a traced constant)."""
    if isinstance(p, FractalTensor):
        return not p.to_numpy().any()
    const = getattr(p, "const", None) if is_traced(p) else p
    return const is not None and not isinstance(p, ListBase) and not np.asarray(const).any()


def _checkpoint_every(k, xs):
    """k when this scan keeps every k-th state and recomputes the rest (`ft.vjp(..., checkpoint=k)`):
    its length is known, longer than k and a multiple of it; None when it stores every state."""
    n = xs.length
    n = n if isinstance(n, int) else n.const if n.is_concrete else None
    if k is None or n is None or n <= k or n % k or (isinstance(xs, Zip) and xs.depth != 1):
        return None
    return k


def _scan(f, xs, init, fold: bool):
    """scanl (fold: foldl) with init; its backward is one reversed scan over the steps. The scanr's
    state is the cotangent flowing into the previous state, the step's element cotangents and the
    running sum of the captured values' cotangents; each step reads the saved states around it
    (`states.window(2, padding=(1, 0))`: the previous one, the init at step 0), so nothing of the
    forward is recomputed and the backward of a stack of scans is a reversed wavefront. Under
    checkpointing (`tape.checkpoint`) only every k-th state is saved (a fold computes no others)
    and the backward runs segment by segment, recomputing each one's states (`_reverse_segments`)."""
    if _empty(xs):  # a fold of no element is its init; a scan of none is [] (no gradient flows)
        if fold:
            return init
        with _Pushed(None):
            return _wrap_result(ft_aggregate("scanl", lambda s, x: s, primal(xs), primal(init)), recording())
    tape = recording()
    k = _checkpoint_every(tape.checkpoint, xs)
    comps = _components(xs)
    xdiff = [is_ad(c) for c in comps]
    init_leaves = pytree.leaves(init)
    state_structure = pytree.structure(init)
    ns = len(init_leaves)
    init_p = [primal(v) for v in init_leaves]
    for v in init_p:
        if _is_number(v):
            raise DifferentiationError("the initial state must be a tensor (ft.zeros(shape)), not a Python number",
                                       op="scanl")
    captured = _captured(f)
    plan_box = []

    def call(*a):
        return f(pytree.unflatten(state_structure, a[:ns]), _regroup((xs,), a[ns:])[0])

    def body(s, x):
        t, _, result = _run_body(call, [*pytree.leaves(s), *_flatten((x,), (xs,))], [True] * ns + xdiff,
                                 checkpoint=tape.checkpoint)
        plan_box[:] = [t.plan_for(result)]
        return primal(result)

    def run_segments(s, seg):
        return ft_aggregate("foldl", body, seg, s)

    states, plan = _planned(tape)
    if states is None or fold:
        with _Pushed(None):
            init_tree = pytree.unflatten(state_structure, init_p)
            states = ft_aggregate("scanl", run_segments, primal(xs).split(k), init_tree) if k and fold else \
                ft_aggregate("scanl", body, primal(xs), init_tree)  # under checkpointing a fold's are the checkpoints
        plan = plan_box[0] if plan_box else (plan or [])
    with _Pushed(None):
        out_p = pytree.map(lambda v: v[-1], states) if fold else states
        saved = pytree.leaves(states if fold or not k else pytree.map(lambda v: v[k - 1::k], states))
    out = _wrap_result(out_p, tape)
    comps_p = [primal(c) for c in comps]
    nc, nx = len(comps), sum(xdiff)

    def reverse(present, comps_l, state_leaves, first, ct_lists, carry0):
        """The reversed scan over the steps of `comps_l` whose states are `state_leaves`, the state before
        the first step being `first`, with the cotangents `ct_lists` of the states `present`: the scanr's
        result, one carry per step."""
        at_first = [not _known_zero(v) for v in first]  # leaves whose step-0 previous state is not the window's zero

        def step(e, carry):  # carry: the flat tuple (state cotangents, element cotangents, captured sums)
            g, acc = carry[:ns], carry[ns + nx:]
            x, windows = e[:nc], e[nc:nc + ns]
            firsts, ct_e = (e[nc + ns], e[nc + ns + 1:]) if any(at_first) else (None, e[nc + ns:])
            prev = [_select_list(1.0 - firsts[0], v, w[0]) if need else w[0]
                    for w, v, need in zip(windows, first, at_first)]
            total = list(g)
            for j, c in zip(present, ct_e):
                total[j] = add(total[j], c)
            grads, caps = _body_vjp(call, [*prev, *x], [True] * ns + xdiff, [w[1] for w in windows], total, plan,
                                    tape.checkpoint)
            return (*grads, *[add(a, c) for a, c in zip(acc, _captured_cts(caps, captured, "scanl"))])

        # traced lists, so that a window is a view of the saved states, not an eager copy of twice their size
        windows = [_traceable(v).window(2, 1, (1, 0)) for v in state_leaves]
        firsts = [_first_indicator(comps_l[0])] if any(at_first) else []
        return ft_aggregate("scanr", step, Zip([*comps_l, *windows, *firsts, *ct_lists]), carry0)

    def backward(couts):
        cts = [None] * ns if fold else list(couts)
        final = [_ct_or_zero(c, v) for c, v in zip(couts if fold else [None] * ns, init_p)]
        present = [j for j, c in enumerate(cts) if c is not None]
        with _Pushed(None):
            carry0 = (*final, *[zeros_like(c[0]) for c, d in zip(comps_p, xdiff) if d],
                      *[zeros_like(c.primal) for c in captured])
            ct_lists = [cts[j] for j in present]
            res = _reverse_segments(functools.partial(reverse, present), body, comps_p, saved, init_p, state_structure,
                                    ct_lists, carry0, k, nx) if k else reverse(present, comps_p, saved, init_p, ct_lists,
                                                                           carry0)
            g_prev, g_xs, g_caps = res[:ns], res[ns:ns + nx], res[ns + nx:]
            pairs = [(v, g[0]) for v, g in zip(init_leaves, g_prev) if is_ad(v)]
            pairs += list(zip([c for c, d in zip(comps, xdiff) if d], g_xs))
            pairs += [(c, g[0]) for c, g in zip(captured, g_caps)]
        return pairs

    tape.record_compute("scan", pytree.leaves(out), backward, (plan, pytree.structure(out_p)))
    return out


def _first_indicator(xs):
    """Element i holds (0, 1) at i = 0 and (1, 1) after: a 0/1 list that tells the first position."""
    return ft_map(lambda _: np.ones((), np.dtype(str(xs.dtype))), xs).window(2, 1, (1, 0))


def _reverse_segments(reverse, body, comps_p, checkpoints, init_p, structure, ct_lists, carry0, k, nx):
    """The reversed scan in segments of k steps, the last segment first: segment j's states are
    recomputed from the state before it (the init, or checkpoint j - 1) by the forward body, then
    `reverse` runs over them from the carry the later segment left at its first step. The state of
    this scan over segments is that carry (state and captured cotangents) and the segment's element
    cotangents (lists of k); the result has the stored version's layout: the element cotangents of
    every step, and the state and captured cotangents at (at least) the first step."""
    ns, nc = len(init_p), len(comps_p)
    at_init = [not _known_zero(v) for v in init_p]

    def segment(e, later):
        xs_seg, windows, firsts, cts_seg = e[:nc], e[nc:nc + ns], e[nc + ns], e[nc + ns + 1:]
        entering = [_select_list(1.0 - firsts[0], v, w[0]) if need else w[0]
                    for w, v, need in zip(windows, init_p, at_init)]
        seg = xs_seg[0] if nc == 1 else Zip(xs_seg)
        states = ft_aggregate("scanl", body, seg, pytree.unflatten(structure, entering))
        carry = (*later[:ns], *[g[0] for g in later[ns:ns + nx]], *later[ns + nx:])
        res = reverse(list(xs_seg), pytree.leaves(states), entering, list(cts_seg), carry)
        return (*[r[0] for r in res[:ns]], *res[ns:ns + nx], *[r[0] for r in res[ns + nx:]])

    spans = FractalTensor.from_numpy(np.zeros(k, np.float32), 1)
    last = (*carry0[:ns], *[ft_map(lambda _, c=c: c, spans) for c in carry0[ns:ns + nx]], *carry0[ns + nx:])
    out = ft_aggregate("scanr", segment, Zip([*[_traceable(c).split(k) for c in comps_p],
                                              *[_traceable(c).window(2, 1, (1, 0)) for c in checkpoints],
                                              _first_indicator(comps_p[0].split(k)), *[c.split(k) for c in ct_lists]]),
                       last)
    return (*out[:ns], *[g.flatten() for g in out[ns:ns + nx]], *out[ns + nx:])


HANDLERS.update(compute=compute, access=access, rules=RULES)
HANDLERS["join"] = join
