"""The CUDA tile library (emit/tiles.cuh) through the emulator: operands shared by several
matmuls of one statement, the GEMMs at shapes with tails, and the workloads at sizes that
need streamed operands. Every result is checked against eager numpy on fresh random data."""
import numpy as np
import pytest

import polyft as ft
from helpers import flist, rand, spec
from polyft.emit.cuda_statements import GEMM_TILES, PRECISIONS, TOLERANCE, gemm_tiles
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS
import test_emulator
from test_emulator import run_kernel

pytestmark = pytest.mark.usefixtures("compile_cache")


def _gated(xs, w1, w2):
    return xs.map(lambda x: (x @ w1) * (x @ w2))


def _gated_scan(xs, h0, w1, w2):
    return ft.scanl(lambda h, x: (x @ w1) * (x @ w2) + h, xs, h0)


def test_left_operand_of_two_matmuls_batched():
    """x @ w1 and x @ w2 in one statement (they declared one staged copy of x twice before: a
    compile error): both GEMMs read the batch's x tiles where they are, for one instance,
    part of a batch, and a batch and a tail."""
    w1, w2 = rand((8, 6), 1), rand((8, 6), 2)
    prog = ft.compile(lambda xs: _gated(xs, w1, w2), spec(["N"], [4, 8]), target="cuda-emulated")
    assert prog.source.count("ft::Batch<4>{v0, (int)_nb, 8, 0}") == 2
    for n in (1, 5, 21):
        xs = flist([n], [4, 8], 3 + n)
        assert rel_error(prog(xs), _gated(xs, w1, w2)) < 1e-5


def test_left_operand_of_two_matmuls_unbatched():
    """In a scan's step (no batch) both products read the step's x in place."""
    w1, w2 = rand((8, 8), 4), rand((8, 8), 5)
    xs, h0 = flist([5], [4, 8], 6), rand((4, 8), 7)
    prog = ft.compile(lambda xs, h0: _gated_scan(xs, h0, w1, w2), xs, h0, target="cuda-emulated")
    assert prog.source.count("ft::rows(v0 + 0, 8)") == 2
    assert rel_error(prog(xs, h0), _gated_scan(xs, h0, w1, w2)) < 1e-5


# -- the GEMMs of the tile library on hand-written kernels --------------------------------
@pytest.fixture(params=[64, 256])
def threads(request, monkeypatch):
    """Blocks of the emulated target's 64 threads and of the GPU's 256: the GEMMs map their
    micro-tiles and warps onto FT_THREADS."""
    monkeypatch.setattr(test_emulator, "THREADS", request.param)
    return request.param


def _gemm(precision, P, K, Q, acc, trans, out, a, b, limits=GEMM_TILES[0]) -> str:
    """One call of ft::gemm_f32 / ft::gemm_tc with the tiles and stage the target would give."""
    BM, BN, BK, nbytes = gemm_tiles(P, Q, trans, precision, *limits)
    name = "ft::gemm_f32<" if precision == "fp32" else f"ft::gemm_tc<{PRECISIONS[precision][0]}, "
    chunk = "" if precision == "fp32" else f"{BK}, "
    return (f"{{ __shared__ __align__(64) unsigned char stage[{nbytes}];\n"
            f"  {name}{P}, {K}, {Q}, {str(acc).lower()}, {str(trans).lower()}, {BM}, {BN}, {chunk}{nbytes}>"
            f"({out}, {a}, {b}, stage); __syncthreads(); }}\n")


def _products(precision, P, K, Q, seed, lda=None, offset=0, limits=GEMM_TILES[0]):
    """out = a @ b, and acc = c0 + a @ x.T with x = b.T (the transposed operand), for a whose
    rows are `lda` floats apart from column `offset` on (16-byte alignment lost when these
    are not multiples of 4)."""
    lda = lda or K
    rng = np.random.default_rng(seed)
    a_full, b, c0 = (rng.standard_normal(s).astype(np.float32) for s in ((P, lda), (K, Q), (P, Q)))
    a = a_full[:, offset:offset + K]
    x = np.ascontiguousarray(b.T)
    out, acc = np.full((P, Q), np.nan, np.float32), c0.copy()
    rows = f"ft::Rows{{c->b0 + {offset}, {lda}}}"
    run_kernel(_gemm(precision, P, K, Q, False, False, "c->b3", rows, f"ft::Rows{{c->b1, {Q}}}", limits)
               + _gemm(precision, P, K, Q, True, True, "c->b4", rows, f"ft::Rows{{c->b2, {K}}}", limits),
               a_full, b, x, out, acc)
    return a, b, c0, out, acc


