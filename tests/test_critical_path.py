"""The critical path (`prog.schedule.critical_path`, deps/critical.py) and the steps as the C code
runs them (`prog.schedule.steps_as_run`, schedule/steps.py), checked by brute force.

* **critical path, brute force.** The ISL-independent interpreter (`interpret.run(record=)`)
  runs every instance in the original order and records the buffer elements it reads and
  writes; an instance depends on the (single) writer of each element it reads, so its chain
  length is 1 + the longest among those writers' (0 for none), and the critical path is the
  longest. A gather's read counts the whole gathered dim (what the model's may-access reads);
  with the elements actually read, the chain lies between the critical path over the exact
  flow dependences (`deps.flow`, which leaves gathers out) and the one over `deps.may_flow`.
  For every workload at the small preset (coarsened and as traced), a bidirectional RNN, a
  gather of a scan's results (may-read: one longer than the elements actually read), and
  random nests (tests/nests.py), traced on concrete inputs and on specs with `sizes=`.
* the stacked RNN's critical path is L + D - 1 (one cell per layer and step on the
  wavefront), the bidirectional RNN's L + 1 as traced; symbolic lengths give None; the cap
  on rounds raises a PolyftError.
* **steps as run, brute force.** From the C target's source (not from the AST schedule/steps.py
  walks): the OpenMP loop around each statement's calls; from the schedule's time vectors a
  trie (time dim by time dim): a statement's OpenMP dim takes the most of its iterations,
  every other dim the sum. Every workload, both schedules. The stacked RNN runs
  N (L + D - 1) instances in one thread under "auto" (the batch loop inside the parallel
  layer loop) and D·L under "original".
* the bounds: critical path <= sequential_steps and <= steps_as_run, for every program here.
* **the auto schedule reaches it**: its sequential steps <= the brute-force chain of the program
  as traced (no coarsening), for every workload (inputs and specs with sizes=), random nests
  and the bidirectional RNN (L + 1, its compiled code against a numpy loop); the dilated RNN
  at the paper's sizes: 253 steps for one wavefront, 139 (its critical path) with one
  hyperplane per layer; symbolic lengths keep the band schedule.
"""
from __future__ import annotations

import re
from collections import defaultdict

import islpy as isl
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import polyft as ft
from polyft import interpret
from polyft.deps.critical import critical_path
from polyft.emit.c_target import CTarget
from polyft.emit.isl_ast import build_ast as emit_build_ast
from polyft.errors import PolyftError
from polyft.etdg import Gather
from polyft.schedule.schedule import time_rows
from polyft.schedule.steps import build_ast
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS, stacked_rnn

from nests import Kit, analyze_nest, scheduled_nests


# -- the brute-force critical path -------------------------------------------------------------
def brute_critical_path(prog, inputs, may: bool = True) -> int:
    """The longest chain of instances of `prog.etdg`, each depending on the writers of what it
    reads (module docstring); `may`: a gather reads its whole dim."""
    params = interpret.bind_params(prog.etdg, inputs)
    chain = {}  # (buffer name, element) -> chain length of the instance that wrote it
    longest = [0]

    def record(stmt, env, reads, writes):
        reads, elements = iter(reads), []
        for op in stmt.ops:  # pair the recorded reads with the loads' pieces, as the interpreter ran them
            if op.op != "load":
                continue
            [piece] = [pc for pc in op.pieces if all(c.holds(env, params) for c in pc.conds)]
            if piece.buffer is None:
                continue
            name, idx = next(reads)
            if may and any(isinstance(ix, Gather) for ix in piece.index):
                buf = piece.buffer.resolve()
                ranges = [range(buf.dims[r].evaluate(params)) if isinstance(ix, Gather) else [idx[r]]
                          for r, ix in enumerate(piece.index)]
                elements += [(name, tuple(e)) for e in _product(ranges)]
            else:
                elements.append((name, idx))
        assert next(reads, None) is None
        depth = 1 + max((chain[e] for e in elements if e in chain), default=0)
        for e in writes:
            chain[e] = depth
        longest[0] = max(longest[0], depth)
    interpret.run(prog.etdg, *inputs, record=record)
    return longest[0]


def _product(ranges):
    out = [()]
    for r in ranges:
        out = [p + (x,) for p in out for x in r]
    return out


def check_critical_path(prog, inputs) -> int:
    """critical_path equals the brute force (may-reads for gathers) and bounds both step counts;
    the exact chain lies between the ISL critical paths over flow and may-flow."""
    got = prog.schedule.critical_path
    assert got == brute_critical_path(prog, inputs), prog.schedule.describe()
    exact = brute_critical_path(prog, inputs, may=False)
    assert critical_path(prog.model, prog.deps, dependences=prog.deps.flow) <= exact <= got
    assert got <= prog.schedule.sequential_steps
    assert got <= prog.schedule.steps_as_run
    return got


