"""Tracing into the ETDG (paper §4.4).

Three kinds of check:

* traced + interpreted == eager: every access and compute operator inside small programs, traced
  once on concrete inputs and once on `ft.spec`s with symbolic lengths, then run instance by
  instance (`polyft.interpret.run`) on the concrete inputs and compared with calling the program
  directly (the eager reference);
* the structure of the ETDG of Listing 1 (stacked RNN) against the paper: operator vector,
  access maps `M`, `o` and their conditions, regions, depth and dimension, printout, DOT;
* errors raised while tracing: the right `polyft.errors` subclass, naming the operator, the
  shapes/types, and the line of *this* file where the mistake is.
"""
import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import polyft as ft
from polyft import errors
from polyft.etdg import AccessMap
from polyft.interpret import run
from polyft.workloads import WORKLOADS, stacked_rnn

from helpers import assert_same, flist, rand, spec

FAST = settings(max_examples=25, deadline=None)
seeds = st.integers(0, 2**32 - 1)


# -- helpers ------------------------------------------------------------------------------------
def check_traced(fn, inputs, specs=None, concrete=True):
    """Trace fn on the concrete inputs (and on specs, if given); interpreted == eager each time."""
    expected = fn(*inputs)
    etdg = None
    for args in ([inputs] if concrete else []) + ([specs] if specs is not None else []):
        etdg = ft.trace(fn, *args)
        assert_same(run(etdg, *inputs), expected)
    return etdg


def left(s, x):
    """(state, x): order-sensitive and not symmetric, so a swapped or reordered step shows."""
    return ft.tanh(s) * 0.5 + x


def right(x, s):
    return x - ft.tanh(s) * 0.5


# =================================================================================================
# 1. Access operators
# =================================================================================================
ELEM = (2, 3)
SX = spec(["L"], ELEM)


def bound(n):
    """A slice bound that Python would not clamp for a list of length n (or None)."""
    return st.none() | st.integers(-n, n)


@FAST
@given(st.integers(1, 8), seeds, st.data())
def test_slice_positive_and_negative_steps(n, seed, data):
    step = data.draw(st.sampled_from([None, 1, 2, 3, -1, -2, -3]))
    # bounds Python would not clamp (a symbolic trace cannot clamp them: see RUN_TIME_RANGE below)
    start = data.draw(st.none() | st.integers(-n, n - 1 if step is not None and step < 0 else n))
    stop = data.draw(bound(n))
    s = slice(start, stop, step)

    def program(xs):
        ys = xs[s]
        return ys.map(lambda x: x * 2.0 - 1.0), ys

    check_traced(program, (flist([n], ELEM, seed),), (SX,))


@FAST
@given(st.integers(1, 8), seeds, st.integers(-12, 12) | st.none(), st.integers(-12, 12) | st.none(),
       st.sampled_from([None, 1, 2, -1, -3]))
def test_slice_any_bounds_on_concrete_inputs(n, seed, start, stop, step):
    """Out-of-range bounds are clamped as in Python when the length is known."""
    check_traced(lambda xs: xs[start:stop:step].map(lambda x: x + 1.0), (flist([n], ELEM, seed),))


@FAST
@given(st.integers(1, 8), seeds, st.data())
def test_shift_both_ways(n, seed, data):
    k = data.draw(st.integers(0, n))

    def program(xs):
        return ft.map(lambda a, b: a * b - a, xs.shift(k), xs.shift(-k)), xs.shift(-k)

    check_traced(program, (flist([n], ELEM, seed),), (SX,))


@FAST
@given(st.integers(0, 8), seeds)
def test_reverse_zipped_with_itself(n, seed):
    def program(xs):
        return ft.map(lambda a, b: a - 2.0 * b, xs, xs.reverse())

    check_traced(program, (flist([n], ELEM, seed),), (SX,))


def test_reverse_keeps_a_symbolic_length():
    """`xs.reverse()` has the length of xs: `L`, not `max(L, 0)`, so it zips with xs."""
    seen = {}

    def program(xs):
        seen["type"] = xs.reverse().type_string
        return xs.reverse()

    ft.trace(program, SX)
    assert seen["type"] == "[L]float32[2, 3]"


@st.composite
def windows(draw):
    n = draw(st.integers(1, 8))
    size = draw(st.integers(1, 4))
    stride = draw(st.integers(1, 3))
    padding = draw(st.integers(0, 2) | st.tuples(st.integers(0, 2), st.integers(0, 2)))
    lo, hi = (padding, padding) if isinstance(padding, int) else padding
    assume(size <= n + lo + hi and max(lo, hi) < size)  # padding < size (window_args)
    return n, size, stride, padding


@FAST
@given(windows(), seeds)
def test_window_with_stride_and_padding(params, seed):
    n, size, stride, padding = params

    def program(xs):
        ws = xs.window(size, stride, padding)
        return ws.map(lambda w: w.foldl(left)), ws

    check_traced(program, (flist([n], ELEM, seed),), (SX,))


@pytest.mark.parametrize("window", [1, 3, 5])
@pytest.mark.parametrize("n", [1, 2, 6])
def test_shifted_slide(window, n):
    def program(xs):
        return xs.shifted_slide(window).map(lambda w: w.reduce(lambda s, x: s * 0.5 + x))

    etdg = check_traced(program, (flist([n], ELEM, 5 * n + window),), (SX,))
    assert "zeros" in str(etdg) or window == 1  # padded positions read zeros: constant pieces


