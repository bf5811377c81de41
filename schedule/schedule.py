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

from dataclasses import dataclass

import islpy as isl
import numpy as np

from polyft.deps.analyze import Dependences
from polyft.deps.isl_helpers import Namer, maps, param_names, param_prefix, schedule_map, union, union_map
from polyft.deps.model import PolyModel
from polyft.errors import ScheduleError
from polyft.etdg import BlockNode

from .reorder import Reordering, reorder_space, show_distances


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
    kind: str  # "auto", "original" or "user"
    map: isl.UnionMap  # statement instance -> time vector
    per_statement: dict  # name -> isl.Map
    T: dict  # statement name -> unimodular matrix over its dims (numpy int)
    bands: list
    parallel: list  # per time dim: True when it carries no dependence
    sequential_steps: int | None  # critical path in steps, for concrete sizes

    def reordering(self, model, name):
        """The statement's T as a `reorder.Reordering`, for bounds and transformed accesses."""
        dom = model.domains[name]
        names = [dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set))]
        return Reordering(names, set(), None, [], self.T[name])

    def describe(self, context=None) -> str:
        g = (lambda m: m.gist_params(context)) if context is not None else (lambda m: m)
        lines = [f"{self.kind} schedule:"]
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
    """Block-diagonal T over each statement's dims (the bands on its path)."""
    out = {}
    for st in model.etdg.statements:
        n = len(st.dims)
        T = np.zeros((n, n), dtype=np.int64)
        off = 0
        for blk in _path(st.block):
            k = len(blk.dims)
            Tb = band_T.get(blk.name)
            T[off:off + k, off:off + k] = np.eye(k, dtype=np.int64) if Tb is None else np.asarray(Tb, dtype=np.int64)
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


def check_legal(per_statement: dict, deps: Dependences) -> None:
    """Every dependence must go forward in time (lexicographically), else ScheduleError."""
    for src, dst, m in _dependences(deps):
        s1, s2 = per_statement[src], per_statement[dst]
        lexge = isl.Map.lex_ge(s1.get_space().range())
        backwards = s1.apply_range(lexge).apply_range(s2.reverse())
        bad = m.intersect(backwards)
        if not bad.is_empty():
            raise ScheduleError(f"the schedule violates the dependence {bad} "
                                f"(scheduled {s1} and {s2})", op="schedule")


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
    return _finish(kind, model, deps, per, bs)


def _instance(dom: isl.Set) -> str:
    """A statement's instance tuple, as its domain names it: `S_b0[i, j]`."""
    dims = [dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set))]
    return f"{dom.get_tuple_name()}[{', '.join(dims)}]"


def user_schedule(model: PolyModel, user: isl.UnionMap) -> dict:
    """Statement name -> its time map, from a user's schedule: every statement of the program, each
    instance exactly one time vector, all of one length (`_finish` checks that no two share one)."""
    found = maps(user.intersect_params(model.context))
    unknown = {m.get_tuple_name(isl.dim_type.in_) for m in found} - set(model.domains)
    if unknown:
        raise ScheduleError(f"the schedule names statements the program does not have: {sorted(unknown, key=str)}; "
                            f"its statements are {sorted(model.domains)}", op="schedule")
    per, width = {}, None
    for m in found:
        name = m.get_tuple_name(isl.dim_type.in_)
        dom = model.domains[name]
        if m.dim(isl.dim_type.in_) != dom.dim(isl.dim_type.set):
            raise ScheduleError(f"the schedule maps {name} instances of {m.dim(isl.dim_type.in_)} dims ({m}), but "
                                f"{name} has {dom.dim(isl.dim_type.set)}: {_instance(dom)}", op="schedule")
        m = m.reset_tuple_id(isl.dim_type.out).intersect_domain(dom)  # time vectors are anonymous
        if width is not None and m.dim(isl.dim_type.out) != width[1]:
            raise ScheduleError(f"time vectors must have one length: {width[0]} gets {width[1]} dims, {name} gets "
                                f"{m.dim(isl.dim_type.out)} ({m}); pad the shorter ones with 0", op="schedule")
        width = width or (name, m.dim(isl.dim_type.out))
        per[name] = per[name].union(m) if name in per else m
    missing = set(model.domains) - set(per)
    if missing:
        raise ScheduleError(f"the schedule gives no time to {sorted(missing)}", op="schedule")
    for name, dom in model.domains.items():  # a dependence is only checked where both ends have a time
        untimed = dom.subtract(per[name].domain())
        if not untimed.is_empty():
            raise ScheduleError(f"the schedule gives no time to the instances {untimed}", op="schedule")
        if not per[name].is_single_valued():
            raise ScheduleError(f"the schedule gives instances of {name} more than one time: {per[name]}",
                                op="schedule")
    return per


def _check_injective(per: dict, sizes: dict) -> None:
    """No two instances (of one statement or of two) at one time: nothing would order them. The
    error shows one such pair, with the lengths (those not fixed by `sizes`) it needs."""
    times = union(isl.UnionMap.from_map(m) for m in per.values())
    clash = times.apply_range(times.reverse()).subtract(times.domain().identity())
    if clash.is_empty():
        return
    pair = maps(clash)[0].sample()
    first, second = _point(pair.domain()), _point(pair.range())
    time = per[pair.get_tuple_name(isl.dim_type.in_)].intersect_domain(isl.Set.from_basic_set(pair.domain()))
    at = pair.domain().sample_point()
    lengths = ", ".join(f"{p} = {at.get_coordinate_val(isl.dim_type.param, k).to_python()}"
                        for k, p in enumerate(param_names(pair.get_space())) if p not in sizes)
    raise ScheduleError(f"the schedule runs two instances at one time: {first} and {second} are both at "
                        f"{_point(time.range())}" + (f" (for {lengths})" if lengths else "")
                        + "; give every instance its own time vector", op="schedule")


def _point(s) -> str:
    """A point of an ISL set as `S_b0[1, 0]`."""
    p = s.sample_point()
    coords = [p.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(s.dim(isl.dim_type.set))]
    return f"{s.get_tuple_name() or ''}[{', '.join(map(str, coords))}]"


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


def _finish(kind, model, deps, per, bs) -> Schedule:
    check_legal(per, deps)
    if kind == "user":  # after check_legal: a violated dependence is the more telling error
        _check_injective(per, model.sizes)
    parallel = parallel_dims(per, deps)
    steps = sequential_steps(model, per, parallel, deps)
    T = _statement_T(model, _band_T(bs)) if kind != "user" else {}
    space = isl.Space.params_alloc(model.context.get_ctx(), 0)
    return Schedule(kind, union_map(per.values(), space), per, T, bs, parallel, steps)
