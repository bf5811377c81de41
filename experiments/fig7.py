"""Figure 7: end-to-end time of every workload (Table 6) under every system, one shape each
(experiments/measure.py: checked against eager numpy, or against the first torch baseline
where eager numpy is too slow; warm-up; median of repeats). The plot (results/fig7_<preset>.png)
annotates polyft's speedup over the best baseline per workload.

    --quick  CPU shapes a few times the "small" preset (below)
    --paper  each workload's "paper" preset: Table 6's shapes (for a GPU machine)

Writes results/fig7_<preset>.csv.
"""
from __future__ import annotations

import pandas as pd

from polyft.workloads import WORKLOADS, get

from .common import path
from .measure import Point, sweep, times_table
from .reproduce import main

QUICK = {
    "stacked_rnn": dict(N=16, H=128, L=32, D=8),
    "stacked_lstm": dict(N=16, H=128, L=32, D=8),
    "dilated_rnn": dict(N=16, H=128, L=32, D=4),
    "grid_rnn": dict(N=16, H=64, L1=8, L2=8, D=4),
    "b2b_gemm": dict(M=1024, N=256, K=64, P=64, tm=64, tn=64),
    "flash_attention": dict(B=2, NH=4, Lq=256, Lk=512, tq=32, tk=32, d=64),
    "bigbird": dict(B=2, nb=16, bs=32, d=64),
}


def points(preset: str) -> list:
    if preset == "quick":
        return [Point(w, QUICK[w]) for w in WORKLOADS]
    return [Point(w, dict(get(w).PRESETS["paper"])) for w in WORKLOADS]


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    return sweep("fig7", points(preset), preset, out_dir, resume=resume)


def result_text(out_dir: str, preset: str) -> str:
    """Median ms per workload and system (the speedups: the plot step's summary)."""
    return times_table(pd.read_csv(path(out_dir, "fig7.csv", preset)), ["workload"])


if __name__ == "__main__":
    raise SystemExit(main("fig7", __doc__))
