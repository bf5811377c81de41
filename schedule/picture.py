"""Schedule pictures, after the paper's Figures 5 and 6: one band's iteration space under the
original schedule and under another (the wavefront), side by side, and under each, every
statement of the program on one time axis.

The top panels draw the instances of the band's statements in a slice at concrete sizes: the
band's last two dims are the axes (a 1-D band is drawn on a line, one row per statement), every
other dim of the band and its enclosing dims are fixed (`slice_at`, default their first
values), and the dims of statements nested below the band are projected: one marker per
statement and band point. Markers are coloured, and numbered where there are few, by sequential
step under that panel's schedule (the rank of the instance's time on the sequential time dims:
instances whose sequential coordinates agree run in one step), arrows are the exact flow
dependences between markers of the slice (ISL, enumerated), and the second panel shows the
wavefront's hyperplanes: lines of equal outermost time coordinate that varies in the slice
(`j + k = c` for the stacked RNN).

The bottom panels (timelines) put every statement of the program on one axis of sequential
steps, one row per statement: a marker where the statement runs in a step, with the number of
its instances in that step under it, and an arrow for each flow dependence between such
(statement, step) pairs, so that the dependences between bands show too.

Everything is enumerated from the ISL maps at concrete sizes, so a slice of more than MAX_POINTS
markers or steps, or a program of more than MAX_INSTANCES instances, is refused.
"""
from __future__ import annotations

from collections import Counter

import islpy as isl
import numpy as np

from polyft.deps.isl_helpers import maps, point_set, union
from polyft.deps.model import check_sizes
from polyft.errors import PolyftError

MAX_POINTS = 2000  # markers per panel, and sequential steps in a slice or the program
MAX_INSTANCES = 20000  # statement instances of the whole program (the timelines count them)
NUMBERED = 150  # a band panel of at most this many markers writes each one's step in it
MARKERS = "os^Dv<>pP*Xh"
ARROW = dict(arrowstyle="->", color="0.4", lw=0.8, shrinkA=5, shrinkB=5)
AGGREGATES = ("scanl", "scanr", "foldl", "foldr", "reduce")


def draw(original, schedule, sizes=None, band=None, slice_at=None):
    """A matplotlib Figure: on top, `band` (a block name such as "b0"; default the band the
    reordering changed with the most dims) under the schedule `original` and under `schedule`
    (both `Schedule`s of one model); below each, that schedule's timeline of every statement.
    `sizes` fixes the lengths the model leaves symbolic; `slice_at` ({dim name: value}) fixes
    the dims that are not drawn."""
    from matplotlib.figure import Figure  # no pyplot: no backend to choose, none changed

    model, deps = schedule.model, schedule.deps
    context = _fixed_lengths(model, sizes)
    view = _Slice(model, _band(schedule.bands or original.bands, band), context, slice_at)
    shapes = {s: MARKERS[k % len(MARKERS)] for k, s in enumerate(model.domains)}
    rows = sum(not _concrete(d, context).is_empty() for d in model.domains.values())  # the timelines' rows
    fig = Figure(figsize=(13, 7.2 + 0.4 * rows), layout="constrained")
    axes = fig.subplots(2, 2, height_ratios=(5, 1.2 + 0.4 * rows))
    for (top, bottom), sched in zip(axes.T, (original, schedule)):
        _panel(fig, top, view, sched, deps, shapes, hyperplanes=sched is schedule)
        _timeline(bottom, _Program(model, sched, deps, context), shapes)
        top.set_gid("band")
        bottom.set_gid("timeline")
    drawn_planes = any(line.get_gid() == "hyperplane" for line in axes[0][1].lines)
    fig.legend(handles=_key(model, shapes, drawn_planes), loc="outside lower center", ncol=3, fontsize="small",
               frameon=False)
    fig.suptitle(f"{view.caption()} (top); every statement of the program on one time axis (bottom)")
    return fig


def _key(model, shapes, hyperplanes) -> list:
    """The legend: what every mark of the picture means."""
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    marks = [Line2D([], [], ls="", marker=shapes[s], mfc="white", mec="black", label=f"{s} {_dims(model, s)}")
             for s in model.domains]
    marks += [Line2D([], [], ls="", marker="o", ms=9, mfc=colormaps["viridis"](0.6), mec="black",
                     label="colour, number in a marker (top): its sequential step"),
              Line2D([], [], color=ARROW["color"], lw=ARROW["lw"], marker=">", ms=5,
                     label="arrow: flow dependence, writer -> reader"),
              Line2D([], [], ls="", marker="$3$", color="black",
                     label="number under a marker (bottom): instances in that step")]
    if hyperplanes:
        marks.append(Line2D([], [], color="tab:red", lw=0.8, label="red line: hyperplane (time front), a statement's instances on it: one step"))
    return marks


