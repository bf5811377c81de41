"""Measure one workload at one size across systems, and sweeps of such points: the one place
the timing artefacts (cpu_rnn, fig2, fig7, fig8) measure anything.

For one point (workload, sizes) every system of the workload gets one tidy row:

* the reference: the eager numpy program (`numpy-eager`), or, where eager numpy would be too
  slow (more than EAGER_LIMIT instances of the workload's lengths, e.g. the paper's shapes),
  the workload's first torch baseline run on the CPU; `checked_against` names it;
* each system is built (generated code compiled, data moved to its device), run once and its
  result checked against the reference (relative error in norm < CPU_TOL, GPU_TOL on a GPU:
  TF32 and other kernels); then the systems that passed are run `warmup` more times and
  timed `repeats` times or more (short calls until MIN_TURN seconds a turn), in turns (time_calls: a change of the machine's load falls on all of
  them alike, so their ratios hold on a noisy machine);
  `seconds` is the median, `seconds_min` / `seconds_max` the spread. A system that fails its
  check gets status "wrong: ..." and no time; `sweep` writes the CSV and then fails loudly;
* systems that cannot run here are rows too, never dropped: status "absent: no GPU",
  "absent: not installed (pycuda)", "absent: not implemented (...)"; eager numpy beyond
  EAGER_LIMIT is "skipped: ...".

Systems: on the CPU `numpy-eager`, `c-original` and `c-auto` (generated C, ft.compile with
schedule "original" / "auto", OpenMP, at the default threads; c-auto also times the original
order of its coarsened statements and runs the faster: `schedule` says which ran most),
`c-auto-1thread` (the same object pinned to one thread: what the threads add), with `by_hand`
`c-wavefront` (the auto schedule alone) and `c-tiled-wavefront`, the torch baselines of
experiments/baselines.py and `jax-jit`, the JAX baseline of experiments/baselines_jax.py
(absent: "not installed (jax)" where JAX, the optional `bench` extra, cannot be imported).
CPU threads: torch's $POLYFT_THREADS, else every core (`threads` column; JAX: XLA's pool, every
core, whatever $POLYFT_THREADS says); the generated C
runs on its measured default (emit/threads.py), unless $POLYFT_THREADS pins it too; `load` is the 1-minute load average when the point started (other jobs on the machine). On a GPU `polyft-cuda-original/auto`
(generated CUDA through PyCUDA), every torch baseline on CUDA (`<name>-cuda`: the per-cell
loops; torch.nn.LSTM = cuDNN; SDPA = FlashAttention-2's kernel; two GEMMs = cuBLAS),
`torch-compile-cuda` (the first baseline through torch.compile) and `triton` (no Triton
kernels here: always absent). GPU times are wall times between device synchronisations.
"""
from __future__ import annotations

import collections
import importlib.util
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

import polyft as ft
from polyft.testing import rel_error
from polyft.workloads import get
from polyft.workloads import sizes as full_sizes

from . import baselines, baselines_jax, common
from .common import cap_peers, cpu_name, meta
from .deps_time import lengths

EAGER = "numpy-eager"
EAGER_LIMIT = 20_000  # product of the workload's lengths above which eager numpy is skipped
CPU_TOL, GPU_TOL = 1e-4, 2e-3
REPEATS = {"quick": 5, "paper": 10}
WARMUP = 8  # the generated C's schedule and thread choices try each option in its first calls (emit/measured.py)

