"""An independent check of the dependence analysis: run the ETDG instance by instance
(`polyft.interpret.run` with `record=`), remember which instance wrote every buffer element,
and compare the (writer, reader) pairs with ISL's flow dependences point by point.

* must-flow (`deps.flow`) equals the brute-force pairs of the non-gather reads, exactly;
* may-flow (`deps.may_flow`) contains every brute-force pair (gathers are conservative);
* the distance vectors are exactly the brute-force self-dependence distances (without gathers);
* anti and output dependences are empty (buffers are single assignment and the interpreter
  checked that no element is read before it is written, nor written twice);
* `interpret.run(trace)` equals eager execution `fn(*inputs)`.

Each program is checked twice: traced on concrete inputs (no ISL parameters) and traced on
symbolic specs with the lengths fixed by `sizes=` (parametric maps, finite under the context).
"""
from __future__ import annotations

from dataclasses import dataclass

import islpy as isl
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import polyft as ft
from polyft.deps.analyze import analyze
from polyft.deps.model import build
from polyft import interpret
from polyft.errors import AccessError
from polyft.etdg import Gather
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS

from nests import Kit, bodies, list_lengths, nest_inputs, nest_program, nest_specs

TOL = 1e-5

# -- the checker ---------------------------------------------------------------------------


def isl_pairs(umap: isl.UnionMap) -> set:
    """The points of a finite dependence relation: {((stmt, vec), (stmt, vec))}.

    The parameters must be fixed by the context (concrete sizes); they are projected out."""
    out = set()

    def per_map(m):
        src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
        n_in = m.dim(isl.dim_type.in_)
        w = m.wrap()
        n_par = w.dim(isl.dim_type.param)
        if n_par:
            w = w.project_out(isl.dim_type.param, 0, n_par)
        assert w.is_bounded(), f"dependence relation not finite: {m}"
        n = w.dim(isl.dim_type.set)

        def point(p):
            c = [int(p.get_coordinate_val(isl.dim_type.set, k).to_python()) for k in range(n)]
            out.add(((src, tuple(c[:n_in])), (dst, tuple(c[n_in:]))))
        w.foreach_point(point)
    umap.foreach_map(per_map)
    return out


@dataclass
class Brute:
    result: object  # interpret.run's outputs
    pairs: set  # all (writer, reader) instance pairs
    direct: set  # the pairs through non-gather reads
    n_instances: int


def brute_force(etdg, inputs) -> Brute:
    """Run the ETDG instance by instance; for each element an instance reads, the instance
    that last wrote it (buffers are single assignment: the only one) is its flow source."""
    params = interpret.bind_params(etdg, inputs)
    last, pairs, direct = {}, set(), set()
    count = 0

    def record(stmt, env, reads, writes):
        nonlocal count
        count += 1
        me = (stmt.name, tuple(env[d] for d in stmt.dims))
        # which recorded reads go through a gather: the interpreter records the live piece of
        # every load that reads a buffer, in program order
        gather = []
        for op in stmt.ops:
            if op.op == "load":
                live = [pc for pc in op.pieces if all(c.holds(env, params) for c in pc.conds)]
                assert len(live) == 1
                if live[0].buffer is not None:
                    gather.append(any(isinstance(ix, Gather) for ix in live[0].index))
        assert len(gather) == len(reads)
        for (buf, idx), g in zip(reads, gather):
            src = last.get((buf, idx))
            if src is not None:
                pairs.add((src, me))
                if not g:
                    direct.add((src, me))
        for buf, idx in writes:
            assert (buf, idx) not in last, f"{buf}{list(idx)} written twice"
            last[(buf, idx)] = me

    result = interpret.run(etdg, *inputs, record=record)
    return Brute(result, pairs, direct, count)


def self_distances(pairs) -> dict:
    out = {}
    for (s1, a), (s2, b) in pairs:
        if s1 == s2:
            out.setdefault(s1, set()).add(tuple(y - x for x, y in zip(a, b)))
    return out


def check_program(fn, inputs, specs=None, expect=None):
    """Everything the module docstring lists, for one program; returns the brute-force pairs."""
    if expect is None:
        expect = fn(*inputs)
    runs = [(ft.trace(fn, *inputs), None)]
    if specs is not None:
        etdg = ft.trace(fn, *specs)
        runs.append((etdg, interpret.bind_params(etdg, inputs)))
    found = None
    for etdg, sizes in runs:
        model = build(etdg, sizes)
        deps = analyze(model)
        bf = brute_force(etdg, inputs)
        assert rel_error(bf.result, expect) < TOL
        must, may = isl_pairs(deps.flow), isl_pairs(deps.may_flow)
        assert must == bf.direct, (f"must-flow differs from brute force ({'symbolic' if sizes else 'concrete'})\n"
                                   f"only ISL: {sorted(must - bf.direct)[:5]}\n"
                                   f"only brute force: {sorted(bf.direct - must)[:5]}")
        assert bf.pairs <= may, f"may-flow misses {sorted(bf.pairs - may)[:5]}"
        assert deps.anti.is_empty() and deps.output.is_empty()
        want = self_distances(bf.pairs)
        for name in model.statements:
            got = deps.distances[name]
            assert isinstance(got, set), f"{name}: distances not finite at concrete sizes: {got}"
            if model.may_reads.is_empty():
                assert got == want.get(name, set()), name
            else:
                assert got >= want.get(name, set()), name
        found = found or bf  # (the two traces may differ: concrete lengths decide some pieces)
    return found


