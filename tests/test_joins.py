"""Lists joined along their outer dim (`xs.join(ys)`), dilated centred windows
(`shifted_slide(k, dilation=d)`) and windows over zipped lists unpacked into their lists
(`wk, wv = win`, as FractalTensor's): eager against numpy, C and cuda-emulated against eager."""
import numpy as np
import pytest
from helpers import assert_same, flist
from hypothesis import given, settings, strategies as st

import polyft as ft
from polyft.errors import AccessError, DepthError, LengthMismatchError, ShapeError, WindowError

pytestmark = pytest.mark.usefixtures("compile_cache")
TARGETS = ["c", "cuda-emulated"]


def joined_scan(a, b):
    """start.join(middle).join(end) as FractalTensor's examples write it, scanned, then joined again."""
    ab = a[:1].join(b).join(a[1:])
    hs = ab.map(lambda xs: xs.scanl(lambda s, x: ft.tanh(s + x), ft.zeros((1, 3))))
    return hs.join(b.reverse())


@pytest.mark.parametrize("target", TARGETS)
def test_join_equals_numpys_concatenation_compiled(target):
    a, b = flist((3, 4), (1, 3), 0), flist((2, 4), (1, 3), 1)
    A, B = a.to_numpy(), b.to_numpy()
    ab = np.concatenate([A[:1], B, A[1:]])
    hs, s = np.zeros_like(ab), np.zeros((5, 1, 3), np.float32)
    for j in range(4):
        s = np.tanh(s + ab[:, j])
        hs[:, j] = s
    want = np.concatenate([hs, B[::-1]])
    np.testing.assert_allclose(joined_scan(a, b).to_numpy(), want, rtol=1e-6)
    prog = ft.compile(joined_scan, flist((3, 4), (1, 3), 2), flist((2, 4), (1, 3), 3), target=target)
    assert_same(prog(a, b), joined_scan(a, b))


def test_join_over_symbolic_lengths_is_one_access_map_per_part():
    prog = ft.analyze(lambda a, b: a.join(b).map(lambda x: x * 2.0), ft.spec("[N]float32[2]"), ft.spec("[M]float32[2]"))
    reads = str(prog.model.reads)
    assert "a[i" in reads and "b[-N + i" in reads and "i < N" in reads and "i >= N" in reads
    compiled = ft.compile(lambda a, b: a.join(b).map(lambda x: x * 2.0), ft.spec("[N]float32[2]"),
                          ft.spec("[M]float32[2]"), target="c")
    a, b = flist((3,), (2,), 4), flist((5,), (2,), 5)
    np.testing.assert_array_equal(compiled(a, b).to_numpy(), np.concatenate([a.to_numpy(), b.to_numpy()]) * 2)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2 ** 16))
def test_join_is_concatenation_for_any_lengths(n, m, inner, seed):
    a, b = flist((n, inner), (2,), seed), flist((m, inner), (2,), seed + 1)
    want = np.concatenate([a.to_numpy(), b.to_numpy()])[:, ::-1]
    got = a.join(b).map(lambda xs: xs.reverse())
    assert got.type_string == f"[{n + m}, {inner}]float32[2]"
    np.testing.assert_array_equal(got.to_numpy(), want)
    prog = ft.compile(lambda a, b: a.join(b).map(lambda xs: xs.reverse()), a, b, target="c")
    np.testing.assert_array_equal(prog(a, b).to_numpy(), want)
    np.testing.assert_array_equal(a[:0].join(b).to_numpy(), b.to_numpy())
    np.testing.assert_array_equal(a.join(b[n + m:]).to_numpy(), a.to_numpy())


def test_join_of_zips_joins_each_list():
    a, b, c, d = (flist((n,), (2,), seed) for seed, n in enumerate((2, 3, 2, 3)))
    z = ft.zip(a, c).join(ft.zip(b, d))
    out = z.map(lambda xy: xy[0] * xy[1])
    np.testing.assert_array_equal(out.to_numpy(), np.concatenate([a.to_numpy() * c.to_numpy(),
                                                                  b.to_numpy() * d.to_numpy()]))
    prog = ft.compile(lambda a, b, c, d: ft.zip(a, c).join(ft.zip(b, d)).map(lambda xy: xy[0] * xy[1]), a, b, c, d)
    assert_same(prog(a, b, c, d), out)


@pytest.mark.parametrize("other, error, text", [
    (flist((2,), (3,), 1), ShapeError, r"\[2\]float32\[3\]"),
    (flist((2, 2), (2,), 1), ShapeError, r"\[2, 2\]float32\[2\]"),
    (np.ones(2, np.float32), DepthError, "joins two lists"),
])
def test_join_of_unlike_lists_names_both(other, error, text):
    a = flist((3,), (2,), 0)
    with pytest.raises(error, match=text):
        a.join(other)
    with pytest.raises(error, match=text):
        ft.trace(lambda a: a.join(other), a)


