"""The C target (`ft.compile(..., target="c")`): compiled programs against eager execution.

* every workload, under the "original" and the "auto" schedule, compiled from specs (called
  on two different sets of lengths) and from concrete inputs (called on fresh data);
* the generated C marks parallel loops with OpenMP, and only those (stacked RNN: the
  wavefront loop of the auto schedule is sequential, the loop inside it parallel);
* the runtime's on-disk cache: reused within a process, shared by concurrent processes
  compiling the same and different sources at once, no files left behind by a failure;
* errors: a compiler failure shows the compiler's message and the numbered generated lines
  around it; inputs that do not match the compiled program raise `InputError` before any
  native code runs.

Compiled objects go to a temporary cache directory (POLYFT_CACHE), one per module.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import polyft as ft
from polyft.emit import c_target, runtime_c
from polyft.errors import CompileError, InputError, PolyftError
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS, stacked_rnn

from helpers import TOL, assert_same, compiler_calls, flist, rand

SCHEDULES = ("original", "auto")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.usefixtures("compile_cache")  # conftest.py: a temporary POLYFT_CACHE


# -- helpers ---------------------------------------------------------------------------------
def snapshot(inputs):
    return [x.to_numpy() if isinstance(x, ft.FractalTensor) else np.array(x) for x in inputs]


def no_native_code(prog):
    """Make running `prog`'s native code fail the test."""
    def run(*_):
        raise AssertionError("native code ran on inputs that should have been rejected")
    prog._run = run
    return prog


# -- workloads x schedules -------------------------------------------------------------------
OTHER_SIZES = {  # a second set of lengths for each workload (static dims unchanged)
    "b2b_gemm": {"M": 8, "N": 16},
    "bigbird": {"B": 1, "nb": 9},
    "dilated_rnn": {"N": 3, "L": 12},
    "flash_attention": {"B": 1, "NH": 3, "Lq": 4, "Lk": 8},
    "grid_rnn": {"N": 1, "D": 3, "L1": 2, "L2": 5},
    "stacked_lstm": {"N": 3, "D": 2, "L": 4},
    "stacked_rnn": {"N": 3, "D": 2, "L": 7},
}


def test_other_sizes_cover_every_workload():
    assert set(OTHER_SIZES) == set(WORKLOADS)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_compiled_from_specs(name, schedule):
    """One compiled program, called on two sets of lengths (and on the first again): each
    call equals eager execution, and leaves its inputs unchanged."""
    mod = WORKLOADS[name]
    prog = ft.compile(mod.program, *mod.specs("small"), target="c", schedule=schedule)
    assert prog.schedule.kind == schedule
    a = mod.inputs("small", seed=11)
    b = mod.inputs("small", seed=12, **OTHER_SIZES[name])
    before = snapshot(a)
    got_a = prog(*a)
    assert_same(got_a, mod.program(*a))
    for x, y in zip(before, snapshot(a)):
        np.testing.assert_array_equal(x, y)
    got_b = prog(*b)
    assert_same(got_b, mod.program(*b))
    assert_same(got_a, mod.program(*a))  # the second call wrote fresh outputs
    assert_same(prog(*a), mod.program(*a))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_compiled_from_inputs(name, schedule):
    """Compiled from concrete inputs: the lengths are fixed, the data is not."""
    mod = WORKLOADS[name]
    prog = ft.compile(mod.program, *mod.inputs("small", seed=21), schedule=schedule)
    fresh = mod.inputs("small", seed=22)
    assert_same(prog(*fresh), mod.program(*fresh))
    with pytest.raises(InputError):
        no_native_code(prog)(*mod.inputs("small", seed=23, **OTHER_SIZES[name]))


# -- programs beyond the workloads -----------------------------------------------------------
W = rand((3, 3), 5)
XS = flist((5,), (2, 3), 6)
SPECS = (ft.spec("[L]float32[2, 3]"), ft.spec("float32[3, 3]"))

