"""What a call of a compiled program costs beyond its generated code: `prog(*inputs)` as a user
calls it against `bind()`'s zero-argument run (buffers in place, nothing checked), on one thread.

Programs: `x @ W` over N rows of N (N = 8 and 256: the call path must not grow with the data)
and the stacked LSTM's pullback compiled from specs without coarsening (79 buffers, 68 of them
made by each call: intermediates and gradients). Paths, interleaved block by block:
* `bind`: the program run on buffers bound once;
* `prog`: `prog(*inputs)`, each result dropped before the next call (its buffers are recycled);
* `prog, results kept`: the same, with the last KEPT results held, so that every call writes
  fresh output buffers (what a caller that keeps its results pays, page faults included).

Each row: the median and 90th percentile of the call's time over REPEATS calls after WARMUP,
the minor page faults per call, and the load average while measuring (the machine's other
processes skew the medians: compare rows measured together, and rerun on a quiet machine).
Writes results/call_overhead_<preset>.csv.

    python -m polyft.experiments.call_overhead [--quick | --paper] [--out DIR] [--resume]
"""
from __future__ import annotations

import collections
import os
import resource
import time

import numpy as np
import pandas as pd

import polyft as ft

from .common import cpu_family, meta, path, sweep
from .reproduce import main

REPEATS = 400
WARMUP = 20
BLOCK = 20  # calls of one path before the next path's (interleaved, so a change of load hits all)
KEPT = 4
LSTM = {"quick": dict(N=2, H=16, L=4, D=2), "paper": dict(N=8, H=64, L=16, D=4)}


def _matmul(xs, w):
    return xs.map(lambda x: x @ w)


def _programs(preset: str) -> list:
    return [("x @ W", dict(N=8)), ("x @ W", dict(N=256)), ("stacked LSTM pullback", LSTM[preset])]


def _setup(workload: str, sizes: dict):
    """(program, inputs) at these sizes."""
    if workload == "x @ W":
        n = sizes["N"]
        rng = np.random.default_rng(0)
        xs = ft.FractalTensor.from_numpy(rng.standard_normal((n, 1, n)).astype(np.float32), depth=1)
        w = rng.standard_normal((n, n)).astype(np.float32)
        return ft.compile(_matmul, xs, w), (xs, w)
    from polyft.workloads import stacked_lstm

    from .grad_bench import compiled
    inputs = stacked_lstm.lstm_inputs(sizes["N"], sizes["D"], sizes["L"], sizes["H"], seed=0)
    outs = stacked_lstm.program(*inputs)
    cts = [ft.FractalTensor.from_numpy(np.ones(o.to_numpy().shape, np.float32), depth=o.depth) for o in outs]
    return compiled(sizes["H"]), (*inputs, *cts)


def measure(workload: str, sizes: dict, repeats: int = REPEATS) -> list:
    """Rows for one program: each path's median, 90th percentile and page faults per call."""
    prog, inputs = _setup(workload, sizes)
    prog.threads.fixed = 1
    if prog.schedule_choice is not None:  # one schedule for all paths (each path's choice alike)
        prog.schedule_choice.fixed = prog.schedule.kind
    run, _ = prog.bind(*inputs)
    kept = collections.deque(maxlen=KEPT)
    paths = {"bind": run, "prog": lambda: prog(*inputs), "prog, results kept": lambda: kept.append(prog(*inputs))}
    times, faults = collections.defaultdict(list), collections.Counter()
    load = []
    for block in range((WARMUP + repeats) // BLOCK):
        for name, call in paths.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
            if block * BLOCK >= WARMUP:
                faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        load.append(os.getloadavg()[0])
    shape = ", ".join(f"{k}={v}" for k, v in sizes.items())
    bind_median = float(np.median(times["bind"][WARMUP:]))
    rows = []
    for name in paths:
        t = np.array(times[name][WARMUP:])
        rows.append(dict(workload=workload, shape=shape, path=name, buffers=len(prog.layout.buffers),
                         median_us=np.median(t) * 1e6, p90_us=np.percentile(t, 90) * 1e6,
                         over_bind_us=(np.median(t) - bind_median) * 1e6, page_faults_per_call=faults[name] / len(t),
                         repeats=len(t), threads=1, load_average=float(np.median(load))))
    return rows


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    info = dict(preset=preset, cpu_family=cpu_family(), **meta())
    points = _programs(preset)
    return sweep("call_overhead", preset, out_dir, points, lambda p: [dict(r, **info) for r in measure(*p)],
                 key=lambda p: {"workload": p[0], "shape": ", ".join(f"{k}={v}" for k, v in p[1].items())},
                 resume=resume)


def result_text(out_dir: str, preset: str) -> str:
    """Each path's median call and its excess over bind(), per program."""
    df = pd.read_csv(path(out_dir, "call_overhead.csv", preset))
    piv = df.pivot_table(index=["workload", "shape"], columns="path", values="median_us", sort=False)
    return ("median call (us, one thread; the load average is in the CSV)\n"
            + piv.to_string(float_format=lambda v: f"{v:.1f}"))


if __name__ == "__main__":
    raise SystemExit(main("call_overhead", __doc__))
