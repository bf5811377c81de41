"""The scheduler (schedule/): the paper's §5.2 reordering, checked against the paper and by
brute force.

* Figure 6 / Table 5: region3 of the stacked RNN lowered to element level has the operator
  vector (map, scanl, scanl, map) in its dependences, T is Figure 6's matrix, the new loop
  bounds mean exactly Table 5's ranges (compared as sets: ISL and a Python enumeration), and
  the transformed access maps M·T⁻¹ / o are e12..e15;
* the stacked RNN runs in L + D - 1 sequential steps ("auto") against D·L ("original");
* every workload's schedule is legal, also by brute force: the ETDG is run instance by
  instance, every (writer, reader) pair is mapped through the schedule at concrete sizes and
  must go strictly forward in lexicographic time;
* the RNN family's recurrence bands are wavefronts: one sequential dim (π), the rest parallel;
* user schedules: an illegal one raises ScheduleError naming a violated dependence as ISL, a
  legal one is accepted, one that leaves instances without a time is refused;
* Table 4 through the scheduler (π = e_i for an aggregate at depth i; a stride-s access gives
  distance s on the flat index);
* hypothesis: random nests always get a legal "auto" schedule, never with more sequential
  steps than the nest as written.
"""
from __future__ import annotations

import itertools
import re

import islpy as isl
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polyft as ft
from polyft.deps.analyze import analyze as analyze_deps
from polyft.deps.isl_helpers import maps
from polyft.deps.linalg import is_unimodular
from polyft.deps.model import build
from polyft import interpret
from polyft.errors import ScheduleError
from polyft.affine import ge
from polyft.etdg import BlockNode
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS, stacked_rnn
from polyft.schedule.lower import lower
from polyft.schedule.reorder import Reordering, bounds, reorder, reorder_space, transformed_accesses
from polyft.schedule.schedule import distances

from nests import KEEPS_LEVEL, Elem, Kit, Level, lift, make_body, nest_inputs, transforms

# -- helpers ---------------------------------------------------------------------------------


def points(obj) -> set:
    """The points of a finite isl.Set (or of a Map, as (in + out) tuples), parameters fixed
    by the context and projected out."""
    s = obj.wrap() if isinstance(obj, isl.Map) else obj
    n_par = s.dim(isl.dim_type.param)
    if n_par:
        s = s.project_out(isl.dim_type.param, 0, n_par)
    assert s.is_bounded(), f"not finite: {obj}"
    n = s.dim(isl.dim_type.set)
    out = set()
    s.foreach_point(lambda p: out.add(tuple(int(p.get_coordinate_val(isl.dim_type.set, k).to_python())
                                            for k in range(n))))
    return out


def times(model, schedule) -> dict:
    """(statement, instance) -> time vector, for every instance (concrete sizes)."""
    out = {}
    for name, m in schedule.per_statement.items():
        dom = model.domains[name]
        n_in = dom.dim(isl.dim_type.set)
        for p in points(m.intersect_domain(dom)):
            key = (name, p[:n_in])
            assert key not in out, f"{key} has two times"
            out[key] = p[n_in:]
    return out


def brute_flow(etdg, inputs) -> set:
    """Run the ETDG instance by instance: every (writer, reader) pair of instances."""
    last, pairs = {}, set()

    def record(stmt, env, reads, writes):
        me = (stmt.name, tuple(env[d] for d in stmt.dims))
        for buf_idx in reads:
            if buf_idx in last:
                pairs.add((last[buf_idx], me))
        for buf_idx in writes:
            last[buf_idx] = me
    interpret.run(etdg, *inputs, record=record)
    return pairs


def assert_brute_force_legal(prog, inputs, schedule=None) -> int:
    """Every brute-force flow dependence goes strictly forward in the schedule's time;
    returns the number of pairs checked."""
    schedule = schedule or prog.schedule
    when = times(prog.model, schedule)
    pairs = brute_flow(prog.etdg, inputs)
    for src, dst in pairs:
        assert src in when and dst in when, f"{src} or {dst} has no time in the schedule"
        assert when[src] < when[dst], (f"{schedule.kind} schedule runs {dst} at {when[dst]}, not after "
                                       f"its source {src} at {when[src]}")
    return len(pairs)


