"""polyft.pytree: the one set of tree helpers (tuples of leaves) that eager, tracing and operators share."""
import numpy as np

from polyft import pytree


def test_leaves_structure_and_unflatten_round_trip():
    a, b, c = np.zeros(1), np.ones(2), np.full(3, 2.0)
    tree = (a, (b, c))
    assert [x is y for x, y in zip(pytree.leaves(tree), (a, b, c))] == [True] * 3
    assert pytree.structure(tree) == (None, (None, None))
    rebuilt = pytree.unflatten(pytree.structure(tree), pytree.leaves(tree))
    assert rebuilt[0] is a and rebuilt[1][0] is b and rebuilt[1][1] is c
    assert pytree.leaves(a) == [a] and pytree.structure(a) is None


def test_an_empty_tuple_is_a_leaf_not_a_node():
    assert pytree.leaves(()) == [()] and pytree.structure(((), 1)) == (None, None)


def test_map_over_several_trees_and_describe():
    got = pytree.map(lambda x, y: x + y, (1, (2, 3)), (10, (20, 30)))
    assert got == (11, (22, 33))
    assert pytree.describe((1, (2, 3)), lambda x: f"<{x}>") == "(<1>, (<2>, <3>))"