# -- workloads ---------------------------------------------------------------------------------
@pytest.mark.parametrize("coarsen", [None, False], ids=["coarsened", "traced"])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_critical_path_matches_brute_force(name, coarsen):
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", 0)
    prog = ft.analyze(mod.program, *inputs, coarsen=coarsen)
    check_critical_path(prog, inputs)


@pytest.mark.parametrize("N, D, L", [(1, 1, 1), (2, 1, 5), (2, 4, 1), (1, 3, 4), (2, 5, 3)])
def test_stacked_rnn_critical_path_is_the_wavefront(N, D, L):
    """One cell per layer and time step on the chain: L + D - 1, on concrete inputs and with sizes=."""
    inputs = stacked_rnn.inputs("small", 0, N=N, D=D, L=L)
    prog = ft.analyze(stacked_rnn.program, *inputs)
    assert check_critical_path(prog, inputs) == L + D - 1
    specs, sizes = stacked_rnn.specs("small"), {"N": N, "D": D, "L": L}
    auto = ft.analyze(stacked_rnn.program, *specs, sizes=sizes)
    original = ft.analyze(stacked_rnn.program, *specs, sizes=sizes, schedule="original")
    assert auto.schedule.critical_path == original.schedule.critical_path == L + D - 1
    # as the C code runs: the wavefront's layers at once, the batch one after the other in each
    # (one layer or one step: no wavefront, the batch loop is the outermost parallel one and runs at once)
    as_run = (N if min(D, L) > 1 else 1) * (L + D - 1)
    assert prog.schedule.steps_as_run == auto.schedule.steps_as_run == as_run
    assert original.schedule.steps_as_run == D * L  # the batch in parallel, each sentence in turn


H = 4


def birnn(xss, wf, wb):
    """A bidirectional RNN: a forward scanl and a backward scanr over each sequence, joined by a map
    over their zip."""
    def sentence(xs):
        fw = ft.scanl(lambda s, x: ft.tanh(x @ wf + s), xs, ft.zeros((1, H)))
        bw = ft.scanr(lambda x, s: ft.tanh(x @ wb + s), xs, ft.zeros((1, H)))
        return ft.map(lambda p: p[0] + p[1], ft.zip(fw, bw))
    return ft.map(sentence, xss)


def birnn_inputs(N, L, seed=0):
    rng = np.random.default_rng(seed)
    xss = ft.FractalTensor.from_numpy(rng.standard_normal((N, L, 1, H)).astype(np.float32), depth=2)
    wf, wb = ((rng.standard_normal((H, H)) * 0.5).astype(np.float32) for _ in range(2))
    return xss, wf, wb


@pytest.mark.parametrize("L", [1, 2, 6])
def test_bidirectional_rnn_critical_path(L):
    """As traced, the two scans are independent and the join waits for both: L + 1 instances;
    coarsened too (fusing the join into the forward scan would make it wait for the whole
    backward scan, 2L: the coarsening's CriticalPathGuard refuses that merge; at L = 1 all is
    fused into one statement, one instance long)."""
    inputs = birnn_inputs(2, L)
    traced = ft.analyze(birnn, *inputs, coarsen=False)
    assert check_critical_path(traced, inputs) == L + 1
    assert check_critical_path(ft.analyze(birnn, *inputs), inputs) == (L + 1 if L > 1 else 1)


def gathered(xs, w):
    ys = xs.scanl(lambda s, x: ft.tanh(s @ w + x), ft.zeros((1, 2)))
    return ys.gather(np.array([1, 0])).map(lambda y: y @ w)


@pytest.mark.parametrize("coarsen", [None, False], ids=["coarsened", "traced"])
def test_a_gather_of_a_result_counts_its_whole_dim(coarsen):
    """The map reads scan states 1 and 0 (chains of 2 and 1, the scan's own chain is 5), but a
    gather is a may-read of all 5 states: the critical path is 5 + 1, not 5."""
    rng = np.random.default_rng(0)
    inputs = (ft.FractalTensor.from_numpy(rng.standard_normal((5, 1, 2)).astype(np.float32), 1),
              rng.standard_normal((2, 2)).astype(np.float32))
    prog = ft.analyze(gathered, *inputs, coarsen=coarsen)
    assert check_critical_path(prog, inputs) == 6
    assert brute_critical_path(prog, inputs, may=False) == 5
    assert critical_path(prog.model, prog.deps, dependences=prog.deps.flow) == 5


def test_symbolic_lengths_have_no_critical_path():
    prog = ft.analyze(stacked_rnn.program, *stacked_rnn.specs("small"))
    assert prog.schedule.critical_path is None and prog.schedule.steps_as_run is None
    assert prog.schedule.sequential_steps is None