PROGRAMS = {
    "returns a view of its input": lambda xs, w: (xs.reverse(), xs.map(lambda x: x @ w)),
    "returns its input": lambda xs, w: xs,
    "returns a zip": lambda xs, w: ft.zip(xs, xs.reverse()),
    "returns a zip inside a tuple": lambda xs, w: (xs.map(lambda x: x @ w), ft.zip(xs, xs.reverse())),
    "returns only a tensor": lambda xs, w: ft.tanh(w @ w) - w,
    "fold to a tensor": lambda xs, w: xs.foldl(lambda s, x: ft.tanh(s @ w) + x, ft.zeros((2, 3))),
    "foldr": lambda xs, w: ft.foldr(lambda x, s: ft.tanh(s @ w) - x, xs, ft.ones((2, 3))),
    "scanr without init": lambda xs, w: ft.scanr(lambda x, s: ft.tanh(s @ w) - x, xs),
    "tuple state": lambda xs, w: xs.scanl(lambda st, x: (st[0] + x, ft.tanh(st[1] * x)),
                                          (ft.zeros((2, 3)), ft.ones((2, 3)))),
    "product": lambda xs, w: ft.product(xs, xs.shift(1)).map(lambda r: r.map(lambda p: p[0] * p[1])),
    "gather": lambda xs, w: xs.gather(np.array([4, 0, 2, 2])).map(lambda x: ft.softmax(x @ w, axis=0)),
    "window padded on one side": lambda xs, w: xs.window(3, 2, (1, 0)).map(
        lambda win: win.reduce(lambda a, b: ft.maximum(a, b))),
    "constant tensor": lambda xs, w: xs.map(lambda x: x + np.arange(6, dtype=np.float32).reshape(2, 3)),
    "static indexing": lambda xs, w: xs.map(lambda x: x[1] * x[:, 2:3] + ft.sum(x[::-1, ::2])),
    "mean and sum over axes": lambda xs, w: xs.map(lambda x: ft.mean(x, axis=0) + ft.sum(x, axis=(0, 1))),
    "concat of a python list": lambda xs, w: xs.map(lambda x: ft.concat([x, x * 2.0], axis=0)),
    "elements by index": lambda xs, w: xs.map(lambda x: x - xs[-1] + xs[0]),
    "log sqrt relu minimum": lambda xs, w: xs.map(
        lambda x: ft.log(1.0 + x * x) + ft.sqrt(ft.relu(x)) + ft.minimum(x, 0.5)),
    "reduce of lists without init": lambda xs, w: xs.window(2).reduce(
        lambda a, b: ft.map(lambda p, q: p + q, a, b)),
    "nested scans over a split": lambda xs, w: xs.shift(1).strided_split(2).map(
        lambda r: r.scanl(lambda s, x: s * ft.tanh(x @ w))).strided_merge(),
}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_from_specs_and_inputs(name, schedule):
    fn = PROGRAMS[name]
    for args in (SPECS, (XS, W)):
        prog = ft.compile(fn, *args, schedule=schedule)
        xs, w = flist((5,), (2, 3), 7), rand((3, 3), 8)
        assert_same(prog(xs, w), fn(xs, w))


def scan_program(xs, w):
    return xs.scanl(lambda s, x: ft.tanh(s @ w) + x * 0.5), xs.reverse().map(lambda x: ft.softmax(x, axis=0))


def test_float64_program():
    xs, w = ft.FractalTensor.from_numpy(rand((4, 2, 3), 60).astype(np.float64), 1), rand((3, 3), 61).astype(np.float64)
    for args in ((xs, w), (ft.spec("[L]float64[2, 3]"), ft.spec("float64[3, 3]"))):
        got = ft.compile(scan_program, *args)(xs, w)
        expected = scan_program(xs, w)
        assert got[0].dtype == "float64" and rel_error(got, expected) < 1e-12


@pytest.mark.parametrize("how", ["inputs", "specs"])
def test_float16_program(how):
    """float16 tiles are computed in float (c_statements.CTYPES); the compiled program takes and
    returns float16 lists, equal to eager execution up to float16 rounding."""
    xs = ft.FractalTensor.from_numpy(rand((4, 2, 3), 62).astype(np.float16), 1)
    w = rand((3, 3), 63).astype(np.float16)
    args = (xs, w) if how == "inputs" else (ft.spec("[L]float16[2, 3]"), ft.spec("float16[3, 3]"))
    got = ft.compile(scan_program, *args)(xs, w)
    expected = scan_program(xs, w)
    assert [g.type_string for g in got] == [e.type_string for e in expected]
    assert rel_error(got, expected) < 1e-2


