"""Sequential steps as the generated C code runs them (`Schedule.steps_as_run`).

The C target (emit/c_target.py, through emit/isl_ast.py `to_cgen`) generates the schedule's
ISL AST and puts OpenMP on the *outermost* parallel loop of each nest only: a loop at time dim
k runs its iterations at once when `parallel[k]` and no enclosing loop already does; every
other loop, inner parallel ones included, runs its iterations one after the other inside a
thread. This module walks that same AST (built as `emit.isl_ast.build_ast` builds it) at the
concrete sizes and counts, in **statement instances** (the unit of `Schedule.sequential_steps`
and of the critical path, deps/critical.py), the longest sequence one thread runs, with
unlimited threads:

* a statement call counts 1; a block or a sequential loop, the sum of its parts;
* an OpenMP loop, the most any one iteration takes (its iterations run at once);
* a guard, its taken branch.

Tiling (`emit.isl_ast.tileable_loops`: a parallel loop advancing TILE iterations per call)
does not change the count: a tile's instances are one thread's work, run in one call, so they
count one each, as untiled. Nor does flattening an OpenMP loop with the tiled loop inside it
into one loop over (iteration, tile) (`emit.isl_ast`): the inner loop counts as run inside a
thread, as if in one tile. The CUDA target's kernels are not modelled.

Loops whose body's bounds and guards do not use the loop's iterator are counted without
iterating the body (its cost is the same every iteration), so the walk is quick even at the
paper's sizes.
"""
from __future__ import annotations

import islpy as isl

from polyft.deps.model import PolyModel

_OP = isl.ast_expr_op_type


def build_ast(schedule_map: isl.UnionMap, context: isl.Set) -> isl.AstNode:
    """The schedule's ISL AST, as the targets build it (emit.isl_ast.build_ast)."""
    build = isl.AstBuild.from_context(context.params() if not context.is_params() else context)
    return build.node_from_schedule_map(schedule_map)


def steps_as_run(model: PolyModel, schedule_map: isl.UnionMap, parallel: list) -> int | None:
    """Statement instances on the longest sequence one thread runs in the C target's code for
    the schedule (module docstring); None while a length is symbolic."""
    if any(p not in model.sizes for p in model.params):
        return None
    tree = _compile(build_ast(schedule_map, model.context))
    return tree.cost(dict(model.sizes), parallel, False)


# ---------------------------------------------------------------------------------------
# The AST as Python: control expressions compiled to closures, with the ids each subtree's
# bounds and guards use.


def _expr(e: isl.AstExpr):
    """(env -> int, ids used) for an ISL AST expression."""
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        v = e.get_val().to_python()
        return (lambda env: v), frozenset()
    if t == isl.ast_expr_type.id:
        name = e.get_id().get_name()
        return (lambda env: env[name]), frozenset([name])
    op = e.get_op_type()
    args = [_expr(e.get_op_arg(k)) for k in range(e.get_op_n_arg())]
    fs = [f for f, _ in args]
    used = frozenset().union(*(u for _, u in args))
    a = fs[0]
    b = fs[1] if len(fs) > 1 else None
    if op == _OP.max:
        return (lambda env: max(f(env) for f in fs)), used
    if op == _OP.min:
        return (lambda env: min(f(env) for f in fs)), used
    if op == _OP.minus:
        return (lambda env: -a(env)), used
    if op == _OP.add:
        return (lambda env: a(env) + b(env)), used
    if op == _OP.sub:
        return (lambda env: a(env) - b(env)), used
    if op == _OP.mul:
        return (lambda env: a(env) * b(env)), used
    if op in (_OP.div, _OP.fdiv_q, _OP.pdiv_q):  # exact, floor, non-negative numerator
        return (lambda env: a(env) // b(env)), used
    if op == _OP.pdiv_r:
        return (lambda env: a(env) % b(env)), used
    if op == _OP.zdiv_r:  # C's %: the sign of the dividend
        def zdiv_r(env):
            x, y = a(env), b(env)
            r = abs(x) % abs(y)
            return -r if x < 0 else r
        return zdiv_r, used
    if op in (_OP.and_, _OP.and_then):
        return (lambda env: int(bool(a(env)) and bool(b(env)))), used
    if op in (_OP.or_, _OP.or_else):
        return (lambda env: int(bool(a(env)) or bool(b(env)))), used
    if op in (_OP.cond, _OP.select):
        c = fs[2]
        return (lambda env: b(env) if a(env) else c(env)), used
    compare = {_OP.eq: lambda x, y: x == y, _OP.le: lambda x, y: x <= y, _OP.lt: lambda x, y: x < y,
               _OP.ge: lambda x, y: x >= y, _OP.gt: lambda x, y: x > y}
    if op in compare:
        cmp = compare[op]
        return (lambda env: int(cmp(a(env), b(env)))), used
    raise NotImplementedError(f"ISL AST expression {e.to_C_str()}")


class _Call:
    uses = frozenset()

    def cost(self, env, parallel, inside):
        return 1


class _Block:
    def __init__(self, parts):
        self.parts = parts
        self.uses = frozenset().union(*(p.uses for p in parts))

    def cost(self, env, parallel, inside):
        return sum(p.cost(env, parallel, inside) for p in self.parts)


class _If:
    def __init__(self, cond, then, other):
        (self.cond, used), self.then, self.other = cond, then, other
        self.uses = used | then.uses | (other.uses if other else frozenset())

    def cost(self, env, parallel, inside):
        if self.cond(env):
            return self.then.cost(env, parallel, inside)
        return self.other.cost(env, parallel, inside) if self.other else 0


class _For:
    def __init__(self, it, init, cond, inc, body):
        self.it, self.level, self.body = it, int(it[1:]), body
        (self.init, u1), (self.cond, u2), (self.inc, u3) = init, cond, inc
        self.uses = (u1 | u2 | u3 | body.uses) - {it}

    def cost(self, env, parallel, inside):
        par = parallel[self.level] and not inside  # to_cgen's rule: OpenMP on the outermost only
        env = dict(env)
        env[self.it] = self.init(env)
        same = self.it not in self.body.uses  # the body costs the same every iteration
        total, once = 0, None
        while self.cond(env):
            if not same or once is None:
                once = self.body.cost(env, parallel, inside or par)
            total = max(total, once) if par else total + once
            env[self.it] += self.inc(env)
        return total


def _compile(node: isl.AstNode):
    t = node.get_type()
    if t == isl.ast_node_type.block:
        lst = node.block_get_children()
        return _Block([_compile(lst.get_at(k)) for k in range(lst.n_ast_node())])
    if t == isl.ast_node_type.for_:
        return _For(node.for_get_iterator().get_id().get_name(), _expr(node.for_get_init()),
                    _expr(node.for_get_cond()), _expr(node.for_get_inc()), _compile(node.for_get_body()))
    if t == isl.ast_node_type.if_:
        other = _compile(node.if_get_else_node()) if node.if_has_else_node() else None
        return _If(_expr(node.if_get_cond()), _compile(node.if_get_then_node()), other)
    if t == isl.ast_node_type.user:
        return _Call()
    if t == isl.ast_node_type.mark:
        return _compile(node.mark_get_node())
    raise NotImplementedError(f"ISL AST node {t}")
