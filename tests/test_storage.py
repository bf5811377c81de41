"""Storage that follows the live set (schedule/storage.py, `ft.compile(contract=)`, `prog.storage`,
`prog.memory()`).

* **brute force.** Every statement instance of a program is run by the ISL-independent
  interpreter (`polyft.interpret.run(record=)`), which records the buffer elements each
  instance reads and writes; each instance's time vector is read off the schedule. Then, in
  plain Python and using only the moduli of the storage mapping (the cell of element e keeps
  e[r] where the modulus is None, e[r] % m where it is m > 1, and drops dims of modulus 1):
  (a) no two distinct elements sharing a cell have overlapping live ranges under the
  happens-before order (t before t' iff at the first dim where they differ the dim is
  sequential and t is smaller); (b) a simulation in time order (within an instance, its
  operations in order: loads, then the store, and a fused statement may load what it
  stored) never reads a cell holding another element's value, and no two concurrent
  instances (neither before the other) touch one cell where one of them writes; (c) the ISL
  mapping element -> cell agrees with the moduli on every element. For every workload at
  the small preset under both schedules, and for random nests (tests/nests.py), traced on
  concrete inputs and on specs with `sizes=`. Mappings spoiled on purpose are caught by
  (a), (b) (a stale read, a race) and (c).
* **what gets contracted**: a foldl's state buffer to 2 cells (symbolic and concrete L),
  flash attention's online-softmax states to 2 along the key tiles, the stacked LSTM's gates
  along time under the "auto" schedule; a reduce over one element (a buffer no instance
  touches) still gets a mapping.
* **compiled programs** (targets "c" and "cuda-emulated", both schedules, contract True and
  False) equal eager execution; the arrays allocated are what `memory()` reports, and
  contraction allocates no more (strictly less for flash attention and the stacked LSTM).
* **bad input** to `contract=` and `memory(sizes=)`.
* **peak memory**: a 20 000-step foldl over a 64x64 state, compiled to C, keeps 2 states
  (32 KB) with contraction and grows by far less than the 328 MB of the state history, and
  by more than that history without contraction (ru_maxrss in a fresh process).

Compiled objects go to a temporary cache directory (POLYFT_CACHE), one per module.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict

import islpy as isl
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import polyft as ft
from polyft import interpret
from polyft.errors import PolyftError
from polyft.schedule.storage import BATCH, BATCHES, Batch
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS

from helpers import TOL
from nests import Kit, analyze_nest, scheduled_nests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEDULES = ("auto", "original")

pytestmark = pytest.mark.usefixtures("compile_cache")  # conftest.py: a temporary POLYFT_CACHE


# -- the brute-force checker -----------------------------------------------------------------
def before(t, u, parallel) -> bool:
    """t happens strictly before u: at the first dim where they differ, that dim is
    sequential and t is smaller (time vectors first differing in a parallel dim run at once)."""
    for k, (a, b) in enumerate(zip(t, u)):
        if a != b:
            return not parallel[k] and a < b
    return False


def concurrent(t, u, parallel) -> bool:
    return not before(t, u, parallel) and not before(u, t, parallel)


def cell_of(e, moduli) -> tuple:
    """The cell of element e from the moduli alone."""
    return tuple(x if m is None else x % m for x, m in zip(e, moduli) if m != 1)


def isl_points(m: isl.Map) -> list:
    """The (input, output) integer points of a map that the context makes finite."""
    out = []
    n_in = m.dim(isl.dim_type.in_)
    w = m.wrap()
    if w.dim(isl.dim_type.param):
        w = w.project_out(isl.dim_type.param, 0, w.dim(isl.dim_type.param))
    assert w.is_bounded(), f"not finite: {m}"
    n = w.dim(isl.dim_type.set)

    def point(p):
        c = [int(p.get_coordinate_val(isl.dim_type.set, k).to_python()) for k in range(n)]
        out.append((tuple(c[:n_in]), tuple(c[n_in:])))
    w.foreach_point(point)
    return out


@dataclasses.dataclass
class Instance:
    key: tuple  # (statement name, iteration vector)
    time: tuple
    accesses: list  # (writes?, buffer name, element), in the order of the statement's operations

    @property
    def reads(self):
        return [(b, e) for w, b, e in self.accesses if not w]

    @property
    def writes(self):
        return [(b, e) for w, b, e in self.accesses if w]


def run_instances(prog, inputs) -> list:
    """Every statement instance of `prog.etdg` with its accesses (the interpreter, which
    knows nothing of ISL) and its time vector under `prog.schedule`."""
    times = {}
    for name, m in prog.schedule.per_statement.items():
        for point, t in isl_points(m.intersect_params(prog.model.context)):
            assert (name, point) not in times, f"{name}{list(point)} has two time vectors"
            times[(name, point)] = t
    params = interpret.bind_params(prog.etdg, inputs)
    out = []

    def record(stmt, env, reads, writes):
        # the interpreter runs a statement's operations in order and records the reads of its
        # loads that hit a buffer, and its stores: interleave them again (a statement fused by
        # coarsening may store an element and load it back)
        key = (stmt.name, tuple(env[d] for d in stmt.dims))
        reads, writes, accesses = iter(reads), iter(writes), []
        for op in stmt.ops:
            if op.op == "load":
                [piece] = [pc for pc in op.pieces if all(c.holds(env, params) for c in pc.conds)]
                if piece.buffer is not None:
                    accesses.append((False, *next(reads)))
            elif op.op == "store":
                accesses.append((True, *next(writes)))
        assert next(reads, None) is None and next(writes, None) is None
        out.append(Instance(key, times[key], accesses))
    interpret.run(prog.etdg, *inputs, record=record)
    assert len(out) == len(times), "the schedule and the interpreter disagree on the instances"
    return out


@dataclasses.dataclass
class Lives:
    """Per element of one buffer: the time of its write and the times of all its accesses."""

    write: dict  # element -> (time, instance key)
    access: dict  # element -> list of (time, instance key)


def lives(instances, name) -> Lives:
    write, access = {}, defaultdict(list)
    for inst in instances:
        for w, buf, e in inst.accesses:
            if buf == name:
                if w:
                    assert e not in write, f"{name}{list(e)} written twice"
                    write[e] = (inst.time, inst.key)
                access[e].append((inst.time, inst.key))
    assert set(access) == set(write), f"{name}: elements read but never written"
    return Lives(write, dict(access))


def overlap_violations(lv: Lives, moduli, parallel, together=None, order=None) -> list:
    """(a) Pairs of distinct elements in one cell whose live ranges overlap: e1's live range
    ends before e2's begins when every access of e1 happens before e2's write (`order(t, u)`,
    `before` by default). `together(e1, e2)` limits the pairs to those stored in one place
    (a thread's scratch)."""
    cells = defaultdict(list)
    for e in lv.write:
        cells[cell_of(e, moduli)].append(e)
    order = order or (lambda t, u: before(t, u, parallel))

    def done_before(e1, e2):
        w2 = lv.write[e2][0]
        return all(order(t, w2) for t, _ in lv.access[e1])
    bad = []
    for c, es in cells.items():
        for i, e1 in enumerate(es):
            for e2 in es[i + 1:]:
                if (together is None or together(e1, e2)) and not done_before(e1, e2) and not done_before(e2, e1):
                    bad.append((c, e1, lv.access[e1], e2, lv.access[e2]))
    return bad


def local_violations(lv: Lives, s, parallel, local=None) -> list:
    """(d) A buffer placed "local" to the iterations of time dim k = s.slot_dim: every
    element's accesses share the time prefix up to k (one iteration), and per batch width w
    (a thread runs w consecutive iterations of dim k at once, the batch before the next),
    elements whose iterations may share a batch (equal before k, less than w apart at k)
    never share a scratch cell while both are live; for an in-order Batch, live ranges as
    one thread runs them (`thread_before`). `local` overrides s.local's moduli."""
    k = s.slot_dim
    bad = [("premise", e, acc) for e, acc in lv.access.items() if len({t[:k + 1] for t, _ in acc}) != 1]
    for batch, moduli in (local or {b: m for b, (m, _) in s.local.items()}).items():
        def together(e1, e2, width=batch.width):
            t1, t2 = lv.write[e1][0], lv.write[e2][0]
            return t1[:k] == t2[:k] and abs(t1[k] - t2[k]) < width
        order = (lambda t, u: thread_before(t, u, k, parallel)) if batch.in_order else None
        bad += [("overlap", batch, *v) for v in overlap_violations(lv, moduli, parallel, together, order)]
    return bad


def simulation_violations(instances, stored: dict, parallel) -> list:
    """(b) Run the instances in time order (within one, its operations in order: loads of
    operands before the store of the result) on memory that has one slot per cell (`stored`:
    buffer name -> moduli): every read must find the element it asks for. Then any two
    concurrent instances accessing one cell, one of them writing, are a race."""
    bad = []
    memory = {}
    for inst in sorted(instances, key=lambda i: i.time):
        for w, buf, e in inst.accesses:
            if buf not in stored:
                continue
            c = (buf, cell_of(e, stored[buf]))
            if w:
                memory[c] = e
            elif memory.get(c) != e:
                bad.append(("read", buf, e, inst.key, inst.time, memory.get(c)))
    touches = defaultdict(list)  # (buffer, cell) -> (time, instance, element, writes)
    for inst in instances:
        for w, buf, e in inst.accesses:
            if buf in stored:
                touches[(buf, cell_of(e, stored[buf]))].append((inst.time, inst.key, e, w))
    for (buf, c), ts in touches.items():
        for i, (t1, k1, e1, w1) in enumerate(ts):
            for t2, k2, e2, w2 in ts[i + 1:]:
                if k1 != k2 and (w1 or w2) and concurrent(t1, t2, parallel):
                    bad.append(("race", buf, c, (k1, t1, e1, w1), (k2, t2, e2, w2)))
    return bad


def batch_before(t, u, k, parallel) -> bool:
    """t before u inside one batch of iterations of the parallel dim k, which a thread runs
    statement by statement for all its iterations at once: dim k is ignored, then the rule
    of `before`."""
    return before(t[:k] + t[k + 1:], u[:k] + u[k + 1:], parallel[:k] + parallel[k + 1:])


def thread_before(t, u, k, parallel) -> bool:
    """t before u as one C thread runs a batch of iterations of the parallel dim k: dim k is
    ignored; at the first dim where they differ, a sequential one orders them, and so does a
    parallel one (the thread runs its loop in order) where t is at least BATCH smaller (a tile
    of at most BATCH iterations runs at once)."""
    for j, (a, b) in enumerate(zip(t, u)):
        if j != k and a != b:
            if j < k:  # another batch: not the thread's to order
                return False
            return b - a >= BATCH if parallel[j] else a < b
    return False


def sharing_violations(instances, storage, groups, batch, parallel) -> list:
    """(e) Local buffers in one scratch region (`groups`, for a Batch): no element of one may
    be live while an element of another is, when both may be in one batch (equal time prefix
    before the slot dim k, less than the batch's width apart at k). e1's live range ends
    before e2's begins when every access of e1 is batch-before (or, in order, thread-before)
    e2's write."""
    width = batch.width
    bad = []
    for group in groups:
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                k = storage.buffers[a].slot_dim
                first = (lambda t, u, k=k: thread_before(t, u, k, parallel)) if batch.in_order else \
                    (lambda t, u, k=k: batch_before(t, u, k, parallel))
                la, lb = lives(instances, a), lives(instances, b)
                for ea, (wa, _) in la.write.items():
                    for eb, (wb, _) in lb.write.items():
                        if wa[:k] != wb[:k] or abs(wa[k] - wb[k]) >= width:
                            continue
                        if not all(first(t, wb) for t, _ in la.access[ea]) and \
                                not all(first(t, wa) for t, _ in lb.access[eb]):
                            bad.append((a, ea, la.access[ea], b, eb, lb.access[eb]))
    return bad


def mapping_disagreements(s, elements, context) -> list:
    """(c) Elements whose image under the ISL mapping is not exactly their cell by the moduli."""
    m = s.mapping.intersect_params(context)
    if m.dim(isl.dim_type.param):
        m = m.project_out(isl.dim_type.param, 0, m.dim(isl.dim_type.param))
    assert m.dim(isl.dim_type.out) == sum(1 for x in s.moduli if x != 1)
    images = defaultdict(set)
    for e, c in isl_points(m.intersect_domain(box(s.buffer.name, elements))):
        images[e].add(c)
    return [(e, sorted(images.get(e, ())), cell_of(e, s.moduli))
            for e in elements if images.get(e) != {cell_of(e, s.moduli)}]


def box(name, elements) -> isl.Set:
    """The bounding box of the elements, as a parameter-free ISL set."""
    n = len(next(iter(elements)))
    hi = [max(e[r] for e in elements) for r in range(n)]
    es = [f"e{r}" for r in range(n)]
    cond = " and ".join(f"0 <= {x} <= {h}" for x, h in zip(es, hi))
    return isl.Set(f"{{ {name}[{', '.join(es)}] : {cond} }}")


def check_storage(prog, inputs, moduli=None) -> dict:
    """Checks (a), (b) and (c) on every contracted buffer of `prog`; `moduli` overrides the
    mapping's moduli of some buffers (to show that a bad mapping is caught). Returns the
    moduli checked, per buffer."""
    instances = run_instances(prog, inputs)
    parallel = prog.schedule.parallel
    stored = {}
    problems = []
    for name, s in prog.storage.buffers.items():
        if s.mapping is None:
            assert s.buffer.kind != "intermediate" or s.buffer.depth == 0, name
            assert s.moduli == (None,) * s.buffer.depth
            continue
        assert s.buffer.kind == "intermediate", name
        mod = (moduli or {}).get(name, s.moduli)
        assert len(mod) == s.buffer.depth and all(m is None or (isinstance(m, int) and m >= 1) for m in mod)
        lv = lives(instances, name)
        if not lv.write:
            continue
        stored[name] = mod
        bad = overlap_violations(lv, mod, parallel)
        problems += [f"(a) {name}: cell {c}: {e1} accessed at {a1} and {e2} accessed at {a2} are live at once"
                     for c, e1, a1, e2, a2 in bad[:3]]
        if moduli is None:
            bad = mapping_disagreements(s, list(lv.write), prog.model.context)
            problems += [f"(c) {name}{list(e)}: ISL maps it to {got}, the moduli {s.moduli} to {want}"
                         for e, got, want in bad[:3]]
        if s.placement == "local":
            assert set(s.local) == set(BATCHES) and s.slot_dim is not None and parallel[s.slot_dim], name
            problems += [f"(d) {name}: {v}" for v in local_violations(lv, s, parallel)[:3]]
            for width, (mod_w, _) in s.local.items():
                bad = mapping_disagreements(dataclasses.replace(s, moduli=mod_w, mapping=s.local[width][1]),
                                            list(lv.write), prog.model.context)
                problems += [f"(c) {name}{list(e)} local {width}: ISL maps it to {got}, the moduli to {want}"
                             for e, got, want in bad[:3]]
    problems += [f"(b) {v}" for v in simulation_violations(instances, stored, parallel)[:3]]
    local = [n for n, s in prog.storage.buffers.items() if s.placement == "local"]
    for batch in BATCHES:
        groups = prog.storage.regions({n: batch for n in local})
        assert sorted(n for g in groups for n in g) == sorted(local)
        problems += [f"(e) {v}" for v in sharing_violations(instances, prog.storage, groups, batch, parallel)[:3]]
    assert not problems, (f"{prog.schedule.kind} schedule, time dims "
                          f"{['par' if p else 'seq' for p in parallel]}:\n" + "\n".join(problems))
    return stored


# -- the workloads ---------------------------------------------------------------------------
CONTRACTED = {"b2b_gemm", "dilated_rnn", "flash_attention", "stacked_lstm"}  # under both schedules


@pytest.mark.parametrize("source", ["inputs", "specs"])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_storage_matches_brute_force(name, schedule, source):
    """Traced on the inputs, or on specs with the inputs' lengths as `sizes=` (parametric
    maps, finite under the context)."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=5)
    if source == "inputs":
        prog = ft.analyze(mod.program, *inputs, schedule=schedule)
    else:
        sizes = interpret.bind_params(ft.trace(mod.program, *mod.specs("small")), inputs)
        prog = ft.analyze(mod.program, *mod.specs("small"), schedule=schedule, sizes=sizes)
        assert prog.model.params
    stored = check_storage(prog, inputs)
    if name in CONTRACTED:  # (the check is not vacuous: cells are shared)
        assert any(m is not None for moduli in stored.values() for m in moduli), stored


def test_checker_catches_a_bad_mapping():
    """(a), (b) and (c) each notice a mapping that puts live elements in one cell."""
    mod = WORKLOADS["flash_attention"]
    inputs = mod.inputs("small", seed=5)
    prog = ft.analyze(mod.program, *inputs, schedule="auto")
    instances = run_instances(prog, inputs)
    parallel = prog.schedule.parallel
    states = [n for n, s in prog.storage.buffers.items() if s.contracted]
    assert len(states) == 3  # m, l, o
    for name in states:
        s = prog.storage.buffers[name]
        assert s.moduli == (None, None, None, 2)
        lv = lives(instances, name)
        assert not overlap_violations(lv, s.moduli, parallel)
        assert not simulation_violations(instances, {name: s.moduli}, parallel)
        # (a): one cell along the key tiles. A step reads the state while it writes the next
        # one: in time order that would work in place, but the storage (and (a)) count the
        # accesses of one instance as simultaneous.
        one = (None, None, None, 1)
        assert overlap_violations(lv, one, parallel), name
        assert not simulation_violations(instances, {name: one}, parallel)
        with pytest.raises(AssertionError, match=r"\(a\) " + name):
            check_storage(prog, inputs, {name: one})
        # (b): the query tiles of a head in one cell; they run at once (parallel dim)
        rows = (None, None, 1, 2)
        bad = simulation_violations(instances, {name: rows}, parallel)
        assert bad and {v[0] for v in bad} == {"race"}, bad[:3]
        assert overlap_violations(lv, rows, parallel)
        # (c): an ISL mapping that is not what the moduli say
        wrong = dataclasses.replace(s, mapping=isl.Map(str(s.mapping).replace("mod 2", "mod 3")))
        es = list(lv.write)
        assert not mapping_disagreements(s, es, prog.model.context)
        assert mapping_disagreements(wrong, es, prog.model.context), str(wrong.mapping)
        # (d): local to the iterations of the coarsened (b, h, q) loop: one iteration keeps the
        # two live states of its query tile; a batch of 16 (all 8 here) keeps every tile's
        assert s.placement == "local" and s.local[Batch(1)][0] == (1, 1, 1, 2) and s.local[Batch(16)][0] == s.moduli, \
            s.local
        assert not local_violations(lv, s, parallel)
        for spoiled in ({Batch(1): (1, 1, 1, 1)}, {Batch(16): (1, 1, None, 2)}, {Batch(16): (None, None, 1, 2)},
                        {Batch(16, True): (None, None, 1, 2)}):
            assert local_violations(lv, s, parallel, spoiled), spoiled


def test_checker_catches_a_stale_read():
    """(b) in time order: bigbird's block scores are all written before the softmax over
    them reads them; keeping one cell per row would read overwritten scores."""
    mod = WORKLOADS["bigbird"]
    inputs = mod.inputs("small", seed=5)
    prog = ft.analyze(mod.program, *inputs, schedule="auto")
    instances = run_instances(prog, inputs)
    parallel = prog.schedule.parallel
    [scores] = [s for s in prog.storage.buffers.values() if s.mapping is not None and s.buffer.depth == 3]
    name = scores.buffer.name
    assert scores.moduli == (None, None, None)
    stale = (None, None, 1)
    bad = simulation_violations(instances, {name: stale}, parallel)
    assert "read" in {v[0] for v in bad}, bad[:3]  # (and races: the scores of a row are computed at once)
    assert overlap_violations(lives(instances, name), stale, parallel)
    with pytest.raises(AssertionError, match=r"\(b\) \('read', '" + name):
        check_storage(prog, inputs, {name: stale})


def test_checker_catches_a_race():
    """Concurrent instances: the stacked LSTM's "auto" schedule runs the layers of one
    wavefront at once. Dropping the layer dim of the gates buffer as well as the time dim
    is fine in time order, but the layers of a wavefront would share a cell."""
    mod = WORKLOADS["stacked_lstm"]
    inputs = mod.inputs("small", seed=5)
    prog = ft.analyze(mod.program, *inputs, schedule="auto")
    instances = run_instances(prog, inputs)
    parallel = prog.schedule.parallel
    [gates] = [s for s in prog.storage.buffers.values() if s.contracted]
    name, m = gates.buffer.name, gates.moduli
    assert m == (None, None, 1, None)
    layerless = (None, 1, 1, None)
    bad = simulation_violations(instances, {name: layerless}, parallel)
    assert bad and all(v[0] == "race" for v in bad), bad[:3]
    assert overlap_violations(lives(instances, name), layerless, parallel)
    assert not simulation_violations(instances, {name: m}, parallel)


# -- random nests (tests/nests.py) -----------------------------------------------------------
C22 = np.array([[0.6, -0.4], [0.3, 0.8]], dtype=np.float32)
ELEMENT = {  # element math on a [1, 2] tile (w: [2, 2])
    "tanh(x@w)": lambda x, w: ft.tanh(x @ w),
    "x*0.5+1": lambda x, w: x * 0.5 + 1.0,
    "x@C": lambda x, w: x @ C22,
}
COMBINE = {  # an aggregate's step on [1, 2] tiles (lifted elementwise to lists)
    "s+x": lambda s, x, w: s + x,
    "tanh(s@w+x)": lambda s, x, w: ft.tanh(s @ w + x),
    "s*x": lambda s, x, w: s * ft.tanh(x),
}
KIT = Kit(ELEMENT, COMBINE, tile=(1, 2), w_shape=(2, 2), w_scale=0.7, window_pads=(0, 1),
          then=True, pair_state=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduled_nests(KIT))
def test_random_nests_storage_matches_brute_force(case):
    """Traced on the nest's concrete inputs, or (by the seed's parity) on specs with the
    lengths as sizes; nests of one or two levels under the "auto" schedule, up to three under
    the "original" one."""
    prog, (xs, w), program = analyze_nest(case, KIT)
    assert rel_error(interpret.run(prog.etdg, xs, w), program(xs, w)) < TOL
    check_storage(prog, (xs, w))


# -- what gets contracted --------------------------------------------------------------------
def written_by(prog, op):
    """The intermediate buffers written by statements with an `op` dim (e.g. "foldl")."""
    out = {}
    for stmt in prog.etdg.statements:
        if any(d.op == op for d in stmt.dims):
            for am in stmt.writes:
                b = am.buffer.resolve()
                if b.kind == "intermediate":
                    out[b.name] = b
    return list(out.values())


def fold_program(xs, w):
    return xs.foldl(lambda s, x: ft.tanh(s @ w + x), ft.zeros((1, 4)))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("symbolic", [True, False], ids=["specs", "inputs"])
def test_foldl_state_needs_two_cells(symbolic, schedule):
    """Step i reads state i - 1 and writes state i: two cells, for any number of steps."""
    rng = np.random.default_rng(0)
    xs = ft.FractalTensor.from_numpy(rng.standard_normal((7, 1, 4)).astype(np.float32), 1)
    w = (rng.standard_normal((4, 4)) * 0.5).astype(np.float32)
    args = (ft.spec("[L]float32[1, 4]"), ft.spec("float32[4, 4]")) if symbolic else (xs, w)
    prog = ft.analyze(fold_program, *args, schedule=schedule)
    [state] = written_by(prog, "foldl")
    s = prog.storage.of(state)
    assert s.moduli == (2,)
    assert s.cell_dims() == [2]
    assert str(state.dims[0]) == ("L" if symbolic else "7")
    mem = prog.memory(sizes={"L": 1000} if symbolic else None).set_index("buffer")
    row = mem.loc[state.name]
    assert row.role == "intermediate"
    assert row.full_bytes == (1000 if symbolic else 7) * 16 and row.allocated_bytes == 2 * 16
    if not symbolic:
        check_storage(prog, (xs, w))


def test_flash_attention_states_contract_along_key_tiles():
    """The online-softmax state (m, l, o) is carried from one key tile to the next: two cells
    along the key-tile dim, every other dim kept (from specs the dim is TK by name; from the
    inputs, 3 key tiles)."""
    mod = WORKLOADS["flash_attention"]
    for schedule in SCHEDULES:
        for args in (mod.specs("small"), mod.inputs("small", seed=1)):
            prog = ft.analyze(mod.program, *args, schedule=schedule)
            states = written_by(prog, "reduce")
            tq, d = mod.PRESETS["small"]["tq"], mod.PRESETS["small"]["d"]
            assert sorted(b.element_shape for b in states) == [(tq, 1), (tq, 1), (tq, d)], states
            for b in states:
                s = prog.storage.of(b)
                tk = len(b.dims) - 1
                if isinstance(args[0], ft.FractalTensor):
                    assert b.dims[tk].evaluate({}) == 3  # Lk / tk key tiles at the small preset
                else:
                    assert str(b.dims[tk]) == "TK", b.dims
                assert s.moduli == (None,) * tk + (2,), (schedule, b.name, s.moduli)
                assert s.cell_dims()[-1] == 2


def test_stacked_lstm_gates_drop_the_time_dim():
    """Under the "auto" schedule (a wavefront over layers and time), the four gates of a step
    are consumed in the same step: the gates buffer keeps batch, layer and gate, not time."""
    mod = WORKLOADS["stacked_lstm"]
    prog = ft.analyze(mod.program, *mod.specs("small"), schedule="auto")
    gates = [b for b in written_by(prog, "map")
             if len(b.dims) == 4 and str(b.dims[-1]) == "4" and b.element_shape == (1, 8)]
    assert len(gates) == 1, gates
    [g] = gates
    assert [str(n) for n in g.dims] == ["N", "D", "L", "4"]
    assert prog.storage.of(g).moduli == (None, None, 1, None)
    assert prog.storage.of(g).cell_dims() == [g.dims[0], g.dims[1], 1, 4]
    # from concrete inputs too
    prog = ft.analyze(mod.program, *mod.inputs("small", seed=1), schedule="auto")
    [g] = [b for b in written_by(prog, "map") if len(b.dims) == 4 and b.dims[-1].evaluate({}) == 4]
    assert prog.storage.of(g).moduli == (None, None, 1, None)


def test_stacked_lstm_gates_keep_a_tile_of_rows_per_thread():
    """In the C target a thread runs the batch loop inside its layer in order, a tile of 16
    rows at a time, so a thread's gates are those of one tile: rows mod 16, whatever N is
    (the global mapping keeps every row: other threads' layers run at once). Checked by brute
    force at N=40 (tiles wrap around the cells), against eager, and a modulus of 8 rows,
    which two rows of one tile would share, is caught."""
    mod = WORKLOADS["stacked_lstm"]
    shape = dict(N=40, D=2, L=3, H=8)
    inputs = mod.inputs("small", seed=40, **shape)
    prog = ft.compile(mod.program, *inputs, target="c")
    [g] = [b for b in written_by(prog, "map") if len(b.dims) == 4 and b.dims[-1].evaluate({}) == 4]
    s = prog.storage.of(g)
    assert s.moduli == (None, None, 1, None) and prog.local_batch(g) == Batch(1, True)
    assert s.local[Batch(1, True)][0] == (16, 1, 1, None) and s.local[Batch(1, False)][0][0] is None
    assert prog.memory().set_index("buffer").loc[g.name].local_bytes == 16 * 4 * 8 * 4  # rows x gates x H x 4 B
    check_storage(prog, inputs)
    lv = lives(run_instances(prog, inputs), g.name)
    assert local_violations(lv, s, prog.schedule.parallel, {Batch(1, True): (8, 1, 1, None)})
    for seed in (41, 42):
        fresh = mod.inputs("small", seed=seed, **shape)
        assert rel_error(prog(*fresh), mod.program(*fresh)) < TOL


def test_contract_false_keeps_every_element():
    mod = WORKLOADS["flash_attention"]
    prog = ft.compile(mod.program, *mod.inputs("small", seed=1), target="c", contract=False)
    assert not prog.storage.contract
    assert all(s.mapping is None and not s.contracted for s in prog.storage.buffers.values())
    mem = prog.memory()
    assert (mem.allocated_bytes == mem.full_bytes).all()


# -- compiled programs -----------------------------------------------------------------------
STRICTLY_SMALLER = {"flash_attention", "stacked_lstm"}
TARGETS = ["c", "cuda-emulated"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_compiled_contracted_equals_eager(name, schedule, target):
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=21)
    allocated = {}
    for contract in (True, False):
        prog = ft.compile(mod.program, *inputs, target=target, schedule=schedule, contract=contract)
        assert prog.storage.contract is contract
        for seed in (22, 23):  # fresh data, twice on one compiled program
            fresh = mod.inputs("small", seed=seed)
            err = rel_error(prog(*fresh), mod.program(*fresh))
            assert err < TOL, f"contract={contract}: relative error {err:.2e}"
        mem = prog.memory()
        assert list(mem.columns) == ["buffer", "role", "full_bytes", "allocated_bytes", "local_bytes", "packed_bytes",
                                     "placement", "region", "mapping", "padded_cells", "used_cells"]
        assert (mem.allocated_bytes + mem.local_bytes <= mem.full_bytes).all()
        rows = mem.set_index("buffer")
        for b in prog.layout.buffers:  # what the program allocates is what memory() reports
            if b.kind == "intermediate":
                row = rows.loc[b.name]
                cells = int(np.prod(prog.layout.cells_shape(b, {}))) * np.dtype(b.dtype).itemsize
                given = int(np.prod(prog.layout.shape(b, {}))) * np.dtype(b.dtype).itemsize  # by the caller
                local = prog.layout.batch(b) is not None
                assert row.placement == ("local" if local else "global")
                assert (row.local_bytes, row.allocated_bytes, given) == ((cells, 0, 0) if local else (0, cells, cells))
        assert not contract or target != "c" or (mem.placement == "local").sum() >= (name in STRICTLY_SMALLER)
        allocated[contract] = int(mem.allocated_bytes.sum() + mem.local_bytes.sum())
    assert allocated[True] <= allocated[False]
    if name in STRICTLY_SMALLER:
        assert allocated[True] < allocated[False], allocated


@pytest.mark.parametrize("target", TARGETS)
def test_compiled_fold_from_specs(target):
    """A parametric program: one compiled foldl (2 cells of state) on several lengths."""
    prog = ft.compile(fold_program, ft.spec("[L]float32[1, 4]"), ft.spec("float32[4, 4]"), target=target)
    [state] = written_by(prog, "foldl")
    assert prog.storage.of(state).moduli == (2,)
    assert "% 2)" in prog.source  # the state's cells: step i writes cell i mod 2
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((4, 4)) * 0.5).astype(np.float32)
    for n in (1, 2, 3, 8):
        xs = ft.FractalTensor.from_numpy(rng.standard_normal((n, 1, 4)).astype(np.float32), 1)
        assert rel_error(prog(xs, w), fold_program(xs, w)) < TOL, n


def reduce_program(xs, w):
    return xs.map(lambda x: ft.tanh(x @ w)).reduce(lambda s, x: s * ft.tanh(x))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_reduce_over_one_element(schedule):
    """A reduce without init over one element runs no step: its state buffer has no
    instance at all (no write, no read), and still gets a storage mapping."""
    rng = np.random.default_rng(4)
    xs = ft.FractalTensor.from_numpy(rng.standard_normal((1, 1, 2)).astype(np.float32), 1)
    w = rng.standard_normal((2, 2)).astype(np.float32)
    specs = (ft.spec("[A]float32[1, 2]"), ft.spec("float32[2, 2]"))
    for prog in (ft.analyze(reduce_program, xs, w, schedule=schedule),
                 ft.analyze(reduce_program, *specs, schedule=schedule, sizes={"A": 1})):
        [state] = written_by(prog, "reduce")
        assert state.dims[0].evaluate({"A": 1}) == 0
        assert prog.storage.of(state).mapping is not None
        check_storage(prog, (xs, w))
    for target in TARGETS:
        prog = ft.compile(reduce_program, xs, w, target=target, schedule=schedule)
        assert rel_error(prog(xs, w), reduce_program(xs, w)) < TOL
        prog = ft.compile(reduce_program, *specs, target=target, schedule=schedule)
        for n in (1, 2, 5):
            ys = ft.FractalTensor.from_numpy(rng.standard_normal((n, 1, 2)).astype(np.float32), 1)
            assert rel_error(prog(ys, w), reduce_program(ys, w)) < TOL, n


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["yes", 1, 0, None])
def test_contract_must_be_a_bool(bad):
    mod = WORKLOADS["stacked_rnn"]
    with pytest.raises(PolyftError, match="contract"):
        ft.compile(mod.program, *mod.inputs("small", seed=1), target="c", contract=bad)


def test_memory_sizes_checked():
    prog = ft.analyze(fold_program, ft.spec("[L]float32[1, 4]"), ft.spec("float32[4, 4]"))
    with pytest.raises(PolyftError, match=r"\bL\b"):
        prog.memory()
    with pytest.raises(PolyftError, match=r"'L': 2\.5"):
        prog.memory(sizes={"L": 2.5})
    with pytest.raises(PolyftError, match=r"'Q'"):
        prog.memory(sizes={"Q": 3})
    with pytest.raises(PolyftError, match=r"'L'"):
        prog.memory(sizes={"L": -1})
    assert prog.memory(sizes={"L": 3}).set_index("buffer").loc["xs"].full_bytes == 3 * 16
    # a program from concrete inputs knows its lengths, and takes no others
    fixed = ft.analyze(fold_program, ft.FractalTensor.from_numpy(np.ones((5, 1, 4), np.float32), 1),
                       np.ones((4, 4), np.float32))
    assert fixed.memory().set_index("buffer").loc["xs"].full_bytes == 5 * 16
    with pytest.raises(PolyftError, match=r"'L'"):
        fixed.memory(sizes={"L": 5})


# -- peak memory -----------------------------------------------------------------------------
STEPS, SIDE = 20_000, 64
HISTORY = STEPS * SIDE * SIDE * 4  # bytes: every state of the fold, 328 MB
PEAK = textwrap.dedent(f"""
    import json, resource, sys
    import numpy as np
    import polyft as ft
    from polyft.testing import rel_error

    def program(xs, w):
        return xs.foldl(lambda s, x: ft.tanh(s @ w + x), ft.zeros(({SIDE}, {SIDE})))

    rng = np.random.default_rng(0)
    data = rng.standard_normal(({STEPS}, 1, {SIDE}), dtype=np.float32)
    xs = ft.FractalTensor.from_numpy(data, 1)
    w = rng.standard_normal(({SIDE}, {SIDE}), dtype=np.float32) * np.float32(0.3 / np.sqrt({SIDE}))
    expect = np.zeros(({SIDE}, {SIDE}), np.float32)
    for x in data:
        expect = np.tanh(expect @ w + x)
    try:  # make the peak so far the memory in use now (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open("/proc/self/status") as f:  # KB in use now, where the peak could not be reset
        before = min(before, int(f.read().split("VmRSS:")[1].split()[0]))
    prog = ft.compile(program, xs, w, target="c", contract=sys.argv[1] == "1")
    got = prog(xs, w)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mem = prog.memory()
    print(json.dumps(dict(growth=(after - before) * 1024, err=rel_error(got, expect),
                          intermediate=int(mem[mem.role == "intermediate"].allocated_bytes.sum()))))
""")


def peak_growth(contract: bool) -> dict:
    """The growth of the peak resident memory (ru_maxrss, in bytes; Linux reports KB) over
    compile + call, in a fresh process, with the result's error and the intermediates'
    allocated bytes (memory()).

    Linux carries a process's ru_maxrss across exec: a Python spawned straight from this test
    process would start from this process's peak (which hypothesis and the compiled tests
    above raise). Through a shell that forks it, it starts from the shell's."""
    r = subprocess.run(["/bin/sh", "-c", '"$0" -c "$1" "$2"; exit $?', sys.executable, PEAK,
                        "1" if contract else "0"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self; ru_maxrss in KB")
def test_peak_memory_follows_the_live_set():
    contracted = peak_growth(True)
    assert contracted["err"] < 1e-4, contracted
    assert contracted["intermediate"] <= 2 * SIDE * SIDE * 4, contracted
    assert contracted["growth"] < 100e6, contracted
    full = peak_growth(False)
    assert full["err"] < 1e-4, full
    assert full["intermediate"] >= HISTORY, full
    assert full["growth"] > HISTORY, full


# -- local buffers in the C target: a scratch per thread -------------------------------------
def test_flash_attention_states_live_in_each_threads_scratch():
    """At 256 query tiles (16 batches of 16), the online-softmax states and the scaled
    queries are local: the caller allocates nothing for them, a thread's scratch keeps the
    query tiles of its batch (within 2 batches and 2 heads) x 2 live states, a quarter of
    the shared contracted storage, and the result equals eager."""
    mod = WORKLOADS["flash_attention"]
    shape = dict(B=4, NH=4, Lq=64, Lk=24, tq=4, tk=4, d=8)
    prog = ft.compile(mod.program, *mod.inputs("small", seed=30, **shape), target="c")
    mem = prog.memory().set_index("buffer")
    inter = mem[mem.role == "intermediate"]
    assert (inter.placement == "local").all() and (inter.allocated_bytes == 0).all(), inter
    states = [n for n in inter.index if prog.storage.buffers[n].moduli[-1:] == (2,)]
    assert len(states) == 3
    for name in states:
        s = prog.storage.buffers[name]
        b = s.buffer
        tile = int(np.prod(b.element_shape)) * 4
        assert prog.layout.batch(b) == Batch(16, True) and prog.layout.shape(b, {}) == (0,)
        assert s.moduli == (None, None, None, 2) and s.local[Batch(16, True)][0] == (2, 2, None, 2), s.local
        shared = 4 * 4 * 16 * 2 * tile  # B x NH x TQ x 2 states, contracted in shared memory
        assert inter.loc[name].local_bytes == 2 * 2 * 16 * 2 * tile == shared // 4
    assert "#pragma omp parallel\n" in prog.source and "ft_scratch" in prog.source
    for seed in (31, 32):
        fresh = mod.inputs("small", seed=seed, **shape)
        assert rel_error(prog(*fresh), mod.program(*fresh)) < TOL


def test_dilated_rnn_layers_share_scratch_regions(monkeypatch):
    """A dilated layer's outputs are dead once the next layer has read them: the outputs of
    layers 0 and 2 start at one address of a thread's scratch. The compiled result equals
    eager; with every local buffer forced into one region it does not (the test can fail).
    From specs: the band schedule, one sentence's layers after each other in one thread (at
    concrete sizes per-layer hyperplanes run every layer over the whole batch at each step,
    and nothing is local)."""
    mod = WORKLOADS["dilated_rnn"]
    inputs = mod.inputs("small", seed=33)
    specs = mod.specs("small")
    prog = ft.compile(mod.program, *specs, target="c")
    assert not prog.schedule.hyperplanes
    mem = prog.memory(sizes={p: mod.PRESETS["small"][p] for p in prog.model.params})
    local = mem[mem.placement == "local"]
    sizes = local.groupby("region").size()
    assert (sizes >= 2).any() and len(sizes) < len(local), local
    per_thread = int(local.groupby("region").local_bytes.max().sum())
    assert per_thread < int(local.local_bytes.sum())
    assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL

    from polyft.schedule.storage import Storage
    monkeypatch.setattr(Storage, "regions", lambda self, widths: [list(widths)])
    spoiled = ft.compile(mod.program, *specs, target="c")
    assert "ft_region1" not in spoiled.source
    assert rel_error(spoiled(*inputs), mod.program(*inputs)) > TOL