def test_specs_accept_different_lengths_on_each_call():
    """Lengths 0 and 1 included: an empty list folds to its init."""
    def program(xs, w):
        ys = xs.map(lambda x: ft.tanh(x @ w))
        return ys, ys.foldl(lambda s, y: s * 0.5 + y, ft.ones((2, 3))), ys.reverse().scanr(lambda y, s: s - y, w[:2])

    prog = ft.compile(program, *SPECS)
    for n in (3, 0, 1, 6, 3):
        xs, w = flist((n,), (2, 3), 30 + n), rand((3, 3), 40 + n)
        assert_same(prog(xs, w), program(xs, w))


@pytest.mark.parametrize("op", ["scanl", "scanr"])
def test_scan_without_init_of_an_empty_list(op):
    def program(xs):
        return getattr(ft, op)(lambda a, b: a - b * 0.5, xs)

    prog = ft.compile(program, SPECS[0])
    for n in (2, 0, 1):
        xs = flist((n,), (2, 3), 50 + n)
        assert_same(prog(xs), program(xs))


def test_fixed_sizes_reject_other_lengths():
    prog = ft.compile(PROGRAMS["foldr"], *SPECS, sizes={"L": 5})
    assert_same(prog(XS, W), PROGRAMS["foldr"](XS, W))
    with pytest.raises(InputError, match="L = 5"):
        no_native_code(prog)(flist((4,), (2, 3), 1), W)


def test_unknown_target():
    with pytest.raises(PolyftError, match="unknown target"):
        ft.compile(PROGRAMS["foldr"], *SPECS, target="fortran")


# -- OpenMP pragmas --------------------------------------------------------------------------
OMP_FOR = re.compile(r"#pragma omp for( schedule\(static, ft_chunk\(.*\)\))?$")  # a loop shared out in the region


def run_loops(source):
    """The loops of `polyft_run`: (nesting level, iterator, header, marked parallel); a
    flattened pair (`for (long c2_c3 = ...`, a loop over (c2, tile of c3)) counts as c2 with
    c3 inside it."""
    lines = source.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("int polyft_run"))
    out = []
    for k in range(start, len(lines)):
        m = re.match(r"^( *)for \(long (c\d+)(?:_(c\d+))? = ", lines[k])
        if m:
            prev = lines[k - 1].strip()
            out.append((len(m.group(1)), m.group(2), lines[k].strip(), bool(OMP_FOR.match(prev))))
            if m.group(3):
                out.append((len(m.group(1)) + 1, m.group(3), lines[k].strip(), False))
    levels = sorted({indent for indent, *_ in out})
    return [(levels.index(indent), it, header, par) for indent, it, header, par in out]


def test_stacked_rnn_auto_wavefront_is_sequential_and_the_loop_inside_parallel():
    prog = ft.compile(stacked_rnn.program, *stacked_rnn.specs("small"), schedule="auto")
    loops = run_loops(prog.source)
    assert [(lvl, par) for lvl, _, _, par in loops] == [(0, False), (1, True), (2, False)], loops
    _, outer, header, _ = loops[0]
    assert "D" in header and "L" in header, f"not a wavefront over layers and time: {header}"
    run = prog.source[prog.source.index("int polyft_run"):]  # the prelude's helpers have their own
    assert run.count("#pragma omp for") == 1 and prog.source.count("#pragma omp parallel") == 1
    # the flags come from the schedule: the wavefront dimension carries dependences
    assert not prog.schedule.parallel[int(outer[1:])]
    assert prog.schedule.parallel[int(loops[1][1][1:])]
    xs, ws = stacked_rnn.inputs("small", seed=4, L=9, D=4)
    assert_same(prog(xs, ws), stacked_rnn.program(xs, ws))


