"""The CUDA target's control flow: the schedule's whole ISL AST becomes one persistent kernel
(`polyft_k0`), so a call is one launch whatever its wavefront's length.

Every block runs the code outside parallel loops (the wavefront's sequential loops, guards).
A parallel loop starts a *band*: it, the parallel loops directly inside it, and those found
further in, are flattened into one index space of instances that the blocks share out as a
grid-stride loop (block b runs instances b, b + gridDim.x, ...), each instance's body run by
one block with all its threads (emit.cuda_statements). To reach the parallel loops further in,
the band is carried inward: over a block of nodes it is distributed (one band per node), over
a sequential loop or a guard whose bounds do not name the band's iterators it is interchanged
outward (the loop runs in every block, the band inside it). Both are legal because a parallel
loop carries no dependence: only the order of instances with the same band iterators matters,
and that order is kept. Nodes that a parallel time dim tells apart (the layers of a hyperplane
step, each its own statement) share one band instead: the instances of each follow the
previous node's in the flat index, and one barrier ends them all. A band ends in a grid-wide barrier (`ft_grid_sync`), so the next band,
or the next step of a sequential loop, sees everything it wrote; a statement outside every
parallel loop runs in block 0, then the barrier.

Bounds that name an outer band iterator (a triangle, a wavefront's cells) flatten over their
bounding box, computed with ISL, each instance guarded by the loop's own bounds. A parallel
loop that cannot join a band (a non-unit stride, no plain upper bound, a tiled loop whose
bounds name the band's iterators) becomes a sequential loop every block runs, the band
carried inside it, or where its bounds name the band's iterators runs serially inside the
instance's block, as do the parallel loops under a sequential loop or guard that names them,
and those of a band that the target keeps in one piece (`together`: a buffer that one
instance writes and reads stays in its block's shared memory, cuda_target.keep_on_chip);
the reasons are kept in `PersistentKernel.serial` and written into the kernel as comments.

The host side is one line of Python, `run(launch, *params)`: `launch(0, blocks)` with the
most instances any band has at once (ISL, over the lengths), or None where ISL cannot bound
them; the runtime launches min(that, the blocks that can be resident at once).
"""
from __future__ import annotations

from dataclasses import dataclass

import cgen
import islpy as isl

from .c_family import StatementCalls
from .isl_ast import call_loops, children, has_parallel, level, loop_key, names, py_expr, to_cgen, upper_bound

# the grid barrier on the GPU (the emulator has its own, emulate.hpp). A software barrier, not a
# cooperative launch: PyCUDA has no cuLaunchCooperativeKernel, and grid.sync() needs relocatable
# device code; the runtime sizes the grid from the occupancy so that every block is resident.
GRID_BARRIER = r"""#ifndef FT_EMULATED
__device__ unsigned int ft_grid_arrived, ft_grid_generation;
/* All blocks of the grid wait here: the last to arrive resets the count and opens the next
   generation. The fences publish this block's writes before it arrives and order the others'
   before its reads; a barrier still closed after ~10 s traps (a block that is not resident
   would otherwise hang the GPU). */
__device__ __forceinline__ void ft_grid_sync() {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned int* generation = &ft_grid_generation;
    const unsigned int mine = *generation;
    __threadfence();
    if (atomicAdd(&ft_grid_arrived, 1u) == gridDim.x * gridDim.y - 1) {
      atomicExch(&ft_grid_arrived, 0u);
      __threadfence();
      atomicAdd(&ft_grid_generation, 1u);
    } else {
      for (unsigned int spins = 0; *generation == mine; spins++) {
        __nanosleep(64);
        if (spins == (1u << 27)) __trap();
      }
    }
    __threadfence();
  }
  __syncthreads();
}
#endif
"""


@dataclass
class Band:
    """One band of the kernel: the time dims of its flattened loops (outermost first), the
    statements its instances call, the Python expression (over the lengths) of the most
    instances it has at once (None where ISL cannot bound it), and `depth`: one instance runs
    the statement instances whose time vectors agree on the first `depth` dims (those of the
    band's loops and of the loops around it)."""
    dims: list
    called: set
    most: str | None
    depth: int
    tiled: int | None = None  # which of `dims` is the tiled loop (a batch of `tb` per instance)


