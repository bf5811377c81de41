"""The schedule as an ISL AST, translated into cgen nodes (loops, guards, blocks, calls).

Loop iterators are ISL's `c<k>`: loop k scans time dim k of the schedule, so the schedule's
per-dim parallel flags say which loops carry no dependence. The outermost parallel loop of
a nest is handed to the target (`parallel_for`) to mark; statements become calls
`S_name(args)` whose arguments are the statement's iteration vector in terms of the loops.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import cgen
import islpy as isl


def build_ast(schedule_map: isl.UnionMap, context: isl.Set) -> isl.AstNode:
    build = isl.AstBuild.from_context(context.params() if not context.is_params() else context)
    return build.node_from_schedule_map(schedule_map)


def children(node):
    """The nodes of a block node, in order."""
    lst = node.block_get_children()
    return [lst.get_at(i) for i in range(lst.n_ast_node())]


def below(node) -> list:
    """The nodes directly below `node`: a block's children, a loop's body, a guard's branches,
    a mark's node."""
    t = node.get_type()
    if t == isl.ast_node_type.block:
        return children(node)
    if t == isl.ast_node_type.for_:
        return [node.for_get_body()]
    if t == isl.ast_node_type.if_:
        return [node.if_get_then_node()] + ([node.if_get_else_node()] if node.if_has_else_node() else [])
    if t == isl.ast_node_type.mark:
        return [node.mark_get_node()]
    return []


def to_cgen(node: isl.AstNode, parallel: list, statement, parallel_for, inside_parallel=False,
            tiles=(), tile=None, split=None, serial=None):
    """cgen for `node`. `statement(name, [C arg exprs], tile)` gives a statement's code;
    `parallel_for(loop, ParallelLoop)` wraps a parallel loop (e.g. with an OpenMP pragma).
    Loops whose text is in `tiles` (loop -> tile size, from `tileable_loops`) advance a
    tile at a time; statements inside get `tile = (argument position, C count)`. With
    `split` (a C function name), a tiled loop that is itself the parallel one advances by
    `split(iterations, tile size, 1)` instead, computed when the loop starts: the target narrows
    tiles so that every thread gets one (16 iterations in tiles of 16 are one thread's work).
    A parallel loop whose body is a tiled parallel loop with bounds of its own (a wavefront
    step over layers, a batch tiled inside) becomes one loop over (outer iteration, tile),
    tiles `split(inner iterations, tile size, outer iterations)` wide: a step with fewer
    layers than threads still keeps them all busy.
    With `serial`, the code of each largest subtree outside parallel loops that has none
    inside goes through `serial(code)` (one thread of a parallel region runs it)."""
    if serial is not None and not inside_parallel and not has_parallel(node, parallel):
        return serial(to_cgen(node, parallel, statement, parallel_for, inside_parallel, tiles, tile, split))

    def sub(n, inside=inside_parallel, tl=tile):
        return to_cgen(n, parallel, statement, parallel_for, inside, tiles, tl, split, serial)
    t = node.get_type()
    if t == isl.ast_node_type.block:
        return cgen.Block([sub(c) for c in children(node)])
    if t == isl.ast_node_type.for_:
        it = node.for_get_iterator().get_id().get_name()
        level = int(it[1:])
        par = parallel[level] and not inside_parallel
        first = node.for_get_init().to_C_str()
        init = f"long {it} = {first}"
        hi, inclusive = upper_bound(node)
        n = f"{hi.to_C_str()} - ({first}){' + 1' if inclusive else ''}" if hi is not None else None
        inner = node.for_get_body()
        if par and split and n is not None and loop_key(node) not in tiles and _tiled_inside(node, inner, parallel,
                                                                                               tiles):
            return _flattened(node, inner, n, tiles[loop_key(inner)], split, parallel_for,
                              lambda b, tl: sub(b, True, tl))
        if tiles and loop_key(node) in tiles:
            size = tiles[loop_key(node)]
            left = f"{hi.to_C_str()} - {it}{' + 1' if inclusive else ''}"  # iterations from it on
            count = f"{it}_n"
            step = f"{it}_w" if par and split else size
            body = [cgen.Line(f"const long {count} = min({step}, {left});"),
                    sub(node.for_get_body(), inside_parallel or par, (it, count))]
            loop = cgen.For(init, node.for_get_cond().to_C_str(), f"{it} += {step}", cgen.Block(body))
            if par and split:
                width = f"{split}({n}, {size}, 1)"
                return cgen.Block([cgen.Line(f"const long {step} = {width};"),
                                   parallel_for(loop, ParallelLoop(node, f"({n} + {step} - 1) / {step}", step))])
        else:
            step = 1
            body = sub(node.for_get_body(), inside_parallel or par)
            loop = cgen.For(init, node.for_get_cond().to_C_str(), f"{it} += {node.for_get_inc().to_C_str()}",
                            _block(body))
            if node.for_get_inc().to_C_str() != "1":
                n = None
        return parallel_for(loop, ParallelLoop(node, n, step)) if par else loop
    if t == isl.ast_node_type.if_:
        then = _block(sub(node.if_get_then_node()))
        other = _block(sub(node.if_get_else_node())) if node.if_has_else_node() else None
        return cgen.If(node.if_get_cond().to_C_str(), then, other)
    if t == isl.ast_node_type.user:
        name, args = _call(node)
        return statement(name, args, (args.index(tile[0]), tile[1]) if tile else None)
    if t == isl.ast_node_type.mark:
        return sub(node.mark_get_node())
    raise NotImplementedError(f"ISL AST node {t}")


