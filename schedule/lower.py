"""Operation-node lowering (paper §5.1): a statement on static tiles becomes an element-level
statement whose iteration vector also runs over the elements it writes.

Each operation node relates its output element coordinates to those of its inputs (an ISL
map: identity for elementwise math, broadcast dims pinned to 0, a free contraction coordinate
for matmul, a free axis for reductions and softmax, offsets for concat and slicing).
Composing them from the store back to every load gives exact element-level access
relations, so dependences, distances and reuse can be analysed per element — which is how
the paper's region3 becomes the 4-D block node [map, scanl, scanl, map] of Figure 6.
"""
from __future__ import annotations

import islpy as isl
import numpy as np

from polyft.deps.isl_helpers import Namer, access_map, maps, param_prefix, rename_constraint, statement_space, union_map
from polyft.deps.model import PolyModel
from polyft.errors import ScheduleError
from polyft.etdg import OpNode, access_maps
from polyft.primitives import getitem_axes

# every operation the targets compute element by element (emit/c_statements.py UNARY and BINARY; a
# test holds the tables together): output element e reads element e of each operand, broadcast
_IDENTITY_OPS = {"neg", "copy", "astype", "tanh", "sigmoid", "exp", "log", "sqrt", "relu", "sin", "cos", "tan",
                 "erf", "gelu", "rsqrt", "sign", "floor", "logical_not", "abs", "log1p", "softplus", "zeros_like"}
_BROADCAST_OPS = {"add", "sub", "mul", "truediv", "maximum", "minimum", "pow", "where", "greater", "less",
                  "greater_equal", "less_equal", "equal", "not_equal", "logical_and", "logical_or", "logical_xor"}


def _names(prefix, n):
    return [f"{prefix}{i}" for i in range(n)]


def _rel(out_shape, in_shape, in_exprs, extra=()) -> isl.Map:
    """{ [o...] -> [in_exprs...] : o in box and extra }."""
    o = _names("o", len(out_shape))
    box = [f"0 <= {x} < {n}" for x, n in zip(o, out_shape)]
    free = [e for e in in_exprs if e.startswith("f")]
    fbox = [f"0 <= {f} < {n}" for f, n in zip(in_exprs, in_shape) if f in free]
    cons = " and ".join(box + fbox + list(extra)) or "true"
    return isl.Map(f"{{ [{', '.join(o)}] -> [{', '.join(in_exprs)}] : {cons} }}")


def op_relation(op: OpNode, k: int, in_shape) -> isl.Map:
    """Output element coordinates of `op` -> coordinates of its k-th input read for them."""
    out, name = op.shape, op.op
    o = _names("o", len(out))
    if name in _IDENTITY_OPS:
        return _rel(out, in_shape, o)
    if name in _BROADCAST_OPS:
        r, q = len(out), len(in_shape)
        ex = ["0" if in_shape[m] == 1 and out[r - q + m] != 1 else o[r - q + m] for m in range(q)]
        return _rel(out, in_shape, ex)
    if name == "matmul" and len(out) == 2 and len(in_shape) == 2:
        return _rel(out, in_shape, [o[0], "f1"] if k == 0 else ["f0", o[1]])
    if name == "transpose" and len(out) >= 2:
        return _rel(out, in_shape, o[:-2] + [o[-1], o[-2]])
    if name in ("sum", "max", "mean", "softmax"):
        axis = op.attrs.get("axis", -1 if name == "softmax" else None)
        if axis is None:
            return _rel(out, in_shape, _names("f", len(in_shape)))
        axis %= len(in_shape)
        keep = name == "softmax" or op.attrs.get("keepdims", False)
        src = list(o) if keep else o[:axis] + ["_"] + o[axis:]
        ex = [f"f{m}" if m == axis else src[m] for m in range(len(in_shape))]
        return _rel(out, in_shape, ex)
    if name == "concat":
        axis = op.attrs.get("axis", 0) % len(out)
        off = sum(np.shape(a)[axis] if isinstance(a, tuple) else a.shape[axis] for a in op.inputs[:k])
        ex = [f"{o[m]} - {off}" if m == axis else o[m] for m in range(len(out))]
        return _rel(out, in_shape, ex, [f"{off} <= {o[axis]} < {off + in_shape[axis]}"])
    if name == "getitem":
        return _getitem_relation(op, in_shape)
    # anything else: every output element may read every input element (conservative)
    return _rel(out, in_shape, _names("f", len(in_shape)))


def _getitem_relation(op, in_shape) -> isl.Map:
    axes = getitem_axes(op.attrs["key"], in_shape)
    if axes is None:
        return _rel(op.shape, in_shape, _names("f", len(in_shape)))
    o = _names("o", len(op.shape))
    return _rel(op.shape, in_shape, [str(start) if axis is None else f"{start} + {step}*{o[axis]}"
                                     for start, step, axis in axes])


def _shape_of(a):
    return np.shape(a[1]) if isinstance(a, tuple) else a.shape


