"""CPU benchmark of the RNN family: eager numpy, generated C (original and auto schedules),
a torch eager per-cell loop and torch.nn.LSTM, side by side in one run, checked against the
eager result before timing. Writes results/cpu_rnn.csv."""
from __future__ import annotations

import argparse
import os
import statistics
import time

import pandas as pd

import polyft as ft
from polyft.testing import rel_error
from polyft.workloads import get

from . import baselines
from .common import meta

# (workload, sizes) sweeps; --quick keeps `polyft reproduce --quick` within minutes on 2 cores
SWEEPS = {
    "quick": [("stacked_lstm", dict(N=16, H=128, L=32, D=d)) for d in (1, 4, 8)]
    + [("dilated_rnn", dict(N=16, H=128, L=32, D=d)) for d in (1, 2, 4)]
    + [("grid_rnn", dict(N=16, H=64, L1=8, L2=8, D=d)) for d in (1, 2, 4)],
    "paper": [("stacked_lstm", dict(N=16, H=256, L=64, D=d)) for d in (1, 4, 8, 16)]
    + [("dilated_rnn", dict(N=16, H=256, L=64, D=d)) for d in (1, 2, 4, 6)]
    + [("grid_rnn", dict(N=16, H=128, L1=16, L2=16, D=d)) for d in (1, 2, 4, 8)],
}

TORCH_LOOPS = {"stacked_lstm": baselines.lstm_cell_loop, "dilated_rnn": baselines.dilated_cell_loop,
               "grid_rnn": baselines.grid_cell_loop}


def _time(fn, repeats: int):
    fn()  # warm-up (and the result for the check)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def systems(workload, inputs):
    """(name, callable, how to compare its output with eager's) for this workload."""
    mod = get(workload)
    out = [("numpy-eager", lambda: mod.program(*inputs), lambda r, e: rel_error(r, e))]
    for sched in ("original", "auto"):
        prog = ft.compile(mod.program, *inputs, target="c", schedule=sched)
        out.append((f"c-{sched}", lambda p=prog: p(*inputs), lambda r, e: rel_error(r, e)))
    loop = TORCH_LOOPS[workload]
    out.append(("torch-cell-loop", lambda: loop(*inputs), lambda r, e: rel_error(r, e)))
    if workload == "stacked_lstm":
        out.append(("torch-nn-lstm", lambda: baselines.torch_lstm(*inputs),
                    lambda r, e: rel_error(r, e[0].to_numpy()[:, -1])))
    return out


def run(preset: str = "quick", out_dir: str = "results", repeats: int | None = None) -> pd.DataFrame:
    import torch
    repeats = repeats or (3 if preset == "quick" else 5)
    info = meta()
    rows = []
    for workload, size in SWEEPS[preset]:
        mod = get(workload)
        inputs = mod.inputs("small", seed=1, **size)
        expected = mod.program(*inputs)
        for name, fn, check in systems(workload, inputs):
            err = check(fn(), expected)
            if not err < 1e-4:
                raise AssertionError(f"{workload} {size}: {name} differs from eager (rel error {err:.2e})")
            times = _time(fn, repeats)
            rows.append(dict(workload=workload, shape=" ".join(f"{k}={v}" for k, v in size.items()),
                             depth=size["D"], system=name, seconds=statistics.median(times),
                             seconds_min=min(times), seconds_max=max(times), repeats=repeats,
                             rel_error=err, threads=torch.get_num_threads(), preset=preset, **info))
            print(f"  {workload:13s} {rows[-1]['shape']:28s} {name:16s} {rows[-1]['seconds']*1e3:9.1f} ms",
                  flush=True)
    df = pd.DataFrame(rows)
    os.makedirs(out_dir, exist_ok=True)
    df.to_csv(os.path.join(out_dir, "cpu_rnn.csv"), index=False)
    return df


def table(df: pd.DataFrame) -> str:
    """Markdown: median ms per system, and the ratios the issue asks about."""
    order = list(dict.fromkeys(df["system"]))
    df = df.assign(key=df["workload"] + "|" + df["shape"])
    piv = df.pivot_table(index=["key"], columns="system", values="seconds")[order] * 1e3
    piv = piv.loc[list(dict.fromkeys(df["key"]))]
    lines = ["| workload | shape | " + " | ".join(piv.columns) + " | c-auto vs eager | c-auto vs torch loop |",
             "|---|---|" + "---|" * (len(piv.columns) + 2)]
    for key, row in piv.iterrows():
        w, s = key.split("|")
        cells = " | ".join("-" if pd.isna(v) else f"{v:.1f}" for v in row)
        lines.append(f"| {w} | {s} | {cells} | {row['numpy-eager'] / row['c-auto']:.1f}x | "
                     f"{row['torch-cell-loop'] / row['c-auto']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--paper", action="store_true")
    args = ap.parse_args()
    print(table(run("paper" if args.paper else "quick")))
