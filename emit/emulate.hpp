/* The CUDA emulator: the generated .cu compiled as CPU C++ (target "cuda-emulated").

   A block's threads are fibers (ucontext) run one at a time by a scheduler that switches only
   at barriers, so a run is deterministic: a thread runs until it waits, the next one starts.
   That makes missing barriers show up as wrong results (a thread reads a tile its neighbour
   has not written yet) and barriers some threads never reach show up as a reported deadlock,
   instead of a hang on the GPU. Warp-level primitives (shuffles, __syncwarp, WMMA) wait at a
   barrier of the warp's 32 lanes; WMMA fragments hold the whole 16x16 tile in every lane, with
   operands rounded to the fragment's precision (fp16, bf16, tf32) as on the tensor cores.

   The generated source follows this header; ft_launch runs a kernel's grid, block by block. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

struct polyft_dim3 { unsigned x, y, z; };
enum { FT_MAX_THREADS = 1024, FT_MAX_WARPS = FT_MAX_THREADS / 32, FT_STACK = 1 << 18 };
static polyft_dim3 blockIdx, threadIdx;
static int ft_nthreads;  /* of the block being run */
#define blockDim (polyft_dim3{(unsigned)ft_nthreads, 1, 1})
struct float4 { float x, y, z, w; };
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

/* -- the scheduler ------------------------------------------------------------------------ */
static ucontext_t ft_main, ft_fiber[FT_MAX_THREADS];
static char* ft_stacks[FT_MAX_THREADS];
static int ft_done[FT_MAX_THREADS], ft_waiting[FT_MAX_THREADS], ft_wait_group[FT_MAX_THREADS],
    ft_wait_gen[FT_MAX_THREADS];
static int ft_arrived[1 + FT_MAX_WARPS], ft_generation[1 + FT_MAX_WARPS];
static void (*ft_body)(void*);
static void* ft_body_arg;

/* group 0: the block; group 1 + w: warp w */
static void ft_barrier(int group, int size) {
  const int me = threadIdx.x;
  if (++ft_arrived[group] == size) {  /* the last to arrive releases the others */
    ft_arrived[group] = 0;
    ft_generation[group]++;
    return;
  }
  ft_waiting[me] = 1;
  ft_wait_group[me] = group;
  ft_wait_gen[me] = ft_generation[group];
  swapcontext(&ft_fiber[me], &ft_main);
  threadIdx.x = me;
}

static int ft_warp_size(int me) {
  const int first = me / 32 * 32;
  return ft_nthreads - first < 32 ? ft_nthreads - first : 32;
}
#define __syncthreads() ft_barrier(0, ft_nthreads)
#define __syncwarp(...) ft_barrier(1 + threadIdx.x / 32, ft_warp_size(threadIdx.x))

static void ft_entry(int t) {
  ft_body(ft_body_arg);
  ft_done[t] = 1;
}

/* Runs one block; returns 0, or -1 when its threads wait at barriers that can never open. */
static int ft_run_block(void (*body)(void*), void* arg, int nthreads) {
  ft_nthreads = nthreads;
  ft_body = body;
  ft_body_arg = arg;
  memset(ft_arrived, 0, sizeof ft_arrived);
  memset(ft_generation, 0, sizeof ft_generation);
  for (int t = 0; t < nthreads; t++) {
    if (!ft_stacks[t]) ft_stacks[t] = (char*)malloc(FT_STACK);
    getcontext(&ft_fiber[t]);
    ft_fiber[t].uc_stack.ss_sp = ft_stacks[t];
    ft_fiber[t].uc_stack.ss_size = FT_STACK;
    ft_fiber[t].uc_link = &ft_main;
    makecontext(&ft_fiber[t], (void (*)(void))ft_entry, 1, t);
    ft_done[t] = ft_waiting[t] = 0;
  }
  for (int finished = 0; finished < nthreads;) {
    int progress = 0;
    for (int t = 0; t < nthreads; t++) {
      if (ft_done[t] || (ft_waiting[t] && ft_generation[ft_wait_group[t]] == ft_wait_gen[t])) continue;
      ft_waiting[t] = 0;
      threadIdx.x = t;
      progress = 1;
      swapcontext(&ft_main, &ft_fiber[t]);
      finished += ft_done[t];
    }
    if (!progress) return -1;
  }
  return 0;
}

/* Runs a kernel's grid (trampoline(arg) calls it); returns 0, or 1 + the first block (x + y
   * gx) whose threads deadlocked at a barrier. */
static int ft_launch(void (*trampoline)(void*), void* arg, long gx, long gy, int nthreads) {
  for (long y = 0; y < gy; y++)
    for (long x = 0; x < gx; x++) {
      blockIdx.x = (unsigned)x;
      blockIdx.y = (unsigned)y;
      if (ft_run_block(trampoline, arg, nthreads)) return (int)(1 + x + y * gx);
    }
  return 0;
}

