"""Hand-written torch baselines for the RNN workloads, on the workloads' own inputs.

The per-cell loops are how one writes these models in eager PyTorch: one cell call per
(layer, time step) — or per grid cell — batched over the batch. `torch_lstm` is cuDNN's
interface (torch.nn.LSTM) with the same weights. Each returns what the polyft program
returns, so every baseline is checked against the eager result before it is timed.
"""
from __future__ import annotations

import numpy as np


def _torch():
    import torch
    return torch


def _gates(ws, us, bs):
    """Stack a layer's 4 gates (i, f, o, g) into [H, 4H] / [1, 4H] matrices."""
    t = _torch()
    W = t.from_numpy(np.concatenate([w for w in ws], axis=1))
    U = t.from_numpy(np.concatenate([u for u in us], axis=1))
    b = t.from_numpy(np.concatenate([x for x in bs], axis=1))
    return W, U, b


def _cell(x, h, c, W, U, b):
    t = _torch()
    g = x @ W + h @ U + b
    i, f, o, gg = g.chunk(4, dim=1)
    c = t.sigmoid(f) * c + t.sigmoid(i) * t.tanh(gg)
    h = t.sigmoid(o) * t.tanh(c)
    return h, c


def _layers(wss, uss, bss):
    ws, us, bs = (x.to_numpy() for x in (wss, uss, bss))
    return [_gates(ws[d], us[d], bs[d]) for d in range(ws.shape[0])]


def lstm_cell_loop(xss, wss, uss, bss):
    """stacked_lstm: for each layer, for each step, one batched LSTM cell."""
    t = _torch()
    x = t.from_numpy(xss.to_numpy()[:, :, 0, :])  # [N, L, H]
    N, L, H = x.shape
    hs_all, cs_all = [], []
    with t.no_grad():
        for W, U, b in _layers(wss, uss, bss):
            h = t.zeros(N, H)
            c = t.zeros(N, H)
            hs, cs = [], []
            for step in range(L):
                h, c = _cell(x[:, step], h, c, W, U, b)
                hs.append(h)
                cs.append(c)
            x = t.stack(hs, 1)
            hs_all.append(x)
            cs_all.append(t.stack(cs, 1))
    return t.stack(hs_all, 1).numpy()[:, :, :, None, :], t.stack(cs_all, 1).numpy()[:, :, :, None, :]


def lstm_module(wss, uss, bss):
    """torch.nn.LSTM (all layers) holding our weights; torch's gate blocks are (i, f, g, o)."""
    t = _torch()
    layers = _layers(wss, uss, bss)
    H = layers[0][0].shape[0]
    lstm = t.nn.LSTM(H, H, num_layers=len(layers), batch_first=True, bias=True)
    order = [0, 1, 3, 2]
    with t.no_grad():
        for d, (W, U, b) in enumerate(layers):
            Wg, Ug, bg = W.T.reshape(4, H, H), U.T.reshape(4, H, H), b.reshape(4, H)
            getattr(lstm, f"weight_ih_l{d}").copy_(t.cat([Wg[g] for g in order]))
            getattr(lstm, f"weight_hh_l{d}").copy_(t.cat([Ug[g] for g in order]))
            getattr(lstm, f"bias_ih_l{d}").copy_(t.cat([bg[g] for g in order]))
            getattr(lstm, f"bias_hh_l{d}").zero_()
    return lstm


def torch_lstm(xss, wss, uss, bss):
    """stacked_lstm through torch.nn.LSTM: the top layer's hidden states [N, L, 1, H]."""
    t = _torch()
    x = t.from_numpy(xss.to_numpy()[:, :, 0, :])
    with t.no_grad():
        out, _ = lstm_module(wss, uss, bss)(x)
    return out.numpy()[:, :, None, :]


def dilated_cell_loop(xss, wss, uss, bss):
    """dilated_rnn: layer k's step t reads the state of step t - 2**k; batched over N."""
    t = _torch()
    x = t.from_numpy(xss.to_numpy()[:, :, 0, :])
    N, L, H = x.shape
    with t.no_grad():
        for k, (W, U, b) in enumerate(_layers(wss, uss, bss)):
            d = 2 ** k
            zero = t.zeros(N, H)
            hs, cs = [], []
            for step in range(L):
                h0, c0 = (hs[step - d], cs[step - d]) if step >= d else (zero, zero)
                h, c = _cell(x[:, step], h0, c0, W, U, b)
                hs.append(h)
                cs.append(c)
            x = t.stack(hs, 1)
    return x.numpy()[:, :, None, :]


def grid_cell_loop(xss, yss, wx, wy, ws, u1s, u2s, bs):
    """grid_rnn: per layer, per grid cell (i, j), one batched cell reading left and up."""
    t = _torch()
    x = t.from_numpy(xss.to_numpy()[:, :, 0, :])
    y = t.from_numpy(yss.to_numpy()[:, :, 0, :])
    N, L1, H = x.shape
    L2 = y.shape[1]
    Wx, Wy = t.from_numpy(np.asarray(wx)), t.from_numpy(np.asarray(wy))
    layers = [tuple(t.from_numpy(a.to_numpy()[d]) for a in (ws, u1s, u2s, bs)) for d in range(len(ws))]
    with t.no_grad():
        g = [[x[:, i] @ Wx + y[:, j] @ Wy for j in range(L2)] for i in range(L1)]
        outs = []
        for W, U1, U2, b in layers:
            zero = t.zeros(N, H)
            h = [[None] * L2 for _ in range(L1)]
            for i in range(L1):
                for j in range(L2):
                    left = h[i][j - 1] if j else zero
                    up = h[i - 1][j] if i else zero
                    h[i][j] = t.tanh(g[i][j] @ W + left @ U1 + up @ U2 + b)
            g = h
            outs.append(t.stack([t.stack(row, 1) for row in h], 1))
    return t.stack(outs, 1).numpy()[:, :, :, :, None, :]
