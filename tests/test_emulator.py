"""The CUDA emulator (emit/emulate.hpp) and the tile library (emit/tiles.cuh) on hand-written
kernels: what the emulator must catch (a missing barrier, a barrier not all threads reach),
and the tile library's reductions against numpy (its GEMMs: tests/test_cuda_tiles.py)."""
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
