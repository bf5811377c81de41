"""Statement bodies as C: operation nodes on static tiles become macro-kernels (nested loops
with constant bounds that the C compiler unrolls and vectorizes); loads and stores become
index expressions into the original buffers, chosen per piece of the access map — a load
is a pointer into the buffer, never a copy.
"""
from __future__ import annotations

import itertools
import math
import re

import cgen
import numpy as np

from polyft.affine import Constraint, Length
from polyft.errors import CompileError
from polyft.etdg import Gather, OpNode, depends_on, shared_matmuls
from polyft.primitives import getitem_axes

from .isa import Kernel

CTYPES = {"float32": "float", "float64": "double", "float16": "float", "int64": "long long",
          "int32": "int", "uint16": "unsigned short"}  # uint16: the bits of half-width constants
# numpy's NaN rule for comparisons: a NaN operand wins (`x != x` only for NaN), unlike fmax/fmin
# ft_exp, ft_tanh, ft_sigmoid (with the f suffix for float): each target's prelude says what they are
# (the C target's vectorise, emit/vecmath.h)
UNARY = {"neg": "-({x})", "copy": "{x}", "astype": "{x}", "tanh": "ft_tanh{f}({x})", "exp": "ft_exp{f}({x})",
         "log": "log{f}({x})", "sqrt": "sqrt{f}({x})", "sigmoid": "ft_sigmoid{f}({x})",
         "relu": "ft_maximum({x}, 0)", "zeros_like": "0", "log1p": "log1p{f}({x})", "abs": "ft_abs({x})",
         "softplus": "ft_softplus{f}({x})", "sin": "sin{f}({x})", "cos": "cos{f}({x})", "tan": "tan{f}({x})",
         "erf": "ft_erf{f}({x})", "gelu": "ft_gelu{f}({x})", "rsqrt": "(1 / sqrt{f}({x}))", "sign": "ft_sign({x})",
         "floor": "floor{f}({x})", "logical_not": "(({x}) == 0)"}
# operations of two operands, and where's three ({a} its mask, read uncast: `_chain`)
BINARY = {"add": "({a}) + ({b})", "sub": "({a}) - ({b})", "mul": "({a}) * ({b})",
          "truediv": "({a}) / ({b})", "maximum": "ft_maximum({a}, {b})", "minimum": "ft_minimum({a}, {b})",
          "pow": "pow{f}({a}, {b})", "where": "(({a}) != 0 ? ({b}) : ({c}))",
          # comparisons and logic: C's 0/1 ints, stored as the mask's type (NaN compares false but in !=)
          "greater": "(({a}) > ({b}))", "less": "(({a}) < ({b}))", "greater_equal": "(({a}) >= ({b}))",
          "less_equal": "(({a}) <= ({b}))", "equal": "(({a}) == ({b}))", "not_equal": "(({a}) != ({b}))",
          "logical_and": "((({a}) != 0) & (({b}) != 0))", "logical_or": "((({a}) != 0) | (({b}) != 0))",
          "logical_xor": "((({a}) != 0) != (({b}) != 0))"}


def pow_c(op, a: str, b: str, f: str) -> str:
    """C for `a ** b` as numpy computes it: integers by repeated squaring in the integer type,
    wrapping around as numpy's do (a double would overflow to INT_MIN, and lose the low bits of
    an int64 past 2**53); a float to the power of the scalar 0.5 as numpy's `x ** 0.5` (its
    sqrt: -0.0 gives -0.0 and -inf gives NaN, where pow gives +0 and +inf)."""
    if np.dtype(op.dtype).kind in "iu":
        return f"ft_ipow{np.dtype(op.dtype).itemsize * 8}({a}, {b})"
    e = op.inputs[1]
    if not isinstance(e, OpNode) and np.asarray(e[1]).shape == () and float(np.asarray(e[1])) == 0.5:
        return f"sqrt{f}({a})"
    return f"pow{f}({a}, {b})"


# the macros behind them (both targets' preludes); max reductions step with ft_maximum too.
# ft_abs: `+ 0` makes |-0| +0, as numpy's (and sign(-0) +0); ft_softplus: numpy's logaddexp(0, x), no
# overflow; erf and gelu in double, rounded once (polyft computes them so eagerly: numpy has no erf);
# ft_sigmoid: e^-|x| / (1 + e^-|x|) below 0, as eager computes it (polyft.primitives): no underflow to 0
# while the result is representable; ft_ipow: `pow_c`; ft_fma: `_madd`
# a fused multiply-add where the ISA has one (CUDA's fmaf always), else a multiply and an add
FMA_MACROS = """#ifndef ft_fmaf
#if defined(__CUDACC__)
#define ft_fmaf fmaf
#define ft_fma fma
#elif defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define ft_fmaf(a, b, c) __builtin_fmaf((a), (b), (c))
#define ft_fma(a, b, c) __builtin_fma((a), (b), (c))
#else
#define ft_fmaf(a, b, c) ((a) * (b) + (c))
#define ft_fma(a, b, c) ((a) * (b) + (c))
#endif
#endif
"""
NAN_MACROS = FMA_MACROS + """#define ft_maximum(a, b) ((a) != (a) || (a) > (b) ? (a) : (b))
#define ft_minimum(a, b) ((a) != (a) || (a) < (b) ? (a) : (b))
#define ft_exp exp
#define ft_tanh tanh
#define ft_sigmoid(x) (((x) >= 0 ? 1 : exp(-fabs(x))) / (1 + exp(-fabs(x))))
#define ft_abs(x) ((x) < 0 ? -(x) : (x) + 0)
#define ft_softplus(x) (ft_maximum((x), 0) + log1p(exp(-fabs(x))))
#define ft_softplusf(x) (ft_maximum((x), 0) + log1pf(ft_expf(-fabsf(x))))
#define ft_sign(x) ((x) > 0 ? 1 : (x) < 0 ? -1 : (x) + 0)
#define ft_erf erf
#define ft_erff(x) ((float)erf((double)(x)))
#define ft_gelu(x) ((x) < -40 ? -0.0 : 0.5 * (x) * erfc(-(x) * 0.7071067811865476))
#define ft_geluf(x) ((float)ft_gelu((double)(x)))
#ifndef FT_INLINE
#define FT_INLINE static inline
#endif
#define FT_IPOW(name, T, U) FT_INLINE T name(T a, T b) { /* numpy's integer power, wrapping */ \
  if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0; \
  U r = 1, x = (U)a; for (; b; b >>= 1) { if (b & 1) r *= x; x *= x; } return (T)r; }
FT_IPOW(ft_ipow32, int, unsigned int)
FT_IPOW(ft_ipow64, long long, unsigned long long)"""


def ctype(dtype: str) -> str:
    return CTYPES[dtype]


def cast(expr: str, dtype: str, to: str) -> str:
    """`expr` (of element type `dtype`) as `to`'s C type: the generated code computes every
    operation in its result's type, as numpy does (int32 / int32 divides doubles)."""
    return expr if ctype(dtype) == ctype(to) else f"(({ctype(to)})({expr}))"


def lowest(dtype: str) -> str:
    """The C literal a max reduction starts from: -INFINITY, or the integer type's minimum."""
    if np.dtype(dtype).kind == "f":
        return "-INFINITY"
    low = int(np.iinfo(native_dtype(dtype)).min)
    return f"({low + 1}LL - 1)"


def native_dtype(dtype: str) -> np.dtype:
    """The dtype of a value or buffer as generated code reads and writes it: float16 tiles
    are computed and stored as float (CTYPES)."""
    return np.dtype(np.float32 if dtype == "float16" else dtype)


def _sum(parts) -> str:
    """C text of a sum of (coefficient, term) pairs plus nothing else: `2*i + N - 1`."""
    text = ""
    for coef, term in parts:
        if coef == 0:
            continue
        body = term if term is not None else str(abs(coef))
        if term is not None and abs(coef) != 1:
            body = f"{abs(coef)}*{term}"
        if not text:
            text = ("-" if coef < 0 else "") + body
        else:
            text += (" - " if coef < 0 else " + ") + body
    return text or "0"


def length_c(n: Length, param) -> str:
    """A Length as a C expression over the parameters (`param(name)` gives their C names)."""
    parts = [(v, param(k)) for k, v in sorted(n.terms.items())]
    for f in n.floors:
        inner = f"max({length_c(f[2], param)}, {f[3]})" if f[1] == "max" else \
            f"floord({length_c(f[1], param)}, {f[2]})"
        parts.append((f[0], inner))
    parts.append((n.const, None))
    return "(" + _sum(parts) + ")"


def aff_c(a, dim, param, gather) -> str:
    """An index expression as C: dims by `dim(IterDim)`, gathers by `gather(Gather)`."""
    if isinstance(a, Gather):
        return gather(a)
    parts = [(v, dim(k)) for k, v in a.terms.items()]
    parts += [(c, f"floord({aff_c(inner, dim, param, gather)}, {d})") for c, inner, d in a.divs]
    off = a.offset
    parts += [(v, param(k)) for k, v in sorted(off.terms.items())]
    if off.floors:
        parts.append((1, length_c(Length(floors=off.floors), param)))
    parts.append((off.const, None))
    return "(" + _sum(parts) + ")"


