"""Dependence analysis (deps.model, deps.analyze): Table 4's distance vectors per operator
and depth, Listing 1's stacked RNN, the errors of the model, and `polyft inspect --deps`.

The brute-force comparison of every dependence with an instance-by-instance run is in
test_bruteforce.py; this file pins down the shapes the paper states.
"""
from __future__ import annotations

import re
from types import SimpleNamespace

import islpy as isl
import numpy as np
import pytest

import polyft as ft
from polyft.deps.analyze import analyze
from polyft.deps.model import build, check_single_assignment
from polyft import cli, interpret
from polyft.errors import AccessError, LengthMismatchError, SingleAssignmentError
from polyft.affine import Aff
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS, stacked_rnn

OPS = ("map", "reduce", "foldl", "foldr", "scanl", "scanr")
LENGTHS = "ABC"


def analyze_traced(fn, *specs, sizes=None):
    """trace -> deps.model.build -> deps.analyze on the ETDG as traced (ft.analyze would
    coarsen it first with the default schedule)."""
    etdg = ft.trace(fn, *specs)
    model = build(etdg, sizes)
    return SimpleNamespace(etdg=etdg, model=model, deps=analyze(model))


def fresh(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- Table 4: one operator at depth i of a nest of maps --------------------------------------


def lifted_add(depth):
    """s + x on tensors, lifted elementwise over lists of the given depth."""
    if depth == 0:
        return lambda s, x: s * 0.5 + x
    inner = lifted_add(depth - 1)
    return lambda s, x: ft.map(inner, s, x)


def nest(op, i, D, init):
    """A depth-D nest whose level i is `op` and every other level a map; an aggregate's
    state is the rest of the nest (a list of depth D-1-i, or a tensor at the bottom)."""
    def level(k, xs):
        if k < i:
            return xs.map(lambda x: level(k + 1, x))
        if op == "map":
            return xs.map(lambda x: level(k + 1, x)) if k + 1 < D else xs.map(lambda x: x * 2.0)
        step = lifted_add(D - 1 - i)
        f = (lambda x, s: step(s, x)) if op in ("foldr", "scanr") else step
        return getattr(ft, op)(f, xs, xs[0] if init else None)

    def program(xs):
        return level(0, xs)
    return program


def unit(D, i, sign=1):
    return tuple(sign if k == i else 0 for k in range(D))


def operator_statement(prog, op, i, D):
    """The statement whose operator vector p is `op` at i and map elsewhere."""
    want = ["map"] * D
    want[i] = op
    found = [s for s in prog.model.statements.values() if [d.op for d in s.dims] == want]
    assert len(found) == 1, [(s.name, [d.op for d in s.dims]) for s in prog.model.statements.values()]
    return found[0]


def time_distances_positive(prog) -> bool:
    """Every flow dependence goes forward in the original schedule's time (lexicographically)."""
    tf = prog.deps.may_flow.apply_domain(prog.model.schedule).apply_range(prog.model.schedule)
    if tf.is_empty():
        return True
    m = isl.Map.from_union_map(tf)
    return m.is_subset(isl.Map.lex_lt(m.get_space().domain()))


@pytest.mark.parametrize("D,i", [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)])
@pytest.mark.parametrize("op,init", [("map", False)] + [(op, init) for op in OPS[1:] for init in (False, True)],
                         ids=lambda v: v if isinstance(v, str) else ("init" if v else "no-init"))
