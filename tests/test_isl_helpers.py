"""The ISL helpers (deps.isl_helpers), each checked against brute-force enumeration at small
sizes: point sets, the hyperplane test `carries`, reuse read off `coupling_rows`, and the
access and time maps the model is built from (against evaluating the ETDG instance by
instance)."""
from __future__ import annotations

import itertools

import islpy as isl
import pytest

import polyft as ft
from polyft import interpret
from polyft.deps.isl_helpers import (Namer, access_map, carries, coupling_rows, maps, param_names, param_prefix,
                                     point_set, schedule_map, union, union_map)
from polyft.deps.linalg import reuse_dims
from polyft.workloads import stacked_rnn


def points(s, params: dict | None = None) -> set:
    """Points of a Set (a Map: its wrapped (in + out) tuples) with the parameters fixed."""
    s = s.wrap() if isinstance(s, isl.Map) else s
    for name, value in (params or {}).items():
        pos = s.find_dim_by_name(isl.dim_type.param, name)
        if pos >= 0:
            s = s.fix_val(isl.dim_type.param, pos, value)
    s = s.project_out(isl.dim_type.param, 0, s.dim(isl.dim_type.param))
    out = set()
    n = s.dim(isl.dim_type.set)
    s.foreach_point(lambda p: out.add(tuple(p.get_coordinate_val(isl.dim_type.set, k).to_python()
                                            for k in range(n))))
    return out


def test_maps_and_unions():
    um = isl.UnionMap("[N] -> { A[i] -> B[i] : 0 <= i < N; A[i] -> C[i + 1] : 0 <= i < N }")
    ms = maps(um)
    assert sorted(m.get_tuple_name(isl.dim_type.out) for m in ms) == ["B", "C"]
    space = isl.Space.params_alloc(um.get_ctx(), 0)
    assert union_map(ms, space).is_equal(um)
    assert union_map([], space).is_empty()
    sets = [isl.Set("{ [i] : 0 <= i < 2 }"), isl.Set("{ [i] : 5 <= i < 7 }")]
    assert points(union(sets)) == {(0,), (1,), (5,), (6,)}
    assert union([]) is None
    assert param_prefix(["N", "L"]) == "[N, L] -> " and param_prefix([]) == ""
    assert param_names(isl.Set("[N, L] -> { [i] : i < N + L }").get_space()) == ["N", "L"]


@pytest.mark.parametrize("text, bounded", [
    ("[N] -> { [i, j] : 0 <= i <= 1 and j = 1 and N >= 2 }", True),       # the same points for every N
    ("[N] -> { [i, j] : i = 0 and -3 <= j <= 3 and j != 0 and N > 0 }", True),
    ("[N] -> { [i] : 0 < i < N }", False),                                # grows with N
])
def test_point_set_is_every_parameter_value_s_points(text, bounded):
    s = isl.Set(text)
    got = point_set(s)
    every = set().union(*(points(s, {"N": n}) for n in range(0, 12)))
    if bounded:
        assert got == every
    else:
        assert got is None and len(every) > 9


@pytest.mark.parametrize("text", [
    "{ [i, j] : i = 0 and j = 1; [i, j] : i = 1 and -2 <= j <= 2 }",
    "{ [i, j, k] : i = 0 and 0 <= j <= 1 and k = 1 - j }",
    "[N] -> { [i, j] : i = 1 and -N < j < N and N = 3 }",
])
def test_carries_is_every_dot_positive(text):
    dist = isl.Set(text)
    vecs = points(dist)
    n = dist.dim(isl.dim_type.set)
    for pi in itertools.product(range(4), repeat=n):
        assert carries(dist, pi) == all(sum(p * d for p, d in zip(pi, v)) >= 1 for v in vecs), pi


