"""The CUDA target, from the same ISL AST and statement bodies as the C target.

* Host: the loops outside the outermost parallel loops become a Python driver that launches
  one kernel per parallel loop (emit.cuda_host).
* Device: a kernel runs one iteration of its parallel loop per thread block, the loops inside
  it sequentially; each statement is a `__device__` function whose tile operations all
  threads of the block execute cooperatively (emit.cuda_statements), its tiles in the
  block's shared-memory arena (emit.cuda_arena). Runs of elementwise operations are fused
  into one pass whose intermediate values stay in registers (the GEMM epilogues: bias, gates).
* Storage: every buffer stays in global memory, contracted by its shared mapping; buffers the
  storage places "local" are not moved on chip yet (flash attention's state for a block's 16
  query tiles, 512 KB, would not fit in shared memory).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import cgen

from polyft.errors import CompileError

from . import cuda_arena
from .c_family import MACROS, TILE, const_decl, prepare, statement_functions, tiled_loops
from .cuda_host import HostDriver
from .cuda_statements import PRECISIONS, CudaStatementBody
from .isl_ast import build_ast
from .protocol import Module, Target

THREADS = 256

with open(os.path.join(os.path.dirname(__file__), "tiles.cuh")) as _f:
    LIBRARY = _f.read()

PRELUDE = "#include <stdint.h>\n" + MACROS


@dataclass(frozen=True)
class CudaModule(Module):
    """CUDA C++ `source` with kernels `polyft_k<k>(ctx, long...)`, and the Python `host`
    driver that launches them."""
    host: str
    arities: list  # per kernel, its number of `long` arguments after the context
    shared_bytes: int  # the arena of dynamic shared memory each block needs
    threads: int  # per block


class SharedMemoryError(CompileError):
    """A statement's tiles do not fit in a block's shared memory."""


class CudaTarget(Target):
    """CUDA with `threads` per block (a multiple of 32); `precision` of the matmul operands
    (PRECISIONS; accumulation is float32 in all)."""

    name = "CUDA"
    precisions = tuple(PRECISIONS)

    def __init__(self, threads: int = THREADS):
        if threads % 32 or not 32 <= threads <= 1024:
            raise CompileError(f"{threads} threads per block: use a multiple of 32 up to 1024", op="compile")
        self.threads = threads

    def generate(self, model, schedule, precision: str = "fp32", storage=None) -> CudaModule:
        """The parallel loop whose statements gain most (isl_ast.tileable_loops) runs TILE
        instances per block, fewer where their tiles would not fit in shared memory, none if
        even 2 do not."""
        for tb in (TILE, TILE // 2, TILE // 4, 2):
            try:
                return self._generate(model, schedule, precision, storage, tb)
            except SharedMemoryError:
                pass
        return self._generate(model, schedule, precision, storage, None)

    def _generate(self, model, schedule, precision, storage, tb) -> CudaModule:
        etdg = model.etdg
        layout, params, namer, consts, ctx, buffer_ref = prepare(model, storage)
        ast = build_ast(schedule.map, model.context)
        tiles = tiled_loops(etdg, ast, schedule.parallel, tb) if tb else {}
        driver = HostDriver(ast, schedule.parallel, tiles, tb)
        arena = [32]

        def fits(st, body):
            arena[0] = max(arena[0], body.arena.size)
            if body.arena.size > cuda_arena.SHARED_LIMIT:
                raise SharedMemoryError(f"{st.name} keeps {body.arena.size} bytes of tiles in shared memory "
                                        f"(limit {cuda_arena.SHARED_LIMIT}); use smaller tiles", op="emit")
        body = functools.partial(CudaStatementBody, precision=precision)
        functions = statement_functions(etdg, namer, buffer_ref, consts, body, "__device__ static void",
                                        cgen.Value("const ctx_t* __restrict__", "c"), driver.statement.variants,
                                        fits, tb)
        kernels = []
        for k, args, lines in driver.kernels:
            setup = [cgen.Line(f"const long {p} = c->{p}; (void){p};") for p in params]
            kernels.append(cgen.FunctionBody(
                cgen.FunctionDeclaration(cgen.Value(f'extern "C" __global__ void __launch_bounds__({self.threads})',
                                                    f"polyft_k{k}"), args),
                cgen.Block(setup + lines)))
        module = cgen.Module([cgen.Line(f"#define FT_THREADS {self.threads}"), cgen.Line(PRELUDE), cgen.Line(LIBRARY),
                              cgen.Line(cuda_arena.declaration(arena[0])), ctx, cgen.Line("")]
                             + [const_decl(n, v, "__device__ const") for n, v in consts.values()]
                             + [cgen.Line("")] + functions + [cgen.Line("")] + kernels)
        return CudaModule(str(module) + "\n", layout, tuple(params), driver.source(params),
                          [len(args) - 1 for _, args, _ in driver.kernels], arena[0], self.threads)