def test_rounds_are_capped():
    prog = ft.analyze(stacked_rnn.program, *stacked_rnn.inputs("small", 0))  # critical path 7
    assert critical_path(prog.model, prog.deps, max_rounds=7) == 7
    with pytest.raises(PolyftError, match="more than 6 instances"):
        critical_path(prog.model, prog.deps, max_rounds=6)


def test_a_cycle_is_refused():
    prog = ft.analyze(stacked_rnn.program, *stacked_rnn.inputs("small", 0, N=1, D=1, L=2))
    dom = prog.model.domains["S_b0"]
    cycle = isl.UnionMap.from_map(isl.Map.from_domain_and_range(dom, dom))  # every instance -> every instance
    with pytest.raises(PolyftError, match="cycle"):
        critical_path(prog.model, prog.deps, dependences=cycle)


# -- random nests ------------------------------------------------------------------------------
C22 = np.array([[0.6, -0.4], [0.3, 0.8]], dtype=np.float32)
ELEMENT = {  # element math on a [1, 2] tile (w: [2, 2])
    "tanh(x@w)": lambda x, w: ft.tanh(x @ w),
    "x*0.5+1": lambda x, w: x * 0.5 + 1.0,
    "x@C": lambda x, w: x @ C22,
}
COMBINE = {  # an aggregate's step on [1, 2] tiles
    "s+x": lambda s, x, w: s + x,
    "tanh(s@w+x)": lambda s, x, w: ft.tanh(s @ w + x),
}
KIT = Kit(ELEMENT, COMBINE, tile=(1, 2), w_shape=(2, 2), w_scale=0.7, window_pads=(0, 1),
          then=True, pair_state=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduled_nests(KIT))
def test_random_nests_critical_path_matches_brute_force(case):
    """Traced on the nest's concrete inputs, or (by the seed's parity) on specs with sizes=."""
    prog, (xs, w), _ = analyze_nest(case, KIT)
    check_critical_path(prog, (xs, w))


# -- steps as the C code runs them -------------------------------------------------------------
def omp_dims(source: str, statements) -> dict:
    """Statement name -> the time dim of the OpenMP loop around its calls in the C source (None:
    no OpenMP loop), read off the text: `#pragma omp for` / `parallel for` before `for (long cK`,
    blocks by braces."""
    body = source[source.index("int polyft_run"):]
    stack, pending_omp, pending_loop, found = [], False, None, defaultdict(set)
    for line in body.splitlines():
        s = line.strip()
        if re.match(r"#pragma omp (parallel )?for\b", s):
            pending_omp = True
        elif m := re.match(r"for \(long c(\d+)(_c\d+)? ", s):  # c2_c3: c2 and its tiles of c3
            pending_loop, pending_omp = (int(m.group(1)) if pending_omp else None), False
        elif s == "{":
            stack.append(pending_loop)
            pending_loop = None
        elif s == "}":
            stack.pop()
        elif m := re.match(r"(S_\w+?)(_t\d+)?\(", s):
            assert m.group(1) in statements, s
            omp = [k for k in stack if k is not None]
            assert len(omp) <= 1, f"nested OpenMP loops: {s}"
            found[m.group(1)].add(omp[0] if omp else None)
    assert all(len(v) == 1 for v in found.values()), found  # one OpenMP dim per statement
    return {name: v.pop() for name, v in found.items()}


def points(m: isl.Map) -> list:
    """The time vectors of a statement's map at the concrete sizes."""
    out = []
    r = m.range()
    r = r.project_out(isl.dim_type.param, 0, r.dim(isl.dim_type.param))
    n = r.dim(isl.dim_type.set)
    r.foreach_point(lambda p: out.append(tuple(p.get_coordinate_val(isl.dim_type.set, k).to_python()
                                               for k in range(n))))
    return out


def trie_steps(instances, omp: dict, k: int = 0) -> int:
    """instances: (statement, time vector). At dim k, the iterations (values of dim k) of a
    statement's OpenMP dim run at once (the most of them), any other dim's one after the other."""
    if not instances or k == len(instances[0][1]):
        return len(instances)
    groups = defaultdict(list)
    for inst in instances:
        groups[inst[1][k]].append(inst)
    at_once = {omp[name] == k for name, _ in instances}
    assert len(at_once) == 1, f"statements at dim {k} disagree on running it at once"
    costs = [trie_steps(g, omp, k + 1) for g in groups.values()]
    return max(costs) if at_once.pop() else sum(costs)


