"""Stacked 2-D grid RNN over a source x target grid.

Layer 0's input at cell (i, j) combines source token i and target token j, taken from
`ft.product(xs, ys)`: g[i][j] = x_i @ wx + y_j @ wy. Each layer scans the grid's rows; inside
a row it scans the columns, reading the cell to its left (h_left, the inner scan's state) and
the cell above (h_up, from the previous row, the outer scan's state):

    h[i][j] = tanh(g[i][j] @ w + h[i][j-1] @ u1 + h[i-1][j] @ u2 + b)

with zeros outside the grid. Layers are stacked with a scanl over the layer weights whose
state is the whole grid (layer d's input is layer d-1's output), and the batch is mapped
outermost.

Types: xss [N, L1]float32[1, H], yss [N, L2]float32[1, H], wx, wy float32[H, H],
ws, u1s, u2s [D]float32[H, H], bs [D]float32[1, H] -> [N, D, L1, L2]float32[1, H].
"""
from __future__ import annotations

import numpy as np

import polyft as ft

from ._common import randn, sizes

DESCRIPTION = "stacked grid RNN: product of source and target, scanl over rows of a scanl over columns"

PRESETS = {
    "small": {"N": 2, "D": 2, "L1": 3, "L2": 4, "H": 8},
    # Table 6: batch 256, depth 32; the authors' benchmark uses a 10 x 10 grid
    "paper": {"N": 256, "D": 32, "L1": 10, "L2": 10, "H": 256},
    "middle": {"N": 256, "D": 32, "L1": 10, "L2": 10, "H": 256},
    "large": {"N": 256, "D": 32, "L1": 10, "L2": 10, "H": 1024},
}


def program(xss, yss, wx, wy, ws, u1s, u2s, bs):
    """xss [N, L1]float32[1, H], yss [N, L2]float32[1, H], wx, wy float32[H, H],
    ws, u1s, u2s [D]float32[H, H], bs [D]float32[1, H] -> [N, D, L1, L2]float32[1, H]."""
    H = xss.element_shape[-1]

    def pair(xs, ys):
        zero = ft.zeros((1, H))
        zero_row = ys.map(lambda _: ft.zeros((1, H)))  # the row above the first row
        g0 = ft.map(lambda row: ft.map(lambda xy: xy[0] @ wx + xy[1] @ wy, row),
                    ft.product(xs, ys))

        def layer(g, params):
            w, u1, u2, b = params

            def cell(h_left, up_x):
                h_up, x = up_x
                return ft.tanh(x @ w + h_left @ u1 + h_up @ u2 + b)

            return g.scanl(lambda prev_row, row: ft.scanl(cell, ft.zip(prev_row, row), zero),
                           zero_row)

        return ft.scanl(layer, ft.zip(ws, u1s, u2s, bs), g0)

    hssss = ft.map(pair, xss, yss)
    return hssss


def inputs(preset="small", seed=0, **overrides):
    s = sizes("grid_rnn", PRESETS, preset, overrides)
    N, D, L1, L2, H = s["N"], s["D"], s["L1"], s["L2"], s["H"]
    rng = np.random.default_rng(seed)
    sc = 1.0 / np.sqrt(H)
    xss = ft.FractalTensor.from_numpy(randn(rng, (N, L1, 1, H)), depth=2)
    yss = ft.FractalTensor.from_numpy(randn(rng, (N, L2, 1, H)), depth=2)
    wx, wy = randn(rng, (H, H), sc), randn(rng, (H, H), sc)
    ws = ft.FractalTensor.from_numpy(randn(rng, (D, H, H), sc), depth=1)
    u1s = ft.FractalTensor.from_numpy(randn(rng, (D, H, H), sc), depth=1)
    u2s = ft.FractalTensor.from_numpy(randn(rng, (D, H, H), sc), depth=1)
    bs = ft.FractalTensor.from_numpy(randn(rng, (D, 1, H), 0.1), depth=1)
    return xss, yss, wx, wy, ws, u1s, u2s, bs


def specs(preset="small", **overrides):
    H = sizes("grid_rnn", PRESETS, preset, overrides)["H"]
    return (ft.spec(f"[N, L1]float32[1, {H}]"), ft.spec(f"[N, L2]float32[1, {H}]"),
            ft.spec(f"float32[{H}, {H}]"), ft.spec(f"float32[{H}, {H}]"),
            ft.spec(f"[D]float32[{H}, {H}]"), ft.spec(f"[D]float32[{H}, {H}]"),
            ft.spec(f"[D]float32[{H}, {H}]"), ft.spec(f"[D]float32[1, {H}]"))