def sizes_of(etdg, inputs) -> dict:
    return interpret.bind_params(etdg, inputs)


# -- Figure 6 and Table 5: region3 of the stacked RNN -----------------------------------------

FIGURE6_T = [[0, 1, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]]
E12 = [[0, 0, 1, 0], [0, 1, 0, 0], [1, -1, 0, 0]]
E13 = E12 + [[0, 0, 0, 1]]
TABLE5_ACCESSES = sorted([  # (kind, buffer, M·T⁻¹, o)
    ("read", "ysss", E12, [0, -1, 0]),          # e12: the layer below, ysss[i][j-1][k]
    ("read", "ysss", E13, [0, 0, -1, 0]),       # e13: the previous step, ysss[i][j][k-1]
    ("read", "ws", [[0, 1, 0, 0], [0, 0, 0, 1]], [0, 0]),  # e14: the layer's weights
    ("write", "ysss", E13, [0, 0, 0, 0]),       # e15: the output
])


@pytest.fixture(scope="module", params=["small", "paper"])
def region3(request):
    """(preset, element width H, lowered model, dependences, statement, Reordering)."""
    preset = request.param
    etdg = ft.trace(stacked_rnn.program, *stacked_rnn.specs(preset))
    st_ = etdg.statements[0]
    _, j, k = st_.dims
    low = lower(build(etdg), st_.name, region=(ge(j, 1), ge(k, 1)))
    deps = analyze_deps(low)
    dist = distances(deps, [st_.name], 0, [False] * 4)
    R = reorder(low, st_.name, dist)
    return preset, stacked_rnn.PRESETS[preset]["H"], low, deps, st_.name, R, dist


def test_region3_dims_are_map_scanl_scanl_map(region3):
    _, H, low, deps, name, R, dist = region3
    assert low.statements[name].block.p == ["map", "scanl", "scanl"]
    assert len(low.dim_names) == 4  # [i, j, k, e1]: the [1, H] element's unit dim dropped
    vecs = R.distances
    assert isinstance(vecs, set) and vecs
    # Table 4: a map dim never carries a dependence, a scanl dim does (distance 1 on it)
    leading = {next(c for c, x in enumerate(v) if x) for v in vecs}
    assert leading == {1, 2}
    assert all(v[0] == 0 for v in vecs)
    assert (0, 0, 1, 0) in vecs  # along time: the same element of the previous step
    # along the layers: every element of the row below (the matmul's contraction)
    assert {v for v in vecs if v[1] == 1} == {(0, 1, 0, d) for d in range(-(H - 1), H)}


def test_region3_T_is_figure6(region3):
    *_, R, _ = region3
    assert R.T.tolist() == FIGURE6_T
    assert R.pi == (0, 1, 1, 0)


def _bound_constraints(text: str, name: str) -> str:
    """`[lo, hi)` (pieces joined by ∪, lo/hi possibly max(...)/min(...)) as an ISL condition."""
    if text == "":  # how bounds() prints the range of an empty domain
        return "false"
    pieces = []
    for piece in text.split(" ∪ "):
        assert piece.startswith("[") and piece.endswith(")"), piece
        body = piece[1:-1]
        depth, cut = 0, None
        for pos, ch in enumerate(body):
            depth += ch == "("
            depth -= ch == ")"
            if ch == "," and depth == 0:
                cut = pos
        lo, hi = body[:cut].strip(), body[cut + 1:].strip()
        pieces.append(f"({lo} <= {name} < {hi})")
    return " or ".join(pieces)


def _printed_bounds_set(low, R) -> isl.Set:
    names = R.new_names
    cond = " and ".join(f"({_bound_constraints(b, n)})" for n, b in bounds(low, list(low.domains)[0], R))
    return isl.Set(f"[{', '.join(low.params)}] -> {{ [{', '.join(names)}] : {cond} }}").intersect_params(low.context)


