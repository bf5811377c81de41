"""Tests for deps.linalg: exact integer HNF, null spaces, hyperplane, unimodular completion.

Reference checks here use an independent Fraction Gaussian elimination, not the module's HNF.
"""
from fractions import Fraction
from itertools import product
from math import gcd

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from polyft.deps.linalg import (
    complete_unimodular,
    hermite_normal_form,
    hyperplane_search,
    integer_null_space,
    is_unimodular,
    lamport_hyperplane,
    reuse_dims,
    transform_access,
    unimodular_inverse,
)

# Figure 6 / Table 5: block node Γ¹₄ of region3, dims (t5, t4, t3, t2)
M12 = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])   # null space <e3> (paper)
M13 = np.eye(4, dtype=np.int64)                               # empty null space
M14 = np.array([[0, 1, 0, 0], [0, 0, 1, 0]])                  # null space <e0, e3> (paper)
T_FIG6 = [[0, 1, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]]
TINV_FIG6 = [[0, 0, 1, 0], [0, 1, 0, 0], [1, -1, 0, 0], [0, 0, 0, 1]]


# ------------------------------------------------------------------ independent references

def rref_rank(rows):
    """Rank over Q by Fraction Gaussian elimination."""
    A = [[Fraction(x) for x in r] for r in rows]
    rank, ncols = 0, len(A[0]) if A else 0
    for c in range(ncols):
        p = next((i for i in range(rank, len(A)) if A[i][c] != 0), None)
        if p is None:
            continue
        A[rank], A[p] = A[p], A[rank]
        for i in range(len(A)):
            if i != rank and A[i][c] != 0:
                f = A[i][c] / A[rank][c]
                A[i] = [a - f * b for a, b in zip(A[i], A[rank])]
        rank += 1
    return rank


def det(rows):
    A = [[Fraction(int(x)) for x in r] for r in rows]
    n, out = len(A), Fraction(1)
    for c in range(n):
        p = next((i for i in range(c, n) if A[i][c] != 0), None)
        if p is None:
            return Fraction(0)
        if p != c:
            A[c], A[p] = A[p], A[c]
            out = -out
        out *= A[c][c]
        for i in range(c + 1, n):
            f = A[i][c] / A[c][c]
            A[i] = [a - f * b for a, b in zip(A[i], A[c])]
    return out


def matmul(A, B):
    A, B = np.asarray(A, dtype=object), np.asarray(B, dtype=object)
    return A @ B


def as_int_lists(A):
    return [[int(x) for x in row] for row in np.asarray(A, dtype=object)]


def vec_gcd(v):
    g = 0
    for x in v:
        g = gcd(g, int(x))
    return g


small = st.integers(-4, 4)


@st.composite
def int_matrices(draw, max_rows=4, max_cols=5):
    m = draw(st.integers(0, max_rows))
    d = draw(st.integers(1, max_cols))
    rows = [[draw(small) for _ in range(d)] for _ in range(m)]
    return np.array(rows, dtype=np.int64).reshape(m, d)


@st.composite
def lex_positive_distances(draw, max_dims=4, max_count=4):
    dims = draw(st.integers(1, max_dims))
    ds = []
    for _ in range(draw(st.integers(1, max_count))):
        lead = draw(st.integers(0, dims - 1))
        tail = [draw(st.integers(-2, 2)) for _ in range(dims - lead - 1)]
        ds.append(tuple([0] * lead + [draw(st.integers(1, 3))] + tail))
    return ds, dims


@st.composite
def unimodular_matrices(draw, max_n=5):
    n = draw(st.integers(1, max_n))
    T = [[int(i == j) for j in range(n)] for i in range(n)]
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["add", "swap", "neg"]))
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if kind == "add" and i != j:
            k = draw(st.integers(-3, 3))
            T = [r[:i] + [r[i] + k * r[j]] + r[i + 1:] for r in T]
        elif kind == "swap":
            for r in T:
                r[i], r[j] = r[j], r[i]
        elif kind == "neg":
            for r in T:
                r[i] = -r[i]
    return T


# ------------------------------------------------------------------ Hermite normal form