class PersistentKernel:
    """The schedule's AST as the body of one kernel (module doc). A loop in `tiles`
    (isl_ast.tileable_loops) runs `tb` iterations per instance; the statements under it are
    called in their batched form."""

    def __init__(self, ast: isl.AstNode, schedule, context: isl.Set, tiles: dict, tb: int, params: list,
                 together=None):
        self.parallel, self.tiles, self.tb, self.params = schedule.parallel, tiles, tb, list(params)
        self.schedule, self.context = schedule, context
        self.together = together  # (depth, nodes) -> the buffer a band must not be split to keep, or None
        self.kept: list = []  # those buffers
        self.statement = StatementCalls("c")
        self.bands: list = []
        self.instance_bodies: list = []  # per band, the cgen.Block an instance runs (its first lines may be added)
        self.serial: list = []  # why a parallel loop runs serially inside a block
        self._around: list = []  # the sequential loops and guards every block is inside, outermost first
        self.syncs: list = []  # per grid barrier in the code, those around it (`barriers`)
        self.code = self._uniform(ast, [])

    def source(self) -> str:
        """The host driver as Python: `run(launch, *params)` calling `launch(0, blocks)`."""
        most = [b.most for b in self.bands]
        blocks = "None" if None in most else f"max({', '.join(['1'] + most)})"
        return (f"def run(launch, {', '.join(self.params + ['_=None'])}):\n"
                f"    launch(0, {blocks})\n")

    def barriers(self) -> str:
        """Python: `barriers(*params)`, the grid barriers one call passes (each band's, once
        per iteration of the sequential loops around it and where its guards hold), from the
        ISL AST the kernel's control flow is generated from."""
        lines = [f"def barriers({', '.join(self.params + ['_=None'])}):", "    n = 0"]
        for around in self.syncs:
            pad = "    "
            for kind, node, holds in around:
                if kind == "for":
                    it = node.for_get_iterator().get_id().get_name()
                    lines += [f"{pad}{it} = {py_expr(node.for_get_init())}",
                              f"{pad}while {py_expr(node.for_get_cond())}:"]
                    pad += "    "
                else:
                    lines.append(f"{pad}if {'' if holds else 'not '}{py_expr(node.if_get_cond())}:")
                    pad += "    "
            lines.append(f"{pad}n += 1")
            for kind, node, _ in reversed(around):
                pad = pad[:-4]
                if kind == "for":
                    it = node.for_get_iterator().get_id().get_name()
                    lines.append(f"{pad}    {it} += {py_expr(node.for_get_inc())}")
        return "\n".join(lines + ["    return n", ""])

    # -- code every block runs -----------------------------------------------------------
    def _uniform(self, node, path):
        t = node.get_type()
        if t == isl.ast_node_type.block:
            parts = self._concurrent([], children(node), path)
            if parts:  # one band over the nodes' instances at once
                return self._bands(parts, path)
            return cgen.Block([self._uniform(c, path) for c in children(node)])
        if t == isl.ast_node_type.mark:
            return self._uniform(node.mark_get_node(), path)
        if t == isl.ast_node_type.if_:
            return self._guard(node, path, lambda n, p: self._uniform(n, p))
        if t == isl.ast_node_type.for_:
            if self.parallel[level(node)]:
                return self._mapped([], node, path)
            return self._loop(node, path, lambda n, p: self._uniform(n, p))
        if t == isl.ast_node_type.user:  # outside every parallel loop: block 0 runs it
            return self._band([], node, path)
        raise NotImplementedError(f"ISL AST node {t} in a kernel")

    def _guard(self, node, path, inner):
        self._around.append(("if", node, True))
        then = inner(node.if_get_then_node(), path)
        self._around[-1] = ("if", node, False)
        other = inner(node.if_get_else_node(), path) if node.if_has_else_node() else None
        self._around.pop()
        return cgen.If(node.if_get_cond().to_C_str(), _block(then), _block(other) if other is not None else None)

    def _loop(self, node, path, inner):
        """A sequential loop every block runs, `inner` its body; `path` gains its time dim."""
        it = node.for_get_iterator().get_id().get_name()
        init, cond, inc = node.for_get_init(), node.for_get_cond(), node.for_get_inc().to_C_str()
        self._around.append(("for", node, True))
        body = inner(node.for_get_body(), path + [level(node)])
        self._around.pop()
        return cgen.For(f"long {it} = {init.to_C_str()}", cond.to_C_str(), f"{it} += {inc}", _block(body))

    # -- bands ---------------------------------------------------------------------------
    def _mapped(self, band: list, node, path):
        """The code running `node` for every instance of `band` (for-nodes, outermost first),
        the parallel loops in `node` joining the band where they can."""
        t = node.get_type()
        mine = {lp.for_get_iterator().get_id().get_name() for lp in band}
        if t == isl.ast_node_type.for_ and self.parallel[level(node)]:
            why = self._unmappable(band, node)
            if why is None:
                return self._mapped(band + [node], node.for_get_body(), path)
            if not mine & names(f"{node.for_get_init().to_C_str()} {node.for_get_cond().to_C_str()}"):
                self.serial.append(f"{why}: every block runs it as a sequential loop")
                return self._loop(node, path, lambda n, p: self._mapped(band, n, p))
            self.serial.append(f"{why}: it runs serially")
            return self._band(band, node, path, why)
        if t == isl.ast_node_type.block:
            parts = self._concurrent(band, children(node), path)
            if parts:  # one band over the nodes' instances at once
                return self._bands(parts, path)
        if not has_parallel(node, self.parallel):
            return self._band(band, node, path)
        if t == isl.ast_node_type.block:  # distributed: one band per node
            kept = self.together and self.together(self._depth(band, path), children(node))
            if kept:
                why = f"buffer {kept} lives within one instance of the band: its parallel loops run in one block " \
                      "so that it stays on chip"
                self.kept.append(kept)
                self.serial.append(why)
                return self._band(band, node, path, why)
            return cgen.Block([self._mapped(band, c, path) for c in children(node)])
        if t == isl.ast_node_type.mark:
            return self._mapped(band, node.mark_get_node(), path)
        if t == isl.ast_node_type.if_ and not mine & names(node.if_get_cond().to_C_str()):
            return self._guard(node, path, lambda n, p: self._mapped(band, n, p))
        if t == isl.ast_node_type.for_:
            bounds = " ".join(e.to_C_str() for e in (node.for_get_init(), node.for_get_cond(), node.for_get_inc()))
            if not mine & names(bounds):  # interchanged outward: every block runs it, the band inside
                return self._loop(node, path, lambda n, p: self._mapped(band, n, p))
            why = (f"the loop over {node.for_get_iterator().get_id().get_name()} ({node.for_get_cond().to_C_str()}) "
                   f"has bounds naming the band's iterators: the parallel loops inside it run serially")
        else:
            why = f"a guard ({node.if_get_cond().to_C_str()}) names the band's iterators: the parallel loops " \
                  "inside it run serially"
        self.serial.append(why)
        return self._band(band, node, path, why)

    def _unmappable(self, band: list, node) -> str | None:
        """Why parallel loop `node` cannot join `band` (None: it can)."""
        it = node.for_get_iterator().get_id().get_name()
        if node.for_get_inc().to_C_str() != "1" or upper_bound(node)[0] is None:
            return f"the parallel loop over {it} ({node.for_get_cond().to_C_str()}, step " \
                   f"{node.for_get_inc().to_C_str()}) is not a unit-stride loop with an upper bound"
        mine = {lp.for_get_iterator().get_id().get_name() for lp in band}
        bounds = f"{node.for_get_init().to_C_str()} {node.for_get_cond().to_C_str()}"
        if mine & names(bounds) - {it} and loop_key(node) in self.tiles:
            return f"the tiled parallel loop over {it} has bounds naming the band's iterators"
        return None

    def _band(self, band: list, body, path, why=None):
        """The grid-stride loop over the band's instances running `body`, then the grid
        barrier; with no band (a subtree without parallel loops), block 0 runs it."""
        return self._bands([(band, body, [], why)], path)

    def _bands(self, parts: list, path):
        """One grid-stride loop over the instances of several bands that may run at once
        (parts: (band, body, uniform guards, why)), one after the other in the flat index,
        then the grid barrier."""
        head, runs, mosts = [], [], []
        for k, (band, body, conds, why) in enumerate(parts):
            code = to_cgen(body, [False] * len(self.parallel), self.statement, lambda loop, info: loop,
                           tiles=self.tiles, tile=self._tile(band))
            inst = cgen.Block(([cgen.Comment(why)] if why else []) + [code])
            self.instance_bodies.append(inst)
            called = {c for c, _ in call_loops(body)}
            counts, decode, guards = self._flatten(band, path, called, k)
            head += counts
            total = " * ".join(f"ft_n{k}_{d}" for d in range(len(band))) or "1"
            if conds:
                total = f"({' && '.join(conds)}) ? {total} : 0"
            head.append(cgen.Line(f"const long ft_t{k} = {total};"))
            runs.append(decode + [cgen.If(" && ".join(f"({g})" for g in guards), inst) if guards else inst])
            mosts.append(self._most(band, path, called) if band else "1")
            tiled = next((d for d, lp in enumerate(band) if loop_key(lp) in self.tiles), None)
            self.bands.append(Band([level(lp) for lp in band], called, None, self._depth(band, path), tiled))
        most = None if None in mosts else " + ".join(mosts)
        for b in self.bands[-len(parts):]:  # they run at once: the blocks they use add up
            b.most = most
        chain = cgen.Block(runs[-1])
        for k in reversed(range(len(parts) - 1)):
            chain = cgen.Block([cgen.If(f"ft_r < ft_t{k}", cgen.Block(runs[k]),
                                        cgen.Block([cgen.Line(f"ft_r -= ft_t{k};")] + chain.contents))])
        total = " + ".join(f"ft_t{k}" for k in range(len(parts)))
        loop = cgen.For("long ft_f = blockIdx.x", f"ft_f < {total}", "ft_f += gridDim.x",
                        cgen.Block([cgen.Line("long ft_r = ft_f;")] + chain.contents))
        self.syncs.append(list(self._around))
        return cgen.Block(head + [loop, cgen.Statement("ft_grid_sync()")])

    def _flatten(self, band, path, called, k) -> tuple:
        """(count lines, decode lines, guards) of part k's band: its instance `ft_r` (less than
        the product of its counts `ft_n<k>_<d>`) as the band's iterators, the innermost
        varying fastest; a dim whose bounds name another of the band's over its bounding box,
        with the loop's bounds as a guard; a tiled dim by tiles, with its count `<it>_n`."""
        mine = {lp.for_get_iterator().get_id().get_name() for lp in band}
        counts, decode, guards = [], [], []
        for d, lp in enumerate(band):
            it = lp.for_get_iterator().get_id().get_name()
            init, cond = lp.for_get_init(), lp.for_get_cond()
            hi, inclusive = upper_bound(lp)
            if (mine - {it}) & names(f"{init.to_C_str()} {cond.to_C_str()}"):
                lo_c, hi_c = self._box(band, path, called, d)
                guards.append(f"{init.to_C_str()} <= {it} && {cond.to_C_str()}")
                trips = f"({hi_c}) - ({lo_c}) + 1"
            else:
                lo_c = init.to_C_str()
                trips = f"({hi.to_C_str()}) - ({lo_c}){' + 1' if inclusive else ''}"
            n = f"ft_n{k}_{d}"
            tiled = loop_key(lp) in self.tiles
            counts.append(cgen.Line(f"const long {n} = "
                                    + (f"(max(0L, {trips}) + {self.tb - 1}) / {self.tb};" if tiled else f"max(0L, {trips});")))
            lines = [cgen.Line(f"const long {it} = ({lo_c}) + (ft_r % {n}){f' * {self.tb}' if tiled else ''}; "
                               f"ft_r /= {n};")]
            if tiled:
                lines.append(cgen.Line(f"const long {it}_n = min({self.tb}L, ({hi.to_C_str()}) - {it}"
                                       f"{' + 1' if inclusive else ''});"))
            decode[:0] = lines
        return counts, decode, guards

    def _concurrent(self, band: list, nodes: list, path) -> list | None:
        """The parts (as `_bands` takes them) running `nodes`, each under `band`, at once, or
        None: the nodes' statement instances must agree on every time dim before one where
        each node's are one constant, a different one per node, and that dim must be
        parallel (no dependence between them); each node's own parallel loops join its part,
        its uniform guards count its instances, and nothing left in it is parallel."""
        if len(nodes) < 2 or not self._independent(band, nodes, path):
            return None
        parts = []
        for node in nodes:
            b, conds = band, []
            while True:
                mine = {lp.for_get_iterator().get_id().get_name() for lp in b}
                t = node.get_type()
                if t == isl.ast_node_type.mark:
                    node = node.mark_get_node()
                elif t == isl.ast_node_type.if_ and not node.if_has_else_node() and \
                        not mine & names(node.if_get_cond().to_C_str()):
                    conds.append(f"({node.if_get_cond().to_C_str()})")
                    node = node.if_get_then_node()
                elif t == isl.ast_node_type.for_ and self.parallel[level(node)] and self._unmappable(b, node) is None:
                    b, node = b + [node], node.for_get_body()
                else:
                    break
            if has_parallel(node, self.parallel):
                return None
            parts.append((b, node, conds, None))
        return parts

    def _independent(self, band, nodes, path) -> bool:
        """Whether `nodes` (inside the loops of `band` and `path`) are told apart by a parallel
        time dim of constants (`_concurrent`)."""
        around = set(path) | {level(lp) for lp in band}
        times = []
        for node in nodes:
            t = None
            for name in {c for c, _ in call_loops(node)}:
                r = self.schedule.per_statement[name].range()
                t = r if t is None else t.union(r)
            if t is None:
                return False
            times.append(t.coalesce())
        for d in range(times[0].dim(isl.dim_type.set)):
            if d in around:
                continue
            values = []
            for t in times:
                lo, hi = t.dim_min_val(d), t.dim_max_val(d)
                if not (lo.is_int() and hi.is_int() and lo.eq(hi)):
                    return False
                values.append(lo.to_python())
            if len(set(values)) > 1:
                return self.parallel[d] and len(set(values)) == len(values)
        return False

    @staticmethod
    def _depth(band, path) -> int:
        """How many time dims one instance of the band fixes (Band.depth)."""
        return 1 + max([level(lp) for lp in band] + path, default=-1)

    def _tile(self, band):
        """(iterator, count) of the band's tiled loop, as to_cgen takes a tile; None."""
        for lp in band:
            if loop_key(lp) in self.tiles:
                it = lp.for_get_iterator().get_id().get_name()
                return it, f"{it}_n"
        return None

    # -- bounds by ISL -------------------------------------------------------------------
    def _instances(self, band, path, called) -> isl.Set:
        """The time vectors of the statements a band's instances call, on the band's dims,
        the dims of the loops around it (`path`) as the last parameters, each named after its
        loop's iterator: a superset of the band's own instances where the AST splits a
        statement's domain, which only enlarges a box."""
        times = None
        for name in sorted(called):
            t = self.schedule.per_statement[name].range()
            times = t if times is None else times.union(t)
        times = times.coalesce().intersect_params(self.context)
        for d in range(times.dim(isl.dim_type.set)):
            times = times.set_dim_name(isl.dim_type.set, d, f"c{d}")
        mine = [level(lp) for lp in band]
        for d in reversed(range(times.dim(isl.dim_type.set))):
            if d in path:
                times = times.move_dims(isl.dim_type.param, times.dim(isl.dim_type.param), isl.dim_type.set, d, 1)
            elif d not in mine:
                times = times.project_out(isl.dim_type.set, d, 1)
        return times

    def _box(self, band, path, called, d) -> tuple:
        """C (lower, upper) bounds of band loop d over its instances, for the values of the
        loops around."""
        s = self._instances(band, path, called)
        build = isl.AstBuild.from_context(isl.Set.universe(s.get_space().params()))
        return tuple(build.expr_from_pw_aff(b.coalesce()).to_C_str() for b in (s.dim_min(d), s.dim_max(d)))

    def _most(self, band, path, called) -> str | None:
        """Python: at most how many instances the band has at once, over every value of the loops
        around it (the product of each flattened dim's widest extent), None if unbounded."""
        s = self._instances(band, path, called)
        outer = len(path)
        m = isl.Map.from_range(s).move_dims(isl.dim_type.in_, 0, isl.dim_type.param,
                                            s.dim(isl.dim_type.param) - outer, outer)
        build = isl.AstBuild.from_context(isl.Set.universe(m.get_space().params()))
        n = m.dim(isl.dim_type.out)
        factors = []
        for d, lp in enumerate(band):
            one = m.project_out(isl.dim_type.out, d + 1, n - d - 1).project_out(isl.dim_type.out, 0, d)
            try:
                width = one.reverse().apply_range(one).deltas().dim_max(0).coalesce()
                e = f"({py_expr(build.expr_from_pw_aff(width))} + 1)"
            except (isl.Error, NotImplementedError):
                return None
            factors.append(f"-(-max(0, {e}) // {self.tb})" if loop_key(lp) in self.tiles else f"max(0, {e})")
        return " * ".join(factors)


def _block(node):
    return node if isinstance(node, cgen.Block) else cgen.Block([node])
