"""CPU benchmark of the RNN family: eager numpy, generated C (original and auto schedules; for
the stacked LSTM also a tiled wavefront written by hand), a torch eager per-cell loop,
torch.nn.LSTM and JAX (jax.jit of lax.scan; an absent row without JAX), side by side in one run, checked against the eager result before timing
(experiments/measure.py). Writes results/cpu_rnn_<preset>.csv.

    python -m polyft.experiments.cpu_rnn [--quick | --paper] [--out DIR] [--resume]
"""
from __future__ import annotations

import pandas as pd

from .common import path
from .measure import Point, sweep
from .reproduce import main

# (workload, sizes) sweeps; --quick keeps `polyft reproduce --quick` within minutes on 2 cores
SWEEPS = {
    "quick": [("stacked_lstm", dict(N=16, H=128, L=32, D=d)) for d in (1, 4, 8)]
    + [("dilated_rnn", dict(N=16, H=128, L=32, D=d)) for d in (1, 2, 4)]
    + [("grid_rnn", dict(N=16, H=64, L1=8, L2=8, D=d)) for d in (1, 2, 4)],
    "paper": [("stacked_lstm", dict(N=16, H=256, L=64, D=d)) for d in (1, 4, 8, 16)]
    + [("dilated_rnn", dict(N=16, H=256, L=64, D=d)) for d in (1, 2, 4, 6)]
    + [("grid_rnn", dict(N=16, H=128, L1=16, L2=16, D=d)) for d in (1, 2, 4, 8)],
}


def points(preset: str) -> list:
    return [Point(w, size, {"depth": size["D"]}) for w, size in SWEEPS[preset]]


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False,
        repeats: int | None = None) -> pd.DataFrame:
    return sweep("cpu_rnn", points(preset), preset, out_dir, repeats, resume, by_hand=True)


def result_text(out_dir: str, preset: str) -> str:
    return table(pd.read_csv(path(out_dir, "cpu_rnn.csv", preset)))


PEERS = ("torch-", "jax-")  # the peers a user would pick instead of polyft (not eager numpy)


def table(df: pd.DataFrame) -> str:
    """Markdown: median ms per system, and the ratios the issue asks about: c-auto against
    eager numpy, the torch per-cell loop and the fastest peer measured (torch or JAX; a ratio
    above 1 means c-auto is faster)."""
    df = df[df["status"] == "ok"]
    order = list(dict.fromkeys(df["system"]))
    df = df.assign(key=df["workload"] + "|" + df["shape"])
    piv = df.pivot_table(index=["key"], columns="system", values="seconds")[order] * 1e3
    piv = piv.loc[list(dict.fromkeys(df["key"]))]
    peers = [s for s in piv.columns if s.startswith(PEERS)]
    lines = ["| workload | shape | " + " | ".join(piv.columns) + " | c-auto vs eager | c-auto vs torch loop | "
             "c-auto vs fastest peer (torch, JAX) |", "|---|---|" + "---|" * (len(piv.columns) + 3)]
    for key, row in piv.iterrows():
        w, s = key.split("|")
        cells = " | ".join("-" if pd.isna(v) else f"{v:.2f}" for v in row)
        fastest = row[peers].dropna()
        peer = f"{fastest.min() / row['c-auto']:.2f}x ({fastest.idxmin()})" if len(fastest) else "-"
        lines.append(f"| {w} | {s} | {cells} | {row.get('numpy-eager', float('nan')) / row['c-auto']:.1f}x | "
                     f"{row['torch-cell-loop'] / row['c-auto']:.2f}x | {peer} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main("cpu_rnn", __doc__))
