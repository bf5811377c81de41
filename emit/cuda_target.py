"""The CUDA target, from the same ISL AST and statement bodies as the C target.

* Host: the loops outside the outermost parallel loops — the wavefront's sequential loop —
  become a Python driver (generated from the AST) that launches one kernel per parallel loop
  (grid = its trip count) or per statement left outside any parallel loop (grid = 1).
* Device: a kernel runs one iteration of its parallel loop per thread block, the loops inside
  it sequentially; each statement is a `__device__` function whose tile operations are
  executed cooperatively by all threads of the block, calling the tile library
  (`tiles.cuh`: cooperative loaders, GEMMs in float32 or on tensor cores, row reductions,
  online softmax), with a barrier after each. Runs of elementwise operations are fused into
  one pass whose intermediate values stay in registers (the GEMM epilogues: bias, gates).
"""
from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import cgen
import islpy as isl
import numpy as np

from polyft.errors import CompileError
from polyft.etdg import OpNode

from .ast import _children, _loop_key, build_ast, tileable_loops, to_cgen
from .c_target import TILE, StatementCalls, _const_decl, prepare, statement_functions
from .kernels import _BINARY, _UNARY, StatementBody, ctype, shared_matmul_work

THREADS = 256
SHARED_LIMIT = 227 * 1024  # the most a block may opt in to (sm_90); the runtime checks its own GPU

# operand precision of matmuls -> (WMMA element type, k of a fragment); float32 has none
PRECISIONS = {"fp32": None, "tf32": ("nvcuda::wmma::precision::tf32", 8), "fp16": ("__half", 16),
              "bf16": ("__nv_bfloat16", 16)}
TOLERANCE = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}  # relative error vs eager float32

with open(os.path.join(os.path.dirname(__file__), "tiles.cuh")) as _f:
    LIBRARY = _f.read()

PRELUDE = """#include <stdint.h>
#define floord(n, d) (((n) < 0) ? -((-(n) + (d) - 1) / (d)) : (n) / (d))
#define min(x, y) ((x) < (y) ? (x) : (y))
#define max(x, y) ((x) > (y) ? (x) : (y))"""

# every statement's tiles, in dynamic shared memory (the emulator has no launches to size it)
ARENA = """#ifdef FT_EMULATED
static __align__(32) unsigned char ft_arena[{n}];
#else
extern __shared__ __align__(32) unsigned char ft_arena[];
#endif"""


def _elementwise(op) -> bool:
    return op.op in _UNARY or op.op in _BINARY


