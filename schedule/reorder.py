"""The reordering of one iteration space by a unimodular T (paper §5.2, Figure 6, Table 5):
Lamport's hyperplane π carries every distance vector and becomes T's first row, the other
rows move the dims that carry reuse inward; then the transformed access maps
A(j) = (M·T⁻¹) j + o and the new loop bounds by projection over ISL — the Fourier–Motzkin
step — printed as `[max(...), min(...))` ranges like Table 5.

`reorder_space` is the one implementation: the scheduler runs it on every band (block node),
`reorder` on one statement's whole iteration space (Table 5's element-level region3)."""
from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl
import numpy as np

from polyft.deps.isl_helpers import carries, coupling_rows, param_prefix, point_set
from polyft.deps.linalg import complete_unimodular, hyperplane_search, lamport_hyperplane, reuse_dims, \
    transform_access
from polyft.deps.model import PolyModel
from polyft.errors import ScheduleError

MAX_COEF = 4  # a parametric distance set: hyperplanes of coefficient sum up to MAX_COEF per dim


@dataclass
class Reordering:
    """π, T and what they were derived from, for one iteration space."""

    names: list  # original dim names (t)
    distances: object  # set of tuples, or isl.Set when unbounded; empty set when none
    pi: tuple | None
    reuse: list  # dim indices carrying reuse
    T: np.ndarray
    distance_set: isl.Set | None = None  # the distances as ISL computed them (for printing)
    outer: list = field(default_factory=list)  # dims moved before π (outer_parallel)
    why: str = ""  # why dims with no dependence along them are where they are (outer_parallel)

    @property
    def new_names(self) -> list:
        return [f"j{len(self.names) - r}" for r in range(len(self.names))]

    def meaning(self) -> list:
        """Figure 6's right column: each new dim as a combination of the old ones."""
        rows = []
        for r, row in enumerate(self.T):
            expr = " + ".join((n if c == 1 else f"{c}*{n}") for c, n in zip(row, self.names) if c)
            kind = "seq" if (self.pi is not None and tuple(row) == tuple(self.pi)) else "par"
            rows.append(f"{self.new_names[r]} = {expr or '0'}  ({kind})")
        return rows


def reorder_space(dist: isl.Set | None, names: list, reuse: list) -> Reordering:
    """π and T for an iteration space with dims `names`, distance vectors `dist` (None when
    no dependence lies inside it) and dims `reuse` along which data is reused: reuse dims
    go innermost (all dims parallel without distances; else behind π, which replaces one
    of its unit dims). π is Lamport's hyperplane on finitely many distances; on a set that
    grows with the lengths, the same search with ISL proving that π carries all of it."""
    n = len(names)
    if dist is None:
        order = [c for c in range(n) if c not in reuse] + list(reuse)
        T = np.zeros((n, n), dtype=object)
        for r, c in enumerate(order):
            T[r, c] = 1
        return Reordering(names, set(), None, reuse, T)
    pts = point_set(dist)
    pi = lamport_hyperplane(sorted(pts), n) if pts is not None else \
        hyperplane_search(n, lambda p: carries(dist, p), MAX_COEF * n)
    if pi is None:
        raise ScheduleError(f"no hyperplane with coefficient sum <= {MAX_COEF * n} carries the distances {dist}",
                            op="schedule")
    support = {c for c, a in enumerate(pi) if a}
    T = complete_unimodular(pi, n, reuse_dims=[c for c in reuse if c not in support])
    T, outer, why = outer_parallel(T, pts, reuse, names)
    return Reordering(names, pts if pts is not None else dist, pi, reuse, T, dist, outer, why)


