"""ISL helpers shared by the model, the dependence analysis, the scheduler and the targets.

Two kinds: ISL text for ETDG statements (`Namer`, `statement_space`, `access_map`,
`schedule_map`: names, domains, access relations and time maps, so that every layer prints
and parses the same strings), and small operations islpy lacks (`maps`, `union_map`,
`union`, `param_prefix`, `param_names`, `point_set`, `carries`, `coupling_rows`).
"""
from __future__ import annotations

import islpy as isl
import numpy as np

from polyft.affine import Aff, Constraint
from polyft.errors import AccessError
from polyft.etdg import AccessMap, Gather, Statement


def param_prefix(params) -> str:
    """`[N, L] -> ` for ISL text over the parameters `params` ('' when there are none)."""
    return f"[{', '.join(params)}] -> " if params else ""


def param_names(space: isl.Space) -> list:
    """The parameter names of an ISL space, in order."""
    return [space.get_dim_name(isl.dim_type.param, i) for i in range(space.dim(isl.dim_type.param))]


def maps(um: isl.UnionMap) -> list:
    """The maps of a union map, one per pair of spaces."""
    out = []
    um.foreach_map(out.append)
    return out


def union_map(items, space: isl.Space) -> isl.UnionMap:
    """The maps `items` as one union map (empty over `space`'s parameters when there are none)."""
    out = isl.UnionMap.empty(space)
    for m in items:
        out = out.union(isl.UnionMap.from_map(m))
    return out


def union(items):
    """The union of isl objects of one kind (sets of one space, maps of one space); None
    when there are none."""
    out = None
    for x in items:
        out = x if out is None else out.union(x)
    return out


class Namer:
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


def statement_space(st: Statement, namer: Namer) -> tuple:
    """(dim -> ISL name, the tuple `S[i, j]`, the bound constraints `0 <= i < N`) of `st`."""
    names = {d: namer(d) for d in st.dims}
    tup = f"{st.name}[{', '.join(names[d] for d in st.dims)}]"
    bounds = [f"0 <= {names[d]} < {d.extent}" for d in st.dims]
    return names, tup, bounds


def _renaming(names) -> dict:
    return {d: Aff({_Renamed(n): 1}) for d, n in names.items() if n != d.name}


def _rename(ix: Aff, names) -> str:
    env = _renaming(names)
    return str(ix.substitute(env)) if env else str(ix)


def rename_constraint(c: Constraint, names) -> str:
    """A constraint over ETDG dims as ISL text over their names from `statement_space`."""
    env = _renaming(names)
    return str(Constraint(c.expr.substitute(env), c.kind)) if env else str(c)


def access_map(prefix: str, st: Statement, am: AccessMap, namer: Namer) -> isl.Map:
    """The access relation `S[i] -> B[M i + o]` of one access piece of `st` (a gather is a
    may-access over its whole dim)."""
    names, tup, bounds = statement_space(st, namer)
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
    conds = bounds + [rename_constraint(c, names) for c in am.conds] + extra
    text = f"{prefix}{{ {tup} -> {buf.name}[{', '.join(outs)}] : {' and '.join(conds) or 'true'} }}"
    return isl.Map(text)


def _oriented(dim, name) -> str:
    return f"({dim.extent} - 1 - {name})" if dim.reversed else name


def _row(coeffs, terms) -> str:
    parts = [t if c == 1 else f"{c}*{t}" for c, t in zip(coeffs, terms) if c]
    return " + ".join(parts) if parts else "0"


def _block_starting(dim, block):
    """The block on `block`'s path to the root whose first dim is `dim`."""
    while not (block.dims and block.dims[0] is dim):
        block = block.parent
    return block


def schedule_map(prefix: str, st: Statement, namer: Namer, width: int, band_T=None) -> isl.Map:
    """`S[dims] -> [seq, T·v, seq, T·v, ..., seq]` padded with zeros to `width`: the 2d+1
    time vector of `st`, each block's dims `v` in execution order (a right aggregate's dim
    counts down) and transformed by `band_T[block name]` where given (the original nest
    order where not)."""
    band_T = band_T or {}
    names, tup, bounds = statement_space(st, namer)
    items, k = [], 0
    pos = st.position
    while k < len(pos):
        item = pos[k]
        if isinstance(item, int):
            items.append(str(item))
            k += 1
            continue
        blk = _block_starting(item, st.block)
        v = [_oriented(d, names[d]) for d in blk.dims]
        T = band_T.get(blk.name)
        items += [_row(list(r), v) for r in T] if T is not None else v
        k += len(blk.dims)
    items += ["0"] * (width - len(items))
    return isl.Map(f"{prefix}{{ {tup} -> [{', '.join(items)}] : {' and '.join(bounds) or 'true'} }}")


def point_set(s: isl.Set):
    """The points of `s` as a set of int tuples when finitely many over all parameter values,
    else None (e.g. distance vectors that grow with a length)."""
    n_par = s.dim(isl.dim_type.param)
    n_set = s.dim(isl.dim_type.set)
    free = s.move_dims(isl.dim_type.set, n_set, isl.dim_type.param, 0, n_par)
    free = free.project_out(isl.dim_type.set, n_set, n_par)
    if not free.is_bounded():
        return None
    points = set()

    def add(p):
        points.add(tuple(int(p.get_coordinate_val(isl.dim_type.set, k).to_python()) for k in range(n_set)))
    free.foreach_point(add)
    return points


def carries(dist: isl.Set, pi) -> bool:
    """True when `pi · d >= 1` for every vector d of the (parametric) set `dist`: the
    hyperplane `pi` carries every distance."""
    names = [f"x{i}" for i in range(len(pi))]
    dot = " + ".join(f"{c}*{x}" for c, x in zip(pi, names) if c) or "0"
    bad = isl.Set(f"{param_prefix(param_names(dist.get_space()))}{{ [{', '.join(names)}] : {dot} <= 0 }}")
    return dist.intersect(bad).is_empty()


def coupling_rows(access: isl.Map) -> np.ndarray:
    """The input-dim coefficients of every constraint of `access` that ties the instance to
    the element (names an output dim or a div), one row each: for an affine access the rows
    span those of its matrix M, so a zero column is a dim the element does not depend on,
    and `linalg.reuse_dims` reads reuse off these rows as off M."""
    n_in, n_out = access.dim(isl.dim_type.in_), access.dim(isl.dim_type.out)
    rows = []
    for bm in access.get_basic_maps():
        n_div = bm.dim(isl.dim_type.div)
        for con in bm.get_constraints():
            if any(not con.get_coefficient_val(isl.dim_type.out, r).is_zero() for r in range(n_out)) \
                    or any(not con.get_coefficient_val(isl.dim_type.div, q).is_zero() for q in range(n_div)):
                rows.append([con.get_coefficient_val(isl.dim_type.in_, c).to_python() for c in range(n_in)])
    return np.array(rows, dtype=object).reshape(len(rows), n_in)
