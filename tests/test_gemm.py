"""The C target's GEMM: the micro-kernel picked for the CPU, and `x @ W + h @ U` as one GEMM.

* every micro-kernel shape (rows x vectors x lanes: SSE2's 4 x 2 x 4, AVX2's 6 x 2 x 8, AVX-512's
  8 x 2 x 16, and 8 x 1 x 16 where 32 does not divide the columns) gives the eager result, on row
  counts that leave partial register blocks and partial batch tiles, and on column counts the
  vector kernel cannot take (plain loops), whatever ISA level the code is compiled for;
* on every ISA level the compiler can target (emit/isa.py: x86-64, haswell, skylake-avx512 on
  x86; armv8-a through a cross compiler), the GEMM's accumulators stay in vector registers: no
  multiply-add of the generated assembly reads the stack, and no vector is reloaded from it;
  on every level this machine can execute, the code of that level gives the eager result;
* a sum of two matmuls is computed as one GEMM over both (the generated C accumulates the
  second product into the first's registers), batched over a map and unbatched inside a scan;
  a matmul also used elsewhere is not fused;
* the kernel follows the ISA level ($POLYFT_MARCH, else native), whose instruction-set macros
  are part of the compile cache key;
* a large shared matrix is packed in panels before the call (`ft_pack`) and the micro-kernel
  reads the packed copy: the same results on every kernel, panel width, list nesting (the
  LSTM's [D, 4] gate weights), inside a scan and on 1-3 threads; only read-only matrices that
  meet enough rows are packed (`packed_weights`).
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess

import pytest

import polyft as ft
from polyft.emit import c_target, isa, runtime_c
from polyft.emit.targets import TARGETS
from polyft.workloads import stacked_lstm

from helpers import assert_same, flist, rand
from test_threads import assert_same_bits_on_1_to_3_threads

pytestmark = pytest.mark.usefixtures("compile_cache")

KERNELS = [(4, 2, 4), (4, 2, 4, True), (6, 2, 8), (8, 2, 16), (8, 1, 16)]  # (rows, vectors, lanes[, splat])


@pytest.fixture(params=KERNELS, ids=lambda k: f"{k[0]}x{k[1]}x{k[2]}" + ("-splat" if k[3:] == (True,) else ""))
def kernel(request, monkeypatch):
    monkeypatch.setattr(TARGETS["c"][0], "kernel", request.param)
    return request.param


def gates(xs, hs, w, u):
    return ft.map(lambda x, h: x @ w + h @ u, xs, hs)


def fused_terms(source: str) -> int:
    """How many GEMMs of the generated C accumulate a second product (`_a1`: its rows), counted
    by their first row blocks (a tail of rows follows some)."""
    return len(re.findall(r"for \(int _r0 = 0;.*\n\s*\{\n\s*const float\* _a0\[\d+\]; const float\* _a1\[", source))


@pytest.mark.parametrize("N, P, H, Q", [(19, 1, 32, 64), (5, 3, 16, 48), (16, 2, 8, 24)])
def test_sum_of_matmuls_over_a_map(kernel, N, P, H, Q):
    xs, hs = flist([N], [P, H], 1), flist([N], [P, H], 2)
    w, u = rand((H, Q), 3), rand((H, Q), 4)
    prog = ft.compile(gates, xs, hs, w, u)
    assert fused_terms(prog.source) == (1 if Q % kernel[2] == 0 else 0)
    assert_same(prog(xs, hs, w, u), gates(xs, hs, w, u))


def test_sum_of_matmuls_inside_a_scan(kernel):
    def rnn(xs, w, u):
        return xs.scanl(lambda h, x: ft.tanh(x @ w + h @ u), ft.zeros((3, 32)))
    xs, w, u = flist([7], [3, 32], 5), rand((32, 32), 6) / 6, rand((32, 32), 7) / 6
    prog = ft.compile(rnn, xs, w, u)
    assert fused_terms(prog.source) == 1
    assert_same(prog(xs, w, u), rnn(xs, w, u))


def test_a_matmul_used_twice_is_not_fused(kernel):
    def both(xs, hs, w, u):
        def f(x, h):
            y = x @ w
            return y + h @ u, y * 2
        return ft.map(f, xs, hs)
    xs, hs, w, u = flist([19], [1, 32], 8), flist([19], [1, 32], 9), rand((32, 32), 10), rand((32, 32), 11)
    prog = ft.compile(both, xs, hs, w, u)
    assert fused_terms(prog.source) == 0
    assert_same(prog(xs, hs, w, u), both(xs, hs, w, u))


def test_kernel_follows_the_instruction_set():
    assert isa.isa(frozenset({"__AVX512F__", "__AVX2__", "__FMA__"})) == ("avx512", 16, (8, 2), True)
    assert isa.isa(frozenset({"__AVX__", "__AVX2__", "__FMA__"})) == ("avx2", 8, (6, 2), True)
    assert isa.isa(frozenset({"__SSE2__"})) == ("sse2", 4, (4, 2), False)
    assert isa.isa(frozenset({"__ARM_NEON", "__ARM_FEATURE_FMA"})) == ("neon", 4, (8, 2), True)
    assert isa.isa(frozenset()) == ("generic", 4, (4, 2), False)
    if platform.machine() in ("x86_64", "AMD64"):
        assert "__SSE2__" in isa.features("native")
        assert isa.features("x86-64") < isa.features("haswell") < isa.features("skylake-avx512")
    assert isa.runnable_levels()[-1] == "native"
    assert [isa.isa(frozenset(f)).splat for f in ({"__SSE2__"}, {"__SSE2__", "__SSE4_1__"}, {"__AVX__"})] == \
        [True, True, False]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="SSE2 and AVX2 are x86 levels")
def test_sse_splats_left_elements_and_packs_matrices_of_any_size():
    """SSE has no broadcast load: its kernel splats a row block's left elements once, and its
    4-float panels (half a cache line) read a packed copy of even a small shared matrix; AVX2's
    full-line panels read a 64 x 64 matrix in place and broadcast as they go, its row blocks
    inside the loop over the matrix's panels (SSE's outside it: a splat serves every panel)."""
    args = gates_inputs(70, 64, 64)
    for level, splat in (("x86-64", True), ("haswell", False)):
        with isa.building_for(level):
            prog = ft.compile(gates, *args)
            assert ("_ab0[_m][0]" in prog.source) == splat and ("_ab1[_m][3]" in prog.source) == splat, level
            assert prog.packed == ({"w", "u"} if splat else set()), level
            rows_first = prog.source.index("for (int _r0 = 0;") < prog.source.index("for (int _q0 = 0;")
            assert rows_first == splat, level
        assert_same(prog(*args), gates(*args))


@pytest.mark.parametrize("panel, size, packed", [(16, 64, False), (16, 128, True), (32, 128, False), (8, 64, True)])
def test_one_line_panels_pack_matrices_past_the_l1(monkeypatch, panel, size, packed):
    """A panel one cache line wide (AVX2's 2 vectors of 8) packs a shared matrix of 64 KB (128 x 128)
    but reads a 16 KB one in place; a wider one (AVX-512's 32 floats) packs neither, a narrower one
    (SSE's 8 floats) both. Checked by the kernel the target is given, so on any host."""
    kernel = {16: (6, 2, 8), 32: (8, 2, 16), 8: (4, 2, 4, True)}[panel]
    monkeypatch.setattr(TARGETS["c"][0], "kernel", kernel)
    args = gates_inputs(96, size, size)
    prog = ft.compile(gates, *args)
    assert prog.packed == ({"w", "u"} if packed else set())
    assert_same(prog(*args), gates(*args))


def test_an_unknown_level_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(isa.ENV, "no-such-cpu")
    with pytest.raises(ft.errors.CompileError, match="-march=no-such-cpu.*POLYFT_MARCH"):
        ft.compile(gates, *gates_inputs(16, 64, 64))


def test_cache_key_holds_the_instruction_set(monkeypatch):
    source = "int f(void) { return 1; }\n"
    here = runtime_c.build(source)
    assert runtime_c.build(source) == here
    monkeypatch.setattr(runtime_c, "features", lambda level=None, cc=None: frozenset({"__SOME_OTHER_CPU__"}))
    assert runtime_c.build(source) != here
    monkeypatch.undo()
    assert runtime_c.build(source, runtime_c.compile_flags("x86-64")) != here


def gates_inputs(N, H, Q):
    return flist([N], [1, H], 1), flist([N], [1, H], 2), rand((H, Q), 3), rand((H, Q), 4)


@pytest.mark.parametrize("level", isa.runnable_levels())
def test_generated_gemm_uses_the_levels_kernel(level):
    """Built for each level this machine runs: the level's kernel (its accumulators `_c<row>_<vector>`,
    its vector width), the level's -march, the eager result."""
    with isa.building_for(level) as spec:
        prog = ft.compile(gates, *gates_inputs(19, 64, 96))
    MR, NV = spec.kernel
    NV = NV if 96 % (NV * spec.lanes) == 0 else 1
    assert f"_c{MR - 1}_{NV - 1}" in prog.source and f"_c{MR}_0" not in prog.source and f"_c0_{NV}" not in prog.source
    assert f"vector_size({4 * spec.lanes})" in prog.source
    assert prog.module.march == level and f"-march={level}" in prog._run.flags
    assert_same(prog(*gates_inputs(19, 64, 96)), gates(*gates_inputs(19, 64, 96)))


def cross_compilers() -> list:
    """(level, compiler) for every ISA level a compiler here can target: this machine's levels
    with cc, and aarch64's through aarch64-linux-gnu-gcc where it is installed."""
    out = [(level, runtime_c.compiler()) for level in isa.LEVELS.get(platform.machine(), ())]
    if platform.machine() != "aarch64" and shutil.which("aarch64-linux-gnu-gcc"):
        out += [(level, "aarch64-linux-gnu-gcc") for level in isa.LEVELS["aarch64"]]
    return out


# a multiply-add of vectors (FMA, or SSE2's multiply and add), and a vector load from a fixed stack slot
ARITH = {"x86": r"\s+v?(f?n?madd\d*ps|mulps|addps)\s", "arm": r"\s+(fmla|fmul|fadd)\s+v\d+\.4s"}
STACK = {"x86": r"\({base}\)", "arm": r"\[sp"}
RELOAD = {"x86": r"\s+v?mov[au]ps\s+-?\d*\({base}\), %[xyz]mm", "arm": r"\s+ldr\s+q\d+, \[sp"}


def stack_base(asm: list) -> str:
    """x86 registers that address the stack: %rsp, and %rbp where a function makes it the frame
    pointer (`movq %rsp, %rbp`); elsewhere GCC uses %rbp as one more register for a pointer (the
    unrolled SSE2 kernel's into the right matrix, `movups 528(%rbp), %xmm2`)."""
    return "%r[sb]p" if any(re.match(r"\s+movq\s+%rsp, %rbp", line) for line in asm) else "%rsp"


@pytest.mark.parametrize("level, cc", cross_compilers())
def test_accumulators_stay_in_registers(level, cc, tmp_path):
    """The issue this guards: a 64-byte vector type on an AVX2 core kept every accumulator on
    the stack (`vfmadd213ps 256(%rsp), ...`), 20x slower. The assembly of each level's GEMM
    (and of the fused x @ W + h @ U) has multiply-adds, none reading the stack, and no vector
    reloaded from a stack slot."""
    arch = "arm" if "aarch64" in cc or platform.machine() == "aarch64" else "x86"
    spec = isa.isa(isa.features(level, cc))
    TARGET = TARGETS["c"][0]
    xs, hs, w, u = gates_inputs(19, 64, 64)
    prog = ft.analyze(gates, xs, hs, w, u)
    kernel = spec.micro_kernel  # SSE's splats its left elements (Isa.splat)
    TARGET.kernel = kernel
    try:
        module = TARGET.generate(prog.model, prog.schedule, storage=prog.storage)
    finally:
        TARGET.kernel = None
    src = tmp_path / "gemm.c"
    src.write_text(module.source)
    flags = [f for f in runtime_c.compile_flags(level) if f not in ("-shared", "-fopenmp")]
    subprocess.run([cc, *flags, "-fopenmp", "-S", str(src), "-o", str(tmp_path / "gemm.s")], check=True)
    asm = (tmp_path / "gemm.s").read_text().splitlines()
    arith = [line for line in asm if re.match(ARITH[arch], line)]
    stack, reload = (pattern[arch].format(base=stack_base(asm)) for pattern in (STACK, RELOAD))
    assert len(arith) >= kernel[0] * kernel[1], f"{level}: {len(arith)} vector multiply-adds"
    assert not [line for line in arith if re.search(stack, line)], f"{level}: accumulators on the stack"
    assert not [line for line in asm if re.match(reload, line)], f"{level}: vectors reloaded from the stack"


@pytest.mark.parametrize("P, width", [(1, 128), (32, 4), (64, 2), (200, 1)])
def test_tiles_bring_about_128_rows(P, width):
    """A map's tile of instances sharing a right matrix brings about 128 rows (TILE_ROWS): the
    tile's temporaries stay in a core's caches, and the shared matrix is read once per 128 rows
    (one-row instances: 128 of them, as no local buffer limits the tile)."""
    def rows(xs, w):
        return xs.map(lambda x: ft.exp(x @ w))
    prog = ft.compile(rows, ft.spec(f"[N]float32[{P}, 16]"), ft.spec("float32[16, 16]"))
    assert f", {width}, 1);" in prog.source.split("ft_split(", 2)[-1]
    xs, w = flist([37], [P, 16], 1), rand((16, 16), 2) / 4
    assert_same(prog(xs, w), rows(xs, w))
    xs = flist([300], [P, 16], 3)  # more instances than a tile, and a short last tile
    assert_same(prog(xs, w), rows(xs, w))


def test_a_tile_over_a_local_buffer_stays_16_instances():
    """A fold's states live in a thread's scratch (a local buffer), whose cells storage
    contracts for at most BATCH = 16 instances at once: a tile over them stays 16 instances,
    though each brings one row."""
    def fold(xss, w):
        return xss.map(lambda xs: xs.foldl(lambda h, x: ft.tanh(h @ w + x), ft.zeros((1, 16))))
    prog = ft.compile(fold, ft.spec("[N, L]float32[1, 16]"), ft.spec("float32[16, 16]"))
    assert [b.name for b in prog.layout.buffers if prog.local_batch(b)]
    assert ", 16, 1);" in prog.source.split("ft_split(", 2)[-1]
    xss, w = flist([150, 5], [1, 16], 4), rand((16, 16), 5) / 4
    assert_same(prog(xss, w), fold(xss, w))


def packed(source: str) -> int:
    """How many buffers the generated C packs before it runs."""
    return source.count("ft_pack(ctx.b")


@pytest.fixture
def pack_all(monkeypatch):
    """Every matrix a matmul shares counts as large: small programs take the packed path."""
    monkeypatch.setattr(c_target, "PACK_BYTES", 0)
    monkeypatch.setattr(c_target, "PACK_BYTES_LINE", 0)
    monkeypatch.setattr(c_target, "PACK_ROWS", 1)


@pytest.mark.parametrize("N, P, H, Q", [(19, 1, 32, 64), (5, 3, 16, 48), (16, 2, 8, 24)])
def test_packed_sum_of_matmuls_over_a_map(kernel, pack_all, N, P, H, Q):
    xs, hs = flist([N], [P, H], 1), flist([N], [P, H], 2)
    w, u = rand((H, Q), 3), rand((H, Q), 4)
    prog = ft.compile(gates, xs, hs, w, u)
    assert packed(prog.source) == (2 if Q % kernel[2] == 0 else 0)  # lanes not dividing: plain loops, nothing packed
    assert_same(prog(xs, hs, w, u), gates(xs, hs, w, u))


def test_packed_matrix_inside_a_scan_and_read_elsewhere(kernel, pack_all):
    """The scan's matmul is not batched; `w` is also an operand of an add, which reads the
    original: both copies stay right."""
    def rnn(xs, w):
        return xs.scanl(lambda h, x: ft.tanh(x @ w + h @ w) + w[:3] * 0.5, ft.zeros((3, 32)))
    xs, w = flist([7], [3, 32], 5), rand((32, 32), 6) / 6
    prog = ft.compile(rnn, xs, w)
    assert packed(prog.source) == 1
    assert_same(prog(xs, w), rnn(xs, w))


def test_packed_lstm_gate_weights(pack_all):
    """The stacked LSTM's [D, 4] lists of gate weights: each matrix packed in its own place,
    the same on 1-3 threads, for concrete and for symbolic lengths."""
    inputs = stacked_lstm.lstm_inputs(5, 3, 4, 32, seed=7)
    for args in (inputs, stacked_lstm.specs("small", H=32)):
        prog = ft.compile(stacked_lstm.program, *args)
        assert packed(prog.source) == 2
        assert_same_bits_on_1_to_3_threads(prog, stacked_lstm.program, *inputs)


def test_only_large_read_only_matrices_meeting_enough_rows_are_packed(monkeypatch):
    """At the real thresholds of a panel wider than a cache line (AVX-512's 8 x 32 kernel): a
    512 x 512 weight (1 MiB) met by 64 rows is packed, by 16 rows not (the pack would cost more
    than it saves), a 256 x 256 one (256 KiB) not; a right operand the program computes is never
    packed."""
    monkeypatch.setattr(TARGETS["c"][0], "kernel", (8, 2, 16))
    def rows(xs, w):
        return xs.map(lambda x: x @ w)

    def computed(xs, w):
        return xs.map(lambda x: x @ (w * 2))
    w = rand((512, 512), 1) / 20
    for n, expected in ((64, 1), (16, 0)):
        xs = flist([n], [1, 512], 2)
        prog = ft.compile(rows, xs, w)
        assert packed(prog.source) == expected, n
        assert_same(prog(xs, w), rows(xs, w))
        # the copy is memory the call keeps: memory() counts it, as analyze() foresees it
        assert prog.packed == ft.analyze(rows, xs, w).packed == ({"w"} if expected else set())
        assert dict(prog.memory().set_index("buffer")["packed_bytes"]) == {"xs": 0, "w": 1 << 20 if expected else 0,
                                                                            "out": 0}
    assert packed(ft.compile(rows, ft.spec("[N]float32[1, 512]"), w).source) == 1  # rows unknown: packed
    assert packed(ft.compile(rows, flist([64], [1, 256], 3), w[:256, :256]).source) == 0
    assert packed(ft.compile(computed, flist([64], [1, 512], 4), w).source) == 0


@pytest.mark.parametrize("P", range(1, 8))
def test_every_remainder_of_rows(kernel, P):
    """Row counts of every remainder modulo the kernel's rows (a tile of 16 instances of P
    rows, then one of P rows): full blocks, then the rest in blocks of 4 or 2, some taking one
    full block back to waste fewer rows (8 rows on 6: 4 + 4)."""
    def rows(xs, w):
        return xs.map(lambda x: ft.tanh(x @ w))
    xs, w = flist([17], [P, 32], P), rand((32, 48), 3) / 4
    prog = ft.compile(rows, xs, w)
    assert_same(prog(xs, w), rows(xs, w))


def accumulated(source: str) -> int:
    """How many GEMMs of the generated C start their accumulators from a tile (`_x`: its rows)."""
    return len(re.findall(r"for \(int _r0 = 0;.*\n\s*\{\n\s*const float\* _a0\[\d+\]; float\* _o\[\d+\]; const float\* _x\[",
                          source))


@pytest.mark.parametrize("Q", [64, 40])
def test_a_tile_plus_a_matmul_is_one_gemm(kernel, Q):
    """`a * o + p @ v` with per-instance p, v (flash attention's output update): one GEMM whose
    accumulators start from a * o, in a scan (unbatched) and over a map (batched per
    instance); 40 columns take the plain loops, which start from the tile too. A product also
    used elsewhere is not fused."""
    def update(ps, vs, os_):
        return ft.map(lambda p, v, o: o * 0.5 + p @ v, ps, vs, os_)

    def scan(ps, v):
        return ps.scanl(lambda o, p: ft.tanh(o * 0.5 + p @ v), ft.zeros((3, Q)))

    def used_twice(ps, vs, os_):
        def f(p, v, o):
            y = p @ v
            return o + y, y * 2
        return ft.map(f, ps, vs, os_)
    ps, vs, os_ = flist([19], [3, 32], 1), flist([19], [32, Q], 2), flist([19], [3, Q], 3)
    prog = ft.compile(update, ps, vs, os_)
    if Q % kernel[2] == 0:
        assert accumulated(prog.source) == 1
    else:
        assert accumulated(prog.source) == 0 and "_o[_q] = (" in prog.source
    assert_same(prog(ps, vs, os_), update(ps, vs, os_))
    v = rand((32, Q), 4) / 6
    prog = ft.compile(scan, ps, v)
    assert "_x[_i] = " in prog.source or Q % kernel[2]
    assert_same(prog(ps, v), scan(ps, v))
    prog = ft.compile(used_twice, ps, vs, os_)
    assert accumulated(prog.source) == 0 and "_o[_q] = (" not in prog.source
    assert_same(prog(ps, vs, os_), used_twice(ps, vs, os_))


@pytest.mark.parametrize("Q", [64, 40])
def test_a_tile_plus_a_shared_matmul_is_one_gemm_over_the_batch(kernel, Q):
    """Back-to-back GEMMs `acc + (a @ b) @ c` (b, c shared by the map's instances; acc a
    tile read from a buffer, or computed): the second product is one GEMM over every instance's
    rows whose accumulators start from acc's, instead of a product written and then added.
    5 rows an instance: the instances' rows run through the kernel's row blocks and its tail."""
    def b2b(as_, b, c, accs):
        return ft.map(lambda a, acc: acc + (a @ b) @ c, as_, accs)

    def computed(as_, b, c, accs):
        return ft.map(lambda a, acc: ft.tanh(acc) + (a @ b) @ c, as_, accs)
    as_, accs = flist([7], [5, 16], 1), flist([7], [5, Q], 2)
    b, c = rand((16, 24), 3) / 4, rand((24, Q), 4) / 5
    for fn in (b2b, computed):
        prog = ft.compile(fn, as_, b, c, accs)
        assert accumulated(prog.source) == (Q % kernel[2] == 0), fn.__name__
        assert_same(prog(as_, b, c, accs), fn(as_, b, c, accs))


def forwarded(source: str) -> int:
    """How many GEMMs of the generated C write a store's cells (`d<id>`: their address)."""
    return len(re.findall(r"float\* (?:const )?d\d+\b", source))


def test_a_gemm_read_only_by_a_store_writes_the_stored_cells():
    """A product (or tile plus product) whose only reader is a store is written where the store
    would write it, with no tile copied after: over a batch's rows (one address an instance:
    back-to-back GEMMs into a map's output, a reduce's state) and per instance (flash
    attention's o, a scan's states). Not where something else reads the value, nor where the
    product multiplies what the stored buffer holds."""
    from polyft.workloads import b2b_gemm, flash_attention

    def b2b_map(as_, b, c, accs):
        return ft.map(lambda a, acc: acc + (a @ b) @ c, as_, accs)

    def read_twice(as_, b, c, accs):
        def f(a, acc):
            y = acc + (a @ b) @ c
            return y, ft.tanh(y)
        return ft.map(f, as_, accs)

    def scan(ps, v):
        return ps.scanl(lambda o, p: o * 0.5 + p @ v, ft.zeros((3, 32)))

    def feeds_back(ps, v):
        return ps.scanl(lambda o, p: (o @ v) * 0.5 + p, ft.zeros((3, 32)))
    as_, accs = flist([7], [5, 16], 1), flist([7], [5, 32], 2)
    b, c = rand((16, 24), 3) / 4, rand((24, 32), 4) / 5
    ps, v = flist([9], [3, 32], 5), rand((32, 32), 6) / 6
    cases = [(b2b_map, (as_, b, c, accs), 1), (read_twice, (as_, b, c, accs), 0), (scan, (ps, v), 1),
             (feeds_back, (ps, v), 0),
             (b2b_gemm.program, b2b_gemm.inputs("small"), 1), (flash_attention.program, flash_attention.inputs("small"), 1)]
    for fn, args, n in cases:
        prog = ft.compile(fn, *args)
        assert forwarded(prog.source) == n, fn.__name__
        assert_same(prog(*args), fn(*args))


@pytest.mark.parametrize("Q", [64, 40])
def test_a_scaled_tile_plus_a_matmul_starts_from_the_scaled_rows(kernel, Q):
    """`a * o + p @ v` with a a column (one value a row; flash attention's alpha): the GEMM's
    accumulators start from a[r] * o's rows (no pass writes a * o), either operand order, in
    the micro-kernel and in the plain loops (40 columns). Where a * o is also used elsewhere
    the GEMM starts from it, computed once."""
    def update(ps, vs, os_, as_):
        return ft.map(lambda p, v, o, a: a * o + p @ v, ps, vs, os_, as_)

    def swapped(ps, vs, os_, as_):
        return ft.map(lambda p, v, o, a: o * a + p @ v, ps, vs, os_, as_)

    def scaled_twice(ps, vs, os_, as_):
        def f(p, v, o, a):
            x = a * o
            return x + p @ v, ft.tanh(x)
        return ft.map(f, ps, vs, os_, as_)
    ps, vs, os_ = flist([19], [5, 32], 1), flist([19], [32, Q], 2), flist([19], [5, Q], 3)
    as_ = flist([19], [5, 1], 4)
    for fn in (update, swapped):
        prog = ft.compile(fn, ps, vs, os_, as_)
        assert ("_s[_i] = " in prog.source) == (Q % kernel[2] == 0)
        assert bool(re.search(r"_o\[_q\] = v\d+(\[_b\])?\[_r\] \* \(", prog.source)) == (Q % kernel[2] != 0)
        assert_same(prog(ps, vs, os_, as_), fn(ps, vs, os_, as_))
    prog = ft.compile(scaled_twice, ps, vs, os_, as_)
    assert "_s[_i] = " not in prog.source and not re.search(r"_o\[_q\] = v\d+(\[_b\])?\[_r\] \* \(", prog.source)
    assert_same(prog(ps, vs, os_, as_), scaled_twice(ps, vs, os_, as_))
