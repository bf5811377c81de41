"""The CUDA emulator (emit/emulate.hpp) and the tile library (emit/tiles.cuh) on hand-written
kernels: what the emulator must catch (a missing barrier, a barrier not all threads reach),
and each tile routine against numpy, with the tensor cores' rounding written differently
(numpy's float16, bf16 by truncating integers)."""
import numpy as np
import pytest

from polyft.emit.cuda_target import LIBRARY, PRELUDE
from polyft.emit.runtime_cuda import EmulatedBackend
from polyft.errors import DeviceError
from polyft.testing import rel_error

THREADS = 64


def run_kernel(body: str, *arrays, grid=(1,)):
    """Runs `body` as the kernel polyft_k0 with `c->b<k>` pointing at arrays[k] (float32)."""
    fields = " ".join(f"float* b{k};" for k in range(len(arrays)))
    source = (f"#define FT_THREADS {THREADS}\n{PRELUDE}\n{LIBRARY}\ntypedef struct {{ {fields} }} ctx_t;\n"
              f'extern "C" __global__ void polyft_k0(const ctx_t* __restrict__ c) {{\n{body}\n}}\n')
    backend = EmulatedBackend(source, [0])
    for a in arrays:
        assert a.dtype == np.float32 and a.flags.c_contiguous
    ctx = np.array([a.ctypes.data for a in arrays], dtype=np.uint64)
    backend.launch(0, grid, (ctx.ctypes.data,))


def _neighbour_kernel(barrier: bool) -> str:
    return f"""
  __shared__ float t[FT_THREADS];
  t[threadIdx.x] = c->b0[threadIdx.x] * 2;
  {"__syncthreads();" if barrier else ""}
  c->b1[threadIdx.x] = t[(threadIdx.x + 1) % FT_THREADS];"""


def test_a_barrier_makes_a_neighbours_write_visible():
    x, out = np.random.default_rng(0).standard_normal((2, THREADS)).astype(np.float32)
    run_kernel(_neighbour_kernel(True), x, out)
    np.testing.assert_array_equal(out, np.roll(x * 2, -1))


def test_a_missing_barrier_gives_a_wrong_result():
    """Threads run until they wait: without the barrier, thread t reads t+1's slot before
    t+1 has written it (the emulator is deterministic, so this fails every time)."""
    x = np.random.default_rng(1).standard_normal(THREADS).astype(np.float32)
    out = np.zeros(THREADS, np.float32)
    run_kernel(_neighbour_kernel(False), x, out)
    assert not np.array_equal(out, np.roll(x * 2, -1))


def test_a_barrier_in_divergent_code_is_reported():
    x = np.ones(THREADS, np.float32)
    with pytest.raises(DeviceError, match=r"block \(1, 0\).*barriers"):
        run_kernel("if (blockIdx.x == 1 && threadIdx.x < 32) __syncthreads();", x, grid=(2,))


def _other_block_kernel(barrier: bool) -> str:
    """Each block writes its slice, then reads the next block's (what a persistent kernel's
    next step does with the last step's results)."""
    return f"""
  c->b1[blockIdx.x * FT_THREADS + threadIdx.x] = c->b0[blockIdx.x * FT_THREADS + threadIdx.x] * 2;
  {"ft_grid_sync();" if barrier else ""}
  c->b2[blockIdx.x * FT_THREADS + threadIdx.x] = c->b1[((blockIdx.x + 1) % gridDim.x) * FT_THREADS + threadIdx.x];"""


@pytest.mark.parametrize("barrier", [True, False])
def test_a_grid_barrier_makes_another_blocks_write_visible(barrier):
    """The blocks of a grid run together: a block waits at the grid barrier until every block
    has reached it. Without it, block 0 runs to its end first and reads block 1's slice
    before block 1 has written it."""
    x = np.random.default_rng(3).standard_normal((3, THREADS)).astype(np.float32)
    mid, out = np.full_like(x, np.nan), np.full_like(x, np.nan)
    run_kernel(_other_block_kernel(barrier), x, mid, out, grid=(3,))
    assert np.array_equal(out, np.roll(x * 2, -1, axis=0)) == barrier


def test_a_grid_barrier_some_blocks_never_reach_is_reported():
    x = np.ones(THREADS, np.float32)
    with pytest.raises(DeviceError, match=r"block \(0, 0\).*grid barrier"):
        run_kernel("if (blockIdx.x == 0) ft_grid_sync();", x, grid=(2,))


def test_blocks_and_threads_cover_the_grid():
    out = np.zeros((3, 2, THREADS), np.float32)
    run_kernel("c->b0[(blockIdx.y * gridx + blockIdx.x) * FT_THREADS + threadIdx.x] = "
               "blockIdx.y * 1000 + blockIdx.x * 100 + threadIdx.x;".replace("gridx", "2"), out, grid=(2, 3))
    y, x, t = np.meshgrid(range(3), range(2), range(THREADS), indexing="ij")
    np.testing.assert_array_equal(out, y * 1000 + x * 100 + t)


