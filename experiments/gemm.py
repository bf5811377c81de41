"""The generated GEMM against the core's theoretical peak and a BLAS, on every ISA level.

For each -march level this machine can execute (emit.isa.runnable_levels: SSE2, AVX2,
AVX-512, native), the products the workloads run are compiled to C for that level and pinned
to one thread: a map of row blocks times one shared weight matrix (an RNN's `x @ W` over a
batch tile), the LSTM-style sum `x @ W + h @ U` (one GEMM over [x h] and [W; U]) and an LSTM's
four gates. Native's code also runs with the shared matrices read in place (`unpacked`) where
the C target packs them. Beside them, on one thread: torch's matmul of the same matrices (the
gates concatenated, as nn.LSTM) and numpy's sgemm (its BLAS and the kernel it picked are
columns). Results are checked against numpy before timing.

Three references for each level, none sharing the generated code (experiments/peak.py):
`peak_gflops`, the theoretical peak (clock from a dependent-add chain x FP units x lanes x 2);
`probe_gflops`, independent vector multiply-add chains at the level's width, or without FMA
chains of multiplies and chains of adds (what the core issues); and the BLAS rows. Besides torch and numpy at the CPU's own ISA, OpenBLAS runs at
each lower level (`openblas-<core>` rows: numpy in a child process with $OPENBLAS_CORETYPE set
to a core of that ISA, LEVEL_BLAS), so a level's code meets a BLAS that has no more than its
instructions. `of_peak` is gflops over the level's theoretical peak, `vs_blas` over the
fastest BLAS row at the CPU's ISA on the same product, `vs_level_blas` over the BLAS of the
row's own level; `suspect` flags a rate above the theoretical peak (a measurement error: a
wrong clock or flop count).
Writes results/gemm_<preset>.csv.

    python -m polyft.experiments.gemm [--quick | --paper] [--out DIR] [--resume]
"""
from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import pandas as pd

import polyft as ft
from polyft.emit import isa, runtime_c
from polyft.emit.targets import TARGETS
from polyft.testing import rel_error

from .common import meta, path, sweep
from .peak import clock_ghz, fp_units, theoretical_gflops
from .reproduce import main

REPEATS = {"quick": 21, "paper": 51}
ROUNDS = 7  # the systems of a point are timed round-robin, each keeping its best round: a shared
#             VM's slow spells (a busy neighbour on the core's other hardware thread) last seconds,
#             systems timed one after the other met different ones, and with 3 rounds a whole point
#             could fall in one: SSE2's code and OpenBLAS-Prescott (more instructions a flop, so
#             the more a shared front end slows them) then ran at 26 of their quiet 43 GFLOP/s
# OpenBLAS cores whose kernels a level's instructions run (the x86-64 level's SSE2 has no core
# of its own: Prescott's kernels add SSE3's loads and moves, no wider vectors, no FMA)
LEVEL_BLAS = {"x86-64": "Prescott", "haswell": "Haswell", "skylake-avx512": "SkylakeX"}
SHAPES = {"quick": [(256, 1, 256), (16, 64, 256), (256, 1, 1024)],
          "paper": [(256, 1, 256), (16, 64, 256), (256, 1, 1024), (1024, 1, 2048)]}

FMA_PROBE = """typedef float vec __attribute__((vector_size(4 * LANES)));
double probe(long n, float x)
{  /* CHAINS independent chains, the latency hidden, the issue rate measured: of vector
      multiply-adds, or with SPLIT (no FMA) half of multiplies and half of adds */
  vec a[CHAINS];
  for (int i = 0; i < CHAINS; i++) a[i] = (vec){0} + x * (i + 1);
  const vec m = (vec){0} + 0.999999f, b = (vec){0} + 1e-7f;
  for (long k = 0; k < n; k++)
#ifdef SPLIT
    for (int i = 0; i < CHAINS; i += 2) { a[i] = a[i] * m; a[i + 1] = a[i + 1] + b; }
#else
    for (int i = 0; i < CHAINS; i++) a[i] = a[i] * m + b;
#endif
  double s = 0;
  for (int i = 0; i < CHAINS; i++) for (int j = 0; j < LANES; j++) s += a[i][j];
  return s;
}
"""


PROBE_CHAINS = 12  # at least this many multiply-add chains
SPLIT_CHAINS = 14  # 7 multiply and 7 add chains + 2 constants: SSE2's 16 registers


