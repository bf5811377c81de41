/* polyft's CUDA tile library: the cooperative building blocks the generated statement
   functions call. Every function is executed by all FT_THREADS threads of a block (a
   multiple of 32, defined by the generated source) on tiles in shared or global memory,
   row-major and contiguous; the caller puts a barrier after each call. */
#ifndef FT_EMULATED
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif

namespace ft {

/* Cooperative tile loader: all threads copy a tile from global to shared memory, in float4
   steps when both ends are 16-byte aligned, then wait for each other. */
template <typename T>
__device__ __forceinline__ void load_tile(T* __restrict__ dst, const T* __restrict__ src, int n) {
  if (sizeof(T) == 4 && n % 4 == 0 && ((uintptr_t)src % 16) == 0 && ((uintptr_t)dst % 16) == 0) {
    const float4* s4 = reinterpret_cast<const float4*>(src);
    float4* d4 = reinterpret_cast<float4*>(dst);
    for (int e = threadIdx.x; e < n / 4; e += FT_THREADS) d4[e] = s4[e];
  } else {
    for (int e = threadIdx.x; e < n; e += FT_THREADS) dst[e] = src[e];
  }
  __syncthreads();
}

/* Cooperative gather: the tiles of N elements at src[0..nb-1] (one per instance of a
   batch) side by side into dst, zeros for instances nb..TB-1; float4 steps where aligned. */
template <typename T, int TB, int N>
__device__ __forceinline__ void gather_tiles(T* __restrict__ dst, const T* const* src, int nb) {
  constexpr int V = sizeof(T) == 4 && N % 4 == 0 ? 4 : 1;  /* elements a thread moves at once */
  for (int e = threadIdx.x; e < TB * N / V; e += FT_THREADS) {
    const int b = e / (N / V), k = e % (N / V);
    if (V == 4 && ((uintptr_t)dst % 16) == 0 && (b >= nb || ((uintptr_t)src[b] % 16) == 0)) {
      float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
      if (b < nb) v = reinterpret_cast<const float4*>(src[b])[k];
      reinterpret_cast<float4*>(dst)[e] = v;
    } else {
      for (int i = 0; i < V; i++) dst[e * V + i] = b < nb ? src[b][k * V + i] : T(0);
    }
  }
  __syncthreads();
}

/* -- row reductions: one warp per row, lanes strided over it, then a butterfly ---------- */
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);  /* every lane shuffles once: not inside the macro */
    v = ft_maximum(v, w);  /* NaN wins */
  }
  return v;
}
struct Sum {
  static __device__ __forceinline__ float init() { return 0.0f; }
  static __device__ __forceinline__ float step(float acc, float x) { return acc + x; }
  static __device__ __forceinline__ float warp(float v) { return warp_sum(v); }
};
struct Max {
  static __device__ __forceinline__ float init() { return -INFINITY; }
  static __device__ __forceinline__ float step(float acc, float x) { return ft_maximum(x, acc); }
  static __device__ __forceinline__ float warp(float v) { return warp_max(v); }
};

/* out[r] = Op over x[r, 0..N-1] for r < ROWS (divided by N when MEAN) */
template <typename Op, int ROWS, int N, bool MEAN>
__device__ void reduce_rows(float* __restrict__ out, const float* __restrict__ x) {
  const int lane = threadIdx.x % 32;
  for (int r = threadIdx.x / 32; r < ROWS; r += FT_THREADS / 32) {
    float acc = Op::init();
    for (int e = lane; e < N; e += 32) acc = Op::step(acc, x[r * N + e]);
    acc = Op::warp(acc);
    if (lane == 0) out[r] = MEAN ? acc / N : acc;
  }
}

/* Online softmax (Milakov & Gimelshein): one pass keeps each lane's running maximum m and
   the sum s of exp(x - m), rescaling s whenever m grows; lanes merge their (m, s) pairs by
   the same rule; a second pass writes exp(x - m) / s. */
__device__ __forceinline__ void softmax_merge(float& m, float& s, float m2, float s2) {
  const float m_new = ft_maximum(m, m2);  /* a NaN makes the row NaN, as numpy's softmax */
  s = m_new == -INFINITY ? 0.0f : s * expf(m - m_new) + s2 * expf(m2 - m_new);
  m = m_new;
}
template <int ROWS, int N>
__device__ void softmax_rows(float* __restrict__ out, const float* __restrict__ x) {
  const int lane = threadIdx.x % 32;
  for (int r = threadIdx.x / 32; r < ROWS; r += FT_THREADS / 32) {
    float m = -INFINITY, s = 0.0f;
    for (int e = lane; e < N; e += 32) softmax_merge(m, s, x[r * N + e], 1.0f);
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      softmax_merge(m, s, m2, s2);
    }
    for (int e = lane; e < N; e += 32) out[r * N + e] = expf(x[r * N + e] - m) / s;
  }
}

/* -- GEMM in float32 -------------------------------------------------------------------- */
/* out[P, Q] = (or +=, ACC) a[P, K] @ b[K, Q]. Thread t owns column q = t % QT (QT threads
   along q: b is read coalesced, once per R rows) and rows t / QT + i * RG, R of them in
   registers at a time; a's element is the same across a warp (a broadcast). */