def check_hnf(A, H, U):
    A = np.asarray(A)
    m, n = A.shape
    assert H.shape == (m, n) and U.shape == (n, n) and H.dtype == object
    assert as_int_lists(matmul(A, U)) == as_int_lists(H)
    assert abs(det(U)) == 1
    # column echelon form with positive, reduced pivots and zero trailing columns
    Hl = as_int_lists(H)
    prev = -1
    rank = 0
    for c in range(n):
        col = [Hl[i][c] for i in range(m)]
        nz = [i for i in range(m) if col[i]]
        if not nz:
            assert all(not any(Hl[i][cc] for i in range(m)) for cc in range(c, n))
            break
        p = nz[0]
        assert p > prev and col[p] > 0
        assert all(0 <= Hl[p][cc] < col[p] for cc in range(c))
        prev, rank = p, rank + 1
    assert rank == rref_rank(Hl if m else [])


def test_hnf_known():
    H, U = hermite_normal_form([[2, 4, 6], [1, 1, 1]])
    assert as_int_lists(H) == [[2, 0, 0], [0, 1, 0]]
    check_hnf(np.array([[2, 4, 6], [1, 1, 1]]), H, U)


def test_hnf_of_unimodular_is_identity():
    H, U = hermite_normal_form(T_FIG6)
    assert as_int_lists(H) == np.eye(4, dtype=int).tolist()
    assert as_int_lists(U) == TINV_FIG6


def test_rejects_floats():
    with pytest.raises(TypeError):
        hermite_normal_form(np.array([[1.0, 2.0]]))
    with pytest.raises(TypeError):
        integer_null_space([[1, 0.5]])


@settings(max_examples=150, deadline=None)
@given(int_matrices())
def test_hnf_properties(A):
    H, U = hermite_normal_form(A)
    check_hnf(A, H, U)


# ------------------------------------------------------------------ null spaces

def test_null_space_paper():
    assert integer_null_space(M12) == [(0, 0, 0, 1)]
    assert integer_null_space(M14) == [(1, 0, 0, 0), (0, 0, 0, 1)]
    assert integer_null_space(M13) == []
    assert reuse_dims([M12, M13, M14]) == (0, 3)


def test_null_space_edge_cases():
    assert integer_null_space(np.zeros((0, 3), dtype=np.int64)) == [(1, 0, 0), (0, 1, 0), (0, 0, 1)]
    assert integer_null_space([[2, 4]]) == [(2, -1)]      # primitive, not (4, -2)
    assert integer_null_space([[0, 0]]) == [(1, 0), (0, 1)]
    with pytest.raises(ValueError):
        integer_null_space([])


@settings(max_examples=150, deadline=None)
@given(int_matrices())
def test_null_space_properties(M):
    m, d = M.shape
    basis = integer_null_space(M)
    for x in basis:
        assert len(x) == d and all(type(v) is int for v in x)
        assert vec_gcd(x) == 1
        assert all(v == 0 for v in matmul(M, np.array(x, dtype=object)))
    rank_m = rref_rank(M.tolist()) if m else 0
    assert len(basis) == d - rank_m
    if basis:
        assert rref_rank(basis) == len(basis)     # independent, so spans the rational kernel


@settings(max_examples=60, deadline=None)
@given(int_matrices(max_rows=3, max_cols=3))
def test_null_space_is_lattice_basis(M):
    """Every small integer kernel vector is an *integer* combination of the basis."""
    d = M.shape[1]
    basis = integer_null_space(M)
    for x in product(range(-2, 3), repeat=d):
        if any(int(v) for v in M @ np.array(x)):
            continue
        # solve sum c_i b_i = x over Q (unique: basis independent); coefficients must be ints
        k = len(basis)
        if k == 0:
            assert not any(x)
            continue
        rows = [[Fraction(basis[j][i]) for j in range(k)] + [Fraction(x[i])] for i in range(d)]
        assert rref_rank([r[:k] for r in rows]) == rref_rank(rows) == k
        coeffs = _solve(rows, k)
        assert all(c.denominator == 1 for c in coeffs)