def test_table4_distance_vectors(op, init, D, i):
    """Table 4: map has no dependence; reduce, foldl and scanl carry one along their own dim,
    the unit vector e_i. foldr and scanr run their dim backwards (iteration k reads the state
    written by iteration k + 1), so in *iteration* coordinates, which the distances are given in,
    the distance is honestly -e_i; in the original schedule's time coordinates (the dim
    appears as extent - 1 - k) it is forward like every other dependence."""
    fn = nest(op, i, D, init)
    spec = ft.spec(f"[{', '.join(LENGTHS[:D])}]float32[1, 2]")
    sizes = dict(zip(LENGTHS, (3, 4, 5)[:D]))  # >= 3: a no-init fold still has 2 steps
    for kw in ({}, {"sizes": sizes}):  # parametric, then at concrete sizes
        prog = analyze_traced(fn, spec, **kw)
        st = operator_statement(prog, op, i, D)
        names = [d.name for d in st.dims]
        want = set() if op == "map" else {unit(D, i, -1 if op in ("foldr", "scanr") else 1)}
        assert prog.deps.distances[st.name] == want
        assert prog.deps.carried[st.name] == ([] if op == "map" else [names[i]])
        assert prog.deps.parallel[st.name] == [n for k, n in enumerate(names) if op == "map" or k != i]
        # every other statement of the nest (copies, the fold's result) is a nest of maps
        for other in prog.model.statements:
            if other != st.name:
                assert prog.deps.distances[other] == set()
        assert time_distances_positive(prog)
        assert prog.deps.anti.is_empty() and prog.deps.output.is_empty()
    # the traced program computes what the eager one does
    x = ft.FractalTensor.from_numpy(fresh((3, 2, 4)[:D] + (1, 2), seed=D * 10 + i), depth=D)
    assert rel_error(interpret.run(ft.trace(fn, x), x), fn(x)) < 1e-5


def test_fold_with_a_list_state_reads_no_placeholder():
    """Regression (fixed in tracing.traced_compute): the result of a fold whose state is a
    list kept the carry view's placeholder dims, so it read `t0[A - 2, _]`: a KeyError in
    interpret.run and an out-of-bounds access (LengthMismatchError) in deps.model.build."""
    def program(xss):
        return ft.foldl(lambda s, x: ft.map(lambda a, b: a + b, s, x), xss)

    etdg = ft.trace(program, ft.spec("[A, B]float32[1, 2]"))
    assert not re.search(r"[\[, ]_[\],]", str(etdg)), str(etdg)  # no placeholder left in an index
    build(etdg)
    x = ft.FractalTensor.from_numpy(fresh((3, 4, 1, 2), 1), depth=2)
    assert rel_error(interpret.run(ft.trace(program, x), x), program(x)) < 1e-5


# -- Listing 1: the stacked RNN --------------------------------------------------------------


@pytest.mark.parametrize("preset", ["small", "paper"])
@pytest.mark.parametrize("how", ["traced", "ft.analyze"])
def test_stacked_rnn_distances(preset, how):
    specs = stacked_rnn.specs(preset)
    prog = analyze_traced(stacked_rnn.program, *specs) if how == "traced" else \
        ft.analyze(stacked_rnn.program, *specs)
    (name, st), = prog.model.statements.items()
    assert [d.op for d in st.dims] == ["map", "scanl", "scanl"]
    assert prog.deps.distances[name] == {(0, 1, 0), (0, 0, 1)}
    assert prog.deps.carried[name] == ["j", "k"] and prog.deps.parallel[name] == ["i"]
    expect = isl.UnionMap(
        "[D, L, N] -> { S_b0[i, j, k] -> S_b0[i, j, k + 1] : 0 <= i < N and 0 <= j < D and 0 <= k < L - 1;"
        " S_b0[i, j, k] -> S_b0[i, j + 1, k] : 0 <= i < N and 0 <= j < D - 1 and 0 <= k < L }")
    assert prog.deps.flow.is_equal(expect)
    assert prog.deps.may_flow.is_equal(expect)
    # reuse: xss is read again along the layer dim j, ws along the batch i and time k
    reuse = {r.buffer: r.dims for r in prog.deps.reuse if r.null_space}
    assert reuse == {"xss": ["j"], "ws": ["i", "k"]}


def test_stacked_rnn_concrete_sizes():
    mod = stacked_rnn
    prog = analyze_traced(mod.program, *mod.specs(), sizes={"N": 2, "D": 3, "L": 4})
    assert prog.deps.distances["S_b0"] == {(0, 1, 0), (0, 0, 1)}
    # 2 * 3 * 3 dependences along k, 2 * 2 * 4 along j
    assert count_points(prog.deps.flow) == 18 + 16


