"""Our §5.2 scheduler against isl's own scheduler, on every workload.

For each workload, at concrete sizes (so that step counts are numbers), three schedules:

* ``polyft-auto``: ``ft.analyze(schedule="auto")``: the ETDG coarsened (§5.1), then the
  paper's reordering (per block node: Lamport hyperplane + unimodular T);
* ``polyft-original``: ``ft.analyze(schedule="original")``: the traced nest as written (2d+1
  schedule, no coarsening);
* ``isl``: ``isl.ScheduleConstraints.on_domain(domains).set_validity(deps).set_proximity(deps)
  .set_coincidence(deps).compute_schedule()`` with isl's default options, on the same model
  as polyft-auto (the coarsened ETDG): ``deps`` is its may-flow ∪ anti ∪ output and
  ``domains`` the union of its statements' domains.

Reported per schedule (the same code measures all three, on the flat schedule map):

* ``parallel_dims``: time dims that are loops (take more than one value for some statement)
  and carry no dependence (``schedule.parallel_dims``: nothing carried at that level);
* ``sequential_steps``: ``schedule.sequential_steps`` with the dependences — distinct values
  of the sequential dims, a dim being parallel or sequential per subtree of the schedule
  (steps when every parallel dim runs at once: the paper's count, e.g. L + D - 1 for the
  stacked RNN);
* ``steps_as_run``: ``Schedule.steps_as_run`` — statement instances one thread runs one after
  the other in the C target's code for that schedule, which runs only the outermost parallel
  loop of each nest in parallel (schedule/steps.py);
* ``critical_path``: ``Schedule.critical_path`` — statement instances on the longest chain of
  flow dependences of the model the schedule runs (deps/critical.py): the coarsened ETDG for
  polyft-auto and isl, the traced one for polyft-original. The lower bound on both step counts
  (all three count statement instances of that model);
* ``seconds``: median of 5 runs of computing the schedule (ours: ``make_schedule``: bands, π,
  T and the maps, for "auto" also the step counts and critical path that decide on per-statement
  hyperplanes (schedule/hyperplanes.py) and those, and the legality check; isl:
  ``compute_schedule`` + ``get_map``, no check); polyft-auto's coarsening, which runs before
  it, is timed separately in ``note``, which also says where hyperplanes replaced the bands.

Every schedule is also checked legal against the exact dependences (``check_legal``).
``run(preset="quick")`` does the small presets; ``run(preset="paper")`` the paper presets
(concrete sizes from the preset; derived tile counts such as b2b_gemm's MT = M / tm are
named in ``note``) and the small ones. Writes ``results/schedule_vs_isl_<preset>.csv``.

    python -m polyft.experiments.schedule_vs_isl [--quick | --paper] [--out DIR] [--resume]
"""
from __future__ import annotations

import statistics
import time

import islpy as isl
import pandas as pd

import polyft as ft
from polyft.deps.critical import critical_path
from polyft.deps.isl_helpers import maps, union_map
from polyft.workloads import WORKLOADS
from polyft.schedule.coarsen import coarsen
from polyft.schedule.schedule import check_legal, make_schedule, parallel_dims, sequential_steps
from polyft.schedule.steps import steps_as_run

from .common import meta, path, sweep
from .reproduce import main

SYSTEMS = ("polyft-auto", "polyft-original", "isl")
REPEATS = 5
SLOW_SECONDS = 60.0  # one isl run slower than this: no more repeats (noted)