def _best(fn, repeats: int) -> float:
    """Median seconds of fn after two warm-up calls."""
    fn(), fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fma_probe(level: str, repeats: int = 7) -> float:
    """GFLOP/s of one core issuing independent vector operations at `level`'s width. With FMA:
    multiply-add chains, as many as its GEMM micro-kernel has accumulators (they fit its
    registers) and at least PROBE_CHAINS. Without FMA: SPLIT_CHAINS chains, half of multiplies
    and half of adds, as a GEMM without FMA issues a product's multiply and add, each into its
    own chain; chains of a multiply then an add had two latencies to hide, and 12 of them
    measured 49-78% of a Zen 4 core's two multiplies and two adds a cycle in runs where the
    SSE2 GEMM itself reached 75-79%."""
    spec = isa.isa(isa.features(level))
    chains = max(spec.kernel[0] * spec.kernel[1], PROBE_CHAINS) if spec.fma else SPLIT_CHAINS
    flags = [f for f in runtime_c.compile_flags(level) if f != "-fopenmp"] + ["-ffp-contract=fast"]  # a * m + b fused
    if "__AVX__" in isa.features(level):  # GCC may split a vector wider than its tuning prefers
        flags.append(f"-mprefer-vector-width={32 * spec.lanes}")
    flags += [f"-DLANES={spec.lanes}", f"-DCHAINS={chains}"] + ([] if spec.fma else ["-DSPLIT"])
    lib = ctypes.CDLL(runtime_c.build(FMA_PROBE, flags))
    lib.probe.restype, lib.probe.argtypes = ctypes.c_double, [ctypes.c_long, ctypes.c_float]
    n = 2_000_000
    flops = chains * spec.lanes * (2 if spec.fma else 1) * n  # a multiply-add 2 flops a lane, else 1
    return flops / _best(lambda: lib.probe(n, 1.0), repeats) / 1e9


def _programs():
    """(name, fn, inputs(M, P, H, rng), numpy reference, products of M*P x H by H x H,
    torch(arrays, shape) and numpy(arrays, shape) -> (run on one thread, its result as the
    reference's array))."""
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
    def numpy_same(ref):
        return lambda arrays, shape: _numpy_same(arrays, ref, shape)
    return [("x @ W", rows, rows_in, lambda x, w: x @ w, 1, same(lambda x, w: x @ w),
             numpy_same(lambda x, w: x @ w)),
            ("x @ W + h @ U", gates, gates_in, lambda x, h, w, u: x @ w + h @ u, 2,
             same(lambda x, h, w, u: x @ w + h @ u), numpy_same(lambda x, h, w, u: x @ w + h @ u)),
            ("4 gates: x @ W[g] + h @ U[g]", lstm_gates, lstm_gates_in, lstm_gates_ref, 8, _torch_lstm_gates,
             _numpy_lstm_gates)]


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


def _numpy_same(arrays, numpy_fn, shape):
    """numpy's matmuls of the same matrices (on one thread: `run` holds threadpoolctl's limit
    for the whole experiment, as entering it each call cost more than a 256^3 product)."""
    flat = [a.reshape(-1, a.shape[-1]) if a.ndim == 3 else a for a in arrays]

    def run():
        return numpy_fn(*flat)
    return run, lambda: run().reshape(shape)


def _numpy_lstm_gates(arrays, shape):
    x, h, ws, us = arrays
    M, P, H = x.shape
    x, h = (a.reshape(-1, H) for a in (x, h))
    w, u = (np.ascontiguousarray(a.transpose(1, 0, 2).reshape(H, 4 * H)) for a in (ws, us))
    run, _ = _numpy_same([x, h, w, u], lambda x, h, w, u: x @ w + h @ u, None)
    return run, lambda: run().reshape(M, P, 4, H).transpose(0, 2, 1, 3).reshape(shape)


def blas_name() -> str:
    """numpy's BLAS and the kernel it runs here (OpenBLAS picks one per CPU, or by
    $OPENBLAS_CORETYPE)."""
    from threadpoolctl import threadpool_info
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    return f"{blas[0]['internal_api']} {blas[0].get('architecture') or ''}".strip() if blas else "unknown"


