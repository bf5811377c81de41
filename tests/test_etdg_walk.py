"""The ETDG's walker (polyft.etdg: walk, blocks, ops, reads, writes, referenced, access_maps)."""
import numpy as np

import polyft as ft
from polyft.etdg import BlockNode, OpNode, access_maps, blocks, ops, reads, referenced, walk, writes


def test_the_walker_visits_in_program_order_and_names_the_buffers():
    xs = ft.FractalTensor.from_numpy(np.ones((4, 3, 2), np.float32), 2)
    w = np.ones((2, 2), np.float32)

    def program(xss, w):
        ys = xss.map(lambda xs: xs.map(lambda x: x @ w))
        return ys.map(lambda y: y.reduce(lambda s, x: s + x))
    e = ft.trace(program, xs, w)
    nodes = list(walk(e.root))
    assert nodes[0] is e.root and blocks(e.root) == e.blocks() == [n for n in nodes if isinstance(n, BlockNode)]
    assert ops(e.root) == [n for n in nodes if isinstance(n, OpNode)] == [op for st in e.statements for op in st.ops]
    names = lambda bufs: sorted(b.name for b in bufs)  # noqa: E731
    first, second = e.root.body
    assert (names(reads(first)), names(writes(first))) == (["w", "xss"], ["t0"])
    assert (names(reads(second)), names(writes(second))) == (["t0", "t1"], ["out", "t1"])  # t1: the carry
    assert names(referenced(e.root)) == ["out", "t0", "t1", "w", "xss"]
    for st in e.statements:
        for op in st.ops:
            assert [am.kind for am in access_maps(op, st.dims)] == \
                {"load": ["read"] * sum(pc.buffer is not None for pc in op.pieces), "store": ["write"]}.get(op.op, [])
