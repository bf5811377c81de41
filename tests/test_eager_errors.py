"""Every user error of the eager path: its class, the operator, the shapes/types, and the user's line."""
import numpy as np
import pytest

import polyft as ft
from polyft.errors import (DepthError, EmptyReduceError, IndexRangeError, LengthMismatchError, PolyftError,
                           RaggedError, ReturnTypeError, ShapeError, StateTypeError, WindowError)


def fresh(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def as_list(arr, depth=1):
    return ft.FractalTensor.from_numpy(arr, depth)


def test_numpy_shape_mismatch_inside_f_names_the_shapes_and_the_user_line():
    bias = fresh((3,), 1)

    def f(x):
        return x + bias  # the failing user line

    with pytest.raises(ShapeError) as info:
        ft.map(f, as_list(fresh((4, 1, 5))))
    err = info.value
    assert err.op == "add" and isinstance(err, PolyftError)  # the operation that failed, as when traced
    assert "add of float32[1, 5] and float32[3]" in str(err) and "(1,5)" in str(err) and "(3,)" in str(err)
    assert "test_eager_errors.py" in err.where and "return x + bias  # the failing user line" in err.where


def test_element_math_shape_mismatch_inside_a_nested_operator():
    w = fresh((5, 2), 2)

    def step(s, x):
        return ft.matmul(x, w) + s  # matmul of [1, 4] by [5, 2]

    with pytest.raises(ShapeError) as info:
        ft.map(lambda xs: ft.scanl(step, xs, ft.zeros((1, 2))), as_list(fresh((2, 3, 1, 4)), 2))
    assert info.value.op == "matmul" and "[1, 4] @ [5, 2]" in str(info.value)
    assert "ft.matmul(x, w) + s" in info.value.where


def test_a_tensor_where_a_list_is_expected_is_a_depth_error():
    with pytest.raises(DepthError, match=r"float32\[4, 3\] \(depth 0\)"):
        ft.map(np.tanh, fresh((4, 3)))


def test_strided_merge_needs_depth_2_and_from_numpy_at_most_ndim():
    with pytest.raises(DepthError, match="depth >= 2"):
        as_list(fresh((4, 3))).strided_merge()
    with pytest.raises(DepthError, match=r"\[4, 3\]"):
        ft.FractalTensor.from_numpy(fresh((4, 3)), depth=3)


def test_element_math_on_a_list_is_a_depth_error():
    with pytest.raises(DepthError, match="ft.map"):
        ft.tanh(as_list(fresh((4, 3))))


def test_zip_and_map_over_unequal_lengths():
    xs, ys = as_list(fresh((4, 3), 3)), as_list(fresh((5, 3), 4))
    with pytest.raises(LengthMismatchError, match="length 4.*length 5") as info:
        ft.zip(xs, ys)
    assert info.value.op == "zip" and "ft.zip(xs, ys)" in info.value.where
    with pytest.raises(LengthMismatchError) as info:
        ft.map(lambda x, y: x + y, xs, ys)
    assert info.value.op == "map"


def test_init_and_state_of_different_types():
    xs = as_list(fresh((4, 1, 3), 5))
    with pytest.raises(StateTypeError, match=r"float32\[1, 3\].*float32\[3\]") as info:
        ft.scanl(lambda s, x: (s + x)[0], xs, fresh((1, 3), 6))
    assert info.value.op == "scanl"
    with pytest.raises(StateTypeError, match=r"float64"):
        ft.foldl(lambda s, x: s + x.astype(np.float64), xs, fresh((1, 3), 7))
    with pytest.raises(StateTypeError, match=r"\(float32\[1, 3\], float32\[1, 3\]\)"):
        ft.foldr(lambda x, s: s[0] + x, xs, (fresh((1, 3), 8), fresh((1, 3), 9)))


def test_a_python_number_init_is_rejected_with_a_hint():
    with pytest.raises(StateTypeError, match="ft.zeros"):
        ft.scanl(lambda s, x: s + x, as_list(fresh((4, 3))), 0.0)


@pytest.mark.parametrize("op", [ft.reduce, ft.foldl, ft.foldr])
def test_reduce_of_an_empty_list_without_init(op):
    with pytest.raises(EmptyReduceError, match="init"):
        op(lambda a, b: a + b, as_list(fresh((0, 3))))


def test_window_larger_than_the_list():
    xs = as_list(fresh((3, 2)))
    with pytest.raises(WindowError, match="size 5"):
        xs.window(5)
    with pytest.raises(WindowError, match="size 6.*padded by \\(1, 1\\)"):
        xs.window(6, padding=1)
    with pytest.raises(WindowError, match="odd"):
        xs.shifted_slide(2)
    with pytest.raises(WindowError, match="stride of 2"):
        xs.strided_split(2)


def test_out_of_range_gather_index_and_element_index():
    xs = as_list(fresh((3, 2)))
    with pytest.raises(IndexRangeError, match=r"index 3 is outside \[0, 3\)"):
        xs.gather([0, 3, 1])
    with pytest.raises(IndexRangeError, match=r"index -1"):
        xs.gather(np.array([-1]))
    with pytest.raises(IndexRangeError, match="index -4"):
        xs[-4]


@pytest.mark.parametrize("bad", [None, 1.5, [1, 2], "text"])
def test_a_user_function_returning_a_non_tensor(bad):
    with pytest.raises(ReturnTypeError, match="must return a tensor") as info:
        ft.map(lambda x: bad, as_list(fresh((3, 2))))
    assert info.value.op == "map"
    with pytest.raises(ReturnTypeError):
        ft.scanl(lambda s, x: bad, as_list(fresh((3, 2))))


def test_map_results_of_different_types():
    a = fresh((3, 2))
    ragged = ft.FractalTensor.from_list([[a[0]], [a[1], a[2]]])
    with pytest.raises(ReturnTypeError, match=r"float32\[1, 2\] for element 0 but float32\[2, 2\] for element 1"):
        ft.map(lambda xs: xs.to_numpy(), ragged)


def test_ragged_to_numpy():
    a = fresh((3, 2))
    with pytest.raises(RaggedError, match=r"\[2, \*\]"):
        ft.FractalTensor.from_list([[a[0]], [a[1], a[2]]]).to_numpy()


# -- eager errors as clear as traced ones ---------------------------------------------------------

def test_a_float64_weight_in_an_eager_scan_is_named_with_its_line_and_fix():
    xs = as_list(fresh((5, 1, 8), 11))
    w_double = np.random.default_rng(12).standard_normal((8, 8))  # numpy's default: float64

    def step(s, x):
        return ft.tanh(x @ w_double + s)  # the promoting line

    with pytest.raises(StateTypeError) as info:
        xs.scanl(step, ft.zeros((1, 8)))
    message = str(info.value)
    assert "the state has type float32[1, 8] but the function returned float64[1, 8]" in message
    assert "matmul of float32[1, 8] and w_double float64[8, 8] gives float64" in message
    assert "(use w_double.astype(np.float32))" in message
    assert "return ft.tanh(x @ w_double + s)  # the promoting line" in message
    assert info.value.op == "scanl" and "xs.scanl(step, ft.zeros((1, 8)))" in info.value.where


W_GLOBAL = np.random.default_rng(13).standard_normal((4, 4))  # float64, read as a global


def test_a_float64_global_read_by_a_nested_lambda_is_named_too():
    xss = as_list(fresh((2, 3, 1, 4), 14), 2)
    with pytest.raises(StateTypeError, match=r"matmul of float32\[1, 4\] and W_GLOBAL float64\[4, 4\]") as info:
        xss.map(lambda xs: xs.foldl(lambda s, x: s + x @ W_GLOBAL, ft.zeros((1, 4))))
    assert info.value.op == "foldl" and "W_GLOBAL.astype(np.float32)" in str(info.value)


def _traced_and_eager(fn, *inputs):
    errors = []
    for run in (lambda: ft.trace(fn, *inputs), lambda: fn(*inputs)):
        with pytest.raises(ShapeError) as info:
            run()
        errors.append(info.value)
    return errors


def test_an_eager_matmul_shape_error_is_the_traced_one():
    w = fresh((4, 4), 15)

    def rnn(xs):
        return xs.scanl(lambda s, x: x @ w + s, ft.zeros((1, 8)))

    traced, eager = _traced_and_eager(rnn, as_list(fresh((5, 1, 8), 16)))
    assert str(eager) == str(traced) and eager.op == traced.op == "matmul"
    assert "[1, 8] @ [4, 4]" in str(eager) and "x @ w + s" in eager.where


def test_an_eager_shape_error_over_zipped_elements_is_the_traced_one():
    def pairs(xs, ys):
        return ft.map(lambda xy: xy[0] @ xy[1], ft.zip(xs, ys))

    traced, eager = _traced_and_eager(pairs, as_list(fresh((3, 2, 5), 17)), as_list(fresh((3, 4, 2), 18)))
    assert str(eager) == str(traced) and "[2, 5] @ [4, 2]" in str(eager) and "xy[0] @ xy[1]" in eager.where


@pytest.mark.parametrize("call", [
    lambda arr: ft.map(lambda x: x, arr),
    lambda arr: ft.scanl(lambda s, x: s + x, arr, ft.zeros((1, 8))),
    lambda arr: ft.reduce(lambda s, x: s + x, arr),
    lambda arr: ft.zip(arr, arr),
], ids=["map", "scanl", "reduce", "zip"])
def test_a_numpy_array_where_a_list_is_needed_suggests_from_numpy(call):
    arr = fresh((5, 1, 8), 19)
    with pytest.raises(DepthError) as info:
        call(arr)
    message = str(info.value)
    assert isinstance(info.value, PolyftError) and "float32[5, 1, 8]" in message
    assert "ft.FractalTensor.from_numpy(arr, depth=...): depth=1 gives [5]float32[1, 8], depth=2 gives " \
           "[5, 1]float32[8]" in message
    assert "test_eager_errors.py" in info.value.where
