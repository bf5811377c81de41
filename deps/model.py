"""ETDG -> polyhedral model over ISL: iteration domains, access relations, original schedule.

One statement per run of operation nodes (`S_<block>`), named after its block node; its
domain is the rectangle of its iteration vector, parametric in the symbolic lengths. A
buffer element is one static tile (a static-shape tensor): the block-level model reads and
writes whole tiles, so the static dims only appear once operation nodes are lowered to
element level (schedule/coarsen). Gathers are may-accesses over the whole gathered dim.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import islpy as isl
import numpy as np

from polyft.errors import LengthMismatchError, SingleAssignmentError, SpecError
from polyft.etdg import ETDG
from polyft.names import written

from .isl_helpers import Namer, access_map, maps, param_prefix, schedule_map, statement_space, union_map


@dataclass
class PolyModel:
    """The polyhedral model of an ETDG; every piece prints as an ISL string."""

    etdg: ETDG
    params: list
    sizes: dict
    context: isl.Set
    domains: dict  # statement name -> isl.Set
    reads: isl.UnionMap
    writes: isl.UnionMap
    may_reads: isl.UnionMap  # gathers: conservative may-accesses (also contained in reads)
    schedule: isl.UnionMap  # the original nest order and block-node sequence
    statements: dict = field(default_factory=dict)  # name -> etdg.Statement
    accesses: list = field(default_factory=list)  # (statement name, AccessMap, isl.Map)

    def describe(self) -> str:
        """Domains, accesses and the original schedule as ISL strings (simplified under the
        context, so the trivial `N >= 0` constraints do not clutter them)."""
        g = self.gist
        lines = ["context: " + str(self.context), "domains:"]
        lines += [f"  {g(d)}" for d in self.domains.values()]
        lines.append("reads:")
        lines += [f"  {g(m)}" + ("   (may: gather)" if am.is_gather else "")
                  for _, am, m in self.accesses if am.kind == "read"]
        lines.append("writes:")
        lines += [f"  {g(m)}" for _, am, m in self.accesses if am.kind == "write"]
        lines.append("original schedule:")
        lines += [f"  {g(m)}" for m in maps(self.schedule)]
        return "\n".join(lines)

    def gist(self, obj):
        return obj.gist_params(self.context)


MAX_LENGTH = 2**63 - 1  # generated code indexes with a C long


def check_sizes(sizes, params, op: str = "sizes") -> dict:
    """`sizes` ({length name: value}) checked against the program's lengths `params`: known names,
    values ints (not bools) in [0, MAX_LENGTH]; returned with plain ints, so ISL text is clean."""
    if sizes is None:
        return {}
    if not isinstance(sizes, Mapping):
        raise SpecError(f"sizes must be a dict {{length name: int}}, got the {type(sizes).__name__} {sizes!r}",
                        op=op)
    sizes = {k if k in params or not isinstance(k, str) or not k.isidentifier() else written(k): v
             for k, v in sizes.items()}  # a user's name for a length ISL spells otherwise (polyft.names)
    unknown = sorted(set(sizes) - set(params), key=str)
    if unknown:
        raise LengthMismatchError(f"sizes name unknown lengths {unknown}; the program's lengths are {params}",
                                  op=op)
    bad = {k: v for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, (int, np.integer))
           or not 0 <= v <= MAX_LENGTH}
    if bad:
        types = ", ".join(f"{k}: {type(v).__name__}" for k, v in bad.items())
        raise SpecError(f"a length must be an int in [0, 2**63), got {bad} ({types})", op=op)
    return {k: int(v) for k, v in sizes.items()}


def check_addressable(buffers, lengths: dict, error=SpecError, op: str = "sizes") -> None:
    """Every buffer's bytes at `lengths` (Python ints, exact) within MAX_LENGTH: the generated code
    computes its offsets, strides and loop bounds in C longs, which would wrap past it. `error`:
    SpecError for sizes= given at compile time, InputError for a call's inputs."""
    for b in buffers:
        if not all(d.params <= lengths.keys() for d in b.dims):
            continue
        count = math.prod(d.evaluate(lengths) for d in b.dims) * math.prod(b.element_shape)
        size = count * np.dtype(b.dtype).itemsize
        if size > MAX_LENGTH:
            at = " at " + ", ".join(f"{p} = {v}" for p, v in lengths.items()) if lengths else ""
            raise error(f"buffer {b.name} {b.type} would hold {count} elements, {size} bytes "
                        f"(~2**{size.bit_length() - 1}){at}: past 2**63, beyond the 64-bit offsets the generated "
                        "code computes with; use smaller lengths", op=op)