template <int P, int K, int Q, bool ACC>
__device__ void gemm_f32(float* __restrict__ out, const float* __restrict__ a, const float* __restrict__ b) {
  constexpr int QT = Q < FT_THREADS ? Q : FT_THREADS;
  constexpr int RG = FT_THREADS / QT;
  constexpr int R0 = (P + RG - 1) / RG;
  constexpr int R = R0 < 8 ? R0 : 8;
  const int rg = threadIdx.x / QT;
  if (rg >= RG) return;
  for (int q = threadIdx.x % QT; q < Q; q += QT)
    for (int p0 = rg; p0 < P; p0 += R * RG) {
      float acc[R];
      for (int i = 0; i < R; i++) acc[i] = 0.0f;
      for (int m = 0; m < K; m++) {
        const float w = b[m * Q + q];
        for (int i = 0; i < R; i++) {
          const int p = p0 + i * RG < P ? p0 + i * RG : P - 1;  /* past the end: recomputed, not stored */
          acc[i] += a[p * K + m] * w;
        }
      }
      for (int i = 0; i < R; i++) {
        const int p = p0 + i * RG;
        if (p < P) out[p * Q + q] = ACC ? out[p * Q + q] + acc[i] : acc[i];
      }
    }
}

/* -- GEMM on tensor cores (WMMA) -------------------------------------------------------- */
/* Per operand precision: the element staged in shared memory, the WMMA fragment type, its k
   extent, and the rounding tf32 needs after a fragment load. */
template <typename H> struct Precision {  /* fp16 and bf16: staged and multiplied as H */
  typedef H elem;
  typedef H frag;
  enum { K = 16 };
  static __device__ __forceinline__ H convert(float f) { return H(f); }
  template <typename F> static __device__ __forceinline__ void round(F&) {}
};
template <> struct Precision<nvcuda::wmma::precision::tf32> {
  typedef float elem;
  typedef nvcuda::wmma::precision::tf32 frag;
  enum { K = 8 };
  static __device__ __forceinline__ float convert(float f) { return f; }
  template <typename F> static __device__ __forceinline__ void round(F& f) {
    for (int e = 0; e < f.num_elements; e++) f.x[e] = nvcuda::wmma::__float_to_tf32(f.x[e]);
  }
};

/* out[P, Q] = (or +=, ACC) a[P, K] @ b[K, Q], with P, Q multiples of 16 and K of the
   fragment's k: all threads convert KC columns of a and rows of b into shared memory
   (`stage`, 32 * (P + Q) bytes, 32-byte aligned), then each warp multiplies them into the
   accumulators of its 16x16 output tiles, which stay in registers for the whole of K and
   are stored (float) once. */
template <typename T, int P, int K, int Q, bool ACC>
__device__ void gemm_tc(float* __restrict__ out, const float* __restrict__ a, const float* __restrict__ b,
                        unsigned char* stage) {
  namespace wmma = nvcuda::wmma;
  typedef Precision<T> Pr;
  constexpr int KC = Pr::K, TQ = Q / 16, TILES = (P / 16) * TQ, WARPS = FT_THREADS / 32;
  constexpr int PER = (TILES + WARPS - 1) / WARPS;
  static_assert(KC * sizeof(typename Pr::elem) == 32, "a staged row is 32 bytes");
  typename Pr::elem* const sa = reinterpret_cast<typename Pr::elem*>(stage);
  typename Pr::elem* const sb = sa + P * KC;
  const int warp = threadIdx.x / 32;
  wmma::fragment<wmma::accumulator, 16, 16, Pr::K, float> acc[PER];
  for (int i = 0; i < PER; i++) {
    const int t = warp + i * WARPS;
    if (t >= TILES) continue;
    if (ACC)
      wmma::load_matrix_sync(acc[i], out + (t / TQ) * 16 * Q + (t % TQ) * 16, Q, wmma::mem_row_major);
    else
      wmma::fill_fragment(acc[i], 0.0f);
  }
  for (int k0 = 0; k0 < K; k0 += KC) {
    __syncthreads();  /* the last stage has been multiplied */
    for (int e = threadIdx.x; e < P * KC; e += FT_THREADS) sa[e] = Pr::convert(a[(e / KC) * K + k0 + e % KC]);
    for (int e = threadIdx.x; e < KC * Q; e += FT_THREADS) sb[e] = Pr::convert(b[(k0 + e / Q) * Q + e % Q]);
    __syncthreads();
    for (int i = 0; i < PER; i++) {
      const int t = warp + i * WARPS;
      if (t >= TILES) continue;
      wmma::fragment<wmma::matrix_a, 16, 16, Pr::K, typename Pr::frag, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, Pr::K, typename Pr::frag, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, sa + (t / TQ) * 16 * KC, KC);
      wmma::load_matrix_sync(fb, sb + (t % TQ) * 16, Q);
      Pr::round(fa);
      Pr::round(fb);
      wmma::mma_sync(acc[i], fa, fb, acc[i]);
    }
  }
  for (int i = 0; i < PER; i++) {
    const int t = warp + i * WARPS;
    if (t < TILES) wmma::store_matrix_sync(out + (t / TQ) * 16 * Q + (t % TQ) * 16, acc[i], Q, wmma::mem_row_major);
  }
}

}  // namespace ft
