"""The CUDA target's host side: the schedule's ISL AST outside its parallel loops becomes a
Python driver `run(launch, *params)` (the wavefront's sequential loop, guards), which
launches one kernel per parallel loop (grid = its trip count; a directly nested parallel loop
makes the grid 2-D) or per statement left outside any parallel loop (grid = 1). The AST
inside a parallel loop becomes that kernel's body.
"""
from __future__ import annotations

import cgen
import islpy as isl

from polyft.errors import CompileError

from .c_family import StatementCalls
from .isl_ast import call_loops, children, loop_key, names, py_expr, to_cgen, upper_bound

class HostDriver:
    """Splits the AST: host code (Python lines) outside parallel loops, kernels inside.

    A loop in `tiles` (isl_ast.tileable_loops) runs `tb` iterations per block (or per
    step, inside a kernel); the statements under it are called in their batched form."""

    def __init__(self, ast: isl.AstNode, parallel: list, tiles: dict, tb: int):
        self.parallel = parallel
        self.tiles, self.tb = tiles, tb
        self.statement = StatementCalls("c")
        self.kernels = []  # (k, arguments, body lines) of kernel polyft_k<k>
        self.grids = []  # per kernel: the time dims of its grid's loops (none: a grid of 1), and
        self.called = []  # the names of the statements it calls
        self.host = []
        self.host_lines(ast, 1, [])

    def source(self, params: list) -> str:
        """The driver as Python: `run(launch, *params)`, calling `launch(k, grid, lows, outer)`."""
        return "\n".join([f"def run(launch, {', '.join(params + ['_=None'])}):"] + (self.host or ["    pass"])) + "\n"

    def host_lines(self, node, indent, outer):
        t = node.get_type()
        pad = "    " * indent
        if t == isl.ast_node_type.block:
            for c in children(node):
                self.host_lines(c, indent, outer)
        elif t == isl.ast_node_type.if_:
            self.host.append(f"{pad}if {py_expr(node.if_get_cond())}:")
            self.host_lines(node.if_get_then_node(), indent + 1, outer)
            if node.if_has_else_node():
                self.host.append(f"{pad}else:")
                self.host_lines(node.if_get_else_node(), indent + 1, outer)
        elif t == isl.ast_node_type.for_:
            it = node.for_get_iterator().get_id().get_name()
            if self.parallel[int(it[1:])]:
                loops = [node]  # this parallel loop, and one directly inside it -> a 2-D grid
                inner = node.for_get_body()
                if inner.get_type() == isl.ast_node_type.for_:
                    it2 = inner.for_get_iterator().get_id().get_name()
                    if self.parallel[int(it2[1:])] and it not in names(
                            f"{inner.for_get_init().to_C_str()} {inner.for_get_cond().to_C_str()}"):
                        loops.append(inner)
                tiled = [loop_key(lp) in self.tiles for lp in loops]
                k = self._kernel(loops[-1].for_get_body(), outer, [lp.for_get_iterator().get_id().get_name()
                                                                   for lp in loops], tiled)
                grid, los, counts = [], [], []
                for lp, tl in zip(loops, tiled):
                    lo, n = _trip(lp)
                    grid.append(f"(({n}) + {self.tb - 1}) // {self.tb}" if tl else n)
                    los.append(lo)
                    counts += [n] if tl else []
                los += counts
                self.host.append(f"{pad}launch({k}, ({', '.join(grid)},), ({', '.join(los)},), "
                                 f"({', '.join(outer + [''])}))")
            else:
                self.host.append(f"{pad}{it} = {py_expr(node.for_get_init())}")
                self.host.append(f"{pad}while {py_expr(node.for_get_cond())}:")
                self.host_lines(node.for_get_body(), indent + 1, outer + [it])
                self.host.append(f"{pad}    {it} += {py_expr(node.for_get_inc())}")
        elif t == isl.ast_node_type.user:
            k = self._kernel(node, outer, [])
            self.host.append(f"{pad}launch({k}, (1,), (), ({', '.join(outer + [''])}))")
        else:
            raise NotImplementedError(f"ISL AST node {t} on the host")

    def _kernel(self, body, outer, its, tiled=()) -> int:
        """A kernel running `body` with `its` bound to block indices (x, then y); a tiled one
        to `tb` iterations from there (at most n<d>, its trip count, minus those before)."""
        k = len(self.kernels)
        lines, tile = [], None
        for d, (it, tl) in enumerate(zip(its, tiled or [False] * len(its))):
            xy = "xy"[d]
            if tl:
                lines.append(cgen.Line(f"const long {it} = lo{d} + (long)blockIdx.{xy} * {self.tb};"))
                lines.append(cgen.Line(f"const long {it}_n = min({self.tb}, n{d} - (long)blockIdx.{xy} * {self.tb});"))
                tile = (it, f"{it}_n")
            else:
                lines.append(cgen.Line(f"const long {it} = lo{d} + blockIdx.{xy};"))
        code = to_cgen(body, [False] * len(self.parallel), self.statement, lambda loop, info: loop,
                       tiles=self.tiles, tile=tile)
        args = [cgen.Value("const ctx_t* __restrict__", "c")]
        self.grids.append([int(it[1:]) for it in its])
        self.called.append({name for name, _ in call_loops(body)})
        args += [cgen.Value("const long", f"lo{d}") for d in range(len(its))]
        args += [cgen.Value("const long", f"n{d}") for d, tl in enumerate(tiled) if tl]
        args += [cgen.Value("const long", o) for o in outer]
        self.kernels.append((k, args, lines + [code]))
        return k


def _trip(node) -> tuple:
    """(lower bound, trip count) of a unit-stride loop, as Python expressions."""
    lo = py_expr(node.for_get_init())
    hi, inclusive = upper_bound(node)
    if hi is None:
        raise CompileError(f"cannot map the loop over {node.for_get_iterator().get_id().get_name()} "
                           f"({node.for_get_cond().to_C_str()}) to a grid", op="emit")
    return lo, f"max(0, {py_expr(hi)} - ({lo}){' + 1' if inclusive else ''})"
