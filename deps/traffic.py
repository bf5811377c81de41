"""Memory traffic of a traced program's reads, modelled exactly from its access relations
(the model behind the paper's Table 7: what deferring the materialisation of views saves).

At concrete sizes every read of a statement is an ISL relation instance -> buffer element,
one element being one static-shape tile. Two plans are counted, with the same rule for both:
a buffer element is moved between DRAM and the chip once per buffer it lives in (an ideal
cache: repeated reads of one element by different instances are free).

* deferred (what the ETDG's access maps allow): every read goes straight to the source
  buffer through its access map. Traffic = distinct source elements touched, i.e. the card
  of the image of the statement's domain under the access relation, times the tile bytes.
* materialising (what a DAG of tensor operators does): every read through a non-identity
  view (window / shifted_slide, slice / shift, stride / dilation, reverse, index of a
  parametric list, gather) first copies the view into its own buffer: read the distinct
  source elements, write every element of the view, then read the view. The view has one
  element per distinct value of the iteration dims the access depends on (the shape the view
  operator produces, e.g. `ks.shifted_slide(3)[2:-2]` is [B, NB - 4, 3]); it is read once
  per element, by the rule above. So the plans differ by exactly 2 x view elements per view.

Reads that are not views: identity and broadcast reads (every buffer index is one iteration
dim, coefficient 1, offset 0, in loop order; dims the access does not use are a broadcast,
e.g. a closure reading `ks` inside `qs.map`), unpacking a static list by a constant index
(`gs[0]`, the 4 gates of an LSTM, the 3 tiles of a window inside a user function), and the
states of a scan or reduce. Statements on a dataflow cycle (a statement reading what it
writes, or a scan body split into several statements) carry a recurrence; their reads of
each other's buffers are kind "state": the running state stays on chip and moves no bytes.
Reads of such a buffer from outside the cycle (kind "result", e.g. a reduce's final value
`t[..., TK - 1]`) are plain reads unless they go through a view (a dilated layer reads the
layer below's outputs through a stride), and only the states read so, or returned by the program,
are written out. Other writes are the distinct elements written. Writes are the same in
both plans; they are reported and included in the totals. Intermediate buffers are DRAM
buffers in both plans (no fusion is modelled), so the ratio of the two plans isolates the
cost of materialising views; absolute bytes are an ideal-cache lower bound, not what a
kernel moves. Gathers are may-accesses over the whole gathered dim (an upper bound).

What the generated code moves (`code_traffic`) is a third count, without the ideal cache:
the generated code (C and CUDA alike) has no cache of its own, so every access of every
statement instance moves its whole tile, each time: a load reads the tile from its buffer
(loads are pointers into buffers), a store writes it. Per read and write access relation at
concrete sizes, that is the number of (instance, element) pairs, the card of the relation's
graph, times the tile bytes; states of a recurrence are read back from their buffer like any
other element (nothing is kept on chip). Every access relation of an affine access is a
function of the instance, so its graph has exactly as many points as its domain, which is what
is counted (a box, or split like any set: never enumerated at full size); a gather reads one
element per instance too, though its may-access relation spans the whole gathered dim, so it
is counted the same way (the index it reads first is not an access relation of the model and
is not counted; nor are constant pieces, e.g. a window's zero padding, which read no buffer).
Storage contraction (schedule/storage.py) changes where an element is stored, not how often it
is accessed: the bytes the code moves are the same with or without it. What changes is which
memory they hit: the C target keeps buffers placed "local" in a small scratch per thread
(cache-resident), so `CodeTraffic.bytes(exclude=...)` leaves their accesses out to count what
the code moves to and from memory shared by all threads.

Counting: sets are boxes in the workloads (products of intervals), counted as products of
their extents; a non-box set is counted by isl's enumeration when small, else split along
its first dim. Parameters are fixed to the sizes first, so counts are plain integers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl
import numpy as np

from polyft.affine import Aff
from polyft.errors import PolyftError
from polyft.etdg import ETDG, Gather

from .isl_helpers import union
from .model import PolyModel, build

# the kinds of read, most view-like first (a load's kind is the first kind any piece has)
VIEW_KINDS = ("gather", "window", "stride", "reverse", "index", "slice", "permute")
PLAIN_KINDS = ("state", "result", "unpack", "direct")
ENUMERATE_LIMIT = 200_000  # points: above this a non-box set is split rather than enumerated


# -- counting ------------------------------------------------------------------------------

def _fix_params(s: isl.Set, sizes: dict) -> isl.Set:
    for name, value in sizes.items():
        pos = s.find_dim_by_name(isl.dim_type.param, name)
        if pos >= 0:
            s = s.fix_val(isl.dim_type.param, pos, value)
    return s.project_out_all_params()


def _bounds(s) -> list:
    out = []
    for d in range(s.dim(isl.dim_type.set)):
        lo, hi = s.dim_min_val(d), s.dim_max_val(d)
        if not (lo.is_int() and hi.is_int()):
            raise PolyftError(f"cannot count the unbounded set {s}", op="traffic")
        out.append((lo.to_python(), hi.to_python()))
    return out


def _count_basic(s: isl.Set) -> int:
    if s.is_empty():
        return 0
    bounds = _bounds(s)
    volume = int(np.prod([hi - lo + 1 for lo, hi in bounds], dtype=object)) if bounds else 1
    box = isl.Set.universe(s.get_space())
    for d, (lo, hi) in enumerate(bounds):
        box = box.lower_bound_val(isl.dim_type.set, d, isl.Val.int_from_si(s.get_ctx(), lo))
        box = box.upper_bound_val(isl.dim_type.set, d, isl.Val.int_from_si(s.get_ctx(), hi))
    if box.is_subset(s):
        return volume
    if volume <= ENUMERATE_LIMIT:
        return s.count_val().to_python()
    for d, (lo, hi) in enumerate(bounds):  # split along the first dim with more than one value
        if hi > lo:
            return sum(_count_basic(s.fix_val(isl.dim_type.set, d, v)) for v in range(lo, hi + 1))
    return 1


def count(s, sizes: dict | None = None) -> int:
    """The number of integer points of an isl Set (parameters fixed by `sizes`)."""
    if isinstance(s, isl.BasicSet):
        s = isl.Set.from_basic_set(s)
    if s.dim(isl.dim_type.param):
        s = _fix_params(s, sizes or {})
    return sum(_count_basic(isl.Set.from_basic_set(b)) for b in s.make_disjoint().get_basic_sets())


# -- classifying reads ---------------------------------------------------------------------

def _row_kind(ix, extent) -> str:
    if isinstance(ix, Gather):
        return "gather"
    if not isinstance(ix, Aff):
        raise PolyftError(f"the access index {ix} is neither affine nor a gather", op="traffic")
    if ix.divs or any(abs(c) > 1 for c in ix.terms.values()):
        return "stride"
    if len(ix.terms) > 1:
        return "window"
    if not ix.terms:
        return "unpack" if extent.is_concrete else "index"
    if next(iter(ix.terms.values())) == -1:
        return "reverse"
    return "slice" if not (ix.offset.is_concrete and ix.offset.const == 0) else "direct"


def piece_kind(index, buffer, dims) -> str:
    """What kind of view one access piece reads through (see VIEW_KINDS / PLAIN_KINDS)."""
    unit = {d: 0 for d in dims if d.extent.is_concrete and d.extent.const == 1}  # e.g. strided_split(1)
    index = [ix.substitute(unit) if unit and isinstance(ix, Aff) else ix for ix in index]
    kinds = [_row_kind(ix, ext) for ix, ext in zip(index, buffer.dims)]
    used = [dims.index(next(iter(ix.terms))) for ix, k in zip(index, kinds) if k == "direct"]
    if used != sorted(set(used)):
        kinds.append("permute")
    return next((k for k in VIEW_KINDS + PLAIN_KINDS if k in kinds), "direct")


def _used_dims(index) -> set:
    out = set()
    for ix in index:
        out |= ix.dims
    return out


# -- the model -----------------------------------------------------------------------------

@dataclass
class ReadTraffic:
    """One load of one statement (all its pieces), counted in tiles."""

    statement: str
    buffer: str
    access: str  # the pieces' indices, e.g. "kss[i, j + k + 1]"
    kind: str  # one of VIEW_KINDS or PLAIN_KINDS
    instances: int  # statement instances
    source_tiles: int  # distinct source elements touched
    view_tiles: int  # elements of the materialised view (0 when the read is not a view)
    tile_bytes: int

    @property
    def is_view(self) -> bool:
        return self.kind in VIEW_KINDS

    @property
    def deferred_bytes(self) -> int:
        return 0 if self.kind == "state" else self.source_tiles * self.tile_bytes

    @property
    def materialised_bytes(self) -> int:
        return self.deferred_bytes + 2 * self.view_tiles * self.tile_bytes


@dataclass
class WriteTraffic:
    statement: str
    buffer: str
    tiles: int
    tile_bytes: int

    @property
    def bytes(self) -> int:
        return self.tiles * self.tile_bytes


@dataclass
class Traffic:
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)

    @property
    def write_bytes(self) -> int:
        return sum(w.bytes for w in self.writes)

    def bytes(self, plan: str) -> int:
        """Total bytes moved (reads + writes) under plan "deferred" or "materialised"."""
        if plan not in ("deferred", "materialised"):
            raise PolyftError(f"unknown plan {plan!r}: 'deferred' or 'materialised'", op="traffic")
        return sum(getattr(r, f"{plan}_bytes") for r in self.reads) + self.write_bytes

    def rows(self) -> list:
        """One dict per read and write (for a tidy table)."""
        out = [dict(statement=r.statement, buffer=r.buffer, access=r.access, kind=r.kind,
                    instances=r.instances, source_tiles=r.source_tiles, view_tiles=r.view_tiles,
                    tile_bytes=r.tile_bytes, deferred_bytes=r.deferred_bytes,
                    materialised_bytes=r.materialised_bytes) for r in self.reads]
        out += [dict(statement=w.statement, buffer=w.buffer, access="write", kind="write",
                     instances=w.tiles, source_tiles=w.tiles, view_tiles=0, tile_bytes=w.tile_bytes,
                     deferred_bytes=w.bytes, materialised_bytes=w.bytes) for w in self.writes]
        return out


def tile_bytes(buffer) -> int:
    return int(np.prod(buffer.element_shape, dtype=np.int64)) * np.dtype(buffer.dtype).itemsize


def _project(domain: isl.Set, keep: list) -> isl.Set:
    for pos in reversed(range(domain.dim(isl.dim_type.set))):
        if pos not in keep:
            domain = domain.project_out(isl.dim_type.set, pos, 1)
    return domain


def _loads(model: PolyModel, st):
    """(pieces, their isl maps) per load of `st` and buffer it reads."""
    maps = [m for name, am, m in model.accesses if name == st.name and am.kind == "read"]
    out, pos = [], 0
    for op in st.ops:
        pieces = [pc for pc in op.pieces if pc.buffer is not None] if op.op == "load" else []
        groups = {}  # a load reading several buffers (a scan's init, then its states) is one read per buffer
        for pc in pieces:
            groups.setdefault(pc.buffer.resolve(), []).append((pc, maps[pos]))
            pos += 1
        out += [([pc for pc, _ in g], [m for _, m in g]) for g in groups.values()]
    if pos != len(maps):
        raise PolyftError(f"{st.name}: {len(maps)} read relations but {pos} load pieces", op="traffic")
    return out


def _recurrences(stmts, loads, writer) -> dict:
    """statement -> the statements on a dataflow cycle with it (itself included if on one)."""
    names = [st.name for st in stmts]
    reach = {a: set() for a in names}  # a -> statements that read what a writes, transitively
    for st in stmts:
        for pcs, _ in loads[st.name]:
            w = writer.get(pcs[0].buffer.resolve())
            if w is not None:
                reach[w].add(st.name)
    for k in names:  # transitive closure (a handful of statements)
        for a in names:
            if k in reach[a]:
                reach[a] |= reach[k]
    return {a: {b for b in reach[a] if a in reach[b]} for a in names}


def _require_lengths(model: PolyModel) -> None:
    missing = [p for p in model.params if p not in model.sizes]
    if missing:
        raise PolyftError(f"traffic needs concrete lengths; give sizes for {missing}", op="traffic")


def model_traffic(model: PolyModel) -> Traffic:
    """The traffic of every read and write of `model` (all lengths fixed by model.sizes)."""
    _require_lengths(model)
    stmts = model.etdg.statements
    loads = {st.name: _loads(model, st) for st in stmts}
    writer = {am.buffer.resolve(): st.name for st in stmts for am in st.writes}
    cycle = _recurrences(stmts, loads, writer)
    # buffers carried by a recurrence: written and read inside one cycle of statements
    state = {pcs[0].buffer.resolve() for st in stmts for pcs, _ in loads[st.name]
             if writer.get(pcs[0].buffer.resolve()) in cycle[st.name]}
    read_elsewhere = {}  # state buffer -> the elements read outside its recurrence
    out = Traffic()
    for st in stmts:
        dims, domain = list(st.dims), model.domains[st.name]
        instances = count(domain, model.sizes)
        for pieces, maps in loads[st.name]:
            buf = pieces[0].buffer.resolve()
            image = union(m.range() for m in maps)
            if writer.get(buf) in cycle[st.name]:
                kind = "state"
            else:
                kinds = [piece_kind(pc.index, buf, dims) for pc in pieces]
                kind = next(k for k in VIEW_KINDS + PLAIN_KINDS if k in kinds)
                if buf in state:  # a scan's outputs, or a reduce's last state (a constant index)
                    kind = "result" if kind not in VIEW_KINDS or kind == "index" else kind
                    read_elsewhere[buf] = image if buf not in read_elsewhere else read_elsewhere[buf].union(image)
            view = 0
            if kind in VIEW_KINDS:
                used = set().union(*(_used_dims(pc.index) for pc in pieces))
                view = count(_project(domain, [i for i, d in enumerate(dims) if d in used]), model.sizes)
            access = " | ".join(f"{buf.name}[{', '.join(str(ix) for ix in pc.index)}]" for pc in pieces)
            out.reads.append(ReadTraffic(st.name, buf.name, access, kind, instances,
                                         count(image, model.sizes), view, tile_bytes(buf)))
    for st in stmts:
        for name, am, m in model.accesses:
            if name == st.name and am.kind == "write":
                b = am.buffer.resolve()
                image = m.range()
                if b in state and b.kind != "output":  # only the states others read leave the chip
                    image = image.intersect(read_elsewhere[b]) if b in read_elsewhere else image.subtract(image)
                out.writes.append(WriteTraffic(st.name, b.name, count(image, model.sizes), tile_bytes(b)))
    return out


def traffic(etdg: ETDG, sizes: dict) -> Traffic:
    """Build the ISL model of `etdg` at `sizes` (every length given) and count its traffic."""
    return model_traffic(build(etdg, sizes))


# -- what the generated code moves ---------------------------------------------------------

@dataclass
class AccessTraffic:
    """One access relation (one piece of one load or store) of one statement, counted in tiles."""

    statement: str
    buffer: str
    kind: str  # "read" | "write"
    access: str  # e.g. "xs[i + 1]"
    pairs: int  # (instance, element) pairs: the card of the relation's graph
    tile_bytes: int

    @property
    def bytes(self) -> int:
        return self.pairs * self.tile_bytes


@dataclass
class CodeTraffic:
    """Bytes the generated code loads and stores: every access of every instance moves its tile."""

    accesses: list = field(default_factory=list)

    def bytes(self, kind: str | None = None, exclude=()) -> int:
        """Total bytes moved, of kind "read" or "write" (both by default), leaving out the
        accesses to the buffers named in `exclude` (e.g. those a storage places "local")."""
        if kind not in (None, "read", "write"):
            raise PolyftError(f"unknown access kind {kind!r}: 'read' or 'write'", op="traffic")
        return sum(a.bytes for a in self.accesses
                   if (kind is None or a.kind == kind) and a.buffer not in set(exclude))

    def by_buffer(self) -> dict:
        """buffer name -> bytes moved to and from it."""
        out = {}
        for a in self.accesses:
            out[a.buffer] = out.get(a.buffer, 0) + a.bytes
        return out


def graph_count(m: isl.Map, sizes: dict | None = None, gather: bool = False) -> int:
    """The number of (instance, element) pairs an access moves: the card of the graph of `m`.
    A single-valued relation's graph has as many points as its domain (counted instead, as
    boxes); a gather's may-access relation spans the gathered dim but reads one element per
    instance, so its domain is counted too; any other relation is counted as its wrapped graph."""
    if gather or m.is_single_valued():
        return count(m.domain(), sizes)
    return count(m.wrap(), sizes)


def model_code_traffic(model: PolyModel) -> CodeTraffic:
    """What the code generated from `model` loads and stores (all lengths fixed by model.sizes)."""
    _require_lengths(model)
    out = CodeTraffic()
    for name, am, m in model.accesses:
        buf = am.buffer.resolve()
        access = f"{buf.name}[{', '.join(str(ix) for ix in am.index)}]"
        out.accesses.append(AccessTraffic(name, buf.name, am.kind, access,
                                          graph_count(m, model.sizes, am.is_gather), tile_bytes(buf)))
    return out


def code_traffic(etdg: ETDG, sizes: dict) -> CodeTraffic:
    """Build the ISL model of `etdg` at `sizes` (every length given) and count the bytes its
    generated code loads and stores (no cache: every access moves its tile)."""
    return model_code_traffic(build(etdg, sizes))
