"""Dependence analysis over the polyhedral model: exact flow dependences from ISL's dataflow
analysis, anti/output dependences, per-statement distance vectors, carried and parallel dims,
and reuse (null spaces of the access matrices, paper §5.2)."""
from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from .isl_helpers import maps, point_set, union
from .linalg import integer_null_space, reuse_dims
from .model import PolyModel


@dataclass
class Reuse:
    """Dims along which one access reads the same data (the null space of its matrix M)."""

    statement: str
    buffer: str
    M: list
    null_space: list  # integer basis vectors
    dims: list  # names of the iteration dims whose unit vector lies in the null space
    columns: list  # their positions in the statement's iteration vector


@dataclass
class Dependences:
    flow: isl.UnionMap  # exact (must) flow dependences: source instance -> sink instance
    may_flow: isl.UnionMap  # including gathers' conservative may-reads
    anti: isl.UnionMap
    output: isl.UnionMap
    distances: dict  # statement -> set of distance tuples (self dependences)
    distance_sets: dict  # statement -> isl.Set of the deltas, parametric
    carried: dict  # statement -> dim names that carry a self dependence
    parallel: dict  # statement -> dim names that carry none
    reuse: list = field(default_factory=list)

    @property
    def all(self) -> isl.UnionMap:
        """Every dependence a schedule must keep: may flow, anti and output."""
        return self.may_flow.union(self.anti).union(self.output)

    def describe(self, context=None) -> str:
        """Everything as ISL strings, simplified under `context` where given."""
        def show(um):
            return [f"  {m.gist_params(context) if context is not None else m}" for m in maps(um)] or ["  (none)"]
        lines = ["flow dependences:"] + show(self.flow)
        if not self.may_flow.is_equal(self.flow):
            lines += ["may flow dependences (gathers):"] + show(self.may_flow)
        lines += ["anti dependences:"] + show(self.anti)
        lines += ["output dependences:"] + show(self.output)
        lines.append("distance vectors:")
        for s, ds in self.distances.items():
            shown = sorted(ds) if isinstance(ds, set) else str(ds)
            lines.append(f"  {s}: {shown}   carried by {self.carried[s] or '-'}; parallel {self.parallel[s] or '-'}")
        lines.append("reuse (null spaces of access matrices):")
        for r in self.reuse:
            if r.null_space:
                lines.append(f"  {r.statement} reads {r.buffer}: null space {r.null_space} -> reuse along {r.dims or '-'}")
        return "\n".join(lines)


def _flow(model: PolyModel, reads):
    info = isl.UnionAccessInfo.from_sink(reads)
    info = info.set_must_source(model.writes)
    info = info.set_schedule_map(model.schedule)
    flow = info.compute_flow()
    return flow.get_must_dependence(), flow.get_may_dependence()


def may_flow(model: PolyModel) -> isl.UnionMap:
    """The flow dependences a schedule must keep (`Dependences.may_flow`) alone: what the
    critical path needs, without the anti/output dependences, distances and reuse."""
    must, may = _flow(model, model.reads)
    return may.union(must)


def analyze(model: PolyModel) -> Dependences:
    must, _ = _flow(model, model.reads.subtract(model.may_reads))
    may = may_flow(model)
    anti_info = isl.UnionAccessInfo.from_sink(model.writes).set_may_source(model.reads) \
        .set_schedule_map(model.schedule).compute_flow()
    anti = anti_info.get_may_dependence()
    out_info = isl.UnionAccessInfo.from_sink(model.writes).set_must_source(model.writes) \
        .set_schedule_map(model.schedule).compute_flow()
    output = out_info.get_may_dependence()

    distances, distance_sets, carried, parallel = {}, {}, {}, {}
    within = {}  # statement -> its dependences on itself (grouped once: per statement, quadratic)
    for m in maps(may):
        if m.get_tuple_name(isl.dim_type.in_) == m.get_tuple_name(isl.dim_type.out):
            within.setdefault(m.get_tuple_name(isl.dim_type.in_), []).append(m)
    for name, st in model.statements.items():
        dim_names = [d.name for d in st.dims]
        deltas = union(m.deltas() for m in within.get(name, ()))
        distance_sets[name] = deltas
        pts = point_set(deltas) if deltas is not None else set()
        distances[name] = pts if pts is not None else deltas
        levels = set()
        for v in (pts or []):
            nz = [k for k, x in enumerate(v) if x != 0]
            if nz:
                levels.add(nz[0])
        if pts is None:  # unbounded distances: every dim they touch may carry
            levels = set(range(len(dim_names)))
        carried[name] = [dim_names[k] for k in sorted(levels)]
        parallel[name] = [n for k, n in enumerate(dim_names) if k not in levels]

    reuse = []
    for name, am, _ in model.accesses:
        if am.kind != "read" or not am.is_affine or not am.dims:
            continue
        M = am.M
        basis = integer_null_space(M)
        columns = list(reuse_dims([M]))
        reuse.append(Reuse(name, am.buffer.resolve().name, M.tolist(), [list(v) for v in basis],
                           [am.dims[k].name for k in columns], columns))
    return Dependences(must, may, anti, output, distances, distance_sets, carried, parallel, reuse)
