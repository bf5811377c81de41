"""Schedules over ISL: the original nest order, and the paper's reordering (§5.2).

Every block node is a *band*: its dims form a perfect nest, which FractalTensor's operators
make fully permutable. For each band the dependences among the statements below it that
are not carried further out (zero distance on the enclosing dims) give distance vectors on
the band's dims; Lamport's hyperplane π (the first row of T) carries all of them, and the
other rows of T move reuse dims inward. The statement's time vector interleaves the block
sequence numbers with `T · v` for each band on its path, where `v` are the band's dims
oriented in execution order (a right aggregate's dim counts down). Every schedule — ours,
the original, or one a user supplies — is checked against the exact dependences with ISL.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl
import numpy as np

from polyft.deps.analyze import Dependences
from polyft.deps.critical import critical_path as _critical_path
from polyft.deps.isl_helpers import Namer, maps, param_names, param_prefix, schedule_map, union, union_map
from polyft.deps.model import PolyModel
from polyft.errors import ScheduleError
from polyft.etdg import BlockNode

from .hyperplanes import statement_hyperplanes
from .provenance import Coarsening
from .reorder import Reordering, reorder_space, show_distances
from .steps import steps_as_run as _steps_as_run


@dataclass
class Band:
    """One block node's dims: the unit the hyperplane method transforms."""

    block: BlockNode
    outer: int  # number of enclosing dims
    statements: list  # names of the statements below the block
    reordering: Reordering | None = None  # π and T ("auto" schedules)

    @property
    def dims(self):
        return self.block.dims

    @property
    def distances(self):
        """Set of tuples (finite), isl.Set (unbounded), or empty set; None before reordering."""
        return self.reordering.distances if self.reordering else None

    @property
    def pi(self) -> tuple | None:
        return self.reordering.pi if self.reordering else None

    @property
    def T(self) -> np.ndarray | None:
        return self.reordering.T if self.reordering else None

    @property
    def reuse(self) -> list:
        """Band-dim indices along which data is reused."""
        return self.reordering.reuse if self.reordering else []