def test_traced_join_needs_equal_inner_lengths_and_traced_parts():
    with pytest.raises(LengthMismatchError, match="inner lengths"):
        ft.trace(lambda a, b: a.join(b), ft.spec("[N, 3]float32[2]"), ft.spec("[M, 4]float32[2]"))
    with pytest.raises(AccessError, match="pass the other list as an input"):
        ft.trace(lambda a: a.join(flist((2,), (2,), 1)), flist((2,), (2,), 0))


# -- dilated centred windows -------------------------------------------------------------------------
def dilated(xs):
    return xs.shifted_slide(3, dilation=2).map(lambda win: ft.concat(tuple(win), axis=0))


@pytest.mark.parametrize("target", TARGETS)
def test_shifted_slide_with_a_dilation(target):
    xs = flist((7,), (1, 2), 5)
    x = xs.to_numpy()
    pad = np.concatenate([np.zeros((2, 1, 2), np.float32), x, np.zeros((2, 1, 2), np.float32)])
    want = np.stack([np.concatenate([pad[i], pad[i + 2], pad[i + 4]]) for i in range(7)])
    np.testing.assert_array_equal(dilated(xs).to_numpy(), want)
    np.testing.assert_array_equal(ft.compile(dilated, xs, target=target)(xs).to_numpy(), want)
    with pytest.raises(WindowError, match="dilation"):
        xs.shifted_slide(3, dilation=0)


# -- windows over zipped lists ------------------------------------------------------------------------
def windowed_attention(ks, vs):
    """Each position attends to a window of 3 keys and values, unpacked into their lists."""
    def at(win):
        wk, wv = win  # the keys' window and the values' window
        k, v = ft.concat(tuple(wk), axis=0), ft.concat(tuple(wv), axis=0)   # [3, D]
        p = ft.softmax(ft.sum(k * k[1:2], axis=1, keepdims=True), axis=0)
        return ft.sum(p * v, axis=0, keepdims=True)
    return ft.zip(ks, vs).window(3, padding=1).map(at)


@pytest.mark.parametrize("target", TARGETS)
def test_a_window_over_zipped_lists_unpacks_into_its_lists(target):
    ks, vs = flist((6,), (1, 4), 6), flist((6,), (1, 4), 7)
    K = np.concatenate([np.zeros((1, 4)), ks.to_numpy()[:, 0], np.zeros((1, 4))])
    V = np.concatenate([np.zeros((1, 4)), vs.to_numpy()[:, 0], np.zeros((1, 4))])
    want = []
    for i in range(6):
        k, v = K[i:i + 3], V[i:i + 3]
        s = (k * k[1]).sum(1)
        p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        want.append((p[:, None] * v).sum(0, keepdims=True))
    np.testing.assert_allclose(windowed_attention(ks, vs).to_numpy(), np.stack(want), rtol=1e-5, atol=1e-6)
    prog = ft.compile(windowed_attention, ks, vs, target=target)
    assert_same(prog(ks, vs), windowed_attention(ks, vs))


def test_a_window_of_a_zip_still_indexes_its_pairs_and_a_zip_iterates_its_tuples():
    ks, vs = flist((4,), (2,), 8), flist((4,), (2,), 9)
    win = ft.zip(ks, vs).window(2)[1]
    k1, v1 = win[0]
    assert k1 is ks[1] and v1 is vs[1]
    assert [t[0] is ks[i] for i, t in enumerate(ft.zip(ks, vs))] == [True] * 4


def test_the_gradient_of_a_join_splits_the_cotangent():
    rng = np.random.default_rng(10)
    x, y = rng.standard_normal((2, 1, 3)), rng.standard_normal((3, 1, 3))
    w = rng.standard_normal((3, 3))

    def f(xs, ys):
        joined = xs.join(ys).join(xs[:1])
        return joined.scanl(lambda s, v: ft.tanh(s @ w + v), np.zeros((1, 3)))

    def loss(x, y):
        return float(f(ft.FractalTensor.from_numpy(x, 1), ft.FractalTensor.from_numpy(y, 1)).to_numpy().sum())
    xs, ys = ft.FractalTensor.from_numpy(x, 1), ft.FractalTensor.from_numpy(y, 1)
    out, pullback = ft.vjp(f, xs, ys)
    ones = ft.FractalTensor.from_numpy(np.ones((6, 1, 3)), 1)
    gx, gy = (g.to_numpy() for g in pullback(ones))
    eps = 1e-6
    for arr, g, k in ((x, gx, 0), (y, gy, 1)):
        fd = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            up, down = arr.copy(), arr.copy()
            up[idx] += eps
            down[idx] -= eps
            args_up, args_down = ([up, y] if k == 0 else [x, up]), ([down, y] if k == 0 else [x, down])
            fd[idx] = (loss(*args_up) - loss(*args_down)) / (2 * eps)
        assert np.abs(g - fd).max() < 1e-6 * max(1.0, np.abs(fd).max())
    compiled = ft.compile(pullback, ones, target="c")
    np.testing.assert_allclose(compiled(ones)[0].to_numpy(), gx, rtol=1e-6)
