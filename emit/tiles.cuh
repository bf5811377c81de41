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

/* -- element types -------------------------------------------------------------------------
   Under precision fp16 or bf16 the buffers in global memory hold __half or __nv_bfloat16 (the
   target's "narrow" buffers); tiles in shared memory and all arithmetic stay float. A load of a
   narrow buffer is an In<H>: indexing it reads a float, so every operation reads it as it
   reads a float tile; the GEMMs stage its halves as they are. */
template <typename A, typename B> struct same { enum { value = 0 }; };
template <typename A> struct same<A, A> { enum { value = 1 }; };
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T narrow(float x);
template <> __device__ __forceinline__ float narrow<float>(float x) { return x; }
template <> __device__ __forceinline__ __half narrow<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename H>
struct In {
  const H* p;
  __device__ __forceinline__ float operator[](long i) const { return widen(p[i]); }
  __device__ __forceinline__ In operator+(long i) const { return In{p + i}; }
  __device__ __forceinline__ bool operator==(const In& o) const { return p == o.p; }
};
/* the element pointer of a load: a float tile's, or a narrow load's */
__device__ __forceinline__ const float* ptr(const float* p) { return p; }
template <typename H> __device__ __forceinline__ const H* ptr(const In<H>& x) { return x.p; }

/* -- global memory ------------------------------------------------------------------------
   Every read of global memory by the tile library is one of a thread's Copies into shared
   memory: asynchronous (cp.async, sm_80 and later) from global memory, plain loads from shared
   memory (a source the statement computed). `wait` returns once this thread's copies have
   landed; a barrier after it makes everyone's visible. The emulator performs the copies only
   at `wait` (the latest a GPU may land them), so reading a chunk before waiting for it gives
   wrong results there too. */
struct Copies {
#ifdef FT_EMULATED
  enum { MAX = 256 };
  struct Copy { char* dst; const char* src; int n, size; } pending[MAX];
  int count = 0;
  void copy(void* dst, const void* src, int n, int size) {
    if (count == MAX) wait();  /* landing early is allowed */
    pending[count++] = Copy{(char*)dst, (const char*)src, n, size};
  }
  template <typename T> void copy16(T* dst, const T* src) { copy(dst, src, 16 / sizeof(T), sizeof(T)); }
  void copy4(float* dst, const float* src) { copy(dst, src, 1, 4); }
  void wait() {  /* element by element: loads and stores the traffic count instruments */
    for (int i = 0; i < count; i++) {
      const Copy& c = pending[i];
      for (int e = 0; e < c.n; e++) {
        if (c.size == 4) ((float*)c.dst)[e] = ((const float*)c.src)[e];
        else ((uint16_t*)c.dst)[e] = ((const uint16_t*)c.src)[e];
      }
    }
    count = 0;
  }
#else
  template <typename T>
  __device__ __forceinline__ void copy16(T* dst, const T* src) {  /* both 16-byte aligned */
#if __CUDA_ARCH__ >= 800
    if (__isGlobal(src)) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
      return;
    }
#endif
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  }
  __device__ __forceinline__ void copy4(float* dst, const float* src) {
#if __CUDA_ARCH__ >= 800
    if (__isGlobal(src)) {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
      return;
    }
#endif
    *dst = *src;
  }
  __device__ __forceinline__ void wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::);
#endif
  }
#endif
};

/* Matrix operands of the GEMMs, by rows (any memory) of elements T: row r of a row-major
   matrix (`rows(load or tile, ld)`) ... */
template <typename T>
struct RowsOf {
  typedef T elem;
  const T* p;
  int ld;
  __device__ __forceinline__ const T* row(int r) const { return p + (long)r * ld; }
};
typedef RowsOf<float> Rows;
__device__ __forceinline__ Rows rows(const float* p, int ld) { return Rows{p, ld}; }
template <typename H> __device__ __forceinline__ RowsOf<H> rows(const In<H>& x, int ld) { return RowsOf<H>{x.p, ld}; }
/* ... or of a batch's instances side by side: instance b's P rows at src[b] + off (ld apart;
   src: the batch's loads, of type S), no rows (zeros) for the instances nb.. past the end of
   the batch */
