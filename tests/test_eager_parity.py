"""Eager execution accepts exactly what compiles: every construct of the language (each primitive of
the operator table, each compute and access operator, and programs that misuse them) runs eagerly
and through ft.compile (C); both give the same result (type and values, NaN and infinities
included), or both refuse it with the same error class and message. Known gaps are marked strict
xfails, so that closing one is noticed."""
import operator

import numpy as np
import pytest

import polyft as ft
from polyft.errors import PolyftError
from polyft.primitives import PRIMITIVES
from polyft.testing import rel_error

pytestmark = pytest.mark.usefixtures("compile_cache")


def data(shape, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, -0.0]
    return x


XS = ft.FractalTensor.from_numpy(data((3, 2, 3), 0), 1)
YS = ft.FractalTensor.from_numpy(data((3, 2, 3), 1), 1)
POS = ft.FractalTensor.from_numpy(np.abs(data((3, 2, 3), 2)) + 0.5, 1)
W = np.random.default_rng(3).standard_normal((3, 3)).astype(np.float32)
IDS = ft.FractalTensor.from_numpy(np.array([2, 0, 1, 2]), 1)


def elementwise(body, *lists):
    return lambda *xs: ft.map(body, *xs), lists


# one program per primitive of the operator table (a test below holds the table to it)
PRIMITIVE_PROGRAMS = {
    "add": elementwise(operator.add, XS, YS), "sub": elementwise(operator.sub, XS, YS),
    "mul": elementwise(operator.mul, XS, YS), "truediv": elementwise(operator.truediv, XS, POS),
    "neg": elementwise(operator.neg, XS), "pow": elementwise(lambda x: x ** 3, XS),
    "abs": elementwise(abs, XS), "matmul": elementwise(lambda x: x @ W, POS),
    "getitem": elementwise(lambda x: x[1:, ::2], XS), "transpose": elementwise(lambda x: x.T, XS),
    "permute": elementwise(lambda x: x[None].transpose(2, 0, 1), XS),
    "reshape": elementwise(lambda x: x.reshape(3, 2), XS), "copy": elementwise(lambda x: x[:, :] * 1.0, XS),
    "astype": elementwise(lambda x: x.astype("float64"), XS),
    "zeros_like": elementwise(ft.zeros_like, XS), "where": elementwise(lambda a, b: ft.where(a, a, b), XS, YS),
    "maximum": elementwise(ft.maximum, XS, YS), "minimum": elementwise(ft.minimum, XS, YS),
    "max": elementwise(lambda x: ft.max(x, axis=1), POS), "sum": elementwise(lambda x: ft.sum(x, axis=0), POS),
    "mean": elementwise(lambda x: ft.mean(x, axis=-1, keepdims=True), POS),
    "softmax": elementwise(lambda x: ft.softmax(x, axis=-1), POS),
    "logsumexp": elementwise(lambda x: ft.logsumexp(x, axis=0), XS),
    "scatter_add": elementwise(lambda x: ft.scatter_add(x, np.array([1, 1]), 3), POS),
    "concat": elementwise(lambda a, b: ft.concat((a, b), axis=1), XS, YS),
    "logical_and": elementwise(lambda a, b: ft.logical_and(a, b), XS, YS),
    "logical_or": elementwise(lambda a, b: ft.logical_or(a, b), XS, YS),
    "logical_xor": elementwise(lambda a, b: ft.logical_xor(a, b), XS, YS),
    "logical_not": elementwise(ft.logical_not, XS),
    **{name: elementwise(lambda a, b, op=op: ft.where(op(a, b), a, b), XS, YS)
       for name, op in (("greater", operator.gt), ("less", operator.lt), ("greater_equal", operator.ge),
                        ("less_equal", operator.le), ("equal", operator.eq), ("not_equal", operator.ne))},
    **{name: elementwise(getattr(ft, name), XS)
       for name in ("tanh", "sigmoid", "exp", "log", "sqrt", "log1p", "softplus", "relu", "sin", "cos", "tan",
                    "erf", "gelu", "rsqrt", "sign", "floor")},
}