def count_points(umap) -> int:
    """The number of pairs in a relation made finite by fixing the parameters."""
    points = []

    def per_map(m):
        w = m.wrap().project_out(isl.dim_type.param, 0, m.dim(isl.dim_type.param))
        w.foreach_point(points.append)
    umap.foreach_map(per_map)
    return len(points)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads_distances_are_forward(name):
    """Every workload's flow dependences go forward in the original schedule, and buffers
    being single assignment, there are no anti or output dependences."""
    mod = WORKLOADS[name]
    prog = analyze_traced(mod.program, *mod.specs("small"))
    assert time_distances_positive(prog)
    assert prog.deps.anti.is_empty() and prog.deps.output.is_empty()
    assert not prog.deps.flow.is_empty()


# -- errors -----------------------------------------------------------------------------------


def test_access_error_strided_merge_of_symbolic_outer_length():
    def program(xss):
        return xss.strided_merge().map(lambda x: x + 1.0)

    with pytest.raises(AccessError, match=r"strided_merge over a symbolic outer length N"):
        ft.analyze(program, ft.spec("[N, L]float32[1, 2]"))
    # with a concrete outer length the merged view is quasi-affine: xss[i mod 3, floor(i/3)]
    prog = analyze_traced(program, ft.spec("[3, L]float32[1, 2]"))
    (read,) = [m for _, am, m in prog.model.accesses if am.kind == "read"]
    assert read.is_equal(isl.Map("[L] -> { S_b0[i] -> xss[i mod 3, floor(i/3)] : 0 <= i < 3L }"))


def test_access_error_index_that_is_not_an_aff():
    """An ETDG whose access index is neither an Aff nor a Gather cannot be modelled."""
    etdg = ft.trace(lambda xs: xs.map(lambda x: x * 2.0), ft.spec("[L]float32[1, 2]"))
    load = next(op for st in etdg.statements for op in st.ops if op.op == "load")
    load.pieces[0].index = ("i*i",)  # not quasi-affine
    with pytest.raises(AccessError) as info:
        build(etdg)
    msg = str(info.value)
    assert "xs[i*i]" in msg and "S_b0" in msg and "neither quasi-affine nor a declared gather" in msg


def _two_maps():
    def program(xs):
        a = xs.map(lambda x: x * 2.0)
        b = xs.map(lambda x: x + 1.0)
        return a, b
    return ft.trace(program, ft.spec("[L]float32[1, 2]"))


def test_single_assignment_two_statements_one_buffer():
    """Two stores aliased to one buffer: every element is written by S_b0 and by S_b1."""
    etdg = _two_maps()
    a, b = etdg.outputs
    b.alias_of = a
    with pytest.raises(SingleAssignmentError) as info:
        build(etdg)
    msg = str(info.value)
    assert "written twice" in msg
    # the clashing instances, printed with their coordinates
    assert re.search(r"S_b0\[i\] -> S_b1\[i'\] : .*i = (\d+) and i' = \1", msg) or \
        re.search(r"S_b1\[i\] -> S_b0\[i'\] : .*i = (\d+) and i' = \1", msg), msg
    assert f"-> {a.name}[i]" in msg  # the buffer written twice


def test_single_assignment_one_statement_overwrites():
    """A store whose index drops the iteration dim: instances i != i' write out[0]."""
    etdg = ft.trace(lambda xs: xs.map(lambda x: x * 2.0), ft.spec("[L]float32[1, 2]"))
    store = next(op for st in etdg.statements for op in st.ops if op.op == "store")
    store.index = (Aff.of(0),)
    with pytest.raises(SingleAssignmentError) as info:
        build(etdg)
    m = re.search(r"S_b0\[i\] -> S_b0\[i'\] : [^}]*i = (\d+) and i' = (\d+)", str(info.value))
    assert m and m.group(1) != m.group(2), str(info.value)


def test_check_single_assignment_accepts_traced_programs():
    for mod in WORKLOADS.values():
        check_single_assignment(build(ft.trace(mod.program, *mod.specs("small"))))