template <typename S> struct load_elem;
template <> struct load_elem<const float*> { typedef float type; };
template <typename H> struct load_elem<In<H>> { typedef H type; };
template <int P, typename S = const float*>
struct Batch {
  typedef typename load_elem<S>::type elem;
  const S* src;
  int nb, ld, off;
  __device__ __forceinline__ const elem* row(int r) const {
    return r / P < nb ? ptr(src[r / P]) + off + (long)(r % P) * ld : nullptr;
  }
};

/* One element of a staged tile from a source element: a float copied asynchronously, any
   other (a narrow source at the edge of a tile, or read as float) loaded and converted. */
__device__ __forceinline__ void put(Copies& cp, float* d, const float* s) { cp.copy4(d, s); }
template <typename D, typename S>
__device__ __forceinline__ void put(Copies&, D* d, const S* s) { *d = narrow<D>(widen(*s)); }

/* Cooperative staging: rows r0..r0+R-1 and columns c0..c0+C-1 of matrix m into dst (elements
   D, row stride LD), zeros past its nrows x ncols; 16 bytes a copy where the source holds D
   too and is aligned, else element by element, converted. */
template <int R, int C, int LD, typename D, typename M>
__device__ __forceinline__ void stage_tile(Copies& cp, D* __restrict__ dst, const M& m, int r0, int c0, int nrows,
                                           int ncols) {
  typedef typename M::elem S;
  enum { V = 16 / sizeof(D) };
  static_assert(C % V == 0 && LD % V == 0, "staged rows are 16-byte vectors");
  for (int e = threadIdx.x; e < R * C / V; e += FT_THREADS) {
    const int r = e / (C / V), c = e % (C / V) * V;
    D* d = dst + r * LD + c;
    const S* s = r0 + r < nrows ? m.row(r0 + r) : nullptr;
    if (s != nullptr) s += c0 + c;
    if (same<S, D>::value && s != nullptr && c0 + c + V <= ncols && (uintptr_t)s % 16 == 0) {
      cp.copy16(d, reinterpret_cast<const D*>(s));
    } else {
      for (int i = 0; i < V; i++) {
        if (s != nullptr && c0 + c + i < ncols) put(cp, d + i, s + i);
        else d[i] = narrow<D>(0.0f);
      }
    }
  }
}

/* The K-chunks of a GEMM's two operands in shared memory, double-buffered, of elements DA and
   DB: a[P, K] as BM x BK blocks (row stride LA), b[K, Q] as BK x BN blocks (row stride LB),
   or, when TRANS (b is x.T for a row-major x[Q, K], read along its rows: coalesced), x's BN x
   BK blocks. Rows are padded by 16 bytes (4 floats, 8 halves): they stay 16-byte aligned and
   each row starts 4 banks on, so 8 threads reading 16 bytes of 8 rows hit 32 different banks. */
template <int BM, int BN, int BK, bool TRANS, typename DA = float, typename DB = float>
struct Chunks {
  enum { LA = BK + 16 / sizeof(DA), LB = (TRANS ? BK : BN) + 16 / sizeof(DB), A = BM * LA, B = (TRANS ? BN : BK) * LB,
         ABYTES = A * sizeof(DA), BBYTES = B * sizeof(DB), BYTES = (2 * (ABYTES + BBYTES) + 31) / 32 * 32 };
  unsigned char* base;
  __device__ __forceinline__ DA* a(int c) const { return reinterpret_cast<DA*>(base + (c % 2) * (ABYTES + BBYTES)); }
  __device__ __forceinline__ DB* b(int c) const {
    return reinterpret_cast<DB*>(base + (c % 2) * (ABYTES + BBYTES) + ABYTES);
  }
  /* chunk c of the block tile at (m0, n0) into buffer c % 2 */
  template <int P, int K, int Q, typename MA, typename MB>
  __device__ __forceinline__ void load(Copies& cp, int c, const MA& ma, const MB& mb, int m0, int n0) const {
    stage_tile<BM, BK, LA>(cp, a(c), ma, m0, c * BK, P, K);
    if (TRANS) stage_tile<BN, BK, LB>(cp, b(c), mb, n0, c * BK, Q, K);
    else stage_tile<BK, BN, LB>(cp, b(c), mb, c * BK, n0, K, Q);
  }
};

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

