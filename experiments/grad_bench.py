"""Forward + backward of the stacked LSTM on the CPU: polyft's pullback as one compiled C program
(forward and backward traced together by ft.vjp), eager, against torch.nn.LSTM's forward+backward
and jax.grad of a lax.scan LSTM (an `absent` row without JAX). The compiled program's and JAX's
gradients are checked against the eager pullback's first (their relative error in the status
column); torch's loss differs (below), so its gradients are not compared. The compiled program
is built once per H from specs (N, L, D symbolic), not coarsened (one statement per operation
node; auto schedule). Each row also carries the
forward+backward program's memory (`prog.memory(sizes)`, allocated bytes) and, up to
EAGER_STEPS cells, its critical path. Writes results/grad_bench_<preset>.csv.

The loss differs in one respect: polyft and JAX differentiate the sum of every layer's h and c
(Listing 2 returns them all); torch.nn.LSTM returns the top layer only, so its loss is the sum of
its top layer's outputs (the same work: one backward through every layer and step).

    python -m polyft.experiments.grad_bench [--quick | --paper] [--out DIR]
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

import polyft as ft
from polyft.testing import rel_error
from polyft.workloads import stacked_lstm

from .common import meta, path, write_csv
from .reproduce import main

SHAPES = {"quick": [dict(N=2, H=16, L=4, D=2)],
          "paper": [dict(N=8, H=64, L=16, D=4), dict(N=64, H=256, L=64, D=8)]}
EAGER_STEPS = 64  # the eager pullback runs one Python call per cell: timed up to N * L * D cells
REPEATS = 3


def forward_backward(xss, wss, uss, bss, ct_h, ct_c):
    """Gradients of sum(ct_h * hsss) + sum(ct_c * csss) for the four inputs: one program."""
    _, pullback = ft.vjp(stacked_lstm.program, xss, wss, uss, bss)
    return pullback(ct_h, ct_c)


def _median_seconds(run) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _torch_row(inputs, size):
    import torch
    N, H, L, D = size["N"], size["H"], size["L"], size["D"]
    lstm = torch.nn.LSTM(H, H, D, batch_first=True)
    x = torch.tensor(inputs[0].to_numpy().reshape(N, L, H), requires_grad=True)

    def run():
        lstm.zero_grad()
        out, _ = lstm(x)
        out.sum().backward()
    return "torch-nn.LSTM", _median_seconds(run), "ok (loss: top layer's h)"


def _jax_row(inputs, expected):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return "jax-grad-lax.scan", float("nan"), "absent (no jax)"
    jax.config.update("jax_enable_x64", False)

    def loss(xs, ws, us, bs):  # xs [N, L, 1, H]; ws, us [D, 4, H, H]; bs [D, 4, 1, H]
        total = 0.0
        hs = jnp.swapaxes(xs, 0, 1)  # time-major
        for d in range(ws.shape[0]):
            def step(state, x, d=d):
                h, c = state
                g = [x @ ws[d, k] + h @ us[d, k] + bs[d, k] for k in range(4)]
                c = jax.nn.sigmoid(g[1]) * c + jax.nn.sigmoid(g[0]) * jnp.tanh(g[3])
                h = jax.nn.sigmoid(g[2]) * jnp.tanh(c)
                return (h, c), (h, c)
            zero = jnp.zeros_like(hs[0])
            _, (hs, cs) = jax.lax.scan(step, (zero, zero), hs)
            total = total + hs.sum() + cs.sum()
        return total

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    arrays = [jnp.asarray(x.to_numpy()) for x in inputs]
    got = grad(*arrays)
    err = max(rel_error(np.asarray(g), e) for g, e in zip(got, expected))
    return "jax-grad-lax.scan", _median_seconds(lambda: jax.block_until_ready(grad(*arrays))), \
        f"ok (rel error {err:.1e})"


_COMPILED: dict = {}  # H -> the compiled forward+backward program


def compiled(H: int):
    """The forward+backward program compiled to C once from specs (N, L, D symbolic; H fixed):
    the schedule and code do not depend on the lengths, so one build serves every shape (built
    from concrete inputs, the auto schedule's per-statement hyperplanes peel the critical path
    instance by instance: minutes at N=8 L=16 D=4, far more at the paper shape)."""
    if H not in _COMPILED:
        ct = ft.spec(f"[N, D, L]float32[1, {H}]")
        _COMPILED[H] = ft.compile(forward_backward, *stacked_lstm.specs(H=H), ct, ct, target="c", coarsen=False)
    return _COMPILED[H]


def _critical_path(inputs, cts) -> int | None:
    """Instances on the longest chain of the forward+backward program at these lengths (where
    they are small: the count peels the chain instance by instance)."""
    return ft.analyze(forward_backward, *inputs, *cts, schedule="original", coarsen=False).schedule.critical_path


def _rows(size):
    inputs = stacked_lstm.lstm_inputs(size["N"], size["D"], size["L"], size["H"], seed=0)
    hsss, csss = stacked_lstm.program(*inputs)
    cts = [ft.FractalTensor.from_numpy(np.ones_like(o.to_numpy()), 3) for o in (hsss, csss)]
    expected = [g.to_numpy() for g in forward_backward(*inputs, *cts)]
    prog = compiled(size["H"])
    err = max(rel_error(g, e) for g, e in zip(prog(*inputs, *cts), expected))
    memory = int(prog.memory(sizes={k: size[k] for k in ("N", "L", "D")})["allocated_bytes"].sum())
    rows = [("polyft-c-auto", _median_seconds(lambda: prog(*inputs, *cts)), f"ok (rel error {err:.1e})")]
    small = size["N"] * size["L"] * size["D"] <= EAGER_STEPS
    if small:
        rows.append(("polyft-eager", _median_seconds(lambda: forward_backward(*inputs, *cts)), "ok"))
    rows.append(_torch_row(inputs, size))
    rows.append(_jax_row(inputs, expected))
    shape = ",".join(f"{k}={v}" for k, v in size.items())
    critical = _critical_path(inputs, cts) if small else None
    return [dict(workload="stacked_lstm", shape=shape, system=system, seconds=seconds, status=status,
                 backward_memory_bytes=memory, critical_path=critical, **meta())
            for system, seconds, status in rows]


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    df = pd.DataFrame([row for size in SHAPES[preset] for row in _rows(size)])
    write_csv(df, path(out_dir, "grad_bench.csv", preset))
    return df


def result_text(out_dir: str, preset: str) -> str:
    df = pd.read_csv(path(out_dir, "grad_bench.csv", preset))
    table = df.pivot_table(index="shape", columns="system", values="seconds") * 1e3
    return "forward+backward of the stacked LSTM, median ms\n" + table.round(2).to_string()


if __name__ == "__main__":
    raise SystemExit(main("grad_bench", __doc__))