def test_length_mismatch_zip_and_map_of_different_symbolic_lengths():
    specs = (ft.spec("[N]float32[1, 2]"), ft.spec("[M]float32[1, 2]"))
    with pytest.raises(LengthMismatchError, match=r"length N .* length M"):
        ft.analyze(lambda xs, ys: ft.zip(xs, ys).map(lambda t: t[0] + t[1]), *specs)
    with pytest.raises(LengthMismatchError, match=r"\[N\]float32\[1, 2\] vs \[M\]float32\[1, 2\]"):
        ft.analyze(lambda xs, ys: ft.map(lambda a, b: a + b, xs, ys), *specs)


def test_length_mismatch_sizes_naming_an_unknown_length():
    with pytest.raises(LengthMismatchError, match=r"unknown lengths \['Q'\].*\['D', 'L', 'N'\]"):
        ft.analyze(stacked_rnn.program, *stacked_rnn.specs(), sizes={"Q": 3})


def test_length_mismatch_access_outside_a_buffer():
    """xs[5] of a list of symbolic length L: out of bounds for some L (and for L = 3)."""
    def program(xs):
        return xs.map(lambda x: x + xs[5])

    spec = ft.spec("[L]float32[1, 2]")
    prog = analyze_traced(program, spec)  # the trace assumes L >= 6
    assert prog.model.context.is_equal(isl.Set("[L] -> { : L >= 6 }"))
    # sizes contradicting the assumption (they made the model silently empty before e987a10)
    with pytest.raises(LengthMismatchError, match=r"assuming L >= 6 \(xs\[5\].*sizes give L = 3"):
        analyze_traced(program, spec, sizes={"L": 3})
    assert analyze_traced(program, spec, sizes={"L": 8}).deps.flow.is_empty()
    # an access outside a buffer the trace did not account for: the length of out changed
    etdg = ft.trace(program, spec)
    store = next(op for st in etdg.statements for op in st.ops if op.op == "store")
    store.index = (Aff.of(store.index[0]) + 1,)
    with pytest.raises(LengthMismatchError, match=r"S_b0 writes outside buffer out .*o0 = (\d+)"):
        build(etdg)


def test_root_statement_names_are_stable():
    """A statement at the top level of a program (here the fold's result) is S_root, whatever
    was traced before (it was S_b<global block counter>; fixed in 5149ced)."""
    def program(xs):
        return ft.reduce(lambda s, x: s + x, xs)  # the fold's result is stored at the top level

    spec = ft.spec("[L]float32[1, 2]")
    first = [s.name for s in ft.trace(program, spec).statements]
    ft.trace(stacked_rnn.program, *stacked_rnn.specs())
    second = [s.name for s in ft.trace(program, spec).statements]
    assert first == second == ["S_b0", "S_root"]


# -- polyft inspect --deps ----------------------------------------------------------------


def test_cli_inspect_deps_parametric(capsys):
    assert cli.main(["inspect", "stacked_rnn", "--deps"]) == 0
    out = capsys.readouterr().out
    assert "[D, L, N] -> { S_b0[i, j, k] : 0 <= i < N and 0 <= j < D and 0 <= k < L }" in out
    assert "S_b0[i, j, k] -> ysss[i, -1 + j, k]" in out  # a read
    assert "S_b0[i, j, k] -> ysss[i, j, k]" in out  # the write
    assert "S_b0[i, j, k] -> [0, i, j, k, 0]" in out  # the original schedule
    assert "flow dependences:" in out and "k' = 1 + k" in out and "j' = 1 + j" in out
    assert "S_b0: [(0, 0, 1), (0, 1, 0)]   carried by ['j', 'k']; parallel ['i']" in out


def test_cli_inspect_deps_concrete(capsys):
    assert cli.main(["inspect", "stacked_rnn", "--deps", "--size", "N=2,D=3,L=4"]) == 0
    out = capsys.readouterr().out
    assert "context: [D, L, N] -> {  : D = 3 and L = 4 and N = 2 }" in out
    assert "{ S_b0[i, j, k] : 0 <= i <= 1 and 0 <= j <= 2 and 0 <= k <= 3 }" in out
    assert "S_b0: [(0, 0, 1), (0, 1, 0)]" in out


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_cli_inspect_deps_every_workload(name, capsys):
    assert cli.main(["inspect", name, "--deps"]) == 0
    out = capsys.readouterr().out
    for section in ("domains:", "reads:", "writes:", "original schedule:", "flow dependences:",
                    "distance vectors:"):
        assert section in out


