"""The Extended Task Dependence Graph (paper §4.4, Table 2).

Nodes:
* `Buffer` (buffer node, single assignment): an input, a constant, or a value written by
  block nodes. Its index vector is the iteration vector of the block that created it
  followed by its own list dims (array expansion), so every write is to a fresh element.
* `BlockNode`: a perfect nest of compute operators — iteration dims (`IterDim`, with extent
  and operator, giving the operator vector p) and a sub-graph (`body`) of operation nodes and
  child block nodes, in program order.
* `OpNode` (operation node): element math on static-shape tensors; `load`/`store` nodes are
  the edges into and out of buffer nodes and carry the access maps.
* `AccessMap`: `i_m = M · i_d + o` on one edge, as a list of `Aff` rows (`polyft.affine`).

Passes walk the graph with `walk` (every node, in program order), `blocks`, `ops`, and ask a
sub-graph which buffer nodes it `reads`, `writes` or has `referenced`; `access_maps` gives an
operation node's edges.

Nested aggregates (a scan whose state is read as `init` on the first iteration and as the
previous output later) are kept as one block node with a *piecewise* access map: one piece
per region, each with its condition (`k = 0`, `k >= 1`). This has the meaning of the paper's
region0..3 split (Figure 4) without duplicating the sub-graph; `Statement.regions()` lists
the regions.
"""
from __future__ import annotations

import copy

import hashlib
import itertools
from dataclasses import dataclass, field

import numpy as np

from .affine import Aff, Length
from .types import FTType

# ---------------------------------------------------------------------------------------
# Assumptions on the lengths


@dataclass(frozen=True)
class Assumption:
    """A condition on the lengths that a program traced with symbolic lengths relies on —
    `xs[-7:]` needs L >= 7, `strided_split(4)` needs 4 | L. It joins the ISL context, and
    concrete inputs are checked against it before the program runs."""

    expr: Length  # expr >= 0 ("ge"), or expr divisible by d ("mod")
    kind: str = "ge"
    d: int = 1
    why: str = ""  # the operator and the user's line

    def holds(self, params: dict) -> bool:
        v = self.expr.evaluate(params)
        return v >= 0 if self.kind == "ge" else v % self.d == 0

    def isl(self) -> str:
        return f"{self.expr} >= 0" if self.kind == "ge" else f"({self.expr}) mod {self.d} = 0"

    def __str__(self):
        if self.kind == "mod":
            return f"{self.expr} divisible by {self.d}"
        c = self.expr.const
        return f"{self.expr - c} >= {-c}" if c and (self.expr.terms or self.expr.floors) else f"{self.expr} >= 0"


@dataclass(frozen=True)
class IndexCheck:
    """A gather by ids given at call time (`table.gather(ids)`): the model reads the whole gathered
    dim (a may-read), so every id of the input `ids` must lie in [0, bound); checked on each call
    before native code runs."""

    ids: str  # the input holding the ids
    bound: Length  # the gathered list's length (the rows scatter_add writes)
    what: str  # what the ids index, for the message
    where: str | None = None  # the user's line
    op: str = "gather"

    def check(self, ids: np.ndarray, params: dict, error) -> None:
        """Raise `error` (an InputError class) naming the first id out of range and the bound."""
        bound = self.bound.evaluate(params)
        bad = np.flatnonzero((ids < 0) | (ids >= bound)) if ids.size else []
        if len(bad):
            k = np.unravel_index(bad[0], ids.shape)
            raise error(f"index {self.ids}[{', '.join(map(str, k))}] = {ids[k]} is outside [0, {bound}) of {self.what} "
                        f"({len(bad)} ids out of range); nothing ran", op=self.op, where=self.where)


# ---------------------------------------------------------------------------------------
# Buffer nodes and access maps


