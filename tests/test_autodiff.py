"""ft.vjp / ft.grad: gradients of nested-list programs against torch.autograd and central finite
differences (float64), eagerly; the pullback as a compiled program (C, cuda-emulated)."""
from __future__ import annotations

import numpy as np
import pytest

import polyft as ft
from polyft.autodiff import DifferentiationError
from polyft.testing import rel_error
from polyft.workloads import stacked_lstm, stacked_rnn

torch = pytest.importorskip("torch")


def ones_like_out(out):
    """Cotangents of ones for every output (the loss is the sum of the outputs)."""
    if isinstance(out, tuple):
        return tuple(ones_like_out(o) for o in out)
    return ft.FractalTensor.from_numpy(np.ones_like(out.to_numpy()), out.depth)


def torch_stacked_rnn(x, w):
    """Listing 1 in torch: every layer's outputs, summed."""
    N, L = x.shape[:2]
    total = 0
    for n in range(N):
        hs = [x[n, t] for t in range(L)]
        for d in range(w.shape[0]):
            s, new = torch.zeros_like(hs[0]), []
            for t in range(L):
                s = hs[t] @ w[d] + s
                new.append(s)
            hs = new
            total = total + sum(h.sum() for h in hs)
    return total


def torch_stacked_lstm(x, ws, us, bs):
    """Listing 2 in torch (gates i, f, o, g): every layer's h and c, summed."""
    N, L = x.shape[:2]
    total = 0
    for n in range(N):
        hs = [x[n, t] for t in range(L)]
        for d in range(ws.shape[0]):
            h = c = torch.zeros_like(hs[0])
            new = []
            for t in range(L):
                g = [hs[t] @ ws[d, k] + h @ us[d, k] + bs[d, k] for k in range(4)]
                c = torch.sigmoid(g[1]) * c + torch.sigmoid(g[0]) * torch.tanh(g[3])
                h = torch.sigmoid(g[2]) * torch.tanh(c)
                new.append(h)
                total = total + h.sum() + c.sum()
            hs = new
    return total


def torch_grads(fn, arrays):
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    fn(*ts).backward()
    return [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("workload, reference", [(stacked_rnn, torch_stacked_rnn),
                                                 (stacked_lstm, torch_stacked_lstm)])
def test_stacked_rnn_and_lstm_equal_torch(workload, reference):
    inputs = workload.inputs("small", seed=3, N=2, D=3, L=4, H=6)
    out, pullback = ft.vjp(workload.program, *inputs)
    np.testing.assert_allclose(rel_error(out, workload.program(*inputs)), 0, atol=1e-7)
    grads = pullback(ones_like_out(out))
    expected = torch_grads(reference, [x.to_numpy() for x in inputs])
    assert len(grads) == len(inputs)
    for g, e in zip(grads, expected):
        assert rel_error(g, e) < 1e-4