@dataclass
class Schedule:
    """A checked schedule. Its step counts need concrete sizes (None while a length is
    symbolic) and are all in statement instances of the model (one instance runs in one step;
    a chain of k dependent instances needs k steps), so they compare directly:

    * `sequential_steps`: steps when every parallel time dim runs at once, a dim being
      parallel per subtree of the schedule (`sequential_steps()`). The paper's count (Tables
      3/4; e.g. the stacked RNN's wavefront: L + D - 1), and the `sequential_steps` column of
      results/schedule_vs_isl_paper.csv.
    * `steps_as_run` (computed on first use): the instances one thread runs one after the
      other in the C target's code, which runs only the outermost parallel loop of each nest
      in parallel (schedule/steps.py; the stacked RNN's batch loop, inside the parallel layer
      loop of the wavefront, runs in a thread: N (L + D - 1)).
    * `critical_path` (computed on first use): instances on the longest chain of flow
      dependences (deps/critical.py), the lower bound on both for any schedule of the model.

    An "auto" schedule whose bands take more steps than the critical path, at concrete sizes,
    runs per-statement hyperplanes (schedule/hyperplanes.py) outermost: `hyperplanes` maps each
    statement to its θ, the first time dim, and the band times (`T`) follow it.
    """

    kind: str  # "auto", "original" or "user"
    map: isl.UnionMap  # statement instance -> time vector
    per_statement: dict  # name -> isl.Map
    T: dict  # statement name -> unimodular matrix over its dims (numpy int)
    bands: list
    parallel: list  # per time dim: True when it carries no dependence
    sequential_steps: int | None  # steps with every parallel dim at once, for concrete sizes
    hyperplanes: dict = field(default_factory=dict)  # name -> θ map, the outermost time dim, where used
    band_steps: int | None = None  # where hyperplanes are used: the band schedule's sequential steps
    coarsening: Coarsening | None = field(default=None, repr=False, compare=False)  # set by the Program
    model: PolyModel | None = field(default=None, repr=False, compare=False)  # for the lazy counts
    deps: Dependences | None = field(default=None, repr=False, compare=False)
    _counts: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def critical_path(self) -> int | None:
        """Statement instances on the longest chain of flow dependences at the model's concrete
        sizes (deps.critical.critical_path: a PolyftError beyond its cap); None when symbolic."""
        if "critical_path" not in self._counts:
            self._counts["critical_path"] = None if self.model is None else _critical_path(self.model, self.deps)
        return self._counts["critical_path"]

    @property
    def steps_as_run(self) -> int | None:
        """Statement instances one thread runs one after the other in the C target's code
        (schedule.steps.steps_as_run: OpenMP on the outermost parallel loop of each nest only);
        None when symbolic."""
        if "steps_as_run" not in self._counts:
            self._counts["steps_as_run"] = None if self.model is None else \
                _steps_as_run(self.model, self.map, self.parallel)
        return self._counts["steps_as_run"]

    def check_lengths(self, lengths: dict) -> None:
        """Before a call at `lengths` (every length of the model): a user's schedule whose loops
        would be almost all empty at them is a ScheduleError (`check_scan`; done at compile time
        where the lengths were known then), once per set of lengths."""
        if self.kind != "user" or self.model is None or all(p in self.model.sizes for p in self.model.params):
            return
        key = ("scan",) + tuple(lengths[p] for p in self.model.params)
        if key not in self._counts:
            check_scan(self.model, self.per_statement, {p: lengths[p] for p in self.model.params})
            self._counts[key] = True

    def sequential_levels(self) -> dict:
        """Per statement, the time dims it runs sequentially: those at which a dependence is
        carried in its subtree of the schedule (what sequential_steps counts by)."""
        return _sequential_levels(self.model, self.per_statement, self.deps)

    def plot(self, sizes=None, band=None, slice_at=None):
        """A matplotlib Figure of one band's instances under the original schedule and this one,
        side by side (the paper's Figures 5/6): sequential steps as colours, flow dependences as
        arrows, this schedule's wavefront hyperplanes as lines. `sizes` fixes lengths left
        symbolic, `band` is a block name ("b0"), `slice_at` ({dim: value}) fixes the dims not
        drawn (schedule/picture.py)."""
        from .picture import draw  # matplotlib only here
        return draw(make_schedule(self.model, self.deps, "original"), self, sizes, band, slice_at)

    def reordering(self, model, name):
        """The statement's T as a `reorder.Reordering`, for bounds and transformed accesses."""
        dom = model.domains[name]
        names = [dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set))]
        return Reordering(names, set(), None, [], self.T[name])

    def describe(self, context=None) -> str:
        g = (lambda m: m.gist_params(context)) if context is not None else (lambda m: m)
        lines = [f"{self.kind} schedule:"]
        if self.coarsening is not None:  # which traced statements are scheduled as which
            lines += [f"  {ln}" for ln in self.coarsening.describe()]
        lines += [f"  {g(m)}" for m in self.per_statement.values()]
        kinds = ["par" if p else "seq" for p in self.parallel]
        lines.append(f"  time dims: [{', '.join(kinds)}]"
                     + (f"; sequential steps: {self.sequential_steps}" if self.sequential_steps is not None else ""))
        for b in self.bands:
            if b.T is not None:
                dims = ", ".join(d.name for d in b.dims)
                lines.append(f"  band {b.block.name} [{dims}] p = [{', '.join(b.block.p)}]: "
                             f"distances {show_distances(b.distances)}, "
                             f"pi = {b.pi}, reuse dims {[b.dims[k].name for k in b.reuse]}, "
                             f"T = {b.T.tolist()}")
                if b.reordering.why:
                    lines.append(f"    {b.reordering.why}")
        if self.hyperplanes:
            lines.append(f"  per-statement hyperplanes (time dim 0; the bands' {self.band_steps} steps -> "
                         f"{self.sequential_steps}, the critical path):")
            lines += [f"    {g(m)}" for m in self.hyperplanes.values()]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Bands and their distance vectors


def bands(model: PolyModel) -> list:
    """One Band per block node (outermost first), with its statements."""
    out = []
    for blk in model.etdg.blocks():
        if not blk.dims:
            continue
        names = [st.name for st in model.etdg.statements if _below(st.block, blk)]
        out.append(Band(blk, len(blk.context()) - len(blk.dims), names))
    return out


def _below(block, ancestor) -> bool:
    while block is not None:
        if block is ancestor:
            return True
        block = block.parent
    return False


def _dependences(deps: Dependences):
    """(source statement, sink statement, map) for every map of every dependence."""
    for m in maps(deps.all):
        yield m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out), m


def band_distances(band: Band, deps: Dependences) -> isl.Set | None:
    """Distance vectors on the band's dims (execution-oriented) of the dependences among its
    statements that no enclosing dim carries; None when there are none."""
    return distances(deps, band.statements, band.outer, [d.reversed for d in band.dims])