def _blas_child() -> None:
    """LevelBlas's child process: numpy's BLAS, loaded under the parent's $OPENBLAS_CORETYPE.
    Reads the points (a JSON line: repeats, [[M, P, H], program index] each), answers the
    BLAS's name and each point's rel error against float64 (a JSON line), then times the point
    of each index it reads (one call of `_best` a line) until stdin closes."""
    from threadpoolctl import threadpool_limits
    request = json.loads(sys.stdin.readline())
    calls, errors = [], []
    with threadpool_limits(1, user_api="blas"):
        for (M, P, H), index in request["points"]:
            _, _, make, ref, _, _, numpy_fn = _programs()[index]
            inputs = make(M, P, H, np.random.default_rng(M * P + H))
            arrays = [x.to_numpy() if isinstance(x, ft.FractalTensor) else x for x in inputs]
            expected = ref(*(a.astype(np.float64) for a in arrays))
            go, result = numpy_fn(arrays, expected.shape)
            calls.append(go)
            errors.append(float(rel_error(result(), expected)))
        print(json.dumps({"blas": blas_name(), "errors": errors}), flush=True)
        for line in sys.stdin:
            print(_best(calls[int(line)], request["repeats"]), flush=True)


class LevelBlas:
    """OpenBLAS at the ISA of a lower level (its LEVEL_BLAS core), in a child process, since
    OpenBLAS picks its kernels when it loads. The child times a point's product when asked
    (`best`), so its turns fall in the rounds beside the other systems' turns. A shared VM's
    128-bit code swings 1.6x between slow and fast spells: a BLAS timed apart meets other spells."""

    def __init__(self, level: str, points: list, repeats: int):
        env = dict(os.environ, OPENBLAS_CORETYPE=LEVEL_BLAS[level], OPENBLAS_NUM_THREADS="1")
        code = "from polyft.experiments.gemm import _blas_child; _blas_child()"
        self.child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, env=env)
        self.child.stdin.write(json.dumps(dict(points=points, repeats=repeats)) + "\n")
        self.child.stdin.flush()
        answer = json.loads(self.child.stdout.readline() or "null")
        if answer is None:
            self.close()
            raise RuntimeError(f"the child process timing OpenBLAS at {level} failed")
        self.name, self.errors = answer["blas"], answer["errors"]

    def best(self, index: int) -> float:
        self.child.stdin.write(f"{index}\n")
        self.child.stdin.flush()
        return float(self.child.stdout.readline())

    def close(self):
        self.child.stdin.close()
        self.child.wait()


def level_blases(levels, points: list, repeats: int) -> dict:
    """level -> LevelBlas for the levels below the CPU's own that LEVEL_BLAS names, where
    numpy's BLAS is OpenBLAS built for many cores (as numpy's wheels are): a child that names
    the parent's kernels and not the core asked for did not take $OPENBLAS_CORETYPE (an
    OpenBLAS built for one core), and its level has no BLAS row."""
    native = blas_name()
    if not native.startswith("openblas"):
        return {}
    out = {}
    for level in levels:
        if level in LEVEL_BLAS:
            blas = LevelBlas(level, points, repeats)
            if blas.name == native and LEVEL_BLAS[level] not in native:
                blas.close()
            else:
                out[level] = blas
    return out


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    import torch
    from threadpoolctl import threadpool_limits
    torch.set_num_threads(1)
    with threadpool_limits(1, user_api="blas"):
        return _run(preset, out_dir, resume)