@pytest.mark.parametrize("schedule", ["auto", "original"])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_steps_as_run_match_the_generated_c(name, schedule):
    mod = WORKLOADS[name]
    prog = ft.analyze(mod.program, *mod.inputs("small", 0), schedule=schedule)
    s = prog.schedule
    # the AST walked is the one the targets generate
    assert build_ast(s.map, prog.model.context).to_C_str() == emit_build_ast(s.map, prog.model.context).to_C_str()
    source = CTarget().generate(prog.model, s, storage=prog.storage).source
    omp = omp_dims(source, set(prog.model.domains))
    assert set(omp) == set(prog.model.domains)
    instances = sorted((n, t) for n, m in s.per_statement.items()
                       for t in points(m.intersect_domain(prog.model.domains[n])))
    instances.sort(key=lambda x: x[1])
    assert s.steps_as_run == trie_steps(instances, omp)
    assert s.critical_path <= s.steps_as_run


# -- the auto schedule reaches the critical path of the program as traced ----------------------
def check_reaches(program, inputs, auto=None) -> int:
    """The auto schedule's sequential steps <= the brute-force chain of the program as traced
    (no coarsening); returns the steps."""
    traced = ft.analyze(program, *inputs, coarsen=False)
    auto = auto or ft.analyze(program, *inputs)
    chain = brute_critical_path(traced, inputs)
    assert auto.schedule.sequential_steps <= chain, auto.schedule.describe(auto.model.context)
    return auto.schedule.sequential_steps


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_workload_auto_schedule_reaches_the_critical_path(name):
    """From concrete inputs and from specs with sizes= (the same schedule either way)."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", 0)
    steps = check_reaches(mod.program, inputs)
    specs = mod.specs("small")
    sizes = interpret.bind_params(ft.trace(mod.program, *specs), inputs)
    assert ft.analyze(mod.program, *specs, sizes=sizes).schedule.sequential_steps == steps


@pytest.mark.parametrize("L", [1, 2, 6])
def test_bidirectional_rnn_auto_takes_L_plus_1_and_computes_the_same(L):
    """The forward and backward scans share time steps (per-statement hyperplanes: j and
    L - 1 - j), the join follows both; the compiled code equals a numpy loop written out. (At
    L = 1 coarsening fuses scans and join into one statement: one step.)"""
    xss, wf, wb = birnn_inputs(2, L)
    auto = ft.analyze(birnn, xss, wf, wb)
    steps = L + 1 if L > 1 else 1
    assert check_reaches(birnn, (xss, wf, wb), auto) == steps == auto.schedule.critical_path
    assert L == 1 or auto.schedule.hyperplanes
    got = ft.compile(birnn, xss, wf, wb)(xss, wf, wb).to_numpy()
    x = xss.to_numpy()
    fw, bw = np.zeros_like(x), np.zeros_like(x)
    s = np.zeros((2, 1, H), np.float32)
    for j in range(L):
        s = np.tanh(x[:, j] @ wf + s)
        fw[:, j] = s
    s = np.zeros((2, 1, H), np.float32)
    for j in reversed(range(L)):
        s = np.tanh(x[:, j] @ wb + s)
        bw[:, j] = s
    assert rel_error(got, fw + bw) < 1e-5


def test_dilated_rnn_layers_get_their_own_hyperplanes():
    """At the paper's sizes one wavefront for all layers takes 253 steps; one hyperplane per
    layer statement (its dilation in its slope) takes the critical path, 139. The schedule is
    a plain ISL map: given back as a user's schedule it is legal and as long."""
    mod = WORKLOADS["dilated_rnn"]
    specs = mod.specs("paper")
    sizes = {p: mod.PRESETS["paper"][p] for p in ft.trace(mod.program, *specs).params}
    prog = ft.analyze(mod.program, *specs, sizes=sizes)
    s = prog.schedule
    assert (s.band_steps, s.sequential_steps, s.critical_path) == (253, 139, 139)
    assert s.parallel[0] is False and all(s.parallel[1:])  # θ carries every dependence
    slopes = {tuple(row[0][0]) for row in (time_rows(m) for m in s.hyperplanes.values())}
    assert len(slopes) > 2, slopes
    again = ft.analyze(mod.program, *specs, sizes=sizes, schedule=s.map)
    assert again.schedule.sequential_steps == 139


def test_symbolic_lengths_keep_the_band_schedule():
    """Hyperplanes are fitted at concrete sizes: without them the bands' schedule stays."""
    mod = WORKLOADS["dilated_rnn"]
    s = ft.analyze(mod.program, *mod.specs("small")).schedule
    assert not s.hyperplanes and s.sequential_steps is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(scheduled_nests(KIT).filter(lambda case: case[3] == "auto"))
def test_random_nests_auto_schedule_reaches_the_critical_path(case):
    prog, (xs, w), program = analyze_nest(case, KIT)
    check_reaches(program, (xs, w), prog)
