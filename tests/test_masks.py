"""Comparisons of traced values (`t > 0`, `a == b`, ...) as 0/1 masks of the operands' dtype, and the
logical operators on them, in eager, C and cuda-emulated against numpy (NaN compares false except
in `!=`), under differentiation (no gradient through a mask), and in where, arithmetic and sums."""
import numpy as np
import pytest

import polyft as ft
from polyft.errors import DTypeError
from test_cuda import TARGETS as CUDA_TARGETS
from polyft.testing import rel_error

pytestmark = pytest.mark.usefixtures("compile_cache")

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5], np.float32)


def pair(seed, n=5):
    """Two lists that are equal in places, with NaN, infinities and both zeros against each other."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-2, 3, (n, 3, 8)).astype(np.float32) * 0.5
    b = rng.integers(-2, 3, (n, 3, 8)).astype(np.float32) * 0.5
    a[0, 0], b[0, 0] = SPECIAL, SPECIAL[::-1]
    a[0, 1], b[0, 1] = SPECIAL, SPECIAL
    return ft.FractalTensor.from_numpy(a, 1), ft.FractalTensor.from_numpy(b, 1)


OPS = {">": np.greater, "<": np.less, ">=": np.greater_equal, "<=": np.less_equal, "==": np.equal,
       "!=": np.not_equal}


def masks(xs, ys):
    return ft.map(lambda a, b: (a > b, a < b, a >= b, a <= b, a == b, a != b, (a > 0) & (b <= 0),
                                (a == b) | (b > 0.5), ~(a != a), (a > 0) ^ (b > 0)), xs, ys)


def expected(a, b):
    with np.errstate(all="ignore"):
        out = [f(a, b) for f in OPS.values()]
        out += [(a > 0) & (b <= 0), (a == b) | (b > 0.5), ~(a != a), (a > 0) ^ (b > 0)]
    return [m.astype(np.float32) for m in out]


@pytest.mark.parametrize("target", ["c", *CUDA_TARGETS])
def test_comparisons_and_logic_are_numpys_masks(target):
    xs, ys = pair(1)
    got = ft.compile(masks, *pair(2), target=target)(xs, ys)
    want = expected(xs.to_numpy(), ys.to_numpy())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == "float32"
        np.testing.assert_array_equal(g.to_numpy(), w)


def leaky(xs):
    """The issue's example, a mask in arithmetic, and a sum of a mask (a count)."""
    return xs.map(lambda t: ft.where(t > 0, t, t ** 2) + (t < -0.5) * 3.0 + ft.sum(t >= 0, axis=-1, keepdims=True))


@pytest.mark.parametrize("target", ["c", "cuda-emulated"])
def test_masks_in_where_arithmetic_and_sums_equal_eager(target):
    x = np.random.default_rng(3).standard_normal((4, 3, 6)).astype(np.float32)
    x[0, 0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    xs = ft.FractalTensor.from_numpy(x, 1)
    got = ft.compile(leaky, xs, target=target)(xs).to_numpy()
    with np.errstate(all="ignore"):
        want = np.where(x > 0, x, x ** 2) + (x < -0.5) * 3.0 + np.sum(x >= 0, axis=-1, keepdims=True)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(leaky(xs).to_numpy(), want, rtol=1e-6)  # eager: numpy's bool masks


def test_a_mask_has_the_operands_dtype_by_numpys_promotion():
    def dtypes(xs, ys):
        return ft.map(lambda a, b: (a > 0, a > b, a.astype("float64") < 0.5), xs, ys)
    x = ft.FractalTensor.from_numpy(np.ones((2, 2, 3), np.float32), 1)
    y = ft.FractalTensor.from_numpy(np.zeros((2, 2, 3)), 1)
    got = ft.compile(dtypes, x, y, target="c")(x, y)
    assert [g.dtype for g in got] == ["float32", "float64", "float64"]
    np.testing.assert_array_equal(got[1].to_numpy(), np.ones((2, 2, 3)))


def test_numpy_ufuncs_and_function_forms_record_the_same_masks():
    x = np.random.default_rng(4).standard_normal((3, 2, 4)).astype(np.float32)
    xs = ft.FractalTensor.from_numpy(x, 1)

    def f(xs):
        return xs.map(lambda t: np.greater(t, 0.1) + ft.logical_and(t > -1, np.less_equal(t, 1)) * 2.0
                      + ft.logical_not(ft.logical_or(t > 1, t < -1)) * 4.0 + ft.logical_xor(t > 0, t > 1) * 8.0)
    want = (x > 0.1) + ((x > -1) & (x <= 1)) * 2.0 + ~((x > 1) | (x < -1)) * 4.0 + ((x > 0) ^ (x > 1)) * 8.0
    np.testing.assert_array_equal(ft.compile(f, xs, target="c")(xs).to_numpy(), want.astype(np.float32))
    np.testing.assert_array_equal(f(xs).to_numpy(), want)


def test_bitwise_operators_on_integer_values_are_refused_with_the_logical_functions_named():
    ids = ft.FractalTensor.from_numpy(np.arange(6, dtype=np.int32).reshape(3, 2), 1)
    with pytest.raises(DTypeError, match=r"ft\.logical_not"):
        ft.compile(lambda xs: xs.map(lambda i: ~i), ids, target="c")
    # a comparison with something that is no number is Python's identity comparison, not an operation
    ft.trace(lambda xs: xs.map(lambda t: t * 2.0 if t != None else t), ft.spec("[N]float32[2]"))  # noqa: E711


def test_no_gradient_flows_through_a_mask():
    x = np.random.default_rng(5).standard_normal((3, 1, 5))
    xs = ft.FractalTensor.from_numpy(x, 1)
    g = ft.vjp(lambda xs: xs.map(lambda t: ft.where(t > 0, t, t ** 2) * (t < 1)), xs)[1](
        ft.FractalTensor.from_numpy(np.ones((3, 1, 5)), 1))[0].to_numpy()
    want = np.where(x > 0, 1.0, 2 * x) * (x < 1)
    assert rel_error(g, want) < 1e-12
