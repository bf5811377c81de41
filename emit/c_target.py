"""The C target: one translation unit per program — a context struct (parameters, buffer
pointers, strides), one function per statement (its operation nodes as macro-kernels), and
`polyft_run`, the schedule's ISL AST with OpenMP on the outermost parallel loop of each nest.
"""
from __future__ import annotations

import cgen
import numpy as np

from polyft.deps.model import _Namer

from .ast import build_ast, tileable_loops, to_cgen
from .kernels import StatementBody, ctype, length_c, shared_matmul_work

TILE = 16  # instances of a parallel loop one call of a tiled statement runs

PRELUDE = """#include <math.h>
#include <stddef.h>
#include <string.h>
typedef float ft_vec __attribute__((vector_size(64)));  /* 16 floats: the GEMM micro-kernel's row */
#define floord(n, d) (((n) < 0) ? -((-(n) + (d) - 1) / (d)) : (n) / (d))
#define min(x, y) ((x) < (y) ? (x) : (y))
#define max(x, y) ((x) > (y) ? (x) : (y))"""


class Layout:
    """The buffers a program touches, in the order the runtime passes them, with strides."""

    def __init__(self, etdg):
        seen, self.buffers = set(), []
        for b in etdg.buffers:
            b = b.resolve()
            if id(b) not in seen:
                seen.add(id(b))
                self.buffers.append(b)
        self.index = {id(b): k for k, b in enumerate(self.buffers)}

    def slot(self, buf) -> int:
        return self.index[id(buf.resolve())]


def _const_name(consts: dict, value: np.ndarray) -> str:
    value = np.ascontiguousarray(value)
    key = (value.dtype.str, value.shape, value.tobytes())
    if key not in consts:
        consts[key] = (f"k{len(consts)}", value)
    return consts[key][0]


def _const_decl(name, value) -> cgen.Generable:
    flat = value.ravel() if value.size else np.zeros(1, value.dtype)
    items = ", ".join(repr(float(x)) if np.isfinite(x) else ("INFINITY" if x > 0 else "-INFINITY")
                      for x in flat.astype(np.float64)) if value.dtype.kind == "f" else \
        ", ".join(str(int(x)) for x in flat)
    return cgen.Line(f"static const {ctype(value.dtype.name)} {name}[{flat.size}] = {{{items}}};")


def param_c(p: str) -> str:
    """A parameter inside a statement function: read from the context."""
    return f"c->{p}"


def context(layout: Layout, params) -> tuple:
    """The context struct `ctx_t` (parameters, then per buffer its pointer and strides) and
    `buffer_ref(buf, idx)`, the C address of a buffer element through it. The C and CUDA
    targets share both; the runtimes fill the struct in this order."""
    def buffer_ref(buf, idx):
        k = layout.slot(buf)
        terms = [f"({e})*c->s{k}_{r}" for r, e in enumerate(idx)]
        return f"(c->b{k} + {' + '.join(terms) or '0'})"

    fields = [cgen.Value("long", p) for p in params]
    for k, b in enumerate(layout.buffers):
        fields.append(cgen.Pointer(cgen.Value(ctype(b.dtype), f"b{k}")))
        fields += [cgen.Value("long", f"s{k}_{r}") for r in range(b.depth)]
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
    `_nb` <= `tile` consecutive values of dim pos at once (StatementBody's batch);
    `check(statement, body)` may reject a body (the CUDA target's shared memory)."""
    functions = []
    by_name = {st.name: st for st in etdg.statements}
    for name, pos in sorted(variants, key=lambda v: (v[0], -1 if v[1] is None else v[1])):
        st = by_name[name]
        names = {d: namer(d) for d in st.dims}
        batch = (st.dims[pos], tile) if pos is not None else None
        body = body_class(st.ops, lambda d, names=names: names[d], param_c, buffer_ref,
                          lambda v: _const_name(consts, v), batch=batch)
        lines = body.generate()
        if check is not None:
            check(st, body)
        args = [cgen.Value("const long", names[d]) for d in st.dims]
        args += [cgen.Value("const long", "_nb")] if pos is not None else []
        name = st.name if pos is None else f"{st.name}_t{pos}"
        functions.append(cgen.FunctionBody(cgen.FunctionDeclaration(cgen.Value(qualifiers, name), args + [ctx_arg]),
                                           cgen.Block(lines)))
    return functions


def prepare(model) -> tuple:
    """What both targets start from: (layout, params, namer, consts, ctx struct, buffer_ref)."""
    layout = Layout(model.etdg)
    params = list(model.params)
    ctx, buffer_ref = context(layout, params)
    return layout, params, _Namer(params), {}, ctx, buffer_ref


def generate(model, schedule) -> tuple:
    """(C source, Layout) for `model` under `schedule`."""
    etdg = model.etdg
    layout, params, namer, consts, ctx, buffer_ref = prepare(model)

    ast = build_ast(schedule.map, model.context)
    call = StatementCalls("&ctx")
    by_name = {st.name: st for st in etdg.statements}
    tiles = tileable_loops(ast, schedule.parallel, TILE,
                           lambda name, pos: shared_matmul_work(by_name[name].ops, by_name[name].dims[pos]))
    code = to_cgen(ast, schedule.parallel, call, lambda loop: cgen.Block([cgen.Pragma("omp parallel for"), loop]),
                   tiles=tiles)
    functions = statement_functions(etdg, namer, buffer_ref, consts, StatementBody, "static void",
                                    cgen.Value("const ctx_t* restrict", "c"), call.variants)
    setup = [cgen.Line("ctx_t ctx;"), cgen.Line("const ctx_t* c = &ctx;")]
    setup += [cgen.Line(f"const long {p} = ctx.{p} = params[{k}];") for k, p in enumerate(params)]
    for k, b in enumerate(layout.buffers):
        setup.append(cgen.Line(f"ctx.b{k} = ({ctype(b.dtype)}*)bufs[{k}];  /* {b.name} */"))
        stride = str(int(np.prod(b.element_shape)) if b.element_shape else 1)
        for r in reversed(range(b.depth)):
            setup.append(cgen.Line(f"ctx.s{k}_{r} = {stride};"))
            stride = f"{stride}*{length_c(b.dims[r], param_c)}"
    setup.append(cgen.Line("(void)c;"))
    run = cgen.FunctionBody(
        cgen.FunctionDeclaration(cgen.Value("void", "polyft_run"),
                                 [cgen.Pointer(cgen.Pointer(cgen.Value("void", "bufs"))),
                                  cgen.Pointer(cgen.Value("const long", "params"))]),
        cgen.Block(setup + [code]))
    module = cgen.Module([cgen.Line(PRELUDE), cgen.Line(""), ctx, cgen.Line("")]
                         + [_const_decl(n, v) for n, v in consts.values()] + [cgen.Line("")]
                         + functions + [cgen.Line(""), run])
    return str(module) + "\n", layout