def distances(deps: Dependences, statements, outer: int, reversed_dims) -> isl.Set | None:
    """Distances on dims outer..outer+n of the dependences among `statements` with zero
    distance on the first `outer` dims; dims flagged in `reversed_dims` run backwards."""
    n = len(reversed_dims)
    k = outer + n
    found = []
    for src, dst, m in _dependences(deps):
        if src not in statements or dst not in statements:
            continue
        n_in, n_out = m.dim(isl.dim_type.in_), m.dim(isl.dim_type.out)
        p = m.project_out(isl.dim_type.in_, k, n_in - k).project_out(isl.dim_type.out, k, n_out - k)
        p = p.reset_tuple_id(isl.dim_type.in_).reset_tuple_id(isl.dim_type.out)
        d = p.deltas()
        for o in range(outer):  # not carried further out
            d = d.fix_val(isl.dim_type.set, o, isl.Val.zero(d.get_ctx()))
        d = d.project_out(isl.dim_type.set, 0, outer)
        for c, rev in enumerate(reversed_dims):
            if rev:
                d = d.apply(_negate(d.get_space(), c))
        zero = isl.Set.universe(d.get_space())
        for c in range(n):
            zero = zero.fix_val(isl.dim_type.set, c, isl.Val.zero(d.get_ctx()))
        d = d.subtract(zero)
        if not d.is_empty():
            found.append(d)
    result = union(found)
    return result.coalesce() if result is not None else None


def _negate(space, c) -> isl.Map:
    n = space.dim(isl.dim_type.set)
    names = [f"x{i}" for i in range(n)]
    outs = [f"-{x}" if i == c else x for i, x in enumerate(names)]
    return isl.Map(f"{param_prefix(param_names(space))}{{ [{', '.join(names)}] -> [{', '.join(outs)}] }}")


def band_reuse(band: Band, deps: Dependences) -> list:
    """Band dims along which some read of the band's statements touches the same data (the
    reuse that the dependence analysis found, paper §5.2)."""
    n = len(band.dims)
    return sorted({k - band.outer for r in deps.reuse if r.statement in band.statements
                   for k in r.columns if band.outer <= k < band.outer + n})


# ---------------------------------------------------------------------------------------
# Building schedules


def _statement_maps(model: PolyModel, band_T: dict) -> dict:
    """Per statement: S[dims] -> [seq, T·v, seq, T·v, ..., seq] (padded), each band's dims
    transformed by its T in `band_T` (block name -> T; the nest as written where absent)."""
    namer = Namer(model.params)
    prefix = param_prefix(model.params)
    width = max((len(st.position) for st in model.etdg.statements), default=0)
    return {st.name: schedule_map(prefix, st, namer, width, band_T).intersect_params(model.context)
            for st in model.etdg.statements}


def _statement_T(model: PolyModel, band_T: dict) -> dict:
    """Block-diagonal T over each statement's dims (the bands on its path), so that the
    statement's non-constant time dims are T·x plus a constant: a band's T acts on its dims in
    execution order, where a right aggregate's dim x counts down (L - 1 - x), so its column
    changes sign here."""
    out = {}
    for st in model.etdg.statements:
        n = len(st.dims)
        T = np.zeros((n, n), dtype=np.int64)
        off = 0
        for blk in _path(st.block):
            k = len(blk.dims)
            Tb = band_T.get(blk.name)
            Tb = np.eye(k, dtype=np.int64) if Tb is None else np.asarray(Tb, dtype=np.int64)
            T[off:off + k, off:off + k] = Tb * np.array([-1 if d.reversed else 1 for d in blk.dims], dtype=np.int64)
            off += k
        out[st.name] = T
    return out


def _path(block) -> list:
    chain = []
    while block is not None:
        if block.dims:
            chain.insert(0, block)
        block = block.parent
    return chain


def _timed(m: isl.Map, src: str, dst: str, per_statement: dict) -> isl.Map:
    """A dependence as time of the source -> time of the sink."""
    return m.apply_domain(per_statement[src]).apply_range(per_statement[dst])


def parallel_dims(per_statement: dict, deps: Dependences) -> list:
    """Per time dim of the schedule `per_statement` (name -> isl.Map): True when it is
    parallel, i.e. no dependence is carried at that level."""
    width = next(iter(per_statement.values())).dim(isl.dim_type.out) if per_statement else 0
    pairs = union(_timed(m, src, dst, per_statement) for src, dst, m in _dependences(deps))
    parallel = []
    for k in range(width):
        if pairs is None:
            parallel.append(True)
            continue
        carried = pairs
        for j in range(k):
            carried = carried.equate(isl.dim_type.in_, j, isl.dim_type.out, j)
        same = carried.equate(isl.dim_type.in_, k, isl.dim_type.out, k)
        parallel.append(carried.subtract(same).is_empty())
    return parallel


