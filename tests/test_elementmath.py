"""Element math on numpy: values against numpy in float64, shape errors, and tracer dispatch."""
import numpy as np
import pytest

import polyft as ft
from polyft import tracing
from polyft.errors import DepthError, DTypeError, ShapeError
from polyft.testing import rel_error


def fresh(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


X = fresh((3, 4), 1)
X64 = X.astype(np.float64)


@pytest.mark.parametrize("fn, ref", [
    (ft.tanh, np.tanh(X64)), (ft.sigmoid, 1 / (1 + np.exp(-X64))), (ft.exp, np.exp(X64)),
    (ft.relu, np.where(X64 > 0, X64, 0)), (ft.transpose, X64.T), (ft.zeros_like, np.zeros_like(X64)),
])
def test_unary_functions(fn, ref):
    got = fn(X)
    assert got.dtype == np.float32 and got.shape == ref.shape and rel_error(got, ref) < 1e-5


def test_log_and_sqrt_of_positive_inputs():
    pos = np.abs(X) + 0.5
    assert rel_error(ft.log(pos), np.log(pos.astype(np.float64))) < 1e-5
    assert rel_error(ft.sqrt(pos), np.sqrt(pos.astype(np.float64))) < 1e-5


def test_sigmoid_does_not_overflow():
    big = np.array([-1e4, 0, 1e4], dtype=np.float32)
    with np.errstate(all="raise"):
        np.testing.assert_array_equal(ft.sigmoid(big), [0, 0.5, 1])


def test_maximum_and_minimum_broadcast_and_keep_float32_with_python_scalars():
    row = fresh((1, 4), 2)
    assert rel_error(ft.maximum(X, row), np.maximum(X64, row)) < 1e-5
    assert rel_error(ft.minimum(row, X), np.minimum(X64, row)) < 1e-5
    assert ft.maximum(X, 0.0).dtype == np.float32


@pytest.mark.parametrize("fn, ref", [(ft.max, np.max), (ft.sum, np.sum), (ft.mean, np.mean)])
@pytest.mark.parametrize("axis, keepdims", [(None, False), (1, True), (0, False), (-1, False), ((0, 1), True)])
def test_reductions(fn, ref, axis, keepdims):
    got = fn(X, axis=axis, keepdims=keepdims)
    expected = ref(X64, axis=axis, keepdims=keepdims)
    assert np.shape(got) == np.shape(expected) and rel_error(got, expected) < 1e-5


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax(axis):
    e = np.exp(X64 - X64.max(axis=axis, keepdims=True))
    assert rel_error(ft.softmax(X, axis), e / e.sum(axis=axis, keepdims=True)) < 1e-5


def test_concat_of_a_tuple_and_of_a_depth_1_list():
    a, b = fresh((2, 4), 3), fresh((1, 4), 4)
    np.testing.assert_array_equal(ft.concat((a, b)), np.concatenate([a, b]))
    xs = ft.FractalTensor.from_numpy(fresh((3, 2, 1), 5), 1)
    np.testing.assert_array_equal(ft.concat(xs, axis=1), np.concatenate(list(xs.to_numpy()), axis=1))


@pytest.mark.parametrize("sa, sb", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((2, 3, 4), (4, 5)),
                                    ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul_follows_numpy(sa, sb):
    a, b = fresh(sa, 6), fresh(sb, 7)
    assert rel_error(ft.matmul(a, b), np.matmul(a.astype(np.float64), b)) < 1e-5


def test_constants():
    assert ft.zeros((2, 3)).dtype == np.float32 and not np.any(ft.zeros((2, 3)))
    assert ft.ones(4, "float64").dtype == np.float64 and np.all(ft.ones(4) == 1)
    np.testing.assert_array_equal(ft.full((2,), -np.inf), [-np.inf, -np.inf])
    with pytest.raises(DTypeError, match="bool"):
        ft.zeros(3, "bool")


@pytest.mark.parametrize("call, shapes", [
    (lambda: ft.maximum(fresh((2, 3)), fresh(4)), "[2, 3] with [4]"),
    (lambda: ft.matmul(fresh((1, 4)), fresh((5, 2))), "[1, 4] @ [5, 2]"),
    (lambda: ft.matmul(fresh((2, 1, 4)), fresh((3, 4, 2))), "[2] with [3]"),
    (lambda: ft.matmul(fresh(()), fresh(3)), "[] @ [3]"),
    (lambda: ft.sum(fresh((2, 3)), axis=2), "axis 2 is out of range for a tensor of shape [2, 3]"),
    (lambda: ft.softmax(fresh(3), axis=1), "axis 1 is out of range for a tensor of shape [3]"),
    (lambda: ft.concat((fresh((2, 3)), fresh((2, 4)))), "[2, 3], [2, 4] differ off axis 0"),
    (lambda: ft.concat(()), "at least one"),
])
def test_shape_errors_name_the_function_and_the_shapes(call, shapes):
    with pytest.raises(ShapeError) as info:
        call()
    assert shapes in str(info.value) and info.value.op in str(info.value)
    assert "test_elementmath.py" in info.value.where


def test_lists_are_not_tensors():
    with pytest.raises(DepthError, match="ft.map"):
        ft.sum(ft.FractalTensor.from_numpy(X, 1))


def test_traced_values_dispatch_to_the_tracer(monkeypatch):
    calls = []
    monkeypatch.setattr(tracing, "apply_op", lambda name, args, attrs: calls.append((name, args, attrs)))
    v = tracing.Value((3, 4), "float32")
    ft.tanh(v)
    ft.matmul(X.T, v)
    ft.sum(v, axis=1)
    ft.concat((X, v), axis=0)
    assert [(name, attrs) for name, _, attrs in calls] == [
        ("tanh", {}), ("matmul", {}), ("sum", {"axis": 1, "keepdims": False}), ("concat", {"axis": 0})]
    assert calls[1][1][1] is v and calls[3][1] == (X, v)