@pytest.mark.parametrize("size,message", [("Q=1", "unknown lengths ['Q']"),
                                          ("N=x", "--size expects name=value")])
def test_cli_inspect_bad_sizes(size, message, capsys):
    assert cli.main(["inspect", "stacked_rnn", "--deps", "--size", size]) == 2
    assert message in capsys.readouterr().err


# -- the benchmark script (experiments/deps_time.py) -------------------------------------------


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_deps_time_lengths_are_the_inputs_lengths(name):
    """The benchmark's concrete sizes are the lengths that the preset's inputs bind."""
    from polyft.experiments.deps_time import lengths
    mod = WORKLOADS[name]
    etdg = ft.trace(mod.program, *mod.specs("small"))
    assert lengths(name, "small") == interpret.bind_params(etdg, mod.inputs("small"))


def test_deps_time_writes_tidy_csv(tmp_path, monkeypatch):
    from polyft.experiments import deps_time
    monkeypatch.setitem(deps_time.SIZES, "quick", "small")  # the small sizes: fast
    df = deps_time.run(preset="quick", out_dir=str(tmp_path), repeats=1)
    on_disk = __import__("pandas").read_csv(tmp_path / "deps_time_quick.csv")
    assert list(on_disk.columns) == ["workload", "preset", "lengths", "sizes", "phase", "seconds", "repeats",
                                     "device", "commit", "date", "isa", "peer_isa"]
    assert len(df) == len(on_disk) == len(WORKLOADS) * 2 * 4
    assert set(df.phase) == {"trace", "model", "analyze", "total"} and (df.seconds > 0).all()


def test_reversed_shifted_symbolic_list_zips_with_itself():
    """Regression: xs.shift(1).reverse() had length max(max(L - 1, 0), 0), not that of
    xs.shift(1), so zipping them failed on symbolic specs only (found by test_bruteforce)."""
    def program(xs):
        ys = xs.shift(1)
        return ft.zip(ys, ys.reverse()).map(lambda t: t[0] - 2.0 * t[1])

    prog = analyze_traced(program, ft.spec("[L]float32[1, 2]"), sizes={"L": 4})
    assert str(prog.etdg.outputs[0].dims[0]) == "max(L - 1, 0)"
    x = ft.FractalTensor.from_numpy(fresh((4, 1, 2), 5), depth=1)
    assert rel_error(interpret.run(prog.etdg, x), program(x)) < 1e-5


def test_reversed_strided_window_symbolic_list_zips_with_it():
    """Regression: a window of stride 2 has length floor((L - 1)/2) + 1 (>= 0 for L >= 0), but
    its reverse had max(floor((L - 1)/2) + 1, 0): they did not zip (found by test_bruteforce)."""
    def program(xs):
        ws = xs.window(1, 2).map(lambda w: ft.reduce(lambda s, x: s + x, w))
        return ft.zip(ws, ws.reverse()).map(lambda t: t[0] * t[1])

    prog = analyze_traced(program, ft.spec("[L]float32[1, 2]"), sizes={"L": 5})
    x = ft.FractalTensor.from_numpy(fresh((5, 1, 2), 6), depth=1)
    assert rel_error(interpret.run(prog.etdg, x), program(x)) < 1e-5


def test_reversed_window_symbolic_list_zips_with_it():
    """Regression: window(3) of [L] has length L - 2 (the trace assumes L >= 3); its reverse
    had max(L - 2, 0) and did not zip with it (found by test_bruteforce)."""
    def program(xs):
        ws = xs.window(3).map(lambda w: ft.reduce(lambda s, x: s + x, w))
        return ft.zip(ws, ws.reverse()).map(lambda t: t[0] * t[1])

    prog = analyze_traced(program, ft.spec("[L]float32[1, 2]"), sizes={"L": 5})
    assert str(prog.etdg.outputs[0].dims[0]) == "L - 2"
    x = ft.FractalTensor.from_numpy(fresh((5, 1, 2), 8), depth=1)
    assert rel_error(interpret.run(prog.etdg, x), program(x)) < 1e-5
