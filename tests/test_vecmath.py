"""The C target's element functions (emit/vecmath.h: ft_expf, ft_tanhf, ft_sigmoidf).

* accuracy against float64 numpy over dense samples of every range that matters (overflow and
  underflow edges, the tanh polynomial's switch at 0.625, the bulk): max ulp error printed
  (`pytest -s`) and bounded, within numpy's own float32 functions' error on the same points;
* special values exactly as numpy: NaN, +-inf, +-0 (tanh keeps the sign of zero), the last
  finite and first infinite exp, results that underflow to subnormals and to zero;
* a loop calling each vectorises (gcc's -fopt-info-vec) on every ISA level: the reason they exist;
* accuracy and special values hold for the code of every level this machine runs;
* compiled programs using them agree with the eager path.
"""
from __future__ import annotations

import ctypes
import platform
import re
import subprocess

import numpy as np
import pytest

import polyft as ft
from polyft.emit import isa, runtime_c
from polyft.emit.c_target import VECMATH

from helpers import assert_same, flist, rand

pytestmark = pytest.mark.usefixtures("compile_cache")

LOOPS = VECMATH + """
void run_exp(float* restrict o, const float* restrict x, long n) { for (long i = 0; i < n; i++) o[i] = ft_expf(x[i]); }
void run_tanh(float* restrict o, const float* restrict x, long n) { for (long i = 0; i < n; i++) o[i] = ft_tanhf(x[i]); }
void run_sigmoid(float* restrict o, const float* restrict x, long n) { for (long i = 0; i < n; i++) o[i] = ft_sigmoidf(x[i]); }
"""
REFERENCE = {"exp": np.exp, "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x))}
MAX_ULP = {"exp": 2, "tanh": 2, "sigmoid": 3}
TINY = np.finfo(np.float32).tiny


@pytest.fixture(scope="module", params=isa.runnable_levels())
def lib(request):
    """The functions built for each ISA level this machine runs (their vector code differs)."""
    return ctypes.CDLL(runtime_c.build(LOOPS, runtime_c.compile_flags(request.param)))


def call(lib, name, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    getattr(lib, f"run_{name}")(ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(x.ctypes.data),
                                ctypes.c_long(x.size))
    return out


def samples() -> np.ndarray:
    rng = np.random.default_rng(7)
    edges = [np.linspace(a, b, 200_001) for a, b in [(-104, -85), (85, 89), (-0.7, 0.7), (-10, 10)]]
    return np.concatenate(edges + [rng.uniform(-110, 95, 1_000_000), rng.standard_normal(500_000) * 3,
                                   np.geomspace(1e-30, 1, 20_000), -np.geomspace(1e-30, 1, 20_000)]
                          ).astype(np.float32)


def ulps(got: np.ndarray, x: np.ndarray, name: str) -> tuple:
    """(ulp errors, mask of points whose exact value is a normal float32)."""
    with np.errstate(over="ignore"):
        exact = REFERENCE[name](x.astype(np.float64))
        normal = (np.abs(exact) >= TINY) & (np.abs(exact) <= np.finfo(np.float32).max)
        spacing = np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / np.where(normal, spacing, 1.0), normal


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid"])
def test_accuracy_in_ulp(lib, name):
    x = samples()
    err, normal = ulps(call(lib, name, x), x, name)
    with np.errstate(over="ignore"):
        theirs, _ = ulps(REFERENCE[name](x), x, name)  # numpy's own float32 functions
    worst, numpy_worst = err[normal].max(), theirs[normal].max()
    print(f"\nft_{name}f: max {worst:.2f} ulp over {normal.sum()} points (numpy float32: {numpy_worst:.2f})")
    assert worst <= MAX_ULP[name]
    assert worst <= max(numpy_worst, 1.5)


def test_special_values(lib):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, 88.73, -87.3, -103.0, -110.0, 1e-30, -1e-30, 20.0,
                  -20.0], np.float32)
    with np.errstate(over="ignore"):
        for name in ("exp", "tanh"):
            got, want = call(lib, name, x), getattr(np, name)(x)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
            ok = ~np.isnan(want)
            np.testing.assert_allclose(got[ok], want[ok], rtol=3e-7, atol=0)  # 0, inf and subnormals exactly
        got = call(lib, "sigmoid", x)
    assert np.isnan(got[0]) and list(got[1:5]) == [1.0, 0.0, 0.5, 0.5] and got[9] == 0.0


