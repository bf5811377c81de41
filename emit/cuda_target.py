"""The CUDA target, from the same ISL AST and statement bodies as the C target.

* Host: the loops outside the outermost parallel loops — the wavefront's sequential loop —
  become a Python driver (generated from the AST) that launches one kernel per parallel loop
  (grid = its trip count) or per statement left outside any parallel loop (grid = 1).
* Device: a kernel runs one iteration of its parallel loop per thread block, the loops inside
  it sequentially; each statement is a `__device__` function whose tile macro-kernels are
  executed cooperatively by all threads of the block (elements strided over threads, a
  barrier between operations), with operand tiles staged in shared memory by cooperative,
  vectorised tile loaders.
"""
from __future__ import annotations

import math

import cgen
import islpy as isl
import numpy as np

from polyft.errors import CompileError

from .ast import _children, build_ast, to_cgen
from .c_target import _const_decl, prepare, statement_functions
from .kernels import StatementBody, ctype

THREADS = 256
SHARED_LIMIT = 48 * 1024

PRELUDE = """#include <stdint.h>
#define floord(n, d) (((n) < 0) ? -((-(n) + (d) - 1) / (d)) : (n) / (d))
#define min(x, y) ((x) < (y) ? (x) : (y))
#define max(x, y) ((x) > (y) ? (x) : (y))

/* cooperative tile loader: all threads copy a tile from global to shared memory, in float4
   steps when both ends are 16-byte aligned, then wait for each other */
template <typename T>
__device__ __forceinline__ void ft_load_tile(T* __restrict__ dst, const T* __restrict__ src, int n) {
  if (sizeof(T) == 4 && n % 4 == 0 && ((uintptr_t)src % 16) == 0 && ((uintptr_t)dst % 16) == 0) {
    const float4* s4 = reinterpret_cast<const float4*>(src);
    float4* d4 = reinterpret_cast<float4*>(dst);
    for (int e = threadIdx.x; e < n / 4; e += blockDim.x) d4[e] = s4[e];
  } else {
    for (int e = threadIdx.x; e < n; e += blockDim.x) dst[e] = src[e];
  }
  __syncthreads();
}"""


