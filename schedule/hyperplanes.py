"""Per-statement hyperplanes: one affine time θ_S(x) = a_S · x + c_S per statement, outermost,
that reaches the critical path (deps/critical.py) where the band schedule (schedule.py: each
block node's dims transformed by one T, sibling block nodes one after the other) does not.

Two things make the band schedule longer than the longest dependence chain:

* siblings run in sequence even when no dependence joins them (the ETDG's task parallelism:
  a bidirectional RNN's forward and backward scans);
* one band, one hyperplane: the dilated RNN's layers (one statement each, dilations 1, 2, 4,
  ...) each want their own wavefront slope and offset.

At concrete sizes the peeling of deps/critical.py gives every instance its earliest level (the
longest chain ending in it) and its latest one (the critical path minus the longest chain
starting from it); both are legal schedules of exactly critical-path steps. Where a
statement's levels are one affine function of its dims (checked exactly with ISL: the affine
hull of the level map, restricted to the domain, equals the map), that function is its
hyperplane. A statement whose earliest levels are not affine (a join that waits for the later
of two chains: max(j, L - 1 - j)) takes its latest ones. Early to early, late to late and early
to late never go backwards (late >= early everywhere); a dependence from a late statement to an
early one may, so each such dependence is checked exactly (ISL) and only where it does go
backwards does its sink take its late times too, repeated until none does (the stacked LSTM's
pullback: a layer's first map has no predecessor on the top layer, level 1 there and on the
wavefront below, not affine, so it takes its late times; its successors keep their early ones,
among them a gate map whose late times, behind a reduction, are not affine). If a sink that must
move has no affine late time, every statement after the late ones takes its late times, else all
do. Where neither is affine (a tail of a split list that ends a step later than the rest, with
no slack), the same choice is made among the level maps themselves, piecewise affine, when they have at most MAX_PIECES pieces each (the loop nest
repeats the statement once per piece). When no choice is left, there are no hyperplanes and
the band schedule stays.
"""
from __future__ import annotations

import islpy as isl

from polyft.deps.analyze import Dependences
from polyft.deps.critical import levels
from polyft.deps.isl_helpers import maps
from polyft.deps.model import PolyModel


MAX_PIECES = 4  # a statement's piecewise time: at most this many affine pieces


def statement_hyperplanes(model: PolyModel, deps: Dependences) -> dict | None:
    """Statement name -> its time θ_S as an isl.Map `S[x] -> [a·x + c]` over its domain
    (piecewise where no affine time reaches the critical path), of critical-path steps in all;
    None when the sizes are symbolic or no choice is left (module docstring)."""
    early, late = levels(model, deps), levels(model, deps, late=True)
    if early is None:
        return None
    early, late = early[0], late[0]
    for fit in (_affine, _pieces):
        fits = {name: (fit(model, name, early), fit(model, name, late)) for name in model.domains}
        chosen = _choose(fits, deps)
        if chosen is not None:
            return chosen
    return None


def _choose(fits: dict, deps: Dependences) -> dict | None:
    """Per statement, its (early, late) time (module docstring): early where it is affine, late
    where not and for the sinks of the dependences that go backwards, until none does; else late
    for those whose early one is missing and every statement after them; else late everywhere;
    None if one is missing."""
    missing = {name for name, (e, _) in fits.items() if e is None}
    for pick_late in (_repaired(fits, deps, missing), _after(deps, missing), set(fits)):
        if pick_late is None:
            continue
        chosen = {name: fits[name][1 if name in pick_late else 0] for name in fits}
        if all(m is not None for m in chosen.values()):
            return chosen
    return None


def _repaired(fits: dict, deps: Dependences, late: set) -> set | None:
    """`late` and the sinks that must take their late times too so that no dependence goes
    backwards (each late -> early dependence checked with ISL); None where such a sink has no
    late time."""
    late, edges = set(late), [(m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out), m)
                              for m in maps(deps.all)]
    changed = True
    while changed:
        changed = False
        for src, dst, m in edges:
            if src not in late or dst in late:
                continue
            t_src, t_dst = fits[src][1], fits[dst][0]
            if t_src is None or t_dst is None:
                return None
            times = m.apply_domain(t_src).apply_range(t_dst)  # [source time] -> [sink time]
            if not times.intersect(isl.Map.lex_ge(times.get_space().range())).is_empty():
                if fits[dst][1] is None:
                    return None
                late.add(dst)
                changed = True
    return late


def _affine(model: PolyModel, name: str, level_maps: dict) -> isl.Map | None:
    """The statement's level map as one affine function over its domain, or None."""
    dom = model.domains[name]
    if name not in level_maps:  # no instances at these sizes
        return isl.Map.from_domain_and_range(dom, isl.Set("{ [0] }").align_params(dom.get_space()))
    m = level_maps[name]
    hull = isl.Map.from_basic_map(m.affine_hull()).intersect_domain(dom)
    if not hull.is_single_valued() or not hull.is_equal(m):
        return None
    return hull.gist_domain(dom).intersect_domain(dom).coalesce()


def _pieces(model: PolyModel, name: str, level_maps: dict) -> isl.Map | None:
    """The statement's level map: as one affine function where it is one, else itself if it has at
    most MAX_PIECES pieces."""
    aff = _affine(model, name, level_maps)
    if aff is not None or name not in level_maps:
        return aff
    m = level_maps[name].coalesce()
    return m if m.n_basic_map() <= MAX_PIECES else None


def _after(deps: Dependences, names: set) -> set:
    """`names` and every statement a chain of dependences leads to from them."""
    succ = {}
    for m in maps(deps.all):
        succ.setdefault(m.get_tuple_name(isl.dim_type.in_), set()).add(m.get_tuple_name(isl.dim_type.out))
    out, todo = set(names), list(names)
    while todo:
        for b in succ.get(todo.pop(), ()):
            if b not in out:
                out.add(b)
                todo.append(b)
    return out
