"""Compiled code is never silently wrong: element types, NaN, integer constants, captured
constants and tile sizes (issue: nothing silently wrong, nothing crashes).

* **one promotion rule**: numpy's. The tracer gives every operation numpy's result dtype; a
  Python number takes the result's dtype (int32 + 1 stays int32, exactly); a matmul's
  operands are cast to the result's dtype first (`astype` nodes); the C kernels compute
  each element operation in its result type. Every pair of float32 / float64 / int32
  operands through `@`, `+`, `/` equals eager execution, dtype included. The CUDA target
  multiplies float32 only and says so (CompileError naming matmul and the dtype).
* **NaN** as numpy: max, maximum, minimum, relu, softmax keep a NaN (fmax/fmin would drop it).
* **integer constants**: 16777217 + 1 in int32 and (2**40 + 1) * 3 in int64 are exact; a max
  over negative integers starts from the type's minimum.
* **captured constants**: a numpy array captured by the user's function (a closure's weights,
  gather indices) is compiled into the code; changing it afterwards makes the call raise
  InputError naming the array and where it was captured, never return stale numbers.
* **tile size**: tiles of 256 x 256 floats (4 MB a batched temporary) run, in a fresh
  process (a stack overflow would kill it): large temporaries live in a per-thread scratch.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import polyft as ft
from polyft.errors import CompileError, InputError

pytestmark = pytest.mark.usefixtures("compile_cache")
TARGETS = ["c", "cuda-emulated"]


def tensor(rng, dtype, shape=(3, 2, 4)):
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def same(got, want):
    """Equal to eager: same dtype, same NaNs, values within float32 rounding."""
    g, w = (x.to_numpy() if hasattr(x, "to_numpy") else np.asarray(x) for x in (got, want))
    assert g.dtype == w.dtype, (g.dtype, w.dtype)
    assert np.array_equal(np.isnan(g), np.isnan(w)) if g.dtype.kind == "f" else True
    tol = 1e-5 if g.dtype == np.float32 else 1e-12
    assert np.allclose(g, w, rtol=tol, atol=tol, equal_nan=True), (g.ravel()[:4], w.ravel()[:4])


DTYPES = ["float32", "float64", "int32"]


@pytest.mark.parametrize("right", DTYPES)
@pytest.mark.parametrize("left", DTYPES)
def test_matmul_and_arithmetic_of_mixed_dtypes_equal_eager(left, right):
    rng = np.random.default_rng(1)
    xs = ft.FractalTensor.from_numpy(tensor(rng, left), 1)
    w = tensor(rng, right, (4, 4))

    def program(xs, w):
        return xs.map(lambda x: (x @ w + x) / w[0])
    want = program(xs, w)
    same(ft.compile(program, xs, w, target="c")(xs, w), want)
    closure = lambda xs: xs.map(lambda x: x @ w)  # noqa: E731  (a captured constant of another dtype)
    same(ft.compile(closure, xs, target="c")(xs), closure(xs))
    product = np.result_type(left, right)
    if product == np.float32:
        same(ft.compile(program, xs, w, target="cuda-emulated")(xs, w), want)
    else:
        with pytest.raises(CompileError, match=f"matmul: the CUDA target multiplies float32 tiles only, not "
                                               f"{product}") as e:
            ft.compile(program, xs, w, target="cuda-emulated")
        assert "test_numerics.py" in e.value.where


@pytest.mark.parametrize("target", TARGETS)
def test_scalars_and_division_follow_numpy(target):
    """A float32 tile divided by a numpy float64 scalar, int32 divided by int32 (a float64
    quotient, not C's integer division), an int32 tile scaled by a Python float."""
    rng = np.random.default_rng(2)
    xs = ft.FractalTensor.from_numpy(tensor(rng, "float32"), 1)
    ks = ft.FractalTensor.from_numpy(tensor(rng, "int32") + 100, 1)

    def program(xs, ks):
        return xs.map(lambda x: x / np.sqrt(4.0)), ks.map(lambda k: k / (k - 7)), ks.map(lambda k: k * 0.5)
    got = ft.compile(program, xs, ks, target=target)(xs, ks)
    for g, w in zip(got, program(xs, ks)):
        same(g, w)


NAN_OPS = {
    "max": lambda x: ft.max(x, axis=1, keepdims=True),
    "max_all": lambda x: ft.max(x),
    "maximum": lambda x: ft.maximum(x, 0.25),
    "minimum": lambda x: ft.minimum(0.25, x),
    "relu": ft.relu,
    "softmax": lambda x: ft.softmax(x, axis=-1),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", sorted(NAN_OPS))
def test_nan_propagates_as_in_numpy(op, target):
    rng = np.random.default_rng(3)
    a = tensor(rng, "float32")
    a[1, 0, 2] = np.nan
    a[2, 1, 0] = np.nan
    xs = ft.FractalTensor.from_numpy(a, 1)

    def program(xs):
        return xs.map(NAN_OPS[op])
    want = program(xs)
    assert np.isnan(want.to_numpy()).any()  # the case is not vacuous
    same(ft.compile(program, xs, target=target)(xs), want)


@pytest.mark.parametrize("target", TARGETS)
def test_integer_constants_are_exact(target):
    i32 = ft.FractalTensor.from_numpy(np.full((2, 1, 4), 16777217, dtype=np.int32), 1)
    i64 = ft.FractalTensor.from_numpy(np.full((2, 1, 4), 2**40 + 1, dtype=np.int64), 1)
    neg = ft.FractalTensor.from_numpy(-np.arange(1, 17, dtype=np.int32).reshape(2, 2, 4), 1)

    def program(a, b, c):
        return a.map(lambda x: x + 1), b.map(lambda x: x * 3 - 1), c.map(lambda x: ft.max(x, axis=1))
    got = ft.compile(program, i32, i64, neg, target=target)(i32, i64, neg)
    want = program(i32, i64, neg)
    for g, w in zip(got, want):
        same(g, w)
    assert got[0].to_numpy()[0, 0, 0] == 16777218 and got[1].to_numpy()[0, 0, 0] == 3 * (2**40 + 1) - 1


def test_a_changed_captured_constant_is_never_used_stale():
    rng = np.random.default_rng(4)
    xs = ft.FractalTensor.from_numpy(tensor(rng, "float32"), 1)
    w = np.eye(4, dtype=np.float32)
    idx = np.array([2, 0])

    def program(xs):
        return xs.gather(idx).map(lambda x: x @ w)
    prog = ft.compile(program, xs)
    same(prog(xs), program(xs))
    w[0, 0] = 5.0  # eager execution now uses the new value: the compiled code cannot
    with pytest.raises(InputError, match=r"float32\[4, 4\] captured as a constant at test_numerics.py:\d+") as e:
        prog(xs)
    assert "compile again" in str(e.value) and e.value.op == "call"
    w[0, 0] = 1.0  # back as compiled: runs again
    same(prog(xs), program(xs))
    idx[0] = 1
    with pytest.raises(InputError, match=r"int64\[2\] captured as a constant"):
        prog.bind(xs)
    idx[0] = 2
    fresh = ft.compile(program, xs)  # compiled again after a change: the new value
    w[1, 1] = 3.0
    same(ft.compile(program, xs)(xs), program(xs))
    with pytest.raises(InputError):
        fresh(xs)


def test_large_tiles_do_not_overflow_the_stack(tmp_path):
    """512 x 512 float32 tiles: every temporary is 1 MB, more in all than a statement keeps on
    its thread's stack (a tile of such instances is one instance: 512 rows each; the arrays are
    sized for the widest tile a statement runs, where 256 x 256 tiles were once sized for 16)."""
    script = textwrap.dedent("""
        import numpy as np, polyft as ft
        from polyft.testing import rel_error
        rng = np.random.default_rng(5)
        xs = ft.FractalTensor.from_numpy(rng.standard_normal((3, 512, 512)).astype(np.float32), 1)
        w = (rng.standard_normal((512, 512)) / 512).astype(np.float32)
        f = lambda xs, w: xs.map(lambda x: ft.tanh(x @ w) + ft.softmax(x, axis=-1))
        prog = ft.compile(f, xs, w, target="c")
        assert "(c->ft_tmp + " in prog.source  # the temporaries are in the scratch
        print(rel_error(prog(xs, w), f(xs, w)))
    """)
    env = {**os.environ, "POLYFT_CACHE": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert float(r.stdout.split()[-1]) < 1e-5