@FAST
@given(st.integers(1, 4), st.integers(0, 4), seeds)
def test_strided_split_and_merge(d, m, seed):
    def program(xs):
        parts = xs.strided_split(d)
        scanned = parts.map(lambda r: r.scanl(left, ft.ones(ELEM)))
        return scanned, scanned.strided_merge(), parts.strided_merge()

    check_traced(program, (flist([d * m], ELEM, seed),), (SX,))


def test_strided_split_records_the_divisibility_it_assumes():
    etdg = ft.trace(lambda xs: xs.strided_split(4).map(lambda r: r.map(lambda x: x + 1.0)), SX)
    assert [a.isl() for a in etdg.assumptions] == ["(L) mod 4 = 0"]


RUN_TIME_RANGE = {
    # each program is fine for some L; traced on [L] and run on L = 5 it reads outside the list
    "slice start below -L": lambda xs: xs[-7:].map(lambda x: x * 2.0),
    "slice stop beyond L": lambda xs: xs[:9].map(lambda x: x * 2.0),
    "negative-step slice stop below -L": lambda xs: xs[:-9:-1].map(lambda x: x * 2.0),
    "index beyond L": lambda xs: xs.map(lambda x: x + xs[6]),
    "negative index below -L": lambda xs: xs.map(lambda x: x + xs[-7]),
    "gather index beyond L": lambda xs: xs.gather([0, 9]).map(lambda x: x + 1.0),
    "window larger than L": lambda xs: xs.window(6).map(lambda w: w.reduce(lambda s, x: s + x)),
    "strided_split not dividing L": lambda xs: xs.strided_split(2).map(lambda r: r.map(lambda x: x * 2.0)),
    "scanl without init, L = 0": lambda xs: xs[5:].scanl(left),
    "scanr without init, L = 0": lambda xs: xs[5:].scanr(right),
    "reduce without init, L = 0": lambda xs: xs[5:].reduce(left),
}


@pytest.mark.parametrize("name", RUN_TIME_RANGE)
def test_symbolic_trace_run_on_lengths_it_does_not_fit_is_never_silently_wrong(name):
    """Eagerly these programs clamp (slices) or raise a PolyftError; the traced program run on the
    same input must give the eager result or raise a PolyftError -- not a wrong answer, and not a
    numpy exception."""
    program = RUN_TIME_RANGE[name]
    xs = flist([5], ELEM, 11)
    etdg = ft.trace(program, SX)
    try:
        expected = program(xs)
    except errors.PolyftError:
        with pytest.raises(errors.PolyftError):
            run(etdg, xs)
        return
    try:
        got = run(etdg, xs)
    except errors.InputError as e:  # refused before running: it must say what the trace assumed
        assert "traced assuming" in str(e) and "L = 5" in str(e)
        return
    assert_same(got, expected)


@FAST
@given(st.integers(1, 7), seeds, st.data())
def test_gather(n, seed, data):
    idx = data.draw(st.lists(st.integers(0, n - 1), max_size=6))

    def program(xs):
        return xs.gather(idx).map(lambda x: x * 3.0 + 1.0)

    check_traced(program, (flist([n], ELEM, seed),), (SX,))


def test_gather_at_two_levels_and_of_a_zip():
    xss, ys = flist([3, 4], (2,), 1), flist([3], (2,), 2)

    def program(xss, ys):
        picked = xss.gather(np.array([2, 0, 2, 1])).map(lambda xs: xs.gather([3, 3, 0]).map(lambda x: -x))
        pairs = ft.zip(xss, ys).gather([1, 1, 0]).map(lambda p: p[0].reduce(lambda s, x: s * p[1] + x))
        return picked, pairs

    check_traced(program, (xss, ys), (spec(["A", "B"], (2,)), spec(["A"], (2,))))


@FAST
@given(st.integers(1, 6), seeds)
def test_zip_map_and_scan(n, seed):
    xs, ys, zs = flist([n], ELEM, seed), flist([n], ELEM, seed + 1), flist([n], ELEM, seed + 2)

    def program(xs, ys, zs):
        a = ft.zip(xs, ys, zs).map(lambda p: p[0] * p[1] - p[2])
        b = ft.scanl(lambda s, p: ft.tanh(s) * p[0] + p[1], ft.zip(xs, ys), ft.ones(ELEM))
        c = ft.zip(xs, ys.reverse())[1:].map(lambda p: p[0] - p[1])  # access operators on a zip
        return a, b, c

    check_traced(program, (xs, ys, zs), (SX, SX, SX))


@FAST
@given(st.integers(0, 4), st.integers(1, 4), seeds)
def test_product(m, n, seed):
    xs, ys = flist([m], (2, 2), seed), flist([n], (2, 2), seed + 1)

    def program(xs, ys):
        return ft.product(xs, ys).map(lambda row: row.map(lambda p: p[0] @ p[1] - p[1]))

    check_traced(program, (xs, ys), (spec(["M"], (2, 2)), spec(["N"], (2, 2))))


@FAST
@given(st.integers(1, 6), seeds, st.data())
def test_int_indexing_negative_ok(n, seed, data):
    i = data.draw(st.integers(-n, n - 1))

    def program(xs):
        return xs.map(lambda x: x * xs[i] + xs[-1])

    check_traced(program, (flist([n], ELEM, seed),), (SX,))