class Buffer:
    """A buffer node Λ: expanded dims (creating block's dims, then own list dims) + element."""

    def __init__(self, name: str, dims, element_shape, dtype="float32", kind="intermediate",
                 value=None, created_in=()):
        self.name = name
        self.dims = [Length.of(d) for d in dims]
        self.element_shape = tuple(element_shape)
        self.dtype = dtype
        self.kind = kind  # "input", "const", "intermediate", "output", "index", "lengths" (a ragged input's)
        self.value = value  # numpy data of a const / index buffer
        self.created_in = tuple(created_in)  # IterDims of the creating context (a prefix of dims)
        self.alias_of: Buffer | None = None

    def __deepcopy__(self, memo):
        """A copy that shares `value`: a const or index buffer's data is never written, and each
        coarsening pass copying a captured 4096 x 4096 weight took 0.6 s."""
        new = copy.copy(self)
        memo[id(self)] = new
        new.__dict__.update({k: v if k == "value" else copy.deepcopy(v, memo) for k, v in self.__dict__.items()})
        return new

    def resolve(self) -> "Buffer":
        b = self
        while b.alias_of is not None:
            b = b.alias_of
        return b

    @property
    def depth(self) -> int:
        return len(self.dims)

    @property
    def type(self) -> FTType:
        return FTType(tuple(self.dims), self.element_shape, self.dtype)

    def __repr__(self):
        return self.resolve().name


class Gather:
    """An indirect index: `index_buffer[*lead, pos]`; modelled as a may-access over the whole dim.
    `lead`: the index buffer's outer coordinates, for ids given at call time as a deeper list
    (`idss.map(lambda ids: table.gather(ids))` reads `idss[i, pos]`)."""

    def __init__(self, pos: Aff, index: Buffer, lead: tuple = ()):
        self.pos = Aff.of(pos)
        self.index = index
        self.lead = tuple(lead)

    def map(self, fn) -> "Gather":
        """The gather with `fn` applied to each of its index expressions."""
        return Gather(fn(self.pos), self.index, tuple(fn(a) for a in self.lead))

    def substitute(self, env):
        return self.map(lambda a: a.substitute(env))

    @property
    def dims(self):
        return set().union(self.pos.dims, *(a.dims for a in self.lead))

    def __str__(self):
        return f"{self.index.name}[{', '.join(str(a) for a in (*self.lead, self.pos))}]"

    __repr__ = __str__


@dataclass
class Piece:
    """One piece of a piecewise access: under `conds`, element `index` of `buffer`.

    `buffer is None` means a constant element (`const`, e.g. padding zeros or a constant init).
    """

    conds: tuple
    buffer: Buffer | None
    index: tuple  # of Aff | Gather
    const: object = None

    def substitute(self, env) -> "Piece | None":
        conds = []
        for c in self.conds:
            c = c.substitute(env)
            t = c.truth()
            if t is False:
                return None
            if t is None:
                conds.append(c)
        return Piece(tuple(conds), self.buffer,
                     tuple(ix.substitute(env) for ix in self.index), self.const)

    def restrict(self, extra) -> "Piece | None":
        """The piece under the further conditions `extra` (None when they cannot hold)."""
        return Piece(self.conds + tuple(extra), self.buffer, self.index, self.const).substitute({})


@dataclass
class AccessMap:
    """The access map on one edge: `i_m = M · i_d + o` under a condition (one piece)."""

    buffer: Buffer
    dims: tuple  # the block's iteration dims (i_d)
    index: tuple  # Aff | Gather per buffer dim (i_m)
    conds: tuple = ()
    kind: str = "read"  # "read" | "write"

    @property
    def is_affine(self) -> bool:
        return all(isinstance(ix, Aff) and ix.is_affine for ix in self.index)

    @property
    def is_gather(self) -> bool:
        return any(isinstance(ix, Gather) for ix in self.index)

    @property
    def M(self) -> np.ndarray:
        """Access matrix, rows = buffer dims, cols = iteration dims (affine rows only)."""
        m = np.zeros((len(self.index), len(self.dims)), dtype=np.int64)
        for r, ix in enumerate(self.index):
            if isinstance(ix, Aff):
                for c, d in enumerate(self.dims):
                    m[r, c] = ix.coefficient(d)
        return m

    @property
    def o(self) -> list:
        """Offset vector: Lengths (symbolic where the access involves a length)."""
        return [ix.offset if isinstance(ix, Aff) else None for ix in self.index]

    def describe(self) -> str:
        b = self.buffer.resolve()
        idx = ", ".join(str(ix) for ix in self.index)
        text = f"{b.name}[{idx}]"
        if self.is_affine:
            rows = "; ".join(" ".join(str(v) for v in row) for row in self.M) or ""
            text += f"   M=[{rows}] o=[{', '.join(str(x) for x in self.o)}]"
        elif self.is_gather:
            text += "   (indirect: may-access over the whole dim)"
        if self.conds:
            text += "   if " + " and ".join(str(c) for c in self.conds)
        return text


