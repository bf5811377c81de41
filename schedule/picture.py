"""Schedule pictures, after the paper's Figures 5 and 6: one band's iteration space under the
original schedule and under another (the wavefront), side by side.

Each panel draws the instances of the band's statements in a slice at concrete sizes: the
band's last two dims are the axes (a 1-D band is drawn on a line, one row per statement), every
other dim of the band and its enclosing dims are fixed (`slice_at`, default their first
values), and the dims of statements nested below the band are projected: one marker per
statement and band point. Markers are coloured by sequential step under that panel's schedule
(the rank of the instance's time on the sequential time dims: instances whose sequential
coordinates agree run in one step), arrows are the exact flow dependences between markers of
the slice (ISL, enumerated), and the second panel shows the wavefront's hyperplanes: lines of
equal outermost time coordinate that varies in the slice (`j + k = c` for the stacked RNN).
Everything is enumerated from the ISL maps at concrete sizes, so a slice of more than MAX_POINTS
markers or steps is refused.
"""
from __future__ import annotations

import islpy as isl
import numpy as np

from polyft.deps.isl_helpers import maps, point_set, union
from polyft.deps.model import check_sizes
from polyft.errors import PolyftError

MAX_POINTS = 2000  # markers per panel, and sequential steps in a slice
MARKERS = "os^Dv<>pP*Xh"


def draw(original, schedule, sizes=None, band=None, slice_at=None):
    """A matplotlib Figure with two panels: `band` (a block name such as "b0"; default the band
    the reordering changed with the most dims) under the schedule `original` and under
    `schedule` (both `Schedule`s of one model). `sizes` fixes the lengths the model leaves
    symbolic; `slice_at` ({dim name: value}) fixes the dims that are not drawn."""
    from matplotlib.figure import Figure  # no pyplot: no backend to choose, none changed

    model, deps = schedule.model, schedule.deps
    context = _fixed_lengths(model, sizes)
    view = _Slice(model, _band(schedule.bands or original.bands, band), context, slice_at)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    for ax, sched in zip(fig.subplots(1, 2), (original, schedule)):
        _panel(fig, ax, view, sched, deps, hyperplanes=sched is schedule)
    fig.suptitle(view.caption())
    return fig


def _fixed_lengths(model, sizes) -> isl.Set:
    """The model's context with every length fixed, from the model's sizes and `sizes`."""
    given = check_sizes(sizes, model.params, op="plot")
    differ = [f"{p} = {model.sizes[p]} (sizes gives {v})" for p, v in given.items()
              if p in model.sizes and model.sizes[p] != v]
    if differ:
        raise PolyftError(f"the program was built with {', '.join(differ)}", op="plot")
    env = {**model.sizes, **given}
    missing = [p for p in model.params if p not in env]
    if missing:
        raise PolyftError(f"a picture needs concrete lengths: give sizes for {', '.join(missing)} "
                          f"(e.g. sizes={{{', '.join(repr(p) + ': 4' for p in missing)}}})", op="plot")
    context = model.context
    for p, v in env.items():
        pos = context.get_space().find_dim_by_name(isl.dim_type.param, p)
        context = context.fix_val(isl.dim_type.param, pos, isl.Val.int_from_si(context.get_ctx(), v))
    if context.is_empty():
        raise PolyftError(f"the sizes {env} break the program's assumptions {model.context}", op="plot")
    return context


def _band(bands, name):
    """The band named `name`, or the one the reordering changed with the most dims."""
    if not bands:
        raise PolyftError("the program has no bands (block nodes with dims) to draw", op="plot")
    if name is None:
        def changed(b):
            return b.T is not None and not np.array_equal(b.T, np.eye(len(b.dims), dtype=b.T.dtype))
        return max(bands, key=lambda b: (changed(b), len(b.dims)))
    found = [b for b in bands if b.block.name == name]
    if not found:
        have = ", ".join(f"{b.block.name} [{', '.join(d.name for d in b.dims)}]" for b in bands)
        raise PolyftError(f"no band {name!r}; the schedule's bands are {have}", op="plot")
    return found[0]


