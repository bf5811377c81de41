"""What the C and CUDA targets share (the C family, after loopy's CFamilyTarget): the context
struct a runtime fills, the statement functions and the AST's calls of them, constant arrays,
and the helper macros of the ISL AST's C expressions.
"""
from __future__ import annotations

import cgen
import numpy as np

from polyft.deps.isl_helpers import Namer
from polyft.ragged import Ragged
from polyft.schedule.storage import BATCH, Batch

from .c_statements import NAN_MACROS, aff_c, ctype, shared_matmul_rows, shared_matmul_work
from .isl_ast import call_loops, level, loop_key, tileable_loops
from .protocol import Layout

TILE = BATCH  # instances of a parallel loop one call of a tiled statement runs

MACROS = """#define floord(n, d) (((n) < 0) ? -((-(n) + (d) - 1) / (d)) : (n) / (d))
#define min(x, y) ((x) < (y) ? (x) : (y))
#define max(x, y) ((x) > (y) ? (x) : (y))
""" + NAN_MACROS


def const_name(consts: dict, value: np.ndarray) -> str:
    """The name of the constant array holding `value`, added to `consts` if new."""
    value = np.ascontiguousarray(value)
    key = (value.dtype.str, value.shape, value.tobytes())
    if key not in consts:
        consts[key] = (f"k{len(consts)}", value)
    return consts[key][0]


def const_decl(name, value, qualifiers: str = "static const") -> cgen.Generable:
    flat = value.ravel() if value.size else np.zeros(1, value.dtype)
    items = ", ".join(repr(float(x)) if np.isfinite(x) else ("INFINITY" if x > 0 else "-INFINITY")
                      for x in flat.astype(np.float64)) if value.dtype.kind == "f" else \
        ", ".join(str(int(x)) for x in flat)
    return cgen.Line(f"{qualifiers} {ctype(value.dtype.name)} {name}[{flat.size}] = {{{items}}};")


def param_c(p: str) -> str:
    """A parameter inside a statement function: read from the context."""
    return f"c->{p}"


def context(layout: Layout, params, scratch: bool = False, packed=()) -> tuple:
    """The context struct `ctx_t` (parameters, then per buffer its pointer and strides, then
    with `scratch` the thread's place for large temporaries, `ft_tmp`, then a pointer `p<k>`
    to the packed copy of each buffer named in `packed`) and `buffer_ref(buf, idx,
    packed=False)`, the C address of a buffer element (or of its packed copy, at the same
    offset) through it. The runtimes fill the struct in this order."""
    def buffer_ref(buf, idx, packed=False):
        k = layout.slot(buf)
        terms = [f"({e})*c->s{k}_{r}" for r, e in enumerate(layout.cell(buf, idx)) if e is not None]
        return f"(c->{'p' if packed else 'b'}{k} + {' + '.join(terms) or '0'})"

    fields = [cgen.Value("long", p) for p in params]
    for k, b in enumerate(layout.buffers):
        fields.append(cgen.Pointer(cgen.Value(layout.narrow.get(b.name, ctype(b.dtype)), f"b{k}")))
        fields += [cgen.Value("long", f"s{k}_{r}") for r in range(b.depth)]
    if scratch:
        fields.append(cgen.Pointer(cgen.Value("char", "ft_tmp")))
    fields += [cgen.Pointer(cgen.Value(ctype(b.dtype), f"p{k}")) for k, b in enumerate(layout.buffers)
               if b.name in packed]
    return cgen.Typedef(cgen.Struct("polyft_ctx", fields, declname="ctx_t")), buffer_ref


class StatementCalls:
    """The AST's calls of statement functions (`to_cgen`'s `statement`), remembering which
    variants are called: (name, None) the plain one, (name, pos) the one batched over
    argument pos. `ctx` is the context argument's C expression."""

    def __init__(self, ctx: str):
        self.ctx = ctx
        self.variants: set = set()

    def __call__(self, name, args, tile):
        if tile is None:
            self.variants.add((name, None))
            return cgen.Statement(f"{name}({', '.join(args + [self.ctx])})")
        self.variants.add((name, tile[0]))
        return cgen.Statement(f"{name}_t{tile[0]}({', '.join(args + [tile[1], self.ctx])})")


def statement_functions(etdg, namer, buffer_ref, consts: dict, body_class, qualifiers: str, ctx_arg,
                        variants, check=None, tile=TILE) -> list:
    """The functions of the called `variants` (StatementCalls'): `qualifiers name(dims...,
    ctx)`, whose body `body_class` generates, and `name_t<pos>(dims..., _nb, ctx)` running
    `_nb` <= `tile` consecutive values of dim pos at once (StatementBody's batch; `tile` may
    be a function of the statement's name); `check(statement, body)` may reject a body (the
    CUDA target's shared memory)."""
    functions = []
    by_name = {st.name: st for st in etdg.statements}
    for name, pos in sorted(variants, key=lambda v: (v[0], -1 if v[1] is None else v[1])):
        st = by_name[name]
        names = {d: namer(d) for d in st.dims}
        batch = (st.dims[pos], tile(name) if callable(tile) else tile) if pos is not None else None
        body = body_class(st.ops, lambda d, names=names: names[d], param_c, buffer_ref,
                          lambda v: const_name(consts, v), batch=batch)
        lines = body.generate()
        if check is not None:
            check(st, body)
        guard = ragged_guard(st, pos, lambda d, names=names: names[d], buffer_ref)
        args = [cgen.Value("const long", names[d]) for d in st.dims]
        args += [cgen.Value("const long", "_nb_all" if guard and pos is not None else "_nb")] if pos is not None else []
        lines = guard + list(lines)
        name = st.name if pos is None else f"{st.name}_t{pos}"
        functions.append(cgen.FunctionBody(cgen.FunctionDeclaration(cgen.Value(qualifiers, name), args + [ctx_arg]),
                                           cgen.Block(lines)))
    return functions


