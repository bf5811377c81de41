"""Access operators: exact elements against index arithmetic written here, and no data copies."""
import numpy as np
from hypothesis import given, settings, strategies as st

import polyft as ft

FAST = settings(max_examples=60, deadline=None)


def source(length, seed, shape=(2, 3), depth=1):
    """A fresh random array and the FractalTensor viewing it."""
    arr = np.random.default_rng(seed).standard_normal((length,) * depth + shape).astype(np.float32)
    return arr, ft.FractalTensor.from_numpy(arr, depth)


def dense(v):
    return v.to_numpy() if isinstance(v, ft.FractalTensor) else v


def check_view(ys, arr, xs, tree):
    """ys mirrors tree: an int is a position of xs (the same object, a view of arr), None a zero pad."""
    if isinstance(tree, list):
        assert isinstance(ys, ft.FractalTensor) and len(ys) == len(tree)
        for y, t in zip(ys, tree):
            check_view(y, arr, xs, t)
    elif tree is None:
        assert dense(ys).shape == arr.shape[1:] and not np.any(dense(ys))
    else:
        assert ys is xs[tree]
        np.testing.assert_array_equal(dense(ys), arr[tree])
        assert all(np.shares_memory(e, arr) for e in (ys if isinstance(ys, ft.FractalTensor) else [ys]))


lengths = st.integers(0, 9)
seeds = st.integers(0, 2**32 - 1)


@FAST
@given(lengths, seeds, st.integers(-12, 12) | st.none(), st.integers(-12, 12) | st.none(),
       st.sampled_from([None, 1, 2, 3, -1, -2, -3]))
def test_slice_has_python_semantics(n, seed, start, stop, step):
    arr, xs = source(n, seed)
    check_view(xs[start:stop:step], arr, xs, list(range(n))[start:stop:step])


@FAST
@given(st.integers(1, 9), seeds, st.data())
def test_index_negative_ok(n, seed, data):
    arr, xs = source(n, seed)
    i = data.draw(st.integers(-n, n - 1))
    np.testing.assert_array_equal(xs[i], arr[i])
    assert np.shares_memory(xs[i], arr)


@FAST
@given(lengths, seeds, st.integers(-11, 11))
def test_shift_keeps_the_valid_positions(n, seed, k):
    arr, xs = source(n, seed)
    check_view(xs.shift(k), arr, xs, [i + k for i in range(n) if 0 <= i + k < n] if k >= 0
               else [i for i in range(n) if i - k < n])


@FAST
@given(lengths, seeds)
def test_reverse(n, seed):
    arr, xs = source(n, seed)
    check_view(xs.reverse(), arr, xs, [n - 1 - i for i in range(n)])


def window_tree(n, size, stride, left, right):
    count = (n + left + right - size) // stride + 1
    return [[p if 0 <= p < n else None for p in (w * stride + j - left for j in range(size))]
            for w in range(count)]


@FAST
@given(st.integers(1, 9), seeds, st.integers(1, 4), st.integers(1, 3), st.integers(0, 2), st.integers(0, 2))
def test_window_with_stride_and_padding(n, seed, size, stride, left, right):
    arr, xs = source(n, seed)
    if size > n + left + right or max(left, right) >= size:  # padding < size (window_args)
        return
    padding = left if left == right else (left, right)
    ys = xs.window(size, stride, padding)
    assert ys.depth == 2
    check_view(ys, arr, xs, window_tree(n, size, stride, left, right))