def _solve(rows, k):
    A = [list(r) for r in rows]
    piv = []
    r = 0
    for c in range(k):
        p = next(i for i in range(r, len(A)) if A[i][c] != 0)
        A[r], A[p] = A[p], A[r]
        A[r] = [v / A[r][c] for v in A[r]]
        for i in range(len(A)):
            if i != r and A[i][c] != 0:
                f = A[i][c]
                A[i] = [a - f * b for a, b in zip(A[i], A[r])]
        piv.append(c)
        r += 1
    return [A[i][k] for i in range(k)]


# ------------------------------------------------------------------ Lamport hyperplane

def test_hyperplane_figure6():
    # p = [map, scanl, scanl, map]: Table 4 distances for the two scanl dims
    assert lamport_hyperplane([(0, 1, 0, 0), (0, 0, 1, 0)], 4) == (0, 1, 1, 0)


def test_hyperplane_cases():
    assert lamport_hyperplane([], 3) is None
    assert lamport_hyperplane([(1, 1)], 2) == (1, 0)          # tie-break: outer dims first
    assert lamport_hyperplane([(0, 4)], 2) == (0, 1)          # strided scan: distance 4
    assert lamport_hyperplane([(1, -5), (0, 1)], 2) == (6, 1)
    assert lamport_hyperplane([(1, -1), (1, 1)], 2) == (1, 0)
    with pytest.raises(ValueError):
        lamport_hyperplane([(0, -1, 1)], 3)                   # not lexicographically positive
    with pytest.raises(ValueError):
        lamport_hyperplane([(0, 0)], 2)
    with pytest.raises(ValueError):
        lamport_hyperplane([(1, 0)], 3)                       # wrong length
    with pytest.raises(ValueError):
        lamport_hyperplane([(1, -5), (0, 1)], 2, max_sum=6)   # needs sum 7


def _feasible(pi, ds):
    return all(sum(a * b for a, b in zip(pi, d)) >= 1 for d in ds)


@settings(max_examples=120, deadline=None)
@given(lex_positive_distances())
def test_hyperplane_minimal(case):
    ds, dims = case
    pi = lamport_hyperplane(ds, dims)
    assert len(pi) == dims and all(type(a) is int and a >= 0 for a in pi)
    assert _feasible(pi, ds)
    s = sum(pi)
    for cand in _vectors_up_to(s, dims):
        if sum(cand) < s or cand > pi:
            assert not _feasible(cand, ds), (cand, pi)


@pytest.mark.parametrize("dims, limit", [(1, 5), (2, 4), (3, 4)])
def test_hyperplane_search_order(dims, limit):
    """The search meets every vector of sum <= limit once, by increasing sum and, within a
    sum, lexicographically largest first; it returns the first that carries, None if none."""
    seen = []
    assert hyperplane_search(dims, lambda pi: seen.append(pi) and False, limit) is None
    assert seen == sorted((v for v in _vectors_up_to(limit, dims) if sum(v)), key=lambda v: (sum(v), [-x for x in v]))
    for want in seen:
        assert hyperplane_search(dims, lambda pi: pi == want, limit) == want
    if dims > 1:  # pruning on the leading entries: pi[0] = 0 only
        pruned = hyperplane_search(dims, lambda pi: True, limit, viable=lambda prefix, left: prefix[0] == 0)
        assert pruned == (0, 1) + (0,) * (dims - 2)


def _vectors_up_to(s, dims):
    """All non-negative integer vectors of length dims with sum <= s."""
    if dims == 1:
        yield from ((v,) for v in range(s + 1))
        return
    for v in range(s + 1):
        for rest in _vectors_up_to(s - v, dims - 1):
            yield (v,) + rest


# ------------------------------------------------------------------ unimodular completion

def test_completion_figure6():
    pi = lamport_hyperplane([(0, 1, 0, 0), (0, 0, 1, 0)], 4)
    reuse = reuse_dims([M12, M14])
    assert reuse == (0, 3)
    T = complete_unimodular(pi, 4, reuse_dims=reuse)
    assert as_int_lists(T) == T_FIG6
    assert as_int_lists(unimodular_inverse(T)) == TINV_FIG6
    # Table 5: e12 and e13 access maps after reordering
    assert as_int_lists(transform_access(M12, T)) == TINV_FIG6[:3]
    assert as_int_lists(transform_access(M13, T)) == TINV_FIG6


