"""Hand-written torch baselines for every workload, on the workloads' own inputs, on any
torch device ("cpu" or "cuda").

Each function takes the workload's inputs (FractalTensors) and returns a `Baseline`: the
data are converted and moved to the device once, `run()` is the call that is timed, and
`result()` runs it and returns numpy data laid out as the eager program's result (or as
`expected(eager result)` where a baseline computes only part of it), so that every baseline
is checked against the eager result before it is timed.

* RNNs: the per-cell loops are how one writes these models in eager PyTorch: one cell call
  per (layer, time step), or per grid cell, batched over the batch. `compile=True` runs the
  cell through torch.compile (the loops stay in Python, as with PyTorch JIT on a cell).
  `nn_lstm` is cuDNN's interface (torch.nn.LSTM, all layers in one call) with our weights.
* b2b_gemm: two GEMMs (cuBLAS on a GPU); flash_attention: scaled_dot_product_attention
  (FlashAttention-2's kernel on a GPU); bigbird: a blocked implementation that gathers each
  query block's window and global key blocks into one tensor (as the official one does).
  `compile=True` compiles the whole call.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np


def _torch():
    import torch
    return torch


class Baseline(NamedTuple):
    run: Callable  # the timed call; data already on the device
    result: Callable  # run() as numpy, laid out as expected(eager result)
    expected: Callable = lambda eager: eager  # the part of the eager result it computes
    columns: Callable = dict  # extra columns of its row, once timed (the schedule the generated C ran)


def _on(device, *arrays, dtype=None):
    """The arrays as tensors on `device` (in `dtype`, a torch dtype, where given)."""
    t = _torch()
    return [t.from_numpy(np.ascontiguousarray(a)).to(device, dtype) for a in arrays]


def _array(x) -> np.ndarray:
    return x.to_numpy() if hasattr(x, "to_numpy") else np.asarray(x)


def _numpy(x):
    if isinstance(x, (tuple, list)):
        return tuple(_numpy(v) for v in x)
    return x.detach().float().cpu().numpy()  # fp16 / bf16 results as float32


def _baseline(run, shape=lambda r: r, expected=None) -> Baseline:
    """A Baseline from a no-grad call and how to lay its result out as the eager result."""
    t = _torch()

    def timed():
        with t.no_grad():
            return run()
    return Baseline(timed, lambda: shape(_numpy(timed())), expected or (lambda eager: eager))


def _compiled(fn, compile: bool):
    return _torch().compile(fn) if compile else fn


# -- RNN cells -------------------------------------------------------------------------------

def _gates(ws, us, bs):
    """Stack a layer's 4 gates (i, f, o, g) into [H, 4H] / [1, 4H] matrices (numpy)."""
    return (np.concatenate(list(ws), axis=1), np.concatenate(list(us), axis=1),
            np.concatenate(list(bs), axis=1))


def _lstm_cell(x, h, c, W, U, b):
    t = _torch()
    g = x @ W + h @ U + b
    i, f, o, gg = g.chunk(4, dim=1)
    c = t.sigmoid(f) * c + t.sigmoid(i) * t.tanh(gg)
    h = t.sigmoid(o) * t.tanh(c)
    return h, c


def _layers(wss, uss, bss):
    ws, us, bs = (x.to_numpy() for x in (wss, uss, bss))
    return [_gates(ws[d], us[d], bs[d]) for d in range(ws.shape[0])]


def _sequence(xss):
    return xss.to_numpy()[:, :, 0, :]  # [N, L, H]


def rnn_cell_loop(xss, ws, device="cpu", compile=False) -> Baseline:
    """stacked_rnn (Listing 1): per layer, per step, s = x @ w + s, batched over N."""
    t = _torch()
    x0, W = _on(device, _sequence(xss), ws.to_numpy())
    cell = _compiled(lambda x, w, s: x @ w + s, compile)
    N, L, H = x0.shape

    def run():
        x, out = x0, []
        for d in range(W.shape[0]):
            s, hs = t.zeros(N, H, device=device), []
            for step in range(L):
                s = cell(x[:, step], W[d], s)
                hs.append(s)
            x = t.stack(hs, 1)
            out.append(x)
        return t.stack(out, 1)
    return _baseline(run, lambda r: r[:, :, :, None, :])