# the compute and access operators, composite element math, and misuses of each
PROGRAMS = {
    "reduce": (lambda xs: xs.reduce(lambda s, x: s + x), (XS,)),
    "foldl": (lambda xs: xs.foldl(lambda s, x: ft.tanh(s @ W + x), ft.zeros((2, 3))), (POS,)),
    "foldr": (lambda xs: xs.foldr(lambda x, s: s * 0.5 + x, ft.zeros((2, 3))), (XS,)),
    "scanl": (lambda xs: xs.scanl(lambda s, x: ft.maximum(s, x), ft.zeros((2, 3))), (XS,)),
    "scanr": (lambda xs: xs.scanr(lambda x, s: s + x, ft.zeros((2, 3))), (XS,)),
    "zip": (lambda xs, ys: ft.zip(xs, ys).map(lambda xy: xy[0] - xy[1]), (XS, YS)),
    "product": (lambda xs, ys: ft.product(xs, ys).map(lambda row: row.map(lambda xy: xy[0] @ xy[1].T)), (XS, YS)),
    "slices": (lambda xs: xs[1:].join(xs.reverse()).join(xs.shift(1)).join(xs[::2]), (XS,)),
    "window": (lambda xs: xs.window(2, padding=(1, 0)).map(lambda w: w[0] + w[1]), (XS,)),
    "shifted_slide": (lambda xs: xs.shifted_slide(3, dilation=1).map(lambda w: w[0] - w[2]), (XS,)),
    "gather": (lambda xs, ids: xs.gather(ids), (XS, IDS)),
    "strided": (lambda xs: xs.join(xs).strided_split(2).strided_merge(), (XS,)),
    "flatten_split": (lambda xss: xss.flatten().split(2), (ft.FractalTensor.from_numpy(data((2, 2, 3), 4), 2),)),
    "transpose_lists": (lambda xss: ft.transpose(xss).map(lambda xs: xs.reduce(operator.add)),
                        (ft.FractalTensor.from_numpy(data((2, 3, 3), 5), 2),)),
    "enumerate": (lambda xs: xs.enumerate().map(lambda ix: ix[1] * ix[0]), (XS,)),
    "window_of_zip": (lambda xs, ys: ft.zip(xs, ys).window(2).map(lambda w: w[0][0] + w[1][1]), (XS, YS)),
    "unpacked_window_of_zip": (lambda xs, ys: ft.zip(xs, ys).window(2).map(
        lambda w: (lambda k, v: k[0] * v[1])(*w)), (XS, YS)),
    "clip_var_stack": (lambda xs: xs.map(lambda x: ft.stack([ft.clip(x, -1, 1), ft.var(x, axis=0, keepdims=True)
                                                              + x], axis=0)), (XS,)),
    # misuses: the same error both ways
    "broadcast_error": (lambda xs: xs.map(lambda x: x + np.ones(4, np.float32)), (XS,)),
    "matmul_error": (lambda xs: xs.map(lambda x: x @ x), (XS,)),
    "reshape_error": (lambda xs: xs.map(lambda x: x.reshape(4, 2)), (XS,)),
    "depth_error": (lambda xs: ft.tanh(xs), (XS,)),
    "window_error": (lambda xs: xs.window(5), (XS,)),
    "join_error": (lambda xs: xs.join(ft.FractalTensor.from_numpy(np.ones((2, 3)), 1)), (XS,)),
    "state_type_error": (lambda xs: xs.foldl(lambda s, x: ft.sum(s + x, axis=0), ft.zeros((2, 3))), (XS,)),
    "axis_error": (lambda xs: xs.map(lambda x: ft.sum(x, axis=2)), (XS,)),
    "stack_error": (lambda xs: xs.map(lambda x: ft.stack([x, x.T])), (XS,)),
    "clip_error": (lambda xs: xs.map(lambda x: ft.clip(x)), (XS,)),
    "gather_range_error": (lambda xs: xs.gather([0, 7]), (XS,)),
}

KNOWN_GAPS = {
    # a comparison is numpy's bool eagerly (its sum an int64 count) and a float32 mask compiled
    "count_of_a_mask": "eagerly a mask's sum is numpy's int64 count, compiled the mask's float32 sum",
    "mask_as_a_result": "eagerly a map cannot return numpy's bool; compiled the mask is a float32 list",
    # a list state whose length changes: eager lists carry their length at run time, traced ones in their type
    "shrinking_fold": "a fold whose list state halves each step runs eagerly; traced, its type changes",
    "index_dependent_slice": "xs[:i] over an index i runs eagerly; compiled, lengths cannot depend on an index",
}
PROGRAMS["count_of_a_mask"] = (lambda xs: xs.map(lambda x: ft.sum(x > 0)), (XS,))
PROGRAMS["mask_as_a_result"] = (lambda xs: xs.map(lambda x: x > 0), (XS,))
PROGRAMS["index_dependent_slice"] = (lambda xs: ft.arange(3, "int64").map(
    lambda i: xs[:i].foldl(lambda a, b: a + b, ft.zeros((2, 3)))), (XS,))
PROGRAMS["shrinking_fold"] = (lambda levels, xs: levels.foldl(lambda s, _: s.split(2).map(lambda p: p[0] + p[1]), xs),
                              (ft.FractalTensor.from_numpy(np.zeros((2, 1), np.float32), 1),
                               ft.FractalTensor.from_numpy(data((4, 3), 6), 1)))


def outcome(run):
    """('ok', result) or ('error', its class, its message without the location)."""
    try:
        with np.errstate(all="ignore"):
            return ("ok", run())
    except PolyftError as e:
        return ("error", type(e).__name__, e.detail)


def leaves(result):
    return list(result) if isinstance(result, (tuple, ft.Zip)) else [result]


def check(name, fn, inputs):
    eager = outcome(lambda: fn(*inputs))
    compiled = outcome(lambda: ft.compile(fn, *inputs, target="c")(*inputs))
    assert eager[0] == compiled[0], (name, eager, compiled)
    if eager[0] == "error":
        assert eager[1:] == compiled[1:], name
        return
    for e, c in zip(leaves(eager[1]), leaves(compiled[1]), strict=True):
        e, c = (v.to_numpy() if isinstance(v, ft.FractalTensor) else np.asarray(v) for v in (e, c))
        assert e.dtype == c.dtype and e.shape == c.shape, (name, e.dtype, c.dtype, e.shape, c.shape)
        inf = np.isinf(e)
        assert np.array_equal(np.isnan(e), np.isnan(c)) and np.array_equal(np.isinf(c), inf), name
        assert np.array_equal(e[inf], c[inf]), name
        finite = np.isfinite(e)
        assert rel_error(c[finite], e[finite]) < 1e-5, name


def test_every_primitive_has_a_program():
    assert set(PRIMITIVE_PROGRAMS) == set(PRIMITIVES)


@pytest.mark.parametrize("name", sorted(PRIMITIVE_PROGRAMS))
def test_each_primitive_runs_eagerly_and_compiled_alike(name):
    check(name, *PRIMITIVE_PROGRAMS[name])


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[n]))
                                  if n in KNOWN_GAPS else n for n in sorted(PROGRAMS)])
def test_each_construct_runs_eagerly_and_compiled_alike(name):
    check(name, *PROGRAMS[name])