def test_int_indexing_of_nested_lists():
    xss = flist([3, 4], (2,), 7)

    def program(xss):
        row = xss[-2]
        return row.map(lambda x: x + xss[0][-1]), xss.map(lambda xs: xs[1] * 2.0), xss[2][-3]

    check_traced(program, (xss,), (spec(["A", "B"], (2,)),))


def test_access_operators_compose():
    """Views of views: reverse of a window of a slice, a shift inside a map over a stride."""
    xss = flist([3, 9], (2,), 21)

    def program(xss):
        def per_row(xs):
            return xs[1:-1].window(3, 2).reverse().map(lambda w: w.shift(1).foldr(right, xs[0]))
        return xss[::-1].map(per_row)

    check_traced(program, (xss,), (spec(["A", "B"], (2,)),))


# =================================================================================================
# 2. Compute operators
# =================================================================================================
LEFT_OPS = ["reduce", "foldl", "scanl"]
RIGHT_OPS = ["foldr", "scanr"]


@FAST
@given(st.sampled_from(LEFT_OPS + RIGHT_OPS), st.integers(0, 6), st.booleans(), seeds)
def test_aggregates_with_and_without_init(op, n, with_init, seed):
    assume(with_init or n > 0)
    f = right if op in RIGHT_OPS else left
    init = rand(ELEM, seed + 1) if with_init else None

    def program(xs):
        return getattr(ft, op)(f, xs, init)

    check_traced(program, (flist([n], ELEM, seed),), (SX,))


@pytest.mark.parametrize("op", LEFT_OPS + RIGHT_OPS)
def test_aggregate_as_a_method_with_init_from_an_input(op):
    f = right if op in RIGHT_OPS else left
    xs, s0 = flist([4], ELEM, 31), rand(ELEM, 32)

    def program(xs, s0):
        return getattr(xs, op)(f, s0 * 2.0)

    check_traced(program, (xs, s0), (SX, ft.spec("float32[2, 3]")))


def test_map_over_one_and_several_lists_and_a_zip():
    xs, ys, zs = flist([5], ELEM, 1), flist([5], ELEM, 2), flist([5], ELEM, 3)

    def program(xs, ys, zs):
        one = xs.map(lambda x: ft.sigmoid(x) * x)
        several = ft.map(lambda x, y, z: x * y - z, xs, ys, zs)
        zipped = ft.map(lambda p: p[0] / (1.0 + p[1] * p[1]), ft.zip(xs, ys))
        return one, several, zipped

    check_traced(program, (xs, ys, zs), (SX, SX, SX))


def test_map_returning_tuples_and_element_math():
    xs = flist([4], (3, 3), 9)

    def program(xs):
        def f(x):
            y = ft.softmax(ft.concat((x, x.T), axis=1), axis=-1)[0:2, 1:4]
            return y - ft.sum(ft.max(x, axis=0, keepdims=True)), ft.mean(ft.exp(-x * x), axis=1)
        return xs.map(f)

    check_traced(program, (xs,), (spec(["L"], (3, 3)),))


@pytest.mark.parametrize("op", LEFT_OPS + RIGHT_OPS)
def test_tuple_states(op):
    xs = flist([5], ELEM, 41)
    init = (rand(ELEM, 42), rand((3,), 43))

    def step(s, x):
        h, c = s
        return ft.tanh(h) * 0.5 + x * c, c * 0.9 + ft.sum(x, axis=0)

    f = (lambda x, s: step(s, x)) if op in RIGHT_OPS else step

    def program(xs):
        return getattr(ft, op)(f, xs, init)

    check_traced(program, (xs,), (SX,))


@pytest.mark.parametrize("with_init", [True, False])
@pytest.mark.parametrize("op", LEFT_OPS + RIGHT_OPS)
def test_list_valued_states(op, with_init):
    """The state is a whole list (Listing 1's layer state `hs`): one element per position."""
    xss = flist([4, 3], ELEM, 51)

    def combine(hs, xs):
        return ft.map(lambda h, x: ft.tanh(h) * 0.5 + x, hs, xs)

    f = (lambda xs, hs: combine(hs, xs)) if op in RIGHT_OPS else combine

    def program(xss):
        if with_init:
            return getattr(ft, op)(f, xss[1:], xss[0].map(lambda x: x * 2.0))
        return getattr(ft, op)(f, xss)

    check_traced(program, (xss,), (spec(["N", "M"], ELEM),))


@pytest.mark.parametrize("n", [0, 1, 3])
def test_fold_with_a_list_state_over_a_maybe_empty_list(n):
    """A symbolic fold's result is the last state when there is one and init otherwise.

    (The list is emptied by a slice: an empty FractalTensor input would not know its inner length.)"""
    xss, h0 = flist([n + 2, 3], ELEM, 61), flist([3], ELEM, 62)

    def program(xss, h0):
        return xss[2:].foldl(lambda hs, xs: ft.map(lambda h, x: h * x + 1.0, hs, xs), h0)

    check_traced(program, (xss, h0), (spec(["N", "M"], ELEM), spec(["M"], ELEM)))