def test_stacked_rnn_original_parallelizes_the_batch_only():
    prog = ft.compile(stacked_rnn.program, *stacked_rnn.specs("small"), schedule="original")
    loops = run_loops(prog.source)
    assert [(lvl, par) for lvl, _, _, par in loops] == [(0, True), (1, False), (2, False)], loops
    assert "N" in loops[0][2]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_pragmas_mark_parallel_loops_only(name, schedule):
    """Every pragma sits on a loop the schedule calls parallel, never inside another one, and
    the outermost parallel loop of each nest carries one; the call has one parallel region,
    and every statement called in it runs in a shared-out loop or under `omp single`."""
    mod = WORKLOADS[name]
    prog = ft.compile(mod.program, *mod.specs("small"), schedule=schedule)
    src = prog.source
    lines = src.splitlines()
    for k, line in enumerate(lines):
        if OMP_FOR.match(line.strip()):
            assert re.match(r"^ *for \(long c\d+(_c\d+)? = ", lines[k + 1]), lines[k + 1]
    assert src.count("#pragma omp parallel") == 1 and "#pragma omp parallel for" not in src
    assert not [s for s in omp_constructs(src) if not {"for", "single"} & set(s[1])], "a call outside both"
    loops = run_loops(src)
    assert any(par for *_, par in loops), "every workload has a parallel batch dimension"
    par_flags = prog.schedule.parallel
    stack = []  # (level, parallel-or-inside-a-parallel-loop) of the enclosing loops
    for lvl, it, header, par in loops:
        while stack and stack[-1][0] >= lvl:
            stack.pop()
        inside = any(p for _, p in stack)
        if par:
            assert par_flags[int(it[1:])], f"{header} is marked parallel, the schedule says no"
            assert not inside, f"nested parallel loop {header}"
        elif par_flags[int(it[1:])]:
            assert inside, f"{header} is parallel but not marked"
        stack.append((lvl, par or inside))


def omp_constructs(source) -> list:
    """(statement call, the OpenMP constructs around it: "parallel", "for", "single") of
    `polyft_run`, blocks by braces."""
    body = source[source.index("int polyft_run"):].splitlines()
    stack, pending, out = [], None, []
    for line in body:
        s = line.strip()
        if m := re.match(r"#pragma omp (parallel|for|single)\b", s):
            pending = m.group(1)
        elif s == "{":
            stack.append(pending)
            pending = None
        elif s == "}":
            stack.pop()
        elif re.match(r"S_\w+\(", s):
            out.append((s, [k for k in stack if k]))
        elif s and not s.startswith("//"):
            pending = pending if s.startswith("for (") else None
    return out


def test_small_steps_run_on_one_thread():
    """The cost model: a wavefront step of the small stacked RNN (H=8: a few thousand flops a
    tile of 16 rows) gets one chunk of all its tiles; at H=512 a tile of one row is worth a
    thread. A trip of the step's loop is a layer's tile of the batch: the flops of one row
    times the tile's width."""
    def chunk_flops(H):
        prog = ft.compile(stacked_rnn.program, *stacked_rnn.specs("small", H=H))
        [m] = re.findall(r"schedule\(static, ft_chunk\(.*, (\d+)\.0 \* c\d+_w\)\)", prog.source)
        return int(m)
    small, large = chunk_flops(8), chunk_flops(512)
    assert small * 16 < 100_000 <= large, (small, large)


# -- the cache -------------------------------------------------------------------------------
def so_path(prog):
    """The shared object of a compiled program (already built: this only looks it up)."""
    return runtime_c.build(prog.source)


def test_same_program_gives_the_same_source():
    """Tracing the same program again (after other traces) gives the same C: the cache key."""
    fn = PROGRAMS["tuple state"]
    first = ft.compile(fn, *SPECS).source
    ft.trace(PROGRAMS["gather"], *SPECS)
    assert ft.compile(fn, *SPECS).source == first