def test_completion_cases():
    assert as_int_lists(complete_unimodular((0, 1, 1, 0), 4)) == \
        [[0, 1, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]]
    # a reuse dim in the hyperplane is kept as its own row when another dim can be replaced
    assert as_int_lists(complete_unimodular((1, 1), 2, reuse_dims=(1,))) == [[1, 1], [0, 1]]
    T = complete_unimodular((2, 3), 2)                        # no +-1 entry: HNF fallback
    assert as_int_lists(T)[0] == [2, 3] and is_unimodular(T)
    T = complete_unimodular((6, 0, 10, 15), 4, reuse_dims=(1,))
    assert as_int_lists(T)[0] == [6, 0, 10, 15] and is_unimodular(T)
    assert as_int_lists(T)[3] == [0, 1, 0, 0]
    with pytest.raises(ValueError):
        complete_unimodular((2, 4), 2)
    with pytest.raises(ValueError):
        complete_unimodular((0, 0), 2)
    with pytest.raises(ValueError):
        complete_unimodular((1, 0), 3)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_completion_properties(data):
    d = data.draw(st.integers(1, 5))
    pi = tuple(data.draw(st.lists(st.integers(-3, 6), min_size=d, max_size=d)))
    if vec_gcd(pi) != 1:
        with pytest.raises(ValueError):
            complete_unimodular(pi, d)
        return
    reuse = data.draw(st.sets(st.integers(0, d - 1)))
    T = complete_unimodular(pi, d, reuse_dims=reuse)
    Tl = as_int_lists(T)
    assert T.shape == (d, d) and Tl[0] == list(pi)
    assert abs(det(Tl)) == 1 and is_unimodular(T)
    assert as_int_lists(matmul(T, unimodular_inverse(T))) == np.eye(d, dtype=int).tolist()
    if any(abs(a) == 1 for a in pi):
        rest = Tl[1:]
        assert all(sorted(r) == [0] * (d - 1) + [1] for r in rest)     # unit rows
        dims = [r.index(1) for r in rest]
        (dropped,) = set(range(d)) - set(dims)
        assert abs(pi[dropped]) == 1                                    # replaced by pi
        flags = [k in reuse for k in dims]
        assert flags == sorted(flags)                                   # reuse dims innermost
        assert [k for k in dims if k in reuse] == sorted(k for k in dims if k in reuse)
        assert [k for k in dims if k not in reuse] == sorted(k for k in dims if k not in reuse)


# ------------------------------------------------------------------ inverse and access maps

def test_is_unimodular():
    assert is_unimodular(T_FIG6)
    assert not is_unimodular([[2, 0], [0, 1]])
    assert not is_unimodular([[1, 2], [2, 4]])
    assert not is_unimodular([[1, 0, 0], [0, 1, 0]])
    with pytest.raises(TypeError):
        is_unimodular([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError):
        unimodular_inverse([[2, 0], [0, 1]])
    with pytest.raises(ValueError):
        transform_access([[1, 0]], [[1, 1], [1, 2], [0, 0]])


@settings(max_examples=150, deadline=None)
@given(unimodular_matrices())
def test_inverse_exact(T):
    assert is_unimodular(T)
    inv = unimodular_inverse(np.array(T, dtype=np.int64))
    n = len(T)
    eye = np.eye(n, dtype=int).tolist()
    assert as_int_lists(matmul(T, inv)) == eye
    assert as_int_lists(matmul(inv, T)) == eye


@settings(max_examples=100, deadline=None)
@given(unimodular_matrices(), st.data())
def test_transform_access_preserves_reads(T, data):
    n = len(T)
    m = data.draw(st.integers(0, 3))
    M = np.array([[data.draw(small) for _ in range(n)] for _ in range(m)], dtype=np.int64)
    M = M.reshape(m, n)
    MT = transform_access(M, T)
    assert MT.shape == (m, n)
    t = np.array([data.draw(st.integers(-5, 5)) for _ in range(n)], dtype=object)
    j = matmul(T, t)
    assert [int(v) for v in matmul(M, t)] == [int(v) for v in matmul(MT, j)]
