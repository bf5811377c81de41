"""Storage that follows the live set: contracting intermediate buffers under a schedule.

The tracer gives every instance of a statement a fresh buffer element (single assignment),
so an intermediate buffer is as large as its statement's iteration domain. Under a schedule
most of those elements are dead most of the time. Over ISL, per intermediate buffer:

* **live ranges.** An element is live from its write to its last read, in schedule time.
  Time is ordered only along sequential time dims: two instances that differ first in a
  parallel dim run at once (OpenMP threads, CUDA blocks), so neither comes first.
* **conflicts.** Elements e1 != e2 conflict unless every access of one happens before the
  write of the other. Accesses at the same time conflict too: a statement may read its
  operands while it writes (loads are pointers into buffers).
* **a modular mapping** (successive modulo, after Lefebvre & Feautrier and Darte, Schreiber &
  Villard): dim by dim, outermost first, the modulus is one more than the largest distance
  along that dim between conflicting elements equal on the dims before it, when that
  distance is a constant; a dim whose distance is unbounded (it grows with a length) keeps
  its extent, a dim with no conflicting distance is dropped (modulus 1). The mapping is
  `isl.Map` element -> cell, checked with ISL before use: no two conflicting elements share a
  cell. Moduli are constants, so the contraction never depends on the lengths.
* **placement.** A buffer whose every element is accessed within one iteration of a parallel
  loop (its *slot* dim, the outermost parallel loop around the accesses) is "local": a
  thread (C) or block (CUDA) runs one iteration of that loop, or a batch of at most BATCH
  consecutive ones when the target tiles it, the whole batch before the next, so it only
  needs the cells of the elements live within one batch. Those get their own
  successive-modulo contraction per `Batch` (`local[batch]`: moduli and mapping for the
  conflicts between elements whose slot times differ by less than the batch's width, checked
  like the global one), a scratch per thread. How the batch runs the parallel loops inside
  the slot loop matters too: a C thread runs them in order, at most BATCH iterations at once
  (`in_order`), so the gates of one tile of rows can take the cells of the tile before;
  a CUDA block may hand them to other blocks (a 2-D grid), so they count as at once there.
  Other buffers are "global": one array shared by all threads. A target may still keep a
  local buffer global (`moduli` are valid either way).
* **sharing.** Local buffers whose elements are never live at once within a batch (a layer's
  outputs, dead once the next layer has read them, and the layer after next's) may start at
  one address of the scratch: `Storage.regions` groups them, each pair checked with ISL.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from polyft.deps.isl_helpers import maps, param_prefix, union
from polyft.deps.model import PolyModel
from polyft.errors import PolyftError

from .schedule import Schedule

BATCH = 16  # consecutive iterations of a parallel loop that one thread (C) or block (CUDA) runs at once


@dataclass(frozen=True)
class Batch:
    """How one thread or block runs the iterations of a local buffer's slot loop: `width`
    consecutive ones at once (1 or BATCH); with `in_order`, the parallel loops inside it in
    order, at most BATCH iterations at once (the C target), else as if all at once (CUDA)."""
    width: int
    in_order: bool = False


BATCHES = tuple(Batch(w, o) for w in (1, BATCH) for o in (False, True))


@dataclass
class BufferStorage:
    """How one buffer is stored: `moduli[r]` per list dim r (None: the full extent, k: the
    index mod k, 1: dropped) and the ISL mapping element -> cell of one global array; for a
    "local" buffer also those of one thread's scratch, `local[batch]` = (moduli, mapping)
    for each of BATCHES: 1 or BATCH consecutive iterations of time dim `slot_dim`."""

    buffer: object  # etdg.Buffer
    moduli: tuple
    mapping: isl.Map | None  # None: stored as is (inputs, outputs, constants)
    placement: str  # "global" | "local"
    live: isl.Map | None = None  # element -> time of each access (write and reads)
    written: isl.Map | None = None  # element -> time of its write
    slot_dim: int | None = None  # local: the parallel time dim whose iteration owns each element
    local: dict | None = None  # local: Batch -> (moduli, isl.Map)

    @property
    def contracted(self) -> bool:
        return any(m is not None for m in self.moduli)

    def _moduli(self, batch: Batch | None) -> tuple:
        if batch is None:
            return self.moduli
        if self.local is None or batch not in self.local:
            raise PolyftError(f"buffer {self.buffer.name} is {self.placement}: no local storage for {batch}",
                              op="storage")
        return self.local[batch][0]

    def cell_dims(self, batch: Batch | None = None) -> list:
        """The stored list dims of the global array (batch None) or of one thread's scratch
        for a Batch: a Length (the full extent) or an int (a modulus)."""
        return [n if m is None else m for n, m in zip(self.buffer.dims, self._moduli(batch))]

    def cell_index(self, r: int, expr: str, batch: Batch | None = None) -> str | None:
        """The C index of list dim r for the element index `expr`; None for a dropped dim."""
        m = self._moduli(batch)[r]
        return expr if m is None else None if m == 1 else f"(({expr}) % {m})"


@dataclass
class Storage:
    """The storage mapping of every buffer of a model under a schedule."""

    buffers: dict  # buffer name -> BufferStorage
    contract: bool
    schedule: Schedule | None = None
    context: isl.Set | None = None
    _apart: dict = field(default_factory=dict)  # (name, name, width) -> never live at once
    _batch_order: dict = field(default_factory=dict)  # (slot dim, in order) -> batch_before of the schedule

    def regions(self, batches: dict) -> list:
        """Local buffers (name -> Batch) in groups that can start at one address of a
        thread's scratch: within a batch, no element of one is live while an element of
        another in its group is (same slot dim and batch; checked pairwise with ISL)."""
        groups = []
        for name, batch in batches.items():
            group = next((g for g in groups if all(self.apart(name, other, batch) for other in g)), None)
            if group is None:
                groups.append([name])
            else:
                group.append(name)
        return groups

    def apart(self, a: str, b: str, batch: Batch) -> bool:
        """Buffers a and b (local, run as `batch`) never have elements live at once."""
        key = (a, b, batch)
        if key not in self._apart:
            sa, sb = self.buffers[a], self.buffers[b]
            if sa.slot_dim is None or sa.slot_dim != sb.slot_dim:
                self._apart[key] = False
            else:
                order = (sa.slot_dim, batch.in_order)
                if order not in self._batch_order:
                    self._batch_order[order] = batch_before(self.schedule, *order)
                both = overlapping(sa.live, sa.written, sb.live, sb.written, self._batch_order[order])
                near = same_batch(sa.live, self.schedule, sa.slot_dim, batch.width, sb.live)
                self._apart[key] = both.intersect(near).intersect_params(self.context).is_empty()
        return self._apart[key]

    def of(self, buf) -> BufferStorage:
        return self.buffers[buf.resolve().name]

    def describe(self, context=None) -> str:
        g = (lambda m: m.gist_params(context)) if context is not None else (lambda m: m)
        lines = []
        for s in self.buffers.values():
            if s.mapping is None:
                continue
            lines.append(f"{s.buffer.name}: {s.placement}, cells {_dims_text(s.cell_dims())} "
                         f"of {_dims_text(s.buffer.dims)}")
            lines.append(f"  mapping  {g(s.mapping)}")
            for batch, (_, m) in (s.local or {}).items():
                inner = "the parallel loops inside in order" if batch.in_order else "the loops inside at once"
                lines.append(f"  local    cells {_dims_text(s.cell_dims(batch))} per thread running {batch.width} "
                             f"iteration(s) of time dim {s.slot_dim} at once, {inner}: {g(m)}")
            if s.live is not None:
                lines.append(f"  accessed {g(s.live)}")
        return "\n".join(lines) or "no intermediate buffers"


def extents(dims, lengths: dict, full=None) -> tuple:
    """Stored dims (cell_dims, or a buffer's dims) as integers, for the given lengths. With
    the buffer's dims `full`, a modulus larger than its dim's extent is cut to the extent
    (the index, below the extent, is its own remainder)."""
    out = tuple(n if isinstance(n, int) else n.evaluate(lengths) for n in dims)
    if full is None:
        return out
    return tuple(min(m, n) if isinstance(d, int) else m for m, n, d in zip(out, extents(full, lengths), dims))


def _dims_text(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _time_space(schedule: Schedule) -> isl.Space:
    """The space of time vectors (from a statement's map: the union of them all is empty when every
    list has length 0)."""
    m = next(iter(schedule.per_statement.values()))
    return m.get_space().range()


def _same_prefix(space: isl.Space, k: int) -> isl.Map:
    """t -> t' on time vectors of `space` that agree on their first k dims."""
    same = isl.Map.universe(isl.Space.map_from_domain_and_range(space, space))
    for j in range(k):
        same = same.equate(isl.dim_type.in_, j, isl.dim_type.out, j)
    return same


def happens_before(schedule: Schedule) -> isl.Map:
    """t -> t' where t runs strictly before t': equal up to a sequential dim where t is smaller.
    Time vectors first differing in a parallel dim are unordered (they run at once)."""
    space = _time_space(schedule)
    before = isl.Map.empty(isl.Space.map_from_domain_and_range(space, space))
    for k, parallel in enumerate(schedule.parallel):
        if not parallel:
            before = before.union(_same_prefix(space, k).order_lt(isl.dim_type.in_, k, isl.dim_type.out, k))
    return before.coalesce()


def batch_before(schedule: Schedule, k: int, in_order: bool = False) -> isl.Map:
    """t -> t' in one batch of iterations of the parallel time dim k (a thread or block runs
    the batch statement by statement, all its iterations at once: as if dim k were innermost),
    where t runs strictly before t': equal up to a sequential dim after k where t is smaller;
    dim k itself is ignored (iterations in one call run at once). With `in_order` (Batch),
    also equal up to a parallel dim after k where t is at least BATCH smaller."""
    space = _time_space(schedule)
    before = isl.Map.empty(isl.Space.map_from_domain_and_range(space, space))
    for j in range(k + 1, len(schedule.parallel)):
        if schedule.parallel[j] and not in_order:
            continue
        same = isl.Map.universe(before.get_space())
        for i in range(j):
            if i != k:
                same = same.equate(isl.dim_type.in_, i, isl.dim_type.out, i)
        if schedule.parallel[j]:
            n = space.dim(isl.dim_type.set)
            far = isl.Map(f"{{ [{', '.join(f'i{d}' for d in range(n))}] -> [{', '.join(f'o{d}' for d in range(n))}] "
                          f": o{j} - i{j} >= {BATCH} }}").align_params(space)
            before = before.union(same.intersect(far))
        else:
            before = before.union(same.order_lt(isl.dim_type.in_, j, isl.dim_type.out, j))
    return before.coalesce()


def buffer_times(model: PolyModel, schedule: Schedule, name: str) -> tuple:
    """(write times, access times) of buffer `name`: element -> time, writes and reads."""
    def times(um) -> list:
        return [m.reverse().apply_range(schedule.per_statement[m.get_tuple_name(isl.dim_type.in_)])
                for m in maps(um) if m.get_tuple_name(isl.dim_type.out) == name]
    write = union(times(model.writes))
    if write is None:  # no instance writes it (an empty domain, e.g. a reduce over one element)
        depth = next(b.resolve().depth for b in model.etdg.buffers if b.resolve().name == name)
        es = ", ".join(f"e{k}" for k in range(depth))
        ts = ", ".join(f"t{k}" for k in range(_time_space(schedule).dim(isl.dim_type.set)))
        write = isl.Map(f"{param_prefix(model.params)}{{ {name}[{es}] -> [{ts}] : false }}")
    return write, union([write, *times(model.reads)]).coalesce()


def overlapping(access1: isl.Map, write1: isl.Map, access2: isl.Map, write2: isl.Map, before: isl.Map) -> isl.Map:
    """e1 -> e2 (elements of two buffers, or of one) whose live ranges overlap: some access of
    each is not before the write of the other."""
    not_before = isl.Map.universe(before.get_space()).subtract(before)
    late12 = access1.apply_range(not_before).apply_range(write2.reverse())  # e1 still used at e2's write
    late21 = access2.apply_range(not_before).apply_range(write1.reverse())
    return late12.intersect(late21.reverse())


def conflicts(write: isl.Map, access: isl.Map, before: isl.Map) -> isl.Map:
    """Pairs of distinct elements whose live ranges overlap."""
    both = overlapping(access, write, access, write, before)
    same = isl.Map.identity(both.get_space())
    return both.subtract(same).coalesce()


def successive_moduli(conflict: isl.Map, context: isl.Set) -> tuple:
    """Per dim, outermost first: None (keep the extent), or the modulus separating every pair
    of conflicting elements that agree on the dims before it (1: drop the dim)."""
    deltas = conflict.intersect_params(context).deltas()
    n = deltas.dim(isl.dim_type.set)
    out = []
    for d in range(n):
        if deltas.is_empty():
            out.append(1)
            continue
        top = deltas.dim_max_val(d)
        if top.is_infty() or top.is_nan():
            out.append(None)
        else:
            out.append(int(top.to_python()) + 1)
        deltas = deltas.fix_val(isl.dim_type.set, d, isl.Val.zero(deltas.get_ctx()))
    return tuple(out)


def mapping(name: str, moduli: tuple, params) -> isl.Map:
    """element -> cell: `name[e0, e1] -> name[e0, e1 mod 2]` (dropped dims omitted)."""
    es = [f"e{k}" for k in range(len(moduli))]
    cell = [e if m is None else f"{e} mod {m}" for e, m in zip(es, moduli) if m != 1]
    return isl.Map(f"{param_prefix(params)}{{ {name}[{', '.join(es)}] -> {name}_cell[{', '.join(cell)}] }}")


def check(name: str, conflict: isl.Map, cells: isl.Map, context: isl.Set) -> None:
    """No two conflicting elements may share a cell (checked over every length in the context)."""
    shared = cells.apply_range(cells.reverse())
    bad = conflict.intersect(shared).intersect_params(context)
    if not bad.is_empty():
        raise PolyftError(f"the storage mapping of buffer {name} ({cells}) puts conflicting elements in one "
                          f"cell: {bad.sample()}", op="storage")


def slot_dim(access: isl.Map, schedule: Schedule) -> int | None:
    """The time dim k of the outermost parallel loop around the accesses when every element
    is accessed within one iteration of it (the time vectors agree up to and including k):
    the buffer can be local to that loop's iterations. None: it must be global."""
    times = access.range()
    space = _time_space(schedule)
    for k, par in enumerate(schedule.parallel):
        if not par:
            continue
        lo, hi = times.dim_min_val(k), times.dim_max_val(k)
        if lo.is_infty() or hi.is_infty() or lo.is_nan() or hi.is_nan() or lo.ne(hi):  # a loop
            pairs = access.reverse().apply_range(access)  # times at which one element is accessed
            return k if pairs.is_subset(_same_prefix(space, k + 1)) else None
    return None


def same_batch(access: isl.Map, schedule: Schedule, k: int, width: int, other: isl.Map | None = None) -> isl.Map:
    """e1 -> e2 (of `access`'s buffer, or e2 of `other`'s) whose accesses may fall in one batch
    of one thread: time dims before k equal, dim k less than `width` apart (a batch is at
    most `width` consecutive iterations)."""
    space = _time_space(schedule)
    n = space.dim(isl.dim_type.set)
    ins, outs = [f"i{j}" for j in range(n)], [f"o{j}" for j in range(n)]
    near = isl.Map(f"{{ [{', '.join(ins)}] -> [{', '.join(outs)}] : -{width} < o{k} - i{k} < {width} }}")
    near = near.align_params(space).intersect(_same_prefix(space, k))
    return access.apply_range(near).apply_range((access if other is None else other).reverse())


def storage_mapping(model: PolyModel, schedule: Schedule, contract: bool = True) -> Storage:
    """The storage mapping of every buffer; with contract=False every buffer keeps its extent
    (what the program stored before contraction, for comparison)."""
    before = happens_before(schedule) if contract else None
    in_order = {}  # slot dim -> batch_before in order
    out = {}
    for b in {b.resolve().name: b.resolve() for b in model.etdg.buffers}.values():
        full = (None,) * b.depth
        if b.kind != "intermediate" or not contract or b.depth == 0:
            out[b.name] = BufferStorage(b, full, None, "global")
            continue
        write, access = buffer_times(model, schedule, b.name)
        conflict = conflicts(write, access, before)
        moduli, cells = _contract(b, conflict, model)
        k = slot_dim(access, schedule)
        if k is None:
            out[b.name] = BufferStorage(b, moduli, cells, "global", access, write)
            continue
        local = {}
        for batch in BATCHES:
            if batch.in_order and k not in in_order:
                in_order[k] = batch_before(schedule, k, True)
            within = conflicts(write, access, in_order[k]) if batch.in_order else conflict
            local[batch] = _contract(b, within.intersect(same_batch(access, schedule, k, batch.width)), model)
        out[b.name] = BufferStorage(b, moduli, cells, "local", access, write, k, local)
    return Storage(out, contract, schedule, model.context)


def _contract(b, conflict: isl.Map, model: PolyModel) -> tuple:
    """(moduli, checked ISL mapping) separating the conflicting elements of buffer b."""
    moduli = successive_moduli(conflict, model.context)
    moduli = tuple(None if m is not None and _at_least(n, m, model.sizes) else m for n, m in zip(b.dims, moduli))
    cells = mapping(b.name, moduli, model.params)
    check(b.name, conflict, cells, model.context)
    return moduli, cells


def _at_least(n, m: int, sizes: dict) -> bool:
    """A modulus no smaller than a known extent saves nothing: keep the extent."""
    return n.params <= set(sizes) and n.evaluate(sizes) <= m