def element_relations(ops) -> dict:
    """For each load of a statement: { [e] -> [c] } from the stored element e to the element
    c of the loaded tile that computing it reads."""
    stores = [op for op in ops if op.op == "store"]
    shapes = {s.shape for s in stores}
    if len(shapes) != 1:
        raise ScheduleError(f"cannot lower a statement storing tiles of different shapes {sorted(shapes)}",
                            op="lower")
    shape = stores[0].shape
    e = _names("o", len(shape))
    ident = isl.Map(f"{{ [{', '.join(e)}] -> [{', '.join(e)}] : "
                    f"{' and '.join(f'0 <= {x} < {n}' for x, n in zip(e, shape)) or 'true'} }}")
    rel: dict = {}
    for s in stores:
        if isinstance(s.inputs[0], OpNode):
            v = s.inputs[0]
            rel[v] = rel[v].union(ident) if v in rel else ident
    for op in reversed(ops):
        if op not in rel or op.op in ("load", "store"):
            continue
        for k, a in enumerate(op.inputs):
            if isinstance(a, OpNode):
                r = rel[op].apply_range(op_relation(op, k, _shape_of(a)))
                rel[a] = rel[a].union(r) if a in rel else r
    return {op: r for op, r in rel.items() if op.op == "load"}, shape


def lower(model: PolyModel, name: str, region=(), drop_unit: bool = True) -> PolyModel:
    """The element-level model of one statement (optionally restricted to a region's
    conditions, e.g. the paper's region3): dims = its iteration vector + the stored tile's
    element coordinates (unit dims dropped)."""
    st = model.statements[name]
    rels, shape = element_relations(st.ops)
    namer = Namer(model.params)
    prefix = param_prefix(model.params)
    names, _, bounds = statement_space(st, namer)
    e = _names("e", len(shape))
    dims = [names[d] for d in st.dims] + e
    ebox = [f"0 <= {x} < {n}" for x, n in zip(e, shape)]
    cond = [rename_constraint(c, names) for c in region]
    tup = f"{name}[{', '.join(dims)}]"
    dom = isl.Set(f"{prefix}{{ {tup} : {' and '.join(bounds + ebox + cond) or 'true'} }}") \
        .intersect_params(model.context)
    to_e = isl.Map(f"{prefix}{{ {tup} -> [{', '.join(e)}] }}")
    accesses = []
    for op in st.ops:
        if op.op == "load" and op not in rels:
            continue
        for am in access_maps(op, st.dims):
            static = to_e.apply_range(rels[op]) if am.kind == "read" else to_e
            accesses.append((name, am, _element_access(prefix, st, am, namer, static, e, dom)))
    sched = isl.Map(f"{prefix}{{ {tup} -> [{', '.join(dims)}] }}").intersect_domain(dom)
    space = dom.get_space().params()
    lowered = PolyModel(model.etdg, model.params, model.sizes, model.context, {name: dom},
                        _of_kind(accesses, "read", space), _of_kind(accesses, "write", space),
                        isl.UnionMap.empty(space), isl.UnionMap.from_map(sched), {name: st}, accesses)
    if drop_unit:
        lowered = _drop_unit_dims(lowered, name, shape, len(st.dims))
    lowered.dim_names = [dims[k] for k in range(len(dims))
                         if not (drop_unit and k >= len(st.dims) and shape[k - len(st.dims)] == 1)]
    return lowered


def _element_access(prefix, st, am, namer, static: isl.Map, e, dom) -> isl.Map:
    """S[dims, e] -> B[programmable index, static coords]."""
    block = access_map(prefix, st, am, namer)  # S[dims] -> B[idx]
    n_e = len(e)
    lifted = block.insert_dims(isl.dim_type.in_, block.dim(isl.dim_type.in_), n_e)
    lifted = lifted.set_tuple_name(isl.dim_type.in_, st.name)
    for k, x in enumerate(e):
        lifted = lifted.set_dim_name(isl.dim_type.in_, block.dim(isl.dim_type.in_) + k, x)
    static = static.set_tuple_name(isl.dim_type.in_, st.name)
    m = lifted.flat_range_product(static).set_tuple_name(isl.dim_type.out, am.buffer.resolve().name)
    return m.intersect_domain(dom)


def _drop_unit_dims(model: PolyModel, name, shape, n_prog) -> PolyModel:
    """Project out element dims of size 1 (fixed at 0: the projection is exact)."""
    unit = [n_prog + k for k, n in enumerate(shape) if n == 1]
    for pos in reversed(unit):  # projection forgets the tuple's name: set it again
        model.domains[name] = model.domains[name].project_out(isl.dim_type.set, pos, 1).set_tuple_name(name)
        model.accesses = [(s, am, m.project_out(isl.dim_type.in_, pos, 1).set_tuple_name(isl.dim_type.in_, name))
                          for s, am, m in model.accesses]
        sched = maps(model.schedule)  # none when the region is empty at these sizes
        if sched:
            model.schedule = isl.UnionMap.from_map(sched[0].project_out(isl.dim_type.in_, pos, 1)
                                                   .project_out(isl.dim_type.out, pos, 1)
                                                   .set_tuple_name(isl.dim_type.in_, name))
    model.accesses = [(s, am, m) for s, am, m in model.accesses if not m.is_empty()]
    space = model.context.get_space()
    model.reads, model.writes = _of_kind(model.accesses, "read", space), _of_kind(model.accesses, "write", space)
    return model


def _of_kind(accesses, kind, space) -> isl.UnionMap:
    """The access relations of one kind ("read" or "write") as one union map."""
    return union_map((m for _, am, m in accesses if am.kind == kind), space)