def build(etdg: ETDG, sizes: dict | None = None) -> PolyModel:
    """The polyhedral model of `etdg`; `sizes` fixes parameters (a context, not a rewrite)."""
    params = etdg.params
    sizes = check_sizes(sizes, params)
    prefix = param_prefix(params)
    ctx_conds = [f"{p} >= 0" for p in params] + [f"{p} = {v}" for p, v in sizes.items()] + \
        [a.isl() for a in etdg.assumptions]
    context = isl.Set(f"{prefix}{{ : {' and '.join(ctx_conds) or 'true'} }}")
    for a in etdg.assumptions:  # sizes that break an assumption would leave an empty model
        if all(q in sizes for q in a.expr.params) and not a.holds(sizes):
            got = ", ".join(f"{q} = {sizes[q]}" for q in sorted(a.expr.params))
            raise LengthMismatchError(f"the program was traced assuming {a} ({a.why}); sizes give {got}",
                                      op="model")
    if context.is_empty():
        raise LengthMismatchError(f"no lengths satisfy the sizes {sizes} and the trace's assumptions "
                                  f"{[str(a) for a in etdg.assumptions]}", op="model")
    check_addressable(etdg.buffers, sizes)
    namer = Namer(params)
    width = max((len(st.position) for st in etdg.statements), default=0)
    domains, accesses, times = {}, [], []
    for st in etdg.statements:
        _, tup, bounds = statement_space(st, namer)
        domains[st.name] = isl.Set(f"{prefix}{{ {tup} : {' and '.join(bounds) or 'true'} }}").intersect_params(context)
        accesses += [(st.name, am, access_map(prefix, st, am, namer).intersect_params(context))
                     for am in st.reads + st.writes]
        times.append(schedule_map(prefix, st, namer, width).intersect_params(context))
    space = isl.Space.params_alloc(context.get_ctx(), 0)
    reads = union_map((m for _, am, m in accesses if am.kind == "read"), space)
    writes = union_map((m for _, am, m in accesses if am.kind == "write"), space)
    may_reads = union_map((m for _, am, m in accesses if am.kind == "read" and am.is_gather), space)
    schedule = union_map(times, space)
    model = PolyModel(etdg, params, sizes, context, domains, reads, writes, may_reads, schedule,
                      {st.name: st for st in etdg.statements}, accesses)
    check_bounds(model)
    check_single_assignment(model)
    return model


def _buffer_domain(buf, prefix) -> isl.Set:
    names = [f"e{r}" for r in range(buf.depth)]
    bounds = [f"0 <= e{r} < {n}" for r, n in enumerate(buf.dims)]
    return isl.Set(f"{prefix}{{ {buf.name}[{', '.join(names)}] : {' and '.join(bounds) or 'true'} }}")


def check_bounds(model: PolyModel) -> None:
    """Every access stays inside its buffer, for every parameter value in the context:
    an access outside means lengths that disagree somewhere in the program."""
    prefix = param_prefix(model.params)
    for name, am, m in model.accesses:
        dom = _buffer_domain(am.buffer.resolve(), prefix).intersect_params(model.context)
        outside = m.range().subtract(dom)
        if not outside.is_empty():
            bad = m.intersect_range(outside)
            raise LengthMismatchError(
                f"{name} {am.kind}s outside buffer {am.buffer.resolve().name} "
                f"{am.buffer.resolve().type}: {bad.sample()}", op="model")


def check_single_assignment(model: PolyModel) -> None:
    """Buffer nodes are single assignment: no element is written by two instances."""
    w = model.writes
    clash = w.apply_range(w.reverse()).subtract(w.domain().identity())
    if not clash.is_empty():
        pair = maps(clash)[0].sample()
        raise SingleAssignmentError(f"a buffer element is written twice: {pair} (through "
                                    f"{maps(w.intersect_domain(clash.domain()))[0]})", op="model")
