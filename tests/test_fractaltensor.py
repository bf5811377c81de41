"""The eager FractalTensor: construction, inspection, type strings, and Zip."""
import numpy as np
import pytest

import polyft as ft
from polyft.errors import DepthError, DTypeError, RaggedError, ShapeError
from polyft.fractaltensor import is_traced
from polyft.types import parse_type


def rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_from_numpy_depth_2_describes_the_array_and_views_it():
    arr = rand((3, 5, 1, 4))
    xss = ft.FractalTensor.from_numpy(arr, depth=2)
    assert (len(xss), xss.depth, xss.element_shape, xss.dtype) == (3, 2, (1, 4), "float32")
    assert isinstance(xss[1], ft.FractalTensor) and xss[1].depth == 1 and len(xss[1]) == 5
    elem = xss[2][4]
    assert isinstance(elem, np.ndarray) and elem.shape == (1, 4)
    np.testing.assert_array_equal(elem, arr[2, 4])
    assert np.shares_memory(elem, arr)
    np.testing.assert_array_equal(xss.to_numpy(), arr)


def test_a_list_viewing_an_array_hands_it_back_without_a_copy():
    """from_numpy and a compiled program's outputs keep the array they view: dense_view() is
    that array (read-only), to_numpy() a writable copy, and the items equal its slices."""
    arr = rand((4, 3, 2, 5), seed=3)
    xss = ft.FractalTensor.from_numpy(arr, depth=2)
    view = xss.dense_view()
    assert np.shares_memory(view, arr) and not view.flags.writeable and view.shape == arr.shape
    copy = xss.to_numpy()
    assert copy.flags.writeable and not np.shares_memory(copy, arr)
    np.testing.assert_array_equal(copy, arr)
    assert xss.type_string == "[4, 3]float32[2, 5]" and xss.is_regular
    np.testing.assert_array_equal(np.stack([np.stack(list(xs)) for xs in xss]), arr)
    listed = ft.FractalTensor.from_list([[arr[i, j] for j in range(3)] for i in range(4)])
    assert not np.shares_memory(listed.dense_view(), arr)  # a list of separate arrays: a copy
    np.testing.assert_array_equal(listed.dense_view(), arr)
    prog = ft.compile(lambda xss: xss.map(lambda xs: xs.map(lambda x: x * 2.0)), xss)
    out = prog(xss)
    np.testing.assert_array_equal(out.to_numpy(), 2.0 * arr)
    assert not out.dense_view().flags.writeable and np.shares_memory(out.dense_view(), out[3][2])


def test_a_list_viewing_an_array_with_an_empty_level_reads_like_a_built_one():
    """Below an empty level there are no lists, so no lengths: [0, 3] reads [0, 0], as built."""
    viewed = ft.FractalTensor.from_numpy(rand((0, 3, 2), seed=4), depth=2)
    built = ft.FractalTensor([], 2, (2,), "float32")
    assert viewed.type_string == built.type_string == "[0, 0]float32[2]"
    assert viewed.to_numpy().shape == viewed.dense_view().shape == built.to_numpy().shape == (0, 0, 2)


def test_from_numpy_of_a_vector_has_0d_elements_that_are_views():
    arr = rand(6, seed=1)
    xs = ft.FractalTensor.from_numpy(arr, 1)
    assert xs.element_shape == () and xs[3].shape == ()
    assert np.shares_memory(xs[3], arr) and xs[3] == arr[3]


def test_type_string_repr_and_ftype():
    xss = ft.FractalTensor.from_numpy(rand((3, 5, 1, 4), dtype=np.float64), 2)
    assert xss.type_string == repr(xss) == "[3, 5]float64[1, 4]"
    assert xss.ftype == parse_type("[3, 5]float64[1, 4]")
    assert xss.is_regular


def test_from_list_regular_equals_from_numpy():
    arr = rand((2, 3, 4), seed=2)
    xss = ft.FractalTensor.from_list([[arr[i, j] for j in range(3)] for i in range(2)])
    assert xss.type_string == "[2, 3]float32[4]"
    np.testing.assert_array_equal(xss.to_numpy(), arr)
    assert np.shares_memory(xss[1][2], arr)