@FAST
@given(st.integers(1, 9), seeds, st.sampled_from([1, 3, 5]))
def test_shifted_slide_is_a_centred_window_of_the_same_length(n, seed, w):
    arr, xs = source(n, seed)
    if w > n + 2 * (w // 2):
        return
    ys = xs.shifted_slide(w)
    assert len(ys) == n
    check_view(ys, arr, xs, window_tree(n, w, 1, w // 2, w // 2))


def test_window_over_a_depth_2_list_pads_with_zero_sub_lists():
    arr, xss = source(4, 1, shape=(3,), depth=2)
    check_view(xss.window(2, 1, 1), arr, xss, window_tree(4, 2, 1, 1, 1))


@FAST
@given(st.integers(1, 9), seeds, st.data())
def test_gather(n, seed, data):
    arr, xs = source(n, seed)
    idx = data.draw(st.lists(st.integers(0, n - 1), max_size=12))
    check_view(xs.gather(idx), arr, xs, idx)
    check_view(xs.gather(np.array(idx, dtype=np.int64)), arr, xs, idx)


@FAST
@given(st.integers(1, 4), st.integers(0, 4), seeds)
def test_strided_split_and_merge(d, m, seed):
    arr, xs = source(d * m, seed)
    yss = xs.strided_split(d)
    check_view(yss, arr, xs, [[r + j * d for j in range(m)] for r in range(d)])
    check_view(yss.strided_merge(), arr, xs, list(range(d * m)))


def test_strided_merge_of_a_depth_2_input():
    arr = np.random.default_rng(3).standard_normal((3, 4, 2)).astype(np.float32)
    zs = ft.FractalTensor.from_numpy(arr, 2).strided_merge()
    assert len(zs) == 12
    for t in range(12):
        assert zs[t] is not arr and np.shares_memory(zs[t], arr)
        np.testing.assert_array_equal(zs[t], arr[t % 3, t // 3])


def test_access_operators_on_sub_lists_of_a_depth_2_list():
    arr, xss = source(5, 4, shape=(2,), depth=2)
    check_view(xss[1:4].reverse(), arr, xss, [3, 2, 1])
    check_view(xss.gather([4, 0]), arr, xss, [4, 0])
    ys = xss[2].shift(1)
    for i in range(4):
        assert ys[i] is xss[2][i + 1] and np.shares_memory(ys[i], arr)


def pairs(z):
    """A zip's elements as nested Python lists of tuples (by index: an element of a deeper zip
    iterates its lists, as `wk, wv = win` unpacks them)."""
    return [pairs(e) if isinstance(e, ft.Zip) else e for e in (z[i] for i in range(len(z)))]


@FAST
@given(st.integers(1, 8), seeds)
def test_access_on_a_zip_applies_to_every_component(n, seed):
    (a, xs), (b, ys) = source(n, seed), source(n, seed + 1)
    z = ft.zip(xs, ys)
    for op in (lambda l: l.reverse(), lambda l: l.shift(1), lambda l: l[::2], lambda l: l.gather([0, n - 1])):
        assert pairs(op(z)) == list(zip(op(xs), op(ys)))
    for op in (lambda l: l.window(1, 2), lambda l: l.shifted_slide(3), lambda l: l.strided_split(1)):
        zipped, first, second = pairs(op(z)), op(xs), op(ys)
        assert len(zipped) == len(first)
        for row, fs, ss in zip(zipped, first, second):
            assert len(row) == len(fs)
            for (x, y), f, s in zip(row, fs, ss):
                assert np.array_equal(x, f) and np.array_equal(y, s)


def test_strided_merge_of_a_zip():
    (a, xs), (b, ys) = source(6, 5), source(6, 6)
    z = ft.zip(xs, ys).strided_split(3).strided_merge()
    assert z.depth == 1 and all(z[i][0] is xs[i] and z[i][1] is ys[i] for i in range(6))


@FAST
@given(st.integers(0, 5), st.integers(0, 5), seeds)
def test_product_pairs_every_x_with_every_y(nx, ny, seed):
    (a, xs), (b, ys) = source(nx, seed), source(ny, seed + 1)
    p = ft.product(xs, ys)
    assert len(p) == nx and p.depth == 2
    for i in range(nx):
        row = p[i]
        assert len(row) == ny and row.depth == 1
        for j in range(ny):
            x, y = row[j]
            assert x is xs[i] and y is ys[j]
            assert np.shares_memory(x, a) and np.shares_memory(y, b)