# ---------------------------------------------------------------------------------------
# Operation nodes and block nodes


class OpNode:
    """A user math operation on static-shape tensors; `load`/`store` carry access pieces."""

    _ids = itertools.count()

    def __init__(self, op: str, inputs, shape, dtype, attrs=None, pieces=(), buffer=None,
                 index=(), where=None):
        self.id = next(OpNode._ids)
        self.op = op
        self.inputs = list(inputs)  # OpNodes, or ("const", array) operands
        self.shape = tuple(shape)
        self.dtype = dtype
        self.attrs = dict(attrs or {})
        self.pieces = list(pieces)  # load: the piecewise read
        self.buffer = buffer  # store: the buffer written
        self.index = tuple(index)  # store: the element written
        self.where = where
        self.var = None  # printing name, set by the ETDG

    def __repr__(self):
        return f"%{self.var if self.var is not None else self.id}"


class BlockNode:
    """A perfect nest of compute operators: dims (outermost first) and a sub-graph."""

    _ids = itertools.count()

    def __init__(self, dims, parent=None):
        self.dims = list(dims)
        self.parent = parent
        self.body: list = []  # OpNode | BlockNode, in program order
        self.name = f"b{next(BlockNode._ids)}"

    @property
    def p(self) -> list:
        """The operator vector."""
        return [d.op for d in self.dims]

    def context(self) -> list:
        """All iteration dims from the root down to and including this block's."""
        chain = []
        b = self
        while b is not None:
            chain = b.dims + chain
            b = b.parent
        return chain


# ---------------------------------------------------------------------------------------
# Walking the graph


def walk(node):
    """The node and every node of its sub-graph, in program order (a block node before its body)."""
    yield node
    if isinstance(node, BlockNode):
        for n in node.body:
            yield from walk(n)


def blocks(node) -> list:
    """The block nodes of a node's sub-graph, itself first, in program order."""
    return [n for n in walk(node) if isinstance(n, BlockNode)]


def ops(node) -> list:
    """The operation nodes of a node's sub-graph (an operation node: itself), in program order."""
    return [n for n in walk(node) if isinstance(n, OpNode)]


def depends_on(ops, d) -> set:
    """The operations whose value (or, for stores, whose place) changes with dim d."""
    out = set()
    for op in ops:
        if op.op == "load":
            if any(d in ix.dims for pc in op.pieces for ix in pc.index) or \
                    any(d in c.expr.dims for pc in op.pieces for c in pc.conds):
                out.add(op)
        elif op.op == "store" or any(isinstance(a, OpNode) and a in out for a in op.inputs):
            out.add(op)
    return out


def shared_matmuls(ops, d) -> list:
    """The matmuls whose left rows change with dim d while the right matrix does not: what
    tiling dim d turns into matrix-matrix products with a reused right operand."""
    dep = depends_on(ops, d)
    return [op for op in ops if op.op == "matmul" and op in dep and isinstance(op.inputs[0], OpNode)
            and op.inputs[0] in dep and not (isinstance(op.inputs[1], OpNode) and op.inputs[1] in dep)]


def reads(node) -> set:
    """The buffer nodes (resolved) that the sub-graph's loads read, gathers' index buffers included,
    and the lengths of its ragged dims (read by each instance's guard)."""
    out = {d.extent.lengths.resolve() for b in blocks(node) for d in b.dims if getattr(d.extent, "lengths", None)}
    for op in ops(node):
        if op.op == "load":
            for pc in op.pieces:
                if pc.buffer is not None:
                    out.add(pc.buffer.resolve())
                out |= {ix.index.resolve() for ix in pc.index if isinstance(ix, Gather)}
    return out


def writes(node) -> set:
    """The buffer nodes (resolved) that the sub-graph's stores write."""
    return {op.buffer.resolve() for op in ops(node) if op.op == "store"}


def referenced(node) -> set:
    """The buffer nodes (resolved) that the sub-graph reads or writes."""
    return reads(node) | writes(node)


def access_maps(op: OpNode, dims) -> list:
    """The access maps on an operation node's edges to buffer nodes, over iteration dims `dims`:
    a read per piece of a load that reads a buffer, the write of a store, none for the others."""
    if op.op == "load":
        return [AccessMap(pc.buffer, tuple(dims), pc.index, pc.conds, "read")
                for pc in op.pieces if pc.buffer is not None]
    if op.op == "store":
        return [AccessMap(op.buffer, tuple(dims), op.index, (), "write")]
    return []