def _transformed_domain(low, name, T) -> isl.Set:
    dom = low.domains[name]
    n = dom.dim(isl.dim_type.set)
    xs = [f"x{c}" for c in range(n)]
    rows = [" + ".join(f"{a}*{x}" for a, x in zip(row, xs) if a) or "0" for row in T]
    tm = isl.Map(f"[{', '.join(low.params)}] -> {{ {name}[{', '.join(xs)}] -> [{', '.join(rows)}] }}")
    return dom.apply(tm)


def test_region3_bounds_mean_table5(region3):
    """The printed bounds, Table 5's ranges and T applied to region3's domain are the same
    set, parametrically in N, D, L (the element width is the preset's H; 512 in the paper)."""
    preset, H, low, _, name, R, _ = region3
    b = dict(bounds(low, name, R))
    assert b["j1"] == f"[0, {H})" and b["j2"] == "[0, N)"
    printed = _printed_bounds_set(low, R)
    td = _transformed_domain(low, name, FIGURE6_T)
    table5 = isl.Set(f"[D, L, N] -> {{ [j4, j3, j2, j1] : 2 <= j4 < L + D - 1 and "
                     f"max(1, j4 - L + 1) <= j3 < min(j4, D) and 0 <= j2 < N and 0 <= j1 < {H} }}"
                     ).intersect_params(low.context)
    assert printed.is_equal(td), f"printed bounds {b} differ from T(domain) {td}"
    assert table5.is_equal(td)


@pytest.mark.parametrize("N, D, L", [(1, 1, 1), (1, 2, 1), (1, 1, 3), (2, 3, 4), (1, 4, 2), (2, 2, 5)])
def test_region3_bounds_enumerated(N, D, L):
    """At concrete sizes: the points of the bounds printed for Figure 6's T, of Table 5's loops
    written in Python, and of region3 (j >= 1, k >= 1) mapped through T with numpy, are the
    same. (At sizes where a scan has a single step in region3 the hyperplane differs, e.g.
    L = 2: then the bounds printed for the T found mean T applied to region3.)"""
    etdg = ft.trace(stacked_rnn.program, *stacked_rnn.specs("small"))
    st_ = etdg.statements[0]
    _, j, k = st_.dims
    low = lower(build(etdg, {"N": N, "D": D, "L": L}), st_.name, region=(ge(j, 1), ge(k, 1)))
    deps = analyze_deps(low)
    R = reorder(low, st_.name, distances(deps, [st_.name], 0, [False] * 4))
    H = stacked_rnn.PRESETS["small"]["H"]
    region = [(i, jj, kk, e) for i in range(N) for jj in range(1, D) for kk in range(1, L) for e in range(H)]
    T = np.array(FIGURE6_T)
    mapped = {tuple(int(x) for x in T @ np.array(p)) for p in region}
    table5 = {(j4, j3, j2, j1) for j4 in range(2, L + D - 1) for j3 in range(max(1, j4 - L + 1), min(j4, D))
              for j2 in range(N) for j1 in range(H)}
    fig6 = Reordering(R.names, set(), (0, 1, 1, 0), [], np.array(FIGURE6_T, dtype=object))
    assert points(_printed_bounds_set(low, fig6)) == table5 == mapped
    own = {tuple(int(x) for x in np.array(R.T, dtype=np.int64) @ np.array(p)) for p in region}
    assert points(_printed_bounds_set(low, R)) == own
    if D >= 3 and L >= 3:  # both scans have a dependence inside region3
        assert R.T.tolist() == FIGURE6_T


def test_region3_accesses_are_table5(region3):
    *_, low, _, name, R, _ = region3
    got = sorted((kind, buf, mt.tolist(), [int(x) for x in o])
                 for kind, buf, _, mt, o in transformed_accesses(low, name, R))
    assert got == TABLE5_ACCESSES