# ISL parameters that are not preset sizes: tile counts, from the preset
DERIVED = {
    "MT": ("M / tm", lambda s: s["M"] // s["tm"]),
    "NT": ("N / tn", lambda s: s["N"] // s["tn"]),
    "TQ": ("Lq / tq", lambda s: s["Lq"] // s["tq"]),
    "TK": ("Lk / tk", lambda s: s["Lk"] // s["tk"]),
    "NB": ("nb", lambda s: s["nb"]),
}


def concrete_sizes(mod, preset: str, params) -> tuple[dict, str]:
    """Values of the program's ISL parameters for the preset, and a note naming them."""
    pre = mod.PRESETS[preset]
    sizes, derived = {}, []
    for p in params:
        if p in pre:
            sizes[p] = pre[p]
        else:
            how, fn = DERIVED[p]
            sizes[p] = fn(pre)
            derived.append(f"{p} = {how}")
    note = "sizes " + " ".join(f"{p}={v}" for p, v in sizes.items())
    if derived:
        note += " (" + ", ".join(derived) + ")"
    return sizes, note


def _median_time(fn, repeats=REPEATS):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        if times[-1] > SLOW_SECONDS:
            break
    return out, statistics.median(times), len(times)


def polyft_maps(model, deps, kind: str) -> dict:
    """The schedule map per statement, from make_schedule: for "auto" the bands' maps, or where
    they take more steps than the critical path, the per-statement hyperplanes outside them
    (the choice needs both step counts, so the timing includes them and the legality check)."""
    return make_schedule(model, deps, kind).per_statement


def isl_maps(model, deps):
    """isl's schedule: (per-statement maps, number of coincident band members)."""
    domains = None
    for d in model.domains.values():
        u = isl.UnionSet.from_set(d)
        domains = u if domains is None else domains.union(u)
    dep = deps.all
    sc = isl.ScheduleConstraints.on_domain(domains).set_validity(dep).set_proximity(dep).set_coincidence(dep)
    sched = sc.compute_schedule()
    per = {}
    for m in maps(sched.get_map().intersect_params(model.context)):
        per[m.get_tuple_name(isl.dim_type.in_)] = m
    return per, _coincident_members(sched)


def _coincident_members(sched) -> int:
    count = 0

    def visit(node):
        nonlocal count
        if node.get_type() == isl.schedule_node_type.band:
            count += sum(1 for k in range(node.band_n_member()) if node.band_member_get_coincident(k))
        return True
    sched.get_root().foreach_descendant_top_down(visit)
    return count


def _pad(per: dict) -> dict:
    """All maps to the same number of time dims (zeros appended): isl's may differ."""
    width = max(m.dim(isl.dim_type.out) for m in per.values())
    out = {}
    for n, m in per.items():
        k = m.dim(isl.dim_type.out)
        if k < width:
            m = m.add_dims(isl.dim_type.out, width - k)
            for c in range(k, width):
                m = m.fix_val(isl.dim_type.out, c, isl.Val.zero(m.get_ctx()))
        out[n] = m
    return out


def measure(model, deps, per: dict) -> tuple[int, int, int]:
    """(parallel loop dims, sequential steps, steps as the C code runs them) of a schedule given
    per statement."""
    check_legal(per, deps)
    parallel = parallel_dims(per, deps)
    loops = set()  # time dims that take more than one value for some statement
    for n, m in per.items():
        img = model.domains[n].apply(m)
        width = img.dim(isl.dim_type.set)
        for k in range(width):
            if k not in loops and not _is_singleton(
                    img.project_out(isl.dim_type.set, k + 1, width - k - 1).project_out(isl.dim_type.set, 0, k)):
                loops.add(k)
    par = sum(1 for k in loops if parallel[k])
    space = isl.Space.params_alloc(model.context.get_ctx(), 0)
    timed = union_map((m.intersect_domain(model.domains[n]) for n, m in per.items()), space)  # isl's: unbounded
    as_run = steps_as_run(model, timed, parallel)
    return par, sequential_steps(model, per, parallel, deps), as_run


def _is_singleton(s: isl.Set) -> bool:
    """At most one point (parameters fixed by the context)."""
    n_par = s.dim(isl.dim_type.param)
    s = s.project_out(isl.dim_type.param, 0, n_par) if n_par else s
    lo, hi = s.lexmin(), s.lexmax()
    return s.is_empty() or lo.is_equal(hi)


def compare(name: str, preset: str, info: dict) -> list[dict]:
    """Rows (one per system) for one workload at one preset; `info`: the columns of meta()."""
    mod = WORKLOADS[name]
    specs = mod.specs(preset)
    etdg = ft.trace(mod.program, *specs)
    sizes, note = concrete_sizes(mod, preset, etdg.params)
    prog = ft.analyze(mod.program, *specs, sizes=sizes)  # coarsened, then reordered
    orig = ft.analyze(mod.program, *specs, sizes=sizes, schedule="original")  # as traced
    rows = []
    for system in SYSTEMS:
        model, deps = (orig.model, orig.deps) if system == "polyft-original" else (prog.model, prog.deps)
        extra = f"; {len(model.domains)} statements"
        if system == "isl":
            (per, coincident), secs, n = _median_time(lambda: isl_maps(model, deps))
            per = _pad(per)
            extra += f"; isl band members marked coincident: {coincident}"
            if n < REPEATS:
                extra += f"; isl took {secs:.0f} s: {n} run(s) only"
        else:
            kind = system.split("-")[1]
            per, secs, _ = _median_time(lambda: polyft_maps(model, deps, kind))
            if kind == "auto":
                _, c_secs, _ = _median_time(lambda: coarsen(prog.traced, sizes=sizes))
                extra += f"; coarsening (not in seconds) {1e3 * c_secs:.1f} ms"
                if prog.schedule.hyperplanes:
                    extra += f"; per-statement hyperplanes (the bands alone: {prog.schedule.band_steps} steps)"
        par, steps, as_run = measure(model, deps, per)
        rows.append(dict(workload=name, preset=preset, system=system, parallel_dims=par,
                         sequential_steps=steps, steps_as_run=as_run, critical_path=critical_path(model, deps),
                         seconds=secs, **info, note=note + extra))
    # the library's own numbers agree with ours
    for p, row in ((prog, rows[0]), (orig, rows[1])):
        for k in ("sequential_steps", "steps_as_run", "critical_path"):
            assert getattr(p.schedule, k) == row[k], (name, k, p.schedule, row)
    return rows


def markdown(df: pd.DataFrame) -> str:
    lines = ["| workload | preset | parallel dims (auto / original / isl) | sequential steps (auto / original / isl) "
             "| steps as run in C (auto / original / isl) | critical path (coarsened / traced) "
             "| ms to schedule (auto / isl) |", "|---|---|---|---|---|---|---|"]
    for (w, p), g in df.groupby(["workload", "preset"], sort=False):
        r = {s: g[g.system == s].iloc[0] for s in SYSTEMS}
        lines.append(f"| {w} | {p} | {r['polyft-auto'].parallel_dims} / {r['polyft-original'].parallel_dims} / "
                     f"{r['isl'].parallel_dims} | {r['polyft-auto'].sequential_steps} / "
                     f"{r['polyft-original'].sequential_steps} / {r['isl'].sequential_steps} | "
                     f"{r['polyft-auto'].steps_as_run} / {r['polyft-original'].steps_as_run} / "
                     f"{r['isl'].steps_as_run} | {r['polyft-auto'].critical_path} / "
                     f"{r['polyft-original'].critical_path} | "
                     f"{1e3 * r['polyft-auto'].seconds:.1f} / {1e3 * r['isl'].seconds:.1f} |")
    return "\n".join(lines)


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    info = meta()
    points = [(p, name) for p in {"quick": ["small"], "paper": ["paper", "small"]}[preset] for name in WORKLOADS]
    return sweep("schedule_vs_isl", preset, out_dir, points, lambda p: compare(p[1], p[0], info), resume=resume,
                 key=lambda p: {"workload": p[1], "preset": p[0]})


def result_text(out_dir: str, preset: str) -> str:
    return markdown(pd.read_csv(path(out_dir, "schedule_vs_isl.csv", preset)))


if __name__ == "__main__":
    raise SystemExit(main("schedule_vs_isl", __doc__))
