"""Stacked dilated LSTM (Chang et al., NeurIPS 2017), dilations 1, 2, 4, ... per layer.

Layer k (dilation d = 2**k) runs an LSTM whose step t reads the state of step t - d. Written
with the constantly strided access: `xs.strided_split(d)` views the sequence as d interleaved
subsequences (ys[r][j] = xs[r + j*d]); each is scanned by an ordinary LSTM, and
`.strided_merge()` puts the outputs back in time order for the next layer:

    for k, (ws, us, bs) in enumerate(layers):     // a Python loop: each layer has its own d
        xs = xs.strided_split(2**k)
               .map(sub => sub.scanl((0, 0), lstm_cell).hs)
               .strided_merge()

Types: xss [N, L]float32[1, H]; wss, uss [D, 4]float32[H, H]; bss [D, 4]float32[1, H], gates
(i, f, o, g) as in stacked_lstm; result: the top layer's outputs [N, L]float32[1, H].
D is concrete (it fixes the dilations) and L must be a multiple of 2**(D-1).
"""
from __future__ import annotations

import polyft as ft

from ._common import check_divisible, sizes
from .stacked_lstm import lstm_cell, lstm_inputs

DESCRIPTION = "stacked dilated LSTM: per layer strided_split(2**k), scanl per subsequence, strided_merge"

PRESETS = {
    "small": {"N": 2, "D": 3, "L": 8, "H": 8},
    # Table 6: batch 256, dilations 1..32 (6 layers)
    "paper": {"N": 256, "D": 6, "L": 64, "H": 256},
    "middle": {"N": 256, "D": 6, "L": 64, "H": 256},
    "large": {"N": 256, "D": 6, "L": 64, "H": 1024},
}


def dilated_layer(xs, dilation, ws, us, bs):
    """One dilated LSTM layer over the sequence xs [L]float32[1, H]."""
    zero = ft.zeros((1, xs.element_shape[-1]))

    def subsequence(sub):
        hs, _ = sub.scanl(lambda s, x: lstm_cell(s, x, ws, us, bs), (zero, zero))
        return hs

    return xs.strided_split(dilation).map(subsequence).strided_merge()


def program(xss, wss, uss, bss):
    """xss [N, L]float32[1, H]; wss, uss [D, 4]float32[H, H]; bss [D, 4]float32[1, H]
    -> [N, L]float32[1, H] (the top layer's hidden states)."""
    def sentence(xs):
        for k in range(len(wss)):
            xs = dilated_layer(xs, 2 ** k, wss[k], uss[k], bss[k])
        return xs

    ysss = xss.map(sentence)
    return ysss


def inputs(preset="small", seed=0, **overrides):
    s = sizes("dilated_rnn", PRESETS, preset, overrides)
    N, D, L, H = s["N"], s["D"], s["L"], s["H"]
    check_divisible("dilated_rnn", "L", L, 2 ** (D - 1))
    return lstm_inputs(N, D, L, H, seed)


def specs(preset="small", **overrides):
    s = sizes("dilated_rnn", PRESETS, preset, overrides)
    D, H = s["D"], s["H"]
    return (ft.spec(f"[N, L]float32[1, {H}]"), ft.spec(f"[{D}, 4]float32[{H}, {H}]"),
            ft.spec(f"[{D}, 4]float32[{H}, {H}]"), ft.spec(f"[{D}, 4]float32[1, {H}]"))