def test_same_source_compiles_once(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    calls = compiler_calls(monkeypatch)
    fn = PROGRAMS["fold to a tensor"]
    p1 = ft.compile(fn, *SPECS)
    assert len(calls) == 1
    p2 = ft.compile(fn, *SPECS)
    assert len(calls) == 1 and p2.source == p1.source
    assert_same(p2(XS, W), fn(XS, W))
    p3 = ft.compile(PROGRAMS["foldr"], *SPECS)  # another source
    assert len(calls) == 2
    so = runtime_c.build(p1.source, runtime_c.compile_flags() + ["-DPOLYFT_TEST_OTHER_FLAGS"])  # other flags
    assert len(calls) == 3 and so != so_path(p1)
    assert len(calls) == 3  # (looking up the paths compiled nothing)
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in {so_path(p1), so_path(p3), so})


WORKER = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import polyft as ft
    from polyft.testing import rel_error

    which, go = sys.argv[1], sys.argv[2]
    def a(xs, w):
        return xs.scanl(lambda s, x: ft.tanh(s @ w) + x)
    def b(xs, w):
        return xs.reverse().map(lambda x: ft.softmax(x @ w, axis=-1))
    fn = {"a": a, "b": b}[which]
    rng = np.random.default_rng(len(which) + ord(which))
    xs = ft.FractalTensor.from_numpy(rng.standard_normal((6, 2, 3)).astype(np.float32), 1)
    w = rng.standard_normal((3, 3)).astype(np.float32)
    expected = fn(xs, w)
    open(go + "." + str(os.getpid()), "w").close()  # ready
    while not os.path.exists(go):
        time.sleep(0.005)
    prog = ft.compile(fn, ft.spec("[L]float32[2, 3]"), ft.spec("float32[3, 3]"))
    from polyft.emit.runtime_c import build
    print(json.dumps({"err": rel_error(prog(xs, w), expected), "so": build(prog.source)}))