@pytest.mark.parametrize("text, pi", [
    ("[N] -> { [i, j] : i = 1 and 0 <= j < N; [0, 1] }", (1, 1)),
    ("[N] -> { [i, j] : 1 <= i < N and -1 <= j <= 1 }", (1, 0)),
    ("[N] -> { [i, j, k] : 1 <= i < N and j = 0 and k = 0; [0, j, k] : 1 <= j < N and -1 <= k <= 1; [0, 0, 1] }",
     (1, 2, 1)),
])
def test_reorder_space_on_distances_that_grow_with_a_length(text, pi):
    """Distances with no bound over the lengths: π is the smallest-sum vector that carries
    them all (lexicographically largest among equal sums; checked against enumeration at
    N = 1..7), T is unimodular with π as its first row; none within the search's bound is
    a ScheduleError."""
    dist = isl.Set(text)
    n = dist.dim(isl.dim_type.set)
    R = reorder_space(dist, [f"x{k}" for k in range(n)], [])
    assert R.pi == pi and R.distances is dist and is_unimodular(R.T) and list(R.T[0]) == list(pi)
    vecs = set().union(*(points(dist.fix_val(isl.dim_type.param, 0, N)) for N in range(1, 8)))

    def carries(c):
        return all(sum(a * b for a, b in zip(c, v)) >= 1 for v in vecs)
    assert carries(pi)
    assert not any(carries(c) for c in itertools.product(range(sum(pi) + 1), repeat=n)
                   if sum(c) < sum(pi) or (sum(c) == sum(pi) and c > pi))  # smallest sum; outer dims first
    with pytest.raises(ScheduleError, match="no hyperplane"):
        reorder_space(isl.Set("[N] -> { [i, j] : i = 1 and -N < j < N; [0, 1] }"), ["x0", "x1"], [])


# -- stacked RNN: L + D - 1 against D·L ----------------------------------------------------


@pytest.mark.parametrize("D, L", [(1, 1), (1, 5), (4, 1), (2, 2), (3, 4), (5, 3), (8, 2)])
def test_stacked_rnn_sequential_steps(D, L):
    specs = stacked_rnn.specs("small")
    sizes = {"N": 2, "D": D, "L": L}
    auto = ft.analyze(stacked_rnn.program, *specs, sizes=sizes)
    orig = ft.analyze(stacked_rnn.program, *specs, sizes=sizes, schedule="original")
    assert auto.schedule.sequential_steps == L + D - 1
    assert orig.schedule.sequential_steps == D * L


# -- every workload: legal, also by brute force --------------------------------------------

SHRINK = {"dilated_rnn": {"H": 4}, "flash_attention": {"Lk": 8}, "bigbird": {"nb": 6}}


@pytest.fixture(scope="module", params=sorted(WORKLOADS))
def workload(request):
    """(name, inputs, eager result, auto program, original program) at the small preset. The
    auto program schedules the coarsened ETDG; "original" is the traced nest as written."""
    name = request.param
    mod = WORKLOADS[name]
    over = SHRINK.get(name, {})
    inputs = mod.inputs("small", seed=0, **over)
    specs = mod.specs("small", **over)
    sizes = sizes_of(ft.trace(mod.program, *specs), inputs)
    auto = ft.analyze(mod.program, *specs, sizes=sizes)  # make_schedule checks legality with ISL
    original = ft.analyze(mod.program, *specs, sizes=sizes, schedule="original")
    return name, inputs, mod.program(*inputs), auto, original


def test_workload_schedule_legal_by_brute_force(workload):
    name, inputs, expect, auto, original = workload
    assert auto.schedule.kind == "auto" and original.schedule.kind == "original"
    for prog in (auto, original):
        assert prog.schedule.sequential_steps is not None
        assert rel_error(interpret.run(prog.etdg, *inputs), expect) < 1e-4  # the program it schedules
        assert assert_brute_force_legal(prog, inputs) > 0  # not vacuous: there are dependences
    # the nest order of the coarsened ETDG is legal too
    assert_brute_force_legal(auto, inputs, auto.original_schedule())


def test_workload_auto_no_slower_than_original(workload):
    name, _, _, auto, original = workload
    assert auto.schedule.sequential_steps <= original.schedule.sequential_steps, name
    assert auto.schedule.sequential_steps <= auto.original_schedule().sequential_steps, name