def _sequential_levels(model: PolyModel, per_statement: dict, deps: Dependences) -> dict:
    """Per statement, the time dims it must run sequentially. Dim k is sequential for the
    statements of a subtree of the schedule at level k (those whose times can share the
    prefix of dims < k, closed transitively) in which some dependence is carried at k; in
    another subtree the same dim runs in parallel (e.g. a map placed after a scan)."""
    names = list(per_statement)
    if not names:
        return {}
    width = per_statement[names[0]].dim(isl.dim_type.out)
    images = {n: model.domains[n].apply(per_statement[n]).reset_tuple_id() for n in names}
    carried = [set() for _ in range(width)]  # statements with a dependence carried at k
    for src, dst, m in _dependences(deps):
        same = _timed(m, src, dst, per_statement)
        for k in range(width):
            if same.is_empty():
                break
            eq = same.equate(isl.dim_type.in_, k, isl.dim_type.out, k)
            if not same.subtract(eq).is_empty():
                carried[k] |= {src, dst}
            same = eq
    out = {n: set() for n in names}
    for k in range(width):
        if not carried[k]:
            continue
        prefix = {n: images[n].project_out(isl.dim_type.set, k, width - k) for n in names}
        group_of = {}
        for n in names:  # connected components of "can share the prefix"
            if n in group_of:
                continue
            group_of[n], todo = n, [n]
            while todo:
                a = todo.pop()
                for b in names:
                    if b not in group_of and not prefix[a].intersect(prefix[b]).is_empty():
                        group_of[b] = n
                        todo.append(b)
        seq_groups = {group_of[n] for n in carried[k]}
        for n in names:
            if group_of[n] in seq_groups:
                out[n].add(k)
    return out


def sequential_steps(model: PolyModel, per_statement: dict, parallel: list, deps: Dependences | None = None) \
        -> int | None:
    """Distinct values of the sequential time dims over all instances: the critical path in
    steps when every parallel dim runs at once. Needs concrete sizes. With `deps`, a dim is
    parallel or sequential per subtree of the schedule (`_sequential_levels`): a statement's
    parallel dims are set to 0, which keeps every dependence strictly forward, so the count
    is that of a legal execution; without, the dims that are parallel for every statement
    (`parallel`) are projected out."""
    if any(p not in model.sizes for p in model.params):
        return None
    seq = _sequential_levels(model, per_statement, deps) if deps is not None else None
    images = []
    for name, m in per_statement.items():
        img = model.domains[name].apply(m).reset_tuple_id()
        if seq is not None:
            for k in range(img.dim(isl.dim_type.set)):
                if k not in seq[name]:
                    img = img.project_out(isl.dim_type.set, k, 1).insert_dims(isl.dim_type.set, k, 1) \
                        .fix_val(isl.dim_type.set, k, isl.Val.zero(img.get_ctx()))
        images.append(img)
    times = union(images)
    if times is None:
        return 0
    if seq is None:
        for k in reversed(range(len(parallel))):
            if parallel[k]:
                times = times.project_out(isl.dim_type.set, k, 1)
    count = 0

    def add(_):
        nonlocal count
        count += 1
    times.coalesce().foreach_point(add)
    return count


ACCEPTED = '"auto", "original", an ISL schedule string, or an isl.UnionMap (or isl.Map)'


def schedule_kind(kind):
    """What `schedule=` names: "auto" or "original" as they are, a user's schedule as an
    isl.UnionMap (read from its string); anything else is a ScheduleError."""
    if isinstance(kind, str):
        if kind in ("auto", "original"):
            return kind
        try:
            return isl.UnionMap(kind)
        except isl.Error as e:
            raise ScheduleError(f"cannot read the schedule {kind!r} as an ISL union map ({e}); schedule= takes "
                                f"{ACCEPTED}", op="schedule") from None
    if isinstance(kind, isl.Map):
        return isl.UnionMap.from_map(kind)
    if isinstance(kind, isl.UnionMap):
        return kind
    raise ScheduleError(f"schedule= takes {ACCEPTED}; got the {type(kind).__name__} {kind!r}", op="schedule")


def make_schedule(model: PolyModel, deps: Dependences, kind="auto") -> Schedule:
    """`kind`: "auto" (hyperplane reordering), "original" (the nest as written), or an ISL
    schedule (isl.UnionMap or its string) that a user supplies; each is checked legal."""
    kind = schedule_kind(kind)
    if isinstance(kind, isl.UnionMap):
        return _finish("user", model, deps, user_schedule(model, kind), [])
    per, bs = schedule_maps(model, deps, kind)
    sched = _finish(kind, model, deps, per, bs)
    return _reach_critical_path(sched) if kind == "auto" else sched