# workload -> torch baselines: (system name, function in baselines, what it is)
TORCH = {
    "stacked_rnn": [("torch-cell-loop", baselines.rnn_cell_loop, "eager PyTorch, one cell call per (layer, step)")],
    "stacked_lstm": [("torch-cell-loop", baselines.lstm_cell_loop, "eager PyTorch, one cell call per (layer, step)"),
                     ("torch-nn-lstm", baselines.nn_lstm, "torch.nn.LSTM, all layers in one call (cuDNN on a GPU)")],
    "dilated_rnn": [("torch-cell-loop", baselines.dilated_cell_loop, "eager PyTorch, one cell call per (layer, step)")],
    "grid_rnn": [("torch-cell-loop", baselines.grid_cell_loop, "eager PyTorch, one cell call per (layer, grid cell)")],
    "b2b_gemm": [("torch-matmul", baselines.two_matmuls, "(A @ B) @ C, two GEMMs (cuBLAS on a GPU)")],
    "flash_attention": [("torch-sdpa", baselines.sdpa,
                         "scaled_dot_product_attention (FlashAttention-2's kernel on a GPU)")],
    "bigbird": [("torch-blocked", baselines.blocked_bigbird, "blocked attention over gathered key/value blocks")],
}
# workload -> its JAX baseline (experiments/baselines_jax.py; JAX is the optional `bench` extra)
JAX = {
    "stacked_rnn": (baselines_jax.rnn, "jax.jit: per layer a lax.scan over time, the input projection hoisted"),
    "stacked_lstm": (baselines_jax.lstm, "jax.jit: per layer a lax.scan over time, the 4 gates as one [H, 4H] matmul"),
    "dilated_rnn": (baselines_jax.dilated, "jax.jit: per layer a lax.scan over L / 2**k steps of 2**k subsequences"),
    "grid_rnn": (baselines_jax.grid, "jax.jit: per layer a lax.scan over rows of a lax.scan over cells"),
    "b2b_gemm": (baselines_jax.two_matmuls, "jax.jit: (A @ B) @ C"),
    "flash_attention": (baselines_jax.attention, "jax.jit: softmax(q k^T / sqrt(d)) v, dense"),
    "bigbird": (baselines_jax.bigbird, "jax.jit: attention over gathered key/value blocks"),
}


@dataclass
class System:
    """One way to run a workload: `build(inputs)` -> baselines.Baseline (run, result, expected)."""

    name: str
    device: str  # "cpu" | "cuda"
    build: Callable | None
    absent: str = ""  # why it cannot run here ("" when it can)
    note: str = ""
    threads: int | None = None  # the threads it runs on, where not torch's (set_threads)


# -- which systems exist here ----------------------------------------------------------------

def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def gpu_available() -> bool:
    if not _installed("torch"):
        return False
    import torch
    return torch.cuda.is_available()


def _why_absent(gpu: bool, modules=(), missing_impl: str = "") -> str:
    reasons = [] if gpu else ["no GPU"]
    reasons += [f"not installed ({m})" for m in modules if not _installed(m)]
    reasons += [f"not implemented ({missing_impl})"] if missing_impl else []
    return "; ".join(reasons)


_COMPILED: dict = {}


def _polyft(target: str, schedule: str, threads: int | None = None, coarsen: bool = False, alternative=None):
    """Generated code: compiled once per (workload, static shape) from the specs, so one
    shared object serves every length of a sweep; bound to the point's inputs for timing.
    `threads` pins the C target's thread count for this system's calls (else its default);
    `coarsen` and `alternative` as ft.compile's (for a schedule by hand; the auto schedule alone).
    Its row's `schedule` column: the schedule most of its calls ran (emit/schedule_choice.py)."""
    def build(inputs, workload=None, sizes=None):
        mod = get(workload)
        specs = mod.specs("small", **sizes)
        key = (workload, target, schedule, alternative, tuple(str(s) for s in specs))
        if key not in _COMPILED:
            _COMPILED[key] = ft.compile(mod.program, *specs, target=target, schedule=schedule, coarsen=coarsen,
                                        alternative=alternative)
        prog = _COMPILED[key]
        bound, _ = prog.bind(*inputs)
        ran = collections.Counter()

        def go():
            bound()
            ran[prog.schedule_choice.last if prog.schedule_choice else prog.schedule.kind] += 1

        def columns():
            return dict(schedule=ran.most_common(1)[0][0] if ran else "")
        if threads is None:
            return baselines.Baseline(go, lambda: prog(*inputs), columns=columns)

        def pinned(fn):
            def call():
                default, prog.threads.fixed = prog.threads.fixed, threads
                try:
                    return fn()
                finally:
                    prog.threads.fixed = default
            return call
        return baselines.Baseline(pinned(go), pinned(lambda: prog(*inputs)), columns=columns)
    return build


