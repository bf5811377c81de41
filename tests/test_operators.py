"""Compute operators against Table 1, with references written from the definitions.

The references use functools.reduce and plain loops over numpy arrays; the user functions are
neither associative nor commutative, so any change of order or argument convention shows.
"""
import functools

import numpy as np
from hypothesis import given, settings, strategies as st

import polyft as ft
from polyft.testing import rel_error

FAST = settings(max_examples=40, deadline=None)
SHAPES = [(), (3,), (2, 3)]


@st.composite
def arrays(draw, min_len=0, max_len=6):
    """A fresh seeded random float32 array whose first axis is the list."""
    n = draw(st.integers(min_len, max_len))
    shape = draw(st.sampled_from(SHAPES))
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).standard_normal((n,) + shape).astype(np.float32)


def fresh(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def left(s, x):
    """(s, x) -> tanh(s)/2 + x: order-sensitive and not symmetric in its arguments."""
    return np.tanh(s) * 0.5 + x


def right(x, s):
    return x - np.tanh(s) * 0.5


def as_list(arr):
    return ft.FractalTensor.from_numpy(arr, 1)


# -- references from Table 1 -----------------------------------------------------------------
def ref_foldl(f, xs, init):
    return functools.reduce(f, xs, init)


def ref_foldr(f, xs, init):
    return functools.reduce(lambda s, x: f(x, s), reversed(xs), init)


def ref_scanl(f, xs, init):
    """[s0⊕x0, s0⊕x0⊕x1, ...]; without init the prefix folds start from x0."""
    if init is None:
        return [functools.reduce(f, xs[: i + 1]) for i in range(len(xs))]
    return [ref_foldl(f, xs[: i + 1], init) for i in range(len(xs))]


def ref_scanr(f, xs, init):
    """[x0⊕(...⊕(xm⊕s0)), ..., xm⊕s0]; without init the suffix folds end at xm."""
    if init is None:
        return [functools.reduce(lambda s, x: f(x, s), reversed(xs[i:])) for i in range(len(xs))]
    return [ref_foldr(f, xs[i:], init) for i in range(len(xs))]


def elements(arr):
    return [arr[i] for i in range(len(arr))]


def assert_list_close(got, expected, shape, dtype="float32"):
    assert isinstance(got, ft.FractalTensor) and got.depth == 1
    assert got.element_shape == shape and got.dtype == dtype and len(got) == len(expected)
    if expected:
        assert rel_error(got, np.stack(expected)) < 1e-5


# -- map -------------------------------------------------------------------------------------
@FAST
@given(arrays())
def test_map_applies_f_to_each_element(arr):
    got = ft.map(lambda x: np.tanh(x) * 2 + 1, as_list(arr))
    assert_list_close(got, [np.tanh(x) * 2 + 1 for x in elements(arr)], arr.shape[1:])


@FAST
@given(arrays(), st.integers(0, 2**32 - 1))
def test_map_over_several_lists_unpacks_and_over_a_zip_passes_a_tuple(arr, seed):
    other = fresh(arr.shape, seed)
    expected = [x * 2 - y for x, y in zip(elements(arr), elements(other))]
    assert_list_close(ft.map(lambda x, y: x * 2 - y, as_list(arr), as_list(other)), expected, arr.shape[1:])
    assert_list_close(ft.map(lambda xy: xy[0] * 2 - xy[1], ft.zip(as_list(arr), as_list(other))),
                      expected, arr.shape[1:])


def test_map_of_an_empty_list_finds_the_result_type_by_calling_f_on_zeros():
    w = fresh((3, 5), 1)
    got = ft.map(lambda x: (x @ w, ft.sum(x)), as_list(fresh((0, 2, 3), 2)))
    assert [r.type_string for r in got] == ["[0]float32[2, 5]", "[0]float32[]"]


def test_map_returning_lists_gives_a_list_one_deeper():
    arr = fresh((4, 3), 3)
    got = ft.map(lambda x: as_list(np.stack([x, -x])), as_list(arr))
    assert got.type_string == "[4, 2]float32[3]"
    assert rel_error(got, np.stack([arr, -arr], axis=1)) < 1e-5


def test_map_returning_tuples_is_unzipped():
    arr = fresh((5, 2), 4)
    ys, zs = ft.map(lambda x: (x + 1, np.sum(x)), as_list(arr))
    assert ys.type_string == "[5]float32[2]" and zs.type_string == "[5]float32[]"
    assert rel_error(ys, arr + 1) < 1e-5 and rel_error(zs, arr.sum(axis=1)) < 1e-5


def test_nested_map_over_a_depth_2_list():
    arr = fresh((3, 4, 2), 5)
    got = ft.map(lambda xs: ft.map(lambda x: ft.sigmoid(x), xs), ft.FractalTensor.from_numpy(arr, 2))
    assert got.type_string == "[3, 4]float32[2]"
    assert rel_error(got, 1 / (1 + np.exp(-arr.astype(np.float64)))) < 1e-5


# -- aggregates ------------------------------------------------------------------------------
@FAST
@given(arrays(), st.integers(0, 2**32 - 1))
def test_foldl_and_reduce_with_init(arr, seed):
    init = fresh(arr.shape[1:], seed)
    expected = ref_foldl(left, elements(arr), init)
    for op in (ft.foldl, ft.reduce):
        assert rel_error(op(left, as_list(arr), init), expected) < 1e-5


@FAST
@given(arrays(min_len=1))
def test_foldl_and_reduce_without_init_start_from_x0(arr):
    expected = functools.reduce(left, elements(arr))
    for op in (ft.foldl, ft.reduce):
        assert rel_error(op(left, as_list(arr)), expected) < 1e-5


@FAST
@given(arrays(), st.integers(0, 2**32 - 1))
def test_foldr_with_init_takes_x_then_state(arr, seed):
    init = fresh(arr.shape[1:], seed)
    assert rel_error(ft.foldr(right, as_list(arr), init), ref_foldr(right, elements(arr), init)) < 1e-5


@FAST
@given(arrays(min_len=1))
def test_foldr_without_init_ends_at_xm(arr):
    expected = functools.reduce(lambda s, x: right(x, s), reversed(elements(arr)))
    assert rel_error(ft.foldr(right, as_list(arr)), expected) < 1e-5


@FAST
@given(arrays(), st.integers(0, 2**32 - 1))
def test_scanl_with_init_leaves_init_out(arr, seed):
    init = fresh(arr.shape[1:], seed)
    assert_list_close(ft.scanl(left, as_list(arr), init), ref_scanl(left, elements(arr), init), arr.shape[1:])


@FAST
@given(arrays())
def test_scanl_without_init_starts_with_x0(arr):
    got = ft.scanl(left, as_list(arr))
    assert_list_close(got, ref_scanl(left, elements(arr), None), arr.shape[1:])
    if len(arr):
        assert np.array_equal(got[0], arr[0])


@FAST
@given(arrays(), st.integers(0, 2**32 - 1))
def test_scanr_with_init(arr, seed):
    init = fresh(arr.shape[1:], seed)
    assert_list_close(ft.scanr(right, as_list(arr), init), ref_scanr(right, elements(arr), init), arr.shape[1:])


@FAST
@given(arrays())
def test_scanr_without_init_ends_with_xm(arr):
    got = ft.scanr(right, as_list(arr))
    assert_list_close(got, ref_scanr(right, elements(arr), None), arr.shape[1:])
    if len(arr):
        assert np.array_equal(got[-1], arr[-1])


@FAST
@given(arrays(min_len=1))
def test_the_folds_are_the_ends_of_the_scans(arr):
    xs = as_list(arr)
    assert np.array_equal(ft.foldl(left, xs), ft.scanl(left, xs)[-1])
    assert np.array_equal(ft.foldr(right, xs), ft.scanr(right, xs)[0])


def test_aggregates_of_an_empty_list_with_init():
    empty, init = as_list(fresh((0, 2), 6)), fresh(2, 7)
    for op in (ft.reduce, ft.foldl, ft.foldr):
        assert op(left, empty, init) is init
    for op in (ft.scanl, ft.scanr):
        assert op(left, empty, init).type_string == "[0]float32[2]"


def test_scan_without_init_of_an_empty_list_is_empty_of_the_element_type():
    assert ft.scanl(left, as_list(fresh((0, 2, 3), 8))).type_string == "[0]float32[2, 3]"


@FAST
@given(arrays(min_len=0, max_len=5), st.integers(0, 2**32 - 1))
def test_tuple_state_scan_is_unzipped(arr, seed):
    """An LSTM-like (c, h) state: the scan returns the list of c and the list of h."""
    shape = arr.shape[1:]
    c0, h0 = fresh(shape, seed), fresh(shape, seed + 1)

    def cell(state, x):
        c, h = state
        c = ft.sigmoid(x) * c + ft.tanh(h)
        return c, ft.tanh(c) * 0.5 + x

    cs, hs = ft.scanl(cell, as_list(arr), (c0, h0))
    ref = ref_scanl(cell, elements(arr), (c0, h0))
    assert_list_close(cs, [s[0] for s in ref], shape)
    assert_list_close(hs, [s[1] for s in ref], shape)


def test_a_list_state_and_the_method_forms():
    """Listing 1's inner loop as methods: ws.scanl over layers, a list state of one sentence."""
    xs, ws = as_list(fresh((5, 1, 4), 9)), as_list(fresh((3, 4, 4), 10) * 0.5)
    zero = ft.zeros((1, 4))

    def layer(xs, w):
        return xs.scanl(lambda s, x: ft.tanh(x @ w + s), zero)

    got = ws.scanl(layer, xs)
    assert got.type_string == "[3, 5]float32[1, 4]"
    ref, inputs = [], elements(xs.to_numpy())
    for w in elements(ws.to_numpy()):
        state, outs = zero, []
        for x in inputs:
            state = np.tanh(x @ w + state)
            outs.append(state)
        ref.append(np.stack(outs))
        inputs = outs
    assert rel_error(got, np.stack(ref)) < 1e-5
    assert rel_error(ws.foldl(layer, xs), ref[-1]) < 1e-5


def test_methods_equal_the_functions():
    xs, init = as_list(fresh((4, 3), 11)), fresh(3, 12)
    assert rel_error(xs.map(np.tanh), ft.map(np.tanh, xs)) == 0
    for name in ("reduce", "foldl", "scanl"):
        assert rel_error(getattr(xs, name)(left, init), getattr(ft, name)(left, xs, init)) == 0
    for name in ("foldr", "scanr"):
        assert rel_error(getattr(xs, name)(right, init), getattr(ft, name)(right, xs, init)) == 0


def test_map_over_a_product_sees_rows_of_pairs():
    a, b = fresh((3, 2), 13), fresh((4, 2), 14)
    got = ft.map(lambda row: ft.map(lambda p: ft.sum(p[0] * p[1]), row), ft.product(as_list(a), as_list(b)))
    assert got.type_string == "[3, 4]float32[]"
    assert rel_error(got, a @ b.T) < 1e-5


def test_a_returned_zip_counts_as_a_tuple_of_lists():
    arr = fresh((3, 2, 4), 15)
    xs, ys = ft.map(lambda row: ft.zip(row, row.reverse()), ft.FractalTensor.from_numpy(arr, 2))
    assert rel_error(xs, arr) < 1e-5 and rel_error(ys, arr[:, ::-1]) < 1e-5


def test_scalar_results_are_0d_tensors():
    arr = fresh((4, 3), 16)
    got = ft.map(lambda x: np.float32(x.sum()), as_list(arr))
    assert got.element_shape == () and rel_error(got, arr.sum(axis=1)) < 1e-5