def test_brute_force_check_is_not_vacuous():
    """A schedule that runs the stacked RNN's time steps backwards is caught."""
    inputs = stacked_rnn.inputs("small", seed=0)
    specs = stacked_rnn.specs("small")
    sizes = sizes_of(ft.trace(stacked_rnn.program, *specs), inputs)
    prog = ft.analyze(stacked_rnn.program, *specs, sizes=sizes)
    bad = isl.Map("[D, L, N] -> { S_b0[i, j, k] -> [0, i, j, -k, 0] }").intersect_params(prog.model.context)
    fake = type(prog.schedule)("user", isl.UnionMap.from_map(bad), {"S_b0": bad}, {}, [], [], None)
    with pytest.raises(AssertionError, match="not after its source"):
        assert_brute_force_legal(prog, inputs, fake)


# -- the RNN family: wavefront bands ----------------------------------------------------------


def band_offset(model, stmt, band) -> int:
    """Where the band's rows start in the statement's time vector."""
    off, k, pos = 0, 0, stmt.position
    while k < len(pos):
        if isinstance(pos[k], int):
            off, k = off + 1, k + 1
            continue
        blk = next(b for b in model.etdg.blocks() if b.dims and b.dims[0] is pos[k])
        if blk is band.block:
            return off
        off, k = off + len(blk.dims), k + len(blk.dims)
    raise AssertionError(f"{band.block.name} is not on {stmt.name}'s path")


def band_times(schedule) -> dict:
    """The statements' time maps of the band schedule: without the per-statement hyperplanes,
    where the schedule runs them outermost."""
    if not schedule.hyperplanes:
        return schedule.per_statement
    return {n: m.project_out(isl.dim_type.out, 0, 1) for n, m in schedule.per_statement.items()}


def carried_levels(prog, band) -> set:
    """The time levels inside the band's rows at which a dependence among its statements is
    carried (in the band schedule, `band_times`)."""
    per = band_times(prog.schedule)
    levels = set()
    for m in maps(prog.deps.may_flow.union(prog.deps.anti).union(prog.deps.output)):
        src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
        if src not in band.statements or dst not in band.statements:
            continue
        off = band_offset(prog.model, prog.model.statements[src], band)
        assert off == band_offset(prog.model, prog.model.statements[dst], band)
        t = m.apply_domain(per[src]).apply_range(per[dst])
        for level in range(off, off + len(band.dims)):
            same = t
            for c in range(level):
                same = same.equate(isl.dim_type.in_, c, isl.dim_type.out, c)
            if not same.subtract(same.equate(isl.dim_type.in_, level, isl.dim_type.out, level)).is_empty():
                levels.add(level - off)
    return levels


RNN_SCANS = {"stacked_rnn": 2, "stacked_lstm": 2, "dilated_rnn": 1, "grid_rnn": 3}  # scans per recurrence band


@pytest.mark.parametrize("name", sorted(RNN_SCANS))
def test_rnn_recurrence_bands_are_wavefronts(name):
    """Every band that carries a dependence: π is 1 on its scan dims and 0 on its maps (with
    coarsening the batch map may join the band), it is T's first row, and it is the only
    band row at which a dependence is carried: one sequential dim, the others parallel."""
    mod = WORKLOADS[name]
    specs = mod.specs("small")
    sizes = sizes_of(ft.trace(mod.program, *specs), mod.inputs("small"))
    prog = ft.analyze(mod.program, *specs, sizes=sizes)
    seq = [b for b in prog.schedule.bands if b.pi is not None]
    assert seq, "no band carries the recurrence"
    for b in seq:
        assert set(b.block.p) <= {"map", "scanl"} and b.block.p.count("scanl") == RNN_SCANS[name], b.block.p
        assert b.pi == tuple(int(op == "scanl") for op in b.block.p)
        assert list(b.T[0]) == list(b.pi)  # the hyperplane is T's first row
        assert carried_levels(prog, b) == {0}, f"{b.block.name}: carried at {carried_levels(prog, b)}"


def test_grid_rnn_three_scans():
    mod = WORKLOADS["grid_rnn"]
    prog = ft.analyze(mod.program, *mod.specs("small"))
    (band,) = [b for b in prog.schedule.bands if b.pi is not None]
    assert band.block.p == ["scanl", "scanl", "scanl"]
    assert band.distances == {(1, 0, 0), (0, 1, 0), (0, 0, 1)}
    assert band.pi == (1, 1, 1)


