"""ETDG coarsening (FractalTensor §5.1): fewer, larger block nodes with fewer dims.

Passes (each takes an ETDG and returns a *new* one; the input is deep-copied, never mutated;
each appends one line per change to an optional `log` list):

* `horizontal_merge`: sibling block nodes with equal dims (extents and operators, the paper's
  d1 = d2 and p1 ≡ p2) and no dataflow edge between them become one block node: the second's
  dims are renamed to the first's and its sub-graph follows the first's.
* `vertical_merge`: a producer block node and a consumer of its output (siblings): their dims
  are aligned outermost-first; equal-extent dims whose operators compose (Table 3, `compose`)
  become one dim; the dims left over (on one side at most) become child block nodes. Every
  candidate is checked exactly with ISL (`dataflow_violations`): each element is read after
  it is written in the new schedule order. A merged statement's loads of an element it has
  just stored read the stored value directly (store-to-load forwarding).
* `depthwise_merge`: two adjacent dims `a` (outer), `b` (inner, constant extent n) of one
  block node become one dim `t = a*n + b`; accesses get `a = floor(t/n)`, `b = t mod n`,
  simplified (an access along `a*n + b` becomes linear in `t`). Only where both dims have the
  same operator (by default only `map`: merging two aggregate dims would fix their order and
  forbid the §5.2 wavefront) and no access is conditioned on either dim (no "non-access"
  relation: every buffer is read uniformly along both).
* `fuse_access_maps`: a buffer written only by a copy (`store dst[ctx] <- load src...`, or
  `<- copy(load ...)`, or a constant) is removed: every reader reads the source through the
  composed access map (composed indices, composed piece conditions).
* `drop_dead_buffers`: stores into intermediate buffers nobody reads are removed, then the
  operation nodes and block nodes left without purpose.
* `coarsen`: all of the above to a fixpoint; returns the new ETDG and the log.

After every merge a block node whose body is exactly one block node absorbs its dims (the
tracer's perfect-nest rule), which is what lowers the ETDG's depth.
"""
from __future__ import annotations

import copy
import itertools
import re

import islpy as isl
import numpy as np

from polyft.affine import Aff, Constraint, IterDim
from polyft.deps.isl_helpers import maps
from polyft.deps.analyze import may_flow
from polyft.deps.critical import critical_path
from polyft.deps.model import build
from polyft.errors import PolyftError, ScheduleError
from polyft.etdg import (ETDG, BlockNode, Gather, OpNode, Piece, Statement, blocks, depends_on, drop_dead_ops,
                         merge_perfect_nests, ops, reads, referenced, set_body, shared_matmuls, writes)
from polyft.ragged import Ragged

# ---------------------------------------------------------------------------------------
# Table 3


TABLE3_OPS = ("map", "reduce", "scanr", "scanl", "scan")
_X = None  # ✗
TABLE3 = {  # row (outer) -> column (inner) -> composed operator
    "map":    {"map": "map",    "reduce": "reduce", "scanr": "scanr", "scanl": "scanl", "scan": "scan"},
    "reduce": {"map": "reduce", "reduce": "reduce", "scanr": "scanr", "scanl": "scanl", "scan": "scan"},
    "scanr":  {"map": "scanr",  "reduce": "scanr",  "scanr": "scanr", "scanl": _X,      "scan": "scanr"},
    "scanl":  {"map": "scanl",  "reduce": "scanl",  "scanr": "scanl", "scanl": "scanl", "scan": _X},
    "scan":   {"map": "scan",   "reduce": "scan",   "scanr": "scanr", "scanl": "scanl", "scan": "scan"},
}
_AS_TABLE3 = {"foldl": "scanl", "foldr": "scanr"}


def compose(outer_op: str, inner_op: str) -> str | None:
    """Table 3: the operator of a dim merged from `outer_op ∘ inner_op`, None for ✗.

    Rows are `outer_op`, columns `inner_op`. In `vertical_merge` the inner operator is the
    producer's (applied first) and the outer the consumer's. `foldl` composes as `scanl` and
    `foldr` as `scanr` (a fold is a scan of which only the last state is kept; the iteration
    space and its dependences are the scan's). The table is used verbatim, asymmetries
    included (scanl∘scanr = scanl but scanr∘scanl = ✗; scan∘scanl = scanl but scanl∘scan = ✗):
    it is a necessary condition only, and the vertical merge checks every dependence exactly.
    """
    a, b = _AS_TABLE3.get(outer_op, outer_op), _AS_TABLE3.get(inner_op, inner_op)
    for op in (a, b):
        if op not in TABLE3:
            raise ValueError(f"compose: unknown compute operator {op!r} (Table 3 has {TABLE3_OPS} "
                             "and foldl/foldr)")
    return TABLE3[a][b]


# ---------------------------------------------------------------------------------------
# Quasi-affine simplification


def _akey(a: Aff):
    """A structural key of an Aff (dims by identity)."""
    return (tuple(sorted((id(k), v) for k, v in a.terms.items())), str(a.offset),
            tuple(sorted((c, d, _akey(i)) for c, i, d in a.divs)))