class _Slice:
    """The band's statements at fixed values of the dims not drawn: the markers, their
    instances, and the flow dependences between them, all at concrete sizes."""

    def __init__(self, model, band, context, slice_at):
        self.band, self.context = band, context
        first = model.domains[band.statements[0]]
        width = band.outer + len(band.dims)  # the dims the band's statements share
        self.names = [first.get_dim_name(isl.dim_type.set, k) for k in range(width)]
        self.n_fixed = width - min(2, len(band.dims))
        self.axes = self.names[self.n_fixed:]  # outer to inner: y, x (or x alone)
        self.at = self._values(model, width, slice_at or {})
        self.domains = {}  # statement -> its instances in the slice
        for s in band.statements:
            dom = self.concrete(model.domains[s])
            for k, v in enumerate(self.at.values()):
                dom = dom.fix_val(isl.dim_type.set, k, isl.Val.int_from_si(dom.get_ctx(), v))
            if not dom.is_empty():
                self.domains[s] = dom
        self.statements = list(self.domains)  # those with instances in the slice
        self.markers = {s: sorted(point_set(self.drawn(d))) for s, d in self.domains.items()}

    def concrete(self, obj):
        """`obj` at the fixed lengths, with the parameters projected out."""
        obj = obj.intersect_params(self.context)
        return obj.project_out(isl.dim_type.param, 0, obj.dim(isl.dim_type.param))

    def drawn(self, obj, kind=isl.dim_type.set):
        """A set (or a map's `kind` side) projected onto the drawn dims, checked to be small."""
        n = obj.dim(kind)
        obj = obj.project_out(kind, len(self.names), n - len(self.names)).project_out(kind, 0, self.n_fixed)
        if isinstance(obj, isl.Set) and (count := obj.count_val().to_python()) > MAX_POINTS:
            raise PolyftError(f"the slice of band {self.band.block.name} has {count} points ({obj}), more than "
                              f"the {MAX_POINTS} a picture draws; give smaller sizes", op="plot")
        return obj

    def _values(self, model, width, slice_at) -> dict:
        """The fixed dims' values: `slice_at`'s, else the first with instances."""
        fixed = self.names[:self.n_fixed]
        unknown = [d for d in slice_at if d not in fixed]
        if unknown:
            raise PolyftError(f"slice_at names {unknown}, but the dims not drawn of band {self.band.block.name} "
                              f"are {fixed or 'none'}; its axes are {self.axes}", op="plot")
        shared = union(self.concrete(model.domains[s]).reset_tuple_id()
                       .project_out(isl.dim_type.set, width, model.domains[s].dim(isl.dim_type.set) - width)
                       for s in self.band.statements)
        for k, d in enumerate(fixed):
            if d in slice_at:
                shared = shared.fix_val(isl.dim_type.set, k, isl.Val.int_from_si(shared.get_ctx(), slice_at[d]))
        first = shared.project_out(isl.dim_type.set, self.n_fixed, width - self.n_fixed).lexmin()
        if first.is_empty():
            raise PolyftError(f"band {self.band.block.name} has no instances at {slice_at}", op="plot")
        pt = first.sample_point()
        return {d: pt.get_coordinate_val(isl.dim_type.set, k).to_python() for k, d in enumerate(fixed)}

    def steps(self, sched) -> tuple[dict, int, dict]:
        """Under `sched`: (marker -> the first sequential step of its instances, the number of steps
        in the slice, marker -> its wavefront coordinate: the outermost sequential time coordinate
        that varies in the slice, {} where none does)."""
        seq = [k for k, par in enumerate(sched.parallel) if not par]
        times = {}
        for s, dom in self.domains.items():
            m = self.concrete(sched.per_statement[s]).intersect_domain(dom)
            for k in reversed(range(m.dim(isl.dim_type.out))):
                if k not in seq:
                    m = m.project_out(isl.dim_type.out, k, 1)
            times[s] = m
        every = union(m.range() for m in times.values())
        if (count := every.count_val().to_python()) > MAX_POINTS:
            raise PolyftError(f"the slice of band {self.band.block.name} takes {count} steps under the {sched.kind} "
                              f"schedule, more than the {MAX_POINTS} a picture draws; give smaller sizes", op="plot")
        order = sorted(point_set(every))
        rank = {t: r for r, t in enumerate(order)}
        nd = len(self.axes)
        first = {(s, p[:nd]): p[nd:] for s, m in times.items()
                 for p in point_set(self.drawn(m, isl.dim_type.in_).lexmin().wrap())}
        varies = next((k for k in range(len(seq)) if len({t[k] for t in order}) > 1), None)
        wave = {key: t[varies] for key, t in first.items()} if varies is not None else {}
        return {key: rank[t] for key, t in first.items()}, len(order), wave

    def dependences(self, deps) -> set:
        """(source marker, sink marker) of every flow dependence inside the slice."""
        out = set()
        for m in maps(deps.flow):
            src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
            if src not in self.domains or dst not in self.domains:
                continue
            m = self.concrete(m).intersect_domain(self.domains[src]).intersect_range(self.domains[dst])
            m = self.drawn(self.drawn(m, isl.dim_type.in_), isl.dim_type.out)
            nd = len(self.axes)
            out |= {((src, p[:nd]), (dst, p[nd:])) for p in point_set(m.wrap())}
        return {(a, b) for a, b in out if a != b}

    def position(self, marker) -> tuple:
        """Where a marker is drawn: (x, y) = (inner dim, outer dim), statements side by side; on
        a 1-D band (dim, statement row)."""
        s, p = marker
        row = self.statements.index(s)
        if len(p) == 1:
            return float(p[0]), float(row)
        shift = (row - (len(self.statements) - 1) / 2) * 0.3 / len(self.statements)
        return p[1] + shift, p[0] + shift

    def caption(self) -> str:
        at = ", ".join(f"{d} = {v}" for d, v in self.at.items())
        dims = ", ".join(self.names[self.band.outer:])
        return f"band {self.band.block.name} [{dims}]" + (f" at {at}" if at else "")


