"""Pytrees: the values a user function takes and returns, as a tree of tuples (after JAX's `tree_util`).

A tree is a leaf or a non-empty tuple of trees; leaves are tensors and lists (numpy arrays,
FractalTensors, the tracer's values). An empty tuple holds no value: it is a leaf, which every
consumer rejects as it rejects any other non-value. A zip of lists counts as the tuple of its
lists once `fractaltensor.unzip` has turned it into one.
"""
from __future__ import annotations


def is_node(x) -> bool:
    return isinstance(x, tuple) and len(x) > 0


def leaves(tree) -> list:
    """The leaves, left to right."""
    return [leaf for child in tree for leaf in leaves(child)] if is_node(tree) else [tree]


def structure(tree):
    """The tree's shape without its leaves (hashable): None for a leaf, a tuple of children's."""
    return tuple(structure(child) for child in tree) if is_node(tree) else None


def unflatten(shape, items):
    """The tree of `structure` `shape` whose leaves are `items` (an iterable), in order."""
    return _build(shape, iter(items))


def _build(shape, it):
    """(A function of its own, not a closure over itself: that would be a reference cycle holding
    the items until the garbage collector runs, and a compiled program's output buffers with them.)"""
    return tuple(_build(child, it) for child in shape) if shape is not None else next(it)


def map(f, tree, *rest):
    """The tree of `f(leaf, *same-place leaves of rest)`; the trees in rest have tree's structure."""
    if is_node(tree):
        return tuple(map(f, *children) for children in zip(tree, *rest))
    return f(tree, *rest)


def describe(tree, leaf) -> str:
    """`(a, (b, c))` with each leaf written by `leaf(x)`."""
    if is_node(tree):
        return "(" + ", ".join(describe(child, leaf) for child in tree) + ")"
    return leaf(tree)