@dataclass(frozen=True)
class ParallelLoop:
    """What a target may want to know of a parallel loop it marks: the ISL node whose
    iterations the C loop runs, the C expression of the C loop's trip count (None when the
    bounds do not say), and how many of the node's iterations one trip runs (an int, or a C
    name: a tile's width)."""
    node: isl.AstNode
    trips: str | None
    step: object


def _tiled_inside(outer, inner, parallel: list, tiles) -> bool:
    """Whether `inner`, the whole body of parallel loop `outer`, is a tiled parallel loop
    whose bounds do not depend on `outer`'s iterator (so the two flatten into one loop)."""
    if inner.get_type() != isl.ast_node_type.for_ or not parallel[level(inner)] or loop_key(inner) not in tiles:
        return False
    hi, _ = upper_bound(inner)
    it = outer.for_get_iterator().get_id().get_name()
    return hi is not None and not ({it} & (_ids(hi) | _ids(inner.for_get_init())))


def _ids(e: isl.AstExpr) -> set:
    if e.get_type() == isl.ast_expr_type.id:
        return {e.get_id().get_name()}
    if e.get_type() == isl.ast_expr_type.op:
        return set().union(*(_ids(e.get_op_arg(k)) for k in range(e.get_op_n_arg())))
    return set()


def _flattened(outer, inner, n, size, split, parallel_for, body) -> cgen.Block:
    """Parallel loop `outer` (n iterations) around tiled parallel loop `inner` as one loop
    over (outer iteration, tile of inner): `it_m` outer iterations times `jt_t` tiles of
    `jt_w = split(inner iterations, size, it_m)`; each trip sets both iterators and the
    tile's count `jt_n` (the last tile may be short), then runs `body(inner's body, tile)`."""
    it, jt = (f.for_get_iterator().get_id().get_name() for f in (outer, inner))
    hi, inclusive = upper_bound(inner)
    first = inner.for_get_init().to_C_str()
    m = f"({hi.to_C_str()} - ({first}){' + 1' if inclusive else ''})"
    k = f"{it}_{jt}"
    head = [cgen.Line(f"const long {it}_m = max(0, {n});"),
            cgen.Line(f"const long {jt}_w = {split}({m}, {size}, {it}_m);"),
            cgen.Line(f"const long {jt}_t = max(0, ({m} + {jt}_w - 1) / {jt}_w);")]
    trip = [cgen.Line(f"const long {it} = {outer.for_get_init().to_C_str()} + {k} / {jt}_t;"),
            cgen.Line(f"const long {jt} = {first} + ({k} % {jt}_t) * {jt}_w;"),
            cgen.Line(f"const long {jt}_n = min({jt}_w, {hi.to_C_str()} - {jt}{' + 1' if inclusive else ''});"),
            body(inner.for_get_body(), (jt, f"{jt}_n"))]
    loop = cgen.For(f"long {k} = 0", f"{k} < {it}_m * {jt}_t", f"{k} += 1", cgen.Block(trip))
    return cgen.Block(head + [parallel_for(loop, ParallelLoop(inner, f"{it}_m * {jt}_t", f"{jt}_w"))])