# -- the paper's workloads ------------------------------------------------------------------

SHRINK = {  # small presets, shrunk where it keeps the check quick
    "dilated_rnn": {"H": 4},
    "flash_attention": {"Lk": 8},
    "bigbird": {"nb": 7},
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_flow_matches_brute_force(name):
    mod = WORKLOADS[name]
    over = SHRINK.get(name, {})
    inputs = mod.inputs("small", seed=3, **over)
    bf = check_program(mod.program, inputs, mod.specs("small", **over))
    assert bf.pairs, "a workload without any flow dependence: the check would be vacuous"


def test_checker_is_not_vacuous():
    """Dropping one ISL pair, or adding one, is noticed."""
    mod = WORKLOADS["stacked_rnn"]
    inputs = mod.inputs("small", seed=1)
    prog = ft.analyze(mod.program, *inputs, schedule="original")
    bf = brute_force(prog.etdg, inputs)
    must = isl_pairs(prog.deps.flow)
    assert must == bf.direct and len(must) == 2 * 3 * 4 + 2 * 2 * 5  # along k, and along j
    one = isl.Map("{ S_b0[0, 0, 0] -> S_b0[0, 0, 1] }")
    assert isl_pairs(prog.deps.flow.subtract(isl.UnionMap.from_map(one))) != bf.direct
    extra = isl.Map("{ S_b0[0, 0, 0] -> S_b0[1, 2, 4] }")
    assert isl_pairs(prog.deps.flow.union(isl.UnionMap.from_map(extra))) != bf.direct


def test_gather_is_a_may_access():
    """Gathered reads: ISL's may-flow holds the real pairs (and more); must-flow has none."""
    def prog(xs, w):
        ys = xs.map(lambda x: ft.tanh(x @ w))
        zs = ys.gather(np.array([3, 0, 3, 1]))
        return zs.scanl(lambda s, z: s * 0.5 + z)

    rng = np.random.default_rng(7)
    xs = ft.FractalTensor.from_numpy(rng.standard_normal((5, 1, 2)).astype(np.float32), 1)
    w = rng.standard_normal((2, 2)).astype(np.float32)
    bf = check_program(prog, (xs, w), (ft.spec("[L]float32[1, 2]"), ft.spec("float32[2, 2]")))
    assert bf.pairs - bf.direct  # the gathered reads have real sources
    p = ft.analyze(prog, xs, w, schedule="original")  # the ETDG as traced, not coarsened
    may, must = isl_pairs(p.deps.may_flow), isl_pairs(p.deps.flow)
    # S_b0 computes ys; S_b1 is the scan (3 steps: its first output is zs[0]), S_b2 copies
    # zs[0] and the scan's outputs into the result. Conservatively every element of ys may
    # feed every gathering instance: the 3 scan steps and the copy of zs[0].
    gathered = {(a, b) for a, b in may if a[0] == "S_b0"}
    assert gathered == {(("S_b0", (i,)), ("S_b1", (k,))) for i in range(5) for k in range(3)} | \
        {(("S_b0", (i,)), ("S_b2", (0,))) for i in range(5)}
    assert not {(a, b) for a, b in must if a[0] == "S_b0"}


# -- hypothesis: random nests of compute and access operators (tests/nests.py) -------------

C22 = np.array([[0.6, -0.4], [0.3, 0.8]], dtype=np.float32)
ELEMENT = {  # element math on a [1, 2] tensor (w: a [2, 2] input)
    "tanh(x@w)": lambda x, w: ft.tanh(x @ w),
    "x*0.5+1": lambda x, w: x * 0.5 + 1.0,
    "x@C": lambda x, w: x @ C22,
    "tanh(x)+x": lambda x, w: ft.tanh(x) + x,
}
COMBINE = {  # an aggregate's step on [1, 2] tensors, lifted elementwise to lists
    "s+x": lambda s, x, w: s + x,
    "s*0.5+x": lambda s, x, w: s * 0.5 + x,
    "tanh(s@w+x)": lambda s, x, w: ft.tanh(s @ w + x),
    "s*x": lambda s, x, w: s * ft.tanh(x),
}
KIT = Kit(ELEMENT, COMBINE, tile=(1, 2), w_shape=(2, 2), w_scale=0.7,
          window_pads=(0, 1), then=True)


@st.composite
def programs(draw):
    lengths = draw(list_lengths())
    plan, _ = draw(bodies(lengths, KIT))
    seed = draw(st.integers(0, 2 ** 16))
    return plan, [n for n, _ in lengths], seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_nests_match_brute_force(case):
    plan, lengths, seed = case
    xs, w = nest_inputs(lengths, KIT, seed)
    program = nest_program(plan, KIT)
    specs = nest_specs(len(lengths), KIT)
    expect = program(xs, w)
    try:
        check_program(program, (xs, w), specs, expect)
    except AccessError as e:  # gather of a shifted/strided/padded view: a documented limitation
        assume("gather of a" not in str(e))
        raise
