"""CUDA statement bodies: a statement's tile operations spread over the threads of a block,
calling the tile library (tiles.cuh: cooperative loaders, GEMMs in float32 or on tensor
cores, row reductions, online softmax), with a barrier after each; its tiles live in the
block's shared-memory arena (emit.cuda_arena).
"""
from __future__ import annotations

import math

import cgen
import numpy as np

from polyft.errors import CompileError
from polyft.etdg import OpNode
from polyft.primitives import getitem_axes

from .c_statements import BINARY, UNARY, StatementBody, ctype, native_dtype
from .cuda_arena import SHARED_LIMIT, Arena
from .halves import to_storage

# operand precision of matmuls -> (WMMA element type, k of a fragment, bytes of an element
# converted into shared memory); float32 has none
PRECISIONS = {"fp32": None, "tf32": ("nvcuda::wmma::precision::tf32", 8, 4), "fp16": ("__half", 16, 2),
              "bf16": ("__nv_bfloat16", 16, 2)}
TOLERANCE = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}  # relative error vs eager float32

# the tile library's reductions over a tile's trailing axes: `rows` rows of `n` elements
ROWS = {"sum": "ft::reduce_rows<ft::Sum, {rows}, {n}, false>", "mean": "ft::reduce_rows<ft::Sum, {rows}, {n}, true>",
        "max": "ft::reduce_rows<ft::Max, {rows}, {n}, false>", "softmax": "ft::softmax_rows<{rows}, {n}>"}


def _elementwise(op) -> bool:
    return op.op in UNARY or op.op in BINARY


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# (results of a block tile, fragments' k per chunk on tensor cores), largest first: a GEMM takes
# the first whose stage fits in what the statement's tiles leave of shared memory
GEMM_TILES = ((4096, 2), (2048, 2), (1024, 1), (512, 1))


