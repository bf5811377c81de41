"""Comparison helpers shared by the tests and the experiments: relative error in norm."""
from __future__ import annotations

import numpy as np


def _as_array(x) -> np.ndarray:
    if hasattr(x, "to_numpy"):
        x = x.to_numpy()
    if isinstance(x, (tuple, list)):
        return np.concatenate([_as_array(v).ravel() for v in x]) if x else np.zeros(0)
    return np.asarray(x, dtype=np.float64)


def rel_error(actual, expected) -> float:
    """||actual - expected|| / ||expected|| (plain norm when expected is zero)."""
    a, e = _as_array(actual), _as_array(expected)
    if a.shape != e.shape:
        raise AssertionError(f"shapes differ: {a.shape} vs {e.shape}")
    denom = float(np.linalg.norm(e))
    err = float(np.linalg.norm(a - e))
    return err / denom if denom > 0 else err


def assert_close(actual, expected, tol: float = 1e-5) -> None:
    err = rel_error(actual, expected)
    if not err < tol:
        raise AssertionError(f"relative error {err:.3e} >= {tol:.0e}")