def _floor(x: Aff, d: int) -> Aff:
    """floor(x / d) for a simplified x: multiples of d come out of the floor, a constant
    remainder vanishes, floor(floor(y/p)/d) = floor(y/(p*d))."""
    if d == 1:
        return x
    off = x.offset
    qo, ro = (off.const // d, off.const % d) if off.is_concrete else (0, off)
    q = Aff({k: v // d for k, v in x.terms.items() if v % d == 0}, qo,
            tuple((c // d, i, dd) for c, i, dd in x.divs if c % d == 0))
    r = Aff({k: v for k, v in x.terms.items() if v % d}, ro,
            tuple((c, i, dd) for c, i, dd in x.divs if c % d))
    if not r.terms and not r.divs and r.offset.is_concrete:
        return q + r.offset.const // d
    if (not r.terms and len(r.divs) == 1 and r.divs[0][0] == 1 and r.offset.is_concrete
            and r.offset.const == 0):
        _, inner, p = r.divs[0]
        return q + Aff(divs=((1, inner, p * d),))
    return q + Aff(divs=((1, r, d),))


def simplify(a):
    """An equal Aff with floors simplified and equal floor terms collected (Gathers too)."""
    if isinstance(a, Gather):
        return a.map(simplify)
    base = Aff(a.terms, a.offset)
    acc, order = {}, []
    for c, inner, d in a.divs:
        f = _floor(simplify(inner), d) * c
        base = base + Aff(f.terms, f.offset)
        for c2, i2, d2 in f.divs:
            k = (d2, _akey(i2))
            if k in acc:
                acc[k][0] += c2
            else:
                acc[k] = [c2, i2]
                order.append(k)
    return Aff(base.terms, base.offset, tuple((acc[k][0], acc[k][1], k[0]) for k in order if acc[k][0]))


def _subst_piece(pc: Piece, env) -> Piece | None:
    pc = pc.substitute(env)
    if pc is None:
        return None
    conds = tuple(Constraint(simplify(c.expr), c.kind) for c in pc.conds)
    return Piece(conds, pc.buffer, tuple(simplify(ix) for ix in pc.index), pc.const).substitute({})


# ---------------------------------------------------------------------------------------
# Working copies and tree helpers


class _Work:
    """A deep copy of an ETDG's parts, mutated by one pass and turned into a new ETDG."""

    def __init__(self, etdg: ETDG):
        self.name = etdg.name
        (self.root, self.inputs, self.outputs, self.out_tree, self.buffers) = copy.deepcopy(
            (etdg.root, etdg.inputs, etdg.outputs, etdg.out_tree, etdg.buffers))
        self.assumptions = list(etdg.assumptions)
        nums = [int(m.group(1)) for b in blocks(self.root)[1:] if (m := re.fullmatch(r"b(\d+)", b.name))]
        self._next = itertools.count(max(nums, default=-1) + 1)

    def new_block(self, dims, parent, body) -> BlockNode:
        b = BlockNode(dims, parent=parent)
        b.name = f"b{next(self._next)}"
        set_body(b, body)
        return b

    def finish(self) -> ETDG:
        used = referenced(self.root) | {b.resolve() for _, b in self.inputs if b is not None}
        used |= {b.resolve() for b in self.outputs}
        buffers = [b for b in self.buffers if b.resolve() in used]
        e = ETDG(self.name, self.root, self.inputs, self.outputs, self.out_tree, buffers)
        e.assumptions = list(self.assumptions)
        return e

    def rename_created_in(self, env: dict):
        for b in self.buffers:
            b.created_in = tuple(dict.fromkeys(env.get(d, d) for d in b.created_in))


def _substitute(node, env: dict):
    """Rename/replace iteration dims in every access (pieces, conditions, store indices) and in
    the ragged extents of the dims below (where each instance's guard reads its length)."""
    for b in blocks(node):
        for d in b.dims:
            if isinstance(d.extent, Ragged):
                d.extent = d.extent.substitute_dims(env)
    for op in ops(node):
        if op.op == "load":
            op.pieces = [q for q in (_subst_piece(pc, env) for pc in op.pieces) if q is not None]
        elif op.op == "store":
            op.index = tuple(simplify(ix.substitute(env)) for ix in op.index)


def _describe(b: BlockNode) -> str:
    dims = ", ".join(f"{d.name} < {d.extent}" for d in b.dims)
    return f"{b.name} [{dims}] p = [{', '.join(b.p)}]"


def _flatten(block: BlockNode, log, tag):
    """Merge perfect nests, logging each merge."""
    merge_perfect_nests(block, lambda n, child: log.append(
        f"{tag}: {child.name} is the only node in {n.name}'s body: perfect nest -> {_describe(n)}"))


def _operand_dtype_shape(a):
    if isinstance(a, OpNode):
        return a.dtype, tuple(a.shape)
    v = np.asarray(a[1])
    return v.dtype.name, tuple(v.shape)


def _forward(block: BlockNode) -> int:
    """Store-to-load forwarding in the statements of `block`'s own body: a load of exactly
    the element a store of the same statement instance wrote earlier uses the stored value."""
    stored, repl, n_fwd = {}, {}, 0
    for n in block.body:
        if isinstance(n, BlockNode):
            stored = {}  # a child block ends the statement
            continue
        n.inputs = [repl.get(id(a), a) if isinstance(a, OpNode) else a for a in n.inputs]
        if n.op == "store" and all(isinstance(ix, Aff) for ix in n.index):
            stored[(id(n.buffer.resolve()), tuple(_akey(simplify(ix)) for ix in n.index))] = n.inputs[0]
        elif n.op == "load" and len(n.pieces) == 1:
            pc = n.pieces[0]
            if pc.conds or pc.buffer is None or not all(isinstance(ix, Aff) for ix in pc.index):
                continue
            val = stored.get((id(pc.buffer.resolve()), tuple(_akey(simplify(ix)) for ix in pc.index)))
            if val is not None and _operand_dtype_shape(val) == (n.dtype, tuple(n.shape)):
                repl[id(n)] = val
                n_fwd += 1
    return n_fwd


def _unchanged(etdg: ETDG) -> ETDG:
    return _Work(etdg).finish()


# ---------------------------------------------------------------------------------------
# Legality: every read after its write, checked exactly with ISL


def _access_statements(etdg: ETDG) -> list:
    """One pseudo-statement per load/store operation node, its position extended by the
    node's index in the statement, so that accesses of one statement instance are ordered."""
    out = []
    for st in etdg.statements:
        for q, op in enumerate(st.ops):
            if op.op in ("load", "store"):
                out.append(Statement(f"{st.name}_o{q}", st.block, st.dims, [op], list(st.position) + [q]))
    return out


def dataflow_violations(etdg: ETDG) -> list:
    """Ways in which the ETDG's own (2d+1) schedule breaks dataflow, as ISL strings; [] if none.

    Single assignment makes this the whole correctness condition of a rewrite that keeps the
    operation nodes: every element read of a written buffer must be written, and written
    before it is read. Checked parametrically (the ETDG's assumptions in the context), per
    load/store operation node. Gathers count as may-reads of their whole dim (conservative).
    Raises `SingleAssignmentError`/`LengthMismatchError` (from `deps.model.build`) when the
    ETDG writes an element twice or accesses outside a buffer.
    """
    fake = copy.copy(etdg)
    fake.statements = _access_statements(etdg)
    m = build(fake)
    problems = [f"read not after its write: {mp.gist_params(m.context)}" for mp in _early_reads(m)]
    written_names = {b.resolve().name for b in etdg.buffers
                     if b.resolve().kind in ("intermediate", "output")}
    if not m.reads.is_empty():
        unwritten = m.reads.range().subtract(m.writes.range()) if not m.writes.is_empty() else m.reads.range()
        sets = []
        unwritten.foreach_set(sets.append)
        for s in sets:
            if s.get_tuple_name() in written_names and not s.is_empty():
                problems.append(f"read but never written: {s.gist_params(m.context)}")
    return problems


def _early_reads(m) -> list:
    """The write -> read instance pairs of one element in the access model `m` where the read
    does not come after the write, one isl.Map per pair of access statements. Checked pair by
    pair: the whole schedule's lex order with itself (lex_lt_union_map) crosses every two of
    hundreds of access statements and took a minute on the dilated RNN's pullback."""
    if m.writes.is_empty() or m.reads.is_empty():
        return []
    time_of = {mp.get_tuple_name(isl.dim_type.in_): mp for mp in maps(m.schedule)}
    width = next(iter(time_of.values())).dim(isl.dim_type.out)  # every time vector is padded to it
    not_before = isl.Map.lex_ge(isl.Space.set_alloc(m.context.get_ctx(), 0, width))
    bad = []
    for pair in maps(m.writes.apply_range(m.reads.reverse())):  # write instance -> read instance
        w, r = (time_of[pair.get_tuple_name(t)] for t in (isl.dim_type.in_, isl.dim_type.out))
        early = pair.intersect(w.apply_range(not_before).apply_range(r.reverse()))
        if not early.is_empty():
            bad.append(early)
    return bad


def check_dataflow(etdg: ETDG) -> None:
    """Raise ScheduleError unless every read of a written element follows its write."""
    problems = dataflow_violations(etdg)
    if problems:
        raise ScheduleError(f"{etdg.name}: " + "; ".join(problems), op="coarsen")


def _legal(etdg: ETDG) -> bool:
    try:
        return not dataflow_violations(etdg)
    except PolyftError:
        return False


# ---------------------------------------------------------------------------------------
# Width-wise: horizontal merging


def _same_dims(b1: BlockNode, b2: BlockNode) -> bool:
    return (len(b1.dims) == len(b2.dims) and bool(b1.dims)
            and all(d1.extent == d2.extent and d1.op == d2.op for d1, d2 in zip(b1.dims, b2.dims)))


def _edge(rw, i, j) -> bool:
    """Whether nodes i and j exchange data, from `rw`: each node's (reads, writes), computed
    once a body (walking a node's sub-graph again for every pair made the passes cubic)."""
    return bool(rw[i][1] & rw[j][0]) or bool(rw[j][1] & rw[i][0])


def _horizontal_candidate(etdg: ETDG, path, a: int, b: int, where: str, log) -> ETDG:
    """The ETDG with sibling block nodes `a` and `b` of the block at `path` merged, in the
    first's place (`where="first"`) or the second's."""
    w = _Work(etdg)
    _horizontal_apply(w, path, a, b, where, log)
    return w.finish()


def _horizontal_apply(w: _Work, path, a: int, b: int, where: str, log):
    """Merge sibling block nodes `a` and `b` of the block at `path` in the working copy `w`."""
    body = _block_at(w.root, path).body
    b1, b2 = body[a], body[b]
    env = {d2: Aff.of(d1) for d1, d2 in zip(b1.dims, b2.dims)}
    _substitute(b2, env)
    w.rename_created_in(dict(zip(b2.dims, b1.dims)))
    set_body(b1, b1.body + b2.body)
    if where == "first":
        del body[b]
    else:
        body[b] = b1
        del body[a]
    log.append(f"horizontal: {b2.name} merged into {b1.name} (no edge between, equal dims and "
               f"operators) -> {_describe(b1)}")


def _horizontal_places(body):
    """(a, b, where) for the sibling block nodes a < b of `body` that can merge, by a then b:
    where their merged node can sit ("first": b moves up past the nodes between; "second": a
    moves down). Not the pairs that differ in dims or exchange data, nor those with a node
    between that exchanges data with the one that moves. Only the spans free of such a node are
    visited (a node's reads and writes computed once, the nearest edges found by scanning
    outwards), so a chain, every node an edge from the next, costs a linear walk, not all pairs."""
    rw = [(reads(n), writes(n)) for n in body]
    children = [k for k, n in enumerate(body) if isinstance(n, BlockNode)]
    last_edge_before = {j: next((i for i in range(j - 1, -1, -1) if _edge(rw, i, j)), -1) for j in children}
    first_edge_after = {i: next((j for j in range(i + 1, len(body)) if _edge(rw, i, j)), len(body))
                        for i in children}
    later = {a: set(range(a + 1, first_edge_after[a])) for a in children}  # a may move down to them
    for b in children:
        for a in range(last_edge_before[b] + 1, b):  # b may move up to them
            if a in later:
                later[a].add(b)
    for a in children:
        for b in sorted(later[a]):
            if isinstance(body[b], BlockNode) and _same_dims(body[a], body[b]):
                yield a, b, "first" if last_edge_before[b] < a else "second"


def _horizontal_pairs(etdg: ETDG) -> tuple:
    """(path, [(a, b, where)]): the first block node whose body has two or more pairs of sibling
    block nodes that can merge (`_horizontal_places`) in disjoint spans [a, b], each first node
    paired with the nearest one after it (the s sibling maps of a layer: 1 + 2, 3 + 4, ...);
    else (None, []). Disjoint spans make the merges independent: each reorders only its own span."""
    for path, parent in _paths(etdg.root):
        pairs, free_from = [], 0
        for a, b, where in _horizontal_places(parent.body):
            if a >= free_from:
                pairs.append((a, b, where))
                free_from = b + 1
        if len(pairs) > 1:
            return path, pairs
    return None, []


def _horizontal_batch(etdg: ETDG, log, keeps, checked: bool) -> ETDG | None:
    """All the pairs `_horizontal_pairs` finds merged at once, when the result keeps the
    critical path (and, `checked`, its dataflow): 8 layers of 16 sibling maps take 4 rounds of
    whole-program checks instead of 120. None where there is no batch or it is not kept."""
    path, pairs = _horizontal_pairs(etdg)
    if not pairs:
        return None
    w, trial = _Work(etdg), []
    for a, b, where in reversed(pairs):  # from the right: a merge shifts only what follows it
        _horizontal_apply(w, path, a, b, where, trial)
    cand = w.finish()
    if keeps(etdg, cand) and (not checked or _legal(cand)):
        log += trial
        return cand
    return None


def _horizontal_once(etdg: ETDG, log, keeps, checked: bool = False) -> ETDG | None:
    for path, parent in _paths(etdg.root):
        for a, b, where in _horizontal_places(parent.body):
            trial = []
            cand = _horizontal_candidate(etdg, path, a, b, where, trial)
            if keeps(etdg, cand) and (not checked or _legal(cand)):
                log += trial
                return cand
    return None


def _to_fixpoint(etdg, once, name: str, log):
    """Applies `once(work, log)` until it finds nothing more to do; flattens what it merged."""
    log = [] if log is None else log
    w = _Work(etdg)
    n0 = len(log)
    while once(w, log):
        pass
    if len(log) > n0:
        _flatten(w.root, log, name)
    return w.finish()


def horizontal_merge(etdg: ETDG, log: list | None = None, guard: CriticalPathGuard | None = None,
                     checked: bool = False) -> ETDG:
    """Merge sibling block nodes with equal dims and operator vectors and no edge between
    them (paper: Γ¹ ∪ Γ² = (i_d1, P1 ∪ P2, G_T = (V1 ∪ V2, E1 ∪ E2), p_d1)), to a fixpoint.

    The merged node takes the place of the first unless a node in between writes something
    the second reads; then it takes the second's place, unless a node in between reads what
    the first writes (then the pair is left alone). With no data between the two, running
    them in one iteration space changes no value (a direct argument; no ISL needed). A merge
    that makes the critical path longer (`guard`, by default at probe sizes) is not done; with
    `checked`, nor one that `dataflow_violations` finds fault with (coarsen's second try).
    """
    log = [] if log is None else log
    guard = guard or CriticalPathGuard()
    n0, cur = len(log), etdg
    while (nxt := _horizontal_batch(cur, log, guard, checked) or _horizontal_once(cur, log, guard, checked)) is not None:
        cur = nxt
    if len(log) == n0:
        return _unchanged(etdg)
    w = _Work(cur)
    _flatten(w.root, log, "horizontal")
    return w.finish()


# ---------------------------------------------------------------------------------------
# The critical path as a condition on merges


PROBE = 4  # symbolic lengths are probed at the smallest values >= PROBE that the trace allows


class CriticalPathGuard:
    """Whether a merge keeps the critical path (deps/critical.py): merged block nodes run their
    statements as one statement, whose instance waits for everything each part waited for, so
    a merge can chain what ran side by side (a bidirectional RNN's join fused into its forward
    scan waits for the whole backward scan: 2L steps instead of L + 1). Measured at `sizes`;
    lengths they leave symbolic are probed at the smallest values >= PROBE (a single probe: a
    merge that lengthens the path only at other lengths is not caught). Called as
    `guard(before, after)`: True when `after` is no longer than `before`. One guard serves all
    passes of a coarsening: lengths are remembered by the ETDG's printed form, which every pass
    copies but most leave unchanged."""

    def __init__(self, sizes: dict | None = None):
        self.sizes = dict(sizes or {})
        self._lengths = {}  # str(etdg) -> its critical path

    def __call__(self, before: ETDG, after: ETDG) -> bool:
        return self.length(after) <= self.length(before)

    def length(self, etdg: ETDG) -> int:
        key = str(etdg)
        if key not in self._lengths:
            model = build(etdg, self._probe(etdg))
            self._lengths[key] = critical_path(model, None, dependences=may_flow(model))
        return self._lengths[key]

    def _probe(self, etdg: ETDG) -> dict:
        free = [p for p in etdg.params if p not in self.sizes]
        if not free:
            return {p: v for p, v in self.sizes.items() if p in etdg.params}
        ctx = build(etdg, {p: v for p, v in self.sizes.items() if p in etdg.params}).context
        at_least = ctx.intersect_params(isl.Set(f"[{', '.join(etdg.params)}] -> {{ : "
                                                f"{' and '.join(f'{p} >= {PROBE}' for p in free)} }}"))
        pt = (ctx if at_least.is_empty() else at_least).lexmin().sample_point()
        found = {p: pt.get_coordinate_val(isl.dim_type.param, k).to_python() for k, p in enumerate(etdg.params)}
        self.sizes.update({p: found[p] for p in free})
        return {p: self.sizes[p] for p in etdg.params}


# ---------------------------------------------------------------------------------------
# Width-wise: vertical merging


def _block_at(root, path):
    b = root
    for k in path:
        b = b.body[k]
    return b


def _paths(root, prefix=()):
    yield prefix, root
    for k, n in enumerate(root.body):
        if isinstance(n, BlockNode):
            yield from _paths(n, prefix + (k,))


def _aligned(P: BlockNode, C: BlockNode) -> int:
    """How many leading dims align: equal extents and composable operators (Table 3)."""
    k = 0
    for dp, dc in zip(P.dims, C.dims):
        if dp.extent != dc.extent or compose(dc.op, dp.op) is None:
            break
        k += 1
    return k


def _vertical_candidate(etdg: ETDG, path, a: int, b: int, k: int, where: str, log) -> ETDG:
    w = _Work(etdg)
    _vertical_apply(w, path, a, b, k, where, log)
    _flatten(w.root, log, "vertical")
    return w.finish()


def _vertical_apply(w: _Work, path, a: int, b: int, k: int, where: str, log):
    """Merge the block nodes at `a` (producer) and `b` (consumer) of the block at `path` in the
    working copy `w`, over their `k` leading dims, in the producer's or the consumer's place."""
    parent = _block_at(w.root, path)
    P, C = parent.body[a], parent.body[b]
    names = (P.name, C.name)
    env = {dc: Aff.of(dp) for dp, dc in zip(P.dims[:k], C.dims[:k])}
    _substitute(C, env)
    w.rename_created_in(dict(zip(C.dims[:k], P.dims[:k])))
    split = (len(P.dims) > k, len(C.dims) > k)
    composed = []
    for dp, dc in zip(P.dims[:k], C.dims[:k]):
        composed.append(f"{dc.op}∘{dp.op} = {compose(dc.op, dp.op)}")
        dp.op = compose(dc.op, dp.op)
    ppart = [w.new_block(P.dims[k:], P, P.body)] if split[0] else P.body
    cpart = [w.new_block(C.dims[k:], P, C.body)] if split[1] else C.body
    P.dims = P.dims[:k]
    set_body(P, ppart + cpart)
    if where == "producer":
        del parent.body[b]
    else:
        parent.body[b] = P
        del parent.body[a]
    n_fwd = _forward(P)
    if n_fwd:
        drop_dead_ops(P)  # the forwarded loads are P's (the whole program: a batch's merges quadratic)
    left = [f"{nm}'s unaligned dims -> child {_describe(part[0])}"
            for nm, part, s in ((names[0], ppart, split[0]), (names[1], cpart, split[1])) if s]
    msg = (f"vertical: {names[0]} -> {names[1]} merged over {k} aligned dim(s) ({', '.join(composed)}) at the "
           f"{where}'s place -> {_describe(P)}")
    if left:
        msg += "; " + "; ".join(left)
    if n_fwd:
        msg += f"; {n_fwd} load(s) of just-stored elements forwarded"
    log.append(msg)


def _vertical_once(etdg: ETDG, log, keeps) -> ETDG | None:
    for path, parent in _paths(etdg.root):
        body = parent.body
        rw = [(reads(n), writes(n)) for n in body]
        children = [(k, n) for k, n in enumerate(body) if isinstance(n, BlockNode)]
        for (a, P), (b, C) in itertools.combinations(children, 2):
            if not (rw[a][1] & rw[b][0]):
                continue
            # a node moved past one it exchanges data with cannot be legal: skip those places
            places = [where for where, moved in (("producer", b), ("consumer", a))
                      if not any(_edge(rw, moved, x) for x in range(a + 1, b))]
            for k in range(_aligned(P, C), 0, -1):
                if len(P.dims) > k and len(C.dims) > k:
                    continue  # both would keep unaligned dims: one more block node, one more level
                for where in places:
                    trial = []
                    cand = _vertical_candidate(etdg, path, a, b, k, where, trial)
                    if _legal(cand) and keeps(etdg, cand):
                        log += trial
                        return cand
    return None


def _vertical_pairs(etdg: ETDG) -> tuple:
    """(path, [(a, b, k)]): the first block node whose body has two or more disjoint pairs of
    adjacent siblings, a producer directly followed by a consumer of its output, all of whose
    dims align with one side's (the chain of a layer loop: layer 0 -> 1, 2 -> 3, ...); else
    (None, [])."""
    for path, parent in _paths(etdg.root):
        body, pairs, a = parent.body, [], 0
        while a + 1 < len(body):
            P, C = body[a], body[a + 1]
            k = _aligned(P, C) if isinstance(P, BlockNode) and isinstance(C, BlockNode) else 0
            if k and not (len(P.dims) > k and len(C.dims) > k) and writes(P) & reads(C):
                pairs.append((a, a + 1, k))
                a += 2
            else:
                a += 1
        if len(pairs) > 1:
            return path, pairs
    return None, []


def _vertical_batch(etdg: ETDG, log, keeps) -> ETDG | None:
    """All the pairs `_vertical_pairs` finds merged at once, at the producers' places, when the
    result is legal and keeps the critical path (both checked exactly on the whole result, so a
    batch is as safe as one merge): a chain of n layers takes log2(n) rounds of whole-program
    checks instead of n. None where there is no batch or it is not kept."""
    path, pairs = _vertical_pairs(etdg)
    if not pairs:
        return None
    w, trial = _Work(etdg), []
    for a, b, k in reversed(pairs):  # from the right: a merge shifts only what follows it
        _vertical_apply(w, path, a, b, k, "producer", trial)
    _flatten(w.root, trial, "vertical")
    cand = w.finish()
    if _legal(cand) and keeps(etdg, cand):
        log += trial
        return cand
    return None


def vertical_merge(etdg: ETDG, log: list | None = None, guard: CriticalPathGuard | None = None) -> ETDG:
    """Merge producer/consumer sibling block nodes (connected by an edge), to a fixpoint.

    Dims are aligned outermost-first: the leading dims with equal extents whose operators
    compose (Table 3, consumer ∘ producer) are candidates; the producer's dims stay (with the
    composed operators), the consumer's are renamed to them, and each node's remaining dims
    become a child block node of the merged one — on one side only: when both would keep
    unaligned dims the merge adds a block node and a level, the opposite of coarsening, and
    is not done. The most aligned dims are tried first, the
    merged node at the producer's place, then at the consumer's; a candidate is kept only if
    `dataflow_violations` finds none (ISL, exact): the consumer reads the producer only at
    the same or an earlier merged iteration, and the nodes in between still see their data;
    and only if it keeps the critical path (`guard`, by default at probe sizes).
    """
    log = [] if log is None else log
    guard = guard or CriticalPathGuard()
    cur = etdg
    while True:
        nxt = _vertical_batch(cur, log, guard) or _vertical_once(cur, log, guard)
        if nxt is None:
            break
        cur = nxt
    return _unchanged(cur) if cur is etdg else cur


# ---------------------------------------------------------------------------------------
# Depth-wise coarsening


def _mentions_in_conds(node, dims) -> bool:
    ids = {id(d) for d in dims}
    for op in ops(node):
        if op.op == "load":
            for pc in op.pieces:
                for c in pc.conds:
                    if any(id(d) in ids for d in c.expr.dims):
                        return True
    return False


def _splits_a_shared_matmul(block: BlockNode, a: IterDim, b: IterDim) -> bool:
    """Whether a matmul in the block takes its left operand along one of the dims a, b and
    its right matrix along the other alone of the block's dims and those inside it (x[i] @
    w[g] over a batch i and the gates g): tiling the first dim makes one GEMM of each shared
    matrix (etdg.shared_matmuls), which the merged dim, along which both operands change,
    would lose. A right operand that also changes along other dims (flash attention's key
    tiles, along the reduction inside) is no weight a tile keeps: the merge goes ahead."""
    body = ops(block)
    dependent = [(d, depends_on(body, d)) for blk in blocks(block) for d in blk.dims]
    return any(isinstance(mm.inputs[1], OpNode) and [id(d) for d, dep in dependent if mm.inputs[1] in dep] == [id(other)]
               for d, other in ((a, b), (b, a)) for mm in shared_matmuls(body, d))


def _depthwise_ok(block: BlockNode, x: int, ops) -> str | None:
    a, b = block.dims[x], block.dims[x + 1]
    if a.op != b.op or a.op not in ops:
        return None
    if not b.extent.is_concrete or b.extent.const < 1 or isinstance(a.extent, Ragged) or isinstance(b.extent, Ragged):
        return None
    if _mentions_in_conds(block, (a, b)) or _splits_a_shared_matmul(block, a, b):
        return None
    return "ok"


def depthwise_merge(etdg: ETDG, log: list | None = None, ops=("map",)) -> ETDG:
    """Merge adjacent dims of a block node into one (paper: depth-wise coarsening).

    Dims `a` (outer) and `b` (inner, next to it) merge into `t = a*n + b`, `t < extent(a)*n`,
    when: both have the same operator, one of `ops` (default map only); `n = extent(b)` is a
    constant (so `a = floor(t/n)`, `b = t mod n` are quasi-affine); no access in the block's
    sub-graph is conditioned on `a` or `b` (each buffer interacts with both dims by an
    access or an invariant relation, never a non-access one); and no matmul takes its left
    operand along one of them and its right matrix along the other alone (`x[i] @ w[g]`: a
    tile of i shares each w[g], the reuse a GEMM needs, which t would lose). Accesses are
    rewritten and simplified: an access along `a*n + b` becomes linear in `t`, an access along `a` alone
    (invariant in `b`) becomes `floor(t/n)`, along `b` alone `t mod n` — the strided forms.
    The iteration order is unchanged ((a, b) -> a*n + b is order-preserving and both dims run
    the same way), so every dependence is preserved.
    """
    log = [] if log is None else log
    w = _Work(etdg)
    for block in blocks(w.root):
        x = 0
        while x + 1 < len(block.dims):
            if not _depthwise_ok(block, x, ops):
                x += 1
                continue
            a, b = block.dims[x], block.dims[x + 1]
            n = b.extent.const
            t = IterDim(a.name + b.name, a.extent * n, a.op)
            env = {a: Aff.of(t).floordiv(n), b: Aff.of(t).mod(n)}
            _substitute(block, env)
            w.rename_created_in({a: t, b: t})
            block.dims[x:x + 2] = [t]
            log.append(f"depthwise: {block.name} dims {a.name} < {a.extent}, {b.name} < {n} ({a.op}) -> "
                       f"{t.name} = {a.name}*{n} + {b.name} < {t.extent}; now {_describe(block)}")
    return w.finish()


# ---------------------------------------------------------------------------------------
# Access map fusion and dead buffers


def _statements_of_stores(root) -> dict:
    """id(store) -> (block, ops of the statement containing it), for every store, in one walk
    (searching the tree once a store made access map fusion quadratic in the program)."""
    out = {}
    for block in blocks(root):
        run = []
        for n in block.body + [None]:
            if isinstance(n, OpNode):
                run.append(n)
                continue
            out.update({id(op): (block, run) for op in run if op.op == "store"})
            run = []
    return out


def _copy_source(store: OpNode, run):
    """The pieces a copy store copies (a load, copy(load), or a constant), else None."""
    v = store.inputs[0]
    if isinstance(v, tuple):
        return [Piece((), None, (), v[1])]
    if v.op == "copy" and isinstance(v.inputs[0], OpNode):
        v = v.inputs[0]
    if v.op == "load" and any(op is v for op in run):
        return v.pieces
    return None


def _fuse_once(w: _Work, log) -> bool:
    all_ops = ops(w.root)
    outputs = {id(b.resolve()) for b in w.outputs}
    n_stores = {}
    for op in all_ops:
        if op.op == "store":
            n_stores[id(op.buffer.resolve())] = n_stores.get(id(op.buffer.resolve()), 0) + 1
    statement_of = _statements_of_stores(w.root)
    for store in [op for op in all_ops if op.op == "store"]:
        dst = store.buffer.resolve()
        if dst.kind != "intermediate" or id(dst) in outputs or n_stores[id(dst)] != 1:
            continue
        block, run = statement_of[id(store)]
        ctx = block.context()
        if len(store.index) != len(ctx) or len(ctx) != dst.depth or any(
                not isinstance(ix, Aff) or ix.terms != {d: 1} or ix.divs or str(ix.offset) != "0"
                for ix, d in zip(store.index, ctx)):
            continue
        src = _copy_source(store, run)
        if src is None:
            continue
        if any(np.shape(pc.const) != dst.element_shape if pc.buffer is None else
               (pc.buffer.resolve().element_shape, pc.buffer.resolve().dtype) != (dst.element_shape, dst.dtype)
               for pc in src):
            continue
        readers = [op for op in all_ops if op.op == "load"
                   and any(pc.buffer is not None and pc.buffer.resolve() is dst for pc in op.pieces)]
        if any(isinstance(ix, Gather) and ix.index.resolve() is dst
               for op in all_ops if op.op == "load" for pc in op.pieces for ix in pc.index):
            continue
        if any(not isinstance(ix, Aff) for op in readers for pc in op.pieces
               if pc.buffer is not None and pc.buffer.resolve() is dst for ix in pc.index):
            continue
        for op in readers:
            pieces = []
            for pc in op.pieces:
                if pc.buffer is None or pc.buffer.resolve() is not dst:
                    pieces.append(pc)
                    continue
                env = dict(zip(ctx, pc.index))
                for sp in src:
                    q = _subst_piece(sp, env)
                    q = q.restrict(pc.conds) if q is not None else None
                    if q is not None:
                        pieces.append(q)
            op.pieces = pieces
        set_body(block, [n for n in block.body if n is not store])
        drop_dead_ops(w.root)
        what = ", ".join(sorted({pc.buffer.resolve().name if pc.buffer is not None else "a constant"
                                 for pc in src}))
        how = (f"its {len(readers)} reader(s) now read the source through the composed access map"
               if readers else "nothing read it")
        log.append(f"fuse: {dst.name} was a copy of {what} (store in {block.name}); {how}; the copy is removed")
        return True
    return False


def fuse_access_maps(etdg: ETDG, log: list | None = None) -> ETDG:
    """Access map fusion: remove buffers that only copy another buffer (or a constant).

    A store `dst[ctx] <- v` qualifies when `dst` is an intermediate buffer written by that
    store only, its index is the statement's iteration vector (so the element written at
    iteration `ctx` is `dst[ctx]`), and `v` is a load of the same statement, `copy` of one,
    or a constant. Every reader of `dst[e]` then reads the copied pieces with `ctx := e`
    substituted (composed indices; the copy's piece conditions and the reader's conjoined).
    The source element was written before the copy read it, and the copy before the reader
    read it, so reading the source directly is legal; the copy and what only fed it go.
    """
    return _to_fixpoint(etdg, _fuse_once, "fuse", log)


def drop_dead_buffers(etdg: ETDG, log: list | None = None) -> ETDG:
    """Remove stores into intermediate buffers that nothing reads (and what only fed them)."""
    log = [] if log is None else log
    w = _Work(etdg)
    read = reads(w.root)
    outputs = {b.resolve() for b in w.outputs}
    dead = []

    def visit(block):
        keep = []
        for n in block.body:
            if isinstance(n, OpNode) and n.op == "store":
                b = n.buffer.resolve()
                if b.kind == "intermediate" and b not in read and b not in outputs:
                    if b.name not in dead:
                        dead.append(b.name)
                    continue
            keep.append(n)
            if isinstance(n, BlockNode):
                visit(n)
        block.body = keep
    visit(w.root)
    if dead:
        before = {b.name for b in blocks(w.root)}
        drop_dead_ops(w.root)
        gone = before - {b.name for b in blocks(w.root)}
        log.append(f"dead: nothing reads {', '.join(dead)}: stores removed"
                   + (f", block node(s) {', '.join(sorted(gone))} left empty and removed" if gone else ""))
        _flatten(w.root, log, "dead")
    return w.finish()


# ---------------------------------------------------------------------------------------
# The driver


def coarsen(etdg: ETDG, depthwise: bool = True, depthwise_ops=("map",), max_rounds: int = 50,
            sizes: dict | None = None):
    """All passes to a fixpoint: returns (new ETDG, log of what each pass did).

    A round runs fuse_access_maps, drop_dead_buffers, horizontal_merge, vertical_merge and
    (unless `depthwise=False`) depthwise_merge; rounds repeat until one changes nothing.
    No pass adds a block node, so the result has at most as many as the input, and none
    lengthens the critical path at `sizes` (the merges check it: `CriticalPathGuard`). The
    result's dataflow is checked exactly; where it is broken, coarsening runs again with every
    horizontal merge checked too, and the program stays as traced if that fails as well.
    """
    guard = CriticalPathGuard(sizes)
    for checked in (False, True):
        log, cur = [], etdg
        passes = [fuse_access_maps, drop_dead_buffers, lambda e, lg: horizontal_merge(e, lg, guard, checked),
                  lambda e, lg: vertical_merge(e, lg, guard)]
        if depthwise:
            passes.append(lambda e, lg: depthwise_merge(e, lg, ops=depthwise_ops))
        for _ in range(max_rounds):
            n0 = len(log)
            for p in passes:
                cur = p(cur, log)
            if len(log) == n0:
                break
        if cur is etdg or _legal(cur):
            return (cur if cur is not etdg else _unchanged(etdg)), log
    # the result is checked exactly: a pass that broke the dataflow (a horizontal merge is
    # argued legal, not checked: b2b_gemm's pullback read an element never written) is redone
    # with every merge checked, and if that fails too the program is left as traced
    return _unchanged(etdg), log + ["coarsening broke the dataflow (dataflow_violations): the program runs as traced"]