# -- user schedules --------------------------------------------------------------------------

RNN_SIZES = {"N": 2, "D": 3, "L": 4}


@pytest.mark.parametrize("text, carried", [
    ("{ S_b0[i, j, k] -> [0, i, -k, j, 0] }", "k' = 1 + k"),     # time runs backwards, layers inside
    ("{ S_b0[i, j, k] -> [0, i, j, -k, 0] }", "k' = 1 + k"),     # the time scan reversed
    ("{ S_b0[i, j, k] -> [0, i, -j, k, 0] }", "j' = 1 + j"),     # the layer scan reversed
    ("{ S_b0[i, j, k] -> [0, i, j, 0, 0] }", "k' = 1 + k"),      # all time steps at once
])
def test_illegal_user_schedule_names_a_violated_dependence(text, carried):
    specs = stacked_rnn.specs("small")
    with pytest.raises(ScheduleError) as info:
        ft.analyze(stacked_rnn.program, *specs, schedule=text, sizes=RNN_SIZES)
    msg = str(info.value)
    found = re.search(r"violates the dependence (.*?\}) \(scheduled", msg)
    assert found, msg
    violated = isl.Map(found.group(1))  # an ISL string
    assert not violated.is_empty() and carried in found.group(1)
    prog = ft.analyze(stacked_rnn.program, *specs, sizes=RNN_SIZES)
    assert violated.is_subset(maps(prog.deps.flow)[0].intersect_params(prog.model.context))
    # and it is really violated: the user's times of its source and sink are not increasing
    user = isl.Map(text).intersect_params(prog.model.context)
    for p in points(violated):
        t_src = points(user.intersect_domain(isl.Set(f"{{ S_b0[{', '.join(map(str, p[:3]))}] }}")).range())
        t_dst = points(user.intersect_domain(isl.Set(f"{{ S_b0[{', '.join(map(str, p[3:]))}] }}")).range())
        assert list(t_src)[0] >= list(t_dst)[0]


def test_legal_user_schedule_is_accepted():
    specs = stacked_rnn.specs("small")
    auto = ft.analyze(stacked_rnn.program, *specs, sizes=RNN_SIZES)
    user = ft.analyze(stacked_rnn.program, *specs, schedule=str(auto.schedule.map), sizes=RNN_SIZES)
    assert user.schedule.kind == "user"
    assert user.schedule.map.is_equal(auto.schedule.map)
    assert user.schedule.sequential_steps == auto.schedule.sequential_steps == 3 + 4 - 1
    # a wavefront written by hand, without the sequence dims
    hand = ft.analyze(stacked_rnn.program, *specs, schedule="{ S_b0[i, j, k] -> [j + k, j, i] }",
                      sizes=RNN_SIZES)
    assert hand.schedule.parallel == [False, True, True]
    assert hand.schedule.sequential_steps == 6
    inputs = stacked_rnn.inputs("small", N=2, D=3, L=4)
    assert assert_brute_force_legal(hand, inputs) > 0


@pytest.mark.parametrize("text", [
    "{ S_b0[i, j, k] -> [i, j, k] : i = 0 }",                       # instances with i = 1 get no time
    "{ S_b0[i, j, k] -> [i, j, k] : k < 2 }",
    "{ S_b0[i, j, k] -> [i, j, k, t] : 0 <= t <= 1 }",              # two times for one instance
])
def test_user_schedule_must_give_every_instance_one_time(text):
    with pytest.raises(ScheduleError):
        ft.analyze(stacked_rnn.program, *stacked_rnn.specs("small"), schedule=text, sizes=RNN_SIZES)


def test_unparsable_user_schedule_is_a_schedule_error():
    with pytest.raises(ScheduleError, match="schedule"):
        ft.analyze(stacked_rnn.program, *stacked_rnn.specs("small"), schedule="{ S_b0[i, j, k] -> [i, j, k + t] }",
                   sizes=RNN_SIZES)


