"""The C target: one translation unit per program — a context struct (parameters, buffer
pointers, strides), one function per statement (its operation nodes as macro-kernels), and
`polyft_run`, the schedule's ISL AST with OpenMP on the outermost parallel loop of each nest.
"""
from __future__ import annotations

import cgen
import numpy as np

from .c_family import MACROS, TILE, StatementCalls, const_decl, param_c, prepare, statement_functions, tiled_loops
from .c_statements import StatementBody, ctype, length_c
from .isl_ast import build_ast, to_cgen
from .protocol import Module, Target

PRELUDE = """#include <math.h>
#include <stddef.h>
#include <string.h>
typedef float ft_vec __attribute__((vector_size(64)));  /* 16 floats: the GEMM micro-kernel's row */
""" + MACROS


class CTarget(Target):
    """C with OpenMP; the entry point is `void polyft_run(void** bufs, const long* params)`,
    buffers in layout order, parameters in the module's order (runtime_c.CtypesRuntime)."""

    name = "C"

    def generate(self, model, schedule, precision: str = "fp32", storage=None) -> Module:
        etdg = model.etdg
        layout, params, namer, consts, ctx, buffer_ref = prepare(model, storage)

        ast = build_ast(schedule.map, model.context)
        call = StatementCalls("&ctx")
        tiles = tiled_loops(etdg, ast, schedule.parallel, TILE)
        code = to_cgen(ast, schedule.parallel, call, lambda loop: cgen.Block([cgen.Pragma("omp parallel for"), loop]),
                       tiles=tiles)
        functions = statement_functions(etdg, namer, buffer_ref, consts, StatementBody, "static void",
                                        cgen.Value("const ctx_t* restrict", "c"), call.variants)
        setup = [cgen.Line("ctx_t ctx;"), cgen.Line("const ctx_t* c = &ctx;")]
        setup += [cgen.Line(f"const long {p} = ctx.{p} = params[{k}];") for k, p in enumerate(params)]
        for k, b in enumerate(layout.buffers):
            setup.append(cgen.Line(f"ctx.b{k} = ({ctype(b.dtype)}*)bufs[{k}];  /* {b.name} */"))
            stride = str(int(np.prod(b.element_shape)) if b.element_shape else 1)
            dims = layout.dims(b)
            for r in reversed(range(b.depth)):
                setup.append(cgen.Line(f"ctx.s{k}_{r} = {stride};"))
                stride = f"{stride}*{dims[r] if isinstance(dims[r], int) else length_c(dims[r], param_c)}"
        setup.append(cgen.Line("(void)c;"))
        run = cgen.FunctionBody(
            cgen.FunctionDeclaration(cgen.Value("void", "polyft_run"),
                                     [cgen.Pointer(cgen.Pointer(cgen.Value("void", "bufs"))),
                                      cgen.Pointer(cgen.Value("const long", "params"))]),
            cgen.Block(setup + [code]))
        module = cgen.Module([cgen.Line(PRELUDE), cgen.Line(""), ctx, cgen.Line("")]
                             + [const_decl(n, v) for n, v in consts.values()] + [cgen.Line("")]
                             + functions + [cgen.Line(""), run])
        return Module(str(module) + "\n", layout, tuple(params))