def gemm_tiles(P: int, Q: int, trans: bool, precision: str, results: int = 4096, fragments: int = 2,
               narrow: tuple = (False, False)) -> tuple:
    """(BM, BN, BK, stage bytes) of a GEMM of P x Q results in the tile library: block tiles
    of at most 128 x 128 and `results` (4096: 16 a thread at 256 threads, a 4 x 4 micro-tile,
    few enough registers that kernels calling several GEMMs do not spill), K in chunks of BK
    (16 in float32, `fragments` fragments' k on tensor cores) double-buffered in rows padded
    by 16 bytes: as floats, or on tensor cores as halves for an operand stored narrow (per
    operand, `narrow`: emit.halves), plus, on tensor cores, one chunk of each other operand
    converted, its rows padded by 16 bytes. tiles.cuh's Chunks and gemm_tc compute the same
    bytes and refuse to compile if they differ."""
    tc = PRECISIONS[precision]
    BN = min(128, _pow2(max(Q, 4)), results // (16 if tc else 1))  # fragments: 16 rows at least
    BM = min(128, _pow2(P), results // BN)
    BK = fragments * tc[1] if tc else 16
    blocks = [(BM, BK), (BN, BK) if trans else (BK, BN)]

    def nbytes(rows, cols, size):  # a block of rows padded by 16 bytes
        return rows * (cols + 16 // size) * size
    staged = [tc[2] if tc and n else 4 for n in narrow]
    total = -(-2 * sum(nbytes(r, c, e) for (r, c), e in zip(blocks, staged)) // 32) * 32
    if tc:
        total += sum(nbytes(r, c, tc[2]) for (r, c), n in zip(blocks, narrow) if not n)
    return BM, BN, BK, total


class CudaStatementBody(StatementBody):
    """Tile operations spread over the threads of a block, with a barrier after each.

    Fusions save shared memory and passes: a run of elementwise operations of one shape
    becomes one loop (values used only inside the run stay in registers); `add` of two
    matmuls used nowhere else accumulates the second into the first's tile, and so does a
    chain of them (a @ b + c @ d + e @ f: one tile). The GEMMs read their operands where
    they are (global or shared memory, in K-chunks), so what only matmuls read is never
    materialised (`folded`): a transpose on the right (x.T is read as x, coalesced), a
    concatenation along K on the right (a @ concat([x1, x2]) is a[:, :k1] @ x1 + a[:, k1:]
    @ x2), columns of a tile on the left (s[:, c0:c1] is s from column c0 on).

    With a batch (StatementBody's: `_nb` <= TB instances of a parallel loop), tiles that
    depend on it hold TB instances; a matmul of their rows by a shared matrix becomes one
    GEMM of TB * P rows (where tensor cores can take even a 1-row LSTM step), elementwise
    runs cover all instances' elements at once, other operations loop over the instances.
    """

    RESTRICT = "__restrict__"
    REUSE = ()  # a block's threads share each instance's work: no copy from the previous one
    ACCUMULATE = False  # the tile library's GEMMs start from zero
    ELEMENTS = ("threadIdx.x", "blockDim.x")  # a tile's elements strided over the block's threads

    def __init__(self, *args, precision="fp32", narrow=None, limit=SHARED_LIMIT, **kw):
        super().__init__(*args, **kw)
        self.precision = precision
        self.limit = limit  # the bytes of shared memory a GEMM's stage should end within
        self.narrow = narrow or {}  # buffer name -> the C type global memory holds it as (emit.halves)
        self.arena = Arena()  # owners: an OpNode's tile, or "tmp" for one operation's scratch
        self.declared: set = set()

    # -- narrow buffers: loads read as floats through ft::In, stores converted ------------
    def _stored(self, op) -> str | None:
        """The C type of a load's narrow buffers (its pieces' buffers are all narrow or none
        are: emit.halves; constant pieces follow them), else None; a folded getitem's: its
        input's."""
        if not isinstance(op, OpNode):
            return None
        if op.op == "getitem" and op in getattr(self, "folded", ()):
            return self._stored(op.inputs[0])
        names = [pc.buffer.resolve().name for pc in op.pieces if pc.buffer is not None] if op.op == "load" else []
        return self.narrow.get(names[0]) if names else None

    def _pointer(self, op, restrict: bool = False) -> str:
        h = self._stored(op)
        return f"ft::In<{h}>" if h else super()._pointer(op, restrict)

    def _address(self, op, target: str) -> str:
        h = self._stored(op)
        return f"ft::In<{h}>{{reinterpret_cast<const {h}*>({target})}}" if h else target

    def _constant(self, op, value) -> np.ndarray:
        """A narrow load's constant piece: its elements' bits (emit.halves.to_storage)."""
        h, value = self._stored(op), super()._constant(op, value)
        return to_storage(value, h).view(np.uint16) if h else value

    def _op_store(self, op):
        """Into a narrow buffer: each element rounded to its type (ft::narrow)."""
        h = self.narrow.get(op.buffer.resolve().name)
        if h is None:
            return super()._op_store(op)
        x, s, _ = self._operand(op.inputs[0])
        dst = self.buffer_ref(op.buffer, [self._index(ix) for ix in op.index])
        n = max(1, math.prod(op.shape))
        self.lines.append(cgen.For("int _e = threadIdx.x", f"_e < {n}", "_e += blockDim.x", cgen.Assign(
            f"({dst})[_e]", f"ft::narrow<{h}>({x}[_e])" if s else f"ft::narrow<{h}>({x}[0])")))

    def _release(self, k: int):
        """After operation k and its barrier: free the temporaries and the tiles read last."""
        self.arena.free(lambda owner: owner == "tmp" or self.last[owner] <= k)

    # -- planning: who uses what, which adds fold into matmuls -----------------------------
    def _plan(self):
        self.users = {op: [] for op in self.ops}
        for op in self.ops:
            for a in op.inputs:
                if isinstance(a, OpNode) and a in self.users:
                    self.users[a].append(op)
        self.pos = {op: k for k, op in enumerate(self.ops)}
        self.accumulate, self.alias = {}, {}  # matmul -> tile it adds into; add -> that tile
        for op in self.ops:
            ins = op.inputs
            if op.op == "add" and len(ins) == 2 and ins[0] is not ins[1] and all(
                    isinstance(a, OpNode) and self.users[a] == [op] and tuple(a.shape) == tuple(op.shape)
                    and (a in self.batched) == (op in self.batched) for a in ins):
                for x, mm in sorted([ins, ins[::-1]], key=lambda pair: self.pos[pair[1]], reverse=True):
                    root = self.alias.get(x, x)  # a chain of sums: all in the first matmul's tile
                    if mm.op == "matmul" and root.op == "matmul" and self.pos[root] < self.pos[mm]:
                        self.accumulate[mm] = root
                        self.alias[op] = root
                        break
        self.folded = {op for op in self.ops if self._foldable(op)}
        self.last = {op: max([self.pos[u] for u in self.users[op]], default=self.pos[op]) for op in self.ops}
        for op in self.ops:  # what a folded operation reads is read by the matmuls reading it
            if op in self.folded:
                for a in op.inputs:
                    if isinstance(a, OpNode):
                        self.last[a] = max(self.last[a], self.last[op])
        for add, root in self.alias.items():  # the sum lives in the first matmul's tile
            self.last[root] = max(self.last[root], self.last[add])

    def _foldable(self, op) -> bool:
        """A 2-D transpose, or a concatenation of 2-D tiles along axis 0, read only as the
        right operand of matmuls, or columns of a 2-D tile (x[:, c0:c1]) read only as the left
        operand: never materialised, the GEMMs read its inputs."""
        side = 1
        if op.op == "transpose":
            ok = len(op.shape) == 2
        elif op.op == "concat":
            ok = len(op.shape) == 2 and op.attrs.get("axis", 0) % 2 == 0 and \
                all(isinstance(a, OpNode) and len(a.shape) == 2 for a in op.inputs)
        elif op.op == "getitem":
            side, ok = 0, self._columns(op) is not None
        else:
            return False
        return ok and bool(self.users[op]) and all(
            u.op == "matmul" and u.inputs[side] is op and u.inputs[1 - side] is not op for u in self.users[op])

    @staticmethod
    def _columns(op):
        """The first column of a getitem that is columns of a 2-D tile (every row), else None:
        its rows are the tile's, one row stride apart (in a batch's tile too)."""
        x = op.inputs[0]
        axes = getitem_axes(op.attrs["key"], x.shape) if isinstance(x, OpNode) and len(x.shape) == 2 else None
        if axes is None or axes[0] != (0, 1, 0) or axes[1][1:] != (1, 1) or op.shape[0] != x.shape[0]:
            return None
        return axes[1][0]

    def _left_operand(self, a):
        """Columns of a tile read in place (a folded getitem): k0 -> its rows from column k0 on."""
        if not self._is_folded(a, "getitem"):
            return self._operand(a)
        c0, (name, (_, C), dtype) = self._columns(a), self._operand(a.inputs[0])
        return (lambda k0: f"ft::rows({name} + {c0 + k0}, {C})"), a.shape, dtype

    def _is_folded(self, a, kind: str) -> bool:
        return isinstance(a, OpNode) and a in self.folded and a.op == kind

    def _ref(self, op) -> str:
        return super()._ref(self.alias.get(op, op))

    def generate(self) -> list:
        if self.batch is not None:
            self.batched = self._depends_on_batch()
        self._plan()
        group: list = []
        for op in self.ops:
            if _elementwise(op) and op not in self.alias:
                if group and tuple(group[0].shape) != tuple(op.shape):
                    self._fused(group)
                    group = []
                group.append(op)
                continue
            if op in self.folded:
                continue  # read by the matmuls in its place
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

        def store(op, assign):  # a value the same for every instance: written by the first instance's threads
            return [cgen.If("_b == 0", assign) if batched and op not in self.batched else assign]

        def body(idx):
            lines = [cgen.Line(f"const int _b = _ef / {n};")] if batched else []
            return lines + self._chain(group, kept, idx, store)
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
        where = self.arena.alloc(max(1, math.prod(shape)) * native_dtype(dtype).itemsize, owner)
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
        """Every instance's rows times one shared matrix: one GEMM of TB * P rows, read from
        each instance's tile (ft::Batch: zeros for missing instances of a load; a computed
        tile's rows of missing instances hold anything, their results are never stored)."""
        outer, self.lines, self._in_batch = self.lines, [], False
        a_op = op.inputs[0]
        P, K = a_op.shape
        x, c0, ld = a_op, 0, K
        if self._is_folded(a_op, "getitem"):  # columns of each instance's tile: rows one stride apart
            x, c0, ld = a_op.inputs[0], self._columns(a_op), a_op.inputs[0].shape[1]
        if x.op == "load":
            t = f"{P}, {self._pointer(x)}" if self._stored(x) else f"{P}"  # narrow loads: ft::In<H>
            rows = lambda k0: f"ft::Batch<{t}>{{v{x.id}, (int)_nb, {ld}, {c0 + k0}}}"  # noqa: E731
        else:
            rows = lambda k0: f"ft::rows(v{x.id} + {c0 + k0}, {ld})"  # noqa: E731
        self._matmul(op, rows, None, self.batch[1] * P, K, op.shape[1])
        body, self.lines, self._in_batch = self.lines, outer, True
        return body

    def _matmul(self, op, a, b, P, K, Q):
        """op = a @ b, P x K times K x Q: ft::gemm_tc on tensor cores where the precision and
        the shapes allow (P, Q multiples of 16), else ft::gemm_f32; into the tile of the
        matmul this one adds into, if any. `a`: a row-major tile's C pointer, or k0 -> its
        rows from column k0 on (ft::Rows, ft::Batch). The right operand is read from
        op.inputs[1] (`b` is unused): a folded concatenation is one GEMM per piece, each
        accumulating into the last, on the columns of `a` that meet it."""
        if op.dtype != "float32":
            raise CompileError(f"the CUDA target multiplies float32 tiles only, not {op.dtype} (shapes "
                               f"{[P, K]} @ {[K, Q]}); cast the operands with .astype(np.float32)",
                               op="matmul", where=op.where)
        rows = a if callable(a) else (lambda k0: f"ft::rows({a} + {k0}, {K})")
        into = self.accumulate.get(op)
        if into is None:
            self._decl(op)
        out = self._ref(into or op)
        right = op.inputs[1]
        pieces = right.inputs if self._is_folded(right, "concat") else [right]
        tc = PRECISIONS[self.precision] if P % 16 == 0 and Q % 16 == 0 else None
        trans = [self._is_folded(x, "transpose") for x in pieces]
        narrow = [(self._stored(op.inputs[0]) is not None, self._stored(x.inputs[0] if t else x) is not None)
                  for x, t in zip(pieces, trans)]
        for limits in GEMM_TILES:  # the largest tiles whose stage fits (the last: an error later, if not)
            tiles = [gemm_tiles(P, Q, t, self.precision if tc else "fp32", *limits, narrow=n)
                     for t, n in zip(trans, narrow)]
            most = max(t[-1] for t in tiles)
            if self.arena.place(most) + most <= self.limit:
                break
        stage = self.arena.alloc(most, "tmp")  # one, for every piece
        k0 = 0
        for i, (x, t, (BM, BN, BK, nbytes)) in enumerate(zip(pieces, trans, tiles)):
            name, shape, _ = self._operand(x.inputs[0] if t else x)
            k = shape[1] if t else shape[0]
            args = f"{P}, {k}, {Q}, {str(into is not None or i > 0).lower()}, {str(t).lower()}, {BM}, {BN}, " \
                   + (f"{BK}, " if tc else "") + str(nbytes)
            self._gemm(tc, args, out, rows(k0), f"ft::rows({name}, {shape[1]})", stage)
            k0 += k

    def _gemm(self, tc, args: str, out: str, a: str, b: str, stage: str):
        """One call of the tile library's GEMMs: on tensor cores when `tc` (PRECISIONS)."""
        if tc:
            self.lines.append(cgen.Line(f"ft::gemm_tc<{tc[0]}, {args}>({out}, {a}, {b}, {stage});"
                                        f"  /* tensor cores, {self.precision} operands */"))
        else:
            self.lines.append(cgen.Statement(f"ft::gemm_f32<{args}>({out}, {a}, {b}, {stage})"))

    def _op_transpose(self, op):
        """A transpose the GEMMs do not read in place: threads walk the input in its own order
        (consecutive threads, consecutive addresses: coalesced from global memory) and write
        each element to its swapped place in the shared tile."""
        x, s, _ = self._operand(op.inputs[0])
        self._decl(op)
        o = self._ref(op)
        self.lines.append(self._loops(s, lambda idx: [cgen.Assign(
            f"{o}[{self._flat(op.shape, idx[:-2] + idx[:-3:-1])}]", f"{x}[{self._flat(s, idx)}]")], "_e"))

    def _rows(self, op, x, s, axes, keep) -> bool:
        """A reduction of float32 over the trailing axes as rows of the tile library (ROWS)."""
        if not axes or axes != list(range(len(s) - len(axes), len(s))) or \
                op.dtype != "float32" or self._operand(op.inputs[0])[2] != "float32":
            return False
        self._decl(op)
        rows, n = math.prod(s[d] for d in keep), math.prod(s[d] for d in axes)
        self.lines.append(cgen.Statement(ROWS[op.op].format(rows=rows, n=n) + f"({self._ref(op)}, {x})"))
        return True

    @staticmethod
    def _simd(reduction: str) -> list:
        return []

    def _op_softmax(self, op):
        x, s, _ = self._operand(op.inputs[0])
        axis = op.attrs.get("axis", -1) % len(s)
        if not self._rows(op, x, s, [axis], [d for d in range(len(s)) if d != axis]):
            super()._op_softmax(op)

    def _reduce(self, op, init, step, finish=None, simd=None):
        """Over trailing axes, the tile library's rows; other reductions: one thread per output
        element, sequentially over the reduced axes (`simd` is the C target's)."""
        x, s, axes, keep = self._reduced(op)
        if self._rows(op, x, s, axes, keep):
            return
        self._decl(op)
        o = self._ref(op)
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
