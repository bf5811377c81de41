"""The generated GEMM against the machine's measured single-core peak.

Two probes of the peak, on one thread: `fma-probe`, a C loop of independent vector FMAs
compiled with the C target's flags (what the core can issue), and `torch-mm`, torch's
matrix product of 1024 x 1024 matrices (what a tuned library reaches). Then the products the
workloads run, as polyft programs compiled to C and pinned to one thread: a map of row blocks
times one shared weight matrix (an RNN's `x @ W` over a batch tile), and the LSTM-style sum
`x @ W + h @ U`, which the C target computes as one GEMM over [x h] and [W; U]. Each is run
with the micro-kernel chosen for this CPU and with the portable 4 x 16 one, beside torch's
matmul of the same matrices on one thread; where the C target packs the shared matrices
(1 MiB or more, c_target.packed_weights), also with the chosen kernel reading them in place
(`unpacked`). Results are checked against numpy before timing.

`gflops` is 2 * multiply-adds / median seconds; `of_fma_peak` its fraction of the FMA probe.
Writes results/gemm_<preset>.csv.

    python -m polyft.experiments.gemm [--quick | --paper] [--out DIR] [--resume]
"""
from __future__ import annotations

import ctypes
import statistics
import time

import numpy as np
import pandas as pd

import polyft as ft
from polyft.emit import runtime_c
from polyft.emit.c_target import micro_kernel
from polyft.emit.targets import TARGETS
from polyft.testing import rel_error

from .common import meta, path, sweep
from .reproduce import main

REPEATS = {"quick": 21, "paper": 51}
SHAPES = {"quick": [(256, 1, 256), (16, 64, 256), (256, 1, 1024)],
          "paper": [(256, 1, 256), (16, 64, 256), (256, 1, 1024), (1024, 1, 2048)]}

FMA_PROBE = """typedef float v16 __attribute__((vector_size(64)));
double probe(long n, float x)
{  /* 16 independent chains of vector FMAs: the latency hidden, the issue rate measured */
  v16 a[16];
  for (int i = 0; i < 16; i++) a[i] = (v16){0} + x * (i + 1);
  const v16 m = (v16){0} + 0.999999f, b = (v16){0} + 1e-7f;
  for (long k = 0; k < n; k++)
    for (int i = 0; i < 16; i++) a[i] = a[i] * m + b;
  double s = 0;
  for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) s += a[i][j];
  return s;
}
"""


def _best(fn, repeats: int) -> float:
    """Median seconds of fn after two warm-up calls."""
    fn(), fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fma_peak(repeats: int = 7) -> float:
    """GFLOP/s of one core issuing independent vector FMAs (the C target's compiler and flags)."""
    lib = ctypes.CDLL(runtime_c.build(FMA_PROBE, [f for f in runtime_c.FLAGS if f != "-fopenmp"]))
    lib.probe.restype, lib.probe.argtypes = ctypes.c_double, [ctypes.c_long, ctypes.c_float]
    n = 2_000_000
    return 16 * 16 * 2 * n / _best(lambda: lib.probe(n, 1.0), repeats) / 1e9


def torch_peak(repeats: int = 7, n: int = 1024) -> float:
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n ** 3 / _best(lambda: torch.mm(a, b), repeats) / 1e9


def _programs():
    """(name, fn, inputs(M, P, H, rng), numpy reference, products of M*P x H by H x H,
    torch(arrays) -> (run, its result as the reference's array))."""
    def rows(xs, w):
        return xs.map(lambda x: x @ w)

    def gates(xs, hs, w, u):
        return ft.map(lambda x, h: x @ w + h @ u, xs, hs)

    def lstm_gates(xs, hs, ws, us):
        return ft.map(lambda x, h: ft.map(lambda w, u: x @ w + h @ u, ws, us), xs, hs)

    def rows_in(M, P, H, rng):
        return [ft.FractalTensor.from_numpy(rng.standard_normal((M, P, H), dtype=np.float32), depth=1),
                (rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32)]

    def gates_in(M, P, H, rng):
        x, w = rows_in(M, P, H, rng)
        h, u = rows_in(M, P, H, rng)
        return [x, h, w, u]
    def lstm_gates_in(M, P, H, rng):
        x, h, _, _ = gates_in(M, P, H, rng)
        ws, us = ((rng.standard_normal((4, H, H)) / np.sqrt(H)).astype(np.float32) for _ in range(2))
        return [x, h, ft.FractalTensor.from_numpy(ws, depth=1), ft.FractalTensor.from_numpy(us, depth=1)]

    def lstm_gates_ref(x, h, ws, us):  # [M, 4, P, H]
        return np.einsum("mpk,gkq->mgpq", x, ws) + np.einsum("mpk,gkq->mgpq", h, us)

    def same(ref):
        return lambda arrays, shape: _torch_same(arrays, ref, shape)
    return [("x @ W", rows, rows_in, lambda x, w: x @ w, 1, same(lambda x, w: x @ w)),
            ("x @ W + h @ U", gates, gates_in, lambda x, h, w, u: x @ w + h @ u, 2,
             same(lambda x, h, w, u: x @ w + h @ u)),
            ("4 gates: x @ W[g] + h @ U[g]", lstm_gates, lstm_gates_in, lstm_gates_ref, 8, _torch_lstm_gates)]


