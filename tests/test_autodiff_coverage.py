"""Every operator has a gradient: each entry of the operator table and each access operator is
differentiated (eagerly, float64) against central finite differences, and its pullback compiled to C
equals the eager one; an operator without a gradient raises a DifferentiationError naming it.
A primitive added to the table without a case here fails `test_every_primitive_has_a_case`."""
from __future__ import annotations

import numpy as np
import pytest

import polyft as ft
from polyft import elementmath
from polyft.autodiff import DifferentiationError
from polyft.primitives import PRIMITIVES
from polyft.testing import rel_error

RNG = np.random.default_rng(11)


def _r(*shape, low=None):
    a = RNG.standard_normal(shape)
    return np.abs(a) + 0.5 if low == "positive" else a


def _weighted(out_shape):
    """A fixed random weighting of the output, so that the loss sees every output element apart."""
    return np.random.default_rng(abs(hash(out_shape)) % 2**32).standard_normal(out_shape)


def _loss(op):
    def loss(*xs):
        out = op(*xs)
        return ft.sum(out * _weighted(tuple(out.shape)))
    return loss


MASK = (RNG.standard_normal((3, 4)) > 0).astype(np.float64)
IDS = np.array([0, 2, 2, 1, 0])

# name -> (the operation on its operands, the operands); every operand is differentiated
CASES = {
    "add": (lambda a, b: a + b, [_r(3, 4), _r(1, 4)]),
    "sub": (lambda a, b: a - b, [_r(3, 4), _r(3, 1)]),
    "mul": (lambda a, b: a * b, [_r(3, 4), _r(3, 4)]),
    "truediv": (lambda a, b: a / b, [_r(3, 4), _r(3, 4, low="positive")]),
    "neg": (lambda a: -a, [_r(3, 4)]),
    "pow": (lambda a, b: a ** b, [_r(3, 4, low="positive"), _r(1, 4)]),
    "abs": (lambda a: abs(a), [_r(3, 4)]),
    "matmul": (lambda a, b: a @ b, [_r(3, 4), _r(4, 2)]),
    "getitem": (lambda a: a[1:, ::2], [_r(3, 4)]),
    "transpose": (lambda a: a.T, [_r(3, 4)]),
    "permute": (lambda a: ft.transpose(a, (2, 0, 1)), [_r(2, 3, 4)]),
    "reshape": (lambda a: a.reshape(4, 3), [_r(3, 4)]),
    "copy": (lambda a: elementmath._bind("copy", (a,), {}), [_r(3, 4)]),
    "astype": (lambda a: a.astype("float32").astype("float64"), [_r(3, 4)]),
    "tanh": (ft.tanh, [_r(3, 4)]),
    "sigmoid": (ft.sigmoid, [_r(3, 4)]),
    "exp": (ft.exp, [_r(3, 4)]),
    "log": (ft.log, [_r(3, 4, low="positive")]),
    "sqrt": (ft.sqrt, [_r(3, 4, low="positive")]),
    "log1p": (ft.log1p, [_r(3, 4, low="positive")]),
    "softplus": (ft.softplus, [_r(3, 4)]),
    "where": (lambda a, b: ft.where(MASK, a, b), [_r(3, 4), _r(3, 4)]),
    "relu": (ft.relu, [_r(3, 4)]),
    "zeros_like": (lambda a: ft.zeros_like(a) + a * 2.0, [_r(3, 4)]),
    "maximum": (ft.maximum, [_r(3, 4), _r(3, 4)]),
    "minimum": (ft.minimum, [_r(3, 4), _r(3, 4)]),
    "max": (lambda a: ft.max(a, axis=1), [_r(3, 4)]),
    "sum": (lambda a: ft.sum(a, axis=0, keepdims=True), [_r(3, 4)]),
    "mean": (lambda a: ft.mean(a, axis=1), [_r(3, 4)]),
    "softmax": (lambda a: ft.softmax(a, axis=-1), [_r(3, 4)]),
    "logsumexp": (lambda a: ft.logsumexp(a, axis=1), [_r(3, 4)]),
    "scatter_add": (lambda a: ft.scatter_add(a, IDS, 4), [_r(5, 3)]),
    "concat": (lambda a, b: ft.concat((a, b), axis=1), [_r(3, 4), _r(3, 2)]),
    "sin": (ft.sin, [_r(3, 4)]),
    "cos": (ft.cos, [_r(3, 4)]),
    "tan": (ft.tan, [_r(3, 4) * 0.5]),
    "erf": (ft.erf, [_r(3, 4)]),
    "gelu": (ft.gelu, [_r(3, 4)]),
    "rsqrt": (ft.rsqrt, [_r(3, 4, low="positive")]),
    # piecewise constant: a zero gradient away from the steps (random operands are not on them)
    "sign": (lambda a: ft.sign(a) * a, [_r(3, 4)]),
    "floor": (lambda a: ft.floor(a * 3.0) + a, [_r(3, 4)]),
    "greater": (lambda a, b: (a > b) * a, [_r(3, 4), _r(3, 4)]),
    "less": (lambda a, b: (a < b) * b, [_r(3, 4), _r(3, 4)]),
    "greater_equal": (lambda a, b: (a >= b) * (a - b), [_r(3, 4), _r(3, 4)]),
    "less_equal": (lambda a, b: (a <= b) * (a + b), [_r(3, 4), _r(3, 4)]),
    "equal": (lambda a, b: (a == b) + a * b, [_r(3, 4), _r(3, 4)]),
    "not_equal": (lambda a, b: (a != b) * a * b, [_r(3, 4), _r(3, 4)]),
    "logical_and": (lambda a, b: ft.logical_and(a > 0, b > 0) * a, [_r(3, 4), _r(3, 4)]),
    "logical_or": (lambda a, b: ft.logical_or(a > 0, b > 0) * b, [_r(3, 4), _r(3, 4)]),
    "logical_xor": (lambda a, b: ft.logical_xor(a > 0, b > 0) * a, [_r(3, 4), _r(3, 4)]),
    "logical_not": (lambda a: ft.logical_not(a > 0) * a, [_r(3, 4)]),
}
# where the gradient is not defined: the call that must raise a DifferentiationError naming the op
UNDIFFERENTIABLE = {
    "scatter_add": (lambda a: ft.scatter_add(a, IDS, 4, combine="max"), [_r(5, 3)]),
}