@pytest.mark.parametrize("limits", [GEMM_TILES[0], GEMM_TILES[-1]])  # the largest and smallest tiles
@pytest.mark.parametrize("P, K, Q, lda, offset", [
    (1, 8, 8, 8, 0), (5, 7, 300, 7, 0), (33, 16, 3, 19, 3), (64, 32, 64, 32, 0), (130, 37, 129, 40, 2)])
def test_gemm_f32_with_tails_transposed_and_accumulating(P, K, Q, lda, offset, limits, threads):
    """Shapes that are not multiples of the tiles (P, Q past 128: several block tiles; K not a
    multiple of the 16-deep chunks; rows not 16-byte aligned: 4-byte copies)."""
    a, b, c0, out, acc = _products("fp32", P, K, Q, P * K * Q, lda, offset, limits)
    want = a.astype(np.float64) @ b
    assert rel_error(out, want) < 1e-6
    assert rel_error(acc, want + c0) < 1e-6


@pytest.mark.parametrize("nb", [4, 2, 0])
def test_gemm_reads_a_batch_of_instances_rows(nb, threads):
    """ft::Batch: 4 instances' 3 x 10 tiles (from column 2 of 12-wide rows, in scattered
    places) as one 12-row operand, zeros for the instances past nb."""
    rng = np.random.default_rng(nb)
    x, b = rng.standard_normal((5, 3, 12)).astype(np.float32), rng.standard_normal((10, 20)).astype(np.float32)
    out = np.full((12, 20), np.nan, np.float32)
    run_kernel("const float* src[4];\n  for (int i = 0; i < 4; i++) src[i] = c->b0 + ((3 * i + 1) % 5) * 36;\n"
               + _gemm("fp32", 12, 10, 20, False, False, "c->b2", f"ft::Batch<3>{{src, {nb}, 12, 2}}",
                       "ft::Rows{c->b1, 20}"), x, b, out)
    a = np.zeros((4, 3, 10), np.float32)
    a[:nb] = x[[(3 * i + 1) % 5 for i in range(nb)], :, 2:]
    assert rel_error(out, a.reshape(12, 10).astype(np.float64) @ b) < 1e-6


def _bf16(x):
    """bf16 rounding (to nearest, ties to even) by integer arithmetic on the float32 bits."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def _tf32(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000
    return u.astype(np.uint32).view(np.float32)


ROUNDING = {"fp16": lambda x: x.astype(np.float16).astype(np.float32), "bf16": _bf16, "tf32": _tf32}


@pytest.mark.parametrize("limits", [GEMM_TILES[0], GEMM_TILES[-1]])  # two fragments' k a chunk, and one
@pytest.mark.parametrize("precision", list(ROUNDING))
@pytest.mark.parametrize("P, K, Q", [(16, 16, 16), (32, 40, 144), (144, 24, 32)])
def test_gemm_on_tensor_cores_rounds_operands_and_accumulates_in_float(precision, P, K, Q, limits, threads):
    """The operands rounded to the precision (numpy's float16, bf16 and tf32 by integer
    arithmetic), products summed in float32: K not a multiple of the chunk (zeros past it),
    P or Q past 128 (several block tiles), b read as given and as x.T."""
    a, b, c0, out, acc = _products(precision, P, K, Q, P + K + Q, limits=limits)
    rounding = ROUNDING[precision]
    want = rounding(a).astype(np.float64) @ rounding(b)
    assert rel_error(out, want) < 1e-6  # only the float32 accumulation order differs
    assert rel_error(acc, want + c0) < 1e-6
    assert rel_error(out, a.astype(np.float64) @ b) > 1e-6  # the operands really were rounded


# -- operands the GEMMs read in place ----------------------------------------------------
def _folded(xs, ks, ys, w1):
    """Columns of x on the left, a concatenation along K and a transposed tile on the right,
    the three products summed."""
    return ft.map(lambda x, k, y: x[:, 3:11] @ w1 + x @ ft.concat((y, y * 2.0), axis=0) + x @ k.T, xs, ks, ys)


def test_transposes_concatenations_and_columns_are_read_in_place():
    """None of x[:, 3:11], concat((y, 2 y)) and k.T is copied into a tile: the GEMMs read x
    from column 3 on, y and 2 y as two accumulating GEMMs, k along its rows (TRANS); the
    three products are one tile, each later GEMM accumulating into it."""
    w1 = rand((8, 6), 1)
    prog = ft.compile(lambda xs, ks, ys: _folded(xs, ks, ys, w1), spec(["N"], [4, 16]), spec(["N"], [6, 16]),
                      spec(["N"], [8, 6]), target="cuda-emulated")
    body = prog.source.split("__device__ static void S_b0")[1].split("\n}\n")[0]
    assert "_tx" not in body  # no transpose
    calls = [line for line in body.splitlines() if "ft::gemm_f32<" in line]
    assert len(calls) == 4 and sum(", true, " in line.split(">(")[0] for line in calls) == 3
    assert any("ft::Batch<4>{v0, (int)_nb, 16, 3}" in line for line in calls)  # x[:, 3:11]
    assert any(", true, true, " in line for line in calls)  # k.T
    for n in (1, 17):
        xs, ks, ys = flist([n], [4, 16], 4 + n), flist([n], [6, 16], 5 + n), flist([n], [8, 6], 6 + n)
        assert rel_error(prog(xs, ks, ys), _folded(xs, ks, ys, w1)) < 1e-5


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_bigbird_at_d512_fits_and_equals_eager(precision):
    """BigBird with blocks of 64 x 512 (its windowed key blocks a [192, 512] concatenation, the
    output a sum of five products) generates within a block's shared memory and equals eager."""
    mod = WORKLOADS["bigbird"]
    inputs = mod.inputs("small", seed=8, B=1, nb=8, bs=64, d=512)
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated", precision=precision)
    assert ("ft::gemm_tc<" in prog.source) == (precision != "fp32")
    assert rel_error(prog(*inputs), mod.program(*inputs)) < TOLERANCE[precision]


