"""Exact integer linear algebra for access reordering (FractalTensor §5.2).

Reordering finds a unimodular T so that ``j = T t`` runs a block node's iterations with one
sequential dimension (Lamport's hyperplane ``pi``, the first row of T) and the dimensions that
carry data reuse (null spaces of the access matrices) innermost; access maps become
``A(j) = (M T^-1) j + o``.  Everything here is integer-only: a float round-off in T or T^-1
would silently change which array element an iteration reads.

Conventions:

* matrices come back as 2-D ``numpy.ndarray`` of ``dtype=object`` holding Python ints (no
  overflow, exact ``@``); inputs may be nested lists or integer numpy arrays;
* vectors come back as tuples of Python ints (hashable, easy to compare);
* float or other non-integer entries are rejected with ``TypeError``; ``bool`` counts as an
  integer only inside numpy integer arrays, never as a Python ``bool`` (it is almost always a bug).
"""
from __future__ import annotations

import numbers
from math import gcd
from typing import Callable, Iterable, Sequence

import numpy as np

__all__ = [
    "hermite_normal_form",
    "integer_null_space",
    "reuse_dims",
    "hyperplane_search",
    "lamport_hyperplane",
    "complete_unimodular",
    "is_unimodular",
    "unimodular_inverse",
    "transform_access",
]


# --------------------------------------------------------------------------------------------
# helpers

def _as_int(x) -> int:
    """One exact integer entry; floats are refused even when integral (they are never exact)."""
    if isinstance(x, bool):
        raise TypeError(f"boolean entry {x!r} where an integer was expected")
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, numbers.Rational) and x.denominator == 1:   # Fraction(3, 1)
        return int(x.numerator)
    raise TypeError(f"non-integer entry {x!r} ({type(x).__name__}); use ints, not floats")


def _as_matrix(A, ncols: int | None = None) -> list[list[int]]:
    """A as a list of rows of Python ints; a 2-D numpy array may have zero rows."""
    if isinstance(A, np.ndarray):
        if A.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {A.shape}")
        if A.dtype.kind == "b":
            A = A.astype(np.int64)
        rows = [[_as_int(v) for v in row] for row in A.tolist()] if A.shape[0] else []
        n = A.shape[1]
    else:
        rows = [[_as_int(v) for v in row] for row in A]
        n = len(rows[0]) if rows else ncols
        if n is None:
            raise ValueError("empty matrix given as a list: its column count is unknown; "
                             "pass a numpy array of shape (0, d)")
        if any(len(r) != n for r in rows):
            raise ValueError("ragged matrix: rows of different lengths")
    if ncols is not None and n != ncols:
        raise ValueError(f"expected {ncols} columns, got {n}")
    return rows


def _ncols(A, rows: list[list[int]]) -> int:
    return A.shape[1] if isinstance(A, np.ndarray) else len(rows[0])


def _to_array(rows: list[list[int]], m: int, n: int) -> np.ndarray:
    out = np.empty((m, n), dtype=object)
    for i in range(m):
        for j in range(n):
            out[i, j] = rows[i][j]
    return out


def _egcd(a: int, b: int) -> tuple[int, int, int]:
    """(g, x, y) with a*x + b*y = g = gcd(a, b) >= 0."""
    x0, y0, x1, y1 = 1, 0, 0, 1
    while b:
        q, a, b = a // b, b, a % b
        x0, x1 = x1, x0 - q * x1
        y0, y1 = y1, y0 - q * y1
    if a < 0:
        a, x0, y0 = -a, -x0, -y0
    return a, x0, y0


