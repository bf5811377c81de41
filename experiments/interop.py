"""The cost of calling a compiled program from torch and JAX (ft.torch.function, ft.jax.function)
over calling the program alone on numpy arrays, per call, on the CPU.

Two programs: `tiny` (one [1, 4] element through a tanh: almost no native work, so the time is
the call path) and `lstm` (the character model's two-layer LSTM, polyft.workloads.stacked_lstm at
N=4, L=12, H=16), both on one thread (as torch, set to one thread here). Systems, each the median
over BATCHES of the mean of a batch of calls, in wall time (`seconds`) and in the process's CPU
time (`cpu_seconds`, which a busy machine inflates less: it leaves out the time spent waiting for a
core):

* `native`: the generated code alone on buffers in place (prog.bind's run());
* `program`: the compiled program called on numpy arrays (prog.run_arrays: its checks, its
  buffers allocated, the native code) -- what the boundary is measured against;
* `torch-forward`: layer(*tensors) under torch.no_grad; `torch-autograd`: the same with inputs
  that require grad (the autograd.Function records its node);
* `program-pullback` and `torch-backward`: the pullback program on numpy, and torch.autograd.grad
  through the layer (the pullback and autograd's engine);
* `jax-jit`: the jitted ft.jax.function (pure_callback) with block_until_ready.

`boundary_us` is a row's wall time over `program`'s (over `program-pullback`'s for
`torch-backward`), in microseconds, and `cpu_boundary_us` the same in CPU time. Timings on a
shared machine are noisy (the `load` column: the load average while measuring): measure on an
idle one.

    python -m polyft.experiments.interop [--quick | --paper] [--out DIR]
"""
from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd

import polyft as ft
from polyft.workloads import stacked_lstm

from .common import meta, path, write_csv
from .reproduce import main

CALLS = {"quick": 200, "paper": 2000}  # calls per batch
BATCHES = 5


def tiny(x):
    return ft.tanh(x)


def lstm(xss, wss, uss, bss):
    hsss, _ = stacked_lstm.program(xss, wss, uss, bss)
    return hsss.map(lambda hss: hss[-1])


def _programs():
    """name -> (fn, specs, example numpy inputs)."""
    rng = np.random.default_rng(0)
    H = 16
    lstm_inputs = [rng.standard_normal(s).astype(np.float32) * 0.3
                   for s in [(4, 12, 1, H), (2, 4, H, H), (2, 4, H, H), (2, 4, 1, H)]]
    lstm_specs = (ft.spec(f"[N, L]float32[1, {H}]"), ft.spec(f"[2, 4]float32[{H}, {H}]"),
                  ft.spec(f"[2, 4]float32[{H}, {H}]"), ft.spec(f"[2, 4]float32[1, {H}]"))
    return {"tiny": (tiny, (ft.spec("float32[1, 4]"),), [rng.standard_normal((1, 4)).astype(np.float32)]),
            "lstm": (lstm, lstm_specs, lstm_inputs)}


def _per_call(fn, calls: int) -> tuple:
    """(wall, CPU) seconds per call: the medians over BATCHES of a batch's mean (after one batch to
    warm up)."""
    wall, cpu = [], []
    for k in range(BATCHES + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        wall.append((time.perf_counter() - t0) / calls)
        cpu.append((time.process_time() - c0) / calls)
    return float(np.median(wall[1:])), float(np.median(cpu[1:]))


def _torch_rows(fn, specs, arrays, calls):
    import torch
    layer = ft.torch.function(fn, *specs, coarsen=False, alternative=False)
    prog, pullback = layer.program, layer.pullback
    for p in (prog, pullback):
        p.threads.fixed = 1  # one thread: what the boundary adds, not OpenMP's start-up
    cts = [np.ones_like(o) for o in prog.run_arrays(*arrays)]
    run, _ = prog.bind(*arrays)
    tensors = [torch.from_numpy(a) for a in arrays]
    grads = [torch.from_numpy(a).requires_grad_() for a in arrays]
    out = layer(*grads)
    ct = torch.from_numpy(cts[0])

    def no_grad():
        with torch.no_grad():
            layer(*tensors)

    def backward():
        torch.autograd.grad(out, grads, ct, retain_graph=True)
    return [("native", _per_call(run, calls)), ("program", _per_call(lambda: prog.run_arrays(*arrays), calls)),
            ("torch-forward", _per_call(no_grad, calls)), ("torch-autograd", _per_call(lambda: layer(*grads), calls)),
            ("program-pullback", _per_call(lambda: pullback.run_arrays(*arrays, *cts), calls)),
            ("torch-backward", _per_call(backward, calls))]


def _jax_rows(fn, specs, arrays, calls):
    try:
        import jax
    except ImportError:
        return [("jax-jit", (float("nan"), float("nan")))]
    f = jax.jit(ft.jax.function(fn, *specs, coarsen=False, alternative=False))
    args = [jax.numpy.asarray(a) for a in arrays]
    return [("jax-jit", _per_call(lambda: jax.block_until_ready(f(*args)), calls))]


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        for name, (fn, specs, arrays) in _programs().items():
            times = dict(_torch_rows(fn, specs, arrays, CALLS[preset]) + _jax_rows(fn, specs, arrays, CALLS[preset]))
            shape = ";".join("x".join(map(str, a.shape)) for a in arrays)
            for system, (seconds, cpu) in times.items():
                wall0, cpu0 = times["program-pullback" if system == "torch-backward" else "program"]
                over = system.startswith(("torch", "jax"))
                rows.append(dict(workload=name, shape=shape, system=system, seconds=seconds, cpu_seconds=cpu,
                                 boundary_us=(seconds - wall0) * 1e6 if over else None,
                                 cpu_boundary_us=(cpu - cpu0) * 1e6 if over else None,
                                 load=os.getloadavg()[0], **meta()))
    finally:
        torch.set_num_threads(threads)
    df = pd.DataFrame(rows)
    write_csv(df, path(out_dir, "interop.csv", preset))
    return df


def result_text(out_dir: str, preset: str) -> str:
    df = pd.read_csv(path(out_dir, "interop.csv", preset))
    table = df.pivot_table(index="system", columns="workload", values=["seconds", "cpu_seconds"], sort=False) * 1e6
    boundary = df.pivot_table(index="system", columns="workload", values=["boundary_us", "cpu_boundary_us"],
                              sort=False)
    return (f"microseconds per call (wall, CPU; load average {df['load'].max():.1f})\n" + table.round(1).to_string()
            + "\n\nover the program alone (us)\n" + boundary.round(1).to_string())


if __name__ == "__main__":
    raise SystemExit(main("interop", __doc__))
