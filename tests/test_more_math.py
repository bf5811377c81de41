"""The element math added for layer norms, positions and GELU MLPs (ft.sin, cos, tan, erf, gelu, rsqrt,
sign, floor, clip, mean, var, stack): eager against independent float64 references (numpy, scipy),
compiled (C and cuda-emulated) against eager to 2 ulp in float32 with numpy's NaN, infinities and
signed zeros, and each adjoint against central finite differences."""
import shutil
import subprocess

import numpy as np
import pytest
import scipy.special
from test_cuda import TARGETS as CUDA_TARGETS

import polyft as ft
from polyft.errors import ShapeError
from polyft.testing import rel_error

pytestmark = pytest.mark.usefixtures("compile_cache")

EDGES = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-45, 3.0, -3.0, 30.0, -30.0, 1e4, -1e4,
                  0.5, -0.5, 1.5, -2.5, 88.0, -104.0], np.float32)


def data(seed=0, n=6):
    """Fresh values, spread over several magnitudes, with every edge value in the first row."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, 4, EDGES.size)) * rng.choice([0.01, 1.0, 10.0], (n, 4, 1))).astype(np.float32)
    x[0, 0] = EDGES
    return x


UNARY = {"sin": ft.sin, "cos": ft.cos, "tan": ft.tan, "erf": ft.erf, "gelu": ft.gelu, "rsqrt": ft.rsqrt,
         "sign": ft.sign, "floor": ft.floor}


def reference(name, x64):
    """Each function in float64 by another library than polyft's implementation uses."""
    with np.errstate(all="ignore"):
        if name == "erf":
            return scipy.special.erf(x64)
        if name == "gelu":  # x Phi(x) by scipy's normal CDF (torch's 0.5 x (1 + erf) is 0 below x = -8)
            return np.where(x64 == -np.inf, -0.0, x64 * scipy.special.ndtr(x64))
        if name == "rsqrt":
            return 1 / np.sqrt(x64)
        return getattr(np, name)(x64)