# ---------------------------------------------------------------------------------------
# Rewriting the graph


def set_body(block: BlockNode, body) -> None:
    """Replace a block's sub-graph, making it the parent of the child blocks."""
    block.body = list(body)
    for n in block.body:
        if isinstance(n, BlockNode):
            n.parent = block


def drop_dead_ops(root: BlockNode) -> None:
    """Drop operation nodes whose values no store needs, then block nodes left empty."""
    live = set()

    def mark(node):
        if id(node) not in live:
            live.add(id(node))
            for a in node.inputs:
                if isinstance(a, OpNode):
                    mark(a)

    for n in ops(root):
        if n.op == "store":
            mark(n)

    def sweep(block):
        block.body = [n for n in block.body if isinstance(n, BlockNode) or id(n) in live]
        for n in block.body:
            if isinstance(n, BlockNode):
                sweep(n)
        block.body = [n for n in block.body if not (isinstance(n, BlockNode) and not n.body)]
    sweep(root)


def merge_perfect_nests(block: BlockNode, on_merge=None) -> None:
    """A block whose body is exactly one block node is one perfect nest: merge their dims
    (`on_merge(block, absorbed_child)` is told about each merge)."""
    for n in block.body:
        if isinstance(n, BlockNode):
            while len(n.body) == 1 and isinstance(n.body[0], BlockNode):
                child = n.body[0]
                n.dims = n.dims + child.dims
                set_body(n, child.body)
                if on_merge is not None:
                    on_merge(n, child)
            merge_perfect_nests(n, on_merge)


@dataclass
class Statement:
    """A run of operation nodes executed once per point of its block's iteration domain."""

    name: str
    block: BlockNode
    dims: list  # the full iteration vector (enclosing blocks' dims first)
    ops: list
    position: list = field(default_factory=list)  # 2d+1 original-schedule sequence numbers

    @property
    def reads(self) -> list:
        return [am for op in self.ops if op.op == "load" for am in access_maps(op, self.dims)]

    @property
    def writes(self) -> list:
        return [am for op in self.ops if op.op == "store" for am in access_maps(op, self.dims)]

    def regions(self) -> list:
        """The distinct conditions under which the statement's reads come from other places
        (the paper's region0..3 of Figure 4): each a tuple of Constraints."""
        per_load = [[pc.conds for pc in op.pieces] for op in self.ops if op.op == "load" and len(op.pieces) > 1]
        regions = []
        for combo in itertools.product(*per_load) if per_load else [()]:
            conds = tuple(c for group in combo for c in group)
            if conds not in regions:
                regions.append(conds)
        return regions


# ---------------------------------------------------------------------------------------
# The graph


def digest(a) -> str:
    """A content hash of a numpy array (dtype, shape and bytes)."""
    a = np.ascontiguousarray(a)
    h = hashlib.blake2b(f"{a.dtype.str}{a.shape}".encode(), digest_size=16)
    h.update(a.view(np.uint8).ravel())
    return h.hexdigest()


SNAPSHOT_BYTES = 1 << 16  # a captured array up to this size is compared with a copy of its bytes


def _contents(value) -> np.ndarray:
    """The values of a captured numpy array or FractalTensor (the array it views, without a copy
    where it is one)."""
    return value.dense_view() if hasattr(value, "dense_view") else value


def frozen_key(a: np.ndarray):
    """(address, shape, strides) of `a` when neither it nor any array it views can be written
    (numpy's writeable flags, down to memory an array owns or an immutable bytes object), else
    None: such an array is taken not to change (a view made writable before it was frozen is the
    one way around that, as for numpy's own read-only arrays)."""
    b = a
    while isinstance(b, np.ndarray):
        if b.flags.writeable:
            return None
        b = b.base
    if b is not None and not isinstance(b, bytes):
        return None  # memory of a buffer numpy does not guard (mmap, array.array, ...)
    return (a.__array_interface__["data"][0], a.shape, a.strides)


