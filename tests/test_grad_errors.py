"""Differentiation's inputs checked in the user's terms (polyft.autodiff): a pullback's cotangent of
the wrong kind, shape, lengths or dtype, and an argnums that is not an input's position, are each a
DifferentiationError naming what was expected (they were errors about an internal scanr, or a raw
TypeError)."""
from __future__ import annotations

import numpy as np
import pytest

import polyft as ft
from polyft.autodiff import DifferentiationError
from polyft.errors import PolyftError


def f(xs, w):
    return xs.map(lambda x: ft.tanh(x @ w))


rng = np.random.default_rng(0)
XS = ft.FractalTensor.from_numpy(rng.standard_normal((3, 1, 4)).astype(np.float32), 1)
W = rng.standard_normal((4, 4)).astype(np.float32)


@pytest.mark.parametrize("ct, why", [
    (np.ones((3, 1, 5), np.float32), "element shape"),
    (np.ones((2, 1, 4), np.float32), "lengths"),
    (np.ones((3, 1, 4), np.int32), "dtype"),
    (np.ones((1, 4), np.float32), "an array for a list"),
    (1.0, "a Python float"),
])
def test_a_cotangent_of_another_type_is_a_differentiation_error(ct, why):
    _, pullback = ft.vjp(f, XS, W)
    with pytest.raises(DifferentiationError) as e:
        pullback(ct)
    msg = str(e.value)
    assert "cotangent of the output" in msg and "[3]float32[1, 4]" in msg and "scanr" not in msg, (why, msg)


def test_a_right_cotangent_still_works():
    out, pullback = ft.vjp(f, XS, W)
    gx, gw = pullback(np.ones((3, 1, 4), np.float32))
    assert gw.shape == (4, 4) and gx.type_string == "[3]float32[1, 4]"


def loss(xs, w):
    return ft.sum(ft.reduce(lambda a, x: a + x, f(xs, w)))


@pytest.mark.parametrize("argnums", ["1", 1.0, True, (), (0, "1"), None, [0.0]])
def test_argnums_that_is_not_a_position_is_a_differentiation_error(argnums):
    with pytest.raises(DifferentiationError) as e:
        ft.grad(loss, argnums=argnums)
    msg = str(e.value)
    assert "argnums" in msg and repr(argnums) in msg, msg


@pytest.mark.parametrize("argnums", [np.int64(1), 1, -1, [1]])
def test_argnums_as_numpy_ints_and_lists(argnums):
    g = ft.grad(loss, argnums=argnums)(XS, W)
    g = g[0] if isinstance(g, tuple) else g
    assert np.shape(g) == (4, 4)


def test_an_out_of_range_argnums_is_still_a_polyft_error():
    with pytest.raises(PolyftError, match="out of range"):
        ft.grad(loss, argnums=5)(XS, W)