def cond_c(c: Constraint, dim, param) -> str:
    e = aff_c(c.expr, dim, param, None)
    return f"{e} >= 0" if c.kind == "ge" else f"{e} == 0"


class Rows:
    """Row r of a matrix at C pointer `base`, `stride` elements a row: `base + (r)*stride`.
    A GEMM function takes such rows as the pointer alone; other rows (a batch's instances, each
    its own tile) as an array of row pointers."""

    def __init__(self, base: str, stride: int):
        self.base, self.stride = base, stride

    def __call__(self, r) -> str:
        return f"{self.base} + ({r})*{self.stride}"


# a statement with more matmuls than this calls the module's GEMM and elementwise functions
# (StatementBody._outline); they are never inlined (GCC 12 vectorising one inlined into an OpenMP
# region crashed with an internal compiler error)
OUTLINE_MATMULS = 16
OUTLINED = "static __attribute__((noinline)) void"


# the operations whose loops an outlining statement (StatementBody._outline) also calls as the
# module's functions, besides GEMMs and fused elementwise runs: a 12-layer encoder's copies,
# permutes and softmaxes inline made one 4,300-line function that GCC took 10 s to compile
# (register allocation and PRE grow faster than a function's size)
OUTLINED_OPS = frozenset({"matmul", "transpose", "permute", "reshape", "sum", "mean", "max", "softmax",
                          "logsumexp", "concat", "getitem"})
# identifiers an outlined loop may use besides its parameters: its own (`_e0`, `_t3`, `_m`: a
# leading underscore, but not the statement's `_b`, `_nb`), the module's constants (`k0`) and
# functions (`ft_expf`), C's and libm's names; anything else stays where it is (inline)
_LOCAL = re.compile(r"(?!_b\b|_nb\b)_\w+|k\d+|ft_\w+")
_C_NAMES = frozenset("""int long float double char const restrict for if else return void sizeof
    unsigned signed short static inline while do break continue
    expf exp logf log sqrtf sqrt tanhf tanh fmaxf fmax fminf fmin fabsf fabs log1pf log1p powf pow
    sinf sin cosf cos tanf tan floorf floor
    INFINITY pragma omp simd reduction max min""".split())


def _row_param(name: str, stride, const: bool) -> cgen.Value:
    """A GEMM function's parameter for rows: a pointer (Rows, `stride` not None) or an array of them."""
    t = "const float" if const else "float"
    return cgen.Value(f"{t}* restrict" if stride is not None else f"{t}* const* restrict", name)


def _madd(acc: str, a: str, b: str, t: str) -> str:
    """`acc += a * b` of a GEMM's dot product, as one fused multiply-add for floats (ft_fma, where
    the ISA has one): the generated C is compiled with -ffp-contract=off, so that no other
    multiply and add fuse, but a dot product's may (as BLAS's, numpy's matmul, do)."""
    if t in ("float", "double"):
        return f"{acc} = ft_fma{'f' if t == 'float' else ''}({a}, {b}, {acc});"
    return f"{acc} += {a} * {b};"


def _start(init_row, init_scale, r, q) -> str:
    """A plain-loop GEMM's start for out[r, q]: 0, x[r, q], or scale[r] * x[r, q]."""
    if init_row is None:
        return "0"
    x = f"({init_row(r)})[{q}]"
    return x if init_scale is None else f"{init_scale}[{r}] * {x}"


def shared_matmul_work(ops, d) -> int:
    """Multiply-adds of the shared matmuls of dim d (what a tile of it gains)."""
    return sum(math.prod(op.inputs[0].shape) * op.shape[-1] for op in shared_matmuls(ops, d))


def instance_flops(ops) -> int:
    """About the arithmetic of one instance (the C target's cost model): two flops per
    multiply-add of a matmul, one per element every other operation makes."""
    def shape(a):
        return a.shape if isinstance(a, OpNode) else np.shape(a[1])
    return sum(2 * math.prod(op.shape) * shape(op.inputs[0])[-1] if op.op == "matmul" else math.prod(op.shape)
               for op in ops)


SPLAT_BYTES = 1 << 14  # a chunk of a row block's splatted left elements: half a 32 KB L1 (K = 256 on SSE's 4 rows)