NESTS = {
    "map/scanl/scanr": lambda xsss: xsss.map(
        lambda xss: xss.scanl(lambda hs, xs: xs.scanr(lambda x, s: x - ft.tanh(s) * hs[0], ft.ones(ELEM)))),
    "map/map/foldl": lambda xsss: xsss.map(lambda xss: xss.map(lambda xs: xs.foldl(left, ft.ones(ELEM)))),
    "scanl/map/reduce": lambda xsss: xsss.scanl(
        lambda acc, xss: ft.map(lambda a, xs: xs.reduce(lambda s, x: s * a + x), acc, xss),
        xsss[0].map(lambda xs: xs[0])),
    "foldr/scanl/map": lambda xsss: xsss.foldr(
        lambda xss, hss: ft.map(lambda hs, xs: ft.map(lambda h, x: ft.tanh(h) - x, hs, xs),
                                hss, xss.scanl(lambda hs, xs: ft.map(lambda h, x: h * 0.5 + x, hs, xs)))),
}


@pytest.mark.parametrize("name", NESTS)
def test_nests_of_depth_3(name):
    xsss = flist([2, 3, 4], ELEM, 71)
    check_traced(NESTS[name], (xsss,), (spec(["A", "B", "C"], ELEM),))


def test_values_crossing_block_nodes():
    """Values of an enclosing body used inside a child block node and after it."""
    xs, ys = flist([3], (2, 2), 81), flist([4], (2, 2), 82)

    def program(xs, ys):
        def outer(x):
            a = ft.tanh(x)
            zs = ys.map(lambda y: a @ y)  # `a` is read inside the child block
            b = a * 2.0  # ... and used again after it
            s = ys.reduce(lambda s, y: ft.tanh(s) @ y + x)
            return zs.map(lambda z: z + b + a * s)
        return xs.map(outer)

    check_traced(program, (xs, ys), (spec(["L"], (2, 2)), spec(["M"], (2, 2))))


def test_returning_inputs_views_and_constants():
    xs = flist([4], ELEM, 91)
    table = flist([4], ELEM, 92)  # a concrete FractalTensor closed over: a constant buffer

    def program(xs):
        return xs, xs[::2], ft.map(lambda a, b: a * b, xs, table), xs.reduce(left)

    check_traced(program, (xs,))


S22 = spec(["L"], (2, 2))
SAB = spec(["A", "B"], (2,))
EDGES = {
    # name: (program, input shapes as (lengths, element shape), specs)
    "scanl over a zip without init (tuple state)": (
        lambda xs, ys: ft.scanl(lambda s, p: (s[0] * p[1] + p[0], s[1] - p[0]), ft.zip(xs, ys)),
        [([4], (2, 2)), ([4], (2, 2))], (S22, S22)),
    "foldr over a zip without init": (
        lambda xs, ys: ft.foldr(lambda p, s: (s[0] * p[1] + p[0], s[1] - p[0]), ft.zip(xs, ys)),
        [([4], (2, 2)), ([4], (2, 2))], (S22, S22)),
    "map returning a zip": (
        lambda xs, ys: ft.map(lambda x: ft.zip(ys, ys.reverse()), xs),
        [([3], (2, 2)), ([4], (2, 2))], (S22, spec(["M"], (2, 2)))),
    "identity maps": (
        lambda xss: (xss.map(lambda xs: xs), xss.map(lambda xs: xs.map(lambda x: x))),
        [([3, 4], (2,))], (SAB,)),
    "scan returning its element / its state": (
        lambda xs: (xs.scanl(lambda s, x: x, ft.ones((2, 2))), xs.scanl(lambda s, x: s, ft.ones((2, 2))),
                    xs.scanr(lambda x, s: s)),
        [([4], (2, 2))], (S22,)),
    "one result returned twice": (
        lambda xs: (lambda a: (a, a))(xs.map(lambda x: x * 2.0)), [([4], (2, 2))], (S22,)),
    "a fold's result used by a later map": (
        lambda xs, ys: ys.map(lambda y: y @ xs.reduce(lambda s, x: s @ x)),
        [([4], (2, 2)), ([3], (2, 2))], (S22, spec(["M"], (2, 2)))),
    "reduce over a product with a tuple state": (
        lambda xs, ys: ft.product(xs, ys[:2]).map(lambda row: row.reduce(lambda s, p: (s[0] @ p[0], s[1] + p[1]))),
        [([3], (2, 2)), ([4], (2, 2))], (S22, spec(["M"], (2, 2)))),
    "padded window of lists": (
        lambda xss: (xss.window(2, 1, 1).map(lambda w: w.map(lambda xs: xs.reduce(lambda s, x: s * 0.5 + x))),
                     xss.window(2, 1, (0, 1))),
        [([3, 4], (2,))], (SAB,)),
    "padded window of a zip": (
        lambda xs, ys: ft.zip(xs, ys).window(3, 1, 1).map(
            lambda w: w.foldl(lambda s, p: s @ p[0] + p[1], ft.ones((2, 2)))),
        [([4], (2, 2)), ([4], (2, 2))], (S22, S22)),
    "scan with a (list, tensor) state": (
        lambda xss: xss.scanl(lambda s, xs: (ft.map(lambda h, x: h + x, s[0], xs), s[1] * 2.0),
                              (xss[0], ft.ones((2,)))),
        [([3, 4], (2,))], (SAB,)),
    "an element of the scanned list inside the scan": (
        lambda xs: xs.scanl(lambda s, x: s @ xs[0] + x), [([4], (2, 2))], (S22,)),
    "windows inside a strided split, merged": (
        lambda xs: xs.strided_split(2).map(
            lambda r: r.shifted_slide(3).map(lambda w: w.reduce(lambda s, x: s + x))).strided_merge(),
        [([6], (2, 2))], (S22,)),
    "numpy constants and every element function": (
        lambda xs: xs.map(lambda x: ft.matmul(ft.transpose(x), x) * np.float32(2) + np.ones((2, 2), np.float32)
                          + ft.maximum(x, 0.5) - ft.minimum(x, -0.5) + ft.relu(x) * ft.sqrt(ft.exp(x))
                          + ft.log(ft.exp(x)) - 3 + ft.full((2, 2), 0.25) / (ft.zeros_like(x) + 2.0)),
        [([4], (2, 2))], (S22,)),
    "float64 lists": (
        lambda xs: xs.scanl(lambda s, x: ft.tanh(s) + x), [([4], (2,))], (ft.spec("[L]float64[2]"),)),
}