def _reach_critical_path(sched: Schedule) -> Schedule:
    """`sched` (the bands reordered), or where it takes more steps than the critical path, the
    per-statement hyperplanes (schedule/hyperplanes.py) outermost with its times inside."""
    model, deps = sched.model, sched.deps
    if sched.sequential_steps is None or sched.sequential_steps <= sched.critical_path:
        return sched
    theta = statement_hyperplanes(model, deps)
    if theta is None:
        return sched
    per = {name: theta[name].flat_range_product(m) for name, m in sched.per_statement.items()}
    out = _finish("auto", model, deps, per, sched.bands, theta)
    out.band_steps = sched.sequential_steps
    return out if out.sequential_steps < sched.sequential_steps else sched


def _instance(dom: isl.Set) -> str:
    """A statement's instance tuple, as its domain names it: `S_b0[i, j]`."""
    dims = [dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set))]
    return f"{dom.get_tuple_name()}[{', '.join(dims)}]"


def _given(m: isl.Map) -> str:
    """The instance tuple a user's map gives, with its own dim names: `S_b0[i, j]`."""
    dims = [m.get_dim_name(isl.dim_type.in_, k) or f"x{k}" for k in range(m.dim(isl.dim_type.in_))]
    return f"{m.get_tuple_name(isl.dim_type.in_) or ''}[{', '.join(dims)}]"


def _statements(model: PolyModel) -> str:
    """The program's statements with their dims: `S_b0[i, j, k], S_b1[i]`."""
    return ", ".join(_instance(dom) for dom in model.domains.values())


def user_schedule(model: PolyModel, user: isl.UnionMap) -> dict:
    """Statement name -> its time map, from a user's schedule: every statement of the program, each
    instance exactly one time vector, all of one length (`_finish` checks that no two share one).
    The maps are intersected with the statement domains (bounds written in the schedule may be
    left out or repeat the domain's), lengths the program does not have are resolved
    (`_own_lengths`), and each statement's arity is checked."""
    user = _own_lengths(model, user)
    found = maps(user.intersect_params(model.context))
    unknown = [m for m in found if m.get_tuple_name(isl.dim_type.in_) not in model.domains]
    if unknown:
        raise ScheduleError(f"the schedule names statements the program does not have: "
                            f"{', '.join(_misspelled(model, m) for m in unknown)}; the program's statements are "
                            f"{_statements(model)}", op="schedule")
    wrong = [m for m in found
             if m.dim(isl.dim_type.in_) != model.domains[m.get_tuple_name(isl.dim_type.in_)].dim(isl.dim_type.set)]
    if wrong:
        m = wrong[0]
        name = m.get_tuple_name(isl.dim_type.in_)
        dom = model.domains[name]
        raise ScheduleError(f"the schedule gives {_given(m)} ({m.dim(isl.dim_type.in_)} dims), but {name} has "
                            f"{dom.dim(isl.dim_type.set)} dims: {_instance(dom)}; the schedule gives "
                            f"{', '.join(_given(x) for x in found)}, the program's statements are "
                            f"{_statements(model)}", op="schedule")
    per, width = {}, None
    for m in found:
        name = m.get_tuple_name(isl.dim_type.in_)
        dom = model.domains[name]
        m = m.reset_tuple_id(isl.dim_type.out).intersect_domain(dom)  # time vectors are anonymous
        if width is not None and m.dim(isl.dim_type.out) != width[1]:
            raise ScheduleError(f"time vectors must have one length: {width[0]} gets {width[1]} dims, {name} gets "
                                f"{m.dim(isl.dim_type.out)} ({m}); pad the shorter ones with 0", op="schedule")
        width = width or (name, m.dim(isl.dim_type.out))
        per[name] = per[name].union(m) if name in per else m
    missing = [name for name in model.domains if name not in per]
    if missing:
        raise ScheduleError(f"the schedule gives no time to {', '.join(_instance(model.domains[n]) for n in missing)}; "
                            f"it gives {', '.join(_given(m) for m in found) or 'none'}, the program's statements are "
                            f"{_statements(model)}", op="schedule")
    for name, dom in model.domains.items():  # a dependence is only checked where both ends have a time
        untimed = dom.subtract(per[name].domain())
        if not untimed.is_empty():
            raise ScheduleError(f"the schedule gives no time to the instances {untimed} (e.g. {_point(untimed)}); "
                                f"write no bounds, or those of the domain {dom}", op="schedule")
        if not per[name].is_single_valued():
            raise ScheduleError(f"the schedule gives instances of {name} more than one time{_two_times(per[name])}: "
                                f"{per[name]}", op="schedule")
    return per