def _hnf_rows(H: list[list[int]], n: int) -> tuple[list[list[int]], list[list[int]], int]:
    """In-place column HNF of H (m x n rows); returns (H, U, rank) with A U = H."""
    m = len(H)
    U = [[int(i == j) for j in range(n)] for i in range(n)]

    def colop(M, r, j, a, b, c, d):
        # (col_r, col_j) <- (a col_r + c col_j, b col_r + d col_j)
        for row in M:
            x, y = row[r], row[j]
            row[r], row[j] = a * x + c * y, b * x + d * y

    r = 0
    for i in range(m):
        if r == n:
            break
        for j in range(r + 1, n):
            b = H[i][j]
            if b == 0:
                continue
            a = H[i][r]
            g, x, y = _egcd(a, b)
            # [[x, -b/g], [y, a/g]] has determinant (a x + b y)/g = 1: unimodular
            for M in (H, U):
                colop(M, r, j, x, -b // g, y, a // g)
        p = H[i][r]
        if p == 0:
            continue                      # no pivot in this row
        if p < 0:
            for M in (H, U):
                for row in M:
                    row[r] = -row[r]
            p = -p
        for c in range(r):                # reduce left of the pivot into [0, p)
            q = H[i][c] // p
            if q:
                for M in (H, U):
                    for row in M:
                        row[c] -= q * row[r]
        r += 1
    return H, U, r


# --------------------------------------------------------------------------------------------
# Hermite normal form and null spaces

def hermite_normal_form(A) -> tuple[np.ndarray, np.ndarray]:
    """Column-style Hermite normal form: returns ``(H, U)`` with ``A @ U == H``, U unimodular.

    H (m x n) is in column echelon form: the first ``rank`` columns carry strictly moving-down
    pivots, each pivot positive, entries of a pivot's row left of it reduced into ``[0, pivot)``,
    and the last ``n - rank`` columns are zero.  This form is unique for the lattice spanned by
    A's columns, so it is a canonical answer.  Why column style: the trailing ``n - rank``
    columns of U are then a lattice basis of A's integer null space (used by
    :func:`integer_null_space`), and for a unimodular A the form is the identity, so U = A^-1
    (used by :func:`unimodular_inverse`).  Only unimodular column operations (extended gcd
    steps, negations, integer column subtractions) are used, so no rational step is needed.
    """
    rows = _as_matrix(A)
    n = _ncols(A, rows)
    m = len(rows)
    H, U, _ = _hnf_rows([list(r) for r in rows], n)
    return _to_array(H, m, n), _to_array(U, n, n)


def integer_null_space(M) -> list[tuple[int, ...]]:
    """A basis of the lattice ``{x in Z^d : M x = 0}``, as a list of primitive integer tuples.

    Why a lattice basis, not just a rational one: iterations ``t1, t2`` read the same element
    exactly when ``t1 - t2`` is an *integer* kernel vector (§5.2), so reuse directions must be
    integral and primitive (gcd 1: the shortest step along that direction).  The basis is the
    trailing columns of U from the column HNF ``M U = H``, brought to the canonical column HNF
    of the kernel lattice: it depends only on the kernel, each vector's first nonzero entry is
    positive, and a kernel spanned by unit vectors comes back as exactly those unit vectors
    (e.g. ``[0, 0, 0, 1]`` for the paper's M_12).  Each vector is primitive because the kernel
    lattice is saturated (``g x`` in it implies ``x`` in it).  A zero-row ``M`` (numpy shape
    ``(0, d)``) gives the d unit vectors; a full-column-rank ``M`` gives ``[]``.
    """
    rows = _as_matrix(M)
    d = _ncols(M, rows)
    _, U, r = _hnf_rows([list(row) for row in rows], d)
    k = d - r
    if k == 0:
        return []
    K = [U[i][r:] for i in range(d)]                # d x k, full column rank
    H, _, rk = _hnf_rows(K, k)
    assert rk == k
    return [tuple(H[i][c] for i in range(d)) for c in range(k)]


def reuse_dims(access_matrices: Iterable) -> tuple[int, ...]:
    """Dimensions k whose unit vector e_k lies in the null space of some access matrix.

    Moving along such a dimension re-reads the same element of that buffer (the paper reads
    this off the null-space bases: ``null(M_12) = <e_3>``, ``null(M_14) = <e_0, e_3>`` give
    dims 0 and 3 of Figure 6).  ``e_k`` is in ``null(M)`` exactly when column k of M is zero,
    so that is what is checked.  Kernel vectors that are not unit vectors (diagonal reuse)
    name no single dimension and are ignored here.  Returns the sorted dims.
    """
    found: set[int] = set()
    for A in access_matrices:
        rows = _as_matrix(A)
        d = _ncols(A, rows)
        found.update(k for k in range(d) if all(row[k] == 0 for row in rows))
    return tuple(sorted(found))


# --------------------------------------------------------------------------------------------
# Lamport's hyperplane

def _lex_positive(v: Sequence[int]) -> bool:
    for x in v:
        if x:
            return x > 0
    return False


def hyperplane_search(dims: int, carries: Callable[[tuple[int, ...]], bool], limit: int, *,
                      viable: Callable[[list[int], int], bool] | None = None) -> tuple[int, ...] | None:
    """The hyperplane search: the non-negative integer ``pi`` (a ``dims``-tuple) with
    ``carries(pi)`` of smallest coefficient sum, at most ``limit``; None if there is none.

    Among equal sums the *lexicographically largest* ``pi`` wins: weight goes on outer dims
    first.  Candidates are enumerated by increasing sum, each sum distributed over the dims
    from the outermost, largest share first.  ``viable(prefix, left)``, if given, prunes:
    False when no ``pi`` starting with the entries ``prefix`` and ``left`` more to
    distribute can carry (branch and bound).  Both reorderings use this one search:
    :func:`lamport_hyperplane` on finitely many distance vectors, and the scheduler on a
    parametric distance set with an ISL test as ``carries``.
    """
    def search(prefix: list[int], rem: int):
        if len(prefix) == dims - 1:
            pi = tuple(prefix + [rem])
            return pi if carries(pi) else None
        for v in range(rem, -1, -1):          # descending: lexicographically largest first
            p = prefix + [v]
            if viable is None or viable(p, rem - v):
                found = search(p, rem - v)
                if found is not None:
                    return found
        return None

    for s in range(1, limit + 1):
        found = search([], s)
        if found is not None:
            return found
    return None


def lamport_hyperplane(distances: Iterable[Sequence[int]], dims: int, *,
                       max_sum: int | None = None) -> tuple[int, ...] | None:
    """Lamport's hyperplane: the schedule ``pi`` with ``pi . d >= 1`` for every distance d.

    ``pi`` (a ``dims``-tuple of non-negative ints) becomes the first row of T: iterations on
    the same hyperplane ``pi . t = c`` are independent, so one sequential loop over c carries
    every dependence and all other dims are parallel (the fully permutable nest of §5.2).
    Returns the vector of smallest coefficient sum ``sum(pi)`` (the fewest wavefront steps per
    unit of each dim); among equal sums the *lexicographically largest* one, i.e. weight is put
    on outer dims first (``[(1, 1)]`` gives ``(1, 0)``, keeping the outer loop sequential as the
    original nest had it).  With no distance vectors returns ``None``: nothing needs a
    sequential dimension.

    Distances must be lexicographically positive integer tuples of length ``dims`` (later
    entries may be negative); otherwise ``ValueError``.  The search (:func:`hyperplane_search`)
    is exact, with branch and bound on the best reachable ``pi . d``, bounded by the sum of a
    constructive solution (choose pi from the innermost dim outwards, each just large enough
    for the distances whose leading entry is there), so a solution always exists within the
    bound.  ``max_sum`` lowers that bound; ``ValueError`` if no pi fits under it.
    """
    ds = [tuple(_as_int(x) for x in d) for d in distances]
    if not ds:
        return None
    if dims < 1:
        raise ValueError(f"dims must be positive, got {dims}")
    for d in ds:
        if len(d) != dims:
            raise ValueError(f"distance vector {d} does not have {dims} entries")
        if not _lex_positive(d):
            raise ValueError(f"distance vector {d} is not lexicographically positive")

    # constructive solution, innermost dim first: its sum bounds the search
    pi_c = [0] * dims
    for k in range(dims - 1, -1, -1):
        need = 0
        for d in ds:
            lead = next(i for i, x in enumerate(d) if x)
            if lead == k:
                inner = sum(pi_c[j] * d[j] for j in range(k + 1, dims))
                need = max(need, -((inner - 1) // d[k]))      # ceil((1 - inner) / d_k)
        pi_c[k] = need
    limit = sum(pi_c) if max_sum is None else min(sum(pi_c), max_sum)

    # best possible later gain per distance: max positive entry strictly after position k
    gain = [[max([0] + [d[j] for j in range(k + 1, dims)]) for k in range(dims)] for d in ds]

    def dot(pi: Sequence[int], d: Sequence[int]) -> int:
        return sum(p * x for p, x in zip(pi, d))

    def carries(pi: tuple[int, ...]) -> bool:
        return all(dot(pi, d) >= 1 for d in ds)

    def viable(prefix: list[int], left: int) -> bool:
        k = len(prefix) - 1
        return all(dot(prefix, d) + left * g[k] >= 1 for d, g in zip(ds, gain))

    found = hyperplane_search(dims, carries, limit, viable=viable)
    if found is None:
        raise ValueError(f"no hyperplane with coefficient sum <= {limit} for distances {ds}")
    return found


# --------------------------------------------------------------------------------------------
# unimodular completion, inverse, transformed access maps

def complete_unimodular(first_row: Sequence[int], d: int,
                        reuse_dims: Iterable[int] = ()) -> np.ndarray:
    """Complete ``pi`` to a d x d unimodular T (first row ``pi``), reuse dims innermost.

    Rule (reproduces the paper's Figure 6):

    1. The hyperplane row replaces one original dim k with ``|pi_k| = 1`` (then T with unit
       rows for all other dims has ``det = +-pi_k = +-1``).  k is the *innermost* such dim that
       carries no reuse; if every candidate carries reuse, the innermost candidate.  Why:
       a reuse dim should survive as its own parallel loop, and replacing the inner of two
       skewed dims is the classic wavefront ``(i, j) -> (i + j, i)`` that keeps the outer loop.
    2. The remaining dims become unit rows, ordered by a *stable partition*: dims without
       reuse first, then the ``reuse_dims``, each group in original order.  Any order with all
       reuse dims inner must invert every (reuse dim, later non-reuse dim) pair of the
       original order; the stable partition inverts exactly those pairs and no others, so it
       has the fewest interchanges.

    Figure 6: dims (t5, t4, t3, t2), ``pi = (0, 1, 1, 0)``, reuse dims (0, 3) from
    ``null(M_12) = <e_3>`` and ``null(M_14) = <e_0, e_3>``: step 1 drops t3 (innermost of t4,
    t3), step 2 orders t4 | t5, t2, giving rows pi, e_1, e_0, e_3, i.e. the paper's
    ``j5 = t4 + t3, j4 = t4, j3 = t5, j2 = t2``.

    If no entry of ``pi`` is +-1 (e.g. ``(2, 3)``), unit rows cannot complete it; the dims in
    pi's support then get rows from the HNF completion ``pi_S U = e_1`` (T_S = U^-1 has first
    row pi_S), placed right after pi, and the dims outside the support get unit rows ordered
    as in step 2.  Requires ``gcd(pi) = 1`` (else no unimodular T has first row pi:
    ``ValueError``); returns a ``dtype=object`` array.
    """
    pi = [_as_int(x) for x in first_row]
    if len(pi) != d:
        raise ValueError(f"first row has {len(pi)} entries, expected {d}")
    g = 0
    for x in pi:
        g = gcd(g, x)
    if g != 1:
        raise ValueError(f"gcd of {tuple(pi)} is {g}, not 1: no unimodular completion")
    reuse = {int(k) for k in reuse_dims}
    if any(not 0 <= k < d for k in reuse):
        raise ValueError(f"reuse dims {sorted(reuse)} out of range for d = {d}")

    def ordered(dims_left: list[int]) -> list[int]:
        return [k for k in dims_left if k not in reuse] + [k for k in dims_left if k in reuse]

    def unit(k: int) -> list[int]:
        return [int(i == k) for i in range(d)]

    unit_dims = [k for k in range(d) if abs(pi[k]) == 1]
    if unit_dims:
        free = [k for k in unit_dims if k not in reuse]
        k = max(free) if free else max(unit_dims)
        rows = [pi] + [unit(j) for j in ordered([j for j in range(d) if j != k])]
        return _to_array(rows, d, d)

    support = [k for k in range(d) if pi[k]]
    _, U, _ = _hnf_rows([[pi[k] for k in support]], len(support))   # pi_S U = (1, 0, ..., 0)
    TS = unimodular_inverse(_to_array(U, len(support), len(support)))
    rows = [pi]
    for r in range(1, len(support)):
        row = [0] * d
        for c, k in enumerate(support):
            row[k] = int(TS[r, c])
        rows.append(row)
    rows += [unit(j) for j in ordered([j for j in range(d) if not pi[j]])]
    return _to_array(rows, d, d)


def is_unimodular(T) -> bool:
    """True iff T is a square integer matrix with ``det T = +-1``.

    Checked exactly through the column HNF (``det H = +-det T``; a square matrix's HNF is the
    identity exactly when it is unimodular), so no float determinant is involved.  Non-square
    gives False; non-integer entries raise ``TypeError``.
    """
    rows = _as_matrix(T)
    n = _ncols(T, rows)
    if len(rows) != n:
        return False
    H, _, r = _hnf_rows([list(row) for row in rows], n)
    return r == n and all(H[i][i] == 1 for i in range(n))


def unimodular_inverse(T) -> np.ndarray:
    """The exact integer inverse of a unimodular T (``dtype=object``); ``ValueError`` if T is not.

    For unimodular T the column HNF is the identity, so ``T U = I`` and ``U = T^-1``: the
    inverse falls out of the same integer column operations, with no rational step.
    """
    rows = _as_matrix(T)
    n = _ncols(T, rows)
    if len(rows) != n:
        raise ValueError(f"not square: {len(rows)} x {n}")
    H, U, r = _hnf_rows([list(row) for row in rows], n)
    if r != n or any(H[i][i] != 1 for i in range(n)):
        raise ValueError("matrix is not unimodular (|det| != 1)")
    return _to_array(U, n, n)


def transform_access(M, T) -> np.ndarray:
    """The access matrix ``M T^-1`` of the reordered nest (``dtype=object``, m x d).

    Iteration t becomes ``j = T t``, so the element read at j is ``M t + o = (M T^-1) j + o``;
    the offset o is unchanged.  T must be d x d unimodular (``ValueError`` otherwise), which
    keeps the new matrix integral.  A zero-row M (numpy shape ``(0, d)``) gives ``(0, d)``.
    """
    Tinv = unimodular_inverse(T)
    d = Tinv.shape[0]
    rows = _as_matrix(M, ncols=d)
    m = len(rows)
    out = [[sum(rows[i][k] * Tinv[k, j] for k in range(d)) for j in range(d)] for i in range(m)]
    return _to_array(out, m, d)
