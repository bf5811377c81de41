"""The schedule as an ISL AST, translated into cgen nodes (loops, guards, blocks, calls).

Loop iterators are ISL's `c<k>`: loop k scans time dim k of the schedule, so the schedule's
per-dim parallel flags say which loops carry no dependence. The outermost parallel loop of
a nest is handed to the target (`parallel_for`) to mark; statements become calls
`S_name(args)` whose arguments are the statement's iteration vector in terms of the loops.
"""
from __future__ import annotations

import cgen
import islpy as isl


def build_ast(schedule_map: isl.UnionMap, context: isl.Set) -> isl.AstNode:
    build = isl.AstBuild.from_context(context.params() if not context.is_params() else context)
    return build.node_from_schedule_map(schedule_map)


def _children(node):
    lst = node.block_get_children()
    return [lst.get_at(i) for i in range(lst.n_ast_node())]


def to_cgen(node: isl.AstNode, parallel: list, statement, parallel_for, inside_parallel=False):
    """cgen for `node`. `statement(name, [C arg exprs])` gives a statement's code;
    `parallel_for(loop)` wraps a parallel loop (e.g. with an OpenMP pragma)."""
    t = node.get_type()
    if t == isl.ast_node_type.block:
        return cgen.Block([to_cgen(c, parallel, statement, parallel_for, inside_parallel)
                           for c in _children(node)])
    if t == isl.ast_node_type.for_:
        it = node.for_get_iterator().get_id().get_name()
        level = int(it[1:])
        par = parallel[level] and not inside_parallel
        body = to_cgen(node.for_get_body(), parallel, statement, parallel_for, inside_parallel or par)
        loop = cgen.For(f"long {it} = {node.for_get_init().to_C_str()}", node.for_get_cond().to_C_str(),
                        f"{it} += {node.for_get_inc().to_C_str()}", _block(body))
        return parallel_for(loop) if par else loop
    if t == isl.ast_node_type.if_:
        then = _block(to_cgen(node.if_get_then_node(), parallel, statement, parallel_for, inside_parallel))
        other = (_block(to_cgen(node.if_get_else_node(), parallel, statement, parallel_for, inside_parallel))
                 if node.if_has_else_node() else None)
        return cgen.If(node.if_get_cond().to_C_str(), then, other)
    if t == isl.ast_node_type.user:
        expr = node.user_get_expr()
        name = expr.get_op_arg(0).get_id().get_name()
        args = [expr.get_op_arg(k).to_C_str() for k in range(1, expr.get_op_n_arg())]
        return statement(name, args)
    if t == isl.ast_node_type.mark:
        return to_cgen(node.mark_get_node(), parallel, statement, parallel_for, inside_parallel)
    raise NotImplementedError(f"ISL AST node {t}")


def _block(node):
    return node if isinstance(node, cgen.Block) else cgen.Block([node])