def test_ragged_lists_print_a_star_and_cannot_be_dense():
    arr = rand((3, 2), seed=3)
    xss = ft.FractalTensor.from_list([[arr[0], arr[1]], [arr[2]]])
    assert not xss.is_regular
    assert xss.type_string == "[2, *]float32[2]"
    assert [len(xs) for xs in xss] == [2, 1]
    with pytest.raises(RaggedError):
        xss.to_numpy()
    with pytest.raises(RaggedError):
        xss.ftype


def test_from_list_of_fractaltensors_adds_a_level():
    arr = rand((2, 3, 4), seed=4)
    rows = [ft.FractalTensor.from_numpy(arr[i], 1) for i in range(2)]
    xss = ft.FractalTensor.from_list(rows)
    assert xss.depth == 2 and xss[1] is rows[1]
    np.testing.assert_array_equal(xss.to_numpy(), arr)


def test_from_list_empty_lists_need_element_shape():
    xs = ft.FractalTensor.from_list([], element_shape=(1, 4))
    assert xs.type_string == "[0]float32[1, 4]" and xs.to_numpy().shape == (0, 1, 4)
    yss = ft.FractalTensor.from_list([[], []], element_shape=(2,), dtype="float64")
    assert yss.type_string == "[2, 0]float64[2]"
    with pytest.raises(ShapeError, match="element_shape"):
        ft.FractalTensor.from_list([[]])


def test_from_list_adopts_sibling_depth_for_empty_lists():
    arr = rand((2, 3), seed=5)
    xss = ft.FractalTensor.from_list([[], [arr[0], arr[1]]])
    assert xss.type_string == "[2, *]float32[3]" and len(xss[0]) == 0


def test_from_list_dtype_casts_tensor_leaves():
    arr = rand((2, 3), seed=6, dtype=np.float64)
    xs = ft.FractalTensor.from_list([arr[0], arr[1]], dtype="float32")
    assert xs.dtype == "float32" and xs[0].dtype == np.float32
    np.testing.assert_allclose(xs.to_numpy(), arr.astype(np.float32))


def test_from_list_rejects_inconsistent_elements():
    a, b = rand(3, seed=7), rand(4, seed=8)
    with pytest.raises(ShapeError, match=r"\[3\].*\[4\]"):
        ft.FractalTensor.from_list([a, b])
    with pytest.raises(DTypeError):
        ft.FractalTensor.from_list([a, a.astype(np.float64)])
    with pytest.raises(DepthError):
        ft.FractalTensor.from_list([[a], a])


def test_unsupported_dtypes_are_rejected():
    with pytest.raises(DTypeError, match="bool"):
        ft.FractalTensor.from_numpy(np.ones((2, 3), dtype=bool), 1)


def test_zeros_is_a_read_only_regular_list():
    zs = ft.FractalTensor.zeros((2, 3), (4,), "float64")
    assert zs.type_string == "[2, 3]float64[4]" and not np.any(zs.to_numpy())
    assert not zs[0][0].flags.writeable


def test_iteration_yields_the_items_themselves():
    arr = rand((4, 2), seed=9)
    xs = ft.FractalTensor.from_numpy(arr, 1)
    assert all(x is xs[i] for i, x in enumerate(xs))


def test_zip_elements_are_tuples_of_the_components_items():
    a, b = rand((4, 2), seed=10), rand((4, 3, 3), seed=11)
    xs, yss = ft.FractalTensor.from_numpy(a, 1), ft.FractalTensor.from_numpy(b, 2)
    z = ft.zip(xs, yss)
    assert len(z) == 4 and z.depth == 1 and not z._traced and not is_traced(z)
    x, ys = z[2]
    assert x is xs[2] and ys is yss[2]
    assert [t[0] is xs[i] for i, t in enumerate(z)] == [True] * 4
    assert repr(z) == "zip([4]float32[2], [4, 3]float32[3])"


def test_zip_of_zips_nests_tuples():
    arr = rand((3, 2), seed=12)
    xs = ft.FractalTensor.from_numpy(arr, 1)
    (a, b), c = ft.zip(ft.zip(xs, xs), xs.reverse())[0]
    assert a is xs[0] and b is xs[0] and c is xs[2]


def test_zip_rejects_non_lists():
    with pytest.raises(DepthError):
        ft.zip(ft.FractalTensor.from_numpy(rand((3, 2)), 1), rand((3, 2)))


def test_plain_values_are_not_traced():
    assert not any(is_traced(v) for v in (rand(3), 1.0, None, ft.FractalTensor.from_numpy(rand((2, 2)), 1)))