def _dims(model, statement) -> str:
    dom = model.domains[statement]
    return f"[{', '.join(dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set)))}]"


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


def _concrete(obj, context):
    """`obj` at the fixed lengths of `context`, with the parameters projected out."""
    obj = obj.intersect_params(context)
    return obj.project_out(isl.dim_type.param, 0, obj.dim(isl.dim_type.param))


def _sequential(m: isl.Map, keep) -> isl.Map:
    """A schedule map `m` with its time dims not in `keep` (the parallel ones) set to 0: equal
    images, one step."""
    for k in range(m.dim(isl.dim_type.out)):
        if k not in keep:
            m = m.project_out(isl.dim_type.out, k, 1).insert_dims(isl.dim_type.out, k, 1) \
                .fix_val(isl.dim_type.out, k, isl.Val.zero(m.get_ctx()))
    return m


def _ranks(times, what) -> dict:
    """Sequential time tuple -> its step (rank) among the points of the union of `times`'s
    ranges; more than MAX_POINTS steps are refused (`what` names them in the error)."""
    every = union(m.range() for m in times)
    if (count := every.count_val().to_python()) > MAX_POINTS:
        raise PolyftError(f"{what} takes {count} steps, more than the {MAX_POINTS} a picture draws; give smaller "
                          f"sizes", op="plot")
    return {t: r for r, t in enumerate(sorted(point_set(every)))}


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
        return _concrete(obj, self.context)

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
        seq = {k for k, par in enumerate(sched.parallel) if not par}
        times = {s: _sequential(self.concrete(sched.per_statement[s]).intersect_domain(dom), seq)
                 for s, dom in self.domains.items()}
        rank = _ranks(times.values(), f"the slice of band {self.band.block.name} under the {sched.kind} schedule")
        order = sorted(rank)
        nd = len(self.axes)
        first = {(s, p[:nd]): p[nd:] for s, m in times.items()
                 for p in point_set(self.drawn(m, isl.dim_type.in_).lexmin().wrap())}
        varies = next((k for k in range(len(order[0])) if len({t[k] for t in order}) > 1), None)
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
        """Where a marker is drawn: (x, y) = (inner dim, outer dim), statements side by side
        (diagonally, apart enough for numbered markers); on a 1-D band (dim, statement row)."""
        s, p = marker
        row = self.statements.index(s)
        if len(p) == 1:
            return float(p[0]), float(row)
        shift = (row - (len(self.statements) - 1) / 2) * 0.5 / len(self.statements)
        return p[1] + shift, p[0] + shift

    def axis_label(self, k) -> str:
        """The drawn dim k (0: the outer) named with the operator it iterates, e.g. "k: step of
        the scanl over L" (an aggregate's steps run in order as written; a map's elements do not)."""
        dim = self.band.dims[self.n_fixed - self.band.outer + k]
        role = "step" if dim.op in AGGREGATES else "element"
        return f"{self.axes[k]}: {role} of the {dim.op} over {dim.extent}"

    def caption(self) -> str:
        at = ", ".join(f"{d} = {v}" for d, v in self.at.items())
        dims = ", ".join(self.names[self.band.outer:])
        return f"band {self.band.block.name} [{dims}]" + (f" at {at}" if at else "")


class _Program:
    """Every statement of the program under one schedule at concrete sizes: how many of its
    instances run in each sequential step, and the flow dependences between (statement, step)
    pairs (source step -> sink step). A time dim is sequential for the statements of a subtree
    of the schedule that carries a dependence at it (Schedule.sequential_levels), so that the
    steps are those `Schedule.sequential_steps` counts."""

    def __init__(self, model, sched, deps, context):
        self.kind = sched.kind
        domains = {s: _concrete(d, context) for s, d in model.domains.items()}
        domains = {s: d for s, d in domains.items() if not d.is_empty()}
        if (total := sum(d.count_val().to_python() for d in domains.values())) > MAX_INSTANCES:
            raise PolyftError(f"the program has {total} statement instances at these sizes, more than the "
                              f"{MAX_INSTANCES} a picture counts; give smaller sizes", op="plot")
        seq = sched.sequential_levels()  # per subtree, as sequential_steps counts
        times = {s: _sequential(_concrete(sched.per_statement[s], context).intersect_domain(d), seq[s])
                 for s, d in domains.items()}
        rank = _ranks(times.values(), f"the program under the {sched.kind} schedule")
        self.statements, self.steps = list(domains), len(rank)
        self.counts = Counter()  # (statement, step) -> instances
        for s, m in times.items():
            n = m.dim(isl.dim_type.in_)
            self.counts.update((s, rank[p[n:]]) for p in point_set(m.wrap()))
        self.pairs = set()  # ((source, step), (sink, step))
        for m in maps(deps.flow):
            src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
            if src in times and dst in times:
                when = _concrete(m, context).apply_domain(times[src]).apply_range(times[dst])
                n = when.dim(isl.dim_type.in_)
                self.pairs |= {((src, rank[p[:n]]), (dst, rank[p[n:]])) for p in point_set(when.wrap())}


