"""The CUDA target, from the same ISL AST and statement bodies as the C target.

* Control: the whole schedule is one persistent kernel (emit.cuda_host): every block runs the
  sequential loops, each parallel band's instances (all its parallel loops flattened) are
  shared out among the blocks by a grid-stride loop, a grid barrier after each band. One
  launch per call; the runtime sizes the grid so that all its blocks are resident.
* Device: an instance of a band runs on one block, the loops inside it sequentially; each
  statement is a `__device__` function whose tile operations all threads of the block
  execute cooperatively (emit.cuda_statements), its tiles in the block's shared-memory arena
  (emit.cuda_arena). Runs of elementwise operations are fused into one pass whose
  intermediate values stay in registers (the GEMM epilogues: bias, gates).
* Storage: buffers stay in global memory, contracted by their shared mapping, except the
  buffers the storage places "local" that a block can keep in its own shared memory
  (`local_candidates`): every statement touching one is called in one band, and every
  element's accesses fall in one instance of it, so the block running that instance owns
  the element from its write to its last read, and no other block ever sees it. Those
  buffers (`local_places`) live after the arena in the block's dynamic shared memory,
  64-byte aligned, each group of buffers never live at once (Storage.regions) in one region
  as large as its largest member: on-chip state (flash attention's running max, sum and
  output; b2b_gemm's accumulator) is then never written to DRAM. The kernel runs on its own
  copy of the context (`ft_own`) whose pointers to them are the block's places. What does
  not fit next to the arena within LOCAL_BUDGET (two blocks per SM) goes back to global
  memory, largest first; so do buffers whose size is not known when generating (a full
  extent of an unknown length): the launch's dynamic shared memory is a number fixed at
  generation.
* Precision: under "fp16" and "bf16" the float32 buffers in global memory hold halves
  (emit.halves: `layout.narrow`); the block's local buffers stay float32.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field

import cgen
import islpy as isl

from polyft.affine import Length
from polyft.errors import CompileError
from polyft.schedule.storage import Batch, check, conflicts, happens_before, mapping, successive_moduli

from . import cuda_arena
from .c_family import MACROS, TILE, const_decl, local_batches, prepare, statement_functions, tiled_loops
from .c_statements import ctype, native_dtype
from .cuda_host import GRID_BARRIER, PersistentKernel
from .cuda_statements import PRECISIONS, CudaStatementBody
from .halves import narrow_buffers
from .isl_ast import below, build_ast, call_loops, level
from .protocol import Module, Target

THREADS = 256
ALIGN = 64  # bytes: where each region of local buffers starts in the block's shared memory

with open(os.path.join(os.path.dirname(__file__), "tiles.cuh")) as _f:
    LIBRARY = _f.read()

# the float element functions are CUDA's own (the C target's vectorised ones are for CPUs)
PRELUDE = "#include <stdint.h>\n#define FT_INLINE __device__ inline  /* not static: nvcc warns of unused ones */\n" \
    + MACROS + """
#define ft_expf expf
#define ft_tanhf tanhf
#define ft_sigmoidf(x) (((x) >= 0 ? 1.0f : expf(-fabsf(x))) / (1.0f + expf(-fabsf(x))))
"""

# emulated, blocks run by turns between grid barriers, each with its own copy of the arena
# (emit/emulate.hpp swaps them)
REGISTER_ARENA = """#ifdef FT_EMULATED
static const int ft_arena_registered = ft_register_arena(ft_arena, sizeof ft_arena);
#endif"""