def central_differences(loss, arrays, k, eps=1e-6):
    grad = np.zeros_like(arrays[k])
    for idx in np.ndindex(arrays[k].shape):
        vals = []
        for sign in (1, -1):
            moved = [a.copy() for a in arrays]
            moved[k][idx] += sign * eps
            vals.append(float(loss(*moved)))
        grad[idx] = (vals[0] - vals[1]) / (2 * eps)
    return grad


def _as_tuple(g):
    return g if isinstance(g, tuple) else (g,)


def _numpy(x):
    return x.to_numpy() if hasattr(x, "to_numpy") else np.asarray(x)


def test_every_primitive_has_a_case():
    assert set(PRIMITIVES) <= set(CASES), sorted(set(PRIMITIVES) - set(CASES))


@pytest.mark.parametrize("name", sorted(CASES))
def test_primitive_gradient_equals_finite_differences(name):
    op, args = CASES[name]
    loss = _loss(op)
    nums = tuple(range(len(args)))
    grads = _as_tuple(ft.grad(loss, argnums=nums)(*args))
    tol = 1e-4 if name == "astype" else 1e-6  # a float32 round trip: finite differences see its steps
    for k, g in enumerate(grads):
        expected = central_differences(loss, args, k, eps=1e-3 if name == "astype" else 1e-6)
        assert rel_error(_numpy(g), expected) < tol, (name, k)


@pytest.mark.parametrize("name", sorted(UNDIFFERENTIABLE))
def test_undifferentiable_operators_name_themselves(name):
    op, args = UNDIFFERENTIABLE[name]
    with pytest.raises(DifferentiationError, match=name):
        ft.grad(_loss(op))(*args)


# -- access operators on lists, and values read through a body's closure -----------------------

XSS = RNG.standard_normal((3, 4, 1, 2))
XS = RNG.standard_normal((6, 1, 2))
W = RNG.standard_normal((2, 2)) * 0.5
WS = RNG.standard_normal((3, 2, 2)) * 0.5


def _total(ys):
    """A sum over a list of [1, 2] elements, each weighted by its position (0.5 ** (n - 1 - i))."""
    return ys.map(lambda y: ft.sum(y * np.array([[1.0, -0.5]]))).reduce(lambda a, b: a * 0.5 + b)


def _deep_total(yss):
    return yss.map(_total).reduce(lambda a, b: a + b * 1.5)