def _panel(fig, ax, view, sched, deps, hyperplanes):
    """One schedule's picture of the slice on `ax`."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm
    from matplotlib.ticker import MaxNLocator

    step, n, wave = view.steps(sched)
    cmap = colormaps["viridis"].resampled(n)
    norm = BoundaryNorm(np.arange(n + 1) - 0.5, n)
    for k, s in enumerate(view.statements):
        keys = [(s, p) for p in view.markers[s]]
        xy = np.array([view.position(key) for key in keys])
        ax.scatter(xy[:, 0], xy[:, 1], c=[step[key] for key in keys], cmap=cmap, norm=norm, s=60,
                   marker=MARKERS[k % len(MARKERS)], edgecolors="black", linewidths=0.5, zorder=3,
                   label=s, gid=f"instances {s}")
    flat = len(view.axes) == 1
    for a, b in sorted(view.dependences(deps)):
        bend = 0.4 if flat and a[0] == b[0] else 0  # along one row: arcs, so that they do not overlap
        ax.annotate("", xy=view.position(b), xytext=view.position(a), gid="dependence", zorder=2,
                    arrowprops=dict(arrowstyle="->", color="0.4", lw=0.8, shrinkA=5, shrinkB=5,
                                    connectionstyle=f"arc3,rad={bend}"))
    if hyperplanes and not flat:
        _hyperplanes(ax, view, wave)
    fig.colorbar(ScalarMappable(norm, cmap), ax=ax, label="sequential step",
                 ticks=MaxNLocator(integer=True, nbins=min(n, 10)))
    every = np.array([view.position((s, p)) for s in view.statements for p in view.markers[s]])
    lo, hi = every.min(axis=0) - 0.6, every.max(axis=0) + 0.6
    ax.set_xlim(lo[0], hi[0])  # the markers' box: the hyperplanes are infinite lines
    ax.set_ylim(lo[1], hi[1])
    ax.set_xlabel(view.axes[-1])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    if flat:
        ax.set_yticks(range(len(view.statements)), view.statements)
    else:
        ax.set_ylabel(view.axes[0])
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        if len(view.statements) > 1:
            ax.legend(loc="upper left", fontsize="small")
    title = f"{sched.kind}: {n} step{'s' if n != 1 else ''}"
    if sched.sequential_steps not in (None, n):
        title += f" (the program: {sched.sequential_steps})"
    ax.set_title(title)


def _hyperplanes(ax, view, wave):
    """Per statement, the lines through its markers where the wavefront coordinate is constant
    (fitted exactly to the markers; none where it is not affine in the drawn dims)."""
    drawn = set()
    for s in view.statements if wave else []:
        keys = [(s, p) for p in view.markers[s]]
        xy = np.array([(p[1], p[0]) for _, p in keys], dtype=float)  # unshifted
        varies = np.ptp(xy, axis=0) > 0  # a coordinate that is constant here gets no coefficient
        a = np.column_stack([xy[:, varies], np.ones(len(keys))])
        values = np.array([wave[key] for key in keys], dtype=float)
        fit, *_ = np.linalg.lstsq(a, values, rcond=None)
        coef = np.zeros(2)
        coef[varies] = fit[:-1]
        (cx, cy), c0 = coef, fit[-1]
        if not np.allclose(a @ fit, values) or np.allclose(coef, 0):
            continue
        for c in sorted(set(values)):
            line = tuple(np.round((cx, cy, c - c0), 6))
            if line in drawn:
                continue
            drawn.add(line)
            if abs(cy) > 1e-9:  # cx x + cy y + c0 = c
                ends = (0, (c - c0) / cy), (1, (c - c0 - cx) / cy)
            else:
                ends = ((c - c0) / cx, 0), ((c - c0) / cx, 1)
            ax.axline(*ends, color="tab:red", lw=0.6, alpha=0.6, zorder=1, gid="hyperplane")