def test_warp_sum_stays_within_each_warp():
    x = np.random.default_rng(2).standard_normal(THREADS).astype(np.float32)
    out = np.zeros(THREADS, np.float32)
    run_kernel("c->b1[threadIdx.x] = ft::warp_sum(c->b0[threadIdx.x]);", x, out)
    want = np.repeat(x.reshape(-1, 32).astype(np.float64).sum(1), 32)
    assert rel_error(out, want) < 1e-6


@pytest.mark.parametrize("rows, n", [(5, 7), (3, 100), (70, 33)])
def test_row_reductions_and_online_softmax(rows, n):
    rng = np.random.default_rng(rows * n)
    x = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
    x[0, : n // 2] = -np.inf  # masked entries, as attention masks leave them
    s, m, mean = (np.zeros(rows, np.float32) for _ in range(3))
    sm = np.zeros((rows, n), np.float32)
    run_kernel(f"""
  ft::reduce_rows<ft::Sum, {rows}, {n}, false>(c->b1, c->b5);
  ft::reduce_rows<ft::Max, {rows}, {n}, false>(c->b2, c->b0);
  ft::reduce_rows<ft::Sum, {rows}, {n}, true>(c->b3, c->b5);
  ft::softmax_rows<{rows}, {n}>(c->b4, c->b0);""", x, s, m, mean, sm, np.nan_to_num(x, neginf=0.0))
    finite = np.nan_to_num(x, neginf=0.0).astype(np.float64)
    assert rel_error(s, finite.sum(1)) < 1e-6
    np.testing.assert_array_equal(m, x.max(1))
    assert rel_error(mean, finite.mean(1)) < 1e-6
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    assert rel_error(sm, e / e.sum(1, keepdims=True)) < 1e-6


@pytest.mark.parametrize("P, K, Q", [(1, 8, 8), (5, 7, 300), (33, 16, 3), (64, 32, 64)])
def test_gemm_f32_and_its_accumulating_form(P, K, Q):
    rng = np.random.default_rng(P * K * Q)
    a, b, c0 = (rng.standard_normal(s).astype(np.float32) for s in ((P, K), (K, Q), (P, Q)))
    out, acc = np.zeros((P, Q), np.float32), c0.copy()
    run_kernel(f"ft::gemm_f32<{P}, {K}, {Q}, false>(c->b2, c->b0, c->b1); __syncthreads();\n"
               f"ft::gemm_f32<{P}, {K}, {Q}, true>(c->b3, c->b0, c->b1);", a, b, out, acc)
    want = a.astype(np.float64) @ b
    assert rel_error(out, want) < 1e-6
    assert rel_error(acc, want + c0) < 1e-6


def _bf16(x):
    """bf16 rounding (to nearest, ties to even) by integer arithmetic on the float32 bits."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def _tf32(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000
    return u.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("precision, element, rounding", [
    ("fp16", "__half", lambda x: x.astype(np.float16).astype(np.float32)),
    ("bf16", "__nv_bfloat16", _bf16),
    ("tf32", "nvcuda::wmma::precision::tf32", _tf32)])
@pytest.mark.parametrize("P, K, Q", [(16, 16, 16), (32, 48, 64), (48, 64, 16)])
def test_gemm_on_tensor_cores_rounds_operands_and_accumulates_in_float(precision, element, rounding, P, K, Q):
    rng = np.random.default_rng(P + K + Q)
    a, b, c0 = (rng.standard_normal(s).astype(np.float32) for s in ((P, K), (K, Q), (P, Q)))
    out, acc = np.zeros((P, Q), np.float32), c0.copy()
    run_kernel(f"__shared__ __align__(32) unsigned char stage[32 * ({P} + {Q})];\n"
               f"ft::gemm_tc<{element}, {P}, {K}, {Q}, false>(c->b2, c->b0, c->b1, stage); __syncthreads();\n"
               f"ft::gemm_tc<{element}, {P}, {K}, {Q}, true>(c->b3, c->b0, c->b1, stage);", a, b, out, acc)
    want = rounding(a).astype(np.float64) @ rounding(b)
    assert rel_error(out, want) < 1e-6  # only the float32 accumulation order differs
    assert rel_error(acc, want + c0) < 1e-6
    assert rel_error(out, a.astype(np.float64) @ b) > 1e-6  # the operands really were rounded


@pytest.mark.parametrize("n, nb", [(8, 3), (6, 4), (12, 0)])
def test_gather_tiles_side_by_side_with_zeros_after_the_batch(n, nb):
    x = np.random.default_rng(n).standard_normal((5, n)).astype(np.float32)
    out = np.full((4, n), np.nan, np.float32)
    run_kernel(f"""
  const float* src[4];
  for (int b = 0; b < 4; b++) src[b] = c->b0 + ((3 * b + 1) % 5) * {n};
  ft::gather_tiles<float, 4, {n}>(c->b1, src, {nb});""", x, out)
    want = np.zeros((4, n), np.float32)
    want[:nb] = x[[(3 * b + 1) % 5 for b in range(nb)]]
    np.testing.assert_array_equal(out, want)
