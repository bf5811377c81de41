"""Stacked RNN, the paper's Listing 1.

    ysss = xss.map xs =>                      // every sentence of the batch
        ws.scanl xs, (hs, w) =>               // every layer; state: the layer below's outputs
            hs.scanl 0, (s, x) =>             // every time step; state: the previous output
                x @ w + s

Types: xss [N, L]float32[1, H], ws [D]float32[H, H] -> ysss [N, D, L]float32[1, H]
(ysss[n][d][t] is layer d's output at step t). As in the listing the cell is linear (each
layer is a running sum of the layer below's outputs), so the values grow with L and D even with
the weights scaled by 1/sqrt(H): small sizes stay O(10), the paper preset reaches ~1e25 at the
top layer (still finite in float32; compare with relative errors).
"""
from __future__ import annotations

import numpy as np

import polyft as ft

from ._common import randn, sizes

DESCRIPTION = "stacked RNN (Listing 1): map over the batch, scanl over layers, scanl over time"

PRESETS = {
    "small": {"N": 2, "D": 3, "L": 5, "H": 8},
    # Listing 1's hidden size 512 with Table 6's stacked-RNN batch 256 and depth 32
    "paper": {"N": 256, "D": 32, "L": 64, "H": 512},
    "middle": {"N": 256, "D": 32, "L": 64, "H": 256},
    "large": {"N": 256, "D": 32, "L": 64, "H": 1024},
}


def program(xss, ws):
    """xss: [N, L]float32[1, H], ws: [D]float32[H, H] -> [N, D, L]float32[1, H]."""
    H = xss.element_shape[-1]
    ysss = xss.map(
        lambda xs: ws.scanl(
            lambda hs, w: hs.scanl(lambda s, x: x @ w + s, ft.zeros((1, H))),
            xs))
    return ysss


def inputs(preset="small", seed=0, **overrides):
    s = sizes("stacked_rnn", PRESETS, preset, overrides)
    N, D, L, H = s["N"], s["D"], s["L"], s["H"]
    rng = np.random.default_rng(seed)
    xss = ft.FractalTensor.from_numpy(randn(rng, (N, L, 1, H)), depth=2)
    ws = ft.FractalTensor.from_numpy(randn(rng, (D, H, H), 1.0 / np.sqrt(H)), depth=1)
    return xss, ws


def specs(preset="small", **overrides):
    H = sizes("stacked_rnn", PRESETS, preset, overrides)["H"]
    return (ft.spec(f"[N, L]float32[1, {H}]"), ft.spec(f"[D]float32[{H}, {H}]"))
