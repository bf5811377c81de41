"""The C target: one translation unit per program — a context struct (parameters, buffer
pointers, strides), one function per statement (its operation nodes as macro-kernels), and
`polyft_run`, the schedule's ISL AST inside one OpenMP parallel region: the threads walk the
sequential loops (the wavefront's steps) together, share out the outermost parallel loop of
each nest and leave what lies between to one of them (`_region`). A cost model (`ft_chunk`,
`iteration_flops`) gives each thread of a loop enough arithmetic to pay for the loop's barrier,
so a small step runs on fewer threads or one.

Buffers the storage places "local" (c_family.local_batches) live in a scratch per thread, and
so do a statement's tile temporaries when they are too large for a thread's stack: one block
per OpenMP thread, kept from call to call, and each thread runs on its own copy of the
context whose pointers into the scratch are the thread's.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import cgen
import islpy as isl
import numpy as np

from polyft.deps.traffic import count

from .c_family import (MACROS, TILE, StatementCalls, const_decl, local_batches, param_c, prepare, statement_functions,
                       tile_widths, tiled_loops, widened)
from .c_statements import (FMA_MACROS, StatementBody, ctype, instance_flops, length_c, native_dtype, packed_right,
                           panel_width)
from .isl_ast import below, build_ast, call_name, evaluate, has_parallel, to_cgen, upper_bound
from .protocol import Module, Target
from .isa import Kernel, current, march

with open(os.path.join(os.path.dirname(__file__), "vecmath.h")) as _f:
    VECMATH = FMA_MACROS + _f.read()  # ft_fmaf for the polynomials, also where it stands alone (tests)

# The micro-kernel's multiply-add `c += a * b` (a a float, `_s`, or a vector, `_v`) as one fused
# instruction where the ISA has one: the generated C is compiled with -ffp-contract=off
# (runtime_c.FLAGS), so only the multiply-adds polyft writes this way fuse (a dot product's,
# as BLAS fuses them), never an elementwise `x * 2 - x`.
VECTOR_FMA = """#if defined(__AVX512F__) && FT_VEC_FLOATS == 16
#include <immintrin.h>
#define ft_vfma(c, a, b) ((ft_vec)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#elif defined(__FMA__) && FT_VEC_FLOATS == 8
#include <immintrin.h>
#define ft_vfma(c, a, b) ((ft_vec)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#elif defined(__FMA__) && FT_VEC_FLOATS == 4
#include <immintrin.h>
#define ft_vfma(c, a, b) ((ft_vec)_mm_fmadd_ps((__m128)(a), (__m128)(b), (__m128)(c)))
#elif defined(__ARM_FEATURE_FMA) && FT_VEC_FLOATS == 4
#include <arm_neon.h>
#define ft_vfma(c, a, b) ((ft_vec)vfmaq_f32((float32x4_t)(c), (float32x4_t)(a), (float32x4_t)(b)))
#else
#define ft_vfma(c, a, b) ((c) + (a) * (b))
#endif
#define ft_vmadd_v(c, a, b) ((c) = ft_vfma((c), (a), (b)))
#define ft_vmadd_s(c, a, b) ((c) = ft_vfma((c), (ft_vec){0} + (a), (b)))
"""

PRELUDE = """#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
#define omp_get_thread_num() 0
#define omp_get_num_threads() 1
#define omp_get_max_threads() 1
#endif

/* The threads' scratch outlives a call: a fresh block each call would be mapped and zeroed
   page by page every time. A call takes the kept block (atomically: calls may overlap),
   or a larger one, and gives it back; of two given back, the larger one is kept. */
static char* ft_kept;
static long ft_kept_bytes;
static char* ft_take_scratch(long bytes)
{
  char* p = __atomic_exchange_n(&ft_kept, NULL, __ATOMIC_ACQ_REL);
  if (p && __atomic_load_n(&ft_kept_bytes, __ATOMIC_ACQUIRE) >= bytes) return p;
  free(p);
  return (char*)malloc(bytes);
}
static void ft_give_scratch(char* p, long bytes)
{
  char* old = __atomic_exchange_n(&ft_kept, NULL, __ATOMIC_ACQ_REL);
  if (old && __atomic_load_n(&ft_kept_bytes, __ATOMIC_ACQUIRE) >= bytes) { free(p); p = old; bytes = ft_kept_bytes; }
  else free(old);
  __atomic_store_n(&ft_kept_bytes, bytes, __ATOMIC_RELEASE);
  __atomic_store_n(&ft_kept, p, __ATOMIC_RELEASE);
}
/* n row-major K x Q matrices, each copied to its own place in dst as Q / W panels of K rows
   of W floats, one panel after the other: the GEMM micro-kernel then reads a shared matrix
   as one stream instead of W floats from every row, rows a page apart once Q reaches 1024.
   Every thread of a region calls it (an orphaned omp for, a barrier after it), or one
   thread outside any. */