# -- Table 4 through the scheduler ---------------------------------------------------------


def table4_nest(d: int, i: int, agg: str):
    """A nest of depth d: `agg` at depth i (0 = outermost), map at the others. The
    aggregate's step is one elementwise map over the inner dims and its init `z` an input
    (a list over the inner dims), so the aggregate and the maps inside it are one perfect
    nest, as in Table 4."""
    step = lift(lambda s, x: s * 0.5 + ft.tanh(x), d - i - 1)

    def prog(x, z):
        def level(k):
            if k == d:  # agg == "map": maps all the way down
                return ft.tanh
            if k == i and agg != "map":
                return lambda xs: getattr(xs, agg)(step, z)
            child = level(k + 1)
            return lambda xs: xs.map(child)
        return level(0)(x)
    return prog


def path_pi(prog, stmt) -> tuple:
    """π of every band on the statement's path, in the statement's dims (0 where none)."""
    out = []
    for b in prog.schedule.bands:
        if stmt.name in b.statements:
            out += list(b.pi) if b.pi is not None else [0] * len(b.dims)
    return tuple(out)


@pytest.mark.parametrize("d, i", [(d, i) for d in (1, 2, 3) for i in range(d)])
@pytest.mark.parametrize("agg", ["map", "reduce", "foldl", "scanl"])
def test_table4_unit_distance(d, i, agg):
    names = "ABC"[:d]
    inner = names[i + 1:]
    specs = (ft.spec(f"[{', '.join(names)}]float32[1, 2]"),
             ft.spec((f"[{', '.join(inner)}]" if inner else "") + "float32[1, 2]"))
    prog = ft.analyze(table4_nest(d, i, agg), *specs, sizes={n: 4 for n in names})
    if agg == "map":
        (band,) = prog.schedule.bands
        assert band.block.p == ["map"] * d and band.pi is None and band.distances == set()
        assert all(prog.schedule.parallel) and prog.schedule.sequential_steps == 1
        return
    unit = tuple(int(c == i) for c in range(d))
    (stmt,) = [s for s in prog.etdg.statements if any(x.op == agg for x in s.dims)]
    assert [x.op for x in stmt.dims] == ["map"] * i + [agg] + ["map"] * (d - i - 1)
    assert prog.deps.distances[stmt.name] == {unit}          # Table 4: d_i = 1, 0 elsewhere
    assert path_pi(prog, stmt) == unit                       # π = e_i
    (band,) = [b for b in prog.schedule.bands if b.pi is not None]
    assert band.block.p.count(agg) == 1 and set(band.block.p) <= {agg, "map"}
    assert band.pi == tuple(int(op == agg) for op in band.block.p)
    assert all(path_pi(prog, s) in (unit, (0,) * len(s.dims)) for s in prog.etdg.statements)
    if agg == "scanl":
        assert band.block.p == stmt.block.p == [x.op for x in stmt.dims]  # one perfect nest
    # the aggregate's 4 steps; a fold's result is copied out after it (one more step)
    assert prog.schedule.sequential_steps == (4 if agg == "scanl" else 5)


@pytest.mark.parametrize("s", [2, 3, 4])
def test_table4_stride_gives_distance_s(s):
    """`xs.strided_split(s).map(lambda sub: sub.scanl(...))`: distance 1 on the scan dim of
    the [s, L/s] nest, and distance s on the flat index t = r + s*j of the list: the flow
    dependence composed with the access relations of the list (ISL, no coarsening)."""
    L = 12

    def prog_fn(xs):
        return xs.strided_split(s).map(lambda sub: sub.scanl(lambda a, x: a * 0.5 + x, ft.zeros((1, 4))))

    prog = ft.analyze(prog_fn, ft.spec("[L]float32[1, 4]"), sizes={"L": L})
    (band,) = prog.schedule.bands
    assert band.block.p == ["map", "scanl"] and band.distances == {(0, 1)} and band.pi == (0, 1)
    (read,) = [m for _, am, m in prog.model.accesses if am.kind == "read" and am.buffer.resolve().name == "xs"]
    (dep,) = maps(prog.deps.flow)
    flat = read.reverse().apply_range(dep).apply_range(read)  # xs[t] -> xs[t'] of source -> sink
    assert points(flat.deltas()) == {(s,)}
    assert len(points(flat)) == L - s
    assert prog.schedule.sequential_steps == L // s


