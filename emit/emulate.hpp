/* The CUDA emulator: the generated .cu compiled as CPU C++ (target "cuda-emulated").

   A block's threads are fibers (ucontext) run one at a time by a scheduler that switches only
   at barriers, so a run is deterministic: a thread runs until it waits, the next one starts.
   That makes missing barriers show up as wrong results (a thread reads a tile its neighbour
   has not written yet) and barriers some threads never reach show up as a reported deadlock,
   instead of a hang on the GPU. Warp-level primitives (shuffles, __syncwarp, WMMA) wait at a
   barrier of the warp's 32 lanes; WMMA fragments hold the whole 16x16 tile in every lane, with
   operands rounded to the fragment's precision (fp16, bf16, tf32) as on the tensor cores.

   The blocks of a grid run together (the scheduler below), so the persistent kernel's grid
   barrier is a barrier too: a block that reads what another wrote in the step before sees it
   only after the barrier, and a barrier not every block reaches is reported as a deadlock.
   The generated source follows this header; ft_launch runs a kernel's grid. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

struct polyft_dim3 { unsigned x, y, z; };
enum { FT_MAX_THREADS = 1024, FT_MAX_WARPS = FT_MAX_THREADS / 32, FT_GROUPS = 1 + FT_MAX_WARPS,
       FT_MAX_FIBERS = 16384, FT_STACK = 1 << 18, FT_TOO_MANY = -(1 << 30) };
static polyft_dim3 blockIdx, threadIdx, gridDim;
static int ft_nthreads;  /* per block */
#define blockDim (polyft_dim3{(unsigned)ft_nthreads, 1, 1})
struct float4 { float x, y, z, w; };
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

/* -- the scheduler ------------------------------------------------------------------------
   Every thread of every block of the grid is a fiber. Block by block, the scheduler runs the
   block's threads until each has finished or waits at the grid barrier (switching among them
   at block and warp barriers), then the next block's; when every thread waits at the grid
   barrier it opens. A block's shared memory is the one arena (registered by the generated
   source): the scheduler keeps a copy per block and swaps them when it changes block. */
struct ft_thread {
  ucontext_t context;
  int block, done, waiting, group, generation;
};
static ucontext_t ft_main;
static ft_thread* ft_threads;
static char* ft_stacks[FT_MAX_FIBERS];
static int ft_self;  /* the running fiber */
static int *ft_arrived, *ft_generation;  /* per group: 0, the grid; 1 + block * FT_GROUPS, the block; then its warps */
static long ft_total;  /* threads in the grid */
static void (*ft_body)(void*);
static void* ft_body_arg;
static unsigned char* ft_arena_at;
static size_t ft_arena_bytes;
static int ft_in_thread;  /* 1 while a thread fiber runs (0: the scheduler, e.g. swapping arenas) */
static void (*ft_on_launch)(long blocks, int nthreads);  /* an instrumented build's (emit/race_check.py) */

static int ft_register_arena(unsigned char* arena, size_t n) {
  ft_arena_at = arena;
  ft_arena_bytes = n;
  return 0;
}

static long ft_grid_opened;  /* grid barriers passed, all launches (the profile's count is checked against it) */
static void ft_wait(int group, long size) {
  if (++ft_arrived[group] == size) {  /* the last to arrive releases the others */
    ft_arrived[group] = 0;
    ft_generation[group]++;
    ft_grid_opened += group == 0;
    return;
  }
  const int me = ft_self;
  ft_threads[me].waiting = 1;
  ft_threads[me].group = group;
  ft_threads[me].generation = ft_generation[group];
  swapcontext(&ft_threads[me].context, &ft_main);
}

static int ft_warp_size(int t) {
  const int first = t / 32 * 32;
  return ft_nthreads - first < 32 ? ft_nthreads - first : 32;
}
static int ft_block_group() { return 1 + ft_threads[ft_self].block * FT_GROUPS; }
#define __syncthreads() ft_wait(ft_block_group(), ft_nthreads)
#define __syncwarp(...) ft_wait(ft_block_group() + 1 + threadIdx.x / 32, ft_warp_size(threadIdx.x))
/* the persistent kernel's grid barrier: every thread of the grid */
static void ft_grid_sync() { ft_wait(0, ft_total); }