static void ft_pack(const float* restrict src, float* restrict dst, long n, long K, long Q, long W)
{
  #pragma omp for schedule(static)
  for (long t = 0; t < n * (Q / W); t++)
  {
    const long e = t / (Q / W), p = t % (Q / W);
    for (long m = 0; m < K; m++)
      memcpy(dst + e * K * Q + p * K * W + m * W, src + e * K * Q + m * Q + p * W, W * sizeof(float));
  }
}

/* The step of a tiled parallel loop of n iterations run for each of m iterations of a loop
   around it: tiles of at most `size`, narrowed so that every thread of the region gets one
   (fewer rows per GEMM beats idle threads) */
static long ft_split(long n, long size, long m)
{
  const long per = m < 1 ? 1 : m, t = (omp_get_num_threads() + per - 1) / per, w = (n + t - 1) / t;
  return w < 1 ? 1 : (w < size ? w : size);
}

/* The chunk of a parallel loop's n iterations (of `flops` each) that one thread takes: an
   even share among as many threads as get FT_MIN_FLOPS each, at least one (schedule(static)
   then hands thread k the k-th chunk). A barrier costs about a microsecond, about what a core
   computes in FT_MIN_FLOPS: a step with less work for a thread runs on fewer threads. */
#define FT_MIN_FLOPS 100000.0
static long ft_chunk(long n, double flops)
{
  long t = omp_get_num_threads();
  const double most = (double)n * flops / FT_MIN_FLOPS;
  if (most < t) t = most < 1 ? 1 : (long)most;
  return n > t ? (n + t - 1) / t : 1;
}
""" + MACROS + "\n" + VECMATH


TILE_ROWS = 128  # rows of a tiled statement's products: its temporaries stay in a core's L2
WIDE_TILE = 128  # instances of a tile where no local buffer limits it (c_family.widened)
# A shared matrix of PACK_BYTES or more is packed in panels before a call runs (ft_pack): the
# micro-kernel's walk down its columns runs 10-25% slower on rows 2-4 KB apart (1024^2 floats:
# 197 GFLOP/s against 248 packed on a Zen 4 core). A pack costs about two 16-row products by
# the matrix, so only matrices that meet PACK_ROWS rows of left operands in a call are packed.
# A panel one cache line wide (AVX2's 16 floats) reads one line a row, rows 512 B apart at
# Q = 128, which the L1 keeps few of: its matrices are packed from PACK_BYTES_LINE (the stacked
# RNN and LSTM at H = 128 on AVX2: 1.04-1.21x with two threads; below it, 64 x 64 tiles of b2b
# GEMM and attention, which fit the L1, ran 0.5-0.9x packed). Narrower panels (SSE, NEON) use half
# of every line they load in place: their matrices are packed at any size.
PACK_BYTES = 1 << 20
PACK_BYTES_LINE = 1 << 16
PACK_ROWS = 64
CACHE_LINE = 64  # bytes
ASSUMED_TRIPS = 16  # the iterations the cost model assumes of a loop whose bounds it cannot evaluate


@dataclass(frozen=True)
class CModule(Module):
    """C source, and the -march level it was generated for (its GEMM micro-kernel fits that
    level's vector registers): the runtime compiles it for that level."""
    march: str


class CTarget(Target):
    """C with OpenMP; the entry point is `int polyft_run(void** bufs, const long* params)`,
    buffers in layout order (local ones are not read), parameters in the module's order
    (runtime_c.CtypesRuntime); it returns 1 when the threads' scratch cannot be allocated."""

    name = "C"

    def __init__(self, kernel=None, pack=True):
        self.kernel = kernel  # the GEMM micro-kernel (rows, vectors, floats per vector); None: the ISA's
        self.pack = pack  # pack large shared matrices before a call (packed_weights); False: read them in place

    @staticmethod
    def local_batches(model, schedule, storage) -> dict:
        """The buffers this target keeps in a per-thread scratch: name -> storage.Batch (a
        thread runs the parallel loops inside a batch in order)."""
        ast = build_ast(schedule.map, model.context)
        return local_batches(model.etdg, storage, ast, schedule.parallel,
                             tiled_loops(model.etdg, ast, schedule.parallel, TILE, TILE_ROWS), True)

    def generate(self, model, schedule, precision: str = "fp32", storage=None) -> Module:
        etdg = model.etdg
        ast = build_ast(schedule.map, model.context)
        tiles = tiled_loops(etdg, ast, schedule.parallel, TILE, TILE_ROWS)
        local = local_batches(etdg, storage, ast, schedule.parallel, tiles, True)
        tiles = widened(etdg, ast, schedule.parallel, tiles, local, WIDE_TILE, TILE_ROWS)
        level, spec = march(), current()
        kernel = Kernel(*self.kernel) if self.kernel else spec.micro_kernel
        packs = packed_weights(model, kernel) if self.pack else {}
        layout, params, namer, consts, ctx, buffer_ref = prepare(model, storage, local, scratch=True, packed=packs)
        called = StatementCalls("c")  # which statement variants the AST calls
        to_cgen(ast, schedule.parallel, called, lambda loop, info: loop, tiles=tiles)
        spilled = [0]  # the most bytes of temporaries one statement call keeps in the scratch

        def spill(st, body):
            spilled[0] = max(spilled[0], body.scratch_bytes)
        called_functions = {}  # the GEMM and elementwise functions the statements call (StatementBody)
        body = functools.partial(StatementBody, kernel=kernel, packed=frozenset(packs), functions=called_functions)
        widths = tile_widths(ast, tiles)
        functions = statement_functions(etdg, namer, buffer_ref, consts, body, "static void",
                                        cgen.Value("const ctx_t* restrict", "c"), called.variants, spill,
                                        lambda name: widths.get(name, TILE))
        setup = [cgen.Line("ctx_t ctx;"), cgen.Line("const ctx_t* c = &ctx;")]
        setup += [cgen.Line(f"const long {p} = ctx.{p} = params[{k}];") for k, p in enumerate(params)]
        region_bytes = {}  # a local buffer's name -> the C expression of its bytes per thread
        pack_bytes, pack_calls = "0", []  # the packed copies' place after the threads' scratch; their ft_pack calls
        for k, b in enumerate(layout.buffers):
            stride = str(int(np.prod(b.element_shape)) if b.element_shape else 1)
            dims = layout.dims(b)
            for r in reversed(range(b.depth)):
                setup.append(cgen.Line(f"ctx.s{k}_{r} = {stride};"))
                stride = f"{stride}*{_extent_c(dims[r], b.dims[r])}"
            if layout.batch(b):
                region_bytes[b.name] = f"({stride}*{native_dtype(b.dtype).itemsize} + 63) / 64 * 64"
                setup.append(cgen.Line(f"ctx.b{k} = NULL;  /* {b.name}: per thread */"))
            else:
                setup.append(cgen.Line(f"ctx.b{k} = ({ctype(b.dtype)}*)bufs[{k}];  /* {b.name} */"))
            if b.name in packs:
                K, Q = b.element_shape
                setup.append(cgen.Line(f"const long ft_pack{k} = {pack_bytes};  /* {b.name}, packed */"))
                pack_bytes = f"ft_pack{k} + ({stride}*4 + 63) / 64 * 64"
                pack_calls.append(cgen.Statement(f"ft_pack(ctx.b{k}, ctx.p{k}, {stride} / {K * Q}, {K}, {Q}, "
                                                 f"{panel_width(kernel, Q)})"))
        # a thread's scratch: one 64-byte aligned region per group of local buffers never live
        # at once, then the place of large temporaries
        per_thread = "0"
        offsets = {}  # slot of a local buffer -> its place in a thread's scratch
        slots = {b.name: k for k, b in enumerate(layout.buffers)}
        for j, group in enumerate(storage.regions(layout.local) if layout.local else []):
            setup.append(cgen.Line(f"const long ft_region{j} = {per_thread};  /* {', '.join(group)} */"))
            size = region_bytes[group[0]]
            for name in group[1:]:
                size = f"max({size}, {region_bytes[name]})"
            per_thread = f"ft_region{j} + {size}"
            offsets.update({slots[name]: f"ft_region{j}" for name in group})
        scratch = bool(offsets or spilled[0] or packs)
        setup.append(cgen.Line("(void)c;"))
        if scratch:
            setup += [cgen.Line(f"const long ft_tmp_off = {per_thread};  /* temporaries */"),
                      cgen.Line(f"const long ft_per_thread = ft_tmp_off + {spilled[0]};"),
                      cgen.Line(f"const long ft_scratch_bytes = ft_per_thread * omp_get_max_threads() + {pack_bytes};"),
                      cgen.Line("char* ft_scratch = ft_take_scratch(ft_scratch_bytes);"),
                      cgen.Line("if (!ft_scratch) return 1;"),
                      cgen.Line("ctx.ft_tmp = ft_scratch + ft_tmp_off;  /* the first thread's, outside parallel loops */")]
            setup += [cgen.Line(f"ctx.p{layout.slot(b)} = (float*)(ft_scratch + ft_per_thread * omp_get_max_threads()"
                                f" + ft_pack{layout.slot(b)});") for b in layout.buffers if b.name in packs]
        else:
            setup.append(cgen.Line("ctx.ft_tmp = NULL;"))
        flops = functools.partial(iteration_flops, {st.name: instance_flops(st.ops) for st in etdg.statements},
                                  model.sizes)
        code = to_cgen(ast, schedule.parallel, StatementCalls("c"), lambda loop, info: _omp_for(loop, info, flops),
                       tiles=tiles, split="ft_split", serial=_single)
        code = cgen.Block(pack_calls + [code]) if pack_calls else code
        if has_parallel(ast, schedule.parallel):
            code = _region(code, offsets, scratch)
        end = [cgen.Line("ft_give_scratch(ft_scratch, ft_scratch_bytes);")] if scratch else []
        run = cgen.FunctionBody(
            cgen.FunctionDeclaration(cgen.Value("int", "polyft_run"),
                                     [cgen.Pointer(cgen.Pointer(cgen.Value("void", "bufs"))),
                                      cgen.Pointer(cgen.Value("const long", "params"))]),
            cgen.Block(setup + [code] + end + [cgen.Line("return 0;")]))
        vec = cgen.Line(f"typedef float ft_vec __attribute__((vector_size({4 * kernel[2]})));"
                        f"  /* {kernel[2]} floats: a vector register of the GEMM micro-kernel */\n"
                        f"#define FT_VEC_FLOATS {kernel[2]}\n" + VECTOR_FMA)
        module = cgen.Module([cgen.Line(PRELUDE), vec, cgen.Line(""), ctx, cgen.Line("")]
                             + [const_decl(n, v) for n, v in consts.values()] + [cgen.Line("")]
                             + [f for _, f in called_functions.values()] + functions + [cgen.Line(""), run])
        return CModule(str(module) + "\n", layout, tuple(params), level)


def packed_weights(model, kernel=None) -> dict:
    """The read-only buffers (inputs, constants) whose matrices a call packs before it runs:
    name -> Buffer. Their elements are float32 K x Q matrices of PACK_BYTES or more
    (PACK_BYTES_LINE where the micro-kernel's panel is one cache line wide, any size where it is
    narrower: read in place, it would use half of every line it loads), the micro-kernel's lanes
    dividing Q (`kernel`: the current
    ISA's if None), that matmuls take whole as their right operand, each meeting PACK_ROWS rows
    of left operands or more in a call (counted at the model's sizes; assumed where they are
    not all known)."""
    kernel = Kernel(*kernel) if kernel else current().micro_kernel
    panel = 4 * kernel.lanes * kernel.vectors
    least = 0 if panel < CACHE_LINE else PACK_BYTES_LINE if panel == CACHE_LINE else PACK_BYTES
    rows, found = {}, {}
    for st in model.etdg.statements:
        instances = _instances(model.domains[st.name], model)
        for op in st.ops:
            buf = packed_right(op) if op.op == "matmul" and op.dtype == "float32" else None
            if buf is None or buf.kind not in ("input", "const") or buf.dtype != "float32" or \
                    buf.element_shape[1] % kernel.lanes or 4 * buf.element_shape[0] * buf.element_shape[1] < least:
                continue
            found[buf.name] = buf
            known = instances is not None and rows.get(buf.name, 0) is not None
            rows[buf.name] = rows.get(buf.name, 0) + instances * op.shape[0] if known else None
    out = {}
    for name, buf in found.items():
        known = rows[name] is not None and all(p in model.sizes for d in buf.dims for p in d.params)
        if not known or rows[name] >= PACK_ROWS * math.prod(d.evaluate(model.sizes) for d in buf.dims):
            out[name] = buf
    return out


def _instances(domain: isl.Set, model) -> int | None:
    """The instances of a statement domain at the model's sizes; None where they are not all known."""
    return count(domain, model.sizes) if all(p in model.sizes for p in model.params) else None


def _extent_c(cells, n) -> str:
    """The stored extent of a list dim of length n: its cells' Length, or a modulus cut to n
    (Layout.shape's rule, which the caller allocates by)."""
    if not isinstance(cells, int):
        return length_c(cells, param_c)
    return str(cells) if n.is_concrete else f"min({cells}, {length_c(n, param_c)})"


def _region(code, offsets: dict, scratch: bool) -> cgen.Generable:
    """The call's one parallel region: every thread runs the schedule's sequential loops
    (the wavefront's steps) in step, shares out each parallel loop (`omp for`, a barrier
    after it) and leaves the code between them to one thread (`omp single`, a barrier too);
    workers stay in the region from step to step instead of being woken for each. With a
    scratch (local buffers, `offsets`: slot -> place in it; large temporaries) each thread
    runs on its own context pointing at its own part of the scratch."""
    if not scratch:
        return cgen.Block([cgen.Pragma("omp parallel"), _block(code)])
    own = [cgen.Line("ctx_t ft_own = ctx;"), cgen.Line("const ctx_t* c = &ft_own;"),
           cgen.Line("char* ft_mine = ft_scratch + omp_get_thread_num() * ft_per_thread;"),
           cgen.Line("ft_own.ft_tmp = ft_mine + ft_tmp_off;")]
    own += [cgen.Line(f"ft_own.b{k} = (void*)(ft_mine + {off});") for k, off in sorted(offsets.items())]
    return cgen.Block([cgen.Pragma("omp parallel"), cgen.Block(own + [code])])


def _omp_for(loop, info, flops) -> cgen.Generable:
    """A parallel loop shared out among the region's threads; with its iterations' count
    known, in chunks that give each thread at least MIN_FLOPS (ft_chunk): a step too small
    to split runs on fewer threads, down to one."""
    if info.trips is None:
        return cgen.Block([cgen.Pragma("omp for"), loop])
    per_trip = f"{flops(info.node)}.0" + ("" if info.step == 1 else f" * {info.step}")
    return cgen.Block([cgen.Pragma(f"omp for schedule(static, ft_chunk({info.trips}, {per_trip}))"), loop])


def _single(code) -> cgen.Generable:
    return cgen.Block([cgen.Pragma("omp single"), _block(code)])


def _block(node) -> cgen.Block:
    return node if isinstance(node, cgen.Block) else cgen.Block([node])



def iteration_flops(instance: dict, sizes: dict, loop) -> int:
    """About the flops of one iteration of `loop` (an ISL for-node): the statements called in
    its body (`instance`: name -> flops of one instance), times the trip counts of the loops
    between, evaluated at the lengths in `sizes` (ASSUMED_TRIPS where they do not tell)."""
    def trips(node) -> int:
        hi, inclusive = upper_bound(node)
        last, first = (evaluate(hi, sizes), evaluate(node.for_get_init(), sizes)) if hi is not None else (None, None)
        if last is None or first is None:
            return ASSUMED_TRIPS
        return max(0, last - first + (1 if inclusive else 0))

    def work(node) -> int:
        t = node.get_type()
        if t == isl.ast_node_type.user:
            return instance[call_name(node)]
        if t == isl.ast_node_type.for_:
            return trips(node) * work(node.for_get_body())
        if t == isl.ast_node_type.if_:
            return max(work(k) for k in below(node))
        return sum(work(k) for k in below(node))
    return max(1, work(loop.for_get_body()))
