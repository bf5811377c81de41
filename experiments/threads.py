"""Threads that never hurt: the generated C of every workload at the quick shapes (Figure 7's),
on one thread, on every core, and at the default (emit/threads.py: the count measured fastest
per program), with the machine idle and with another process busy on one core.

The three run interleaved, call by call, on one compiled program per workload (the pinned
counts bypass the default's measurements); medians of REPEATS calls after a warm-up of
WARMUP. `ratio_to_one_thread` is a count's median over one thread's; the target is <= 1.2 for
the default, idle and loaded. `chosen` is what the default ran its timed calls on.

The shapes are Figure 7's quick ones under either preset. Writes results/threads_<preset>.csv.

    python -m polyft.experiments.threads [--quick | --paper] [--out DIR] [--resume]
"""
from __future__ import annotations

import collections
import statistics
import subprocess
import sys
import time

import pandas as pd

import polyft as ft
from polyft.emit.threads import cores
from polyft.workloads import get

from .common import meta, path, sweep
from .fig7 import QUICK
from .measure import shape_string
from .reproduce import main

REPEATS = 15
WARMUP = 6  # the default's first calls try each count
LOADS = ("idle", "one core busy")


def _timed(run) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def measure(workload: str, sizes: dict, load: str, repeats: int = REPEATS) -> list:
    """Rows for one workload under one load: pinned 1, pinned every core, default."""
    mod = get(workload)
    inputs = mod.inputs("small", seed=1, **sizes)
    prog = ft.compile(mod.program, *inputs)
    run, _ = prog.bind(*inputs)
    choice = prog.threads
    most = cores()
    counts = {"1": 1, f"all ({most})": most, "default (measured)": None}
    times, chosen = collections.defaultdict(list), collections.Counter()
    for k in range(WARMUP + repeats):
        for label, n in counts.items():
            choice.fixed = n
            t = _timed(run)
            if k >= WARMUP:
                times[label].append(t)
                if n is None:
                    chosen[choice.last] += 1
    choice.fixed = None
    one = statistics.median(times["1"])
    rows = []
    for label in counts:
        med = statistics.median(times[label])
        rows.append(dict(workload=workload, shape=shape_string(sizes), load=load, threads=label,
                         seconds=med, seconds_max=max(times[label]), repeats=repeats,
                         ratio_to_one_thread=med / one,
                         chosen=", ".join(f"{n} thread(s) x{c}" for n, c in sorted(chosen.items())) if label.startswith("default") else ""))
    return rows


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    info = dict(preset=preset, **meta())

    def point(p) -> list:
        load, w = p
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load != "idle" else None
        try:
            return [dict(r, **info) for r in measure(w, QUICK[w], load)]
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    return sweep("threads", preset, out_dir, [(load, w) for load in LOADS for w in QUICK], point, resume=resume,
                 key=lambda p: {"load": p[0], "workload": p[1]})


def result_text(out_dir: str, preset: str) -> str:
    """Each count's time over one thread's, per workload and load (the target: <= 1.2 for the default)."""
    df = pd.read_csv(path(out_dir, "threads.csv", preset))
    piv = df.pivot_table(index="workload", columns=["load", "threads"], values="ratio_to_one_thread", sort=False)
    return "time / one thread's time\n" + piv.to_string(float_format=lambda v: f"{v:.2f}x")


if __name__ == "__main__":
    raise SystemExit(main("threads", __doc__))