def _eager(inputs, workload=None, sizes=None):
    mod = get(workload)
    return baselines.Baseline(lambda: mod.program(*inputs), lambda: mod.program(*inputs))


def _torch(fn, device, compile=False):
    def build(inputs, workload=None, sizes=None):
        return fn(*inputs, device=device, compile=compile)
    return build


def _jax(fn):
    def build(inputs, workload=None, sizes=None):
        return fn(*inputs)
    return build


def systems(workload: str, by_hand: bool = False) -> list:
    """Every system of `workload`, CPU first, GPU ones absent (with the reason) where they
    cannot run here; with `by_hand`, also the workload's schedule by hand where it has one."""
    gpu = gpu_available()
    out = [System(EAGER, "cpu", _eager,
                  note="the program run eagerly on numpy (the reference; its BLAS on one thread while timed)"),
           System("c-original", "cpu", _polyft("c", "original"), note="generated C, the nest as written"),
           System("c-auto", "cpu", _polyft("c", "auto"),
                  note="generated C, coarsened and reordered (§5); where that differs from the original order, "
                       "each call runs the one of the two measured faster (schedule column: which ran most)"),
           System("c-auto-1thread", "cpu", _polyft("c", "auto", threads=1),
                  note="c-auto pinned to one thread", threads=1)]
    if by_hand:
        out.append(System("c-wavefront", "cpu", _polyft("c", "auto", alternative=False),
                          note="generated C, the auto schedule alone (alternative=False): the wavefront "
                               "where it reorders, never the original order"))
    if by_hand and hasattr(get(workload), "tiled_wavefront"):
        out.append(System("c-tiled-wavefront", "cpu", _polyft("c", get(workload).tiled_wavefront(), coarsen=True),
                          note="generated C, a schedule by hand: each layer's steps in tiles of 4, the tiles "
                               "in a wavefront (the weights of one layer kept for 4 steps)"))
    out += [System(name, "cpu", _torch(fn, "cpu"), note=what) for name, fn, what in TORCH[workload]]
    fn, what = JAX[workload]
    out.append(System("jax-jit", "cpu", _jax(fn), baselines_jax.unavailable(), what,
                      threads=os.cpu_count() or 1))  # XLA's thread pool: every core
    cuda = _why_absent(gpu, ["pycuda"])
    out += [System(f"polyft-cuda-{s}", "cuda", _polyft("cuda", s), cuda, f"generated CUDA, schedule {s}")
            for s in ("original", "auto")]
    torch_cuda = _why_absent(gpu)
    out += [System(f"{name}-cuda", "cuda", _torch(fn, "cuda"), torch_cuda, what) for name, fn, what in TORCH[workload]]
    name, fn, what = TORCH[workload][0]
    out.append(System("torch-compile-cuda", "cuda", _torch(fn, "cuda", compile=True), torch_cuda,
                      f"torch.compile of {name} ({what})"))
    out.append(System("triton", "cuda", None, _why_absent(gpu, ["triton"], "no Triton kernels in experiments/"),
                      "hand-written Triton kernels (the paper's best baseline for grid RNN and BigBird)"))
    return out


# -- timing ----------------------------------------------------------------------------------

def _sync(device):
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


