"""ft.jax.function: a compiled program as a JAX function under jax.jit, jax.grad and jax.vmap,
against the same computation written with jax.numpy (float64) and, for the language model,
against torch.nn.LSTM's loss curve. JAX is optional (the `bench` extra): without it these skip."""
from __future__ import annotations

import numpy as np
import pytest

import polyft as ft
from polyft.errors import InputError
from polyft.testing import rel_error

jax = pytest.importorskip("jax")
jnp = jax.numpy
pytestmark = pytest.mark.usefixtures("compile_cache")

H = 4


def rnn(xss, w, u):
    """Per sentence, an RNN's states: [N, L]float64[1, 3] -> [N, L]float64[1, 4]."""
    return xss.map(lambda xs: xs.scanl(lambda h, x: ft.tanh(x @ w + h @ u), ft.zeros((1, H), "float64")))


def rnn_jax(xss, w, u):
    def step(h, x):
        h = jnp.tanh(x @ w + h @ u)
        return h, h
    return jax.vmap(lambda xs: jax.lax.scan(step, jnp.zeros((1, H), xs.dtype), xs)[1])(xss)


@pytest.fixture(scope="module")
def f():
    return ft.jax.function(rnn, ft.spec("[N, L]float64[1, 3]"), ft.spec("float64[3, 4]"), ft.spec("float64[4, 4]"))


def inputs(seed=0, N=3, L=5):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s)) for s in [(N, L, 1, 3), (3, H), (H, H)]]


def test_jit_and_grad_equal_jax_autodiff(f):
    with jax.enable_x64(True):
        args = inputs()
        assert rel_error(np.asarray(jax.jit(f)(*args)), np.asarray(rnn_jax(*args))) < 1e-12

        def loss(g):
            return lambda *a: jnp.sum(jnp.sin(g(*a)))
        got = jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))(*args)
        expected = jax.grad(loss(rnn_jax), argnums=(0, 1, 2))(*args)
        for g, e in zip(got, expected):
            assert rel_error(np.asarray(g), np.asarray(e)) < 1e-5  # (in float64 about 1e-15)


def test_vmap_runs_the_program_per_example(f):
    with jax.enable_x64(True):
        x, w, u = inputs(N=2, L=4)
        ws = jnp.stack([w, 2 * w])
        got = jax.vmap(f, in_axes=(None, 0, None))(x, ws, u)
        expected = jnp.stack([rnn_jax(x, w, u), rnn_jax(x, 2 * w, u)])
        assert rel_error(np.asarray(got), np.asarray(expected)) < 1e-12


def test_errors_name_the_argument(f):
    x, w, u = inputs()  # without x64: float32 arrays
    with pytest.raises(InputError, match=r"ft.jax.function: argument 0 \(xss\) of rnn should be a float64 tensor "
                                         r"\[N, L, 1, 3\] .*got a float32 array \[3, 5, 1, 3\]"):
        f(x, w, u)


def test_char_lm_step_matches_torch():
    """The character-level model with polyft's LSTM in JAX (jit, grad, Adam written out): its loss
    is torch.nn.LSTM's (same initial weights, same batches) within 1e-3 relative at every step."""
    pytest.importorskip("torch")
    import char_lm
    reference, _ = char_lm.torch_models(H=16)
    state = {k: v.detach().numpy().copy() for k, v in reference.state_dict().items()}
    expected = char_lm.train_torch(reference, steps=20, N=4, L=12)
    got = char_lm.train_jax(state, H=16, steps=20, N=4, L=12)
    errors = np.abs(np.array(got) - expected) / np.abs(expected)
    assert errors.max() < 1e-3, (errors.argmax(), errors.max())
