"""polyft.deps.traffic: the Table 7 memory-traffic model, on tiny programs counted by hand.

Tiles are float32[1, 4]: 16 bytes each."""
import islpy as isl
import pytest

import polyft as ft
from polyft.deps.traffic import code_traffic, count, graph_count, traffic
from polyft.errors import PolyftError
from polyft.workloads import WORKLOADS

TILE = ft.spec("[L]float32[1, 4]")


def _reads(tr):
    return {r.access: r for r in tr.reads}


def test_count_boxes_triangles_and_parameters():
    assert count(isl.Set("{ S[i, j] : 0 <= i < 4 and 0 <= j < 7 }")) == 28
    assert count(isl.Set("{ S[i, j] : 0 <= i < 4 and 0 <= j <= i }")) == 10  # enumerated
    big = isl.Set("[N] -> { S[i, j] : 0 <= i < N and 0 <= j <= i }")
    assert count(big, {"N": 1000}) == 500500  # too big to enumerate at once: split along i
    assert count(isl.Set("{ S[i] : 0 <= i < 10 and i mod 3 = 0 }")) == 4
    assert count(isl.Set("{ S[i] : 0 <= i < 3 or 5 <= i < 6 }")) == 4
    assert count(isl.Set("{ S[i] : 1 = 0 }")) == 0


def test_slice_is_a_view_prefix_is_direct():
    # out[i] = xs[i + 1] + xs[i], L = 5: 4 instances
    tr = traffic(ft.trace(lambda xs: ft.map(lambda a, b: a + b, xs[1:], xs[:-1]), TILE), {"L": 5})
    r = _reads(tr)
    assert (r["xs[i + 1]"].kind, r["xs[i + 1]"].source_tiles, r["xs[i + 1]"].view_tiles) == ("slice", 4, 4)
    assert (r["xs[i]"].kind, r["xs[i]"].source_tiles, r["xs[i]"].view_tiles) == ("direct", 4, 0)
    # deferred: 4 + 4 tiles read, 4 written; materialised: + the slice's copy written and read
    assert tr.bytes("deferred") == (4 + 4 + 4) * 16
    assert tr.bytes("materialised") == (4 + 4 + 4 + 2 * 4) * 16


def test_window_reads_each_source_tile_once_deferred():
    # shifted_slide(3): 5 x 3 windows over 5 tiles (zeros past the ends)
    fn = lambda xs: xs.shifted_slide(3).map(lambda w: w.map(lambda x: x * 2.0))  # noqa: E731
    tr = traffic(ft.trace(fn, TILE), {"L": 5})
    (r,) = tr.reads
    assert (r.kind, r.instances, r.source_tiles, r.view_tiles) == ("window", 15, 5, 15)
    assert r.deferred_bytes == 5 * 16 and r.materialised_bytes == (5 + 2 * 15) * 16
    assert tr.write_bytes == 15 * 16
    assert tr.bytes("materialised") - tr.bytes("deferred") == 2 * 15 * 16


def test_reduce_state_stays_on_chip_and_only_the_last_state_is_written():
    fn = lambda xs: ft.reduce(lambda s, x: s + x, xs, ft.zeros((1, 4)))  # noqa: E731
    tr = traffic(ft.trace(fn, TILE), {"L": 5})
    kinds = {r.access: r.kind for r in tr.reads}
    assert kinds == {"xs[i]": "direct", "t0[i - 1]": "state", "t0[L - 1]": "result"}
    # read 5 tiles of xs, write the final state, read it back, write the output
    assert [w.tiles for w in tr.writes] == [1, 1]
    assert tr.bytes("deferred") == tr.bytes("materialised") == (5 + 1 + 1 + 1) * 16


def test_broadcast_reads_are_not_views():
    fn = lambda xs, ys: xs.map(lambda x: ys.map(lambda y: x + y))  # noqa: E731
    tr = traffic(ft.trace(fn, ft.spec("[L1]float32[1, 4]"), ft.spec("[L2]float32[1, 4]")), {"L1": 3, "L2": 2})
    r = _reads(tr)
    assert (r["xs[i]"].kind, r["xs[i]"].source_tiles) == ("direct", 3)
    assert (r["ys[j]"].kind, r["ys[j]"].source_tiles) == ("direct", 2)
    assert tr.bytes("deferred") == tr.bytes("materialised") == (3 + 2 + 6) * 16


def test_workloads_views_and_ratios():
    from polyft.experiments.deps_time import lengths
    kinds, ratio = {}, {}
    for name in ("bigbird", "flash_attention", "dilated_rnn", "stacked_lstm"):
        mod = WORKLOADS[name]
        tr = traffic(ft.trace(mod.program, *mod.specs("small")), lengths(name, "small"))
        kinds[name] = {r.kind for r in tr.reads}
        ratio[name] = tr.bytes("materialised") / tr.bytes("deferred")
    assert {"window", "slice", "index"} <= kinds["bigbird"] and ratio["bigbird"] > 1.5
    assert "stride" in kinds["dilated_rnn"] and ratio["dilated_rnn"] > 1
    assert ratio["flash_attention"] == ratio["stacked_lstm"] == 1.0  # no views: nothing to defer