ROUNDS = 3  # the timed calls of a point come in this many turns per system (time_calls)
# seconds of quiet before each system's turn: the previous system's idle OpenMP workers stop
# spinning (libgomp: 300 000 spins, ~8 ms on the 2-core VM of results/, before they sleep; the
# generated C shares torch's libgomp, loaded first, so emit/threads.py's brief_spin does not
# apply), which would otherwise take a core from the next system: JAX (XLA's own thread pool)
# ran its first calls after the C's or torch's turn up to 3.5x slower (stacked RNN, D=16)
SETTLE = 0.02
# a turn of a system runs at least its share of the repeats and at least this many seconds (at
# most MAX_CALLS_PER_TURN calls): 5 timed calls of a 0.3 ms workload (b2b GEMM, BigBird at the
# quick shapes) are 1.5 ms of timing, and their median moved by 1.5x between two runs
MIN_TURN = 0.05
MAX_CALLS_PER_TURN = 100


def _timed(fn, device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def time_calls(calls: list, repeats: int, warmup: int = WARMUP) -> list:
    """Seconds of `repeats` or more calls of each (fn, device) in `calls` (more for short calls:
    MIN_TURN), after `warmup` calls of each.
    The timed calls come in ROUNDS turns, each system in turn running one untimed call and then
    its share of the repeats: a change of the machine's load while they are timed falls on all of
    them alike, so their ratios hold. Each turn starts after SETTLE seconds of quiet (the other
    system's OpenMP workers stop spinning) and one untimed call (this one's workers wake up).
    numpy's BLAS runs on one thread meanwhile: OpenBLAS's idle worker spins about 0.1 s after
    each call it helps with, and the generated C's two threads ran 1.9x slower in that time
    (b2b GEMM), so a system timed after eager numpy's turn lost a core to it, and the C's
    thread choice could settle on one thread for the rest of its calls."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1, user_api="blas"):
        for fn, device in calls:
            for _ in range(warmup):
                _timed(fn, device)
        times = [[] for _ in calls]
        for r in range(ROUNDS):
            share = repeats // ROUNDS + (r < repeats % ROUNDS)
            for (fn, device), out in zip(calls, times):
                time.sleep(SETTLE)
                _timed(fn, device)
                turn = [_timed(fn, device) for _ in range(share)]
                while sum(turn) < MIN_TURN and len(turn) < MAX_CALLS_PER_TURN:
                    turn.append(_timed(fn, device))
                out += turn
    return times


def device_name(device: str) -> str:
    if device == "cpu":
        return cpu_name()
    if gpu_available():
        import torch
        return torch.cuda.getdevice_name()
    return "none (no GPU)"


def set_threads() -> int:
    """torch's intra-op threads: $POLYFT_THREADS, else every core. The generated C takes its own
    count per call (emit/threads.py): $POLYFT_THREADS pinned, else the faster of one thread and
    every core as measured on the program's calls."""
    import torch
    n = int(os.environ.get("POLYFT_THREADS") or 0) or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def shape_string(sizes: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sizes.items())


def instances(workload: str, sizes: dict) -> int:
    """Product of the workload's lengths at these sizes: how much eager numpy would loop."""
    mod = get(workload)
    return int(np.prod(list(lengths(workload, full_sizes(workload, mod.PRESETS, "small", sizes)).values())))


def measure(workload: str, sizes: dict, preset: str = "quick", repeats: int | None = None,
            warmup: int = WARMUP, extra: dict | None = None, info: dict | None = None, by_hand: bool = False) -> list:
    """One row per system of `workload` at `sizes` (inputs: the "small" preset overridden
    by `sizes`, seed 1); `extra` columns (depth, panel, ...) are copied into every row;
    `by_hand` as systems'."""
    cap_peers()  # torch and JAX at $POLYFT_MARCH's level, as the generated C
    mod = get(workload)
    repeats = repeats or REPEATS.get(preset, 3)
    info = {k: v for k, v in (info or meta()).items() if k != "device"}  # device: per system
    inputs = mod.inputs("small", seed=1, **sizes)
    common = dict(workload=workload, shape=shape_string(sizes), **(extra or {}))
    eager_ok = instances(workload, sizes) <= EAGER_LIMIT
    if eager_ok:
        reference, ref_name = mod.program(*inputs), EAGER
    else:  # the first torch baseline on the CPU, laid out as the eager result
        name, fn, _ = TORCH[workload][0]
        reference, ref_name = fn(*inputs).result(), f"{name} (cpu)"
    load, threads = os.getloadavg()[0], set_threads()
    rows, timed = [], []  # timed: (row, built system, device) of those that passed their check
    for system in systems(workload, by_hand):
        row = dict(common, system=system.name, device=device_name(system.device), status="ok", schedule="",
                   seconds=float("nan"), seconds_min=float("nan"), seconds_max=float("nan"), repeats=0,
                   warmup=0, rel_error=float("nan"), checked_against="",
                   threads=system.threads or threads,
                   load=round(load, 2), preset=preset, **info, note=system.note)
        rows.append(row)
        if system.absent:
            row["status"] = f"absent: {system.absent}"
            continue
        if system.name == EAGER and not eager_ok:
            row["status"] = f"skipped: eager numpy too slow here (> {EAGER_LIMIT} instances)"
            continue
        b = system.build(inputs, workload=workload, sizes=sizes)
        if system.name != EAGER:  # (eager's first run made the reference)
            err = rel_error(b.result(), b.expected(reference))  # the first run: also a warm-up
            row.update(rel_error=err, checked_against=ref_name)
            if not err < (GPU_TOL if system.device == "cuda" else CPU_TOL):
                row["status"] = f"wrong: rel error {err:.2e} against {ref_name}"
                continue
        timed.append((row, b, system.device))
    for (row, b, _), times in zip(timed, time_calls([(b.run, device) for _, b, device in timed], repeats, warmup)):
        row.update(seconds=statistics.median(times), seconds_min=min(times), seconds_max=max(times),
                   repeats=len(times), warmup=warmup + 1, **b.columns())
    return rows


@dataclass
class Point:
    """One measurement point of a sweep: a workload at sizes, with the columns that place it
    in a figure (depth, seq_len, model, panel, ...)."""

    workload: str
    sizes: dict
    extra: dict = field(default_factory=dict)


def sweep(name: str, points: list, preset: str, out_dir: str, repeats: int | None = None,
          resume: bool = False, by_hand: bool = False) -> pd.DataFrame:
    """Measure every point (common.sweep: <out_dir>/<name>_<preset>.csv written after each point,
    a progress bar, --resume; `by_hand` as systems'). Raises after writing when a system
    disagreed with the reference."""
    info = meta()
    df = common.sweep(name, preset, out_dir, points,
                      lambda p: measure(p.workload, p.sizes, preset, repeats, extra=p.extra, info=info,
                                        by_hand=by_hand),
                      key=lambda p: dict(workload=p.workload, shape=shape_string(p.sizes), **p.extra), resume=resume)
    wrong = df[df["status"].str.startswith("wrong")]
    if len(wrong):
        raise AssertionError(f"{name}: {len(wrong)} systems disagree with the reference:\n"
                             + wrong[["workload", "shape", "system", "status"]].to_string(index=False))
    return df


def times_table(df: pd.DataFrame, index: list) -> str:
    """A sweep's CSV as text: median ms per point (rows: `index`) and system (columns: those
    measured here), then the systems that were not."""
    ok = df[df["status"] == "ok"]
    order = list(dict.fromkeys(ok["system"]))
    piv = ok.pivot_table(index=index, columns="system", values="seconds", sort=False)[order] * 1e3
    absent = [s for s in dict.fromkeys(df["system"]) if s not in order]
    return (f"median ms per system ({len(ok)} measurements)\n"
            + piv.to_string(float_format=lambda v: f"{v:.2f}", na_rep="-")
            + (f"\nnot measured here: {', '.join(absent)}" if absent else ""))