@pytest.mark.parametrize("name", EDGES)
def test_edge_programs(name):
    program, shapes, specs = EDGES[name]
    inputs = tuple(flist(lengths, shape, 100 + k) for k, (lengths, shape) in enumerate(shapes))
    if specs[0].dtype == "float64":
        inputs = tuple(ft.FractalTensor.from_numpy(x.to_numpy().astype(np.float64), x.depth) for x in inputs)
    check_traced(program, inputs, specs)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workloads_traced_on_specs_run_like_eager(name):
    mod = WORKLOADS[name]
    check_traced(mod.program, mod.inputs("small", seed=5), mod.specs("small"))


def test_a_trace_can_follow_a_failed_trace():
    with pytest.raises(errors.PolyftError):
        ft.trace(lambda xs: xs.map(lambda x: None), SX)
    check_traced(lambda xs: xs.map(lambda x: x + 1.0), (flist([3], ELEM, 1),), (SX,))


# =================================================================================================
# 3. ETDG structure (paper §4.4, Figure 4)
# =================================================================================================
@pytest.fixture(scope="module")
def rnn():
    return ft.trace(stacked_rnn.program, *stacked_rnn.specs())


def the_block(etdg):
    blocks = [b for b in etdg.blocks() if b is not etdg.root]
    assert len(blocks) == 1
    return blocks[0]


def the_statement(etdg):
    assert len(etdg.statements) == 1
    return etdg.statements[0]


def reads_of(statement, buffer_name):
    return [m for m in statement.reads if m.buffer.resolve().name == buffer_name]


def test_stacked_rnn_is_one_block_node_map_scanl_scanl(rnn):
    block = the_block(rnn)
    assert block.p == ["map", "scanl", "scanl"]
    assert [str(d.extent) for d in block.dims] == ["N", "D", "L"]
    assert rnn.params == ["D", "L", "N"]
    assert the_statement(rnn).dims == block.dims


def test_stacked_rnn_state_read_is_identity_minus_one_in_time(rnn):
    """`ysss[i][j][k-1]` in map/scanl/scanl: M = I3, o = [0, 0, -1] (paper §4.4), for k >= 1."""
    stmt = the_statement(rnn)
    i, j, k = stmt.dims
    time_state = [m for m in reads_of(stmt, "ysss") if any(k in c.expr.dims for c in m.conds)]
    assert len(time_state) == 1
    m = time_state[0]
    assert isinstance(m, AccessMap) and m.is_affine and not m.is_gather
    np.testing.assert_array_equal(m.M, np.eye(3, dtype=np.int64))
    assert [int(x) for x in m.o] == [0, 0, -1]
    (cond,) = m.conds
    assert str(cond) == "k >= 1"
    assert [cond.holds({i: 0, j: 0, k: v}) for v in range(3)] == [False, True, True]
    # the k = 0 piece of the same load is the scan's init: zeros, not a buffer
    load = next(op for op in stmt.ops if op.op == "load" and any(pc.conds == m.conds for pc in op.pieces))
    init = [pc for pc in load.pieces if pc.buffer is None]
    assert len(init) == 1 and [str(c) for c in init[0].conds] == ["k = 0"]
    assert not np.any(init[0].const)


def test_stacked_rnn_layer_state_and_inputs(rnn):
    stmt = the_statement(rnn)
    i, j, k = stmt.dims
    layer = [m for m in reads_of(stmt, "ysss") if any(j in c.expr.dims for c in m.conds)]
    assert len(layer) == 1
    np.testing.assert_array_equal(layer[0].M, np.eye(3, dtype=np.int64))
    assert [int(x) for x in layer[0].o] == [0, -1, 0]
    assert [str(c) for c in layer[0].conds] == ["j >= 1"]
    (xss,) = reads_of(stmt, "xss")  # the first layer reads the input
    np.testing.assert_array_equal(xss.M, [[1, 0, 0], [0, 0, 1]])
    assert [str(c) for c in xss.conds] == ["j = 0"]
    (ws,) = reads_of(stmt, "ws")
    np.testing.assert_array_equal(ws.M, [[0, 1, 0]])
    assert ws.conds == ()
    (write,) = stmt.writes
    assert write.buffer.resolve().name == "ysss" and write.kind == "write"
    np.testing.assert_array_equal(write.M, np.eye(3, dtype=np.int64))
    assert [int(x) for x in write.o] == [0, 0, 0]