/* out[r] = Op over x[r, 0..N-1] for r < ROWS (divided by N when MEAN); x: a float tile or a
   narrow load (In) */
template <typename Op, int ROWS, int N, bool MEAN, typename X>
__device__ void reduce_rows(float* __restrict__ out, const X x) {
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
template <int ROWS, int N, typename X>
__device__ void softmax_rows(float* __restrict__ out, const X x) {
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
/* float4 component s of v (s a constant once the loops are unrolled) */
__device__ __forceinline__ float component(const float4& v, int s) { return s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w; }

/* acc += one staged chunk's product for the micro-tile of thread (tm, tn): rows tm + i * MT,
   columns tn * 4 + j (b row-major: one float4 of a row) or, TRANS, tn + j * NT (one float4
   along k of each of 4 rows of x, rows 4 banks apart). Every 4 k-steps read TM + 4 float4s
   of shared memory (LDS.128) for 16 * TM multiply-adds, fused (fmaf: nvcc runs with --fmad=false). */
template <int TM, int MT, int NT, int BK, int LA, int LB, bool TRANS>
__device__ __forceinline__ void multiply_chunk(float (&acc)[TM][4], const float* __restrict__ sa,
                                               const float* __restrict__ sb, int tm, int tn) {
#pragma unroll
  for (int k = 0; k < BK; k += 4) {
    float4 av[TM];
#pragma unroll
    for (int i = 0; i < TM; i++) av[i] = *reinterpret_cast<const float4*>(sa + (tm + i * MT) * LA + k);
    if (TRANS) {
      float4 bv[4];
#pragma unroll
      for (int j = 0; j < 4; j++) bv[j] = *reinterpret_cast<const float4*>(sb + (tn + j * NT) * LB + k);
#pragma unroll
      for (int s = 0; s < 4; s++)
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
          for (int j = 0; j < 4; j++) acc[i][j] = fmaf(component(av[i], s), component(bv[j], s), acc[i][j]);
    } else {
#pragma unroll
      for (int s = 0; s < 4; s++) {
        const float4 bv = *reinterpret_cast<const float4*>(sb + (k + s) * LB + tn * 4);
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
          for (int j = 0; j < 4; j++) acc[i][j] = fmaf(component(av[i], s), component(bv, j), acc[i][j]);
      }
    }
  }
}

/* out[P, Q] = (or +=, ACC) a[P, K] @ b[K, Q] (b = x.T when TRANS), any P, K, Q: the block
   works through BM x BN tiles of out; for each, K in chunks of 16 staged into `stage`
   (Chunks: STAGE bytes, double-buffered, the next chunk copied while this one is multiplied,
   one barrier per chunk), each thread accumulating a micro-tile of TM x 4 in registers: the
   BN / 4 threads of a row of the tile and FT_THREADS / (BN / 4) (at most BM) rows of them. */
template <int P, int K, int Q, bool ACC, bool TRANS, int BM, int BN, int STAGE, typename MA, typename MB>
__device__ void gemm_f32(float* __restrict__ out, const MA a, const MB b, unsigned char* stage) {
  enum { BK = 16, NT = BN / 4, MT0 = FT_THREADS / NT, MT = MT0 < BM ? MT0 : BM, TM = BM / MT, NK = (K + BK - 1) / BK };
  typedef Chunks<BM, BN, BK, TRANS> C;  /* floats: narrow operands converted as they are staged */
  static_assert(C::BYTES == STAGE, "the stage the target allotted is this GEMM's");
  static_assert(BN % 4 == 0 && NT <= FT_THREADS && BM % MT == 0, "a tile the block's threads cover");
  const C ch = {stage};
  Copies cp;
  const int tm = threadIdx.x / NT, tn = threadIdx.x % NT;
  const bool active = threadIdx.x < MT * NT;
  for (int m0 = 0; m0 < P; m0 += BM)
    for (int n0 = 0; n0 < Q; n0 += BN) {
      float acc[TM][4];
      for (int i = 0; i < TM; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
      ch.template load<P, K, Q>(cp, 0, a, b, m0, n0);
      for (int c = 0; c < NK; c++) {
        cp.wait();
        __syncthreads();  /* chunk c is in; every thread is done with chunk c - 1, whose buffer c + 1 takes */
        if (c + 1 < NK) ch.template load<P, K, Q>(cp, c + 1, a, b, m0, n0);
        if (active) multiply_chunk<TM, MT, NT, BK, C::LA, C::LB, TRANS>(acc, ch.a(c), ch.b(c), tm, tn);
      }
      __syncthreads();  /* the next tile's first chunk may overwrite the buffers */
      if (!active) continue;
      for (int i = 0; i < TM; i++)
        for (int j = 0; j < 4; j++) {
          const int p = m0 + tm + i * MT, q = n0 + (TRANS ? tn + j * NT : tn * 4 + j);
          if (p < P && q < Q) out[p * Q + q] = ACC ? out[p * Q + q] + acc[i][j] : acc[i][j];
        }
    }
}

/* -- GEMM on tensor cores (WMMA) -------------------------------------------------------- */
/* Per operand precision: the element of the converted chunks in shared memory, the WMMA
   fragment type, its k extent, and the conversion (tf32: rounded to nearest, kept as float). */
template <typename H> struct Precision {  /* fp16 and bf16: staged and multiplied as H */
  typedef H elem;
  typedef H frag;
  enum { K = 16 };
  static __device__ __forceinline__ H convert(float f) { return narrow<H>(f); }
};
template <> struct Precision<nvcuda::wmma::precision::tf32> {
  typedef float elem;
  typedef nvcuda::wmma::precision::tf32 frag;
  enum { K = 8 };
  static __device__ __forceinline__ float convert(float f) { return nvcuda::wmma::__float_to_tf32(f); }
};
template <bool TRANS> struct LayoutB { typedef nvcuda::wmma::row_major type; };
template <> struct LayoutB<true> { typedef nvcuda::wmma::col_major type; };

/* Converts a staged R x C block (row stride LS, elements S) into h (row stride LH). */
template <typename Pr, int R, int C, int LS, int LH, typename S>
__device__ __forceinline__ void convert_chunk(typename Pr::elem* __restrict__ h, const S* __restrict__ s) {
  for (int e = threadIdx.x; e < R * C; e += FT_THREADS) h[e / C * LH + e % C] = Pr::convert(widen(s[e / C * LS + e % C]));
}

/* out[P, Q] = (or +=, ACC) a[P, K] @ b[K, Q] (b = x.T when TRANS), P and Q multiples of 16,
   any K: per BM x BN tile of out, K in chunks of BK (a multiple of the fragments' k), staged
   as their elements are (Chunks, double-buffered: the next chunk's copies fly while this one
   is multiplied). An operand already in the fragments' precision (a narrow buffer under fp16
   or bf16: weights stored as halves) is multiplied straight from its staged chunk; any other
   is converted once per chunk and block into padded rows of 16 bytes more (row starts 4 banks
   apart: conflict-free fragment loads). Warps own FM x FN fragments of the tile, whose
   accumulators stay in registers over all of K; STAGE: the staged chunks, then the converted. */
template <typename T, int P, int K, int Q, bool ACC, bool TRANS, int BM, int BN, int BK, int STAGE, typename MA,
          typename MB>
__device__ void gemm_tc(float* __restrict__ out, const MA a, const MB b, unsigned char* stage) {
  namespace wmma = nvcuda::wmma;
  typedef Precision<T> Pr;
  typedef typename Pr::elem E;
  typedef typename MA::elem SA;
  typedef typename MB::elem SB;
  /* which operands are converted: those not already in the fragments' type (tf32: rounded, always) */
  enum { CA = !same<SA, typename Pr::frag>::value, CB = !same<SB, typename Pr::frag>::value,
         FK = Pr::K, PAD = 16 / sizeof(E), HA = BK + PAD, HB = TRANS ? BK + PAD : BN + PAD, NK = (K + BK - 1) / BK };
  typedef Chunks<BM, BN, BK, TRANS, SA, SB> C;
  static_assert(C::BYTES + (CA * BM * HA + CB * (TRANS ? BN : BK) * HB) * sizeof(E) == STAGE,
                "the stage the target allotted is this GEMM's");
  static_assert(CA || C::LA == HA, "an operand multiplied where it is staged has the converted rows' stride");
  static_assert(CB || C::LB == HB, "an operand multiplied where it is staged has the converted rows' stride");
  enum { TI = BM / 16, TJ = BN / 16, WARPS = FT_THREADS / 32, WJ = TJ < WARPS ? TJ : WARPS,
         WI = TI < WARPS / WJ ? TI : WARPS / WJ, FM = TI / WI, FN = TJ / WJ };
  static_assert(P % 16 == 0 && Q % 16 == 0 && BK % FK == 0 && TI % WI == 0 && TJ % WJ == 0,
                "whole fragments for each warp");
  const C ch = {stage};
  Copies cp;
  E* const ca = reinterpret_cast<E*>(stage + C::BYTES);
  E* const cb = ca + CA * BM * HA;
  const int warp = threadIdx.x / 32, wi = warp / WJ, wj = warp % WJ;
  const bool active = warp < WI * WJ;
  for (int m0 = 0; m0 < P; m0 += BM)
    for (int n0 = 0; n0 < Q; n0 += BN) {
      wmma::fragment<wmma::accumulator, 16, 16, FK, float> acc[FM][FN];
      for (int x = 0; x < FM; x++)
        for (int y = 0; y < FN; y++) {
          const int p = m0 + (wi * FM + x) * 16, q = n0 + (wj * FN + y) * 16;
          if (ACC && active && p < P && q < Q) wmma::load_matrix_sync(acc[x][y], out + p * Q + q, Q, wmma::mem_row_major);
          else wmma::fill_fragment(acc[x][y], 0.0f);
        }
      ch.template load<P, K, Q>(cp, 0, a, b, m0, n0);
      for (int c = 0; c < NK; c++) {
        cp.wait();
        __syncthreads();  /* chunk c is in; the last chunk's fragments have all been loaded */
        if (c + 1 < NK) ch.template load<P, K, Q>(cp, c + 1, a, b, m0, n0);
        if (CA) convert_chunk<Pr, BM, BK, C::LA, HA>(ca, ch.a(c));
        if (CB && TRANS) convert_chunk<Pr, BN, BK, C::LB, HB>(cb, ch.b(c));
        if (CB && !TRANS) convert_chunk<Pr, BK, BN, C::LB, HB>(cb, ch.b(c));
        if (CA || CB) __syncthreads();
        if (!active) continue;
        const E* ha = CA ? ca : reinterpret_cast<const E*>(ch.a(c));
        const E* hb = CB ? cb : reinterpret_cast<const E*>(ch.b(c));
        for (int k = 0; k < BK; k += FK) {
          wmma::fragment<wmma::matrix_a, 16, 16, FK, typename Pr::frag, wmma::row_major> fa[FM];
          wmma::fragment<wmma::matrix_b, 16, 16, FK, typename Pr::frag, typename LayoutB<TRANS>::type> fb[FN];
          for (int x = 0; x < FM; x++) wmma::load_matrix_sync(fa[x], ha + (wi * FM + x) * 16 * HA + k, HA);
          for (int y = 0; y < FN; y++)
            wmma::load_matrix_sync(fb[y], TRANS ? hb + (wj * FN + y) * 16 * HB + k : hb + k * HB + (wj * FN + y) * 16, HB);
          for (int x = 0; x < FM; x++)
            for (int y = 0; y < FN; y++) wmma::mma_sync(acc[x][y], fa[x], fb[y], acc[x][y]);
        }
      }
      __syncthreads();  /* the next tile's first chunk may overwrite the buffers */
      if (!active) continue;
      for (int x = 0; x < FM; x++)
        for (int y = 0; y < FN; y++) {
          const int p = m0 + (wi * FM + x) * 16, q = n0 + (wj * FN + y) * 16;
          if (p < P && q < Q) wmma::store_matrix_sync(out + p * Q + q, acc[x][y], Q, wmma::mem_row_major);
        }
    }
}

}  // namespace ft
