"""Triangular PolyBench kernels written with masks by index (`j < i` over ft.arange): trisolv and
syrk, eager and compiled (C, cuda-emulated) against numpy. Bodies bounded by an enclosing index
(`xs[:i]`) are refused with the masked form named: they are not modelled as affine domains."""
import numpy as np
import pytest

import polyft as ft
from polyft.errors import TracerControlFlowError
from polyft.testing import rel_error

pytestmark = pytest.mark.usefixtures("compile_cache")
TARGETS = ["c", "cuda-emulated"]
N = 6


def trisolv(rows, b):
    """Forward substitution L x = b: x[i] = (b[i] - sum_{j < i} L[i, j] x[j]) / L[i, i], as a scan
    over the rows whose state is the whole x (zeros past i), row i reading x by a mask j < i."""
    n = len(rows)
    idx = ft.arange(n)

    def step(x, row_b_i):
        row, bi, i = row_b_i
        done = ft.map(lambda j, xj, lij: lij * xj * (j < i), idx, x, row).reduce(lambda a, c: a + c)
        diag = ft.map(lambda j, lij: lij * (j == i), idx, row).reduce(lambda a, c: a + c)
        xi = (bi - done) / diag
        return ft.map(lambda j, xj: ft.where(j == i, xi, xj), idx, x)
    x0 = ft.FractalTensor.from_numpy(np.zeros((n, 1), np.float32), 1)
    return ft.zip(rows, b, idx).foldl(step, x0)


def lower_system(seed):
    rng = np.random.default_rng(seed)
    L = np.tril(rng.standard_normal((N, N))).astype(np.float32) * 0.3 + np.eye(N, dtype=np.float32) * 2
    return L, rng.standard_normal((N, 1)).astype(np.float32)


def as_lists(L, b):
    return ft.FractalTensor.from_numpy(L.reshape(N, N, 1), 2), ft.FractalTensor.from_numpy(b, 1)


@pytest.mark.parametrize("target", TARGETS)
def test_trisolv(target):
    L, b = lower_system(0)
    want = np.linalg.solve(L.astype(np.float64), b.astype(np.float64))
    rows, bs = as_lists(L, b)
    assert rel_error(trisolv(rows, bs).to_numpy(), want) < 1e-5
    prog = ft.compile(trisolv, *as_lists(*lower_system(1)), target=target)
    assert rel_error(prog(rows, bs).to_numpy(), want) < 1e-5


def syrk(a, c, alpha=1.5, beta=0.5):
    """C = alpha A A^T + beta C on the lower triangle (j <= i), the upper kept: PolyBench's syrk."""
    n = len(a)
    idx = ft.arange(n)
    return ft.map(lambda i, ai, ci: ft.map(
        lambda j, aj, cij: ft.where(j <= i, alpha * ft.sum(ai * aj, keepdims=True).reshape(()) + beta * cij, cij),
        idx, a, ci), idx, a, c)


@pytest.mark.parametrize("target", TARGETS)
def test_syrk(target):
    rng = np.random.default_rng(2)
    A, C = rng.standard_normal((N, 4)).astype(np.float32), rng.standard_normal((N, N)).astype(np.float32)
    want = C.astype(np.float64).copy()
    full = 1.5 * A.astype(np.float64) @ A.T.astype(np.float64) + 0.5 * C
    want[np.tril_indices(N)] = full[np.tril_indices(N)]
    a, c = ft.FractalTensor.from_numpy(A, 1), ft.FractalTensor.from_numpy(C, 2)
    assert rel_error(syrk(a, c).to_numpy(), want) < 1e-5
    assert rel_error(ft.compile(syrk, a, c, target=target)(a, c).to_numpy(), want) < 1e-5


def test_a_slice_bounded_by_an_index_names_the_masked_form():
    xs = ft.FractalTensor.from_numpy(np.ones((4, 3), np.float32), 1)
    with pytest.raises(TracerControlFlowError, match=r"\(j < i\), ft\.arange"):
        ft.trace(lambda xs: ft.arange(4, "int64").map(lambda i: xs[:i].reduce(lambda a, b: a + b)), xs)