def test_stacked_rnn_depth_2_dimension_5(rnn):
    assert (rnn.depth, rnn.dimension) == (2, 5)


def test_stacked_rnn_regions_are_figure_4(rnn):
    stmt = the_statement(rnn)
    regions = stmt.regions()
    assert {frozenset(str(c) for c in r) for r in regions} == {
        frozenset({"j = 0", "k = 0"}), frozenset({"j = 0", "k >= 1"}),
        frozenset({"j >= 1", "k = 0"}), frozenset({"j >= 1", "k >= 1"})}
    # the regions partition the iteration domain: every instance lies in exactly one
    i, j, k = stmt.dims
    for point in np.ndindex(2, 3, 4):
        env = dict(zip((i, j, k), point))
        assert sum(all(c.holds(env) for c in r) for r in regions) == 1


def test_stacked_rnn_printout(rnn):
    text = str(rnn)
    assert "p = [map, scanl, scanl]" in text
    assert "block b0 [i < N, j < D, k < L]" in text
    assert "ysss[i, j, k - 1]   M=[1 0 0; 0 1 0; 0 0 1] o=[0, 0, -1]   if k >= 1" in text
    assert "ysss[i, j - 1, k]   M=[1 0 0; 0 1 0; 0 0 1] o=[0, -1, 0]   if j >= 1" in text
    assert "depth 2, dimension 5, parameters D, L, N" in text
    assert text.splitlines()[0] == ("etdg stacked_rnn(xss: [N, L]float32[1, 8], ws: [D]float32[8, 8]) "
                                    "-> ysss: [N, D, L]float32[1, 8]")


def test_type_strings_of_symbolic_specs(rnn):
    assert str(ft.spec("[N, L]float32[1, 8]")) == "[N, L]float32[1, 8]"
    assert str(ft.spec("[N,L] float32 [1,8]")) == "[N, L]float32[1, 8]"
    assert [str(b.type) for _, b in rnn.inputs] == ["[N, L]float32[1, 8]", "[D]float32[8, 8]"]
    assert [str(b.type) for b in rnn.outputs] == ["[N, D, L]float32[1, 8]"]
    seen = []

    def program(xss):
        seen.append(xss.type_string)
        seen.append(xss[0].type_string)
        seen.append(xss.window(2).type_string)
        seen.append(xss.map(lambda xs: xs.strided_split(2)).type_string)
        return xss

    ft.trace(program, ft.spec("[N, L]float32[1, 8]"))
    assert seen == ["[N, L]float32[1, 8]", "[L]float32[1, 8]", "[N - 1, 2, L]float32[1, 8]",
                    "[N, 2, floor((L)/2)]float32[1, 8]"]


def two_blocks(xs, ys):
    a = xs.map(lambda x: x * 2.0)
    return ft.map(lambda p, y: p @ y, a, ys.scanl(lambda s, y: s @ y))


def check_dot(dot: str, etdg):
    assert dot.startswith(f'digraph "{etdg.name}" {{') and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    blocks = [b for b in etdg.blocks() if b is not etdg.root]
    clusters = re.findall(r'subgraph "cluster_(\w+)"', dot)
    assert sorted(clusters) == sorted(b.name for b in blocks)
    for b in etdg.buffers:
        assert f'"{b.resolve().name}" [shape=box3d' in dot
    edges = re.findall(r'^\s*"([^"]+)" -> "([^"]+)"(.*)$', dot, re.M)
    buffer_names = {b.resolve().name for b in etdg.buffers}
    access_edges = [e for e in edges if e[0] in buffer_names or e[1] in buffer_names]
    n_maps = sum(len(s.reads) + len(s.writes) for s in etdg.statements)
    assert len(access_edges) == n_maps
    for _, _, attrs in access_edges:
        assert re.search(r'\[label="[^"]*\[[^"]*\][^"]*"\];$', attrs), attrs  # labelled: buf[index] ...
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr


def test_to_dot_stacked_rnn(rnn):
    dot = rnn.to_dot()
    check_dot(dot, rnn)
    assert "p=[map, scanl, scanl]" in dot
    assert 'label="ysss[i, j, k - 1]   M=[1 0 0; 0 1 0; 0 0 1] o=[0, 0, -1]   if k >= 1"' in dot


def test_to_dot_one_cluster_per_block():
    etdg = ft.trace(two_blocks, spec(["L"], (2, 2)), spec(["L"], (2, 2)))
    assert len([b for b in etdg.blocks() if b is not etdg.root]) == 3
    check_dot(etdg.to_dot(), etdg)


