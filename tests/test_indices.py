"""Element indices as values: `ft.arange(n)` and `xs.enumerate()`, eager against numpy and compiled
(C, cuda-emulated) against eager: sinusoidal positions, a causal mask by position."""
import numpy as np
import pytest
from helpers import assert_same, flist

import polyft as ft
from polyft.errors import AccessError, DTypeError, TracerControlFlowError, WindowError

pytestmark = pytest.mark.usefixtures("compile_cache")
TARGETS = ["c", "cuda-emulated"]


def positions(xs):
    """x + the transformer's sinusoidal encoding of its position (D = 8)."""
    freq = np.exp(-np.log(10000.0) * np.arange(0, 8, 2) / 8).astype(np.float32)[None, :]   # [1, 4]

    def add(ix):
        i, x = ix
        angle = i * freq
        return x + ft.concat((ft.sin(angle), ft.cos(angle)), axis=1)
    return xs.enumerate().map(add)


@pytest.mark.parametrize("target", TARGETS)
def test_sinusoidal_positions(target):
    xs = flist((6,), (1, 8), 0)
    pos = np.arange(6, dtype=np.float64)[:, None] * np.exp(-np.log(10000.0) * np.arange(0, 8, 2) / 8)
    want = xs.to_numpy() + np.concatenate([np.sin(pos), np.cos(pos)], axis=1)[:, None, :]
    np.testing.assert_allclose(positions(xs).to_numpy(), want, rtol=1e-5, atol=1e-6)
    assert_same(ft.compile(positions, flist((6,), (1, 8), 1), target=target)(xs), positions(xs))


def causal_sums(xs):
    """Row i sums the elements j <= i of the list, by a mask of indices compared (i <= j)."""
    n = len(xs)
    return ft.arange(n).map(lambda i: ft.map(lambda j, y: y * (j <= i), ft.arange(n), xs).reduce(lambda a, b: a + b))


@pytest.mark.parametrize("target", TARGETS)
def test_a_mask_by_index(target):
    xs = flist((5,), (3,), 2)
    np.testing.assert_allclose(causal_sums(xs).to_numpy(), np.cumsum(xs.to_numpy(), axis=0), rtol=1e-5)
    assert_same(ft.compile(causal_sums, xs, target=target)(xs), causal_sums(xs))


def test_arange_values_and_errors():
    assert ft.arange(4).type_string == "[4]float32[]"
    np.testing.assert_array_equal(ft.arange(4, "int32").to_numpy(), np.arange(4, dtype=np.int32))
    ids = ft.arange(3, "int64")
    np.testing.assert_array_equal(flist((5,), (2,), 3).gather(ids).to_numpy(), flist((5,), (2,), 3).to_numpy()[:3])
    with pytest.raises(WindowError, match=">= 0"):
        ft.arange(-1)
    with pytest.raises(AccessError, match="must be an int"):
        ft.arange(2.5)
    with pytest.raises(DTypeError, match="bool"):
        ft.arange(2, "bool")
    with pytest.raises(TracerControlFlowError, match="enumerate.*symbolic|symbolic.*enumerate"):
        ft.trace(lambda xs: xs.enumerate().map(lambda ix: ix[1]), ft.spec("[N]float32[2]"))