# -- hypothesis: random nests ------------------------------------------------------------------

C22 = np.array([[0.6, -0.4], [0.3, 0.8]], dtype=np.float32)
ELEMENT = {  # (no tensor argument w: the program is fn(xs))
    "tanh": lambda x, w: ft.tanh(x),
    "x*0.5+1": lambda x, w: x * 0.5 + 1.0,
    "x@C": lambda x, w: x @ C22,
}
COMBINE = {
    "s+x": lambda s, x, w: s + x,
    "s*0.5+x": lambda s, x, w: s * 0.5 + x,
    "tanh(s@C+x)": lambda s, x, w: ft.tanh(s @ C22 + x),
}
KIT = Kit(ELEMENT, COMBINE, tile=(1, 2), w_shape=(2, 2), w_scale=1.0,
          kinds=("id", "reverse", "shift", "slice", "window"), window_pads=(0, 1), slices="forward")


@st.composite
def chains(draw):
    """A chain of levels (each level's child is the next one), no split, no consumer nest;
    an init of zeros or none only at the bottom level."""
    depth = draw(st.integers(1, 3))
    lengths = [draw(st.integers(1, 4)) for _ in range(depth)]
    levels = []
    for k in range(depth):
        op = draw(st.sampled_from(["map", "scanl", "foldl", "reduce", "scanr", "foldr"]))
        t, _, _ = draw(transforms(lengths[k], KIT))
        bottom = k == depth - 1
        # without an init the state is the raw first element: only where the child keeps it
        init = draw(st.sampled_from(["first", "none", "zeros"] if bottom and t[0] != "window" else ["first"]))
        levels.append((op, t, init, draw(st.sampled_from(sorted(COMBINE)))))
    plan, out_depth = Elem(draw(st.sampled_from(sorted(ELEMENT)))), 0
    for k in reversed(range(depth)):
        op, t, init, comb = levels[k]
        plan = Level(t, op, init, 0, comb, plan, elem_depth=depth - k - 1, child_out=out_depth)
        out_depth += op in KEEPS_LEVEL
    return plan, lengths, draw(st.integers(0, 2 ** 16))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_random_nests_auto_is_legal_and_no_slower(case):
    plan, lengths, seed = case
    fn = make_body(plan, [None], KIT)
    xs, _ = nest_inputs(lengths, KIT, seed)
    auto = ft.analyze(fn, xs)  # concrete sizes: make_schedule checks legality with ISL
    original = ft.analyze(fn, xs, schedule="original")  # the traced nest as written
    assert auto.schedule.sequential_steps is not None
    for orig in (original.schedule, auto.original_schedule()):  # as traced; as coarsened
        assert auto.schedule.sequential_steps <= orig.sequential_steps, (
            f"{plan} {lengths}: auto {auto.schedule.sequential_steps} > original {orig.sequential_steps}\n"
            + auto.schedule.describe())
    assert_brute_force_legal(auto, (xs,))


# -- statement names ---------------------------------------------------------------------------


def test_root_statement_name_never_clashes_with_a_block(monkeypatch):
    """The root block keeps the name it was created with; in a fresh process that is b0,
    the name the first child block gets too: a reduce's result copy at the root was then
    a second statement S_b0, and the model kept only one of the two domains."""
    monkeypatch.setattr(BlockNode, "_ids", itertools.count())
    def fn(xs):
        return xs.reduce(lambda s, x: s * 0.5 + ft.tanh(x))
    etdg = ft.trace(fn, ft.spec("[A]float32[1, 2]"))
    names = [s.name for s in etdg.statements]
    assert len(names) == len(set(names)) == 2, names
    prog = ft.analyze(fn, ft.spec("[A]float32[1, 2]"), sizes={"A": 4})
    assert prog.schedule.sequential_steps == 3 + 1  # the reduce's 3 steps, the copy of its result