@dataclass(frozen=True)
class CudaModule(Module):
    """CUDA C++ `source` with one persistent kernel `polyft_k0(ctx)` (emit.cuda_host), and the
    Python `host` driver that launches it."""
    host: str
    arities: list  # per kernel, its number of `long` arguments after the context
    shared_bytes: int  # the dynamic shared memory each block needs: the arena, then local buffers
    threads: int  # per block
    serial: tuple = ()  # why parallel loops run serially inside a block (cuda_host.PersistentKernel)
    # per local buffer, the band whose instances own it: buffers of two bands are never live at
    # once (a grid barrier between), so they may share places
    band_of: dict = field(default_factory=dict)
    batch: int | None = None  # instances per block of the tiled loop's statements (None: none batched)
    barriers: str = ""  # Python `barriers(*params)`: the grid barriers a call passes (PersistentKernel.barriers)


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
        even 2 do not; fewer also where the local buffers a block could own would not fit
        beside the tiles (local_places), down to none batched: state on chip (flash
        attention's running max, sum and output) saves more DRAM traffic than a batch's
        shared operands. Among equals, the largest batch."""
        best = None
        for tb in (TILE, TILE // 2, TILE // 4, 2, None):
            try:
                module, wanted = self._generate(model, schedule, precision, storage, tb)
            except SharedMemoryError:
                continue
            if len(module.layout.local) == wanted:
                return module
            if best is None or len(module.layout.local) > len(best.layout.local):
                best = module
        if best is None:  # even unbatched: the error, with its numbers
            return self._generate(model, schedule, precision, storage, None)[0]
        return best

    def _generate(self, model, schedule, precision, storage, tb, given_up=frozenset()) -> tuple:
        """(the module with `tb` instances per batch, how many local buffers a block could own).
        A band kept whole for a buffer that then does not fit in shared memory is split after
        all (the buffers `given_up`): its parallel loops are worth more than nothing."""
        etdg = model.etdg
        ast = build_ast(schedule.map, model.context)
        tiles = tiled_loops(etdg, ast, schedule.parallel, tb) if tb else {}
        driver = PersistentKernel(ast, schedule, model.context, tiles, tb, list(model.params),
                                  keep_on_chip(etdg, storage, schedule.parallel, given_up))
        band_of, local = local_candidates(etdg, storage, ast, schedule.parallel, tiles, driver, model)
        wanted = len(local)
        nbytes = {name: local_bytes(storage.buffers[name], w, model.sizes) for name, w in local.items()}
        local = {name: w for name, w in local.items() if nbytes[name] is not None}
        while True:  # the statements for these local buffers; again if some must go back to global memory
            layout, params, namer, consts, ctx, buffer_ref = prepare(
                model, storage, local, narrow=narrow_buffers(etdg, local, precision))
            arena = [32]

            def fits(st, body):
                arena[0] = max(arena[0], body.arena.size)
                if body.arena.size > cuda_arena.SHARED_LIMIT:
                    raise SharedMemoryError(f"{st.name} keeps {body.arena.size} bytes of tiles in shared memory "
                                            f"(limit {cuda_arena.SHARED_LIMIT}); use smaller tiles", op="emit")
            # the GEMMs' stages leave room for the local buffers (smaller block tiles, if need be):
            # a block's state kept on chip saves more DRAM traffic than larger tiles save L2 reads
            need = local_places(storage, local, band_of, nbytes, 0)[1]
            limit = min(cuda_arena.SHARED_LIMIT, LOCAL_BUDGET - need) if local else cuda_arena.SHARED_LIMIT
            body = functools.partial(CudaStatementBody, precision=precision, narrow=layout.narrow, limit=limit)
            # not inlined: ptxas allocates registers per statement, not over the whole persistent
            # kernel (inlined, the dilated RNN's gate GEMMs spilled 864 bytes under 128
            # registers); a call costs nanoseconds, a statement's tile operations microseconds
            functions = statement_functions(etdg, namer, buffer_ref, consts, body,
                                            "__noinline__ __device__ static void",
                                            cgen.Value("const ctx_t* __restrict__", "c"), driver.statement.variants,
                                            fits, tb)
            places, shared = local_places(storage, local, band_of, nbytes, arena[0])
            if len(places) == len(local):
                break
            local = {name: w for name, w in local.items() if name in places}
        lost = set(driver.kept) - set(places)
        if lost:
            return self._generate(model, schedule, precision, storage, tb, given_up | lost)
        slots = {b.name: k for k, b in enumerate(layout.buffers)}
        setup = [cgen.Line(f"const long {p} = c->{p}; (void){p};") for p in params]
        lines = [driver.code]
        mine = sorted((slots[name], name) for name in places)
        if mine:  # the block's own context: its local buffers in its shared memory
            setup.append(cgen.Line("ctx_t ft_own = *c;"))
            for slot, name in mine:
                b = layout.buffers[slot]
                setup.append(cgen.Line(f"ft_own.b{slot} = ({ctype(b.dtype)}*)(ft_arena + {places[name]});  "
                                       f"/* {name}: {nbytes[name]} bytes, batches of {local[name]} */"))
            for k in sorted({band_of[name] for name in places}):
                lo = min(places[name] for name in places if band_of[name] == k)
                hi = max(places[name] + nbytes[name] for name in places if band_of[name] == k)
                # what an earlier instance left in the block's shared memory would hide a read
                # before a write: emulated, each instance starts from NaNs
                driver.instance_bodies[k].contents.insert(0, cgen.Line(
                    f"#ifdef FT_EMULATED\nif (threadIdx.x == 0) memset(ft_arena + {lo}, 0xff, {hi - lo});\n"
                    f"__syncthreads();\n#endif"))
            lines = [cgen.Block([cgen.Line("const ctx_t* c = &ft_own;")] + lines)]
        notes = [cgen.Comment(f"parallel loop not mapped to blocks: {why}") for why in driver.serial]
        kernel = cgen.FunctionBody(
            cgen.FunctionDeclaration(cgen.Value(f'extern "C" __global__ void __launch_bounds__({self.threads}, '
                                                f'{BLOCKS_PER_SM})', "polyft_k0"),
                                     [cgen.Value("const ctx_t* __restrict__", "c")]),
            cgen.Block(notes + setup + lines))
        shared = max(arena[0], shared)
        module = cgen.Module([cgen.Line(f"#define FT_THREADS {self.threads}"), cgen.Line(PRELUDE), cgen.Line(LIBRARY),
                              cgen.Line(GRID_BARRIER), cgen.Line(cuda_arena.declaration(shared)),
                              cgen.Line(REGISTER_ARENA), ctx, cgen.Line("")]
                             + [const_decl(n, v, "__device__ const") for n, v in consts.values()]
                             + [cgen.Line("")] + functions + [cgen.Line(""), kernel])
        return CudaModule(str(module) + "\n", layout, tuple(params), driver.source(), [0], shared, self.threads,
                          tuple(driver.serial), {name: band_of[name] for name in places},
                          tb if tiles else None, driver.barriers()), wanted


def local_candidates(etdg, storage, ast, parallel: list, tiles: dict, driver: PersistentKernel, model) -> tuple:
    """(buffer name -> its band, buffer name -> Instance) of the local buffers a block may keep
    in shared memory: c_family.local_batches' (placed "local", every access inside a parallel
    loop) whose every statement is called in one band of the kernel (cuda_host.Band), each
    element's accesses all in one instance of it (`owned`): the block running that instance
    owns the element for its whole life, whatever the band's shape. Its cells are those of
    one instance (`instance_cells`)."""
    if storage is None:
        return {}, {}
    widths = local_batches(etdg, storage, ast, parallel, tiles, False)
    by_name = {st.name: st for st in etdg.statements}
    bands: dict = {}  # buffer name -> the bands calling a statement that touches it
    for k, band in enumerate(driver.bands):
        for name in band.called:
            st = by_name[name]
            for am in st.reads + st.writes:
                bands.setdefault(am.buffer.resolve().name, set()).add(k)
    band_of, local = {}, {}
    for name in widths:
        ks = bands.get(name, set())
        if len(ks) != 1:
            continue
        band = driver.bands[min(ks)]
        if owned(storage.buffers[name], band.depth):
            tiled = band.dims[band.tiled] if band.tiled is not None else None
            inst = Instance(driver.tb if tiled is not None else 1, False, band.depth, tiled)
            instance_cells(storage, name, inst, model)
            band_of[name], local[name] = min(ks), inst
    return band_of, local


@dataclass(frozen=True)
class Instance(Batch):
    """How a block runs the elements of a local buffer: one instance of a band, i.e. the
    statement instances whose first `depth` time dims agree, except time dim `tiled` (the
    band's tiled loop, if any), on which they are less than `width` apart."""
    depth: int = 0
    tiled: int | None = None


def keep_on_chip(etdg, storage, parallel: list, given_up=frozenset()):
    """PersistentKernel's `together`: a band is not split over a sequence of nodes when a local
    buffer (not in `given_up`) is touched in two of them and lives within one instance of the
    band, unless a sequential loop is among those nodes (a state carried along it, as in the
    dilated RNN, is worth the parallel loops inside). Kept whole, the instance writes and
    reads the buffer in one block, which keeps it in shared memory (the stacked LSTM's gates:
    one GEMM per gate, a block's gates never leave the chip); split, it would go through
    global memory between two bands. Returns the buffer's name, or None."""
    if storage is None:
        return None
    local = {name: s for name, s in storage.buffers.items() if s.placement == "local" and name not in given_up}
    touches = {st.name: {am.buffer.resolve().name for am in st.reads + st.writes} for st in etdg.statements}

    def together(depth, nodes):
        parts = [{name for name, _ in call_loops(n)} for n in nodes]
        for name, s in sorted(local.items()):
            users = [n for n, called in zip(nodes, parts) if any(name in touches[st] for st in called)]
            if len(users) > 1 and not any(_sequential(n, parallel) for n in users) and owned(s, depth):
                return name
        return None
    return together


def _sequential(node, parallel: list) -> bool:
    """Whether a loop over a sequential time dim is at or below `node`."""
    if node.get_type() == isl.ast_node_type.for_ and not parallel[level(node)]:
        return True
    return any(_sequential(k, parallel) for k in below(node))


def owned(s, depth: int) -> bool:
    """Whether every access of each element of buffer storage `s` happens at times that agree
    on the first `depth` time dims (ISL: the pairs of access times of one element)."""
    pairs = s.live.reverse().apply_range(s.live)
    same = isl.Map.universe(pairs.get_space())
    for j in range(depth):
        same = same.equate(isl.dim_type.in_, j, isl.dim_type.out, j)
    return pairs.is_subset(same)


def instance_cells(storage, name: str, inst: Instance, model) -> None:
    """Adds to buffer `name`'s local storage (BufferStorage.local) the successive-modulo
    contraction for one block's instance `inst`: the conflicts (schedule.storage) between
    elements accessed in one instance, checked with ISL like the storage's own. A block owns
    far fewer elements than a batch of the slot loop (flash attention's o: the query tiles of
    one instance, not every head's), so the cells of a band over B x NH x TQ fit on chip."""
    s = storage.buffers[name]
    if inst in s.local:
        return
    before = happens_before(storage.schedule)
    space = s.live.get_space().range()
    n = space.dim(isl.dim_type.set)
    ins, outs = [f"i{j}" for j in range(n)], [f"o{j}" for j in range(n)]
    cons = [f"o{j} = i{j}" for j in range(inst.depth) if j != inst.tiled]
    if inst.tiled is not None:
        cons.append(f"-{inst.width} < o{inst.tiled} - i{inst.tiled} < {inst.width}")
    near = isl.Map(f"{{ [{', '.join(ins)}] -> [{', '.join(outs)}] : {' and '.join(cons) or 'true'} }}")
    near = near.align_params(space)
    same = s.live.apply_range(near).apply_range(s.live.reverse())
    within = conflicts(s.written, s.live, before).intersect(same)
    moduli = successive_moduli(within, model.context)
    cells = mapping(name, moduli, model.params)
    check(name, within, cells, model.context)
    s.local[inst] = (moduli, cells)


def local_bytes(s, batch, sizes: dict) -> int | None:
    """The bytes of a block's cells of a local buffer (storage.BufferStorage `s`) for a
    storage.Batch, at most what Layout.cells_shape gives for any lengths the model allows (a
    modulus over an unknown length counts whole); None where a kept extent is unknown."""
    def known(n):
        n = Length.of(n)
        return n.evaluate(sizes) if n.params <= set(sizes) else None
    buf = s.buffer
    count = math.prod(buf.element_shape) * native_dtype(buf.dtype).itemsize
    for cells, n in zip(s.cell_dims(batch), buf.dims):
        extent = known(n)
        if not isinstance(cells, int):
            if extent is None:
                return None
            cells = extent
        count *= cells if extent is None else max(0, min(cells, extent))
    return count


# the blocks of the persistent kernel an SM should hold: its registers are bounded for them
# (__launch_bounds__: at 256 threads, 128 registers a thread, where ptxas's own choice of 64
# spills the tile GEMMs' accumulators), and local buffers may grow a block's shared memory up
# to LOCAL_BUDGET, at which two blocks still fit (228 KB on sm_90, 1 KB of it reserved per
# block); more would trade occupancy for on-chip state
BLOCKS_PER_SM = 2
LOCAL_BUDGET = 113 * 1024


def local_places(storage, local: dict, band_of: dict, nbytes: dict, arena: int) -> tuple:
    """(buffer name -> byte offset in the block's dynamic shared memory, the bytes a block
    needs): per band, its local buffers after the arena (those of two bands are never live at
    once: they may overlap), one ALIGN-aligned region per group of Storage.regions (as large
    as its largest member); where a band's regions would pass LOCAL_BUDGET its largest buffer
    goes back to global memory (left out), until they fit."""
    base = _align(arena)
    places, shared = {}, 0
    for k in sorted(set(band_of[name] for name in local)):
        names = [name for name in local if band_of[name] == k]
        while names:
            offsets, end = {}, base
            for group in storage.regions({name: local[name] for name in names}):
                offsets.update({name: end for name in group})
                end += _align(max(nbytes[name] for name in group))
            if end <= LOCAL_BUDGET:
                places.update(offsets)
                shared = max(shared, end)
                break
            names.remove(max(names, key=lambda name: (nbytes[name], name)))
    return places, shared


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