static void ft_entry(int t) {
  ft_body(ft_body_arg);
  ft_threads[t].done = 1;
}

static int ft_blocked(const ft_thread& th) {
  return th.done || (th.waiting && ft_generation[th.group] == th.generation);
}

/* Runs a kernel's grid (trampoline(arg) calls it), its blocks' threads together. Returns 0;
   1 + a block (x + y * gx) whose threads wait at a block or warp barrier that the others
   never reach; or -(1 + a block) whose threads wait at a grid barrier that other threads
   never reach (they finished: a grid barrier in code not every block runs); FT_TOO_MANY
   when the grid has more than FT_MAX_FIBERS threads. */
static int ft_launch(void (*trampoline)(void*), void* arg, long gx, long gy, int nthreads) {
  const long blocks = gx * gy;
  ft_total = blocks * nthreads;
  if (ft_total > FT_MAX_FIBERS) return FT_TOO_MANY;
  ft_nthreads = nthreads;
  ft_body = trampoline;
  ft_body_arg = arg;
  gridDim = polyft_dim3{(unsigned)gx, (unsigned)gy, 1};
  ft_threads = (ft_thread*)calloc(ft_total, sizeof(ft_thread));
  ft_arrived = (int*)calloc(1 + blocks * FT_GROUPS, sizeof(int));
  ft_generation = (int*)calloc(1 + blocks * FT_GROUPS, sizeof(int));
  unsigned char* saved = ft_arena_bytes ? (unsigned char*)malloc(blocks * ft_arena_bytes) : 0;
  if (saved) memset(saved, 0xff, blocks * ft_arena_bytes);  /* NaNs: a read before a write shows */
  for (long t = 0; t < ft_total; t++) {
    if (!ft_stacks[t]) ft_stacks[t] = (char*)malloc(FT_STACK);
    ft_threads[t].block = (int)(t / nthreads);
    getcontext(&ft_threads[t].context);
    ft_threads[t].context.uc_stack.ss_sp = ft_stacks[t];
    ft_threads[t].context.uc_stack.ss_size = FT_STACK;
    ft_threads[t].context.uc_link = &ft_main;
    makecontext(&ft_threads[t].context, (void (*)(void))ft_entry, 1, (int)t);
  }
  if (ft_on_launch) ft_on_launch(blocks, nthreads);
  int result = 0;
  long current = -1;  /* the block whose shared memory is in the arena */
  for (long finished = 0; finished < ft_total;) {
    int progress = 0;
    for (long b = 0; b < blocks; b++) {
      for (int ran = 1; ran;) {  /* the block's threads, until none can go on */
        ran = 0;
        for (long t = b * nthreads; t < (b + 1) * nthreads; t++) {
          if (ft_blocked(ft_threads[t])) continue;
          if (saved && current != b) {
            if (current >= 0) memcpy(saved + current * ft_arena_bytes, ft_arena_at, ft_arena_bytes);
            memcpy(ft_arena_at, saved + b * ft_arena_bytes, ft_arena_bytes);
            current = b;
          }
          ft_threads[t].waiting = 0;
          ft_self = (int)t;
          threadIdx = polyft_dim3{(unsigned)(t % nthreads), 0, 0};
          blockIdx = polyft_dim3{(unsigned)(b % gx), (unsigned)(b / gx), 0};
          ft_in_thread = 1;
          swapcontext(&ft_main, &ft_threads[t].context);
          ft_in_thread = 0;
          finished += ft_threads[t].done;
          ran = progress = 1;
        }
      }
    }
    if (!progress) {  /* a deadlock: which barrier */
      for (long t = 0; t < ft_total && !result; t++)
        if (!ft_threads[t].done && ft_threads[t].group != 0) result = 1 + ft_threads[t].block;
      for (long t = 0; t < ft_total && !result; t++)
        if (!ft_threads[t].done) result = -(1 + ft_threads[t].block);
      break;
    }
  }
  free(saved);
  free(ft_threads);
  free(ft_arrived);
  free(ft_generation);
  return result;
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
static inline __half __float2half_rn(float f) { return __half(f); }  /* _Float16: to nearest even */
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
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
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
  if (threadIdx.x % 32 == 0)  /* every lane holds the whole tile: one stores it (so no lanes race) */
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