def test_access_maps_of_access_operators():
    """Slices, shifts, reverse, strides and windows become `M`, `o` on read edges: no copies."""
    def program(xs):
        a = ft.map(lambda p, q, r: p + q * r, xs[2:].shift(-1), xs.reverse()[2:5], xs[::2])
        return a, xs.window(2, 2).map(lambda w: w.reduce(lambda s, x: s * x))

    etdg = ft.trace(program, flist([6], ELEM, 1))
    assert not [op for st_ in etdg.statements for op in st_.ops if op.op == "copy"]
    reads = sorted((", ".join(map(str, m.index)), m.M.tolist(), [int(x) for x in m.o], [str(c) for c in m.conds])
                   for st_ in etdg.statements for m in st_.reads if m.buffer.resolve().name == "xs")
    assert reads == sorted([
        ("i + 2", [[1]], [2], []),  # xs[2:].shift(-1)[i]
        ("-i + 3", [[-1]], [3], []),  # xs.reverse()[2:5][i] = xs[5 - (i + 2)]
        ("2*i", [[2]], [0], []),  # xs[::2][i]
        ("2*i + j + 1", [[2, 1]], [1], []),  # xs.window(2, 2)[i][j + 1], the reduce's x
        ("2*i", [[2, 0]], [0], ["j = 0"]),  # xs.window(2, 2)[i][0], the reduce's first state
    ])


# =================================================================================================
# 4. Errors while tracing
# =================================================================================================
SOURCE = open(__file__).read().splitlines()


def line_of(tag):
    """The line number of the line of this file ending in `# <tag>`."""
    hits = [n for n, text in enumerate(SOURCE, 1) if text.rstrip().endswith(f"# {tag}")]
    assert len(hits) == 1, tag
    return hits[0]


def check_error(info, op, tag, *fragments):
    e = info.value
    assert isinstance(e, errors.PolyftError)
    assert e.op == op and str(e).startswith(f"{op}: ")
    assert e.where is not None and e.where.startswith(f"test_trace.py:{line_of(tag)}: "), e.where
    assert f"at {e.where}" in str(e)
    for fragment in fragments:
        assert fragment in str(e), (fragment, str(e))


def test_shape_mismatch_in_a_traced_user_function():
    xs, w = flist([3], (2, 3), 1), rand((4, 4), 2)
    with pytest.raises(errors.ShapeError) as info:
        ft.trace(lambda xs, w: xs.map(lambda x: x @ w), xs, w)  # matmul-here
    check_error(info, "matmul", "matmul-here", "[2, 3]", "[4, 4]")
    with pytest.raises(errors.ShapeError) as info:
        ft.trace(lambda xs: xs.map(lambda x: x + ft.ones((4,))), SX)  # add-here
    check_error(info, "add", "add-here", "[2, 3]", "[4]")


def test_depth_mismatch_map_over_a_tensor():
    w = rand((4, 4), 3)
    with pytest.raises(errors.DepthError) as info:
        ft.trace(lambda xs, w: ft.map(lambda x: x, w), SX, w)  # depth-here
    check_error(info, "map", "depth-here", "float32[4, 4]")
    with pytest.raises(errors.DepthError) as info:
        ft.trace(lambda xs: xs.map(lambda x: ft.scanl(left, x)), SX)  # element-here
    check_error(info, "scanl", "element-here", "float32[2, 3]")


@pytest.mark.parametrize("specs", [(flist([5], ELEM, 1), flist([4], ELEM, 2)), (SX, spec(["M"], ELEM))],
                         ids=["concrete", "symbolic"])
def test_zip_and_map_over_unequal_lengths(specs):
    a, b = ("5", "4") if isinstance(specs[0], ft.FractalTensor) else ("L", "M")
    with pytest.raises(errors.LengthMismatchError) as info:
        ft.trace(lambda xs, ys: ft.zip(xs, ys).map(lambda p: p[0]), *specs)  # zip-here
    check_error(info, "zip", "zip-here", f"[{a}]float32[2, 3]", f"[{b}]float32[2, 3]")
    with pytest.raises(errors.LengthMismatchError) as info:
        ft.trace(lambda xs, ys: ft.map(lambda x, y: x + y, xs, ys), *specs)  # map2-here
    check_error(info, "map", "map2-here", f"[{a}]float32[2, 3]", f"[{b}]float32[2, 3]")


def test_state_type_mismatch_in_a_traced_scan():
    with pytest.raises(errors.StateTypeError) as info:
        ft.trace(lambda xs: xs.scanl(lambda s, x: ft.sum(s + x, axis=0), ft.zeros(ELEM)), SX)  # shape-here
    check_error(info, "scanl", "shape-here", "float32[2, 3]", "float32[3]")
    with pytest.raises(errors.StateTypeError) as info:
        ft.trace(lambda xs: xs.scanr(lambda x, s: s[0] + x, (ft.zeros(ELEM), ft.zeros(ELEM))), SX)  # tuple-here
    check_error(info, "scanr", "tuple-here", "(float32[2, 3], float32[2, 3])")
    with pytest.raises(errors.StateTypeError) as info:
        ft.trace(lambda xss: xss.scanl(lambda hs, xs: hs[0], xss[0]), spec(["N", "M"], ELEM))  # list-here
    check_error(info, "scanl", "list-here", "[M]float32[2, 3]")


def test_python_number_as_init_is_rejected_with_a_hint_as_eagerly():
    xs = flist([3], ELEM, 4)
    with pytest.raises(errors.StateTypeError) as eager:
        xs.scanl(lambda s, x: s + x, 0.0)
    assert "ft.zeros" in str(eager.value)
    with pytest.raises(errors.StateTypeError) as info:
        ft.trace(lambda xs: xs.scanl(lambda s, x: s + x, 0.0), SX)  # number-init-here
    check_error(info, "scanl", "number-init-here", "float", "ft.zeros")