def _torch_same(arrays, torch_fn, shape):
    """torch's matmuls of the same matrices: the row blocks stacked into one [M*P, H] matrix."""
    import torch
    flat = [torch.from_numpy(a.reshape(-1, a.shape[-1]) if a.ndim == 3 else a) for a in arrays]
    return lambda: torch_fn(*flat), lambda: torch_fn(*flat).numpy().reshape(shape)


def _torch_lstm_gates(arrays, shape):
    """The four gates as torch.nn.LSTM computes them: x @ [W0 .. W3] + h @ [U0 .. U3], the
    gates' weights concatenated once (outside the timing), one addmm over both products."""
    import torch
    x, h, ws, us = arrays
    M, P, H = x.shape
    x, h = (torch.from_numpy(a.reshape(-1, H)) for a in (x, h))
    w, u = (torch.from_numpy(np.ascontiguousarray(a.transpose(1, 0, 2).reshape(H, 4 * H))) for a in (ws, us))

    def run():
        return torch.addmm(torch.mm(x, w), h, u)
    return run, lambda: run().numpy().reshape(M, P, 4, H).transpose(0, 2, 1, 3).reshape(shape)


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    import torch
    torch.set_num_threads(1)
    repeats = REPEATS[preset]
    info = dict(preset=preset, **meta())
    chosen = micro_kernel(runtime_c.native_features())
    kernels = [chosen] + [k for k in [(4, 1)] if k != chosen]
    peak, lib_peak = fma_peak(), torch_peak()
    target = TARGETS["c"][0]

    def point(p) -> list:
        (M, P, H), (name, fn, make, ref, products, torch_fn) = p
        rng = np.random.default_rng(M * P + H)
        inputs = make(M, P, H, rng)
        arrays = [x.to_numpy() if isinstance(x, ft.FractalTensor) else x for x in inputs]
        expected = ref(*arrays)
        flops = 2.0 * products * M * P * H * H
        common = dict(product=name, M=M, P=P, H=H, threads=1, peak_fma_gflops=round(peak, 1),
                      peak_torch_gflops=round(lib_peak, 1), **info)
        systems = []
        variants = [(k, True) for k in kernels]
        if ft.analyze(fn, *inputs).packed:  # also the chosen kernel reading them in place
            variants.append((chosen, False))
        for kernel, pack in variants:
            target.kernel, target.pack = kernel, pack
            try:
                prog = ft.compile(fn, *inputs)
            finally:
                target.kernel, target.pack = None, True
            prog.threads.fixed = 1
            go, _ = prog.bind(*inputs)
            label = f"polyft-c {kernel[0]}x{16 * kernel[1]}" + (" (chosen)" if kernel == chosen and pack else "") \
                + ("" if pack else " unpacked")
            systems.append((label, go, lambda prog=prog: prog(*inputs).to_numpy()))
        systems.append(("torch-mm", *torch_fn(arrays, expected.shape)))
        rows = []
        for label, go, result in systems:
            go()
            err = rel_error(result(), expected)
            if not err < 1e-4:
                raise AssertionError(f"{label} on {name} M={M} P={P} H={H}: rel error {err:.2e}")
            seconds = _best(go, repeats)
            rows.append(dict(common, system=label, seconds=seconds, gflops=flops / seconds / 1e9,
                             of_fma_peak=flops / seconds / 1e9 / peak, rel_error=err))
        return rows
    points = [(shape, program) for shape in SHAPES[preset] for program in _programs()]
    return sweep("gemm", preset, out_dir, points, point, resume=resume,
                 key=lambda p: dict(product=p[1][0], M=p[0][0], P=p[0][1], H=p[0][2]))


def result_text(out_dir: str, preset: str) -> str:
    return table(pd.read_csv(path(out_dir, "gemm.csv", preset)))


def table(df: pd.DataFrame) -> str:
    lines = [f"single-core peak: FMA probe {df['peak_fma_gflops'].iloc[0]} GFLOP/s, "
             f"torch.mm 1024^3 {df['peak_torch_gflops'].iloc[0]} GFLOP/s ({df['device'].iloc[0]})", "",
             "| product | M x P x H | system | GFLOP/s | of FMA peak |", "|---|---|---|---|---|"]
    for r in df.itertuples():
        lines.append(f"| {r.product} | {r.M} x {r.P} x {r.H} | {r.system} | {r.gflops:.1f} | {r.of_fma_peak:.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main("gemm", __doc__))