def _lstm_stack(xss, wss, uss, bss, device, compile, dilated):
    """A call returning every layer's (hs, cs) [N, L, H]; layer k's step t reads the state of
    step t - 1 (stacked LSTM) or t - 2**k (dilated), zeros before the start."""
    t = _torch()
    (x0,) = _on(device, _sequence(xss))
    layers = [_on(device, *g) for g in _layers(wss, uss, bss)]
    cell = _compiled(_lstm_cell, compile)
    N, L, H = x0.shape

    def run():
        x, out = x0, []
        for k, (W, U, b) in enumerate(layers):
            d, zero = 2 ** k if dilated else 1, t.zeros(N, H, device=device)
            hs, cs = [], []
            for step in range(L):
                h0, c0 = (hs[step - d], cs[step - d]) if step >= d else (zero, zero)
                h, c = cell(x[:, step], h0, c0, W, U, b)
                hs.append(h)
                cs.append(c)
            x = t.stack(hs, 1)
            out.append((x, t.stack(cs, 1)))
        return out
    return run


def lstm_cell_loop(xss, wss, uss, bss, device="cpu", compile=False) -> Baseline:
    """stacked_lstm: for each layer, for each step, one batched LSTM cell; every layer's h, c."""
    t = _torch()
    layers = _lstm_stack(xss, wss, uss, bss, device, compile, dilated=False)

    def run():
        out = layers()
        return t.stack([h for h, _ in out], 1), t.stack([c for _, c in out], 1)
    return _baseline(run, lambda r: (r[0][:, :, :, None, :], r[1][:, :, :, None, :]))


def lstm_module(wss, uss, bss):
    """torch.nn.LSTM (all layers) holding our weights; torch's gate blocks are (i, f, g, o)."""
    t = _torch()
    layers = [tuple(t.from_numpy(a) for a in g) for g in _layers(wss, uss, bss)]
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


def nn_lstm(xss, wss, uss, bss, device="cpu", compile=False, dtype=None) -> Baseline:
    """stacked_lstm through torch.nn.LSTM (cuDNN on a GPU): the top layer's hidden states;
    `dtype` (a torch dtype) of its weights and inputs."""
    (x,) = _on(device, _sequence(xss), dtype=dtype)
    lstm = lstm_module(wss, uss, bss).to(device, dtype)
    return _baseline(lambda: lstm(x)[0], lambda r: r[:, :, None, :],
                     expected=lambda eager: _array(eager[0])[:, -1])


def dilated_cell_loop(xss, wss, uss, bss, device="cpu", compile=False) -> Baseline:
    """dilated_rnn: layer k's step t reads the state of step t - 2**k; batched over N."""
    layers = _lstm_stack(xss, wss, uss, bss, device, compile, dilated=True)
    return _baseline(lambda: layers()[-1][0], lambda r: r[:, :, None, :])