def _run(preset: str, out_dir: str, resume: bool) -> pd.DataFrame:
    repeats = REPEATS[preset]
    info = dict(preset=preset, blas=blas_name(), **meta())
    ghz, units = clock_ghz(), fp_units()
    levels = {}  # level -> (Isa, theoretical GFLOP/s, probe GFLOP/s)
    for level in isa.runnable_levels():
        spec = isa.isa(isa.features(level))
        levels[level] = (spec, theoretical_gflops(spec, ghz, units), fma_probe(level))
    target = TARGETS["c"][0]
    programs = _programs()
    points = [(shape, program) for shape in SHAPES[preset] for program in programs]
    blases = level_blases(levels, [[list(shape), k] for shape in SHAPES[preset] for k in range(len(programs))], repeats)

    def point(p) -> list:
        (M, P, H), (name, fn, make, ref, products, torch_fn, numpy_fn) = p
        rng = np.random.default_rng(M * P + H)
        inputs = make(M, P, H, rng)
        arrays = [x.to_numpy() if isinstance(x, ft.FractalTensor) else x for x in inputs]
        expected = ref(*arrays)
        flops = 2.0 * products * M * P * H * H
        common = dict(product=name, M=M, P=P, H=H, threads=1, clock_ghz=round(ghz, 2), fp_units=units.source, **info)
        systems = []  # (label, level, run, result)
        for level in levels:
            variants = [True] + ([False] if level == "native" and ft.analyze(fn, *inputs).packed else [])
            for pack in variants:
                target.pack = pack
                try:
                    with isa.building_for(level):
                        prog = ft.compile(fn, *inputs)
                finally:
                    target.pack = True
                prog.threads.fixed = 1
                go, _ = prog.bind(*inputs)
                label = "polyft-c" + ("" if pack else " unpacked")
                systems.append((label, level, go, lambda prog=prog: prog(*inputs).to_numpy()))
        systems.append(("torch-mm", "native", *torch_fn(arrays, expected.shape)))
        systems.append(("numpy-sgemm", "native", *numpy_fn(arrays, expected.shape)))
        rows, errors = [], []
        for label, level, go, result in systems:
            go()
            errors.append(rel_error(result(), expected))
            if not errors[-1] < 1e-4:
                raise AssertionError(f"{label} ({level}) on {name} M={M} P={P} H={H}: rel error {errors[-1]:.2e}")
        turns = [lambda go=go: _best(go, repeats) for _, _, go, _ in systems]
        k = points.index(p)
        for level, blas in blases.items():
            if not blas.errors[k] < 1e-4:
                raise AssertionError(f"{blas.name} ({level}) on {name} M={M} P={P} H={H}: rel error {blas.errors[k]:.2e}")
            systems.append((f"openblas-{LEVEL_BLAS[level]}", level, None, None))
            errors.append(blas.errors[k])
            turns.append(lambda blas=blas: blas.best(k))
        rounds = [[turn() for turn in turns] for _ in range(ROUNDS)]
        best = [min(times) for times in zip(*rounds)]
        for (label, level, _, _), seconds, err in zip(systems, best, errors):
            spec, peak, probe = levels[level]
            gflops = flops / seconds / 1e9
            kernel = f"{spec.kernel[0]}x{spec.kernel[1] * spec.lanes}" if label.startswith("polyft") else "-"
            rows.append(dict(common, system=label, level=level, isa=spec.name, kernel=kernel, seconds=seconds,
                             gflops=gflops, peak_gflops=round(peak, 1), probe_gflops=round(probe, 1),
                             of_peak=gflops / peak, of_probe=gflops / probe, suspect=gflops > peak,
                             rel_error=err, **({"blas": blases[level].name} if label.startswith("openblas-") else {})))
        native = max(r["gflops"] for r in rows if r["system"] in ("torch-mm", "numpy-sgemm"))
        at_level = {r["level"]: r["gflops"] for r in rows if r["system"].startswith("openblas-")}
        at_level["native"] = native
        return [dict(r, vs_blas=r["gflops"] / native,
                     vs_level_blas=r["gflops"] / at_level[r["level"]] if r["level"] in at_level else float("nan"))
                for r in rows]
    try:
        return sweep("gemm", preset, out_dir, points, point, resume=resume,
                     key=lambda p: dict(product=p[1][0], M=p[0][0], P=p[0][1], H=p[0][2]))
    finally:
        for blas in blases.values():
            blas.close()


def result_text(out_dir: str, preset: str) -> str:
    return table(pd.read_csv(path(out_dir, "gemm.csv", preset)))


def table(df: pd.DataFrame) -> str:
    first = df.iloc[0]
    lines = [f"one core of {first['device']}, clock {first['clock_ghz']} GHz (dependent-add probe), FP units: "
             f"{first['fp_units']}; numpy's BLAS: {first['blas']}", "",
             "| level (ISA) | theoretical peak | FMA probe |", "|---|---|---|"]
    for level, g in df.groupby("level", sort=False):
        lines.append(f"| {level} ({g['isa'].iloc[0]}) | {g['peak_gflops'].iloc[0]} | {g['probe_gflops'].iloc[0]} |")
    lines += ["", "| product | M x P x H | system | level (ISA) | GFLOP/s | of peak | vs BLAS | vs the level's BLAS |",
              "|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        flag = " (above peak: measurement error)" if r.suspect else ""
        system = r.system if r.kernel == "-" else f"{r.system} {r.kernel}"
        level = "-" if pd.isna(r.vs_level_blas) else f"{r.vs_level_blas:.2f}x"
        lines.append(f"| {r.product} | {r.M} x {r.P} x {r.H} | {system} | {r.level} ({r.isa}) | "
                     f"{r.gflops:.1f} | {r.of_peak:.0%}{flag} | {r.vs_blas:.2f}x | {level} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main("gemm", __doc__))
