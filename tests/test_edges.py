"""Compiled equals eager at the numerical edges (emit.c_statements pow_c, ft_sigmoid, ft_fma;
runtime_c's -ffp-contract):

* integer powers in integer arithmetic, wrapping around as numpy's (not through a double:
  INT_MIN for an int32 overflow, the low bits of an int64 past 2**53 lost);
* `x ** 0.5` as numpy's (its sqrt: -0.0 -> -0.0, -inf -> NaN), also of a matmul's signed zeros;
* sigmoid's tails: log(sigmoid(x)) at -20 (float32) and -40 (float64) is x on both paths;
* no contraction of an elementwise multiply and add (x * 2 - x at 3e38 is inf, as numpy's),
  unless $POLYFT_FP_CONTRACT=fast asks for it.
"""
from __future__ import annotations

import numpy as np
import pytest

import polyft as ft
from polyft.emit import runtime_c
from polyft.errors import SettingError

pytestmark = pytest.mark.usefixtures("compile_cache")
TARGETS = ["c", "cuda-emulated"]


def both(fn, *arrays, target="c"):
    """(compiled, eager) results of fn over lists of the arrays' rows, as numpy arrays."""
    xs = [ft.FractalTensor.from_numpy(np.asarray(a), 1) for a in arrays]
    prog = ft.compile(fn, *xs, target=target)
    with np.errstate(all="ignore"):
        return prog(*xs).to_numpy(), fn(*xs).to_numpy()


def same_bits(got, want):
    """Equal values, NaN where NaN, and the same sign of every zero."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want)), (got, want)


INTS = {
    "int32 x ** 2": (lambda xs: xs.map(lambda x: x ** 2), np.int32, [70000, -3, 46341, -46341, 2**31 - 1, -2**31]),
    "int32 x ** 3": (lambda xs: xs.map(lambda x: x ** 3), np.int32, [1291, -1291, 2000, 7, 0, -1]),
    "int32 ft.pow(x, 2)": (lambda xs: xs.map(lambda x: ft.pow(x, 2)), np.int32, [70000, 2**31 - 1, -5, 0, 1, 3]),
    "int64 x ** 3 past 2**53": (lambda xs: xs.map(lambda x: x ** 3), np.int64,
                                [2**21 + 1, 2**20 + 3, -(2**21) - 5, 3, 2**40 + 1, -7]),
    "int64 x ** 5": (lambda xs: xs.map(lambda x: x ** 5), np.int64, [2**13 + 1, 1000003, -999, 2, 0, -1]),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(INTS))
def test_integer_powers_wrap_as_numpys(case, target):
    fn, dtype, values = INTS[case]
    got, want = both(fn, np.array(values, dtype).reshape(-1, 1), target=target)
    same_bits(got, want)


def test_integer_power_by_an_integer_list():
    def fn(xs, ps):
        return ft.map(lambda x, p: x ** p, xs, ps)
    xs = np.array([3, -2, 70000, 5, 1, -1], np.int32).reshape(-1, 1)
    ps = np.array([13, 31, 2, 0, 9, 7], np.int32).reshape(-1, 1)
    got, want = both(fn, xs, ps)
    same_bits(got, want)


EDGES = [-0.0, 0.0, -np.inf, np.inf, np.nan, 4.0, -4.0, 1e-45]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_square_root_by_power_as_numpys(dtype, target):
    got, want = both(lambda xs: xs.map(lambda x: x ** 0.5), np.array(EDGES, dtype).reshape(-1, 1), target=target)
    same_bits(got, want)
    assert np.signbit(want[0]) and np.isnan(want[2])  # numpy's own: sqrt(-0.0), sqrt(-inf)


def test_other_powers_are_pow():
    for p in (1.5, 2.0, -0.5, 3, -1):
        got, want = both(lambda xs, p=p: xs.map(lambda x: x ** p), np.array(EDGES, np.float32).reshape(-1, 1))
        same_bits(got, want)


def test_power_of_a_matmuls_signed_zeros():
    x = -np.abs(np.zeros((3, 4, 5), np.float32))
    x[:, :, 1:] = 1.0
    x[1] = -0.0
    x[2, :, 0] = -1.0
    got, want = both(lambda xs: xs.map(lambda m: (m.T @ (-m)) ** 0.5), x)
    same_bits(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype, xs", [(np.float32, [-20.0, -40.0, -88.0, -95.0, -103.0, 0.0, 30.0, -np.inf]),
                                       (np.float64, [-40.0, -700.0, -745.0, 0.0, 40.0])])
def test_log_sigmoid_tails(dtype, xs, target):
    fn = lambda v: v.map(lambda x: ft.log(ft.sigmoid(x)))  # noqa: E731
    got, want = both(fn, np.array(xs, dtype).reshape(-1, 1), target=target)
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps)
    x64 = np.array(xs, np.float64)
    exact = -np.logaddexp(0, -x64)  # log(sigmoid(x)) = -log(1 + e^-x)
    normal = np.isfinite(x64) & (np.exp(x64) >= np.finfo(dtype).tiny)  # e^x not subnormal
    np.testing.assert_allclose(want.ravel()[normal], exact[normal], rtol=1e-5, atol=1e-6)
    assert want.ravel()[0] == pytest.approx(xs[0], rel=1e-6)  # not -inf: the tail is there


def test_no_contraction_of_elementwise_multiply_and_add():
    x = np.array([3e38, 1.0, -3e38, 1e-30], np.float32).reshape(-1, 1)
    got, want = both(lambda xs: xs.map(lambda v: v * 2 - v), x)
    same_bits(got, want)
    assert np.isinf(want[0, 0])


def test_fast_contraction_is_opt_in(monkeypatch):
    assert "-ffp-contract=off" in runtime_c.compile_flags()
    monkeypatch.setenv("POLYFT_FP_CONTRACT", "fast")
    assert "-ffp-contract=fast" in runtime_c.compile_flags()
    x = np.array([3e38, 1.0], np.float32).reshape(-1, 1)
    got, _ = both(lambda xs: xs.map(lambda v: v * 2 - v), x)
    assert got[1, 0] == 1.0  # built (its own cache entry) and right away from the edge
    monkeypatch.setenv("POLYFT_FP_CONTRACT", "fused")
    with pytest.raises(SettingError, match="POLYFT_FP_CONTRACT"):
        runtime_c.compile_flags()
