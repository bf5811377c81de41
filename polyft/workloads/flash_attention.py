"""Flash attention, the paper's Listing 3 (with the online-softmax update written correctly).

For every batch, head and query tile q [tq, d], a reduction over the key/value tiles keeps the
running row maximum m, the running softmax denominator l and the unnormalised output o:

    s = (q / sqrt(d)) @ k.T                 m' = max(m, rowmax(s))
    p = exp(s - m')                         a  = exp(m - m')
    l' = a * l + rowsum(p)                  o' = a * o + p @ v

starting from (-inf, 0, 0); a final map divides o by l. (Listing 3 divides by the old sum s
inside the loop; keeping o unnormalised and dividing once is FlashAttention-2's form.)

Types: qsss [B, NH, TQ]float32[tq, d], ksss, vsss [B, NH, TK]float32[tk, d]
-> [B, NH, TQ]float32[tq, d]. (The paper preset's inputs take 2.5 GB: use its specs, or
override B / NH for data.)
"""
from __future__ import annotations

import math

import numpy as np

import polyft as ft

from ._common import check_divisible, randn, sizes

DESCRIPTION = "flash attention (Listing 3): online softmax as a reduce over key/value tiles"

PRESETS = {
    "small": {"B": 2, "NH": 2, "Lq": 8, "Lk": 12, "tq": 4, "tk": 4, "d": 8},
    # Listing 3: batch 32, 16 heads, 2048 queries, 4096 keys, tiles of [32, 128]
    "paper": {"B": 32, "NH": 16, "Lq": 2048, "Lk": 4096, "tq": 32, "tk": 32, "d": 128},
}


def program(qsss, ksss, vsss):
    """[B, NH, TQ]float32[tq, d], [B, NH, TK]float32[tk, d] (twice) -> [B, NH, TQ]float32[tq, d]."""
    tq, d = qsss.element_shape
    scale = 1.0 / math.sqrt(d)

    def attend(q, ks, vs):
        q = q * scale

        def step(state, kv):
            m, l, o = state
            k, v = kv
            s = q @ k.T
            m_new = ft.maximum(m, ft.max(s, axis=1, keepdims=True))
            p = ft.exp(s - m_new)
            alpha = ft.exp(m - m_new)
            return m_new, alpha * l + ft.sum(p, axis=1, keepdims=True), alpha * o + p @ v

        init = (ft.full((tq, 1), -np.inf), ft.zeros((tq, 1)), ft.zeros((tq, d)))
        return ft.reduce(step, ft.zip(ks, vs), init)

    def head(qs, ks, vs):
        _, ls, outs = qs.map(lambda q: attend(q, ks, vs))
        return ft.map(lambda l, o: o / l, ls, outs)

    osss = ft.map(lambda qss, kss, vss: ft.map(head, qss, kss, vss), qsss, ksss, vsss)
    return osss


def inputs(preset="small", seed=0, **overrides):
    s = sizes("flash_attention", PRESETS, preset, overrides)
    B, NH, Lq, Lk, tq, tk, d = (s[k] for k in ("B", "NH", "Lq", "Lk", "tq", "tk", "d"))
    check_divisible("flash_attention", "Lq", Lq, tq)
    check_divisible("flash_attention", "Lk", Lk, tk)
    rng = np.random.default_rng(seed)
    q = randn(rng, (B, NH, Lq // tq, tq, d))
    k = randn(rng, (B, NH, Lk // tk, tk, d))
    v = randn(rng, (B, NH, Lk // tk, tk, d))
    return tuple(ft.FractalTensor.from_numpy(t, depth=3) for t in (q, k, v))


def specs(preset="small", **overrides):
    s = sizes("flash_attention", PRESETS, preset, overrides)
    tq, tk, d = s["tq"], s["tk"], s["d"]
    return (ft.spec(f"[B, NH, TQ]float32[{tq}, {d}]"), ft.spec(f"[B, NH, TK]float32[{tk}, {d}]"),
            ft.spec(f"[B, NH, TK]float32[{tk}, {d}]"))
