"""Stacked LSTM, the paper's Listing 2 (with scanl over the layers, so every layer is returned).

    hsss, csss = xss.map xs =>                                 // every sentence
        zip(wss, uss, bss).scanl (xs, 0s), ((hs, _), (ws, us, bs)) =>   // every layer
            hs.scanl (0, 0), ((h, c), x) =>                    // every time step
                gs = zip(ws, us, bs).map (w, u, b) => x @ w + h @ u + b
                i, f, o = sigmoid(gs[0]), sigmoid(gs[1]), sigmoid(gs[2])
                c = f * c + i * tanh(gs[3])
                h = o * tanh(c)

Types: xss [N, L]float32[1, H]; per layer and gate wss, uss [D, 4]float32[H, H] and
bss [D, 4]float32[1, H]; result (hsss, csss), both [N, D, L]float32[1, H].

Gate order in the 4-lists is Listing 2's (i, f, o, g): the first three go through a sigmoid,
the last (the cell candidate) through tanh. torch.nn.LSTM stacks its gates as (i, f, g, o):
our gate j is torch's block (0, 1, 3, 2)[j], with wss[d][j] = weight_ih_l{d}[block].T,
uss[d][j] = weight_hh_l{d}[block].T and bss[d][j] = (bias_ih + bias_hh)[block].
The input size equals the hidden size (a layer's state is the layer below's output sequence).
"""
from __future__ import annotations

import numpy as np

import polyft as ft

from ._common import randn, sizes

DESCRIPTION = "stacked LSTM (Listing 2): map over the batch, scanl over layers, scanl over time"

PRESETS = {
    "small": {"N": 2, "D": 3, "L": 5, "H": 8},
    # Table 6: batch 256, depth 32; hidden 256 as Figure 8's "middle"
    "paper": {"N": 256, "D": 32, "L": 64, "H": 256},
    "middle": {"N": 256, "D": 32, "L": 64, "H": 256},
    "large": {"N": 256, "D": 32, "L": 64, "H": 1024},
}

TORCH_GATE = (0, 1, 3, 2)  # our gate j (i, f, o, g) is torch's gate block TORCH_GATE[j]


def lstm_cell(state, x, ws, us, bs):
    """One LSTM step: state (h, c), input x [1, H]; ws, us, bs the 4 gates' weights (i, f, o, g)."""
    h, c = state
    gs = ft.map(lambda w, u, b: x @ w + h @ u + b, ws, us, bs)
    i, f, o = ft.sigmoid(gs[0]), ft.sigmoid(gs[1]), ft.sigmoid(gs[2])
    c = f * c + i * ft.tanh(gs[3])
    h = o * ft.tanh(c)
    return h, c


def program(xss, wss, uss, bss):
    """xss [N, L]float32[1, H]; wss, uss [D, 4]float32[H, H]; bss [D, 4]float32[1, H]
    -> (hsss, csss), both [N, D, L]float32[1, H]."""
    H = xss.element_shape[-1]

    def layer(state, params):
        xs, _ = state  # the layer below's hidden states are this layer's inputs
        ws, us, bs = params
        zero = ft.zeros((1, H))
        return xs.scanl(lambda s, x: lstm_cell(s, x, ws, us, bs), (zero, zero))  # (hs, cs)

    def sentence(xs):
        # the state of the layer scan is a layer's (hs, cs); below layer 0 there is no cell state
        return ft.scanl(layer, ft.zip(wss, uss, bss), (xs, xs.map(ft.zeros_like)))

    hsss, csss = xss.map(sentence)
    return hsss, csss


def tiled_wavefront(steps: int = 4) -> str:
    """A schedule by hand (for `ft.compile(..., coarsen=True)`, whose statements are the gates
    S_b3 and the cell S_b0): each layer runs its time steps in tiles of `steps`, the tiles in
    a wavefront (layer j's tile t at time j + t), so a thread keeps one layer's weights for a
    tile's steps where the auto schedule's wavefront moves to the next layer every step."""
    t = f"j + floor(k/{steps})"
    return f"{{ S_b0[i, j, k] -> [{t}, j, k, i, 1, 0]; S_b3[i, j, k, l] -> [{t}, j, k, i, 0, l] }}"


def inputs(preset="small", seed=0, **overrides):
    s = sizes("stacked_lstm", PRESETS, preset, overrides)
    return lstm_inputs(s["N"], s["D"], s["L"], s["H"], seed)


def lstm_inputs(N, D, L, H, seed):
    """Sequences [N, L] of [1, H] and D layers of gate weights (also the dilated LSTM's)."""
    rng = np.random.default_rng(seed)
    xss = ft.FractalTensor.from_numpy(randn(rng, (N, L, 1, H)), depth=2)
    wss = ft.FractalTensor.from_numpy(randn(rng, (D, 4, H, H), 1.0 / np.sqrt(H)), depth=2)
    uss = ft.FractalTensor.from_numpy(randn(rng, (D, 4, H, H), 1.0 / np.sqrt(H)), depth=2)
    bss = ft.FractalTensor.from_numpy(randn(rng, (D, 4, 1, H), 0.1), depth=2)
    return xss, wss, uss, bss


def specs(preset="small", **overrides):
    H = sizes("stacked_lstm", PRESETS, preset, overrides)["H"]
    return (ft.spec(f"[N, L]float32[1, {H}]"), ft.spec(f"[D, 4]float32[{H}, {H}]"),
            ft.spec(f"[D, 4]float32[{H}, {H}]"), ft.spec(f"[D, 4]float32[1, {H}]"))