def _panel(fig, ax, view, sched, deps, shapes, hyperplanes):
    """One schedule's picture of the slice on `ax`."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm
    from matplotlib.ticker import MaxNLocator

    step, n, wave = view.steps(sched)
    cmap = colormaps["viridis"].resampled(n)
    norm = BoundaryNorm(np.arange(n + 1) - 0.5, n)
    numbered = sum(map(len, view.markers.values())) <= NUMBERED
    for s in view.statements:
        keys = [(s, p) for p in view.markers[s]]
        xy = np.array([view.position(key) for key in keys])
        ax.scatter(xy[:, 0], xy[:, 1], c=[step[key] for key in keys], cmap=cmap, norm=norm, s=190 if numbered else 60,
                   marker=shapes[s], edgecolors="black", linewidths=0.5, zorder=3, gid=f"instances {s}")
        for key, (x, y) in zip(keys if numbered else [], xy):
            r, g, b, _ = cmap(norm(step[key]))
            ax.text(x, y, str(step[key]), ha="center", va="center", fontsize=7, zorder=4, gid="step",
                    color="white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black")
    flat = len(view.axes) == 1
    for a, b in sorted(view.dependences(deps)):
        bend = 0.4 if flat and a[0] == b[0] else 0  # along one row: arcs, so that they do not overlap
        ax.annotate("", xy=view.position(b), xytext=view.position(a), gid="dependence", zorder=2,
                    arrowprops=dict(ARROW, shrinkA=7, shrinkB=7, connectionstyle=f"arc3,rad={bend}"))
    if hyperplanes and not flat:
        _hyperplanes(ax, view, wave)
    fig.colorbar(ScalarMappable(norm, cmap), ax=ax, label=f"sequential step ({sched.kind} schedule, this slice)",
                 ticks=np.arange(0, n, -(-n // 12)))  # every step labelled, or every k-th: at most 12
    every = np.array([view.position((s, p)) for s in view.statements for p in view.markers[s]])
    lo, hi = every.min(axis=0) - 0.6, every.max(axis=0) + 0.6
    ax.set_xlim(lo[0], hi[0])  # the markers' box: the hyperplanes are infinite lines
    ax.set_ylim(lo[1], hi[1])
    ax.set_xlabel(view.axis_label(len(view.axes) - 1))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    if flat:
        ax.set_yticks(range(len(view.statements)), view.statements)
    else:
        ax.set_ylabel(view.axis_label(0))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    title = f"{sched.kind} schedule: {n} step{'s' if n != 1 else ''} in this slice"
    if sched.sequential_steps not in (None, n):
        title += f" (the program: {sched.sequential_steps})"
    ax.set_title(title)


def _timeline(ax, program, shapes):
    """Every statement of `program` (a _Program) on one axis of sequential steps, one row each
    (program order from the top), with the dependences between (statement, step) pairs."""
    from matplotlib.ticker import MaxNLocator

    row = {s: k for k, s in enumerate(program.statements)}
    for s in program.statements:
        at = sorted((step, n) for (t, step), n in program.counts.items() if t == s)
        ax.scatter([step for step, _ in at], [row[s]] * len(at), marker=shapes[s], s=50, c="white",
                   edgecolors="black", linewidths=0.7, zorder=3, gid=f"timeline {s}")
        for step, n in at:
            ax.annotate(str(n), (step, row[s]), xytext=(0, -7), textcoords="offset points", ha="center", va="top",
                        fontsize=7, zorder=4, gid="count")
    for a, b in sorted(program.pairs):
        bend = -0.3 if a[0] == b[0] else 0  # along one row: arcs above it (the counts are under)
        ax.annotate("", xy=(b[1], row[b[0]]), xytext=(a[1], row[a[0]]), gid="dependence", zorder=2,
                    arrowprops=dict(ARROW, connectionstyle=f"arc3,rad={bend}"))
    ax.set_yticks(range(len(row)), program.statements)
    ax.set_ylim(len(row) - 0.4, -0.7)  # the first statement on top, room for the arcs above it
    ax.set_xlim(-0.7, program.steps - 0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel(f"sequential step of the whole program ({program.kind} schedule)")
    ax.set_title(f"every statement, {program.kind} schedule: {program.steps} step{'s' if program.steps != 1 else ''}")
    ax.grid(True, axis="x", alpha=0.3)


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