def outer_parallel(T: np.ndarray, pts, reuse: list, names: list) -> tuple:
    """(T, the dims moved outermost, why: a line for Schedule.describe or ''): T with the dims that
    no distance vector moves along and that carry no reuse moved before π, where they are all the
    parallelism a wavefront step has (Pluto's objective: outer parallelism, no synchronisation
    inside).

    The cost, on a CPU's threads: behind π, such dims are the parallel loop inside every
    wavefront step, and each step ends in a barrier (a map over 8 independent sequences of
    4096 steps: 4096 barriers a call, each step a few hundred flops per thread); outermost, each
    thread runs its iterations' whole chains with no barrier at all. Both orders split the same
    work over the same dims, so the wavefront costs one barrier per step more and nothing less.
    It is kept (i) where the band has other dims (a wavefront of its own width: the layers and
    time steps of a stacked RNN run side by side, parallelism the outer order would lose), and
    (ii) for dims that carry reuse: the rows of a step that share operands (the batch, whose
    rows share every layer's weights) make one wide step (a GEMM) that the outer order would cut
    into matrix-vector products, each streaming the weights again. `pts`: the distance vectors
    (None: a set that grows with the lengths, left as it is)."""
    if not pts:
        return T, [], ""
    n = T.shape[0]
    outer = [c for c in range(n) if all(p[c] == 0 for p in pts)]
    free = ", ".join(names[c] for c in outer)
    if not outer:
        return T, [], ""
    if len(outer) != n - 1:  # (i)
        return T, [], (f"{free} inside the wavefront: its steps have a width of their own, which an outer "
                        "parallel loop would run in sequence (reorder.outer_parallel)")
    if any(c in reuse for c in outer):  # (ii)
        return T, [], (f"{free} inside the wavefront: the rows of a step share operands (reuse), one wide step per "
                        "barrier (reorder.outer_parallel)")
    units = {}  # dim -> the row of T that is its unit vector (behind π, row 0)
    for r, row in enumerate(T.tolist()):
        if r > 0 and sum(map(abs, row)) == 1 and 1 in row:
            units[row.index(1)] = r
    if any(c not in units for c in outer):
        return T, [], ""
    rows = [units[c] for c in outer]
    T = np.array([T[r] for r in rows] + [T[r] for r in range(n) if r not in rows], dtype=object)
    return T, outer, (f"{free} outermost, before pi: no dependence and no reuse along {free}, and the wavefront "
                      "has no width of its own: one parallel loop with no barrier inside instead of a barrier per "
                      "step (reorder.outer_parallel)")


def statement_reuse(model: PolyModel, name: str) -> list:
    """The dims of statement `name` along which one of its reads touches the same data: zero
    columns of the coupling rows of its access relations (at element level too)."""
    rows = [coupling_rows(m) for s, am, m in model.accesses if am.kind == "read" and s == name]
    return list(reuse_dims(rows))


def reorder(model: PolyModel, name: str, distances) -> Reordering:
    """`reorder_space` on the whole iteration space of statement `name` (the single statement
    of an element-level model such as Table 5's region3), whose distance set is `distances`
    (an isl.Set or None)."""
    dom = model.domains[name]
    names = [dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set))]
    return reorder_space(distances, names, statement_reuse(model, name))


def _t_map(model: PolyModel, name: str, R: Reordering) -> isl.Map:
    prefix = param_prefix(model.params)
    rows = [" + ".join(f"{c}*{x}" for c, x in zip(row, R.names) if c) or "0" for row in R.T]
    return isl.Map(f"{prefix}{{ {name}[{', '.join(R.names)}] -> [{', '.join(rows)}] }}")


def transformed_accesses(model: PolyModel, name: str, R: Reordering) -> list:
    """(kind, buffer, new access map over j as ISL, M·T⁻¹, o) for the statement's accesses."""
    Tinv = _t_map(model, name, R).reverse()
    out = []
    for s, am, m in model.accesses:
        if s != name:
            continue
        new = Tinv.apply_range(m)
        new = new.reset_tuple_id(isl.dim_type.in_)
        for k, jn in enumerate(R.new_names):
            new = new.set_dim_name(isl.dim_type.in_, k, jn)
        M, o = access_matrix(m)
        mt = transform_access(M, R.T) if len(M) else None
        out.append((am.kind, am.buffer.resolve().name, new.gist_params(model.context), mt, o))
    return out


def access_matrix(m: isl.Map):
    """(M, o) of an access relation: one row per output coordinate that is an affine
    function of the iteration vector (equalities of the affine hull); coordinates read as a
    whole range (a matmul's contraction) or fixed (a unit dim) have no row, as in Table 5."""
    hull = m.affine_hull()
    n_in, n_out = m.dim(isl.dim_type.in_), m.dim(isl.dim_type.out)
    rows, offs = [], []
    for r in range(n_out):
        for con in hull.get_constraints():
            if not con.is_equality():
                continue
            cr = con.get_coefficient_val(isl.dim_type.out, r).to_python()
            others = [con.get_coefficient_val(isl.dim_type.out, q).to_python() for q in range(n_out) if q != r]
            if abs(cr) != 1 or any(others):
                continue
            row = [-cr * con.get_coefficient_val(isl.dim_type.in_, c).to_python() for c in range(n_in)]
            if any(row):
                rows.append(row)
                offs.append(-cr * con.get_constant_val().to_python())
            break
    return np.array(rows, dtype=object).reshape(len(rows), n_in), offs