LIST_CASES = {
    "getitem": (lambda xs: _total(xs[1:5:2]) + ft.sum(xs[-1]), [XS], [1]),
    "shift_reverse": (lambda xs: _total(xs.shift(2)) + _total(xs.reverse()), [XS], [1]),
    "window": (lambda xs: _deep_total(xs.window(3, stride=2, padding=1)), [XS], [1]),
    "dilated_window": (lambda xs: _deep_total(xs.window(2, dilation=2)), [XS], [1]),
    "gather": (lambda xs: _total(xs.gather(np.array([5, 0, 0, 3]))), [XS], [1]),
    "strided_split": (lambda xs: _deep_total(xs.strided_split(2)), [XS], [1]),
    "strided_merge": (lambda xss: _total(xss.strided_merge()), [XSS], [2]),
    "product": (lambda xs: _deep_total(ft.product(xs[:2], xs[2:5]).map(lambda ab: ab.map(lambda p: p[0] * p[1]))),
                [XS], [1]),
    "flatten": (lambda xss: _total(xss.flatten()), [XSS], [2]),
    "split": (lambda xs: _deep_total(xs.split(3)), [XS], [1]),
    "transpose": (lambda xss: _deep_total(ft.transpose(xss)), [XSS], [2]),
    "zip": (lambda xs, ys: _total(ft.map(lambda a, b: a * b, ft.zip(xs, ys).map(lambda p: p[0]), ys)), [XS, XS[::-1]],
            [1, 1]),
    # a weight read through the body's closure, on the right of an operand that is not differentiated
    "closure_matmul_right": (lambda xs, w: _total(xs.map(lambda x: ft.tanh(x @ w))), [XS, W], [1, 0]),
    "closure_in_scan": (lambda xs, w: _total(xs.scanl(lambda h, x: ft.tanh(x @ w + h @ w), xs[0] * 0.0)),
                        [XS, W], [1, 0]),
    "closure_list_indexed": (lambda xs, ws: _total(xs.map(lambda x: x @ ws[1] * ws[0][0:1])), [XS, WS], [1, 1]),
}


def _lists(args, depths):
    return [ft.FractalTensor.from_numpy(a, d) if d else a for a, d in zip(args, depths)]


@pytest.mark.parametrize("name", sorted(LIST_CASES))
def test_access_operator_gradient_equals_finite_differences(name):
    op, args, depths = LIST_CASES[name]
    nums = tuple(range(len(args)))

    grads = _as_tuple(ft.grad(op, argnums=nums)(*_lists(args, depths)))
    for k, g in enumerate(grads):
        expected = central_differences(lambda *a: _numpy(op(*_lists(a, depths))), args, k)
        assert rel_error(_numpy(g), expected) < 1e-6, (name, k)


@pytest.mark.parametrize("name", sorted(LIST_CASES))
def test_access_operator_pullback_compiles(name):
    """Each gradient also compiled (with respect to the list; a closure's weight is differentiated alone,
    with the list traced on its left), equal to the eager gradient. Not coarsened: coarsening a
    pullback costs minutes (the whole program's dataflow is checked per candidate merge)."""
    op, args, depths = LIST_CASES[name]
    values = _lists([x.astype(np.float32) for x in args], depths)
    for nums in [(0,)] + ([(1,)] if name.startswith("closure") else []):
        expected = _as_tuple(ft.grad(op, argnums=nums)(*values))
        got = _as_tuple(ft.compile(ft.grad(op, argnums=nums), *values, coarsen=False)(*values))
        for g, e in zip(got, expected):
            assert rel_error(_numpy(g), _numpy(e)) < 1e-5, (name, nums)


@pytest.mark.parametrize("name", ["matmul", "mul", "sub", "truediv", "pow", "maximum", "where", "concat"])
def test_binary_gradients_compile_for_each_operand_alone(name):
    """`ft.grad(f, argnums=k > 0)`: an operand not differentiated is traced on the left of a differentiated one."""
    op, args = CASES[name]
    inputs = [a.astype(np.float32) for a in args]
    for k in range(1, len(inputs)):
        expected = ft.grad(_loss(op), argnums=k)(*inputs)
        got = ft.compile(ft.grad(_loss(op), argnums=k), *inputs)(*inputs)
        assert rel_error(_numpy(got), _numpy(expected)) < 1e-5, (name, k)
