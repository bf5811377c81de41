"""The CUDA tile library (emit/tiles.cuh) through the emulator: operands shared by several
matmuls of one statement, the GEMMs at shapes with tails, and the workloads at sizes that
need streamed operands. Every result is checked against eager numpy on fresh random data."""
import numpy as np
import pytest

import polyft as ft
from helpers import flist, rand, spec
from polyft.testing import rel_error

pytestmark = pytest.mark.usefixtures("compile_cache")


def _gated(xs, w1, w2):
    return xs.map(lambda x: (x @ w1) * (x @ w2))


def _gated_scan(xs, h0, w1, w2):
    return ft.scanl(lambda h, x: (x @ w1) * (x @ w2) + h, xs, h0)


def test_left_operand_of_two_matmuls_is_staged_once():
    """x @ w1 and x @ w2 read one shared copy of x (they declared two before: a compile error),
    batched over the instances of the map: one, part of a batch, a batch and a tail."""
    w1, w2 = rand((8, 6), 1), rand((8, 6), 2)
    prog = ft.compile(lambda xs: _gated(xs, w1, w2), spec(["N"], [4, 8]), target="cuda-emulated")
    assert prog.source.count("ft::gather_tiles<float, 16, 32>(v") == 1
    for n in (1, 5, 21):
        xs = flist([n], [4, 8], 3 + n)
        assert rel_error(prog(xs), _gated(xs, w1, w2)) < 1e-5


def test_left_operand_of_two_matmuls_unbatched():
    """In a scan's step (no batch) the staged x is also one tile for both products."""
    w1, w2 = rand((8, 8), 4), rand((8, 8), 5)
    xs, h0 = flist([5], [4, 8], 6), rand((4, 8), 7)
    prog = ft.compile(lambda xs, h0: _gated_scan(xs, h0, w1, w2), xs, h0, target="cuda-emulated")
    assert prog.source.count("ft::load_tile(v") == 1
    assert rel_error(prog(xs, h0), _gated_scan(xs, h0, w1, w2)) < 1e-5