def has_parallel(node, parallel: list) -> bool:
    """Whether a loop over a parallel time dim is at or below `node`."""
    if node.get_type() == isl.ast_node_type.for_ and parallel[level(node)]:
        return True
    return any(has_parallel(k, parallel) for k in below(node))


_PY_OPS = {isl.ast_expr_op_type.add: "+", isl.ast_expr_op_type.sub: "-", isl.ast_expr_op_type.mul: "*",
           isl.ast_expr_op_type.div: "//", isl.ast_expr_op_type.fdiv_q: "//",
           isl.ast_expr_op_type.pdiv_q: "//", isl.ast_expr_op_type.pdiv_r: "%",
           isl.ast_expr_op_type.zdiv_r: "%", isl.ast_expr_op_type.le: "<=", isl.ast_expr_op_type.lt: "<",
           isl.ast_expr_op_type.ge: ">=", isl.ast_expr_op_type.gt: ">", isl.ast_expr_op_type.eq: "==",
           isl.ast_expr_op_type.and_: "and", isl.ast_expr_op_type.and_then: "and",
           isl.ast_expr_op_type.or_: "or", isl.ast_expr_op_type.or_else: "or"}


def py_expr(e: isl.AstExpr) -> str:
    """An ISL AST expression as Python."""
    t = e.get_type()
    if t == isl.ast_expr_type.id:
        return e.get_id().get_name()
    if t == isl.ast_expr_type.int:
        return str(e.get_val().to_python())
    op = e.get_op_type()
    args = [py_expr(e.get_op_arg(k)) for k in range(e.get_op_n_arg())]
    if op in _PY_OPS:
        return "(" + f" {_PY_OPS[op]} ".join(args) + ")"
    if op == isl.ast_expr_op_type.minus:
        return f"(-{args[0]})"
    if op in (isl.ast_expr_op_type.min, isl.ast_expr_op_type.max):
        return f"{'min' if op == isl.ast_expr_op_type.min else 'max'}({', '.join(args)})"
    if op in (isl.ast_expr_op_type.select, isl.ast_expr_op_type.cond):
        return f"({args[1]} if {args[0]} else {args[2]})"
    raise NotImplementedError(f"ISL AST operation {op} in a host loop")


_INT_OPS = {isl.ast_expr_op_type.add: lambda a, b: a + b, isl.ast_expr_op_type.sub: lambda a, b: a - b,
            isl.ast_expr_op_type.mul: lambda a, b: a * b, isl.ast_expr_op_type.div: lambda a, b: a // b,
            isl.ast_expr_op_type.fdiv_q: lambda a, b: a // b, isl.ast_expr_op_type.pdiv_q: lambda a, b: a // b,
            isl.ast_expr_op_type.pdiv_r: lambda a, b: a % b, isl.ast_expr_op_type.minus: lambda a: -a,
            isl.ast_expr_op_type.min: min, isl.ast_expr_op_type.max: max}


def evaluate(e: isl.AstExpr, values: dict) -> int | None:
    """An integer ISL AST expression at `values` (name -> int); None where it names others
    (a loop iterator, a length not given) or uses an operation it does not know."""
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return int(e.get_val().to_python())
    if t == isl.ast_expr_type.id:
        return values.get(e.get_id().get_name())
    fn = _INT_OPS.get(e.get_op_type())
    args = [evaluate(e.get_op_arg(k), values) for k in range(e.get_op_n_arg())]
    return None if fn is None or None in args else fn(*args)


def call_name(node) -> str:
    """The statement a user node calls."""
    return _call(node)[0]