def ulps(a, b):
    """Distance in float32 units in the last place (0 where both are NaN or equal, signed zeros apart)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)

    def ordered(v):
        i = v.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF) - 1, i)  # -0 sits one below +0
    both_nan = np.isnan(a) & np.isnan(b)
    return np.where(both_nan, 0, np.where(np.isnan(a) | np.isnan(b), 1 << 40, np.abs(ordered(a) - ordered(b))))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_eager_equals_a_float64_reference_to_an_ulp(name):
    x = data(1)
    with np.errstate(all="ignore"):
        got = UNARY[name](x)
        want = reference(name, x.astype(np.float64)).astype(np.float32)
    assert got.dtype == np.float32 and got.shape == x.shape
    worst = {"sin": 1, "cos": 1, "tan": 2}.get(name, 1)  # numpy's own float32 sin/cos/tan: ~1 ulp
    assert ulps(got, want).max() <= worst, x.ravel()[np.argmax(ulps(got, want))]


def test_edge_values_follow_numpy():
    with np.errstate(all="ignore"):
        for name in ("sin", "cos", "tan", "sign", "floor"):
            np.testing.assert_array_equal(UNARY[name](EDGES), getattr(np, name)(EDGES))
        np.testing.assert_array_equal(ft.rsqrt(EDGES), 1 / np.sqrt(EDGES))
    assert np.signbit(ft.floor(np.float32(-0.0))) and not np.signbit(ft.sign(np.float32(-0.0)))
    assert ft.erf(np.float32(-0.0)) == 0 and np.signbit(ft.erf(np.float32(-0.0)))
    assert ft.gelu(np.float32(-np.inf)) == 0 and ft.gelu(np.float32(np.inf)) == np.inf
    assert np.isnan(ft.gelu(np.float32(np.nan))) and np.isnan(ft.erf(np.float32(np.nan)))
    np.testing.assert_array_equal(ft.clip(EDGES, -1, 2), np.clip(EDGES, -1, 2))  # NaN stays NaN
    np.testing.assert_array_equal(ft.clip(EDGES, 2, -1), np.clip(EDGES, 2, -1))  # lo > hi: hi, as numpy
    np.testing.assert_array_equal(ft.clip(EDGES, None, 0.5), np.clip(EDGES, None, 0.5))


@pytest.mark.parametrize("axis, keepdims, ddof", [(None, False, 0), (-1, True, 0), (0, False, 1), ((0, 2), True, 0)])
def test_mean_and_var_are_numpys(axis, keepdims, ddof):
    x = data(2)[1:]
    x64 = x.astype(np.float64)
    assert rel_error(ft.mean(x, axis=axis, keepdims=keepdims), np.mean(x64, axis=axis, keepdims=keepdims)) < 1e-6
    got = ft.var(x, axis=axis, keepdims=keepdims, ddof=ddof)
    assert np.shape(got) == np.shape(np.var(x, axis=axis, keepdims=keepdims))
    assert rel_error(got, np.var(x64, axis=axis, keepdims=keepdims, ddof=ddof)) < 1e-6


def test_stack_is_numpys_and_checks_shapes():
    a, b = data(3)[0], data(4)[0]
    for axis in (0, 1, -1):
        np.testing.assert_array_equal(ft.stack([a, b], axis=axis), np.stack([a, b], axis=axis))
    with pytest.raises(ShapeError, match=r"stack.*\[4, 20\].*\[3\]|stack.*\[3\].*\[4, 20\]"):
        ft.stack([a, np.ones(3, np.float32)])
    with pytest.raises(ShapeError, match="clip"):
        ft.clip(a)


def program(xs):
    """Every new function on one list; the results as a tuple of lists."""
    def body(t):
        unary = tuple(f(t) for _, f in sorted(UNARY.items()))
        return unary + (ft.clip(t, -1.0, 2.0), ft.clip(t, None, 0.25),
                        ft.mean(t, axis=-1, keepdims=True), ft.var(t, axis=0), ft.var(t, axis=-1, keepdims=True),
                        ft.stack([t[0], t[1], t[2]], axis=1), ft.mean(t))
    return xs.map(body)


@pytest.mark.parametrize("target", ["c", *CUDA_TARGETS])
def test_compiled_equals_eager_to_two_ulps_with_numpys_edge_cases(target):
    xs = ft.FractalTensor.from_numpy(data(5), 1)
    with np.errstate(all="ignore"):
        want = program(xs)
    got = ft.compile(program, ft.FractalTensor.from_numpy(data(6), 1), target=target)(xs)
    assert len(got) == len(want) == len(UNARY) + 7
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = g.to_numpy(), w.to_numpy()
        assert g.dtype == w.dtype and g.shape == w.shape
        if k < len(UNARY):  # element math: ulps; NaN where numpy's is NaN; zeros signed as numpy's
            assert ulps(g, w).max() <= 2, (sorted(UNARY)[k], g.ravel()[np.argmax(ulps(g, w))])
        else:  # reductions in another order: relative error
            assert np.array_equal(np.isnan(g), np.isnan(w)) and rel_error(np.nan_to_num(g), np.nan_to_num(w)) < 1e-5


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_nvcc_compiles_the_new_functions_and_masks_for_sm80_and_sm90(tmp_path):
    from polyft.emit.cuda_target import CudaTarget

    def both(xs):
        return xs.map(lambda t: program_body(t) + ((t > 0) & ~(t == 1.0) | (t <= -1)) * ft.sign(t))
    prog = ft.analyze(both, ft.FractalTensor.from_numpy(data(9), 1))
    (tmp_path / "k.cu").write_text(CudaTarget().generate(prog.model, prog.schedule).source)
    r = subprocess.run(["nvcc", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
                        "-c", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def program_body(t):
    return sum((f(t) for f in UNARY.values()), ft.clip(t, -1.0, 1.0))


def test_float64_compiles_with_the_double_functions():
    x = data(7)[1:3].astype(np.float64)
    xs = ft.FractalTensor.from_numpy(x, 1)
    def f(xs):
        return xs.map(lambda t: ft.sin(t) * ft.gelu(t) + ft.erf(t) - ft.rsqrt(ft.abs(t) + 1.0)
                      + ft.floor(t) * ft.tan(t))
    got = ft.compile(f, xs, target="c")(xs).to_numpy()
    assert got.dtype == np.float64 and rel_error(got, f(xs).to_numpy()) < 1e-13


# -- adjoints -------------------------------------------------------------------------------------
SMOOTH = {"sin": ft.sin, "cos": ft.cos, "tan": ft.tan, "erf": ft.erf, "gelu": ft.gelu,
          "rsqrt": lambda t: ft.rsqrt(t * t + 0.5), "var": lambda t: ft.var(t, axis=-1, keepdims=True) * t,
          "mean": lambda t: ft.mean(t, axis=0) * t, "stack": lambda t: ft.stack([t, t * t], axis=1)[:, 1] * t,
          "clip": lambda t: ft.clip(t, -0.7, 0.9) * t}


@pytest.mark.parametrize("name", sorted(SMOOTH))
def test_adjoints_equal_finite_differences(name):
    f = SMOOTH[name]
    x = np.random.default_rng(8).uniform(-1.2, 1.2, (3, 2, 4))

    def loss(x):
        return float(ft.map(lambda t: ft.sum(f(t)), ft.FractalTensor.from_numpy(x, 1)).to_numpy().sum())
    g = ft.vjp(lambda xs: xs.map(lambda t: ft.sum(f(t))), ft.FractalTensor.from_numpy(x, 1))[1](
        ft.FractalTensor.from_numpy(np.ones(3), 1))[0].to_numpy()
    eps, fd = 1e-6, np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        fd[idx] = (loss(up) - loss(down)) / (2 * eps)
    assert rel_error(g, fd) < 1e-6


def test_sign_and_floor_have_zero_gradients():
    x = ft.FractalTensor.from_numpy(np.random.default_rng(9).standard_normal((3, 4)), 1)
    g = ft.vjp(lambda xs: xs.map(lambda t: ft.sign(t) * 2.0 + ft.floor(t) + t), x)[1](
        ft.FractalTensor.from_numpy(np.ones((3, 4)), 1))[0].to_numpy()
    np.testing.assert_array_equal(g, np.ones((3, 4)))


def test_stack_of_a_list_of_concrete_length_compiles():
    xss = ft.FractalTensor.from_numpy(data(10)[:2, :3, :2], 2)

    def f(xss):
        return xss.map(lambda xs: ft.stack(xs, axis=1))
    want = np.stack([np.stack(list(row), axis=1) for row in xss.to_numpy()])
    np.testing.assert_array_equal(f(xss).to_numpy(), want)
    np.testing.assert_array_equal(ft.compile(f, xss, target="c")(xss).to_numpy(), want)
