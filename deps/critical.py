"""The critical path of a program: the longest chain of flow dependences between statement
instances, at concrete sizes, computed over ISL.

Unit: **statement instances**. A chain i_1 -> i_2 -> ... -> i_k (each i_{j+1} reads what i_j
wrote) has length k; a program whose instances are all independent has critical path 1, an
empty one 0. A schedule runs each instance in one step and the instances of a chain in k
distinct steps, so `Schedule.sequential_steps` (and `Schedule.steps_as_run`), which count steps
of one instance each per statement, are >= the critical path: it is the lower bound on the
sequential steps of any schedule of *this* model when every dependence-free loop runs at once.
The unit is the model's statement instance, so a coarsened ETDG (fused statements) has a
shorter critical path than the ETDG as traced.

Dependences: `deps.may_flow` — the exact flow dependences plus, for gathers (whose indices
are data), the conservative may-dependences on the whole gathered dim, i.e. every flow
dependence a schedule must keep (`Dependences.all` minus anti and output dependences, which
single assignment leaves empty). Without gathers of intermediate results `may_flow` equals the
exact `flow`, and the chain is the program's data dependence chain exactly.

Method (no enumeration of instances): peel the sources. R_0 is every instance; R_{k+1} is
the set of instances of R_k with a predecessor in R_k (`range(dep ∩ (R_k × R_k))`). The
instances of R_{k} - R_{k+1} are those whose longest incoming chain within the DAG has k + 1
instances, so the number of non-empty R_k is the longest chain. Each round is a few ISL set
operations at fixed parameters on the statements whose instances or whose sources' instances
the previous round changed, so the cost grows with the critical path and those statements, not
with the number of instances; rounds are capped at `MAX_ROUNDS` (beyond it: `CriticalPathTooLong`, a
PolyftError). Dependences go forward in the original schedule, so the graph is acyclic and
the peeling ends (a round that removes nothing, i.e. a cycle, is a PolyftError).
"""
from __future__ import annotations

import islpy as isl

from polyft.errors import PolyftError

from .analyze import Dependences
from .isl_helpers import maps, union
from .model import PolyModel

MAX_ROUNDS = 100_000  # a longer critical path (one ISL round per instance on it) raises


class CriticalPathTooLong(PolyftError):
    """The critical path is longer than the cap on peeling rounds (`MAX_ROUNDS`)."""


def instances(model: PolyModel) -> isl.UnionSet:
    """Every statement instance of the model, as one union set."""
    out = isl.UnionSet.empty(isl.Space.params_alloc(model.context.get_ctx(), 0))
    for d in model.domains.values():
        out = out.union(isl.UnionSet.from_set(d))
    return out


def critical_path(model: PolyModel, deps: Dependences | None, max_rounds: int = MAX_ROUNDS, *,
                  dependences: isl.UnionMap | None = None) -> int | None:
    """Statement instances on the longest chain of flow dependences (module docstring), for
    concrete sizes; None while a length is symbolic. `dependences` overrides `deps.may_flow`
    (e.g. `deps.flow`, the exact flow without gathers' may-dependences)."""
    if any(p not in model.sizes for p in model.params):
        return None
    return sum(1 for _ in _peel(model, deps.may_flow if dependences is None else dependences, max_rounds))


def levels(model: PolyModel, deps: Dependences, late: bool = False, max_rounds: int = MAX_ROUNDS) \
        -> tuple[dict, int] | None:
    """(statement name -> isl.Map from its instances to [level], the critical path) at concrete
    sizes (None while a length is symbolic). Early (`late=False`, "as soon as possible"): an
    instance's level is the length of the longest chain ending in it, minus 1; late ("as late
    as possible"): the critical path minus the longest chain starting from it. Both are legal
    schedules of the model (a dependence's sink is at least one level after its source) of
    exactly critical-path steps: the peeling rounds of the module docstring, read as times."""
    if any(p not in model.sizes for p in model.params):
        return None
    dep = deps.may_flow.reverse() if late else deps.may_flow
    rounds = list(_peel(model, dep, max_rounds))
    n = len(rounds)
    out = {}
    for k, level in enumerate(rounds):
        at = n - 1 - k if late else k
        for s in _sets(level):
            name = s.get_tuple_name()
            time = isl.Set(f"{{ [{at}] }}").align_params(s.get_space())
            m = isl.Map.from_domain_and_range(s, time)
            out[name] = out[name].union(m) if name in out else m
    return {name: m.coalesce() for name, m in out.items()}, n


def _sets(us: isl.UnionSet) -> list:
    found = []
    us.foreach_set(found.append)
    return found


def _peel(model: PolyModel, dep: isl.UnionMap, max_rounds: int):
    """The instances whose longest chain of `dep` within the remaining instances starts (has no
    predecessor) at each round, round after round (module docstring), as union sets.

    Kept per statement: a statement's remaining instances change only in a round that peels
    some of them, so only those statements and the ones they feed are looked at in the next
    round (a chain of n statements peels one a round: n rounds of one statement each, where
    rounds over the whole program cost n^2)."""
    remaining = {s.get_tuple_name(): s.coalesce() for s in _sets(instances(model))}
    into = {}  # sink statement -> [(source statement, its dependences on the sink)]
    for m in maps(dep):
        src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
        if src in remaining and dst in remaining:
            into.setdefault(dst, []).append((src, m))
    feeds = {}
    for dst, edges in into.items():
        for src, _ in edges:
            feeds.setdefault(src, set()).add(dst)
    later, rounds = {}, 0
    active = {name for name, r in remaining.items() if not r.is_empty()}
    dirty = set(active)
    while active:
        rounds += 1
        if rounds > max_rounds:
            raise CriticalPathTooLong(f"the critical path has more than {max_rounds} instances at sizes "
                                      f"{model.sizes}; use smaller sizes", op="critical_path")
        for name in dirty:
            reached = union(m.intersect_domain(remaining[src]).range() for src, m in into.get(name, ()))
            later[name] = (isl.Set.empty(remaining[name].get_space()) if reached is None
                           else remaining[name].intersect(reached).coalesce())
        peeled = {name: remaining[name].subtract(later[name]) for name in dirty}
        peeled = {name: s for name, s in peeled.items() if not s.is_empty()}
        if not peeled:  # no source left: the dependences have a cycle
            left = [str(remaining[name]) for name in sorted(active)]
            raise PolyftError(f"the flow dependences have a cycle among {'; '.join(left)}", op="critical_path")
        out = isl.UnionSet.empty(isl.Space.params_alloc(model.context.get_ctx(), 0))
        for name, s in peeled.items():
            out = out.union(isl.UnionSet.from_set(s))
            remaining[name] = later[name]
            if remaining[name].is_empty():
                active.discard(name)
        yield out
        dirty = active & set(peeled).union(*(feeds.get(name, ()) for name in peeled))