def _call(node):
    expr = node.user_get_expr()
    return (expr.get_op_arg(0).get_id().get_name(),
            [expr.get_op_arg(k).to_C_str() for k in range(1, expr.get_op_n_arg())])


def names(expr: str) -> set:
    """The identifiers in a C expression."""
    return set(re.findall(r"[A-Za-z_]\w*", expr))


def upper_bound(node) -> tuple:
    """(ISL expression e, inclusive) of a loop's upper bound `it <= e` / `it < e`, else
    (None, None)."""
    it = node.for_get_iterator().get_id().get_name()
    cond = node.for_get_cond()
    first = cond.get_op_arg(0)
    if first.get_type() == isl.ast_expr_type.id and first.get_id().get_name() == it:
        if cond.get_op_type() in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt):
            return cond.get_op_arg(1), cond.get_op_type() == isl.ast_expr_op_type.le
    return None, None


def tileable_loops(node: isl.AstNode, parallel: list, size, benefit, allowed=None) -> dict:
    """Loops to run a tile at a time: loop -> tile size (`size([(statement, argument
    position)])` of the statements under the loop). A candidate is a parallel loop (unit
    stride, a plain upper bound) under which every statement gets the loop's iterator as a
    plain argument and no bound or guard uses it; on each path at most one is chosen, the
    one whose statements gain most (`benefit(statement, argument position)`, e.g. the work of
    matmuls whose right matrix the tile shares), the innermost among equals; never one where
    `allowed(statement, argument position)` says no.
    A parallel loop carries no dependence, so running its body for a tile of iterations
    statement by statement (and sinking it below inner loops) keeps every dependence."""
    def calls(n):
        if n.get_type() == isl.ast_node_type.user:
            return [_call(n)]
        return [c for k in below(n) for c in calls(k)]

    def control(n):
        """The loop bounds and guards below n (a tiled iterator must not appear in them)."""
        t = n.get_type()
        own = [n.for_get_init().to_C_str(), n.for_get_cond().to_C_str()] if t == isl.ast_node_type.for_ else \
            [n.if_get_cond().to_C_str()] if t == isl.ast_node_type.if_ else []
        return own + [e for k in below(n) for e in control(k)]

    def visit(n) -> tuple:
        """(chosen loops below or at n, their total benefit)."""
        chosen, gain = {}, 0
        for k in below(n):
            c, g = visit(k)
            chosen.update(c)
            gain += g
        if n.get_type() != isl.ast_node_type.for_:
            return chosen, gain
        it = n.for_get_iterator().get_id().get_name()
        body = n.for_get_body()
        if not parallel[int(it[1:])] or n.for_get_inc().to_C_str() != "1" or upper_bound(n)[0] is None \
                or it in names(" ".join(control(body))):
            return chosen, gain
        here = calls(body)
        if not all(args.count(it) == 1 and not any(it in names(a) for a in args if a != it)
                   and (allowed is None or allowed(name, args.index(it))) for name, args in here):
            return chosen, gain
        mine = sum(benefit(name, args.index(it)) for name, args in here)
        if mine > gain or not chosen:
            return {loop_key(n): size([(name, args.index(it)) for name, args in here])}, mine
        return chosen, gain
    return visit(node)[0]


def call_loops(node, loops=()) -> list:
    """(statement name, the for-nodes around the call, outermost first) for every call."""
    if node.get_type() == isl.ast_node_type.user:
        return [(_call(node)[0], list(loops))]
    inner = loops + (node,) if node.get_type() == isl.ast_node_type.for_ else loops
    return [c for k in below(node) for c in call_loops(k, inner)]


def level(loop) -> int:
    """The time dim a for-node scans (its iterator c<k>)."""
    return int(loop.for_get_iterator().get_id().get_name()[1:])


def loop_key(node) -> str:
    """Which loop: ISL reuses iterator names across sibling nests, so a loop is named by its
    whole text (what decides whether it can be tiled is all in it)."""
    return node.to_C_str()


def _block(node):
    return node if isinstance(node, cgen.Block) else cgen.Block([node])
