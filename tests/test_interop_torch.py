"""ft.torch.function: a compiled program on torch tensors, its backward the compiled pullback.

References are torch itself: the same computation written with torch operators (float64, so
differences are the programs', not float32's), torch.nn.LSTM for the language model, and
torch's autograd for every gradient."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import polyft as ft
from polyft.errors import InputError, PolyftError
from polyft.testing import rel_error

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("compile_cache")

H = 4


def rnn(xss, w, u):
    """Per sentence, an RNN's states and its last state: [N, L]float64[1, 3] -> ([N, L], [N])."""
    def step(h, x):
        return ft.tanh(x @ w + h @ u)

    def sentence(xs):
        zero = ft.zeros((1, H), "float64")
        return xs.scanl(step, zero), xs.foldl(step, zero)
    return xss.map(sentence)


def rnn_torch(xss, w, u):
    hs, h = [], torch.zeros(xss.shape[0], 1, H, dtype=torch.float64)
    for t in range(xss.shape[1]):
        h = torch.tanh(xss[:, t] @ w + h @ u)
        hs.append(h)
    return torch.stack(hs, 1), h


SPECS = (ft.spec("[N, L]float64[1, 3]"), ft.spec("float64[3, 4]"), ft.spec("float64[4, 4]"))


@pytest.fixture(scope="module")
def layer():
    return ft.torch.function(rnn, *SPECS)


def inputs(seed=0, N=3, L=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, dtype=torch.float64, generator=g, requires_grad=True)
            for s in [(N, L, 1, 3), (3, H), (H, H)]]


def test_outputs_and_gradients_equal_torch_autograd(layer):
    args = inputs()
    got, expected = layer(*args), rnn_torch(*args)
    assert isinstance(got, tuple) and [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected):
        assert rel_error(g.detach().numpy(), e.detach().numpy()) < 1e-12
    weights = [torch.randn(e.shape, dtype=torch.float64) for e in expected]  # a loss using both outputs
    grads = torch.autograd.grad(sum((o * c).sum() for o, c in zip(got, weights)), args)
    reference = torch.autograd.grad(sum((o * c).sum() for o, c in zip(expected, weights)), args)
    for g, e in zip(grads, reference):
        assert rel_error(g.numpy(), e.numpy()) < 1e-5  # (in float64 they agree to about 1e-15)


def test_one_program_serves_other_lengths(layer):
    args = inputs(seed=1, N=2, L=7)
    got = layer(*args)[0]
    assert rel_error(got.detach().numpy(), rnn_torch(*args)[0].detach().numpy()) < 1e-12
    got.sum().backward()
    assert args[0].grad.shape == (2, 7, 1, 3)


def test_inputs_read_in_place_and_outputs_fresh_each_call(layer, monkeypatch):
    args = inputs()
    seen = []
    real = layer.program.run_arrays
    monkeypatch.setattr(layer.program, "run_arrays", lambda *a: seen.append(a) or real(*a))
    first = layer(*args)[0]
    assert [a.ctypes.data for a in seen[0]] == [t.data_ptr() for t in args]  # no copy of any input
    kept = first.detach().clone()
    second = layer(*inputs(seed=5))[0]
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(first.detach(), kept)  # the second call wrote elsewhere
    first.detach()[0, 0, 0, 0] = 7.0  # an output is an ordinary, writable tensor


def test_non_contiguous_inputs_are_copied_and_correct(layer):
    x, w, u = inputs()
    wt = w.detach().T.contiguous().T  # the same values, column-major
    assert not wt.is_contiguous()
    got = layer(x, wt, u)[0]
    assert rel_error(got.detach().numpy(), rnn_torch(x, w, u)[0].detach().numpy()) < 1e-12


def test_only_requested_gradients_are_returned(layer):
    x, w, u = inputs()
    x.requires_grad_(False)
    layer(x, w, u)[1].sum().backward()
    assert x.grad is None and w.grad is not None and u.grad is not None


def test_errors_name_the_torch_argument(layer):
    x, w, u = inputs()
    with pytest.raises(InputError, match=r"argument 1 \(w\) of rnn should be a float64 tensor \[3, 4\], got a "
                                         r"float32 tensor \[3, 4\]"):
        layer(x, w.float(), u)
    with pytest.raises(InputError, match=r"argument 0 \(xss\) of rnn should be a float64 tensor \[N, L, 1, 3\] "
                                         r"\(a \[N, L\] list of \[1, 3\] elements\), got a float64 tensor \[3, 5, 3\]"):
        layer(x.reshape(3, 5, 3), w, u)
    with pytest.raises(InputError, match=r"argument 2 \(u\) .* got a ndarray"):
        layer(x, w, u.detach().numpy())
    with pytest.raises(InputError, match=r"rnn takes 3 tensors \(xss, w, u\), got 2"):
        layer(x, w)
    with pytest.raises(InputError, match="ft.torch.function"):
        layer(x, w.T, u)


def test_tensors_off_the_cpu_are_refused(layer):
    x, w, u = inputs()
    with pytest.raises(InputError, match=r"argument 1 \(w\) .* got a float64 tensor \[3, 4\] on meta \(the program "
                                         r"reads CPU tensors: .cpu\(\) it\)"):
        layer(x, w.to("meta"), u)