/* -- warp shuffles ------------------------------------------------------------------------ */
static double ft_lanes[FT_MAX_THREADS];

template <typename T>
static T __shfl_xor_sync(unsigned, T v, int mask) {
  const int me = threadIdx.x, other = me ^ mask;
  ft_lanes[me] = (double)v;
  __syncwarp();
  const T r = other / 32 == me / 32 && other < ft_nthreads ? (T)ft_lanes[other] : v;
  __syncwarp();
  return r;
}

/* -- reduced precisions ------------------------------------------------------------------- */
struct __half {
  _Float16 h;
  __half() : h(0) {}
  __half(float f) : h((_Float16)f) {}
  operator float() const { return (float)h; }
};
static inline __half __float2half(float f) { return __half(f); }
static inline float __half2float(__half h) { return (float)h; }

static inline float ft_round_mantissa(float f, int drop) { /* round to nearest even, `drop` bits */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + ((1u << (drop - 1)) - 1) + ((u >> drop) & 1)) & ~((1u << drop) - 1);
  memcpy(&f, &u, 4);
  return f;
}
struct __nv_bfloat16 {  /* the upper half of a float's bits, rounded */
  uint16_t bits;
  __nv_bfloat16() : bits(0) {}
  __nv_bfloat16(float x) {
    x = ft_round_mantissa(x, 16);
    uint32_t u;
    memcpy(&u, &x, 4);
    bits = (uint16_t)(u >> 16);
  }
  operator float() const {
    const uint32_t u = (uint32_t)bits << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
  }
};
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }

/* -- WMMA --------------------------------------------------------------------------------- */
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision { struct tf32 {}; }
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K> struct shape_of { enum { rows = M, cols = K }; };
template <int M, int N, int K> struct shape_of<matrix_b, M, N, K> { enum { rows = K, cols = N }; };
template <int M, int N, int K> struct shape_of<accumulator, M, N, K> { enum { rows = M, cols = N }; };
template <typename L> struct is_col { enum { value = 0 }; };
template <> struct is_col<col_major> { enum { value = 1 }; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  enum { rows = shape_of<Use, M, N, K>::rows, cols = shape_of<Use, M, N, K>::cols, num_elements = rows * cols };
  float x[num_elements];  /* the whole tile, row-major, in every lane */
};

/* what an element of precision T keeps of a float (tf32 operands are rounded by the caller,
   with __float_to_tf32, as on the GPU) */
template <typename T> static inline float keep(float f) { return (float)T(f); }
template <> inline float keep<precision::tf32>(float f) { return f; }
static inline float __float_to_tf32(float f) { return ft_round_mantissa(f, 13); }

template <typename F, typename S>
static void ft_load(F& a, const S* p, unsigned ldm, bool col) {
  __syncwarp();
  for (int r = 0; r < F::rows; r++)
    for (int c = 0; c < F::cols; c++) a.x[r * F::cols + c] = (float)p[col ? c * ldm + r : r * ldm + c];
  __syncwarp();
}
template <typename Use, int M, int N, int K, typename T, typename L, typename S>
static void load_matrix_sync(fragment<Use, M, N, K, T, L>& a, const S* p, unsigned ldm) {
  ft_load(a, p, ldm, is_col<L>::value);
  for (int e = 0; e < a.num_elements; e++) a.x[e] = keep<T>(a.x[e]);
}
template <int M, int N, int K>
static void load_matrix_sync(fragment<accumulator, M, N, K, float>& a, const float* p, unsigned ldm, layout_t l) {
  ft_load(a, p, ldm, l == mem_col_major);
}
template <int M, int N, int K>
static void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& a, unsigned ldm, layout_t l) {
  __syncwarp();
  for (int r = 0; r < M; r++)
    for (int c = 0; c < N; c++) p[l == mem_col_major ? c * ldm + r : r * ldm + c] = a.x[r * N + c];
  __syncwarp();
}
template <typename Use, int M, int N, int K, typename T, typename L>
static void fill_fragment(fragment<Use, M, N, K, T, L>& a, float v) {
  for (int e = 0; e < a.num_elements; e++) a.x[e] = v;
}
template <int M, int N, int K, typename T, typename LA, typename LB>
static void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
                     const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  __syncwarp();
  float out[M * N];
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      float acc = c.x[m * N + n];
      for (int k = 0; k < K; k++) acc += a.x[m * K + k] * b.x[k * N + n];
      out[m * N + n] = acc;
    }
  memcpy(d.x, out, sizeof out);
  __syncwarp();
}
}  // namespace wmma
}  // namespace nvcuda
