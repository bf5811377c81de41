"""The paper's workloads, run eagerly, against references written separately from the math
(numpy loops, torch.nn.LSTM, dense attention), plus inputs-vs-specs checks."""
import inspect

import numpy as np
import pytest

import polyft as ft
from polyft.errors import PolyftError
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS, get

TOL = 1e-5
RNNS = ("stacked_rnn", "stacked_lstm", "dilated_rnn", "grid_rnn")


def np_of(x):
    return x.to_numpy() if hasattr(x, "to_numpy") else np.asarray(x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_step(x, h, c, w, u, b):
    """One LSTM step in float64; w, u [4, H, H], b [4, 1, H] in the gate order (i, f, o, g)."""
    g = [x @ w[j] + h @ u[j] + b[j] for j in range(4)]
    c = sigmoid(g[1]) * c + sigmoid(g[0]) * np.tanh(g[3])
    return sigmoid(g[2]) * np.tanh(c), c


# -- registry, presets, inputs against specs ----------------------------------------------

def test_registry():
    assert set(WORKLOADS) == {"stacked_rnn", "stacked_lstm", "dilated_rnn", "grid_rnn",
                              "b2b_gemm", "flash_attention", "bigbird"}
    for name, mod in WORKLOADS.items():
        assert get(name) is mod
        assert isinstance(mod.DESCRIPTION, str) and mod.DESCRIPTION
    with pytest.raises(PolyftError) as info:
        get("lstm")
    assert "stacked_lstm" in str(info.value) and "bigbird" in str(info.value)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_presets_exist_and_specs_parse(name):
    mod = WORKLOADS[name]
    assert {"small", "paper"} <= set(mod.PRESETS)
    if name in RNNS:
        assert {"middle", "large"} <= set(mod.PRESETS)
    n_params = len(inspect.signature(mod.program).parameters)
    for preset in mod.PRESETS:
        sp = mod.specs(preset)
        assert len(sp) == n_params
        assert all(isinstance(s, ft.Spec) for s in sp)
        for s in sp:  # the outermost programmable length is symbolic, except the layer
            if s.depth and not (name == "dilated_rnn" and s.depth == 2 and sp.index(s) > 0):
                assert not ft.Length.of(s.type.lengths[0]).is_concrete, (name, preset, str(s))
    with pytest.raises(PolyftError):
        mod.inputs("no-such-preset")
    with pytest.raises(PolyftError):
        mod.specs("small", no_such_size=3)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_inputs_match_specs(name):
    mod = WORKLOADS[name]
    ins, sp = mod.inputs("small", seed=0), mod.specs("small")
    assert isinstance(ins, tuple) and len(ins) == len(sp)
    env = {}  # a symbolic length must mean the same number in every input
    for x, s in zip(ins, sp):
        if s.depth == 0:
            assert isinstance(x, np.ndarray)
            assert x.shape == tuple(s.element_shape) and x.dtype.name == s.dtype
            arr = x
        else:
            assert isinstance(x, ft.FractalTensor)
            assert x.depth == s.depth
            assert tuple(x.element_shape) == tuple(s.element_shape)
            assert np.dtype(x.dtype).name == s.dtype
            arr = x.to_numpy()
            assert arr.shape[s.depth:] == tuple(s.element_shape)
            for n_spec, n in zip(s.type.lengths, arr.shape[:s.depth]):
                n_spec = ft.Length.of(n_spec)
                if n_spec.is_concrete:
                    assert int(n_spec) == n
                else:
                    assert env.setdefault(str(n_spec), n) == n, (str(n_spec), env, n)
        assert np.isfinite(arr).all() and np.count_nonzero(arr) == arr.size
    # seeded: the same seed gives the same data, another seed other data
    again, other = mod.inputs("small", seed=0), mod.inputs("small", seed=1)
    for a, b, c in zip(ins, again, other):
        np.testing.assert_array_equal(np_of(a), np_of(b))
        assert not np.array_equal(np_of(a), np_of(c))


def test_paper_presets_match_table6():
    for name in ("stacked_lstm", "grid_rnn"):
        p = get(name).PRESETS["paper"]
        assert (p["N"], p["D"]) == (256, 32)
    p = get("dilated_rnn").PRESETS["paper"]
    assert (p["N"], p["D"]) == (256, 6)  # dilations 1..32
    for name in RNNS:
        assert get(name).PRESETS["middle"]["H"] == 256 and get(name).PRESETS["large"]["H"] == 1024
        assert get(name).PRESETS["middle"]["N"] == 256 == get(name).PRESETS["large"]["N"]
    p = get("b2b_gemm").PRESETS["paper"]
    assert (p["K"], p["P"]) == (64, 64)
    assert str(get("flash_attention").specs("paper")[0]) == "[B, NH, TQ]float32[32, 128]"
    assert str(get("bigbird").specs("paper")[0]) == "[B, NB]float32[32, 512]"


def test_overrides_change_sizes():
    xss, ws = get("stacked_rnn").inputs("small", N=3, D=2)
    assert len(xss) == 3 and len(ws) == 2
    with pytest.raises(PolyftError):
        get("dilated_rnn").inputs("small", L=6)  # not a multiple of the top dilation 4


# -- numerics against independent references ---------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
def test_stacked_rnn_equals_numpy_loop(seed):
    mod = get("stacked_rnn")
    xss, ws = mod.inputs("small", seed=seed)
    ysss = mod.program(xss, ws)
    x, w = xss.to_numpy().astype(np.float64), ws.to_numpy().astype(np.float64)
    N, L, D = x.shape[0], x.shape[1], w.shape[0]
    ref = np.empty((N, D, L) + x.shape[2:])
    for n in range(N):
        seq = x[n]
        for d in range(D):
            s = np.zeros(x.shape[2:])
            for t in range(L):
                s = seq[t] @ w[d] + s
                ref[n, d, t] = s
            seq = ref[n, d]
    assert ysss.depth == 3 and tuple(ysss.element_shape) == x.shape[2:]
    assert rel_error(ysss, ref) < TOL


def _torch_lstm_weights(lstm, wss, uss, bss, order):
    import torch
    D, _, H, _ = wss.shape
    with torch.no_grad():
        for d in range(D):
            wih, whh, bih = np.empty((4 * H, H)), np.empty((4 * H, H)), np.empty(4 * H)
            for j in range(4):
                rows = slice(order[j] * H, (order[j] + 1) * H)
                wih[rows], whh[rows], bih[rows] = wss[d, j].T, uss[d, j].T, bss[d, j, 0]
            getattr(lstm, f"weight_ih_l{d}").copy_(torch.from_numpy(wih))
            getattr(lstm, f"weight_hh_l{d}").copy_(torch.from_numpy(whh))
            getattr(lstm, f"bias_ih_l{d}").copy_(torch.from_numpy(bih))
            getattr(lstm, f"bias_hh_l{d}").zero_()


@pytest.mark.parametrize("seed", [0, 3])
def test_stacked_lstm_equals_torch(seed):
    torch = pytest.importorskip("torch")
    mod = get("stacked_lstm")
    xss, wss, uss, bss = mod.inputs("small", seed=seed)
    hsss, csss = mod.program(xss, wss, uss, bss)
    x = xss.to_numpy()[:, :, 0, :]
    w, u, b = wss.to_numpy(), uss.to_numpy(), bss.to_numpy()
    N, L, H = x.shape
    D = w.shape[0]
    hs, cs = hsss.to_numpy()[:, :, :, 0, :], csss.to_numpy()[:, :, :, 0, :]  # [N, D, L, H]
    assert hs.shape == cs.shape == (N, D, L, H)

    lstm = torch.nn.LSTM(H, H, num_layers=D, batch_first=True)
    _torch_lstm_weights(lstm, w, u, b, mod.TORCH_GATE)
    with torch.no_grad():
        out, (hn, cn) = lstm(torch.from_numpy(x))
    assert rel_error(hs[:, D - 1], out.numpy()) < TOL
    assert rel_error(hs[:, :, L - 1].transpose(1, 0, 2), hn.numpy()) < TOL
    assert rel_error(cs[:, :, L - 1].transpose(1, 0, 2), cn.numpy()) < TOL
    # every layer's whole output sequence, through one-layer torch LSTMs fed layer by layer
    seq = torch.from_numpy(x)
    for d in range(D):
        one = torch.nn.LSTM(H, H, num_layers=1, batch_first=True)
        _torch_lstm_weights(one, w[d:d + 1], u[d:d + 1], b[d:d + 1], mod.TORCH_GATE)
        with torch.no_grad():
            seq, _ = one(seq)
        assert rel_error(hs[:, d], seq.numpy()) < TOL


@pytest.mark.parametrize("preset_overrides", [{}, {"D": 2, "L": 6, "N": 1}])
def test_dilated_rnn_equals_numpy_loop(preset_overrides):
    mod = get("dilated_rnn")
    xss, wss, uss, bss = mod.inputs("small", seed=5, **preset_overrides)
    out = mod.program(xss, wss, uss, bss)
    x = xss.to_numpy().astype(np.float64)
    w, u, b = (t.to_numpy().astype(np.float64) for t in (wss, uss, bss))
    N, L = x.shape[:2]
    D = w.shape[0]
    ref = np.empty_like(x)
    for n in range(N):
        seq = x[n]
        for k in range(D):  # layer k: step t reads the state of step t - 2**k
            dil = 2 ** k
            hs, cs = np.zeros_like(seq), np.zeros_like(seq)
            for t in range(L):
                h0 = hs[t - dil] if t >= dil else np.zeros_like(seq[0])
                c0 = cs[t - dil] if t >= dil else np.zeros_like(seq[0])
                hs[t], cs[t] = lstm_step(seq[t], h0, c0, w[k], u[k], b[k])
            seq = hs
        ref[n] = seq
    assert out.depth == 2 and len(out) == N and len(out[0]) == L
    assert rel_error(out, ref) < TOL


def test_grid_rnn_equals_numpy_loop():
    mod = get("grid_rnn")
    ins = mod.inputs("small", seed=7)
    out = mod.program(*ins)
    xs, ys, wx, wy, ws, u1s, u2s, bs = (np_of(t).astype(np.float64) for t in ins)
    N, L1, L2, D, H = xs.shape[0], xs.shape[1], ys.shape[1], ws.shape[0], xs.shape[-1]
    ref = np.empty((N, D, L1, L2, 1, H))
    for n in range(N):
        g = np.empty((L1, L2, 1, H))
        for i in range(L1):
            for j in range(L2):
                g[i, j] = xs[n, i] @ wx + ys[n, j] @ wy
        for d in range(D):
            h = np.zeros((L1 + 1, L2 + 1, 1, H))  # row 0 and column 0: zeros outside the grid
            for i in range(L1):
                for j in range(L2):
                    h[i + 1, j + 1] = np.tanh(g[i, j] @ ws[d] + h[i + 1, j] @ u1s[d]
                                              + h[i, j + 1] @ u2s[d] + bs[d])
            g = ref[n, d] = h[1:, 1:]
    assert out.depth == 4
    assert rel_error(out, ref) < TOL


def test_b2b_gemm_equals_matmuls():
    mod = get("b2b_gemm")
    for overrides in ({}, {"M": 8, "N": 32, "tm": 8, "tn": 16}):
        out = mod.program(*mod.inputs("small", seed=2, **overrides))
        a, b, c = (m.astype(np.float64) for m in mod.matrices("small", seed=2, **overrides))
        tm = {**mod.PRESETS["small"], **overrides}["tm"]
        got = out.to_numpy()
        assert got.shape == (a.shape[0] // tm, tm, c.shape[1])
        assert rel_error(got.reshape(a.shape[0], c.shape[1]), (a @ b) @ c) < TOL


def _dense_attention(q, k, v, mask=None):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def test_flash_attention_equals_softmax_attention():
    torch = pytest.importorskip("torch")
    mod = get("flash_attention")
    q, k, v = mod.inputs("small", seed=4)
    out = mod.program(q, k, v)
    B, NH, TQ, tq, d = q.to_numpy().shape
    flat = [t.to_numpy().reshape(B, NH, -1, d) for t in (q, k, v)]
    got = out.to_numpy()
    assert got.shape == (B, NH, TQ, tq, d)
    got = got.reshape(B, NH, TQ * tq, d)
    ref = _dense_attention(*(t.astype(np.float64) for t in flat))
    assert rel_error(got, ref) < TOL
    sdpa = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(t) for t in flat))
    assert rel_error(got, sdpa.numpy()) < TOL


def test_bigbird_equals_masked_dense_attention():
    mod = get("bigbird")
    q, k, v = mod.inputs("small", seed=6)
    out = mod.program(q, k, v)
    B, nb, bs, d = q.to_numpy().shape
    flat = [t.to_numpy().astype(np.float64).reshape(B, nb * bs, d) for t in (q, k, v)]
    blocks = np.zeros((nb, nb), dtype=bool)  # query block -> key blocks it may attend to
    for i in range(2, nb - 2):
        blocks[i, [0, i - 1, i, i + 1, nb - 1]] = True
    mask = np.kron(blocks, np.ones((bs, bs), dtype=bool)).astype(bool)
    ref = _dense_attention(flat[0][:, 2 * bs:(nb - 2) * bs], *flat[1:], mask[2 * bs:(nb - 2) * bs])
    got = out.to_numpy()
    assert got.shape == (B, nb - 4, bs, d)
    assert rel_error(got.reshape(B, (nb - 4) * bs, d), ref) < TOL