def ragged_guard(st, pos, dim, buffer_ref) -> list:
    """The lines that skip the instances of `st` past their ragged dims' lengths (`k < len[i]`;
    read from the call-time buffer of lengths): return at once, so no padding work is done. In
    the variant running `_nb_all` values of dim `pos` from its value on, the run stops at the
    length (`batchable` keeps that dim out of the lengths' index)."""
    lines = []
    for d in st.dims:
        if isinstance(d.extent, Ragged):
            n = f"((long){buffer_ref(d.extent.lengths, [aff_c(a, dim, param_c, None) for a in d.extent.at])}[0])"
            if pos is not None and st.dims[pos] is d:
                lines.append(cgen.Line(f"const long _nb = min(_nb_all, {n} - {dim(d)});"))
                lines.append(cgen.Line("if (_nb <= 0) return;"))
            else:
                lines.append(cgen.Line(f"if ({dim(d)} >= {n}) return;"))
    if pos is not None and lines and not any(l.text.startswith("const long _nb") for l in lines):
        lines.insert(0, cgen.Line("const long _nb = _nb_all;"))
    return lines


def batchable(st, pos: int) -> bool:
    """Whether one call may run consecutive values of dim `pos` of `st`: not where a ragged
    dim's length is read at that dim (its instances would have different lengths)."""
    d = st.dims[pos]
    return not any(isinstance(e.extent, Ragged) and any(d in a.dims for a in e.extent.at) for e in st.dims)


def tiled_loops(etdg, ast, parallel: list, size: int, rows: int | None = None) -> dict:
    """The loops to run `size` instances at a time (isl_ast.tileable_loops), chosen by the
    matmul work whose right matrix a tile shares (c_statements.shared_matmul_work). With
    `rows`, fewer instances where each brings many rows: a tile's products get about `rows`
    rows (its temporaries then stay in a CPU core's caches)."""
    by_name = {st.name: st for st in etdg.statements}

    def width(calls) -> int:
        most = max((shared_matmul_rows(by_name[name].ops, by_name[name].dims[pos]) for name, pos in calls),
                   default=1)
        return max(1, min(size, rows // most)) if rows else size
    return tileable_loops(ast, parallel, width,
                          lambda name, pos: shared_matmul_work(by_name[name].ops, by_name[name].dims[pos]),
                          lambda name, pos: batchable(by_name[name], pos))


def widened(etdg, ast, parallel: list, tiles: dict, local: dict, size: int, rows: int) -> dict:
    """`tiles` with the loops under which no statement touches a `local` buffer at up to `size`
    instances (and about `rows` rows of products, as tiled_loops's): storage keeps a local
    buffer's cells for at most BATCH instances at once, a global one for all. A statement of
    one-row instances then multiplies a shared matrix by `rows` rows at once, not 16: an LSTM's
    four 1024 x 1024 gate pairs (32 MB) were read from memory once per 16 rows."""
    if size <= TILE:
        return tiles
    by_name = {st.name: st for st in etdg.statements}
    touches = {name: any(am.buffer.resolve().name in local for am in st.reads + st.writes)
               for name, st in by_name.items()}
    held = set()  # loops with a statement under them that touches a local buffer
    for name, around in call_loops(ast):
        if touches[name]:
            held.update(loop_key(f) for f in around)
    wide = tiled_loops(etdg, ast, parallel, size, rows)
    return {key: wide.get(key, width) if key not in held else width for key, width in tiles.items()}


def tile_widths(ast, tiles: dict) -> dict:
    """Statement name -> the widest tile of a loop around its calls (statement_functions's
    `tile`: the instances its batched variant runs at most)."""
    out = {}
    for name, around in call_loops(ast):
        for f in around:
            if loop_key(f) in tiles:
                out[name] = max(out.get(name, 1), tiles[loop_key(f)])
    return out


def local_batches(etdg, storage, ast, parallel: list, tiles: dict, in_order: bool) -> dict:
    """The buffers to keep in a per-thread scratch (buffer name -> storage.Batch): those the
    storage places "local" whose every statement runs inside a parallel loop (a thread's
    iterations); the width is TILE where a loop at the buffer's slot dim runs tiled, else 1;
    `in_order` when one thread runs the parallel loops inside the slot loop in order."""
    if storage is None:
        return {}
    by_name = {st.name: st for st in etdg.statements}
    loops = {}  # buffer name -> the loops around each call of a statement touching it
    for name, around in call_loops(ast):
        st = by_name[name]
        for am in st.reads + st.writes:
            loops.setdefault(am.buffer.resolve().name, []).append(around)
    out = {}
    for name, s in storage.buffers.items():
        calls = loops.get(name, [])
        if s.placement != "local" or not calls or not all(any(parallel[level(f)] for f in c) for c in calls):
            continue
        tiled = any(level(f) == s.slot_dim and loop_key(f) in tiles for c in calls for f in c)
        out[name] = Batch(TILE if tiled else 1, in_order)
    return out


def prepare(model, storage=None, local=None, scratch=False, packed=(), narrow=None) -> tuple:
    """What both targets start from: (layout, params, namer, consts, ctx struct, buffer_ref);
    `local` and `narrow` as Layout's, `scratch` and `packed` as context's."""
    layout = Layout(model.etdg, storage, local, packed, narrow)
    params = list(model.params)
    ctx, buffer_ref = context(layout, params, scratch, packed)
    return layout, params, Namer(params), {}, ctx, buffer_ref