def test_returned_inputs_and_constants_are_fresh_tensors():
    table = np.arange(6.0).reshape(2, 3)

    def f(x, w):
        return w, table
    g = ft.torch.function(f, ft.spec("float64[1, 3]"), ft.spec("float64[2, 3]"))
    w = torch.ones(2, 3, dtype=torch.float64)
    got_w, got_table = g(torch.ones(1, 3, dtype=torch.float64), w)
    assert torch.equal(got_w, w) and got_w.data_ptr() != w.data_ptr()
    assert got_table.tolist() == table.tolist() and not np.shares_memory(got_table.numpy(), table)


def test_the_cuda_emulated_target_runs_forward_and_backward():
    f = ft.torch.function(lambda xs: xs.map(lambda x: ft.tanh(x) * 2.0), ft.spec("[L]float32[1, 4]"),
                          target="cuda-emulated")
    x = torch.randn(3, 1, 4, requires_grad=True)
    y = f(x)
    (g,) = torch.autograd.grad((y * y).sum(), x)
    e = 2.0 * torch.tanh(x)
    (ge,) = torch.autograd.grad((e * e).sum(), x)
    assert rel_error(y.detach().numpy(), e.detach().numpy()) < 1e-6 and rel_error(g.numpy(), ge.numpy()) < 1e-5


def test_lengths_must_agree_between_arguments():
    def add(xs, ys):
        return ft.map(lambda x, y: x + y, xs, ys)
    f = ft.torch.function(add, ft.spec("[L]float32[2]"), ft.spec("[L]float32[2]"))
    with pytest.raises(InputError, match=r"argument 1 \(ys\) has L = 4 \(dim 0 of a float32 tensor \[4, 2\]\), "
                                         r"where another argument has L = 3"):
        f(torch.ones(3, 2), torch.ones(4, 2))


def test_ragged_specs_and_python_values_are_refused():
    with pytest.raises(PolyftError, match="ft.torch.function: spec 0 is the ragged list"):
        ft.torch.function(lambda xss: xss, ft.spec("[N, <=L]float32[2]"))
    with pytest.raises(PolyftError, match="spec 0 is a int"):
        ft.torch.function(lambda x: x, 3)


def test_integer_inputs_have_no_gradient_and_ids_are_read_at_call_time():
    """An embedding lookup: the table's gradient is the pullback's scatter-add of the ids."""
    def embed(table, idss):  # table [10]float64[1, 8] (its gradient needs V concrete); idss [N, L]int64[]
        return idss.map(lambda ids: table.gather(ids).map(ft.tanh))
    f = ft.torch.function(embed, ft.spec("[10]float64[1, 8]"), ft.spec("[N, L]int64[]"))
    table = torch.randn(10, 1, 8, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 10, (3, 6))
    got = f(table, ids)
    expected = torch.tanh(table[ids])
    assert rel_error(got.detach().numpy(), expected.detach().numpy()) < 1e-12
    ct = torch.randn(expected.shape, dtype=torch.float64)
    (g,) = torch.autograd.grad((got * ct).sum(), table)
    (e,) = torch.autograd.grad((expected * ct).sum(), table)
    assert rel_error(g.numpy(), e.numpy()) < 1e-5
    with pytest.raises(InputError, match="outside"):
        f(table, torch.full((3, 6), 10))


def test_under_torch_compile_without_a_graph_break(layer):
    """The custom ops put the program in Dynamo's graph (fullgraph=True fails on a graph break)
    and the backward through the pullback op."""
    def model(x, w, u):
        hs, h = layer(x, 2.0 * w, u)
        return (hs * hs).sum() + h.sum()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    args = inputs(seed=3)
    loss = compiled(*args)
    got = torch.autograd.grad(loss, args)
    expected_loss = model(*args)
    expected = torch.autograd.grad(expected_loss, args)
    assert rel_error(loss.detach().numpy(), expected_loss.detach().numpy()) < 1e-12
    for g, e in zip(got, expected):
        assert rel_error(g.numpy(), e.numpy()) < 1e-12


def test_one_compilation_per_function_and_specs(layer):
    """Functions of one program share its compiled forward and pullback, unless a captured array changed."""
    assert ft.torch.function(rnn, *SPECS).program is layer.program
    w = np.ones((3, 2))

    def project(x):
        return x @ w
    first = ft.torch.function(project, ft.spec("float64[1, 3]"))
    w[0, 0] = 2.0
    again = ft.torch.function(project, ft.spec("float64[1, 3]"))
    assert again.program is not first.program
    assert again(torch.ones(1, 3, dtype=torch.float64)).tolist() == [[4.0, 3.0]]


def test_importing_polyft_imports_neither_torch_nor_jax():
    code = ("import sys, polyft as ft; ft.compile; "
            "assert 'torch' not in sys.modules and 'jax' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert ft.torch.function is ft.interop_torch.function and "torch" in dir(ft)


def test_char_lm_loss_curve_matches_nn_lstm():
    """200 Adam steps of a character-level model (embedding, two-layer LSTM, read-out): with polyft's
    LSTM the loss is torch.nn.LSTM's within 1e-3 relative at every step."""
    import char_lm
    torch.manual_seed(0)
    reference, model = char_lm.torch_models(H=16)
    expected = char_lm.train_torch(reference, steps=200, N=4, L=12)
    got = char_lm.train_torch(model, steps=200, N=4, L=12)
    errors = np.abs(np.array(got) - expected) / np.abs(expected)
    assert errors.max() < 1e-3, (errors.argmax(), errors.max())
    assert expected[-1] < 0.7 * expected[0]  # it learns: the curves compared are not flat