def _misspelled(model: PolyModel, m: isl.Map) -> str:
    """A statement the program lacks, with the likeliest one meant: `S_bo[i, j, k] (did you mean S_b0[i, j, k]?)`."""
    import difflib  # only for this message
    if not m.get_tuple_name(isl.dim_type.in_):
        return _given(m) + " (no statement name)"
    near = difflib.get_close_matches(m.get_tuple_name(isl.dim_type.in_), list(model.domains), 1, 0.5)
    return _given(m) + (f" (did you mean {_instance(model.domains[near[0]])}?)" if near else "")


def _two_times(m: isl.Map) -> str:
    """` (S_b0[0, 0, 0] gets [0, 0, 0, 0] and [0, 0, 0, 1])` for a map that is not single-valued ('' when
    ISL cannot pick one, e.g. times without bound)."""
    try:
        lo, hi = m.lexmin(), m.lexmax()
        where = lo.subtract(hi).domain()
        if where.is_empty():
            return ""
        at = isl.Set.from_point(where.sample_point())
        return f" ({_point(at)} gets {_point(lo.intersect_domain(at).range())} and " \
               f"{_point(hi.intersect_domain(at).range())})"
    except isl.Error:
        return ""


def _own_lengths(model: PolyModel, user: isl.UnionMap) -> isl.UnionMap:
    """The user's schedule over the program's lengths only. A parameter the program does not
    have (every one, for a program traced from concrete inputs, whose lengths are numbers) is
    fixed where the schedule's bounds make its statements' domains exactly those of the program
    (every dim bounded, `0 <= k < L` with k in [0, 5): L = 5) whatever the program's own lengths,
    then projected out (a condition on it alone, `Q > 0`, holds for some value: it drops out,
    from specs as from inputs); the schedule's times must not depend on it otherwise, which is a
    ScheduleError."""
    extra = [p for p in param_names(user.get_space()) if p not in model.params]
    if not extra:
        return user
    named = [m for m in maps(user) if m.get_tuple_name(isl.dim_type.in_) in model.domains]
    if named:
        given = union(isl.UnionSet.from_set(m.domain()) for m in named)
        doms = union(isl.UnionSet.from_set(model.domains[n])
                     for n in dict.fromkeys(m.get_tuple_name(isl.dim_type.in_) for m in named))
        values = isl.Set.universe(given.params().get_space()).intersect_params(model.context) \
            .subtract(given.subtract(doms).params()).subtract(doms.subtract(given).params())
        known = values
        for p in extra:  # the program's lengths for which the bounds tell the others' values
            known = known.project_out(isl.dim_type.param, known.get_space().find_dim_by_name(isl.dim_type.param, p), 1)
        if not values.is_empty() and model.context.is_subset(known):  # for every length of the program: keep them
            user = user.intersect_params(values)

    def without(um, names):
        for p in names:
            um = um.project_out(isl.dim_type.param, um.get_space().find_dim_by_name(isl.dim_type.param, p), 1)
        return um

    def times_of(um):  # the maps over the program's statements, each within its domain
        return [m.intersect_domain(model.domains[n]) for m in maps(um)
                if (n := m.get_tuple_name(isl.dim_type.in_)) in model.domains
                and m.dim(isl.dim_type.in_) == model.domains[n].dim(isl.dim_type.set)]

    if not all(m.is_single_valued() for m in times_of(without(user, extra))):
        if model.params:
            has = f"has the lengths {', '.join(model.params)}"
        else:
            has = "was traced from concrete inputs: its lengths are numbers"
        needed = [p for p in extra if not all(m.is_single_valued() for m in times_of(without(user, [p])))]
        doms = "; ".join(str(d.gist_params(model.context)) for d in model.domains.values())
        raise ScheduleError(f"the schedule's times depend on {', '.join(needed or extra)}, which the program does "
                            f"not know (it {has}); write their values, or bound the statements' dims by them as "
                            f"the domains do ({doms}) so that their values follow", op="schedule")
    return without(user, extra)


def check_legal(per: dict, deps: Dependences) -> None:
    """Every dependence goes forward in the schedule `per`, else a ScheduleError naming
    the violated part of one dependence (once) and one pair of its instances, the smallest for
    one choice of the lengths, with their times: `S_b0[0, 0, 0] must run before S_b0[0, 0, 1]`."""
    for src, dst, m in _dependences(deps):
        s1, s2 = per[src], per[dst]
        lexge = isl.Map.lex_ge(s1.get_space().range())
        bad = m.intersect(s1.apply_range(lexge).apply_range(s2.reverse()))
        if bad.is_empty():
            continue
        first, second, at, lengths = _pair(bad)
        t1 = _point(s1.intersect_params(at).intersect_domain(first).range())
        t2 = _point(s2.intersect_params(at).intersect_domain(second).range())
        a, b = _point(first), _point(second)
        raise ScheduleError(f"the schedule violates the dependence {bad} (scheduled {a} at {t1} and {b} at {t2}"
                            f"{lengths}): {a} must run before {b}, which depends on it, but its time is not "
                            f"earlier", op="schedule")


