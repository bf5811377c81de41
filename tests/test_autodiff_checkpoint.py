"""ft.vjp(..., checkpoint=k): every k-th state of a scan saved, the segments recomputed in the backward.
The gradients equal the stored version's (and torch's); the saved states shrink in prog.memory()."""
from __future__ import annotations

import numpy as np
import pytest
from test_autodiff import torch_grads, torch_stacked_lstm

import polyft as ft
import polyft.autodiff_rules as rules
from polyft.autodiff import DifferentiationError
from polyft.testing import rel_error
from polyft.workloads import stacked_lstm

torch = pytest.importorskip("torch")

L, H = 16, 8


@pytest.fixture
def segments_used(monkeypatch):
    """How many scans ran their backward in checkpointed segments."""
    calls = []
    real = rules._reverse_segments
    monkeypatch.setattr(rules, "_reverse_segments", lambda *a: calls.append(a[-2]) or real(*a))
    return calls


def encoder_case(seed=0, N=3, dtype=np.float64):
    rng = np.random.default_rng(seed)
    xss = ft.FractalTensor.from_numpy(rng.standard_normal((N, L, 1, H)).astype(dtype), 2)
    w = (rng.standard_normal((H, H)) * 0.4).astype(dtype)
    return xss, w


def encoder_loss(xss, w):
    """A fold per sentence (only its last state leaves the forward) and a scan at the top level."""
    dtype = str(xss.dtype)
    lasts = xss.map(lambda xs: xs.foldl(lambda h, x: ft.tanh(x @ w + h @ w), ft.zeros((1, H), dtype)))
    hs = lasts.scanl(lambda s, h: ft.sigmoid(s + h), ft.zeros((1, H), dtype))
    return hs.reduce(lambda acc, h: acc + ft.sum(h * h), np.zeros((), dtype))


def torch_encoder_loss(x, w):
    total, s = 0, torch.zeros(1, H, dtype=torch.float64)
    for n in range(x.shape[0]):
        h = torch.zeros(1, H, dtype=torch.float64)
        for t in range(L):
            h = torch.tanh(x[n, t] @ w + h @ w)
        s = torch.sigmoid(s + h)
        total = total + (s * s).sum()
    return total


@pytest.mark.parametrize("k", [2, 4, 8])
def test_checkpointed_gradients_equal_stored_and_torch(k, segments_used):
    xss, w = encoder_case()
    stored = ft.grad(encoder_loss, argnums=(0, 1))(xss, w)
    assert not segments_used
    got = ft.grad(encoder_loss, argnums=(0, 1), checkpoint=k)(xss, w)
    assert segments_used and set(segments_used) == {k}
    expected = torch_grads(torch_encoder_loss, [xss.to_numpy(), w])
    for g, s, e in zip(got, stored, expected):
        assert rel_error(g, s) < 1e-12 and rel_error(g, e) < 1e-10


def test_stacked_lstm_checkpointed_equals_torch(segments_used):
    """Time scans of 8 steps in segments of 4 (the layer scan of 3 is stored: 4 does not divide it)."""
    inputs = stacked_lstm.inputs("small", seed=3, N=2, D=3, L=8, H=6)
    out, pullback = ft.vjp(stacked_lstm.program, *inputs, checkpoint=4)
    grads = pullback(*[ft.FractalTensor.from_numpy(np.ones_like(o.to_numpy()), 3) for o in out])
    assert segments_used
    for g, e in zip(grads, torch_grads(torch_stacked_lstm, [x.to_numpy() for x in inputs])):
        assert rel_error(g, e) < 1e-4


@pytest.mark.parametrize("target", ["c", "cuda-emulated"])
def test_checkpointed_forward_and_backward_compiled(target):
    """ft.grad(..., checkpoint=4) compiled: the checkpointed forward (a scan over segments of a fold)
    and the segment-wise backward equal the eager stored gradients (float32: the CUDA target's)."""
    xss, w = encoder_case(1, dtype=np.float32)
    expected = ft.grad(encoder_loss, argnums=(0, 1))(xss, w)
    prog = ft.compile(ft.grad(encoder_loss, argnums=(0, 1), checkpoint=4), xss, w, target=target)
    for g, e in zip(prog(xss, w), expected):
        assert rel_error(g, e) < 1e-5


def test_compiled_pullback_saves_fewer_states():
    """The compiled pullback of a top-level fold holds the forward's saved values as constants: with
    checkpoint=8 the states it keeps are L/8 instead of L (the inputs and weights stay)."""
    rng = np.random.default_rng(2)
    xs = ft.FractalTensor.from_numpy(rng.standard_normal((64, 1, 32)).astype(np.float32), 1)
    w = (rng.standard_normal((32, 32)) * 0.2).astype(np.float32)

    def enc(xs, w):
        return xs.foldl(lambda h, x: ft.tanh(x @ w + h), ft.zeros((1, 32)))

    consts = {}
    for k in (None, 8):
        out, pullback = ft.vjp(enc, xs, w, checkpoint=k)
        ct = rng.standard_normal(out.shape).astype(np.float32)
        prog = ft.compile(pullback, ct, target="c")
        m = prog.memory()
        consts[k] = int(m[m.role == "const"].allocated_bytes.sum())
        assert all(rel_error(g, e) < 1e-5 for g, e in zip(prog(ct), pullback(ct)))
    state_bytes = 64 * 32 * 4  # less a few scalar constants the segments add (an indicator's 1.0)
    assert state_bytes - state_bytes // 8 - 16 <= consts[None] - consts[8] <= state_bytes - state_bytes // 8


@pytest.mark.parametrize("k", [1, 0, 2.5, "4", True])
def test_bad_checkpoint_is_an_error(k):
    with pytest.raises(DifferentiationError, match="checkpoint must be an int >= 2") as e:
        ft.vjp(lambda x: x * x, np.ones((2, 2)), checkpoint=k)
    assert e.value.op == "vjp"