@pytest.mark.parametrize("level", [*isa.LEVELS.get(platform.machine(), ()), "native"])
def test_loops_vectorise(tmp_path, level):
    """On every ISA level (SSE2 has no rounding instruction and no masks: ft_expf rounds by
    a shift and the generated C is built with -fno-trapping-math, or nothing vectorises)."""
    cc = runtime_c.compiler()
    if "Free Software Foundation" not in subprocess.run([cc, "--version"], capture_output=True, text=True).stdout:
        pytest.skip(f"{cc} is not GCC: -fopt-info-vec is GCC's report")
    src = tmp_path / "loops.c"
    src.write_text(LOOPS)
    flags = [f for f in runtime_c.compile_flags(level) if f != "-shared"]
    r = subprocess.run([cc, *flags, "-c", str(src), "-o", str(tmp_path / "loops.o"), "-fopt-info-vec-optimized"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [n for n, text in enumerate(LOOPS.splitlines(), 1) if text.startswith("void run_")]
    vectorised = {int(m.group(1)) for m in re.finditer(r"loops\.c:(\d+):\d+: optimized: loop vectorized", r.stderr)}
    assert set(lines) <= vectorised, r.stderr


def test_compiled_programs_use_them():
    def cell(xs, w):
        return xs.map(lambda x: ft.sigmoid(x @ w) * ft.tanh(x) + ft.exp(-x * x))
    xs, w = flist([19], [2, 32], 1), rand((32, 32), 2) / 6
    prog = ft.compile(cell, xs, w)
    assert all(f"ft_{f}f(" in prog.source for f in ("sigmoid", "tanh", "exp"))
    assert_same(prog(xs, w), cell(xs, w))


@pytest.mark.parametrize("level", [*isa.LEVELS.get(platform.machine(), ()), "native"])
def test_softmax_rows_vectorise(tmp_path, level):
    """Each of a softmax row's three loops (its max, its exps and their sum, the division)
    vectorises on every ISA level: the max and the sum reduce in vector lanes (omp simd)."""
    cc = runtime_c.compiler()
    if "Free Software Foundation" not in subprocess.run([cc, "--version"], capture_output=True, text=True).stdout:
        pytest.skip(f"{cc} is not GCC: -fopt-info-vec is GCC's report")
    with isa.building_for(level):
        prog = ft.compile(softmax_rows, flist([8], [16, 64], 3))
    src = tmp_path / "softmax.c"
    src.write_text(prog.source)
    flags = [f for f in runtime_c.compile_flags(level) if f != "-shared"]
    r = subprocess.run([cc, *flags, "-c", str(src), "-o", str(tmp_path / "softmax.o"), "-fopt-info-vec-optimized"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = prog.source.splitlines()
    first = next(n for n, text in enumerate(lines, 1) if "_mx = -INFINITY" in text)
    heads = [n for n, text in enumerate(lines, 1) if n > first and "for (int _a = 0;" in text][:3]
    vectorised = {int(m.group(1)) for m in re.finditer(r"softmax\.c:(\d+):\d+: optimized: loop vectorized", r.stderr)}
    for head, end in zip(heads, heads[1:] + [heads[-1] + 3]):
        assert vectorised & set(range(head - 1, end)), (level, lines[head - 1:end], r.stderr)
    if level in isa.runnable_levels():
        xs = flist([8], [16, 64], 4)
        assert_same(prog(xs), softmax_rows(xs))


def softmax_rows(xs):
    return xs.map(lambda x: ft.softmax(x * 3, axis=-1))