class CudaStatementBody(StatementBody):
    """Tile operations spread over the threads of a block, with a barrier after each.

    Two fusions save shared memory and passes: a run of elementwise operations of one shape
    becomes one loop (values used only inside the run stay in registers), and `add` of two
    matmuls used nowhere else accumulates the second into the first's tile.

    With a batch (StatementBody's: `_nb` <= TB instances of a parallel loop), tiles that
    depend on it hold TB instances; a matmul of their rows by a shared matrix becomes one
    GEMM of TB * P rows (where tensor cores can take even a 1-row LSTM step), elementwise
    runs cover all instances' elements at once, other operations loop over the instances.
    """

    RESTRICT = "__restrict__"
    ELEMENTS = ("threadIdx.x", "blockDim.x")  # a tile's elements strided over the block's threads

    def __init__(self, *args, precision="fp32", **kw):
        super().__init__(*args, **kw)
        self.precision = precision
        self.shared_bytes = 0  # the most of the block's arena the statement's tiles take
        self.live: list = []  # (offset, bytes, owner): an OpNode's tile, or "tmp" for one operation
        self.declared: set = set()

    def _alloc(self, nbytes: int, owner) -> str:
        """A place in the shared-memory arena (32-byte aligned, as WMMA wants), the first gap
        that fits: the C address. Statements run one after another with a barrier between,
        so each allocates from offset 0; within one, a tile's place is free again once the
        operation that reads it last has passed its barrier (`_release`)."""
        size, start = -(-nbytes // 32) * 32, 0
        for off, n, _ in sorted(self.live, key=lambda t: t[0]):
            if off - start >= size:
                break
            start = max(start, off + n)
        self.live.append((start, size, owner))
        self.shared_bytes = max(self.shared_bytes, start + size)
        return f"(ft_arena + {start})"

    def _release(self, k: int):
        """After operation k and its barrier: free the temporaries and the tiles read last."""
        self.live = [t for t in self.live if t[2] != "tmp" and self.last[t[2]] > k]

    # -- planning: who uses what, which adds fold into matmuls -----------------------------
    def _plan(self):
        self.users = {op: [] for op in self.ops}
        for op in self.ops:
            for a in op.inputs:
                if isinstance(a, OpNode) and a in self.users:
                    self.users[a].append(op)
        self.accumulate, self.alias = {}, {}  # matmul -> tile it adds into; add -> that tile
        for op in self.ops:
            ins = op.inputs
            if op.op == "add" and len(ins) == 2 and ins[0] is not ins[1] and all(
                    isinstance(a, OpNode) and a.op == "matmul" and self.users[a] == [op]
                    and tuple(a.shape) == tuple(op.shape) for a in ins):
                first, second = sorted(ins, key=self.ops.index)
                self.accumulate[second] = first
                self.alias[op] = first
        self.pos = {op: k for k, op in enumerate(self.ops)}
        self.last = {op: max([self.pos[u] for u in self.users[op]], default=self.pos[op]) for op in self.ops}
        for add, first in self.alias.items():  # the sum lives in the first matmul's tile
            self.last[first] = max(self.last[first], self.last[add])

    def _ref(self, op) -> str:
        return super()._ref(self.alias.get(op, op))

    def generate(self) -> list:
        self._plan()
        if self.batch is not None:
            self.batched = self._depends_on_batch()
        group: list = []
        for op in self.ops:
            if _elementwise(op) and op not in self.alias:
                if group and tuple(group[0].shape) != tuple(op.shape):
                    self._fused(group)
                    group = []
                group.append(op)
                continue
            if op.op == "load":  # only sets a pointer: emitted at once, a run goes on past it
                self._batched(op) if op in self.batched else self._op_load(op)
                continue
            if group:
                self._fused(group)
                group = []
            if op not in self.alias:
                self._batched(op) if op in self.batched else self._handler(op)(op)
                self._barrier()
                self._release(self.pos[op])
        if group:
            self._fused(group)
        return self.lines

    def _barrier(self):
        self.lines.append(cgen.Statement("__syncthreads()"))

    def _between_instances(self, op) -> list:
        """A barrier where the next instance reuses a tile this one staged."""
        return [] if op.op in ("load", "store") else [cgen.Statement("__syncthreads()")]

    def _fused(self, group):
        """One pass over the elements for a run of elementwise operations: each value is a
        register; those used after the run are also written to their shared tile."""
        members = set(group)
        kept = [op for op in group if any(u not in members for u in self.users[op])]
        for op in kept:
            self._decl(op)
        shape = group[0].shape
        n = max(1, math.prod(shape))
        batched = any(op in self.batched for op in group)

        def body(idx):
            lines = [cgen.Line(f"const int _b = _ef / {n};")] if batched else []
            for op in group:
                vals = []
                for a in op.inputs:
                    if isinstance(a, OpNode) and a in members:
                        vals.append(f"_t{a.id}")
                    else:
                        name, shape, _ = self._operand(a)
                        vals.append(self._at(name, shape, op.shape, idx))
                if op.op in _UNARY:
                    expr = _UNARY[op.op].format(x=vals[0] if vals else "0", f=self._f(op))
                else:
                    expr = _BINARY[op.op].format(a=vals[0], b=vals[1], f=self._f(op))
                lines.append(cgen.Line(f"const {ctype(op.dtype)} _t{op.id} = {expr};"))
                if op in kept:
                    store = cgen.Assign(f"{self._ref(op)}[{self._flat(op.shape, idx)}]", f"_t{op.id}")
                    # a value the same for every instance is written by the first instance's threads
                    lines.append(cgen.If("_b == 0", store) if batched and op not in self.batched else store)
            return lines
        self._in_batch = batched
        self.lines.append(self._loops(shape, body, "_e", "_nb" if batched else 1))
        self._in_batch = False
        self._barrier()
        self._release(self.pos[group[-1]])

    # -- tiles -------------------------------------------------------------------------------
    def _decl(self, op):
        if op in self.declared or op in self.accumulate:
            return
        self.declared.add(op)
        self._tile(f"v{op.id}", (self.batch[1] if op in self.batched else 1,) + tuple(op.shape), op.dtype, op)

    def _tile(self, name, shape, dtype, owner="tmp"):
        t = ctype(dtype)
        where = self._alloc(max(1, math.prod(shape)) * np.dtype(_np_dtype(dtype)).itemsize, owner)
        self.lines.append(cgen.Line(f"{t}* const __restrict__ {name} = ({t}*){where};"))

    def _loops(self, shape, body_fn, tag, copies=1):
        """The elements of `copies` tiles of `shape` strided over the block's threads."""
        n = max(1, math.prod(shape))
        flat = f"{tag}f"
        idx, stride = [], 1
        for d in reversed(range(len(shape))):
            idx.insert(0, f"(({flat} / {stride}) % {shape[d]})" if stride > 1 else f"({flat} % {shape[d]})")
            stride *= shape[d]
        count = n if copies == 1 else f"{copies} * {n}"
        return cgen.For(f"int {flat} = threadIdx.x", f"{flat} < {count}", f"{flat} += blockDim.x",
                        cgen.Block(body_fn(idx)))

    def _matmul_shared_right(self, op) -> list:
        """Every instance's rows times one shared matrix: a GEMM of TB * P rows (rows of
        missing instances are zeros from a load, whatever a computed tile holds: their
        results are never stored)."""
        outer, self.lines, self._in_batch = self.lines, [], False
        a_op, (b, sb, _) = op.inputs[0], self._operand(op.inputs[1])
        P, K = a_op.shape
        rows = self.batch[1] * P
        a = f"v{a_op.id}"
        if a_op.op == "load":  # gather the instances' tiles into one
            a = f"{a}_s"
            self._tile(a, (rows, K), a_op.dtype)
            self.lines.append(cgen.Statement(f"ft::gather_tiles<{ctype(a_op.dtype)}, {self.batch[1]}, {P * K}>"
                                             f"({a}, v{a_op.id}, _nb)"))
        self._matmul(op, a, b, rows, K, sb[1])
        body, self.lines, self._in_batch = self.lines, outer, True
        return body

    def _left_operand(self, a):
        """An operand tile in shared memory: loads are copied in cooperatively first."""
        name, shape, dtype = self._operand(a)
        if isinstance(a, tuple) or a.op != "load":
            return name, shape, dtype
        n = max(1, math.prod(shape))
        if (self.shared_bytes + n * 4) > SHARED_LIMIT // 2:
            return name, shape, dtype  # too big to stage: read it from global memory
        staged = f"v{a.id}_s"
        self._tile(staged, shape, dtype)
        self.lines.append(cgen.Statement(f"ft::load_tile({staged}, {name}, {n})"))
        return staged, shape, dtype

    def _matmul(self, op, a, b, P, K, Q):
        """ft::gemm_tc on tensor cores where the precision and the shapes allow (P, Q multiples
        of 16, K of the fragment's k), else ft::gemm_f32; into the tile of the matmul this one
        adds into, if any."""
        into = self.accumulate.get(op)
        if into is None:
            self._decl(op)
        out, acc = self._ref(into or op), "true" if into is not None else "false"
        tc = PRECISIONS[self.precision]
        if tc and P % 16 == 0 and Q % 16 == 0 and K % tc[1] == 0:
            stage = self._alloc(32 * (P + Q), "tmp")  # KC columns of a and rows of b, 32 bytes a row
            self.lines.append(cgen.Line(f"ft::gemm_tc<{tc[0]}, {P}, {K}, {Q}, {acc}>({out}, {a}, {b}, {stage});"
                                        f"  /* tensor cores, {self.precision} operands */"))
        else:
            self.lines.append(cgen.Statement(f"ft::gemm_f32<{P}, {K}, {Q}, {acc}>({out}, {a}, {b})"))

    def _rows(self, op, call: str) -> bool:
        """A reduction over the trailing axes as rows: `call` gets <ROWS, N, > filled in."""
        x, s, _ = self._operand(op.inputs[0])
        axes, keep = self._axes(op, s)
        if not axes or axes != list(range(len(s) - len(axes), len(s))):
            return False
        self._decl(op)
        rows, n = math.prod(s[d] for d in keep), math.prod(s[d] for d in axes)
        self.lines.append(cgen.Statement(call.format(rows=rows, n=n) + f"({self._ref(op)}, {x})"))
        return True

    def _op_sum(self, op):
        if not self._rows(op, "ft::reduce_rows<ft::Sum, {rows}, {n}, false>"):
            super()._op_sum(op)

    def _op_mean(self, op):
        if not self._rows(op, "ft::reduce_rows<ft::Sum, {rows}, {n}, true>"):
            super()._op_mean(op)

    def _op_max(self, op):
        if not self._rows(op, "ft::reduce_rows<ft::Max, {rows}, {n}, false>"):
            super()._op_max(op)

    def _op_softmax(self, op):
        s = self._operand(op.inputs[0])[1]
        if op.attrs.get("axis", -1) % len(s) != len(s) - 1 or not self._rows(op, "ft::softmax_rows<{rows}, {n}>"):
            super()._op_softmax(op)

    def _reduce(self, op, init, step, finish=None):
        """Other reductions: one thread per output element, sequentially over the reduced axes."""
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
    """Walks the AST: host code (Python lines) outside parallel loops, kernels inside.

    A loop in `tiles` (emit.ast.tileable_loops) runs `tb` iterations per block (or per
    step, inside a kernel); the statements under it are called in their batched form."""

    def __init__(self, parallel, tiles: dict, tb: int):
        self.parallel = parallel
        self.tiles, self.tb = tiles, tb
        self.statement = StatementCalls("c")
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
                tiled = [_loop_key(lp) in self.tiles for lp in loops]
                k = self._kernel(loops[-1].for_get_body(), outer, [lp.for_get_iterator().get_id().get_name()
                                                                   for lp in loops], tiled)
                grid, los, counts = [], [], []
                for lp, tl in zip(loops, tiled):
                    lo, n = _trip(lp)
                    grid.append(f"(({n}) + {self.tb - 1}) // {self.tb}" if tl else n)
                    los.append(lo)
                    counts += [n] if tl else []
                los += counts
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

    def _kernel(self, body, outer, its, tiled=()) -> int:
        """A kernel running `body` with `its` bound to block indices (x, then y); a tiled one
        to `tb` iterations from there (at most n<d>, its trip count, minus those before)."""
        k = len(self.kernels)
        lines, tile = [], None
        for d, (it, tl) in enumerate(zip(its, tiled or [False] * len(its))):
            xy = "xy"[d]
            if tl:
                lines.append(cgen.Line(f"const long {it} = lo{d} + (long)blockIdx.{xy} * {self.tb};"))
                lines.append(cgen.Line(f"const long {it}_n = min({self.tb}, n{d} - (long)blockIdx.{xy} * {self.tb});"))
                tile = (it, f"{it}_n")
            else:
                lines.append(cgen.Line(f"const long {it} = lo{d} + blockIdx.{xy};"))
        code = to_cgen(body, [False] * len(self.parallel), self.statement, lambda loop: loop,
                       tiles=self.tiles, tile=tile)
        args = [cgen.Value("const ctx_t* __restrict__", "c")]
        args += [cgen.Value("const long", f"lo{d}") for d in range(len(its))]
        args += [cgen.Value("const long", f"n{d}") for d, tl in enumerate(tiled) if tl]
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


class CudaModule(NamedTuple):
    source: str  # CUDA C++
    host: str  # the Python host driver
    layout: object  # c_target.Layout
    arities: list  # per kernel, its number of `long` arguments after the context
    shared_bytes: int  # the arena of dynamic shared memory each block needs


class SharedMemoryError(CompileError):
    """A statement's tiles do not fit in a block's shared memory."""


def generate(model, schedule, threads: int = THREADS, precision: str = "fp32") -> CudaModule:
    """The program as CUDA: `threads` per block (a multiple of 32); `precision` of the matmul
    operands (PRECISIONS; accumulation is float32 in all). The parallel loop whose
    statements gain most (emit.ast.tileable_loops) runs TILE instances per block, fewer
    where their tiles would not fit in shared memory, none if even 2 do not."""
    if precision not in PRECISIONS:
        raise CompileError(f"unknown precision {precision!r}; available: {', '.join(PRECISIONS)}", op="compile")
    if threads % 32 or not 32 <= threads <= 1024:
        raise CompileError(f"{threads} threads per block: use a multiple of 32 up to 1024", op="compile")
    for tb in (TILE, TILE // 2, TILE // 4, 2):
        try:
            return _generate(model, schedule, threads, precision, tb)
        except SharedMemoryError:
            pass
    return _generate(model, schedule, threads, precision, None)


def _generate(model, schedule, threads, precision, tb) -> CudaModule:
    etdg = model.etdg
    layout, params, namer, consts, ctx, buffer_ref = prepare(model)
    by_name = {st.name: st for st in etdg.statements}
    ast = build_ast(schedule.map, model.context)
    tiles = tileable_loops(ast, schedule.parallel, tb,
                           lambda name, pos: shared_matmul_work(by_name[name].ops, by_name[name].dims[pos])) \
        if tb else {}
    walker = _Kernels(schedule.parallel, tiles, tb)
    walker.host_lines(ast, 1, [])
    arena = [32]

    def fits(st, body):
        arena[0] = max(arena[0], body.shared_bytes)
        if body.shared_bytes > SHARED_LIMIT:
            raise SharedMemoryError(f"{st.name} keeps {body.shared_bytes} bytes of tiles in shared memory "
                                    f"(limit {SHARED_LIMIT}); use smaller tiles", op="emit")
    body = functools.partial(CudaStatementBody, precision=precision)
    functions = statement_functions(etdg, namer, buffer_ref, consts, body, "__device__ static void",
                                    cgen.Value("const ctx_t* __restrict__", "c"), walker.statement.variants, fits, tb)
    kernels = []
    for k, args, lines in walker.kernels:
        setup = [cgen.Line(f"const long {p} = c->{p}; (void){p};") for p in params]
        kernels.append(cgen.FunctionBody(
            cgen.FunctionDeclaration(cgen.Value(f'extern "C" __global__ void __launch_bounds__({threads})',
                                                f"polyft_k{k}"), args),
            cgen.Block(setup + lines)))
    consts_c = [cgen.Line("__device__ " + str(_const_decl(n, v)).replace("static const", "const"))
                for n, v in consts.values()]
    module = cgen.Module([cgen.Line(f"#define FT_THREADS {threads}"), cgen.Line(PRELUDE), cgen.Line(LIBRARY),
                          cgen.Line(ARENA.format(n=arena[0])), ctx, cgen.Line("")] + consts_c
                         + [cgen.Line("")] + functions + [cgen.Line("")] + kernels)
    host = [f"def run(launch, {', '.join(params + ['_=None'])}):"] + (walker.host or ["    pass"])
    return CudaModule(str(module) + "\n", "\n".join(host) + "\n", layout,
                      [len(args) - 1 for _, args, _ in walker.kernels], arena[0])
