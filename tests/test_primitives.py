"""polyft.primitives, the operator table: element math, the tracer and the interpreter read it;
the static getitem key is decoded once for lowering and the C kernels."""
import numpy as np
import pytest

import polyft as ft
from polyft.errors import ShapeError
from polyft.interpret import run
from polyft.primitives import PRIMITIVES, getitem_axes
from polyft.testing import rel_error


def test_every_element_math_function_is_a_table_entry():
    for name in ("tanh", "sigmoid", "exp", "log", "sqrt", "relu", "maximum", "minimum", "max", "sum", "mean",
                 "softmax", "concat", "matmul", "transpose", "zeros_like"):
        assert name in PRIMITIVES and callable(getattr(ft, name))


def test_a_shape_rule_gives_one_message_eagerly_and_under_tracing():
    a, b = np.ones((2, 3), np.float32), np.ones((4, 4), np.float32)
    with pytest.raises(ShapeError) as eager:
        ft.matmul(a, b)
    with pytest.raises(ShapeError) as traced:
        ft.trace(lambda xs, w: xs.map(lambda x: x @ w), ft.FractalTensor.from_numpy(np.ones((3, 2, 3), np.float32), 1), b)
    assert eager.value.detail == traced.value.detail == "inner dims differ: [2, 3] @ [4, 4]"


def test_the_interpreter_computes_what_eager_execution_does():
    xs = ft.FractalTensor.from_numpy(np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32), 1)

    def program(xs):
        return xs.map(lambda x: ft.concat((ft.softmax(x, axis=-1), ft.relu(-x).T.T), axis=0)[1:, ::2])
    assert rel_error(run(ft.trace(program, xs), xs).to_numpy(), program(xs).to_numpy()) < 1e-6


@pytest.mark.parametrize("key, shape, axes", [
    ((1, slice(None)), (3, 4), [(1, 0, None), (0, 1, 0)]),
    (-1, (3, 4), [(2, 0, None), (0, 1, 0)]),
    ((slice(1, None, 2), slice(None, None, -1)), (5, 4), [(1, 2, 0), (3, -1, 1)]),
    ((None, 0), (3, 4), None),
    (np.array([0, 2]), (3,), None),
])
def test_getitem_axes_decodes_basic_keys(key, shape, axes):
    assert getitem_axes(key, shape) == axes
    if axes is not None:  # the decoding reads the very elements numpy's indexing does
        x = np.arange(np.prod(shape)).reshape(shape)
        out = x[key]
        for point in np.ndindex(out.shape):
            src = tuple(start + step * (point[a] if a is not None else 0) for start, step, a in axes)
            assert x[src] == out[point]
