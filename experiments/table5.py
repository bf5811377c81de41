"""Table 5 / Figure 6: region3 of the stacked RNN (Listing 1), lowered to element level,
reordered; writes T, the new bounds and the transformed access maps as text + ISL strings
(results/table5_<preset>.txt; --quick: the small sizes, --paper: the paper's).

    python -m polyft.experiments.table5 [--quick | --paper] [--out DIR]
"""
from __future__ import annotations

import polyft as ft
from polyft.deps.analyze import analyze
from polyft.deps.model import build
from polyft.affine import ge
from polyft.workloads import stacked_rnn
from polyft.schedule.lower import lower
from polyft.schedule.reorder import reorder, table
from polyft.schedule.schedule import distances

from .common import path, write_text
from .reproduce import main


def region3(preset: str = "paper"):
    """(lowered model, dependences, statement name, Reordering) for region3 (j >= 1, k >= 1)."""
    etdg = ft.trace(stacked_rnn.program, *stacked_rnn.specs(preset))
    st = etdg.statements[0]
    _, j, k = st.dims
    low = lower(build(etdg), st.name, region=(ge(j, 1), ge(k, 1)))
    deps = analyze(low)
    dist = distances(deps, [st.name], 0, [False] * len(low.dim_names))
    return low, deps, st.name, reorder(low, st.name, dist)


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> str:
    """Write and return the table (one computation: nothing to resume)."""
    low, _, name, R = region3("paper" if preset == "paper" else "small")
    text = ("Table 5 / Figure 6: region3 of the stacked RNN (Listing 1) at element level,\n"
            f"dims {low.dim_names} = (t5 batch map, t4 layer scanl, t3 time scanl, t2 element map)\n\n"
            + table(low, name, R) + "\n")
    write_text(path(out_dir, "table5.txt", preset), text)
    return text


def result_text(out_dir: str, preset: str) -> str:
    with open(path(out_dir, "table5.txt", preset)) as f:
        return f.read()


if __name__ == "__main__":
    raise SystemExit(main("table5", __doc__))
