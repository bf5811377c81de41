"""BigBird block-sparse attention, the paper's Listing 4 (without the random part).

Sequences are cut into nb blocks of bs tokens. Query block i (2 <= i < nb-2) attends to its
window of 3 key blocks (i-1, i, i+1, from `shifted_slide(3)`) and to the global first and last
key blocks; the scores [gl : w : gr] go through one softmax, then the values of the same blocks
are weighted and summed:

    wks, wvs = ks.shifted_slide(3), vs.shifted_slide(3)
    wqk  = zip(qs[2:-2], wks[2:-2]).map (q, wk) => wk.map k => q @ k.T
    gqk1 = qs[2:-2].map q => q @ ks[0].T ;   gqk2 = qs[2:-2].map q => q @ ks[-1].T
    scores = zip(gqk1, wqk, gqk2).map (gl, w, gr) => softmax(concat([gl, concat(w), gr]))
    go1 = scores.map s => s[:, :bs] @ vs[0] ;  go2 = scores.map s => s[:, 4bs:] @ vs[-1]
    wo  = zip(scores, wvs[2:-2]).map (s, wv) => s[:, bs:4bs] @ concat(wv)
    os  = zip(go1, go2, wo).map (a, b, c) => a + b + c

(Listing 4 writes q@k for q@k.T and gy1/gy2/oy for go1/go2/wo.) Queries are scaled by
1/sqrt(d) as in the official implementation.

Types: qss, kss, vss [B, NB]float32[bs, d] -> [B, NB - 4]float32[bs, d] (query blocks 2..nb-3).
"""
from __future__ import annotations

import math

import numpy as np

import polyft as ft

from ._common import randn, sizes

DESCRIPTION = "BigBird (Listing 4): windowed attention via shifted_slide(3) plus global blocks"

PRESETS = {
    "small": {"B": 2, "nb": 8, "bs": 4, "d": 8},
    # Listing 4: [16, 64] blocks of [32, 512]
    "paper": {"B": 16, "nb": 64, "bs": 32, "d": 512},
}


def program(qss, kss, vss):
    """[B, NB]float32[bs, d] (three times) -> [B, NB - 4]float32[bs, d]."""
    bs, d = qss.element_shape
    scale = 1.0 / math.sqrt(d)

    def sequence(qs, ks, vs):
        wks, wvs = ks.shifted_slide(3), vs.shifted_slide(3)
        qm = qs[2:-2]
        # windowed attention: each query block against its 3 neighbouring key blocks
        wqk = ft.map(lambda q, wk: wk.map(lambda k: (q * scale) @ k.T), qm, wks[2:-2])
        # left and right global attention
        gqk1 = qm.map(lambda q: (q * scale) @ ks[0].T)
        gqk2 = qm.map(lambda q: (q * scale) @ ks[-1].T)
        scores = ft.map(
            lambda gl, w, gr: ft.softmax(ft.concat((gl, ft.concat(w, axis=1), gr), axis=1), axis=-1),
            gqk1, wqk, gqk2)
        # weighted values
        go1 = scores.map(lambda s: s[:, :bs] @ vs[0])
        go2 = scores.map(lambda s: s[:, 4 * bs:] @ vs[-1])
        wo = ft.map(lambda s, wv: s[:, bs:4 * bs] @ ft.concat(wv, axis=0), scores, wvs[2:-2])
        return ft.map(lambda a, b, c: a + b + c, go1, go2, wo)

    oss = ft.map(sequence, qss, kss, vss)
    return oss


def inputs(preset="small", seed=0, **overrides):
    s = sizes("bigbird", PRESETS, preset, overrides)
    B, nb, bs, d = s["B"], s["nb"], s["bs"], s["d"]
    rng = np.random.default_rng(seed)
    return tuple(ft.FractalTensor.from_numpy(randn(rng, (B, nb, bs, d)), depth=2) for _ in range(3))


def specs(preset="small", **overrides):
    s = sizes("bigbird", PRESETS, preset, overrides)
    bs, d = s["bs"], s["d"]
    return tuple(ft.spec(f"[B, NB]float32[{bs}, {d}]") for _ in range(3))