def test_async_copies_land_only_when_waited_for():
    """The emulator performs a thread's copies at its wait (the latest a GPU may land them), so
    a GEMM reading a chunk before waiting for it reads stale shared memory here too."""
    x = rand(5 * 64, 9)  # per thread: one float copied alone, then four as one 16-byte copy
    before, after = np.zeros(5 * 64, np.float32), np.zeros(5 * 64, np.float32)
    run_kernel("""
  __shared__ __align__(16) float t[5 * FT_THREADS];
  float* const one = t + threadIdx.x;
  float* const four = t + FT_THREADS + 4 * threadIdx.x;
  *one = four[0] = four[1] = four[2] = four[3] = -1.0f;
  ft::Copies cp;
  cp.copy4(one, c->b0 + threadIdx.x);
  cp.copy16(four, c->b0 + FT_THREADS + 4 * threadIdx.x);
  for (int k = 0; k < 2; k++) {  /* k = 0: before the wait; 1: after it */
    if (k == 1) cp.wait();
    float* const out = k == 0 ? c->b1 : c->b2;
    out[threadIdx.x] = *one;
    for (int i = 0; i < 4; i++) out[FT_THREADS + 4 * threadIdx.x + i] = four[i];
  }""", x, before, after)
    np.testing.assert_array_equal(before, np.full(5 * 64, -1.0, np.float32))
    np.testing.assert_array_equal(after, x)


def _transposed(xs):
    return xs.map(lambda x: x.T * 2.0 + 1.0)


def test_a_transpose_not_read_by_a_gemm_reads_its_input_in_order():
    """x.T * 2 + 1 is no matmul operand: the transpose is a tile, written from x read in its
    own order (coalesced), then the elementwise pass."""
    prog = ft.compile(_transposed, spec(["N"], [5, 12]), target="cuda-emulated")
    body = prog.source.split("__device__ static void S_b0")[1].split("\\n}\\n")[0]
    assert "(_ef % 12)" in body.split("for (int _ef")[1].split("}")[0]  # the first loop walks x's rows
    for n in (1, 18):
        xs = flist([n], [5, 12], 10 + n)
        assert rel_error(prog(xs), _transposed(xs)) < 1e-6


@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_small_workloads_equal_eager_in_every_precision(name, precision):
    """The small preset at reduced precisions: tensor cores where its tiles allow (multiples of
    16), float32 GEMMs elsewhere; within the precision's tolerance of eager float32."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=13)
    prog = ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated", precision=precision)
    assert rel_error(prog(*inputs), mod.program(*inputs)) < TOLERANCE[precision]
