"""Back-to-back GEMMs: out = (A @ B) @ C, the intermediate A @ B never materialised whole.

A is cut into row tiles, B and C along the shared dimension N; each output row tile is a
reduction over the N tiles:

    out = as.map a => zip(bs, cs).reduce 0, (acc, (b, c)) => acc + (a @ b) @ c

Types: as [MT]float32[tm, K], bs [NT]float32[K, tn], cs [NT]float32[tn, P]
-> [MT]float32[tm, P]  (M = MT * tm rows, N = NT * tn; the paper uses K = P = 64).
"""
from __future__ import annotations

import numpy as np

import polyft as ft

from ._common import check_divisible, randn, sizes

DESCRIPTION = "back-to-back GEMMs (A @ B) @ C: map over A's row tiles of a reduce over N tiles"

PRESETS = {
    "small": {"M": 16, "N": 24, "K": 8, "P": 8, "tm": 4, "tn": 8},
    # Table 6: K = P = 64; M, N as in the authors' benchmark ([16384, 64] @ [64, 256] @ [256, 64])
    "paper": {"M": 16384, "N": 256, "K": 64, "P": 64, "tm": 64, "tn": 64},
}


def program(a_tiles, b_tiles, c_tiles):
    """[MT]float32[tm, K], [NT]float32[K, tn], [NT]float32[tn, P] -> [MT]float32[tm, P]."""
    tm = a_tiles.element_shape[0]
    P = c_tiles.element_shape[-1]
    d_tiles = a_tiles.map(
        lambda a: ft.reduce(lambda acc, bc: acc + (a @ bc[0]) @ bc[1],
                            ft.zip(b_tiles, c_tiles), ft.zeros((tm, P))))
    return d_tiles


def matrices(preset="small", seed=0, **overrides):
    """The whole matrices A [M, K], B [K, N], C [N, P] behind `inputs` (same seed, same data)."""
    s = sizes("b2b_gemm", PRESETS, preset, overrides)
    M, N, K, P = s["M"], s["N"], s["K"], s["P"]
    rng = np.random.default_rng(seed)
    a = randn(rng, (M, K))
    b = randn(rng, (K, N), 1.0 / np.sqrt(K))
    c = randn(rng, (N, P), 1.0 / np.sqrt(N))
    return a, b, c


def inputs(preset="small", seed=0, **overrides):
    s = sizes("b2b_gemm", PRESETS, preset, overrides)
    M, N, K, P, tm, tn = s["M"], s["N"], s["K"], s["P"], s["tm"], s["tn"]
    check_divisible("b2b_gemm", "M", M, tm)
    check_divisible("b2b_gemm", "N", N, tn)
    a, b, c = matrices(preset, seed, **overrides)
    a_tiles = a.reshape(M // tm, tm, K)
    b_tiles = np.ascontiguousarray(b.reshape(K, N // tn, tn).transpose(1, 0, 2))
    c_tiles = c.reshape(N // tn, tn, P)
    return tuple(ft.FractalTensor.from_numpy(t, depth=1) for t in (a_tiles, b_tiles, c_tiles))


def specs(preset="small", **overrides):
    s = sizes("b2b_gemm", PRESETS, preset, overrides)
    K, P, tm, tn = s["K"], s["P"], s["tm"], s["tn"]
    return (ft.spec(f"[MT]float32[{tm}, {K}]"), ft.spec(f"[NT]float32[{K}, {tn}]"),
            ft.spec(f"[NT]float32[{tn}, {P}]"))