@dataclass
class Captured:
    """A numpy array or FractalTensor the traced program captured (a closure's weights, gather
    indices): its value is compiled into the code, so a later change must not go unnoticed. A
    read-only one (`frozen_key`) costs a pointer and flags check a call; a small writable one is
    compared with a copy of its bytes (a hash costs microseconds even for a few bytes, and an
    LSTM's pullback captures several), a large one hashed every call (a 64 MB weight: tens of ms)."""

    array: object
    digest: str
    where: str | None
    frozen: tuple | None = None

    @classmethod
    def of(cls, value, where) -> "Captured":
        a = _contents(value)
        return cls(value, digest(a), where, frozen_key(a))

    def __post_init__(self):
        a = _contents(self.array)
        self._snapshot = (a.dtype, a.shape, a.tobytes()) if self.frozen is None and a.nbytes <= SNAPSHOT_BYTES else None

    def changed(self) -> bool:
        a = _contents(self.array)
        if self.frozen is not None and frozen_key(a) == self.frozen:
            return False
        if self._snapshot is not None:
            return (a.dtype, a.shape, a.tobytes()) != self._snapshot
        return digest(a) != self.digest

    @property
    def what(self) -> str:
        """The captured value in the user's terms."""
        a = self.array
        if hasattr(a, "dense_view"):
            return f"FractalTensor {a.type_string}"
        return f"numpy array {a.dtype}{list(a.shape)}"


class ETDG:
    """A traced program: input/output buffers, the root block (no dims) and its statements."""

    def __init__(self, name, root: BlockNode, inputs, outputs, out_tree, buffers):
        self.name = name
        self.root = root
        self.inputs = inputs  # list of (arg name, Buffer | None for a non-tensor arg)
        self.outputs = outputs  # flat list of output Buffers
        self.out_tree = out_tree  # how outputs nest: a Buffer-index pytree
        self.buffers = buffers
        self.assumptions: list = []  # ISL constraints on lengths (e.g. divisibility) relied on
        self.captured: list = []  # Captured: numpy arrays of the user's the program holds as constants
        self.statements = self._statements()

    # -- structure -----------------------------------------------------------------
    def blocks(self) -> list:
        return blocks(self.root)

    def _statements(self) -> list:
        """Group consecutive operation nodes into statements, with their original schedule.

        `position` interleaves sequence numbers and dims, outermost first: for a run that is
        the 2nd item of block b1's body, b1 being the 1st item of the root, it is
        [0, *b1.dims, 1] — the classic 2d+1 schedule of the nest as written.
        """
        stmts = []

        def visit(block, prefix):
            runs, run = [], []
            for n in block.body:
                if isinstance(n, OpNode):
                    run.append(n)
                    continue
                if run:
                    runs.append(run)
                    run = []
                runs.append(n)
            if run:
                runs.append(run)
            n_runs = sum(isinstance(r, list) for r in runs)
            k = 0
            for pos, r in enumerate(runs):
                if isinstance(r, list):
                    k += 1
                    name = f"S_{block.name}" + (f"_{k}" if n_runs > 1 else "")
                    stmts.append(Statement(name, block, block.context(), r, prefix + [pos]))
                else:
                    visit(r, prefix + [pos] + list(r.dims))
        visit(self.root, [])
        return stmts

    @property
    def params(self) -> list:
        names = set()
        for b in self.buffers:
            for d in b.resolve().dims:
                names |= d.params
        for blk in self.blocks():
            for d in blk.dims:
                names |= d.extent.params
        return sorted(names)

    def _longest(self, own) -> int:
        """Longest root-to-leaf path, each block contributing own(block); an operation node
        on static-shape tensors counts as the element-level block node it lowers to (§5.1),
        contributing its rank, as the paper counts Listing 1: depth 2, dimension 5."""
        def visit(b):
            kids = [visit(n) for n in b.body if isinstance(n, BlockNode)]
            leaf = max((len(op.shape) for op in b.body if isinstance(op, OpNode)), default=0)
            return own(b) + max(kids + [own(leaf) if leaf else 0])
        return visit(self.root)

    @property
    def depth(self) -> int:
        """Number of block nodes on the longest path from the root to a leaf (§4.4)."""
        return self._longest(lambda b: 1 if isinstance(b, int) or b.dims else 0)

    @property
    def dimension(self) -> int:
        """Sum of the block nodes' dims along the longest path (§4.4), static dims included."""
        return self._longest(lambda b: b if isinstance(b, int) else len(b.dims))

    # -- printing --------------------------------------------------------------------
    def signature(self) -> str:
        ins = ", ".join(f"{n}: {b.type}" if b is not None else n for n, b in self.inputs)
        outs = ", ".join(f"{b.resolve().name}: {b.resolve().type}" for b in self.outputs)
        return f"{self.name}({ins}) -> {outs}"

    def __str__(self):
        lines = [f"etdg {self.signature()}"]
        lines.append(f"  depth {self.depth}, dimension {self.dimension}"
                     + (f", parameters {', '.join(self.params)}" if self.params else ""))
        lines.append("  buffers:")
        seen = set()
        for b in self.buffers:
            b = b.resolve()
            if id(b) in seen:
                continue
            seen.add(id(b))
            lines.append(f"    {b.name:<10} {str(b.type):<32} {b.kind}")
        counter = itertools.count()

        def emit(block, indent):
            for n in block.body:
                if isinstance(n, BlockNode):
                    dims = ", ".join(f"{d.name} < {getattr(d.extent, 'guard', d.extent)}" for d in n.dims)
                    ops = ", ".join(n.p)
                    lines.append(f"{indent}block {n.name} [{dims}]  p = [{ops}]")
                    emit(n, indent + "  ")
                else:
                    n.var = next(counter)
                    lines.append(indent + _format_op(n, indent, block.context()))
        emit(self.root, "  ")
        return "\n".join(lines)

    def to_dot(self) -> str:
        """Graphviz DOT: buffers as boxes, blocks as clusters, access maps on edges. Every name
        and label is a quoted DOT string (`_dot`), whatever characters the user's names hold."""
        out = [f"digraph {_dot(self.name)} {{", "  compound=true; rankdir=LR;",
               '  node [fontname="monospace" fontsize=10];']
        seen = set()
        for b in self.buffers:
            b = b.resolve()
            if id(b) not in seen:
                seen.add(id(b))
                out.append(f"  {_dot(b.name)} [shape=box3d label={_dot(b.name, str(b.type))}];")

        def emit(block, indent):
            for n in block.body:
                if isinstance(n, BlockNode):
                    label = f"{n.name}: [{', '.join(d.name for d in n.dims)}] p=[{', '.join(n.p)}]"
                    out.append(f"{indent}subgraph {_dot('cluster_' + n.name)} {{ label={_dot(label)};")
                    emit(n, indent + "  ")
                    out.append(f"{indent}}}")
                else:
                    out.append(f'{indent}"op{n.id}" [shape=ellipse label={_dot(n.op)}];')
        emit(self.root, "  ")
        for st in self.statements:
            for op in st.ops:
                for a in op.inputs:
                    if isinstance(a, OpNode):
                        out.append(f'  "op{a.id}" -> "op{op.id}";')
                for am in access_maps(op, st.dims):
                    ends = [_dot(am.buffer.resolve().name), f'"op{op.id}"']
                    src, dst = ends if am.kind == "read" else ends[::-1]
                    out.append(f"  {src} -> {dst} [label={_dot(am.describe())}];")
        out.append("}")
        return "\n".join(out)


