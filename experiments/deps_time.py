"""How long the dependence analysis takes: trace -> ISL model -> dependences, per workload.

For every workload at a preset ("paper" by default: the paper's static dims), the program is
traced on its symbolic specs and analysed twice: with parametric lengths (the ISL maps have
parameters N, L, D, ...) and with the preset's concrete lengths fixed by `sizes=` (the same
maps under a context that pins every parameter). Each phase is timed as the median of 5 runs
after a warm-up:

    trace    ft.trace(program, *specs)
    model    deps.model.build(etdg, sizes)      domains, access relations, schedule, checks
    analyze  deps.analyze.analyze(model)        ISL flow, anti/output, distances, reuse
    total    the three together (median of the per-run sums)

The ETDG is analysed as traced (ft.analyze would coarsen it first). Writes tidy CSV
results/deps_time.csv: workload, preset, lengths (symbolic | concrete), sizes, phase, seconds,
repeats, device, commit, date.

    python -m polyft.experiments.deps_time [--preset paper] [--out results]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import pandas as pd

import polyft as ft
from polyft.deps.analyze import analyze
from polyft.deps.model import build
from polyft.errors import PolyftError
from polyft.workloads import WORKLOADS

from .common import meta

PHASES = ("trace", "model", "analyze")
REPEATS = 5


def lengths(name: str, preset) -> dict:
    """The values of a workload's symbolic lengths (the ISL parameters of its specs) at a
    preset (a name, or a dict of sizes as `inputs(**sizes)` takes them), as its
    `inputs(preset)` would give them (without building the inputs)."""
    s = preset if isinstance(preset, dict) else WORKLOADS[name].PRESETS[preset]
    if name in ("stacked_rnn", "stacked_lstm"):
        return {"N": s["N"], "D": s["D"], "L": s["L"]}
    if name == "dilated_rnn":  # the layer count is static: D is a Python loop over layers
        return {"N": s["N"], "L": s["L"]}
    if name == "grid_rnn":
        return {"N": s["N"], "D": s["D"], "L1": s["L1"], "L2": s["L2"]}
    if name == "b2b_gemm":
        return {"MT": s["M"] // s["tm"], "NT": s["N"] // s["tn"]}
    if name == "flash_attention":
        return {"B": s["B"], "NH": s["NH"], "TQ": s["Lq"] // s["tq"], "TK": s["Lk"] // s["tk"]}
    if name == "bigbird":
        return {"B": s["B"], "NB": s["nb"]}
    raise PolyftError(f"deps_time: no lengths known for workload {name!r}", op="deps_time")


def time_once(program, specs, sizes) -> dict:
    t0 = time.perf_counter()
    etdg = ft.trace(program, *specs)
    t1 = time.perf_counter()
    model = build(etdg, sizes)
    t2 = time.perf_counter()
    analyze(model)
    t3 = time.perf_counter()
    return {"trace": t1 - t0, "model": t2 - t1, "analyze": t3 - t2}


def measure(name: str, preset: str, concrete: bool, repeats: int = REPEATS) -> dict:
    """Median seconds per phase (and total) for one workload."""
    mod = WORKLOADS[name]
    specs = mod.specs(preset)
    sizes = lengths(name, preset) if concrete else None
    time_once(mod.program, specs, sizes)  # warm-up
    runs = [time_once(mod.program, specs, sizes) for _ in range(repeats)]
    out = {p: statistics.median(r[p] for r in runs) for p in PHASES}
    out["total"] = statistics.median(sum(r[p] for p in PHASES) for r in runs)
    return out


def run(preset: str = "paper", out_dir: str = "results", repeats: int = REPEATS) -> pd.DataFrame:
    """Time every workload at `preset`; write `out_dir`/deps_time.csv and return the rows.

    `preset="quick"` (what `polyft reproduce` passes by default) means "paper": the analysis
    takes well under a second per workload at the paper's sizes."""
    if preset == "quick":
        preset = "paper"
    info = meta()
    rows = []
    for name, mod in WORKLOADS.items():
        if preset not in mod.PRESETS:
            raise PolyftError(f"deps_time: workload {name} has no preset {preset!r} "
                              f"(it has {', '.join(mod.PRESETS)})", op="deps_time")
        for concrete in (False, True):
            sizes = lengths(name, preset)
            times = measure(name, preset, concrete, repeats)
            for phase in PHASES + ("total",):
                rows.append({"workload": name, "preset": preset,
                             "lengths": "concrete" if concrete else "symbolic",
                             "sizes": " ".join(f"{k}={v}" for k, v in sizes.items()) if concrete else "",
                             "phase": phase, "seconds": times[phase], "repeats": repeats, **info})
            print(f"{name:<16} {'concrete' if concrete else 'symbolic':<9} "
                  + "  ".join(f"{p} {times[p] * 1e3:7.1f} ms" for p in PHASES + ("total",)), flush=True)
    df = pd.DataFrame(rows)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "deps_time.csv")
    df.to_csv(path, index=False)
    print(f"wrote {path}")
    return df


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polyft.experiments.deps_time", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--out", default="results")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv)
    run(args.preset, args.out, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
