"""JAX baselines for every workload, on the workloads' own inputs, on the CPU: what a user who
writes the nested scans in Python with JAX would run instead of polyft.

JAX is optional (the `bench` extra: `pip install -e ".[bench]"`): nothing here imports it
until a baseline is built, and `unavailable()` says why a run cannot have it (the experiments
then write an `absent` row). Each function takes the workload's inputs (FractalTensors) and
returns a `baselines.Baseline`, the contract of the torch baselines (experiments/baselines.py):
the data are converted and put on the device once, `run()` is the timed call, `result()` runs
it and returns numpy data laid out as the eager result (or as `expected(eager result)`), so
every baseline is checked against the eager result before it is timed.

Settings, each the faster of the alternatives measured side by side (`python -m
polyft.experiments.jax_settings` times them again, at fig7's quick shapes; OPTIONS lists
them). The ratios below: medians of 9 calls, three runs on the 2-core AMD EPYC VM of results/
(Zen 4, AVX-512; one run loaded by other jobs, two idle):

* the whole call is one `jax.jit`; `run()` ends in `block_until_ready()` (JAX dispatches
  asynchronously); the first call compiles, outside any timing (measure.py's check);
* float32 (JAX's default), XLA's own CPU thread pool (every core; no flag limits it);
* recurrences: time-major data, one `lax.scan` over time per layer (scan's `unroll=2, 4, 8`
  measured within 3% of none on the LSTM: left at 1); the LSTM's four gates concatenated into
  one [H, 4H] matrix and [1, 4H] bias, one matmul per operand per step, as torch.nn.LSTM does;
* the input projection of a whole layer hoisted out of the time scan (one [L*N, H] GEMM; the
  layer below is finished before this one starts), as torch.nn.LSTM does on the CPU, where it
  is faster: the stacked RNN (hoisted 1.26-1.34x faster) and the grid RNN (g @ w + b per
  layer and a row's h_up @ u2 per row outside the scans: 1.22-1.36x). Not for the stacked
  and dilated LSTMs (`hoist=False` kept: 1.43-1.55x and 1.5-2.1x faster than hoisting, on one
  core as on two): XLA's CPU code for the hoisted step (a slice of the [L, N, 4H]
  projections, + h @ U, the gate math) is slower than for the cell as written
  (x @ W + h @ U + b, the gate math) by more than the hoisted GEMM saves; we did not find why
  (an optimization_barrier around the slice or the sum did not change it);
* layers: an unrolled Python loop (`layers="unroll"`) and a `lax.scan` over the stacked
  weights (`layers="scan"`) measured within noise of each other (5%; the grid RNN's loop once
  1.17x faster): the loop is kept. The dilated RNN can only be unrolled (each layer has its
  own dilation, so its own shapes): its layer k is one scan over L / 2**k steps of a batch of
  2**k * N rows (the strided split is a reshape of the time axis);
* attention: a written-out softmax(q k^T / sqrt(d)) v (two einsums) in the data's own
  [B, heads, T, d] layout (`attention="einsum"`), which measured 2.1x (flash attention) and
  1.3x (BigBird) faster than `jax.nn.dot_product_attention` (`attention="dpa"`, its `xla`
  implementation on the CPU; correct for both: dense, no mask, default scale 1 / sqrt(d); the
  flash-attention data laid out [B, T, heads, d] for it before the calls). BigBird's windows
  are gathered (one gather of 5 key blocks per query block) as the torch baseline gathers
  them, the query blocks the "heads" of one dense attention each.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np

from .baselines import Baseline, _layers, _sequence, b2b_matrices


def _jax():
    import jax
    return jax


def unavailable() -> str:
    """Why the JAX baselines cannot run here ("" when they can): an import that fails (not
    installed, or made unimportable) is an absent row, never a crash."""
    try:
        import jax  # noqa: F401
        import jax.numpy  # noqa: F401
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] in ("jax", "jaxlib"):
            return "not installed (jax)"
        return f"not importable (jax: {e})"
    return ""


def _baseline(fn, args, shape=lambda r: r, expected=None) -> Baseline:
    """A Baseline of `jax.jit(fn)(*args)`: the arguments put on the device once, the timed call
    blocked until its result is ready, the result as numpy laid out by `shape`."""
    jax = _jax()
    jitted = jax.jit(fn)
    args = [jax.device_put(np.ascontiguousarray(a)) for a in args]

    def run():
        return jax.block_until_ready(jitted(*args))
    return Baseline(run, lambda: shape(jax.tree.map(np.asarray, run())), expected or (lambda eager: eager))


def _time_major(xss) -> np.ndarray:
    return _sequence(xss).transpose(1, 0, 2)  # [L, N, H]


def _batch_major(hs):
    """[..., L, N, H] (time-major) -> [N, ..., L, 1, H] (the eager layout)."""
    return np.moveaxis(hs, -2, 0)[..., None, :]


def _stack(layer, x, weights, layers: str):
    """Every layer's output, stacked: `layer(x, *w)` -> the next x, over the layers' weights
    (arrays with the layer first), as an unrolled loop or a lax.scan."""
    jax = _jax()
    if layers == "scan":
        return jax.lax.scan(lambda h, w: (layer(h, *w),) * 2, x, weights)[1]
    out = []
    for d in range(weights[0].shape[0]):
        x = layer(x, *(w[d] for w in weights))
        out.append(x)
    return jax.tree.map(lambda *a: jax.numpy.stack(a), *out)


def _zeros(x, last=None):
    return _jax().numpy.zeros(x.shape[1:-1] + (last or x.shape[-1],), x.dtype)


def _scan_steps(step, init, inputs):
    """lax.scan over the leading (time) axis; the per-step outputs are the states."""
    return _jax().lax.scan(lambda s, a: (step(s, a),) * 2, init, inputs)[1]


# -- RNNs ------------------------------------------------------------------------------------

def rnn(xss, ws, layers="unroll", hoist=True) -> Baseline:
    """stacked_rnn (Listing 1): per layer a scan over time of s = x @ w + s."""
    def layer(x, w):
        if hoist:
            return _scan_steps(lambda s, xw: xw + s, _zeros(x), x @ w)
        return _scan_steps(lambda s, xt: xt @ w + s, _zeros(x), x)

    return _baseline(lambda x, W: _stack(layer, x, (W,), layers), (_time_major(xss), ws.to_numpy()),
                     _batch_major)


def _lstm_step(U, hoisted_b=None, W=None):
    """One LSTM step on (h, c) with the gates concatenated (i, f, o, g): its input is the
    step's x @ W + b when hoisted (W None), else x."""
    jnp = _jax().numpy

    def step(hc, a):
        h, c = hc
        g = a + h @ U if W is None else a @ W + h @ U + hoisted_b
        i, f, o, gg = jnp.split(g, 4, axis=-1)
        sig = _jax().nn.sigmoid
        c = sig(f) * c + sig(i) * jnp.tanh(gg)
        return sig(o) * jnp.tanh(c), c
    return step


