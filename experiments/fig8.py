"""Figure 8: scaling of the stacked LSTM, the dilated RNN and the grid RNN with depth and with
sequence length, for the "middle" and the "large" model, every system side by side
(experiments/measure.py). Plot: results/fig8_<preset>.png; depth ratios:
results/depth_scaling_<preset>.csv.

    --paper  batch 256, hidden 256 ("middle") and 1024 ("large"); depth 1, 4, ..., 32 at
             length 64 (dilated RNN: 1..6 layers, dilations 1..32; grid RNN: a 10 x 10 grid);
             length 32, 64, 128 at the full depth (grid RNN: both grid sides)
    --quick  the same panels scaled down for 2 CPU cores: batch 8, hidden 64 / 256,
             depth 1..8 (dilated 1..4) at length 16 (grid 4 x 4), length 8, 16, 32 at depth 4
             (grid sides 4, 8, 16)

Writes results/fig8_<preset>.csv with columns model, panel (depth | seq_len), depth, seq_len.
"""
from __future__ import annotations

import pandas as pd

from .common import path
from .measure import Point, sweep, times_table
from .reproduce import main

CONFIG = {
    "quick": dict(N=8, hidden={"middle": 64, "large": 256},
                  depth={"stacked_lstm": (1, 2, 4, 8), "dilated_rnn": (1, 2, 3, 4), "grid_rnn": (1, 2, 4, 8)},
                  length={"stacked_lstm": 16, "dilated_rnn": 16, "grid_rnn": 4},
                  seq_len={"stacked_lstm": (8, 16, 32), "dilated_rnn": (8, 16, 32), "grid_rnn": (4, 8, 16)},
                  seq_depth={"stacked_lstm": 4, "dilated_rnn": 4, "grid_rnn": 4}),
    "paper": dict(N=256, hidden={"middle": 256, "large": 1024},
                  depth={"stacked_lstm": tuple([1] + list(range(4, 33, 4))), "dilated_rnn": (1, 2, 3, 4, 5, 6),
                         "grid_rnn": tuple([1] + list(range(4, 33, 4)))},
                  length={"stacked_lstm": 64, "dilated_rnn": 64, "grid_rnn": 10},
                  seq_len={w: (32, 64, 128) for w in ("stacked_lstm", "dilated_rnn", "grid_rnn")},
                  seq_depth={"stacked_lstm": 32, "dilated_rnn": 6, "grid_rnn": 32}),
}
WORKLOADS = ("stacked_lstm", "dilated_rnn", "grid_rnn")


def _sizes(workload: str, N: int, H: int, D: int, L: int) -> dict:
    lengths = dict(L1=L, L2=L) if workload == "grid_rnn" else dict(L=L)
    return dict(N=N, H=H, D=D, **lengths)


def points(preset: str) -> list:
    c = CONFIG[preset]
    out = []
    for model, H in c["hidden"].items():
        for w in WORKLOADS:
            out += [Point(w, _sizes(w, c["N"], H, d, c["length"][w]),
                          dict(model=model, panel="depth", depth=d, seq_len=c["length"][w])) for d in c["depth"][w]]
            d = c["seq_depth"][w]
            out += [Point(w, _sizes(w, c["N"], H, d, L), dict(model=model, panel="seq_len", depth=d, seq_len=L))
                    for L in c["seq_len"][w]]
    return out


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    return sweep("fig8", points(preset), preset, out_dir, resume=resume)


def result_text(out_dir: str, preset: str) -> str:
    df = pd.read_csv(path(out_dir, "fig8.csv", preset))
    return times_table(df, ["model", "panel", "workload", "depth", "seq_len"])


if __name__ == "__main__":
    raise SystemExit(main("fig8", __doc__))