def test_symbolic_lengths_are_refused():
    with pytest.raises(PolyftError, match="concrete lengths"):
        traffic(ft.trace(lambda xs: xs.map(lambda x: x * 2.0), TILE), {})


# -- what the generated code moves: every access of every instance moves its tile ----------

def _code(tr):
    return {(a.kind, a.access): a.pairs for a in tr.accesses}


def test_code_traffic_counts_every_access_of_every_instance():
    # out[i, j] = xs[i] + ys[j], L1 = 3, L2 = 2: 6 instances, each loads x and y and stores one tile
    fn = lambda xs, ys: xs.map(lambda x: ys.map(lambda y: x + y))  # noqa: E731
    etdg = ft.trace(fn, ft.spec("[L1]float32[1, 4]"), ft.spec("[L2]float32[1, 4]"))
    tr = code_traffic(etdg, {"L1": 3, "L2": 2})
    assert _code(tr) == {("read", "xs[i]"): 6, ("read", "ys[j]"): 6, ("write", "out[i, j]"): 6}
    assert tr.bytes() == 18 * 16 and tr.bytes("read") == 12 * 16 and tr.bytes("write") == 6 * 16
    # the ideal cache of Table 7 reads each source tile once: 3 + 2 reads
    assert traffic(etdg, {"L1": 3, "L2": 2}).bytes("deferred") == (3 + 2 + 6) * 16


def test_code_traffic_of_a_window_skips_the_zero_padding():
    # shifted_slide(3) over 5 tiles: 15 instances, the two past the ends read zeros, not xs
    fn = lambda xs: xs.shifted_slide(3).map(lambda w: w.map(lambda x: x * 2.0))  # noqa: E731
    tr = code_traffic(ft.trace(fn, TILE), {"L": 5})
    assert _code(tr) == {("read", "xs[i + j - 1]"): 13, ("write", "out[i, j]"): 15}
    assert tr.bytes() == (13 + 15) * 16


def test_code_traffic_reads_every_state_back():
    # reduce over 5 tiles: each step reads x and (after the first) the previous state, writes
    # its state; the result statement reads the last state and writes the output
    fn = lambda xs: ft.reduce(lambda s, x: s + x, xs, ft.zeros((1, 4)))  # noqa: E731
    tr = code_traffic(ft.trace(fn, TILE), {"L": 5})
    assert _code(tr) == {("read", "xs[i]"): 5, ("read", "t0[i - 1]"): 4, ("write", "t0[i]"): 5,
                         ("read", "t0[L - 1]"): 1, ("write", "out[]"): 1}
    assert tr.bytes() == 16 * 16
    assert tr.by_buffer() == {"xs": 5 * 16, "t0": 10 * 16, "out": 16}
    assert tr.bytes(exclude=("t0",)) == 6 * 16  # were the state kept on chip


def test_code_traffic_of_a_gather_is_one_tile_per_instance():
    import numpy as np
    fn = lambda xs: xs.gather(np.array([4, 0, 0, 2])).map(lambda x: x * 2.0)  # noqa: E731
    tr = code_traffic(ft.trace(fn, TILE), {"L": 5})
    assert _code(tr) == {("read", "xs[t0[i]]"): 4, ("write", "out[i]"): 4}  # not 4 x 5 may-reads


def test_graph_count_is_analytic():
    assert graph_count(isl.Map("{ S[i] -> B[j] : 0 <= i < 3 and 0 <= j <= i }")) == 6  # not a function
    m = isl.Map("[N] -> { S[i, j] -> B[i + j, 2j] : 0 <= i < N and 0 <= j < N }")
    assert graph_count(m, {"N": 10 ** 5}) == 10 ** 10  # counted as a box, never enumerated
    with pytest.raises(PolyftError, match="concrete lengths"):
        code_traffic(ft.trace(lambda xs: xs.map(lambda x: x * 2.0), TILE), {})


def test_code_moves_at_least_the_ideal_cache_plan():
    # on one ETDG: the code reads every tile every time, the deferred plan each distinct tile once
    # (and keeps states on chip), so the code never moves less
    from polyft.experiments.deps_time import lengths
    for name, mod in WORKLOADS.items():
        etdg, sizes = ft.trace(mod.program, *mod.specs("small")), lengths(name, "small")
        assert code_traffic(etdg, sizes).bytes() >= traffic(etdg, sizes).bytes("deferred"), name