""")


def test_concurrent_processes_share_the_cache(tmp_path):
    """Four processes compile two sources (each twice) into a fresh cache at the same time:
    all succeed with correct results, and the cache holds exactly the two objects."""
    cache_dir = tmp_path / "cache"
    go = str(tmp_path / "go")
    env = {**os.environ, "POLYFT_CACHE": str(cache_dir), "PYTHONPATH": ROOT}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, which, go], env=env, cwd=str(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for which in ("a", "b", "a", "b")]
    try:
        import time
        deadline = time.time() + 120
        while len([f for f in os.listdir(tmp_path) if f.startswith("go.")]) < len(procs):
            assert time.time() < deadline, "workers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        open(go, "w").close()  # all compile at once
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    outs = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
    assert all(o["err"] < TOL for o in outs), outs
    assert outs[0]["so"] == outs[2]["so"] and outs[1]["so"] == outs[3]["so"] != outs[0]["so"]
    assert sorted(os.listdir(cache_dir)) == sorted({os.path.basename(o["so"]) for o in outs})


# -- errors ----------------------------------------------------------------------------------
def test_compiler_error_shows_message_and_numbered_source(tmp_path, monkeypatch):
    """A generated program the compiler rejects: the message has gcc's error and the
    generated lines around it, numbered, the offending one marked."""
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    real = c_target.CTarget.generate
    sources = []

    def broken(self, model, schedule, precision="fp32", storage=None):
        module = real(self, model, schedule, precision, storage)
        sources.append(module.source.replace("(void)c;", "(void)c; polyft_no_such_name += 1;", 1))
        return dataclasses.replace(module, source=sources[-1])
    monkeypatch.setattr(c_target.CTarget, "generate", broken)
    with pytest.raises(CompileError) as e:
        ft.compile(PROGRAMS["foldr"], *SPECS)
    msg = str(e.value)
    assert "polyft_no_such_name" in msg and "undeclared" in msg  # gcc's own words
    m = re.search(r"polyft\.c:(\d+):\d+: error", msg)
    assert m, msg
    n = int(m.group(1))
    lines = sources[-1].splitlines()
    assert "polyft_no_such_name" in lines[n - 1]
    assert f">{n:5d} | {lines[n - 1]}" in msg
    assert f" {n - 1:5d} | {lines[n - 2]}" in msg and f" {n + 1:5d} | {lines[n]}" in msg
    assert e.value.where == "generated C"
    assert os.listdir(tmp_path) == []  # no temporary .c or .so left behind


def test_build_of_broken_source(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    source = "int f(void)\n{\n  int x = 1;\n  return x +;\n}\n\nint g(void) { return 2; }\n"
    with pytest.raises(CompileError) as e:
        runtime_c.build(source)
    msg = str(e.value)
    assert "polyft.c:4:" in msg and "error" in msg
    assert ">    4 |   return x +;" in msg
    for k in (1, 2, 3, 5, 6, 7):
        assert f"{k:5d} | " in msg
    assert os.listdir(tmp_path) == []


def test_compiler_flag_error_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    monkeypatch.setattr(runtime_c, "FLAGS", runtime_c.FLAGS + ["-fpolyft-no-such-flag"])
    with pytest.raises(CompileError, match="polyft-no-such-flag"):
        ft.compile(PROGRAMS["foldr"], *SPECS)
    assert os.listdir(tmp_path) == []


def test_missing_compiler(monkeypatch):
    monkeypatch.setenv("CC", "polyft-no-such-cc")
    with pytest.raises(CompileError, match="polyft-no-such-cc"):
        runtime_c.build("int f(void) { return 0; }\n")


def simple(xs, w):
    return xs.map(lambda x: ft.tanh(x @ w))


@pytest.fixture(scope="module")
def compiled():
    """The same program compiled from inputs, from specs, and from specs with fixed sizes."""
    return {"inputs": ft.compile(simple, XS, W), "specs": ft.compile(simple, *SPECS),
            "sizes": ft.compile(simple, *SPECS, sizes={"L": 5})}


BAD_CALLS = {
    "element shape": lambda: (flist((5,), (3, 2), 1), W),
    "tensor shape": lambda: (XS, W[:2]),
    "list depth": lambda: (flist((1, 5), (2, 3), 1), W),
    "tensor for a list": lambda: (W, W),
    "list for a tensor": lambda: (XS, XS),
    "float64 list": lambda: (ft.FractalTensor.from_numpy(rand((5, 2, 3), 1).astype(np.float64), 1), W),
    "float64 tensor": lambda: (XS, W.astype(np.float64)),
    "int32 tensor": lambda: (XS, (W * 10).astype(np.int32)),
    "too few inputs": lambda: (XS,),
    "too many inputs": lambda: (XS, W, W),
    "no inputs": lambda: (),
}


@pytest.mark.parametrize("how", ["inputs", "specs", "sizes"])
@pytest.mark.parametrize("bad", sorted(BAD_CALLS))
def test_bad_inputs_raise_before_native_code(compiled, how, bad):
    prog = compiled[how]
    assert_same(prog(XS, W), simple(XS, W))
    real = prog._run
    try:
        with pytest.raises(InputError):
            no_native_code(prog)(*BAD_CALLS[bad]())
    finally:
        prog._run = real


@pytest.mark.parametrize("how", ["inputs", "sizes"])
def test_wrong_length_for_fixed_lengths(compiled, how):
    prog = compiled[how]
    real = prog._run
    try:
        with pytest.raises(InputError, match="5"):
            no_native_code(prog)(flist((6,), (2, 3), 2), W)
    finally:
        prog._run = real
    assert_same(compiled["specs"](flist((6,), (2, 3), 2), W), simple(flist((6,), (2, 3), 2), W))


def test_lengths_that_disagree_between_inputs():
    def program(xs, ys):
        return ft.zip(xs, ys).map(lambda p: p[0] * p[1])
    prog = ft.compile(program, SPECS[0], SPECS[0])
    a, b = flist((4,), (2, 3), 1), flist((4,), (2, 3), 2)
    assert_same(prog(a, b), program(a, b))
    with pytest.raises(InputError):
        no_native_code(prog)(a, flist((3,), (2, 3), 3))


def test_length_violating_an_assumption_is_rejected():
    """strided_split(2) traced on [L] assumes L mod 2 = 0: an odd L must not run (eagerly it
    is a WindowError; compiled, the native code would silently drop the last element)."""
    def program(xs):
        return xs.strided_split(2).map(lambda r: r.scanl(lambda s, x: s + x))

    prog = ft.compile(program, SPECS[0])
    xs = flist((6,), (2, 3), 5)
    assert_same(prog(xs), program(xs))
    with pytest.raises(InputError, match="L"):
        no_native_code(prog)(flist((7,), (2, 3), 5))


@pytest.mark.parametrize("shape", [(16, 24), (8, 8), (12, 16), (5, 7), (2, 16, 8)])
def test_transposes_by_blocks_and_rows(shape):
    """ft.transpose swaps the last two axes: by 8 x 8 blocks where 8 divides both, a row at a time
    otherwise; a tile of instances (the map's batch) and a leading axis keep their order."""
    def f(xs, w):
        return xs.map(lambda x: ft.transpose(x) * w)
    xs = flist([19], list(shape), 1)
    w = rand(shape[:-2] + (shape[-1], shape[-2]), 2)
    prog = ft.compile(f, xs, w)
    assert ("_e3" in prog.source) == (shape[-1] % 8 == 0 and shape[-2] % 8 == 0)
    assert_same(prog(xs, w), f(xs, w))


def test_a_transpose_shared_by_a_tiles_instances_is_reused():
    """Flash attention's 4 query tiles of a head read one key tile: in a batch of instances,
    run instance by instance, the k.T of an instance whose key tile is the previous one's is
    not computed again (its tile still holds it), and the result is the eager one."""
    from polyft.workloads import flash_attention
    inputs = flash_attention.inputs("small", seed=3, B=2, NH=3, Lq=32, Lk=24, tq=8, tk=8, d=16)
    prog = ft.compile(flash_attention.program, *inputs)
    assert re.search(r"if \(!\(_b > 0 && v\d+\[_b\] == v\d+\[_b - 1\]\)\)", prog.source)
    assert_same(prog(*inputs), flash_attention.program(*inputs))


def test_a_transpose_a_gemm_over_the_batch_reads_is_copied():
    """A transpose that a GEMM over all the batch's instances reads keeps a tile per instance:
    an instance whose input is the previous one's copies that one's tile."""
    def f(ks, qss, w):
        return ft.map(lambda k, qs: qs.map(lambda q: (ft.transpose(k) @ w) + q), ks, qss)
    ks, qss, w = flist([3], [8, 16], 1), flist([3, 4], [16, 8], 2), rand((8, 8), 3)
    prog = ft.compile(f, ks, qss, w)
    assert re.search(r"if \(_b > 0 && v\d+\[_b\] == v\d+\[_b - 1\]\)", prog.source)
    assert_same(prog(ks, qss, w), f(ks, qss, w))


def test_a_batch_runs_instance_by_instance_with_fused_elementwise_chains():
    """A tile of a map's instances runs its per-instance operations one instance at a time:
    a tile used only by the next operations of the same instance is declared for one
    instance, not the batch's 16; a chain of elementwise operations of one shape is one loop
    whose inner values are never stored (exp(s - m) below: `s - m` has no tile), while a value
    also read after a GEMM over all instances keeps a tile per instance. 19 instances: a full
    batch and a partial one."""
    def f(xs, w):
        def row(x):
            s = x @ x.T                                   # per instance: one instance's tile
            p = ft.exp(s - ft.max(s, axis=1, keepdims=True))
            h = ft.tanh(p @ x)                            # read by the GEMM over all instances
            return (h @ w) * h
        return xs.map(row)
    xs, w = flist([19], [8, 16], 1), rand((16, 16), 2) / 4
    prog = ft.compile(f, xs, w)
    body = prog.source[prog.source.index("static void S_"):]
    assert re.search(r"float v\d+\[64\];", body)            # s, p: one instance's 8 x 8
    assert re.search(r"float v\d+\[2048\];", body)          # h: 16 instances' 8 x 16
    assert re.search(r"const float _t\d+ = \(v\d+\[_e0\*8 \+ _e1\]\) - \(v\d+\[_e0\]\);\n\s*"
                     r"const float _t\d+ = ft_expf\(_t\d+\);", body)
    assert_same(prog(xs, w), f(xs, w))
