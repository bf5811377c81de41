"""How long the dependence analysis takes: trace -> ISL model -> dependences, per workload.

For every workload at the paper's static dims (--quick and --paper alike: the analysis takes
well under a second per workload; SIZES), the program is traced on its symbolic specs and
analysed twice: with parametric lengths (the ISL maps have
parameters N, L, D, ...) and with the preset's concrete lengths fixed by `sizes=` (the same
maps under a context that pins every parameter). Each phase is timed as the median of 5 runs
after a warm-up:

    trace    ft.trace(program, *specs)
    model    deps.model.build(etdg, sizes)      domains, access relations, schedule, checks
    analyze  deps.analyze.analyze(model)        ISL flow, anti/output, distances, reuse
    total    the three together (median of the per-run sums)

The ETDG is analysed as traced (ft.analyze would coarsen it first). Writes tidy CSV
results/deps_time_<preset>.csv: workload, preset (the workload preset of the sizes), lengths
(symbolic | concrete), sizes, phase, seconds, repeats, device, commit, date.

    python -m polyft.experiments.deps_time [--quick | --paper] [--out DIR] [--resume]
"""
from __future__ import annotations

import statistics
import time

import pandas as pd

import polyft as ft
from polyft.deps.analyze import analyze
from polyft.deps.model import build
from polyft.errors import PolyftError
from polyft.workloads import WORKLOADS

from .common import meta, path, sweep
from .reproduce import main

PHASES = ("trace", "model", "analyze")
REPEATS = 5
SIZES = {"quick": "paper", "paper": "paper"}  # the workload preset analysed per run preset


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


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False, repeats: int = REPEATS) -> pd.DataFrame:
    """Time every workload at the sizes of SIZES[preset], symbolic and concrete lengths; write
    `out_dir`/deps_time_<preset>.csv and return the rows."""
    sizes_preset = SIZES[preset]
    for name, mod in WORKLOADS.items():
        if sizes_preset not in mod.PRESETS:
            raise PolyftError(f"deps_time: workload {name} has no preset {sizes_preset!r} "
                              f"(it has {', '.join(mod.PRESETS)})", op="deps_time")
    info = meta()

    def point(p) -> list:
        name, concrete = p
        times = measure(name, sizes_preset, concrete, repeats)
        sizes = " ".join(f"{k}={v}" for k, v in lengths(name, sizes_preset).items()) if concrete else ""
        return [{"workload": name, "preset": sizes_preset, "lengths": "concrete" if concrete else "symbolic",
                 "sizes": sizes, "phase": phase, "seconds": times[phase], "repeats": repeats, **info}
                for phase in PHASES + ("total",)]
    points = [(name, concrete) for name in WORKLOADS for concrete in (False, True)]
    return sweep("deps_time", preset, out_dir, points, point, resume=resume,
                 key=lambda p: {"workload": p[0], "lengths": "concrete" if p[1] else "symbolic"})


def result_text(out_dir: str, preset: str) -> str:
    df = pd.read_csv(path(out_dir, "deps_time.csv", preset))
    piv = df.pivot_table(index=["workload", "lengths"], columns="phase", values="seconds", sort=False) * 1e3
    return "ms per phase (median)\n" + piv[list(PHASES) + ["total"]].to_string(float_format=lambda v: f"{v:.1f}")


if __name__ == "__main__":
    raise SystemExit(main("deps_time", __doc__))