class CudaStatementBody(StatementBody):
    """Tile operations spread over the threads of a block, with a barrier after each."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.shared_bytes = 0  # a block's threads share the tiles: no per-instance batching here

    def _decl(self, op):
        n = max(1, math.prod(op.shape))
        self.shared_bytes += n * np.dtype(_np_dtype(op.dtype)).itemsize
        self.lines.append(cgen.Line(f"__shared__ __align__(16) {ctype(op.dtype)} v{op.id}[{n}];"))

    def _loops(self, shape, body_fn, tag):
        n = max(1, math.prod(shape))
        flat = f"{tag}f"
        idx, stride = [], 1
        for d in reversed(range(len(shape))):
            idx.insert(0, f"(({flat} / {stride}) % {shape[d]})" if stride > 1 else f"({flat} % {shape[d]})")
            stride *= shape[d]
        return cgen.For(f"int {flat} = threadIdx.x", f"{flat} < {n}", f"{flat} += blockDim.x",
                        cgen.Block(body_fn(idx)))

    RESTRICT = "__restrict__"
    ELEMENTS = ("threadIdx.x", "blockDim.x")  # a tile's elements strided over the block's threads
    VECTORS = False  # the CUDA matmul is its own (thread-parallel) kernel
    def _after(self, op):
        if op.op != "load":
            self.lines.append(cgen.Statement("__syncthreads()"))

    def _staged(self, a):
        """An operand tile in shared memory: loads are copied in cooperatively first."""
        name, shape, dtype = self._operand(a)
        if isinstance(a, tuple) or a.op != "load":
            return name, shape, dtype
        n = max(1, math.prod(shape))
        if (self.shared_bytes + n * 4) > SHARED_LIMIT // 2:
            return name, shape, dtype  # too big to stage: read it from global memory
        self.shared_bytes += n * np.dtype(_np_dtype(dtype)).itemsize
        staged = f"{name}_s"
        self.lines.append(cgen.Line(f"__shared__ __align__(16) {ctype(dtype)} {staged}[{n}];"))
        self.lines.append(cgen.Statement(f"ft_load_tile({staged}, {name}, {n})"))
        return staged, shape, dtype

    def _op_matmul(self, op):
        """Each thread computes output elements (p, q); the left tile (reused by every q) is
        staged in shared memory, the right one read coalesced along q."""
        (a, sa, _), (b, sb, _) = self._staged(op.inputs[0]), self._operand(op.inputs[1])
        P, K = sa
        Q = sb[1]
        self._decl(op)
        o = self._ref(op)
        self.lines.append(cgen.For("int _f = threadIdx.x", f"_f < {P * Q}", "_f += blockDim.x", cgen.Block([
            cgen.Line(f"const int _p = _f / {Q}, _q = _f % {Q};"),
            cgen.Line(f"{ctype(op.dtype)} _acc = 0;"),
            cgen.For("int _m = 0", f"_m < {K}", "_m++", cgen.Line(f"_acc += {a}[_p*{K} + _m] * {b}[_m*{Q} + _q];")),
            cgen.Assign(f"{o}[_f]", "_acc")])))

    def _reduce(self, op, init, step, finish=None):
        """One thread per output element, reducing sequentially over the reduced axes."""
        x, s, _ = self._operand(op.inputs[0])
        self._decl(op)
        o = self._ref(op)
        axes, keep = self._axes(op, s)
        red_shape = [s[d] for d in axes]
        n_red = math.prod(red_shape)
        f = self._f(op)

        def body(idx):
            # idx: coordinates of the kept dims; the reduced ones come from _r
            src, ri, stride = [], {}, 1
            for d in reversed(axes):
                ri[d] = f"((_r / {stride}) % {s[d]})"
                stride *= s[d]
            it = iter(idx)
            for d in range(len(s)):
                src.append(ri[d] if d in axes else next(it))
            lines = [cgen.Line(f"{ctype(op.dtype)} _acc = {init};"),
                     cgen.For("int _r = 0", f"_r < {n_red}", "_r++",
                              cgen.Line(step.format(dst="_acc", x=f"{x}[{self._flat(s, src)}]", f=f) + ";"))]
            if finish:
                lines.append(cgen.Line(finish.format(dst="_acc", n=n_red) + ";"))
            lines.append(cgen.Assign(f"{o}[{self._flat([s[d] for d in keep], idx)}]", "_acc"))
            return lines
        self.lines.append(self._loops([s[d] for d in keep], body, "_o"))



def _np_dtype(dtype):
    return np.float32 if dtype == "float16" else np.dtype(dtype)


# ---------------------------------------------------------------------------------------
# Host driver: the AST outside the parallel loops, as Python


_PY_OPS = {isl.ast_expr_op_type.add: "+", isl.ast_expr_op_type.sub: "-", isl.ast_expr_op_type.mul: "*",
           isl.ast_expr_op_type.div: "//", isl.ast_expr_op_type.fdiv_q: "//",
           isl.ast_expr_op_type.pdiv_q: "//", isl.ast_expr_op_type.pdiv_r: "%",
           isl.ast_expr_op_type.zdiv_r: "%", isl.ast_expr_op_type.le: "<=", isl.ast_expr_op_type.lt: "<",
           isl.ast_expr_op_type.ge: ">=", isl.ast_expr_op_type.gt: ">", isl.ast_expr_op_type.eq: "==",
           isl.ast_expr_op_type.and_: "and", isl.ast_expr_op_type.and_then: "and",
           isl.ast_expr_op_type.or_: "or", isl.ast_expr_op_type.or_else: "or"}


def py_expr(e: isl.AstExpr) -> str:
    """An ISL AST expression as Python."""
    t = e.get_type()
    if t == isl.ast_expr_type.id:
        return e.get_id().get_name()
    if t == isl.ast_expr_type.int:
        return str(e.get_val().to_python())
    op = e.get_op_type()
    args = [py_expr(e.get_op_arg(k)) for k in range(e.get_op_n_arg())]
    if op in _PY_OPS:
        return "(" + f" {_PY_OPS[op]} ".join(args) + ")"
    if op == isl.ast_expr_op_type.minus:
        return f"(-{args[0]})"
    if op in (isl.ast_expr_op_type.min, isl.ast_expr_op_type.max):
        return f"{'min' if op == isl.ast_expr_op_type.min else 'max'}({', '.join(args)})"
    if op in (isl.ast_expr_op_type.select, isl.ast_expr_op_type.cond):
        return f"({args[1]} if {args[0]} else {args[2]})"
    raise NotImplementedError(f"ISL AST operation {op} in a host loop")


class _Kernels:
    """Walks the AST: host code (Python lines) outside parallel loops, kernels inside."""

    def __init__(self, parallel, statement):
        self.parallel = parallel
        self.statement = statement  # (name, C args) -> cgen call
        self.kernels = []  # cgen FunctionBody
        self.host = []

    def host_lines(self, node, indent, outer):
        t = node.get_type()
        pad = "    " * indent
        if t == isl.ast_node_type.block:
            for c in _children(node):
                self.host_lines(c, indent, outer)
        elif t == isl.ast_node_type.if_:
            self.host.append(f"{pad}if {py_expr(node.if_get_cond())}:")
            self.host_lines(node.if_get_then_node(), indent + 1, outer)
            if node.if_has_else_node():
                self.host.append(f"{pad}else:")
                self.host_lines(node.if_get_else_node(), indent + 1, outer)
        elif t == isl.ast_node_type.for_:
            it = node.for_get_iterator().get_id().get_name()
            if self.parallel[int(it[1:])]:
                loops = [node]  # this parallel loop, and one directly inside it -> a 2-D grid
                inner = node.for_get_body()
                if inner.get_type() == isl.ast_node_type.for_:
                    it2 = inner.for_get_iterator().get_id().get_name()
                    if self.parallel[int(it2[1:])] and not _mentions(inner, it):
                        loops.append(inner)
                k = self._kernel(loops[-1].for_get_body(), outer, [lp.for_get_iterator().get_id().get_name()
                                                                   for lp in loops])
                grid, los = [], []
                for lp in loops:
                    lo, n = _trip(lp)
                    grid.append(n)
                    los.append(lo)
                self.host.append(f"{pad}launch({k}, ({', '.join(grid)},), ({', '.join(los)},), "
                                 f"({', '.join(outer + [''])}))")
            else:
                self.host.append(f"{pad}{it} = {py_expr(node.for_get_init())}")
                self.host.append(f"{pad}while {py_expr(node.for_get_cond())}:")
                self.host_lines(node.for_get_body(), indent + 1, outer + [it])
                self.host.append(f"{pad}    {it} += {py_expr(node.for_get_inc())}")
        elif t == isl.ast_node_type.user:
            k = self._kernel(node, outer, [])
            self.host.append(f"{pad}launch({k}, (1,), (), ({', '.join(outer + [''])}))")
        else:
            raise NotImplementedError(f"ISL AST node {t} on the host")

    def _kernel(self, body, outer, its) -> int:
        """A kernel running `body` with `its` bound to block indices (x, then y)."""
        k = len(self.kernels)
        code = to_cgen(body, [False] * len(self.parallel), self.statement, lambda loop: loop)
        lines = [cgen.Line(f"const long {it} = lo{d} + blockIdx.{'xy'[d]};") for d, it in enumerate(its)]
        args = [cgen.Value("const ctx_t* __restrict__", "c")]
        args += [cgen.Value("const long", f"lo{d}") for d in range(len(its))]
        args += [cgen.Value("const long", o) for o in outer]
        self.kernels.append((k, args, lines + [code]))
        return k


def _mentions(node, name) -> bool:
    return any(tok == name for tok in
               node.for_get_init().to_C_str().replace("(", " ").replace(")", " ").replace(",", " ").split()
               + node.for_get_cond().to_C_str().replace("(", " ").replace(")", " ").replace(",", " ").split())


def _trip(node) -> tuple:
    """(lower bound, trip count) of a unit-stride loop, as Python expressions."""
    it = node.for_get_iterator().get_id().get_name()
    lo = py_expr(node.for_get_init())
    cond = node.for_get_cond()
    op = cond.get_op_type()
    first = cond.get_op_arg(0)
    if first.get_type() == isl.ast_expr_type.id and first.get_id().get_name() == it:
        hi = py_expr(cond.get_op_arg(1))
        if op == isl.ast_expr_op_type.le:
            return lo, f"max(0, {hi} - ({lo}) + 1)"
        if op == isl.ast_expr_op_type.lt:
            return lo, f"max(0, {hi} - ({lo}))"
    raise CompileError(f"cannot map the loop over {it} ({cond.to_C_str()}) to a grid", op="emit")


def generate(model, schedule, threads: int = THREADS) -> tuple:
    """(CUDA source, Python host driver source, Layout, number of kernels)."""
    etdg = model.etdg
    layout, params, namer, consts, ctx, buffer_ref = prepare(model)

    def fits(st, body):
        if body.shared_bytes > SHARED_LIMIT:
            raise CompileError(f"{st.name} keeps {body.shared_bytes} bytes of tiles in shared memory "
                               f"(limit {SHARED_LIMIT}); use smaller tiles", op="emit")
    functions = statement_functions(etdg, namer, buffer_ref, consts, CudaStatementBody, "__device__ static void",
                                    cgen.Value("const ctx_t* __restrict__", "c"), fits)

    ast = build_ast(schedule.map, model.context)
    walker = _Kernels(schedule.parallel, lambda name, a, tile=None: cgen.Statement(f"{name}({', '.join(a + ['c'])})"))
    walker.host_lines(ast, 1, [])
    kernels = []
    for k, args, lines in walker.kernels:
        setup = [cgen.Line(f"const long {p} = c->{p}; (void){p};") for p in params]
        kernels.append(cgen.FunctionBody(
            cgen.FunctionDeclaration(cgen.Value(f'extern "C" __global__ void __launch_bounds__({threads})',
                                                f"polyft_k{k}"), args),
            cgen.Block(setup + lines)))
    consts_c = [cgen.Line("__device__ " + str(_const_decl(n, v)).replace("static const", "const"))
                for n, v in consts.values()]
    module = cgen.Module([cgen.Line(PRELUDE), cgen.Line(""), ctx, cgen.Line("")] + consts_c
                         + [cgen.Line("")] + functions + [cgen.Line("")] + kernels)
    host = [f"def run(launch, {', '.join(params + ['_=None'])}):"] + (walker.host or ["    pass"])
    return str(module) + "\n", "\n".join(host) + "\n", layout, len(walker.kernels)
