"""Figure 2: time against stack depth for the stacked RNN (Listing 1) and the stacked LSTM
(Listing 2), every system side by side (experiments/measure.py: checked against eager numpy,
warm-up, median of repeats). The paper's claim: with the parallelism across layers and time
steps exposed, time must not grow linearly with depth (plot: results/fig2_<preset>.png; the
ratios time(deepest) / time(depth 1) per system: results/depth_scaling_<preset>.csv).

    --quick  CPU: batch 16, hidden 128, length 32, depth 1, 4, 8, ..., 32
    --paper  Table 6 / Figure 8 "middle": batch 256, hidden 256, length 64, depth 1, 4, ..., 32

Writes results/fig2_<preset>.csv (one row per workload, depth and system; GPU systems are rows
with status "absent: ..." where there is no GPU). Beside c-auto (which runs the faster of the
wavefront and the original order, emit/schedule_choice.py) it times the wavefront alone
(`c-wavefront`) and, for the LSTM, a tiled wavefront by hand (`c-tiled-wavefront`).
"""
from __future__ import annotations

import pandas as pd

from .common import path
from .measure import Point, sweep, times_table
from .reproduce import main

DEPTHS = (1, 4, 8, 12, 16, 20, 24, 28, 32)  # the paper's: 1 to 32, every 4
SHAPES = {"quick": (dict(N=16, H=128, L=32), DEPTHS), "paper": (dict(N=256, H=256, L=64), DEPTHS)}
WORKLOADS = ("stacked_rnn", "stacked_lstm")


def points(preset: str) -> list:
    base, depths = SHAPES[preset]
    return [Point(w, dict(base, D=d), {"depth": d}) for w in WORKLOADS for d in depths]


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    return sweep("fig2", points(preset), preset, out_dir, resume=resume, by_hand=True)


def result_text(out_dir: str, preset: str) -> str:
    return times_table(pd.read_csv(path(out_dir, "fig2.csv", preset)), ["workload", "depth"])


if __name__ == "__main__":
    raise SystemExit(main("fig2", __doc__))