@pytest.mark.parametrize("op", ["reduce", "foldl", "foldr"])
def test_aggregate_without_init_over_an_empty_concrete_list(op):
    with pytest.raises(errors.EmptyReduceError) as info:
        ft.trace(lambda xs: getattr(xs[3:3], op)(left), flist([5], ELEM, 5))  # empty-here
    check_error(info, op, "empty-here", "init")


def test_window_larger_than_the_list():
    with pytest.raises(errors.WindowError) as info:
        ft.trace(lambda xs: xs.window(6).map(lambda w: w[0]), flist([5], ELEM, 6))  # window-here
    check_error(info, "window", "window-here", "6", "[5]float32[2, 3]")
    with pytest.raises(errors.WindowError) as info:
        ft.trace(lambda xs: xs.window(9, 1, (1, 2)), flist([5], ELEM, 6))  # padded-window-here
    check_error(info, "window", "padded-window-here", "9", "[5]float32[2, 3]")


@pytest.mark.parametrize("bad", [5, -1])
def test_out_of_range_gather_index(bad):
    with pytest.raises(errors.IndexRangeError) as info:
        ft.trace(lambda xs: xs.gather([0, bad, 1]).map(lambda x: x), flist([5], ELEM, 7))  # gather-here
    check_error(info, "gather", "gather-here", str(bad), "[5]float32[2, 3]")


def test_negative_gather_index_with_a_symbolic_length():
    """A negative gather index is out of range whatever L is (eagerly too: no Python wrap-around)."""
    with pytest.raises(errors.IndexRangeError) as info:
        ft.trace(lambda xs: xs.gather([0, -1]).map(lambda x: x), SX)  # symbolic-gather-here
    check_error(info, "gather", "symbolic-gather-here", "-1", "[L]float32[2, 3]")


def test_out_of_range_int_index():
    with pytest.raises(errors.IndexRangeError) as info:
        ft.trace(lambda xs: xs.map(lambda x: x + xs[-6]), flist([5], ELEM, 8))  # index-here
    check_error(info, "getitem", "index-here", "-6", "[5]float32[2, 3]")


@pytest.mark.parametrize("value, name", [(None, "NoneType"), (1.5, "float"), ([], "list")])
def test_user_function_returning_a_non_tensor(value, name):
    result = (lambda x: [x, x]) if name == "list" else (lambda x: value)
    with pytest.raises(errors.ReturnTypeError) as info:
        ft.trace(lambda xs: xs.map(result), SX)  # return-here
    check_error(info, "map", "return-here", "list" if name == "list" else name)


def test_program_returning_a_non_tensor():
    with pytest.raises(errors.ReturnTypeError) as info:
        ft.trace(lambda xs: None, SX)  # program-return-here
    check_error(info, "return", "program-return-here", "NoneType")


def test_python_control_flow_on_traced_values():
    with pytest.raises(errors.TracerControlFlowError) as info:
        ft.trace(lambda xs: xs.map(lambda x: x if x else -x), SX)  # if-here
    check_error(info, "control flow", "if-here", "float32[2, 3]")
    with pytest.raises(errors.TracerControlFlowError) as info:
        ft.trace(lambda xs: xs.map(lambda x: x * bool(x)), SX)  # bool-here
    check_error(info, "control flow", "bool-here", "float32[2, 3]")
    with pytest.raises(errors.TracerControlFlowError) as info:
        ft.trace(lambda xs: xs.map(lambda x: x * int(x)), SX)  # int-here
    check_error(info, "control flow", "int-here", "float32[2, 3]")
    with pytest.raises(errors.TracerControlFlowError) as info:
        ft.trace(lambda xs: xs.map(lambda x: x * len(xs)), SX)  # len-here
    check_error(info, "len", "len-here", "L", "[L]float32[2, 3]")
    with pytest.raises(errors.TracerControlFlowError) as info:
        ft.trace(lambda xs: [x for x in xs], SX)  # iter-here
    check_error(info, "len", "iter-here", "[L]float32[2, 3]")


def test_len_of_a_concrete_traced_list_is_fine():
    xs = flist([3], ELEM, 9)
    check_traced(lambda xs: xs.map(lambda x: x * float(len(xs))), (xs,))


def test_ragged_constant_in_trace():
    """A ragged input traces (its lengths are call-time data: tests/test_ragged.py); a ragged list
    the program holds as a constant has no call to give them."""
    ragged = ft.FractalTensor.from_list([[rand((2,), 1)], [rand((2,), 2), rand((2,), 3)]])
    with pytest.raises(errors.RaggedError) as info:
        ft.trace(lambda xs: ft.map(lambda x, ys: ys.map(lambda y: y + x), xs, ragged), flist([2], (2,), 4))  # ragged-here
    check_error(info, "trace", "ragged-here", "[2, *]float32[2]", "as an input")


@pytest.mark.parametrize("op", ["scanl", "scanr"])
def test_scan_without_init_of_an_empty_list_is_empty(op):
    """Table 1: a scan without init of [] is [] (only reduce and the folds refuse it)."""
    def program(xs):
        return getattr(ft, op)(lambda a, b: a - b * 0.5, xs)
    empty = flist([5], ELEM, 7)[3:3]
    assert len(program(empty)) == 0
    for args in ((empty,), (SX,)):
        etdg = ft.trace(program, *args)
        got = run(etdg, empty)
        assert len(got) == 0 and got.element_shape == tuple(ELEM)
