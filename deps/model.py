"""ETDG -> polyhedral model over ISL: iteration domains, access relations, original schedule.

One statement per run of operation nodes (`S_<block>`), named after its block node; its
domain is the rectangle of its iteration vector, parametric in the symbolic lengths. A
buffer element is one static tile (a static-shape tensor): the block-level model reads and
writes whole tiles, so the static dims only appear once operation nodes are lowered to
element level (schedule/coarsen). Gathers are may-accesses over the whole gathered dim.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from polyft.errors import AccessError, LengthMismatchError, SingleAssignmentError
from polyft.etdg import ETDG, AccessMap, Aff, Constraint, Gather, Statement


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
        lines += [f"  {g(m)}" for m in _maps(self.schedule)]
        return "\n".join(lines)

    def gist(self, obj):
        return obj.gist_params(self.context)


def _maps(um) -> list:
    out = []
    um.foreach_map(out.append)
    return out


class _Namer:
    """ISL names for a statement's dims: the ETDG's, renamed if they clash with a parameter."""

    def __init__(self, params):
        self.params = set(params)

    def __call__(self, dim) -> str:
        name = dim.name
        while name in self.params:
            name += "_"
        return name


class _Renamed:
    """Stand-in dim carrying an ISL-safe name (for printing only)."""

    _uid = -1

    def __init__(self, name):
        self.name = name
        self.uid = _Renamed._uid


def _space(st: Statement, namer) -> tuple:
    names = {d: namer(d) for d in st.dims}
    tup = f"{st.name}[{', '.join(names[d] for d in st.dims)}]"
    bounds = [f"0 <= {names[d]} < {d.extent}" for d in st.dims]
    return names, tup, bounds


def _access_map(prefix, st, am: AccessMap, namer) -> isl.Map:
    names, tup, bounds = _space(st, namer)
    buf = am.buffer.resolve()
    outs, extra = [], []
    for r, ix in enumerate(am.index):
        if isinstance(ix, Gather):
            g = f"g{r}"
            outs.append(g)
            extra.append(f"0 <= {g} < {buf.dims[r]}")
        elif isinstance(ix, Aff):
            outs.append(_rename(ix, names))
        else:
            raise AccessError(f"the access {buf.name}[{ix}] of {st.name} is neither quasi-affine nor a "
                              "declared gather", op="model")
    conds = bounds + [_rename_constraint(c, names) for c in am.conds] + extra
    text = f"{prefix}{{ {tup} -> {buf.name}[{', '.join(outs)}] : {' and '.join(conds) or 'true'} }}"
    return isl.Map(text)


def _rename(ix: Aff, names) -> str:
    env = {d: Aff({_Renamed(n): 1}) for d, n in names.items() if n != d.name}
    return str(ix.substitute(env)) if env else str(ix)


def _rename_constraint(c, names) -> str:
    env = {d: Aff({_Renamed(n): 1}) for d, n in names.items() if n != d.name}
    return str(Constraint(c.expr.substitute(env), c.kind)) if env else str(c)


def _schedule_map(prefix, st, namer, width) -> isl.Map:
    names, tup, bounds = _space(st, namer)
    out = []
    for item in st.position:
        if isinstance(item, int):
            out.append(str(item))
        else:
            n = names[item]
            out.append(f"{item.extent} - 1 - {n}" if item.reversed else n)
    out += ["0"] * (width - len(out))
    return isl.Map(f"{prefix}{{ {tup} -> [{', '.join(out)}] : {' and '.join(bounds) or 'true'} }}")


def build(etdg: ETDG, sizes: dict | None = None) -> PolyModel:
    """The polyhedral model of `etdg`; `sizes` fixes parameters (a context, not a rewrite)."""
    sizes = dict(sizes or {})
    params = etdg.params
    unknown = set(sizes) - set(params)
    if unknown:
        raise LengthMismatchError(f"sizes name unknown lengths {sorted(unknown)}; the program's lengths "
                                  f"are {params}", op="model")
    prefix = f"[{', '.join(params)}] -> " if params else ""
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
    namer = _Namer(params)
    width = max((len(st.position) for st in etdg.statements), default=0)
    space = isl.Space.params_alloc(context.get_ctx(), 0)
    empty = isl.UnionMap.empty(space)
    domains, accesses = {}, []
    reads, writes, may_reads, schedule = empty, empty, empty, empty
    for st in etdg.statements:
        _, tup, bounds = _space(st, namer)
        domains[st.name] = isl.Set(f"{prefix}{{ {tup} : {' and '.join(bounds) or 'true'} }}").intersect_params(context)
        for am in st.reads + st.writes:
            m = _access_map(prefix, st, am, namer).intersect_params(context)
            accesses.append((st.name, am, m))
            if am.kind == "write":
                writes = writes.union(isl.UnionMap.from_map(m))
            else:
                reads = reads.union(isl.UnionMap.from_map(m))
                if am.is_gather:
                    may_reads = may_reads.union(isl.UnionMap.from_map(m))
        schedule = schedule.union(isl.UnionMap.from_map(
            _schedule_map(prefix, st, namer, width).intersect_params(context)))
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
    prefix = f"[{', '.join(model.params)}] -> " if model.params else ""
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
        pair = _maps(clash)[0].sample()
        raise SingleAssignmentError(f"a buffer element is written twice: {pair} (through "
                                    f"{_maps(w.intersect_domain(clash.domain()))[0]})", op="model")