def splat_chunks(Ks, per_k: int) -> list:
    """The K ranges of a GEMM's terms (`Ks`, in order) cut into chunks whose splatted left
    elements (`per_k` bytes a column) take at most SPLAT_BYTES: [[(term, m0, m1), ...], ...].
    A chunk's splat stays in the L1 cache while the right matrix's panels stream past it; a
    whole row block's (x and h of an LSTM's gates, K = 512) filled it, and the splat and the
    panels were read from L2 both."""
    most = max(1, SPLAT_BYTES // per_k)
    chunks, cur, room = [], [], most
    for k, K in enumerate(Ks):
        m0 = 0
        while m0 < K:
            m1 = min(K, m0 + room)
            cur.append((k, m0, m1))
            room -= m1 - m0
            m0 = m1
            if not room:
                chunks.append(cur)
                cur, room = [], most
    return chunks + ([cur] if cur else [])


def panel_width(kernel, Q: int) -> int:
    """Columns of the panels the GEMM micro-kernel `kernel` (rows, vectors, lanes) walks a
    right matrix of Q columns by: all its vectors where they divide Q, else one."""
    NV, L = kernel[1], kernel[2]
    return L * (NV if Q % (L * NV) == 0 else 1)


def packed_right(op):
    """The buffer a matmul's right operand is one whole element of (one load piece), or None:
    what a target may hand the micro-kernel as a packed copy."""
    b = op.inputs[1]
    if not isinstance(b, OpNode) or b.op != "load" or len(b.pieces) != 1 or b.pieces[0].buffer is None:
        return None
    buf = b.pieces[0].buffer.resolve()
    return buf if tuple(buf.element_shape) == tuple(b.shape) and len(b.shape) == 2 else None


def shared_matmul_rows(ops, d) -> int:
    """The most rows one instance brings to a shared matmul of dim d."""
    return max([op.inputs[0].shape[0] for op in shared_matmuls(ops, d) if len(op.inputs[0].shape) == 2], default=1)


# the micro-kernel's K loop unrolled this many times: a step's loop counter, pointer bumps and
# branch are then paid once per K_UNROLL steps. SSE2 needs a copy, a multiply and an add for each
# product (no FMA, two-operand instructions), so its kernel is bound by the core's instruction
# issue, and those three instructions a step were 10% of them: 42 -> 49-51 GFLOP/s of SSE2's 58.9
# on a Zen 4 core, AVX2 +3-5%, AVX-512 neutral (side by side in one process)
K_UNROLL = 4


class StatementBody:
    """C code for one statement's operation nodes (in order).

    With `batch=(dim, TB)` the body runs `_nb <= TB` instances at once, `dim` taking the
    values dim .. dim + _nb - 1 (a tile of a parallel loop): operations that depend on `dim`
    keep one tile per instance (a leading axis of TB), the others are computed once, and a
    matmul of per-instance rows by a shared matrix reuses each of its rows across the tile.
    """

    def __init__(self, ops, dim, param, buffer_ref, const_ref, batch=None, kernel=(4, 2, 4), packed=frozenset(),
                 functions=None):
        self.ops = ops
        self.dim = dim  # IterDim -> C name
        self.param = param  # parameter name -> C expression
        self.buffer_ref = buffer_ref  # (Buffer, [index C exprs]) -> C pointer expression
        self.const_ref = const_ref  # numpy array -> name of a static const array
        self.batch = batch
        self.batched: set = set()
        self.kernel = Kernel(*kernel)  # the GEMM micro-kernel: rows x vectors of accumulators, lanes, splat
        self.packed = packed  # names of the buffers whose matrices the call has packed in panels
        self.functions = functions  # signature -> (name, function): the module's functions the statements call
        self.sums: dict = {}  # add -> the two matmuls it sums, computed as one GEMM (_matmul_sums)
        self.accumulates: dict = {}  # add -> (matmul, tile) computed as one GEMM from the tile (_matmul_accumulates)
        self.forward: dict = {}  # GEMM op -> the store it writes the cells of (_forwarded)
        self._in_batch = False  # generating the body of the per-instance `_b` loop
        self.single: set = set()  # batched values kept for one instance at a time (_instance_major)
        self.lines: list = []
        self.temps: list = []  # (declaration line, name, C type, bytes) of the tile temporaries
        self.scratch_bytes = 0  # of the thread's scratch the temporaries take (0: on the stack)

    # -- operands ---------------------------------------------------------------------
    def _ref(self, op) -> str:
        """C expression of an operation's value (this instance's, inside the `_b` loop)."""
        if op not in self.batched or not self._in_batch or op in self.single:
            return f"v{op.id}"
        if op.op == "load":
            return f"v{op.id}[_b]"
        return f"(v{op.id} + _b*{max(1, math.prod(op.shape))})"

    def _dim(self, d) -> str:
        if self._in_batch and d is self.batch[0]:
            return f"({self.dim(d)} + _b)"
        return self.dim(d)

    def _operand(self, a):
        """(C name of a flat array, shape, dtype) for an op input."""
        if isinstance(a, OpNode):
            return self._ref(a), a.shape, a.dtype
        value = np.asarray(a[1])
        return self.const_ref(value), value.shape, value.dtype.name

    def _at(self, name, shape, out_shape, idx) -> str:
        """Element of a (broadcast) operand at output coordinates idx."""
        if not shape:
            return f"{name}[0]"
        r, q = len(out_shape), len(shape)
        terms = []
        stride = 1
        for m in reversed(range(q)):
            if shape[m] != 1:
                terms.append(f"{idx[r - q + m]}*{stride}" if stride != 1 else idx[r - q + m])
            stride *= shape[m]
        return f"{name}[{' + '.join(reversed(terms)) or '0'}]"

    def _loops(self, shape, body_fn, tag):
        """Nested loops over `shape`; body_fn(idx) gives the innermost statements."""
        idx = [f"{tag}{d}" for d in range(len(shape))]
        node = cgen.Block(body_fn(idx))
        for d in reversed(range(len(shape))):
            node = cgen.For(f"int {idx[d]} = 0", f"{idx[d]} < {shape[d]}", f"{idx[d]}++", node)
        return node

    @staticmethod
    def _flat(shape, idx) -> str:
        terms, stride = [], 1
        for d in reversed(range(len(shape))):
            terms.append(f"{idx[d]}*{stride}" if stride != 1 else idx[d])
            stride *= shape[d]
        return " + ".join(reversed(terms)) or "0"

    def _decl(self, op):
        if self._in_batch or op in self.forward:
            return  # declared once, before the `_b` loop; or written into a store's cells
        n = max(1, math.prod(op.shape)) * (self.batch[1] if op in self.batched and op not in self.single else 1)
        # the C type every other access uses (cgen's int64 is `long`: a function writing it through
        # `long long*` is another type to the compiler's aliasing rules, and its stores may be lost)
        line = cgen.ArrayOf(cgen.Value(ctype(op.dtype), f"v{op.id}"), n)
        self.temps.append((line, f"v{op.id}", ctype(op.dtype), n * native_dtype(op.dtype).itemsize))
        self.lines.append(line)

    # temporaries of one call kept on the stack; more come from the scratch, which is slower (gcc
    # keeps less in registers through pointers it cannot see the ends of). Not the 8 MB a main
    # thread has: the program may run in a thread of 1 MB (OMP_STACKSIZE=1M, threading's
    # stack_size) with the interpreter's frames below it, so only small tiles stay on the stack
    STACK_BYTES = 128 * 1024

    def _spill(self):
        """Temporaries of more than STACK_BYTES in all live in the thread's scratch (`c->ft_tmp`,
        64-byte aligned places) instead: a batch of large tiles would overflow a thread's stack
        (16 tiles of 256 x 256 floats are 4 MB a temporary; BigBird's paper shape keeps 9 MB)."""
        if sum(nbytes for *_, nbytes in self.temps) <= self.STACK_BYTES:
            return
        places = {}
        for line, name, t, nbytes in self.temps:
            places[id(line)] = cgen.Line(f"{t}* const {self.RESTRICT} {name} = ({t}*)(c->ft_tmp + {self.scratch_bytes});")
            self.scratch_bytes += -(-nbytes // 64) * 64
        self.lines = [places.get(id(line), line) for line in self.lines]

    # -- the operations ------------------------------------------------------------------
    RESTRICT = "restrict"
    ELEMENTS = ("0", "1")  # (first, step) of a loop over a tile's elements: all, in one thread

    def generate(self) -> list:
        if self.batch is not None:
            self.batched = self._depends_on_batch()
        self.sums = self._matmul_sums()
        self.accumulates = self._matmul_accumulates()
        fused = {mm: op for op, pair in self.sums.items() for mm in pair}
        fused.update({node: op for op, (*_, nodes) in self.accumulates.items() for node in nodes})
        ops = [op for op in self.ops if op not in fused]  # the rest computed by the GEMM of the sum they feed
        self.readers = {op: set() for op in ops}  # op -> the operations that read its value
        for op in ops:
            for a in [x for x in op.inputs if isinstance(x, OpNode)]:
                for src in a.inputs if a in fused else [a]:  # a fused matmul's inputs feed its sum's GEMM
                    if isinstance(src, OpNode) and src in self.readers:
                        self.readers[src].add(op)
        self.forward = self._forwarded(ops)
        if self.batch is not None:
            self._instance_major(ops)
        else:
            self._in_order(ops, self._unbatched, lambda group: self.lines.append(self._fused(group)))
        self._spill()
        return self.lines

    def _unbatched(self, op):
        if op in self.sums:
            self._decl(op)
            self.lines += self._gemm_of(op, self.sums[op])
        else:
            self._emit(op)

    def _emit(self, op):
        """The operation's code (its handler's), as a call of a module function where the
        statement outlines (_outline) and the operation is one of OUTLINED_OPS: the loops become
        a function of the operands' and the result's pointers, one per distinct loop, so a stack
        of layers calls one permute and one softmax function instead of repeating them."""
        start = len(self.lines)
        self._handler(op)(op)
        if not self._outline() or op.op not in OUTLINED_OPS:
            return
        declared = {id(line) for line, *_ in self.temps}
        work = [line for line in self.lines[start:] if id(line) not in declared]
        if len(work) == 1 and str(work[0]).startswith("ft_"):
            return  # a call already (a GEMM of the kernel's width)
        self.lines[start:] = [line for line in self.lines[start:] if id(line) in declared] + self._called(op, work)

    def _called(self, op, work) -> list:
        """`work` (the operation's loops) as one call of a module function of its operands and
        its result, or `work` itself where it reads anything else of the statement."""
        params = {}  # C expression -> (parameter, C type)
        for a in op.inputs:
            expr, _, dtype = self._operand(a)
            params.setdefault(expr, (f"x{len(params)}", f"const {ctype(dtype)}"))
        params[self._ref(op)] = ("o", ctype(op.dtype))
        text = "\n".join(str(line) for line in work)
        for expr in sorted(params, key=len, reverse=True):
            text = re.sub(rf"(?<![\w>.]){re.escape(expr)}(?!\w)", params[expr][0], text)
        names = {x for x, _ in params.values()}
        free = {w for w in re.findall(r"(?<![\w>.])[A-Za-z_]\w*", text)
                if w not in names and w not in _C_NAMES and not _LOCAL.fullmatch(w)}
        if free or re.search(r"->|\b_n?b\b", text):
            return work
        args = [cgen.Value(f"{t}* restrict", x) for x, t in params.values()]
        key = ("op", text, tuple(str(a) for a in args))
        if key not in self.functions:
            name = f"ft_{op.op}{len(self.functions)}"
            self.functions[key] = (name, cgen.FunctionBody(cgen.FunctionDeclaration(cgen.Value(OUTLINED, name), args),
                                                           cgen.Block([cgen.Line(text)])))
        return [cgen.Statement(f"{self.functions[key][0]}({', '.join(params)})")]

    def _fusable(self, op) -> bool:
        return (op.op in UNARY or op.op in BINARY) and op not in self.accumulates and op not in self.sums

    def _in_order(self, ops, emit, emit_fused):
        """`emit(op)` for each operation, except that consecutive elementwise ones of one shape
        go to `emit_fused(group)` together (a load between them only sets a pointer)."""
        group: list = []
        for op in ops:
            if self._fusable(op) and (not group or tuple(group[0].shape) == tuple(op.shape)):
                group.append(op)
                continue
            if group and op.op != "load":
                emit_fused(group)
                group = []
            if self._fusable(op):
                group = [op]
            else:
                emit(op)
        if group:
            emit_fused(group)

    def _fused(self, group) -> cgen.Generable:
        """One loop over the elements for a run of elementwise operations of one shape: each
        value is a scalar, stored to its tile only where an operation outside the run reads it
        (declared by the caller: `_kept`), so a chain like exp(s - m) is one pass, not two. With
        the module's `functions`, the loop is a function of its operands' pointers, one per
        distinct loop, which the statement calls (`_outline`): a statement of 256 layers' tanh is
        256 calls of one function, not 256 loops in one."""
        kept = self._kept(group)
        if not self._in_batch:
            for op in kept:
                self._decl(op)
        if not self._outline():
            return self._loops(group[0].shape, lambda idx: self._chain(group, kept, idx), "_e")
        operands = {}  # C expression of an operand -> (parameter, C type)

        def name_of(a):
            expr, _, dtype = self._operand(a)
            return operands.setdefault(expr, (f"x{len(operands)}", ctype(dtype)))[0]
        outs = {op: f"o{k}" for k, op in enumerate(kept)}
        loop = self._loops(group[0].shape, lambda idx: self._chain(group, kept, idx, name_of=name_of,
                                                                    out_of=outs.get), "_e")
        params = [cgen.Value(f"const {t}* restrict", x) for x, t in operands.values()]
        params += [cgen.Value(f"{ctype(op.dtype)}* restrict", outs[op]) for op in kept]
        text = str(loop)
        for k, op in enumerate(group):  # the values named by place, so that layers' loops are one
            text = re.sub(rf"\b_t{op.id}\b", f"_t{k}", text)
        key = ("elementwise", text, tuple(str(p) for p in params))
        if key not in self.functions:
            name = f"ft_elementwise{len(self.functions)}"
            self.functions[key] = (name, cgen.FunctionBody(cgen.FunctionDeclaration(cgen.Value(OUTLINED, name),
                                                                                    params), cgen.Block([cgen.Line(text)])))
        args = list(operands) + [self._ref(op) for op in kept]
        return cgen.Statement(f"{self.functions[key][0]}({', '.join(args)})")

    def _chain(self, group, kept, idx, store=lambda op, assign: [assign], name_of=None, out_of=None) -> list:
        """The lines computing a fused run's values at element `idx` as scalars `_t<id>`, and
        storing those `kept` (`store(op, assignment)` wraps each store); `name_of(operand)` and
        `out_of(op)` name the operands' and the kept values' arrays (by default their own)."""
        members, lines = set(group), []
        for op in group:
            vals = []
            for k, a in enumerate(op.inputs):
                if isinstance(a, OpNode) and a in members:
                    name, dtype = f"_t{a.id}", a.dtype
                else:
                    name, shape, dtype = self._operand(a)
                    name = self._at(name_of(a) if name_of else name, shape, op.shape, idx)
                # where's mask is tested as it is (a float 0.5 cast to an int result would be 0)
                vals.append(name if op.op == "where" and k == 0 else cast(name, dtype, op.dtype))
            if op.op in UNARY:
                expr = UNARY[op.op].format(x=vals[0] if vals else "0", f=self._f(op))
            elif op.op == "pow":
                expr = pow_c(op, vals[0], vals[1], self._f(op))
            else:
                expr = BINARY[op.op].format(a=vals[0], b=vals[1], c=vals[-1], f=self._f(op))
            lines.append(cgen.Line(f"const {ctype(op.dtype)} _t{op.id} = {expr};"))
            if op in kept:
                out = out_of(op) if out_of else self._ref(op)
                lines += store(op, cgen.Assign(f"{out}[{self._flat(op.shape, idx)}]", f"_t{op.id}"))
        return lines

    def _outline(self) -> bool:
        """Whether the GEMMs and elementwise loops are calls of the module's functions: in a
        statement of more than OUTLINE_MATMULS matmuls (a deep stack of layers merged into one),
        where the C compiler's time grows faster than the statement; smaller ones keep their code
        in place, as the compiler optimises it best."""
        return self.functions is not None and sum(op.op == "matmul" for op in self.ops) > OUTLINE_MATMULS

    def _kept(self, group) -> list:
        """The operations of a fused run whose value something outside the run reads (or nothing
        does: a statement's value is never dropped unseen)."""
        return [op for op in group if not self.readers[op] or self.readers[op] - set(group)]

    def _across(self, op) -> bool:
        """A batched operation over all the batch's instances at once: a GEMM of every
        instance's rows by one shared matrix."""
        return (op.op == "matmul" and self._shared_right(op)) or op in self.sums or \
            (op in self.accumulates and self._shared_right(self.accumulates[op][0]))

    def _instance_major(self, ops):
        """A batch's operations, each run of per-instance ones (between the GEMMs over all
        instances) in one loop over the instances, so an instance goes through the whole run
        before the next starts: a value used only inside its run is kept for one instance
        (`single`) and stays in the L1 cache, instead of TB tiles written by one pass and read
        back by the next (flash attention: 16 instances of 4-8 KB tiles a pass). Operations
        that do not depend on the batch are computed once, before the run."""
        run_of, k = {}, 0
        for op in ops:
            if op in self.batched and self._across(op):
                k += 1
            elif op in self.batched:
                run_of[op] = k
        self.single = {op for op, r in run_of.items() if op.op not in ("load", "store")
                       and all(run_of.get(u) == r for u in self.readers[op])}
        run = {"body": None, "stored": False}  # the open run's loop body; whether it stores yet

        def close():
            if run["body"] is not None:
                self.lines.append(cgen.For("int _b = 0", "_b < _nb", "_b++", cgen.Block(run["body"])))
            run.update(body=None, stored=False)

        def inside(emit, declare):
            """Emit into the open run's loop body; `declare` what lives outside it."""
            declare()
            outer, self.lines = self.lines, []
            self._in_batch = True
            lines = emit()
            run["body"] = (run["body"] or []) + (self.lines if lines is None else lines)
            self._in_batch = False
            self.lines = outer

        def one(op):
            if op not in run_of:
                if op in self.batched or (run["stored"] and op.op == "store"):
                    close()
                self._batched(op) if op in self.batched else self._unbatched(op)
                return

            def declare():
                if op.op == "load":
                    self.lines.append(cgen.Line(f"{self._pointer(op)} v{op.id}[{self.batch[1]}];"))
                elif op.op != "store":
                    self._decl(op)

            def emit():
                self._emit(op)
                return self._reused(op, self.lines)
            inside(emit, declare)
            run["stored"] = run["stored"] or op.op == "store"

        def fused(group):
            for _, part in itertools.groupby(group, key=lambda op: op in run_of):
                part = list(part)
                if part[0] in run_of:
                    inside(lambda: [self._fused(part)], lambda: [self._decl(op) for op in self._kept(part)])
                else:  # computed once, before the run
                    self.lines.append(self._fused(part))
        self._in_order(ops, one, fused)
        close()

    def _depends_on_batch(self) -> set:
        return depends_on(self.ops, self.batch[0])

    def _uses(self) -> dict:
        """Operation node -> how many operations of the statement read it."""
        uses: dict = {}
        for op in self.ops:
            for a in op.inputs:
                if isinstance(a, OpNode):
                    uses[a] = uses.get(a, 0) + 1
        return uses

    def _matmul_sums(self) -> dict:
        """`x @ W + h @ U` (an add of two matmuls used nowhere else, same shape, float): add ->
        its matmuls, computed as one GEMM `[x h] @ [W; U]` that accumulates both products in
        the same registers, without building either concatenation."""
        uses = self._uses()
        out = {}
        for op in self.ops:
            mms = [a for a in op.inputs if isinstance(a, OpNode) and a.op == "matmul"]
            if op.op != "add" or len(mms) != 2 or mms[0] is mms[1] or ctype(op.dtype) != "float" or \
                    any(uses[m] != 1 or tuple(m.shape) != tuple(op.shape) or m.dtype != op.dtype or
                        any(len(self._operand(x)[1]) != 2 for x in m.inputs) for m in mms):
                continue
            # batched: both products of per-instance rows by a shared matrix; else neither batched
            kinds = {self._shared_right(m) if m in self.batched else None for m in mms}
            if kinds == ({True} if op in self.batched else {None}):
                out[op] = mms
        return out

    ACCUMULATE = True  # the C target's GEMMs may start from a tile (_matmul_accumulates)

    def _matmul_accumulates(self) -> dict:
        """`x + p @ v` (an add of a float tile x and a matmul used nowhere else, of one shape,
        not already a sum of two matmuls): add -> (matmul, x, scale, the nodes the GEMM
        computes), computed as one GEMM whose accumulators start from x's rows, so neither the
        product nor the sum is a separate pass. Where x is `a * y` (a column a of one value a
        row, used nowhere else), they start from a[r] * y's rows: flash attention's
        `alpha * o + p @ v` is then one pass over o. Batched, the GEMM is per instance where the
        right operand is per instance, else one GEMM over all the instances' rows (_gemm_of),
        unscaled: back-to-back GEMMs' `acc + (a @ b) @ c` adds c's product into acc's rows as
        it goes, where it wrote the product and then read both again to add them."""
        if not self.ACCUMULATE:
            return {}
        uses = self._uses()
        out = {}
        for op in self.ops:
            mms = [a for a in op.inputs if isinstance(a, OpNode) and a.op == "matmul"]
            if op.op != "add" or op in self.sums or len(mms) != 1 or len(op.inputs) != 2:
                continue
            mm, x = mms[0], op.inputs[1 if op.inputs[0] is mms[0] else 0]
            batched = op in self.batched
            if not isinstance(x, OpNode) or uses[mm] != 1 or ctype(op.dtype) != "float" \
                    or any(len(self._operand(a)[1]) != 2 for a in mm.inputs) or (mm in self.batched) != batched:
                continue
            across = batched and self._shared_right(mm)  # one GEMM over every instance's rows
            starts = [(x, None, (mm,))]
            if x.op == "mul" and uses[x] == 1 and len(x.inputs) == 2 and not across:
                starts = [(y, a, (mm, x)) for a, y in (x.inputs, x.inputs[::-1])
                          if self._operand(a)[1:] == ((op.shape[0], 1), "float32")] + starts
            for y, scale, nodes in starts:
                if isinstance(y, OpNode) and tuple(y.shape) == tuple(op.shape) == tuple(mm.shape) \
                        and ctype(y.dtype) == ctype(mm.dtype) == "float" and (y in self.batched) == batched:
                    out[op] = (mm, y, scale, nodes)
                    break
        return out

    def _forwarded(self, ops) -> dict:
        """GEMM op -> the store that is its only reader, where the GEMM can write the store's
        cells itself instead of a tile that the store then copies (the b2b GEMMs' accumulator
        and flash attention's o, every step): the same shape, batched alike, and the stored
        buffer read by no operand of the products and no operation after the GEMM, which writes
        where the store would, earlier. The GEMM's starting tile may share the cells: a block
        reads its rows into the accumulators before it writes them, and panels are disjoint
        columns."""
        out, position = {}, {op: k for k, op in enumerate(ops)}
        for op in ops:
            if op in self.sums:
                mms = self.sums[op]
            elif op in self.accumulates:
                mms = [self.accumulates[op][0]]
            elif op.op == "matmul":
                mms = [op]
            else:
                continue
            store = next(iter(self.readers[op])) if len(self.readers[op]) == 1 else None
            if store is None or store.op != "store" or store.inputs[0] is not op or ctype(op.dtype) != "float" \
                    or tuple(store.shape) != tuple(op.shape) or (store in self.batched) != (op in self.batched):
                continue
            operands = [a for mm in mms for a in mm.inputs if isinstance(a, OpNode)]
            loads = [a for a in ops if a.op == "load" and any(pc.buffer is store.buffer for pc in a.pieces)]
            if any(a in operands or any(position[r] > position[op] for r in self.readers[a]) for a in loads):
                continue  # the cells are read by a product, or by an operation the GEMM now comes before
            out[op] = store
        return out

    def _store_ref(self, store) -> str:
        return self.buffer_ref(store.buffer, [self._index(ix) for ix in store.index])

    def _destination(self, op, Q: int, across: bool = False) -> tuple:
        """(lines, rows): where a GEMM writes op's rows, and the lines declaring it: op's tile,
        or the cells of the store it is forwarded to. `across`: the GEMM runs over every
        instance's rows of a batch (inside `_batched`), one address an instance."""
        store = self.forward.get(op)
        if store is None:
            return [], Rows(f"v{op.id}" if across else self._ref(op), Q)
        dst = self._store_ref(store)
        if not across:
            return [cgen.Line(f"float* const d{op.id} = {dst};")], Rows(f"d{op.id}", Q)
        P = op.shape[0]
        return ([cgen.Line(f"float* d{op.id}[{self.batch[1]}];"),
                 cgen.For("int _b = 0", "_b < _nb", "_b++", cgen.Statement(f"d{op.id}[_b] = {dst}"))],
                lambda r: f"d{op.id}[({r}) / {P}] + (({r}) % {P})*{Q}")

    def _accumulate(self, op):
        """op = x + a @ b, or scale * x + a @ b (self.accumulates): the GEMM's accumulators
        start from x's rows (times the scale's)."""
        mm, x, scale, _ = self.accumulates[op]
        (a, (P, K), _), b = self._left_operand(mm.inputs[0]), self._right(mm)
        self._decl(op)
        Q = op.shape[1]
        sr = None if scale is None else self._operand(scale)[0]
        lines, out = self._destination(op, Q)
        self.lines += lines + self._gemm(str(P), [(K, Rows(a, K), b)], Q, out, "float",
                                         init_row=Rows(self._ref(x), Q), init_scale=sr)

    def _shared_right(self, mm) -> bool:
        return not (isinstance(mm.inputs[1], OpNode) and mm.inputs[1] in self.batched)

    def _batched(self, op):
        """One tile per instance: declare for TB, then the operation inside `for _b < _nb`."""
        if op.op == "load":
            self.lines.append(cgen.Line(f"{self._pointer(op)} v{op.id}[{self.batch[1]}];"))
        elif op.op != "store":
            self._decl(op)
        outer, self.lines = self.lines, []
        self._in_batch = True
        if op.op == "matmul" and self._shared_right(op):
            body = self._matmul_shared_right(op)
        elif op in self.sums:
            body = self._gemm_of(op, self.sums[op])
        elif op in self.accumulates and self._shared_right(self.accumulates[op][0]):
            body = self._gemm_of(op, [self.accumulates[op][0]], init=self.accumulates[op][1])
        else:
            self._emit(op)
            lines = self._reused(op, self.lines) + self._between_instances(op)
            body = [cgen.For("int _b = 0", "_b < _nb", "_b++", cgen.Block(lines))]
        self._in_batch = False
        self.lines = outer + body

    REUSE = ("transpose",)  # batched operations worth copying from the previous instance

    def _reused(self, op, lines) -> list:
        """`lines` (one instance of a batched `op` in REUSE), or a copy of the previous
        instance's result where every input is the same tile: consecutive instances of a tile
        often read one key tile (flash attention's k.T for the 8 query tiles of a head)."""
        loads = [a for a in op.inputs if isinstance(a, OpNode)]
        if op.op not in self.REUSE or not loads or any(a.op != "load" or a not in self.batched for a in loads):
            return lines
        same = " && ".join(f"v{a.id}[_b] == v{a.id}[_b - 1]" for a in loads)
        if op in self.single:  # its one tile still holds the previous instance's result
            return [cgen.If(f"!(_b > 0 && {same})", cgen.Block(lines))]
        n = max(1, math.prod(op.shape))
        copy = cgen.Statement(f"memcpy(v{op.id} + _b*{n}, v{op.id} + (_b - 1)*{n}, {n} * sizeof *v{op.id})")
        return [cgen.If(f"_b > 0 && {same}", cgen.Block([copy]), cgen.Block(lines))]

    def _between_instances(self, op) -> list:
        """Code after each instance of an operation (the CUDA target's barrier)."""
        return []

    def _matmul_shared_right(self, op) -> list:
        return self._gemm_of(op, [op])

    def _gemm_of(self, op, mms, init=None) -> list:
        """op = the sum of the matmuls `mms` (one, or a fused pair), plus the tile `init` where
        given, as one GEMM. Batched (per-instance rows times one shared matrix): one
        matrix-matrix product over all the tile's rows, so each row of the shared matrix is
        loaded once per tile (the reuse a GEMM gets) instead of once per instance."""
        terms = [(mm.inputs[0].shape[1], self._rows(mm.inputs[0]), self._right(mm)) for mm in mms]
        P, Q = op.shape
        rows = f"_nb*{P}" if op in self.batched else str(P)
        lines, out = self._destination(op, Q, across=op in self.batched)
        return lines + self._gemm(rows, terms, Q, out, ctype(op.dtype),
                                  init_row=None if init is None else self._rows(init),
                                  most=self.batch[1] * P if op in self.batched else P)

    def _rows(self, a):
        """Row r of a matrix operand as a C pointer: of the whole batch's rows, instance after
        instance, where it is batched (a batched load is an array of per-instance pointers)."""
        if a not in self.batched:
            name, (_, K), _ = self._operand(a)
            return Rows(name, K)
        P, K = a.shape
        if a.op == "load":
            return lambda r: f"v{a.id}[({r}) / {P}] + (({r}) % {P})*{K}"
        return Rows(f"v{a.id}", K)

    def _right(self, mm):
        """The right operand of a matmul as the GEMM reads it: (C pointer, None) to a row-major
        matrix, or (C pointer, panel width) to its packed copy (c_target.packed_weights)."""
        buf = packed_right(mm)
        if buf is None or buf.name not in self.packed:
            return self._operand(mm.inputs[1])[0], None
        pc = mm.inputs[1].pieces[0]
        return (self.buffer_ref(pc.buffer, [self._index(ix) for ix in pc.index], packed=True),
                panel_width(self.kernel, mm.shape[1]))

    def _gemm(self, nrows: str, terms: list, Q: int, out_row, t: str, init_row=None, init_scale=None,
              most=None) -> list:
        """_gemm_code's GEMM (at most `most` rows, nrows's value by default), as a call of one of
        the module's functions (`functions`: signature -> (name, function)) where it runs the
        micro-kernel: each statement's code holds a call, not the kernel's, so a statement of
        256 chained layers is not 256 kernels that the C compiler optimises as one function
        (time superlinear in its size: 128 layers took 53 s), and statements of one shape share
        one. Rows at a fixed stride (Rows) are passed as their first row's pointer, others (a
        batch's instances, each its own tile) as an array of row pointers."""
        if not self._outline() or Q % self.kernel[2] or t != "float":
            return self._gemm_code(nrows, terms, Q, out_row, t, init_row, init_scale)
        const = nrows if nrows.isdigit() else None
        rows = [a_row for _, a_row, _ in terms] + [out_row] + ([init_row] if init_row else [])
        kinds = tuple(r.stride if isinstance(r, Rows) else None for r in rows)  # None: an array of pointers
        key = ("gemm", const, tuple((K, panel) for K, _, (_, panel) in terms), Q, kinds, init_scale is not None)
        if key not in self.functions:
            name = f"ft_gemm{len(self.functions)}"
            params = [f"ga{k}" for k in range(len(terms))] + ["go"] + (["gx"] if init_row else [])
            inner = [Rows(p, stride) if stride is not None else (lambda r, p=p: f"{p}[{r}]")
                     for p, stride in zip(params, kinds)]
            consts = [True] * len(terms) + [False, True]
            args = [] if const else [cgen.Value("const long", "nrows")]
            for k, (_, _, (_, panel)) in enumerate(terms):
                args += [_row_param(f"ga{k}", kinds[k], True), cgen.Value("const float* restrict", f"gb{k}")]
            args += [_row_param(p, kind, c) for p, kind, c in zip(params[len(terms):], kinds[len(terms):],
                                                                 consts[len(terms):])]
            args += [cgen.Value("const float* restrict", "gs")] if init_scale else []
            code = self._gemm_code(const or "nrows", [(K, inner[k], (f"gb{k}", panel))
                                                      for k, (K, _, (_, panel)) in enumerate(terms)],
                                   Q, inner[len(terms)], t, inner[len(terms) + 1] if init_row else None,
                                   "gs" if init_scale else None)
            self.functions[key] = (name, cgen.FunctionBody(
                cgen.FunctionDeclaration(cgen.Value(OUTLINED, name), args), cgen.Block(code)))
        name = self.functions[key][0]
        n = most if most is not None else int(nrows)
        arrays = [(f"_g{k}", r) for k, r in enumerate(rows) if not isinstance(r, Rows)]
        passed = [r.base if isinstance(r, Rows) else f"_g{k}" for k, r in enumerate(rows)]
        args = ([] if const else [nrows]) + [x for k, (_, _, (b, _)) in enumerate(terms) for x in (passed[k], b)]
        args += passed[len(terms):] + ([init_scale] if init_scale else [])
        call = cgen.Statement(f"{name}({', '.join(args)})")
        if not arrays:
            return [call]
        return [cgen.Block([cgen.Line(" ".join(f"const float* {a}[{n}];" for a, _ in arrays)),
                            cgen.For("int _r = 0", f"_r < {nrows}", "_r++",
                                     cgen.Block([cgen.Line(f"{a}[_r] = {r('_r')};") for a, r in arrays])),
                            call])]

    def _gemm_code(self, nrows: str, terms: list, Q: int, out_row, t: str, init_row=None, init_scale=None) -> list:
        """out[r, :] = sum of a[r, :] @ b over the (K, a_row, (b, panel)) `terms`, for r <
        nrows: a register-blocked micro-kernel (MR rows x NV vectors of L floats, `ft_vec`,
        accumulated over every term's K and stored once; self.kernel, chosen for the ISA:
        emit/isa.py) when L divides Q, else plain loops. `a_row(r)` / `out_row(r)` are C
        pointers to row r; `b` points to the right matrix, row-major (panel None) or packed in
        panels of `panel` columns. With `init_row(r)`, out = that row + the products (the
        accumulators start from it), times `init_scale[r]` where given (a C pointer to a value a row).
        The panels of the right matrix are the outer loop, its row blocks the inner one: a
        panel (K x the kernel's columns) stays in the L1/L2 cache for all the blocks, where
        the other order streamed the whole matrix once per block (an LSTM's four 256 x 256
        gate pairs on AVX2: 82 -> 92 GFLOP/s on a Zen 4 core). With kernel.splat, a row
        block's left elements are splatted into vectors (`_ab<term>`) a chunk of K at a time
        (`splat_chunks`) before the columns are walked, the row blocks outside (a splat serves
        every panel); after the first chunk the accumulators start from what the one before
        stored."""
        MR, NV, L, splat = self.kernel
        NV = NV if Q % (L * NV) == 0 else 1
        panels_outer = not splat  # a panel of the right matrix is read from L1/L2 by every row block (BLIS's jr)
        if Q % L or t != "float":
            assert all(panel is None for *_, (_, panel) in terms)
            body = [cgen.Line(f"{t}* restrict _o = {out_row('_r')};"),
                    cgen.For("int _q = 0", f"_q < {Q}", "_q++",
                             cgen.Assign("_o[_q]", _start(init_row, init_scale, "_r", "_q")))]
            for K, a_row, (b, _) in terms:
                body.append(cgen.Block([
                    cgen.Line(f"const {t}* restrict _a = {a_row('_r')};"),
                    cgen.For("int _m = 0", f"_m < {K}", "_m++", cgen.For(
                        "int _q = 0", f"_q < {Q}", "_q++",
                        cgen.Line(_madd("_o[_q]", "_a[_m]", f"{b}[_m*{Q} + _q]", t))))]))
            return [cgen.For("int _r = 0", f"_r < {nrows}", "_r++", cgen.Block(body))]
        def block(MR, first, last, tail):
            """Row blocks of MR rows from `first` while `last` holds; a `tail` block may run
            past nrows (the extra rows recompute its first row and are not stored)."""
            acc = [[f"_c{i}_{v}" for v in range(NV)] for i in range(MR)]
            clamp = f"_r0 + _i < {nrows} ? _r0 + _i : _r0" if tail else "_r0 + _i"
            rows = [cgen.Line(f"const int _r = {clamp};")]
            rows += [cgen.Line(f"_a{k}[_i] = {a_row('_r')};") for k, (_, a_row, _) in enumerate(terms)]
            rows += [cgen.Line(f"_o[_i] = {out_row('_r')};")]
            rows += [cgen.Line(f"_x[_i] = {init_row('_r')};")] if init_row else []
            rows += [cgen.Line(f"_s[_i] = {init_scale}[_r];")] if init_scale else []
            if init_row:  # the accumulators start from the tile's rows
                start = [cgen.Line(f"ft_vec {', '.join(c for row in acc for c in row)};")] + [
                    cgen.Statement(f"memcpy(&{acc[i][v]}, _x[{i}] + _q0 + {L * v}, sizeof {acc[i][v]})")
                    for i in range(MR) for v in range(NV)]
                start += [cgen.Statement(f"{acc[i][v]} *= _s[{i}]") for i in range(MR) for v in range(NV)
                          if init_scale]
            else:
                start = [cgen.Line(f"ft_vec {', '.join(f'{c} = {{0}}' for row in acc for c in row)};")]
            resume = [cgen.Line(f"ft_vec {', '.join(c for row in acc for c in row)};")] + [
                cgen.Statement(f"memcpy(&{acc[i][v]}, _o[{i}] + _q0 + {L * v}, sizeof {acc[i][v]})")
                for i in range(MR) for v in range(NV)]  # a later chunk's start: what the one before stored
            store = [cgen.Statement(f"memcpy(_o[{i}] + _q0 + {L * v}, &{acc[i][v]}, sizeof {acc[i][v]})")
                     for v in range(NV) for i in range(MR)]
            if tail:
                store = [cgen.If(f"_r0 + {MR} <= {nrows}", cgen.Block(store), cgen.Block([
                    cgen.If(f"_r0 + {i} < {nrows}", cgen.Block(store[i::MR])) for i in range(MR)]))]
            chunks = (splat_chunks([K for K, *_ in terms], MR * L * 4) if splat
                      else [[(k, 0, K) for k, (K, *_) in enumerate(terms)]])
            parts = []
            for c, chunk in enumerate(chunks):
                steps, splats = [], []
                for k, m0, m1 in chunk:
                    K, _, (b, panel) = terms[k]
                    assert panel in (None, L * NV)
                    at = f"_m*{Q} + _q0" if panel is None else f"_q0*{K} + _m*{panel}"  # panel _q0 / panel starts at _q0*K
                    m = f"_m - {m0}" if m0 else "_m"
                    left = (lambda i, k=k, m=m: f"_ab{k}[{m}][{i}]") if splat else (lambda i, k=k: f"_a{k}[{i}][_m]")
                    steps.append(cgen.Pragma(f"GCC unroll {K_UNROLL}"))
                    steps.append(cgen.For(f"int _m = {m0}", f"_m < {m1}", "_m++", cgen.Block(
                        [cgen.Line(f"ft_vec _w{v};") for v in range(NV)]
                        + [cgen.Statement(f"memcpy(&_w{v}, {b} + {at} + {L * v}, sizeof _w{v})") for v in range(NV)]
                        + [cgen.Statement(f"ft_vmadd{'_v' if splat else '_s'}({acc[i][v]}, {left(i)}, _w{v})")
                           for i in range(MR) for v in range(NV)])))
                    if splat:
                        splats += [cgen.Line(f"ft_vec _ab{k}[{m1 - m0}][{MR}];"), cgen.For(
                            f"int _m = {m0}", f"_m < {m1}", "_m++", cgen.Block(
                                [cgen.Line(f"_ab{k}[{m}][{i}] = (ft_vec){{0}} + _a{k}[{i}][_m];") for i in range(MR)]))]
                kernel = [*(resume if c else start)] + steps + store
                if panels_outer:
                    parts += kernel
                else:
                    parts.append(cgen.Block(splats + [
                        cgen.For("int _q0 = 0", f"_q0 < {Q}", f"_q0 += {L * NV}", cgen.Block(kernel))]))
            return cgen.For(f"int _r0 = {first}", last, f"_r0 += {MR}", cgen.Block([
                cgen.Line(" ".join(f"const {t}* _a{k}[{MR}];" for k in range(len(terms))) + f" {t}* _o[{MR}];"
                          + (f" const {t}* _x[{MR}];" if init_row else "") + (f" {t} _s[{MR}];" if init_scale else "")),
                cgen.For("int _i = 0", f"_i < {MR}", "_i++", cgen.Block(rows)), *parts]))
        # blocks of the kernel's MR rows, then the last `_rt` rows in blocks of MT = 4 (2 where
        # MR is 4 or less), _rt being the remainder of MR or, where that wastes fewer rows,
        # one MR block more: on AVX2's 6-row kernel 8 rows run as 4 + 4, 14 as 6 + 4 + 4
        MT = 4 if MR > 4 else 2
        waste = lambda n: -n % MT  # noqa: E731  (rows a tail of n computes and drops)
        longer = [r for r in range(1, MR) if waste(r + MR) < waste(r)]
        if nrows.isdigit():
            r = int(nrows) % MR
            rest = str(r + MR if r in longer and int(nrows) >= r + MR else r)
        else:
            rest = "_rt"
        out = [block(MR, "0", f"_r0 + {MR} <= {nrows} - {rest}", False)]
        if rest != "0":
            out.append(block(MT, f"{nrows} - {rest}", f"_r0 < {nrows}", True))
        if rest == "_rt":
            longer_c = " || ".join(f"_rt0 == {r}" for r in longer) or "0"
            out = [cgen.Line(f"const long _rt0 = ({nrows}) % {MR};"),
                   cgen.Line(f"const long _rt = ({longer_c}) && {nrows} >= _rt0 + {MR} ? _rt0 + {MR} : _rt0;")] + out
        if panels_outer:
            out = [cgen.For("int _q0 = 0", f"_q0 < {Q}", f"_q0 += {L * NV}", cgen.Block(out))]
        return [cgen.Block(out)]

    def _handler(self, op):
        if op in self.accumulates:
            return self._accumulate
        handler = getattr(self, f"_op_{op.op}", None)
        if handler is None:
            raise CompileError(f"no kernel for the operation {op.op} (shape {list(op.shape)})",
                               op="emit", where=op.where)
        return handler

    def _f(self, op):
        return "f" if op.dtype == "float32" else ""

    def _left_operand(self, a):
        """The left matmul operand (the CUDA target stages it in shared memory)."""
        return self._operand(a)

    def _op_matmul(self, op):
        (a, sa, _), (b, sb, _) = self._left_operand(op.inputs[0]), self._operand(op.inputs[1])
        if len(sa) != 2 or len(sb) != 2:
            raise CompileError(f"matmul of {list(sa)} and {list(sb)}: only 2-D tiles", op="emit", where=op.where)
        self._matmul(op, a, b, sa[0], sa[1], sb[1])

    def _matmul(self, op, a, b, P, K, Q):
        """op = a @ b (P x K times K x Q); b is read through _right, which may point to a packed copy."""
        self._decl(op)
        lines, out = self._destination(op, Q)
        self.lines += lines + self._gemm(str(P), [(K, Rows(a, K), self._right(op))], Q, out, ctype(op.dtype))

    def _op_transpose(self, op):
        """Swaps the last two axes; by blocks of 8 x 8 where they divide both, each block read
        row by row: the input (often a tile of a large array, not yet cached) is read in order,
        which the prefetchers follow, and the scattered writes stay in 8 lines of the output.
        1.6-2.5x faster than reading the input down its columns (32 x 64 tiles, SSE2 to AVX-512)."""
        x, s, _ = self._operand(op.inputs[0])
        self._decl(op)
        o = self._ref(op)
        if op.shape[-1] % 8 or op.shape[-2] % 8:
            self.lines.append(self._loops(op.shape, lambda idx: [cgen.Assign(
                f"{o}[{self._flat(op.shape, idx)}]", f"{x}[{self._flat(s, idx[:-2] + idx[:-3:-1])}]")], "_e"))
            return
        B = 8

        def body(idx):  # (block of input rows, block of input columns, input row, input column)
            lead, (jb, ib, j, i) = idx[:-4], idx[-4:]
            out = lead + [f"({ib}*{B} + {i})", f"({jb}*{B} + {j})"]
            return [cgen.Assign(f"_to[{self._flat(op.shape, out)}]", f"_tx[{self._flat(s, out[:-2] + out[:-3:-1])}]")]
        R, C = op.shape[-2:]
        t = ctype(op.dtype)
        self.lines.append(cgen.Block([  # restrict: a batch's input is an array of pointers the compiler cannot see through
            cgen.Line(f"const {t}* {self.RESTRICT} _tx = {x};"), cgen.Line(f"{t}* {self.RESTRICT} _to = {o};"),
            self._loops(list(op.shape[:-2]) + [C // B, R // B, B, B], body, "_e")]))

    def _op_permute(self, op):
        """Axes in any order but a swap of the last two (`_op_transpose`): element by element,
        output axis d reading input axis axes[d]."""
        x, s, _ = self._operand(op.inputs[0])
        self._decl(op)
        o, axes = self._ref(op), op.attrs["axes"]

        def body(idx):
            src = [idx[axes.index(a)] for a in range(len(s))]
            return [cgen.Assign(f"{o}[{self._flat(op.shape, idx)}]", f"{x}[{self._flat(s, src)}]")]
        self.lines.append(self._loops(op.shape, body, "_e"))

    def _op_reshape(self, op):
        """The same elements in the same (row-major) order: a copy of the flat tile."""
        x, _, _ = self._operand(op.inputs[0])
        self._decl(op)
        o = self._ref(op)
        self.lines.append(self._loops([max(1, math.prod(op.shape))], lambda idx: [
            cgen.Assign(f"{o}[{idx[0]}]", f"{x}[{idx[0]}]")], "_e"))

    def _reduced(self, op) -> tuple:
        """(input's C name, its shape s, reduced axes, kept axes) of a sum/max/mean."""
        x, s, _ = self._operand(op.inputs[0])
        axis = op.attrs.get("axis")
        axes = list(range(len(s))) if axis is None else [a % len(s) for a in np.atleast_1d(axis)]
        return x, s, axes, [d for d in range(len(s)) if d not in axes]

    def _reduce(self, op, init, step, finish=None, simd="+"):
        """One accumulator per output element, its reduced axes innermost under `omp simd
        reduction(simd: ...)`, which lets the compiler keep partial results in vector lanes
        (a sum in another order than numpy's pairwise one: rounding differs, no more). A max
        is `>` in the lanes plus a flag for NaN, since `>` alone would drop one."""
        x, s, axes, keep = self._reduced(op)
        self._decl(op)
        o, t = self._ref(op), ctype(op.dtype)
        nan = simd == "max" and native_dtype(op.dtype).kind == "f"
        n = math.prod(s[d] for d in axes)

        def body(idx):
            it = iter(idx)
            v = f"{x}[{self._flat(s, [f'_r{d}' if d in axes else next(it) for d in range(len(s))])}]"
            inner = [cgen.Line(f"const {t} _v = {v};"), cgen.Line("_acc = _v > _acc ? _v : _acc;")] \
                + ([cgen.Line("_nan |= _v != _v;")] if nan else []) if simd == "max" else \
                [cgen.Line(step.format(dst="_acc", x=v, f=self._f(op)) + ";")]
            clause = f"omp simd reduction({simd}:_acc)" + (" reduction(|:_nan)" if nan else "")
            node = cgen.Block([cgen.Pragma(clause),
                               cgen.For(f"int _r{axes[-1]} = 0", f"_r{axes[-1]} < {s[axes[-1]]}", f"_r{axes[-1]}++",
                                        cgen.Block(inner))])
            for d in reversed(axes[:-1]):
                node = cgen.For(f"int _r{d} = 0", f"_r{d} < {s[d]}", f"_r{d}++", node)
            lines = [cgen.Line(f"{t} _acc = {init};")] + ([cgen.Line("int _nan = 0;")] if nan else []) + [node]
            if finish:
                lines.append(cgen.Line(finish.format(dst="_acc", n=n) + ";"))
            out = f"{o}[{self._flat([s[d] for d in keep], idx)}]"
            lines.append(cgen.Assign(out, "_nan ? NAN : _acc" if nan else "_acc"))
            return lines
        self.lines.append(self._loops([s[d] for d in keep], body, "_e"))

    def _op_sum(self, op):
        self._reduce(op, "0", "{dst} += {x}")

    def _op_mean(self, op):
        self._reduce(op, "0", "{dst} += {x}", "{dst} /= {n}")

    def _op_max(self, op):
        self._reduce(op, lowest(op.dtype), "{dst} = ft_maximum({x}, {dst})", simd="max")

    @staticmethod
    def _simd(reduction: str) -> list:
        """`omp simd reduction(...)` before a loop: its partial results in vector lanes (the C
        target; the CUDA one has no such pragma)."""
        return [cgen.Pragma(f"omp simd reduction({reduction})")]

    def _op_softmax(self, op):
        """Each row: its max (a NaN is skipped there, but its exp makes the sum and so the
        whole row NaN, as numpy's), the exps and their sum, then the division; the max and the
        sum reduce in vector lanes."""
        x, s, _ = self._operand(op.inputs[0])
        axis = op.attrs.get("axis", -1) % len(s)
        self._decl(op)
        o = self._ref(op)
        outer = [d for d in range(len(s)) if d != axis]
        n = s[axis]
        f = self._f(op)

        def body(idx):
            full = lambda a: idx[:axis] + [a] + idx[axis:]  # noqa: E731
            at = lambda a: self._flat(s, full(a))  # noqa: E731
            return [cgen.Line(f"{ctype(op.dtype)} _mx = -INFINITY, _sm = 0;"),
                    *self._simd("max:_mx"),
                    cgen.For("int _a = 0", f"_a < {n}", "_a++", cgen.Line(
                        f"_mx = {x}[{at('_a')}] > _mx ? {x}[{at('_a')}] : _mx;")),
                    *self._simd("+:_sm"),
                    cgen.For("int _a = 0", f"_a < {n}", "_a++", cgen.Block([
                        cgen.Line(f"{o}[{at('_a')}] = ft_exp{f}({x}[{at('_a')}] - _mx);"),
                        cgen.Line(f"_sm += {o}[{at('_a')}];")])),
                    cgen.For("int _a = 0", f"_a < {n}", "_a++", cgen.Line(f"{o}[{at('_a')}] /= _sm;"))]
        self.lines.append(self._loops([s[d] for d in outer], body, "_e"))

    def _op_logsumexp(self, op):
        """Per output element: the max over the reduced axes (NaN skipped: its exp makes the sum
        NaN), shifted by where it is finite (all -inf: log 0 = -inf; a +inf: +inf, as scipy's),
        then log of the sum of exps; both passes reduce in vector lanes on the C target."""
        x, s, axes, keep = self._reduced(op)
        self._decl(op)
        o, t, f = self._ref(op), ctype(op.dtype), self._f(op)

        def over(idx, inner):  # the reduced axes' loops around `inner`, reading x at `_v`
            it = iter(idx)
            src = [f"_r{d}" if d in axes else next(it) for d in range(len(s))]
            node = cgen.Block([cgen.Line(f"const {t} _v = {x}[{self._flat(s, src)}];"), cgen.Line(inner)])
            for d in reversed(axes):
                node = cgen.For(f"int _r{d} = 0", f"_r{d} < {s[d]}", f"_r{d}++", node)
            return node

        def body(idx):
            return [cgen.Line(f"{t} _mx = -INFINITY, _sm = 0;"), *self._simd("max:_mx"),
                    over(idx, "_mx = _v > _mx ? _v : _mx;"),
                    cgen.Line(f"const {t} _sh = isfinite(_mx) ? _mx : 0;"), *self._simd("+:_sm"),
                    over(idx, f"_sm += ft_exp{f}(_v - _sh);"),
                    cgen.Assign(f"{o}[{self._flat([s[d] for d in keep], idx)}]", f"log{f}(_sm) + _sh")]
        self.lines.append(self._loops([s[d] for d in keep], body, "_e"))

    def _op_scatter_add(self, op):
        """out[ids[q]] (+)= x[q], q in order: one thread (or loop) per column of the rows owns it
        through the init and every q, so the writes to a row are ordered, never concurrent."""
        (x, s, _), (ids, _, _) = self._operand(op.inputs[0]), self._operand(op.inputs[1])
        self._decl(op)
        o, t = self._ref(op), ctype(op.dtype)
        rows, n, cols = s[0], op.shape[0], max(1, math.prod(s[1:]))
        start, step = ("0", "{dst} += {x}") if op.attrs.get("combine", "sum") == "sum" else \
            (lowest(op.dtype), "{dst} = ft_maximum({x}, {dst})")

        def body(idx):
            c = idx[0]
            return [cgen.For("long _k = 0", f"_k < {n}", "_k++", cgen.Assign(f"{o}[_k*{cols} + {c}]", start)),
                    cgen.For("long _q = 0", f"_q < {rows}", "_q++", cgen.Line(step.format(
                        dst=f"{o}[((long){ids}[_q])*{cols} + {c}]", x=f"{x}[_q*{cols} + {c}]") + ";"))]
        self.lines.append(self._loops([cols], body, "_e"))

    def _op_concat(self, op):
        axis = op.attrs.get("axis", 0) % len(op.shape)
        self._decl(op)
        o = self._ref(op)
        off = 0
        for a in op.inputs:
            x, s, _ = self._operand(a)

            def body(idx, x=x, s=s, off=off):
                dst = list(idx)
                dst[axis] = f"({idx[axis]} + {off})"
                return [cgen.Assign(f"{o}[{self._flat(op.shape, dst)}]", f"{x}[{self._flat(s, idx)}]")]
            self.lines.append(self._loops(s, body, "_e"))
            off += s[axis]

    def _op_getitem(self, op):
        x, s, _ = self._operand(op.inputs[0])
        axes = getitem_axes(op.attrs["key"], s)
        if axes is None:
            raise CompileError(f"indexing with {op.attrs['key']!r} has no C kernel", op="emit", where=op.where)
        self._decl(op)
        o = self._ref(op)

        def body(idx):
            src = [str(start) if axis is None else f"({start} + {step}*{idx[axis]})" for start, step, axis in axes]
            return [cgen.Assign(f"{o}[{self._flat(op.shape, idx)}]", f"{x}[{self._flat(s, src)}]")]
        self.lines.append(self._loops(op.shape, body, "_e"))

    def _pointer(self, op, restrict: bool = False) -> str:
        """The C type of a load's variable: a pointer to its elements (a target may read some
        buffers through another type: the CUDA target's narrow ones)."""
        return f"const {ctype(op.dtype)}*" + (f" {self.RESTRICT}" if restrict else "")

    def _address(self, op, target: str) -> str:
        """A load piece's address `target` as the load's variable (`_pointer`) holds it."""
        return target

    def _constant(self, op, value) -> np.ndarray:
        """The array a load's constant piece points into (a constant array of the module)."""
        return np.broadcast_to(np.asarray(value, dtype=native_dtype(op.dtype)), op.shape)

    def _op_load(self, op):
        name = self._ref(op)
        if not self._in_batch:
            self.lines.append(cgen.Line(f"{self._pointer(op, restrict=True)} {name};"))
        branches = []
        for pc in op.pieces:
            if pc.buffer is None:
                target = self._address(op, self.const_ref(self._constant(op, pc.const)))
            else:
                target = self._address(op, self.buffer_ref(pc.buffer, [self._index(ix) for ix in pc.index]))
            cond = " && ".join(cond_c(c, self._dim, self.param) for c in pc.conds) or "1"
            branches.append((cond, cgen.Assign(name, target)))
        node = branches[-1][1]  # the pieces partition the domain: the last needs no test
        for cond, assign in reversed(branches[:-1]):
            node = cgen.If(cond, cgen.Block([assign]), cgen.Block([node]))
        self.lines.append(node)

    def _index(self, ix) -> str:
        def gather(g):  # the id read from the index buffer (a runtime gather's: at its outer coordinates too)
            at = [aff_c(a, self._dim, self.param, None) for a in (*g.lead, g.pos)]
            return f"((long){self.buffer_ref(g.index, at)}[0])"
        return aff_c(ix, self._dim, self.param, gather)

    def _op_store(self, op):
        if op in self.forward.values():
            return  # the GEMM wrote the cells
        x, s, _ = self._operand(op.inputs[0])
        dst = self.buffer_ref(op.buffer, [self._index(ix) for ix in op.index])
        n = max(1, math.prod(op.shape))
        start, step = self.ELEMENTS
        self.lines.append(cgen.For(f"int _e = {start}", f"_e < {n}", f"_e += {step}",
                                   cgen.Assign(f"({dst})[_e]", f"{x}[_e]" if s else f"{x}[0]")))