def _pair(rel: isl.Map, sizes: dict | None = None, smallest: bool = True) -> tuple:
    """One pair of instances of the relation `rel`: (source point, sink point, the lengths' values
    as a parameter set, ' for L = 2, ...' naming those not in `sizes` ('' when none)): lengths
    sampled, then the lexicographically smallest pair for them (else ISL's sample)."""
    if smallest:
        at = isl.Set.from_point(rel.params().sample_point())
        pair = isl.Set.from_point(rel.intersect_params(at).wrap().lexmin().sample_point()).unwrap()
    else:
        pair = isl.Set.from_point(rel.wrap().sample_point()).unwrap()
        at = pair.params()
    pt = at.sample_point()
    names = param_names(at.get_space())
    shown = [f"{p} = {pt.get_coordinate_val(isl.dim_type.param, k).to_python()}"
             for k, p in enumerate(names) if p not in (sizes or {})]
    return pair.domain(), pair.range(), at, f" (for {', '.join(shown)})" if shown else ""


def _check_injective(per: dict, sizes: dict) -> None:
    """No two instances (of one statement or of two) at one time: nothing would order them. The
    error shows one such pair, with the lengths (those not fixed by `sizes`) it needs, and what
    tells them apart (the dims to add as innermost time dims, or a constant dim between two
    statements); polyft does not complete a user's schedule itself."""
    times = union(isl.UnionMap.from_map(m) for m in per.values())
    clash = times.apply_range(times.reverse()).subtract(times.domain().identity())
    if clash.is_empty():
        return
    rel = maps(clash)[0]
    first, second, at, lengths = _pair(rel, sizes, smallest=False)
    src, dst = rel.get_tuple_name(isl.dim_type.in_), rel.get_tuple_name(isl.dim_type.out)
    time = _point(per[src].intersect_params(at).intersect_domain(first).range())
    if src == dst:
        dom = per[src].domain()
        a, b = first.sample_point(), second.sample_point()
        differ = [dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set))
                  if a.get_coordinate_val(isl.dim_type.set, k).to_python()
                  != b.get_coordinate_val(isl.dim_type.set, k).to_python()]
        hint = f"the time does not tell {src}'s dim{'s' if len(differ) > 1 else ''} {', '.join(differ)} apart: " \
               f"add {'them' if len(differ) > 1 else 'it'} as innermost time dim{'s' if len(differ) > 1 else ''}"
    else:
        hint = f"add a time dim that orders {src} and {dst} (e.g. 0 for one, 1 for the other)"
    raise ScheduleError(f"the schedule runs two instances at one time: {_point(first)} and {_point(second)} are both "
                        f"at {time}{lengths}; give every instance its own time vector ({hint}, padding the "
                        f"other statements' times with 0)", op="schedule")


def _point(s) -> str:
    """A point of an ISL set as `S_b0[1, 0]`."""
    p = s.sample_point()
    coords = [p.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(s.dim(isl.dim_type.set))]
    return f"{s.get_tuple_name() or ''}[{', '.join(map(str, coords))}]"


def time_rows(m: isl.Map) -> list | None:
    """Per time dim of a statement's time map `m`, outer to inner: (its coefficients over the
    statement's dims, its constant part as text: `L - 1`, `0`), so that time = rows·x + constants;
    None when `m` is not one integer affine function. For the "auto" and "original" schedules
    the rows with a nonzero coefficient are `Schedule.T`'s (a dim of extent 1 may read as 0)."""
    pieces = []
    try:
        m.as_pw_multi_aff().foreach_piece(lambda _, ma: pieces.append(ma))
    except isl.Error:  # not single-valued
        return None
    if len(pieces) != 1:
        return None
    ma, rows = pieces[0], []
    params = param_names(m.get_space())
    for r in range(ma.dim(isl.dim_type.out)):
        aff = ma.get_at(r)
        if aff.dim(isl.dim_type.div) or aff.get_denominator_val().to_python() != 1:
            return None
        coeffs = [aff.get_coefficient_val(isl.dim_type.in_, c).to_python() for c in range(m.dim(isl.dim_type.in_))]
        terms = [(aff.get_coefficient_val(isl.dim_type.param, k).to_python(), p) for k, p in enumerate(params)]
        text = ""
        for c, p in [t for t in terms if t[0]] + [(aff.get_constant_val().to_python(), "")]:
            if not c and (text or p):
                continue
            mag = f"{abs(c)}*{p}" if p and abs(c) != 1 else (p or str(abs(c)))
            text += (" - " if c < 0 else " + ") + mag if text else ("-" if c < 0 else "") + mag
        rows.append((coeffs, text))
    return rows