def _affine_text(con, pos, names, params, sign, add=0) -> str:
    """The bound on dim `pos` that constraint `con` gives: sign*(rest)/|c| + add."""
    c = con.get_coefficient_val(isl.dim_type.set, pos).to_python()
    terms = []
    for k, n in enumerate(names):
        if k != pos:
            v = con.get_coefficient_val(isl.dim_type.set, k).to_python()
            if v:
                terms.append((-v * sign, n))
    for k, p in enumerate(params):
        v = con.get_coefficient_val(isl.dim_type.param, k).to_python()
        if v:
            terms.append((-v * sign, p))
    den = abs(c)
    const = -con.get_constant_val().to_python() * sign + add * den
    text = ""
    for v, n in sorted(terms, key=lambda t: (t[1] not in params, t[1])):
        s = n if abs(v) == 1 else f"{abs(v)}*{n}"
        text += (" - " if v < 0 else " + ") + s if text else ("-" if v < 0 else "") + s
    if const or not text:
        text += (f" - {-const}" if const < 0 else f" + {const}") if text else str(const)
    return text if den == 1 else f"({text})/{den}"


def bounds(model: PolyModel, name: str, R: Reordering) -> list:
    """Per new dim, its range given the outer new dims: ISL projects the inner dims out
    (Fourier–Motzkin) and the remaining constraints on the dim give its bounds."""
    td = model.domains[name].apply(_t_map(model, name, R)).gist_params(model.context)
    n = len(R.names)
    params = list(model.params)
    out = []
    for l in range(n):
        proj = td.project_out(isl.dim_type.set, l + 1, n - l - 1).remove_redundancies().coalesce()
        names = R.new_names[:l + 1]
        pieces = []
        for bs in proj.get_basic_sets():
            lo, hi = [], []
            for con in bs.get_constraints():
                c = con.get_coefficient_val(isl.dim_type.set, l).to_python()
                if c == 0 or any(not con.get_coefficient_val(isl.dim_type.div, q).is_zero()
                                 for q in range(bs.dim(isl.dim_type.div))):
                    continue
                sign = 1 if c > 0 else -1
                if con.is_equality() or c > 0:
                    lo.append(_affine_text(con, l, names, params, sign))
                if con.is_equality() or c < 0:  # x <= rest/|c|: the exclusive bound adds 1
                    hi.append(_affine_text(con, l, names, params, sign, add=1))
            pieces.append(f"[{_join('max', lo)}, {_join('min', hi)})")
        out.append((R.new_names[l], " ∪ ".join(pieces)))
    return out


def _join(fn, items) -> str:
    items = list(dict.fromkeys(items))
    if not items:
        return "-inf" if fn == "max" else "inf"
    return items[0] if len(items) == 1 else f"{fn}({', '.join(items)})"


def show_distances(dist) -> str:
    """A few distance vectors as tuples; many (or an unbounded set) as the ISL set."""
    if isinstance(dist, set):
        return str(sorted(dist)) if len(dist) <= 12 else f"{len(dist)} vectors"
    return str(dist)


def table(model: PolyModel, name: str, R: Reordering) -> str:
    """Figure 6 and Table 5 for one iteration space, as text."""
    raw = R.distance_set.gist_params(model.context) if R.distance_set is not None else None
    lines = [f"T = {R.T.tolist()}   (pi = {R.pi})", f"distances: {show_distances(raw)}"]
    lines += ["  " + m for m in R.meaning()]
    lines.append("range constraints (Fourier–Motzkin over ISL):")
    lines += [f"  {n} in {b}" for n, b in bounds(model, name, R)]
    lines.append("transformed access maps A(j) = (M·T⁻¹) j + o:")
    for kind, buf, m, mt, o in transformed_accesses(model, name, R):
        lines.append(f"  {kind} {buf}: {m}")
        if mt is not None:
            lines.append(f"      M·T⁻¹ = {mt.tolist()}, o = {o}")
    return "\n".join(lines)