def _lstm_layer(x, W, U, b, hoist, dilation=1):
    """One LSTM layer over x [L, N, H] -> (hs, cs) [L, N, H]; with a dilation d the step t
    reads step t - d: the d interleaved subsequences are one batch of d * N rows."""
    L, N, H = x.shape
    x = x.reshape(L // dilation, dilation * N, H)
    zero = _zeros(x)
    if hoist:
        hs, cs = _scan_steps(_lstm_step(U), (zero, zero), x @ W + b)
    else:
        hs, cs = _scan_steps(_lstm_step(U, b, W), (zero, zero), x)
    return hs.reshape(L, N, H), cs.reshape(L, N, H)


def _lstm_weights(wss, uss, bss):
    """Each operand's gates concatenated, layers stacked: W, U [D, H, 4H], b [D, 1, 4H]."""
    return tuple(np.stack(a) for a in zip(*_layers(wss, uss, bss)))


def lstm(xss, wss, uss, bss, layers="unroll", hoist=False) -> Baseline:
    """stacked_lstm: per layer a scan over time of the LSTM cell; every layer's h and c."""
    def layer(hc, W, U, b):
        return _lstm_layer(hc[0], W, U, b, hoist)

    def call(x, W, U, b):
        return _stack(layer, (x, x), (W, U, b), layers)

    return _baseline(call, (_time_major(xss),) + _lstm_weights(wss, uss, bss),
                     lambda r: tuple(map(_batch_major, r)))


def dilated(xss, wss, uss, bss, hoist=False) -> Baseline:
    """dilated_rnn: layer k an LSTM over 2**k interleaved subsequences (an unrolled loop: each
    layer has its own dilation); the top layer's hidden states."""
    def call(x, W, U, b):
        for k in range(W.shape[0]):
            x, _ = _lstm_layer(x, W[k], U[k], b[k], hoist, dilation=2 ** k)
        return x

    return _baseline(call, (_time_major(xss),) + _lstm_weights(wss, uss, bss), _batch_major)


def grid(xss, yss, wx, wy, ws, u1s, u2s, bs, layers="unroll", hoist=True) -> Baseline:
    """grid_rnn: per layer a scan over the rows (state: the row above) of a scan over the cells
    (state: the cell to the left); with `hoist`, g @ w + b (per layer) and a row's h_up @ u2
    (per row) are GEMMs outside the scans, else each cell computes its three products."""
    jnp = _jax().numpy

    def layer(g, W, U1, U2, b):  # g [L1, L2, N, H]
        if hoist:
            def row(up, a):  # a: the row's g @ W + b
                return _scan_steps(lambda left, r: jnp.tanh(r + left @ U1), _zeros(up), a + up @ U2)
            return _scan_steps(row, jnp.zeros(g.shape[1:], g.dtype), g @ W + b)

        def cell(left, up_x):
            return jnp.tanh(up_x[1] @ W + left @ U1 + up_x[0] @ U2 + b)
        return _scan_steps(lambda up, row: _scan_steps(cell, _zeros(up), (up, row)),
                           jnp.zeros(g.shape[1:], g.dtype), g)

    def call(x, y, Wx, Wy, W, U1, U2, b):
        g = (x @ Wx)[:, None] + (y @ Wy)[None, :]
        return _stack(layer, g, (W, U1, U2, b), layers)

    arrays = [a.to_numpy() for a in (ws, u1s, u2s, bs)]
    return _baseline(call, [_time_major(xss), _time_major(yss), np.asarray(wx), np.asarray(wy)] + arrays,
                     _batch_major)


# -- attention and GEMMs ---------------------------------------------------------------------

def two_matmuls(a_tiles, b_tiles, c_tiles) -> Baseline:
    """b2b_gemm: (A @ B) @ C on the whole matrices, one jitted call (XLA may fuse nothing
    more: two dots)."""
    A, Bm, Cm, shape = b2b_matrices(a_tiles, b_tiles, c_tiles)
    return _baseline(lambda a, b, c: (a @ b) @ c, (A, Bm, Cm), lambda r: r.reshape(shape))


BTHD = (0, 2, 1, 3)  # [B, heads, T, d] <-> [B, T, heads, d], jax.nn.dot_product_attention's layout


def _attend(q, k, v, attention):
    """softmax(q k^T / sqrt(d)) v over [B, heads, T, d] data ("einsum"), or over [B, T, heads, d]
    data through jax.nn.dot_product_attention ("dpa"; its default scale is 1 / sqrt(d))."""
    jax = _jax()
    if attention == "dpa":
        return jax.nn.dot_product_attention(q, k, v)
    s = jax.numpy.einsum("bhqd,bhkd->bhqk", q * (1.0 / np.sqrt(q.shape[-1])), k)
    return jax.numpy.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


def attention(qsss, ksss, vsss, attention="einsum") -> Baseline:
    """flash_attention: dense attention over the whole sequences, every batch and head (for
    "dpa" the data are laid out [B, T, heads, d] once, before the calls)."""
    q, k, v = (x.to_numpy() for x in (qsss, ksss, vsss))  # [B, NH, T, t, d]
    shape = q.shape
    q, k, v = (x.reshape(x.shape[0], x.shape[1], -1, x.shape[-1]) for x in (q, k, v))
    if attention == "dpa":
        return _baseline(_jax().nn.dot_product_attention, [x.transpose(BTHD) for x in (q, k, v)],
                         lambda r: r.transpose(BTHD).reshape(shape))
    return _baseline(lambda q, k, v: _attend(q, k, v, attention), (q, k, v), lambda r: r.reshape(shape))


def bigbird(qss, kss, vss, attention="einsum") -> Baseline:
    """bigbird: query blocks 2..nb-3 against their window of 3 key blocks and the first and
    last (global) key blocks, gathered as the torch baseline gathers them; the query blocks
    are the batch of one dense attention each."""
    q, k, v = (x.to_numpy() for x in (qss, kss, vss))  # [B, nb, bs, d]
    B, nb, bs, d = q.shape
    blocks = np.array([[0, i - 1, i, i + 1, nb - 1] for i in range(2, nb - 2)])  # [nb - 4, 5]

    def window(x):  # [B, nb, bs, d] -> [B, nb - 4, 5 bs, d]
        return x[:, blocks].reshape(B, nb - 4, 5 * bs, d)

    def call(q, k, v):
        q, k, v = q[:, 2:nb - 2], window(k), window(v)
        if attention == "dpa":  # the gathered windows laid out for it
            return _attend(*(x.transpose(BTHD) for x in (q, k, v)), attention).transpose(BTHD)
        return _attend(q, k, v, attention)
    return _baseline(call, (q, k, v))


# -- the settings measured -------------------------------------------------------------------

LAYERS, HOIST, ATTENTION = ("unroll", "scan"), (True, False), ("einsum", "dpa")
# workload -> (its baseline, {option: the values measured}); the function's default is the one kept
OPTIONS = {
    "stacked_rnn": (rnn, {"layers": LAYERS, "hoist": HOIST}),
    "stacked_lstm": (lstm, {"layers": LAYERS, "hoist": HOIST}),
    "dilated_rnn": (dilated, {"hoist": HOIST}),
    "grid_rnn": (grid, {"layers": LAYERS, "hoist": HOIST}),
    "b2b_gemm": (two_matmuls, {}),
    "flash_attention": (attention, {"attention": ATTENTION}),
    "bigbird": (bigbird, {"attention": ATTENTION}),
}


def variants(workload: str) -> list:
    """(label, function) for the default settings and each alternative, one option changed."""
    fn, options = OPTIONS[workload]
    defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items()}
    out = [("default", fn)]
    for option, values in options.items():
        out += [(f"{option}={v}", functools.partial(fn, **{option: v})) for v in values if v != defaults[option]]
    return out