@pytest.mark.parametrize("text, expect", [
    ("{ S[i, j, k] -> A[i, f] : 0 <= i, j, k < 3 and 0 <= f < 2 }", (1, 2)),   # a free contraction coord
    ("{ S[i, j] -> A[i + j] : 0 <= i, j < 3 }", ()),                           # a window: both move
    ("{ S[i, j] -> A[g] : 0 <= i, j < 3 and j <= g < j + 2 }", (0,)),          # tied by inequalities only
    ("{ S[i, j] -> A[floor(j / 2)] : 0 <= i, j < 4 }", (0,)),                  # through a div
    ("{ S[i, j] -> A[0] : 0 <= i, j < 3 }", (0, 1)),                           # one element for all
])
def test_reuse_from_coupling_rows_is_brute_force_reuse(text, expect):
    """A dim k carries reuse when moving along it never changes the elements an instance
    touches: what `linalg.reuse_dims` reads off the coupling rows."""
    m = isl.Map(text)
    got = reuse_dims([coupling_rows(m)])
    n = m.dim(isl.dim_type.in_)
    image = {}
    for p in points(m):
        image.setdefault(p[:n], set()).add(p[n:])
    brute = tuple(k for k in range(n)
                  if all(image[t] == image[u] for t in image for u in image
                         if all(a == b for c, (a, b) in enumerate(zip(t, u)) if c != k)))
    assert got == brute == expect


def scanr_of_shift(xss):
    return xss.map(lambda xs: xs.shift(1).scanr(lambda s, x: s * 0.5 + x, ft.zeros((1, 2))))


@pytest.mark.parametrize("fn, specs, sizes", [
    (scanr_of_shift, [ft.spec("[N, L]float32[1, 2]")], {"N": 2, "L": 5}),   # a reversed dim, a piecewise load
    (stacked_rnn.program, stacked_rnn.specs("small"), {"N": 2, "D": 3, "L": 4}),
])
def test_access_and_schedule_maps_are_the_etdg_evaluated(fn, specs, sizes):
    """Every access map holds exactly the (instance, element) pairs of evaluating the
    access's index at each instance where its conditions hold, and the time maps the 2d+1
    time vectors the interpreter runs the instances in (with a skew T per block: those
    vectors with T applied to each block's dims)."""
    etdg = ft.trace(fn, *specs)
    prefix, namer = param_prefix(etdg.params), Namer(etdg.params)
    width = max(len(st.position) for st in etdg.statements)
    run = interpret.instances(etdg, sizes)
    blocks = [b for b in etdg.blocks() if b.dims]
    skew = {b.name: [[int(c >= r) for c in range(len(b.dims))] for r in range(len(b.dims))] for b in blocks}
    widths = {b.dims[0]: len(b.dims) for b in blocks}
    for st in etdg.statements:
        mine = [(env, time) for s, env, time in run if s is st]
        assert points(schedule_map(prefix, st, namer, width), sizes) == \
            {tuple(env[d] for d in st.dims) + tuple(time) for env, time in mine}
        assert points(schedule_map(prefix, st, namer, width, skew), sizes) == \
            {tuple(env[d] for d in st.dims) + skewed(st, time, widths) for env, time in mine}
        for am in st.reads + st.writes:
            want = {tuple(env[d] for d in st.dims) + tuple(ix.evaluate(env, sizes) for ix in am.index)
                    for env, _ in mine if all(c.holds(env, sizes) for c in am.conds)}
            assert points(access_map(prefix, st, am, namer), sizes) == want, am.describe()


def skewed(st, time, widths: dict) -> tuple:
    """`time` with every block's dims v replaced by (v0 + v1 + ..., v1 + ..., ...);
    `widths`: a block's first dim -> its number of dims."""
    out = list(time)
    for k, item in enumerate(st.position):
        if not isinstance(item, int) and item in widths:
            n = widths[item]
            out[k:k + n] = [sum(time[k + r:k + n]) for r in range(n)]
    return tuple(out)


def test_namer_renames_dims_that_clash_with_a_parameter():
    class Dim:
        name = "N"
    assert Namer(["N", "N_"])(Dim()) == "N__" and Namer(["L"])(Dim()) == "N"