def _dot(*lines: str) -> str:
    """A quoted DOT string of `lines` (one label line each): quotes and backslashes escaped."""
    return '"' + "\\n".join(str(t).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
                             for t in lines) + '"'


def _format_operand(a) -> str:
    if isinstance(a, OpNode):
        return repr(a)
    value = a[1]
    if np.ndim(value) == 0:
        return repr(float(value))
    return f"const{list(np.shape(value))}"


def _format_op(n: OpNode, indent: str, dims: list) -> str:
    shape = f"{n.dtype}[{', '.join(str(s) for s in n.shape)}]"
    if n.op == "load":
        head = f"{n!r} = load "
        pad = " " * (len(indent) + len(head))
        parts = []
        for pc in n.pieces:
            if pc.buffer is None:
                what = "zeros" if np.all(np.asarray(pc.const) == 0) else f"const{list(np.shape(pc.const))}"
            else:
                am = AccessMap(pc.buffer, tuple(dims), pc.index, pc.conds)
                what = am.describe().split("   if ")[0]
            cond = ("   if " + " and ".join(str(c) for c in pc.conds)) if pc.conds else ""
            parts.append(what + cond)
        return head + f"\n{pad}".join(parts) + f" : {shape}"
    if n.op == "store":
        idx = ", ".join(str(ix) for ix in n.index)
        return f"store {n.buffer.resolve().name}[{idx}] <- {_format_operand(n.inputs[0])}"
    args = " ".join(_format_operand(a) for a in n.inputs)
    attrs = "".join(f" {k}={v}" for k, v in n.attrs.items())
    return f"{n!r} = {n.op} {args}{attrs} : {shape}"