def schedule_maps(model: PolyModel, deps: Dependences, kind: str = "auto") -> tuple[dict, list]:
    """(statement name -> time map, the bands) of an "auto" schedule (every band reordered:
    π and T from its distances and reuse) or an "original" one, not yet checked or measured."""
    bs = bands(model)
    if kind == "auto":
        for b in bs:
            b.reordering = reorder_space(band_distances(b, deps), [d.name for d in b.dims], band_reuse(b, deps))
    return _statement_maps(model, _band_T(bs)), bs


def _band_T(bs) -> dict:
    return {b.block.name: b.T for b in bs if b.T is not None}


def _finish(kind, model, deps, per, bs, hyperplanes=None) -> Schedule:
    check_legal(per, deps)
    if kind == "user":  # after check_legal: a violated dependence is the more telling error
        _check_injective(per, model.sizes)
        if all(p in model.sizes for p in model.params):  # symbolic lengths: checked at each call's lengths
            check_scan(model, per, model.sizes)
    parallel = parallel_dims(per, deps)
    steps = sequential_steps(model, per, parallel, deps)
    T = _statement_T(model, _band_T(bs)) if kind != "user" else {}
    space = isl.Space.params_alloc(model.context.get_ctx(), 0)
    return Schedule(kind, union_map(per.values(), space), per, T, bs, parallel, steps, hyperplanes or {},
                    model=model, deps=deps)


# A user's schedule whose loops step over far more times than there are instances (a coefficient
# like 10**12 * k spreads a statement's few instances over a huge range of one time dim, and the
# generated loop visits every value in it) is rejected before it runs: it would run for hours.
SCAN_RATIO = 1000  # loop iterations per instance beyond which a schedule is rejected ...
SCAN_FLOOR = 10 ** 8  # ... when they are also this many (a fraction of a second of empty loops)


def _widths(s: isl.Set) -> int:
    """The iterations of a loop nest over the points of `s` (params fixed), each loop from the least
    to the greatest value its dim takes under the outer dims' values (holes included): the product
    over dims of the widest such range. Exact for a box; an upper bound that keeps holes visible."""
    count = 1
    for d in range(s.dim(isl.dim_type.set)):
        prefix = s.project_out(isl.dim_type.set, d + 1, s.dim(isl.dim_type.set) - d - 1)
        m = isl.Map.from_range(prefix).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, d)  # outer -> dim d
        spread = m.reverse().apply_range(m).deltas()  # differences of two values under one prefix
        widest = spread.lexmax()
        if widest.is_empty():
            return 0
        count *= widest.sample_point().get_coordinate_val(isl.dim_type.set, 0).to_python() + 1
    return count


def scan_size(model, per: dict, sizes: dict) -> tuple:
    """(about how many loop iterations the statements' time maps `per` take, how many the program's
    own nests take: at least the instances), summed over the statements, for the lengths `sizes`
    (every one given)."""
    fixed = isl.Set(f"[{', '.join(sizes)}] -> {{ : {' and '.join(f'{p} = {v}' for p, v in sizes.items()) or 'true'} }}")
    scanned = own = 0
    for name, m in per.items():
        dom = model.domains[name].intersect_params(fixed)
        scanned += _widths(m.intersect_params(fixed).intersect_domain(dom).range())
        own += _widths(dom)
    return scanned, own


def check_scan(model, per: dict, sizes: dict) -> None:
    """ScheduleError when the loops of `per` run more than SCAN_RATIO times the iterations of the
    program's own nests, and more than SCAN_FLOOR (module comment), with the counts."""
    scanned, own = scan_size(model, per, sizes)
    if scanned > SCAN_FLOOR and scanned > SCAN_RATIO * own:
        at = ", ".join(f"{p} = {v}" for p, v in sizes.items())
        raise ScheduleError(f"the schedule's loops would run about {scanned:.3g} iterations for {own} statement "
                            f"instances{' at ' + at if at else ''}: almost all of them empty (a large coefficient "
                            "spreads the instances over a range of times, and the loops visit every time in it); "
                            "use coefficients that keep the times dense (0, 1, -1, or a tile's floor(k / s))",
                            op="schedule")