def grid_cell_loop(xss, yss, wx, wy, ws, u1s, u2s, bs, device="cpu", compile=False) -> Baseline:
    """grid_rnn: per layer, per grid cell (i, j), one batched cell reading left and up."""
    t = _torch()
    x, y, Wx, Wy = _on(device, _sequence(xss), _sequence(yss), np.asarray(wx), np.asarray(wy))
    N, L1, H = x.shape
    L2 = y.shape[1]
    layers = [_on(device, *(a.to_numpy()[d] for a in (ws, u1s, u2s, bs))) for d in range(len(ws))]
    cell = _compiled(lambda g, left, up, W, U1, U2, b: t.tanh(g @ W + left @ U1 + up @ U2 + b), compile)

    def run():
        g = [[x[:, i] @ Wx + y[:, j] @ Wy for j in range(L2)] for i in range(L1)]
        zero, outs = t.zeros(N, H, device=device), []
        for W, U1, U2, b in layers:
            h = [[None] * L2 for _ in range(L1)]
            for i in range(L1):
                for j in range(L2):
                    h[i][j] = cell(g[i][j], h[i][j - 1] if j else zero, h[i - 1][j] if i else zero, W, U1, U2, b)
            g = h
            outs.append(t.stack([t.stack(row, 1) for row in h], 1))
        return t.stack(outs, 1)
    return _baseline(run, lambda r: r[:, :, :, :, None, :])


# -- attention and GEMMs ---------------------------------------------------------------------

def two_matmuls(a_tiles, b_tiles, c_tiles, device="cpu", compile=False, dtype=None) -> Baseline:
    """b2b_gemm: (A @ B) @ C on the whole matrices (cuBLAS on a GPU), in `dtype` where given."""
    *matrices, shape = b2b_matrices(a_tiles, b_tiles, c_tiles)
    A, Bm, Cm = _on(device, *matrices, dtype=dtype)
    fn = _compiled(lambda: (A @ Bm) @ Cm, compile)
    return _baseline(fn, lambda r: r.reshape(shape))


def b2b_matrices(a_tiles, b_tiles, c_tiles):
    """The whole matrices A [M, K], B [K, N], C [N, P] (numpy) behind b2b_gemm's tiles, and the
    shape [MT, tm, P] of the eager result (the torch and the JAX baselines' inputs)."""
    a, b, c = (x.to_numpy() for x in (a_tiles, b_tiles, c_tiles))  # [MT, tm, K], [NT, K, tn], [NT, tn, P]
    return (a.reshape(-1, a.shape[-1]), np.concatenate(list(b), axis=1), np.concatenate(list(c), axis=0),
            (a.shape[0], a.shape[1], c.shape[-1]))


def sdpa(qsss, ksss, vsss, device="cpu", compile=False, dtype=None) -> Baseline:
    """flash_attention: torch scaled_dot_product_attention over the whole sequences (with fp16
    or bf16 `dtype` on a GPU it can take FlashAttention-2's kernel)."""
    t = _torch()
    q, k, v = _on(device, *(x.to_numpy() for x in (qsss, ksss, vsss)), dtype=dtype)  # [B, NH, T, t, d]
    shape = q.shape
    q2, k2, v2 = (x.reshape(x.shape[0], x.shape[1], -1, x.shape[-1]) for x in (q, k, v))
    fn = _compiled(lambda: t.nn.functional.scaled_dot_product_attention(q2, k2, v2), compile)
    return _baseline(fn, lambda r: r.reshape(shape))


def blocked_bigbird(qss, kss, vss, device="cpu", compile=False, dtype=None) -> Baseline:
    """bigbird: query blocks 2..nb-3 against their window of 3 key blocks and the first and
    last (global) key blocks, gathered into one [B, nb - 4, 5 bs, d] tensor per operand."""
    t = _torch()
    q, k, v = _on(device, *(x.to_numpy() for x in (qss, kss, vss)), dtype=dtype)  # [B, nb, bs, d]
    B, nb, bs, d = q.shape
    scale = 1.0 / np.sqrt(d)

    def gather(x):
        first, last = x[:, 0:1].expand(-1, nb - 4, -1, -1), x[:, nb - 1:nb].expand(-1, nb - 4, -1, -1)
        return t.cat([first, x[:, 1:nb - 3], x[:, 2:nb - 2], x[:, 3:nb - 1], last], dim=2)

    def run():
        p = t.softmax((q[:, 2:nb - 2] * scale) @ gather(k).transpose(-1, -2), dim=-1)
        return p @ gather(v)
    return _baseline(_compiled(run, compile))
