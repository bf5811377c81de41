"""Analysis and compilation that scale with the program (issue: deep models in seconds).

* Coarsening a chain of n layers checks the whole program O(log n) times (pairs of adjacent
  layers merged a batch at a time), not once a merge, and gives the same schedule.
* The user's captured arrays are buffers the generated code reads at call time, never C
  literals; so are large constants; a scalar stays inline.
* The C target's GEMMs are functions the statements call, one per shape: a statement of many
  layers holds calls, not kernels; so are its permutes, slices, softmaxes and concats.
* The compile_time experiment measures every stage and plots them.
"""
import itertools
import math
import re

import numpy as np
import pandas as pd
import pytest

import polyft as ft
from polyft.deps import critical
from polyft.etdg import BlockNode, reads, writes
from polyft.experiments import compile_time, plot
from polyft.schedule import coarsen as C

from helpers import assert_same, flist, rand


def chain(n, H=16):
    ws = [rand((H, H), k) / 4 for k in range(n)]

    def net(xs):
        for w in ws:
            xs = xs.map(lambda x, w=w: ft.tanh(x @ w))
        return xs
    return net, flist([8], [1, H], 99)


@pytest.mark.parametrize("n", [8, 32])
def test_a_chain_of_layers_coarsens_in_log_rounds_of_whole_program_checks(n, monkeypatch):
    """A chain of n maps merges into one map (1 step, critical path 1, as one merge at a time
    gave) while the whole program's dataflow is checked about log2(n) times, not n."""
    checks = []
    real = C.dataflow_violations
    monkeypatch.setattr(C, "dataflow_violations", lambda e: checks.append(1) or real(e))
    net, xs = chain(n)
    prog = ft.analyze(net, xs)
    assert len(prog.etdg.statements) == 1 and prog.schedule.sequential_steps == prog.schedule.critical_path == 1
    assert len(checks) <= 2 * math.log2(n) + 2, len(checks)
    assert_same(ft.compile(net, xs)(xs), net(xs))


def test_horizontal_merging_reads_each_node_once_a_pass(monkeypatch):
    """Which siblings can merge horizontally is decided from each body node's reads and writes,
    computed once per body and pass: linear in the layers (a chain has no pair; before, every
    pair and every node between them was walked again, cubic in the layers)."""
    def count(n):
        calls = []
        real = C.reads
        monkeypatch.setattr(C, "reads", lambda node: calls.append(1) or real(node))
        net, xs = chain(n)
        C.horizontal_merge(ft.trace(net, xs))
        monkeypatch.setattr(C, "reads", real)
        return len(calls)
    assert count(48) <= 2.1 * count(24)


def _places_by_every_pair(body) -> list:
    """Where sibling block nodes a < b can merge, by testing every pair and every node between
    (the definition `_horizontal_places` computes without visiting all pairs)."""
    rw = [(reads(n), writes(n)) for n in body]

    def edge(i, j):
        return bool(rw[i][1] & rw[j][0]) or bool(rw[j][1] & rw[i][0])
    out = []
    for a, b in itertools.combinations([k for k, n in enumerate(body) if isinstance(n, BlockNode)], 2):
        if not C._same_dims(body[a], body[b]) or edge(a, b):
            continue
        if not any(edge(i, b) for i in range(a + 1, b)):
            out.append((a, b, "first"))
        elif not any(edge(a, j) for j in range(a + 1, b)):
            out.append((a, b, "second"))
    return out


def test_horizontal_places_are_every_pairs_and_cost_a_chain_a_linear_walk(monkeypatch):
    """The pairs of siblings that can merge, and where, are those that testing every pair
    gives (layers of sibling branches; maps of two lengths interleaved, some independent, some
    not); a chain's nearest edges are found next door, so the walk is linear in its layers."""
    def mixed(xs, ys):
        a = xs.map(lambda x: ft.tanh(x))
        b = ys.map(lambda y: y * 2.0)
        c = xs.map(lambda x: x + 1.0)
        d = ft.map(lambda p, q: p - q, a, c)
        e = ys.map(lambda y: ft.exp(y))
        f = ft.map(lambda p, q: p * q, b, e)
        return d.map(lambda x: x * 3.0), f, xs.map(lambda x: x - 2.0)
    net, (xs,) = compile_time.branches(4, np.random.default_rng(0), layers=3)
    for body in (ft.trace(net, xs).root.body, ft.trace(mixed, flist([5], [1, 4], 1), flist([3], [1, 4], 2)).root.body):
        want = _places_by_every_pair(body)
        assert want and list(C._horizontal_places(body)) == want

    def edges(n):
        calls = []
        real = C._edge
        monkeypatch.setattr(C, "_edge", lambda *a: calls.append(1) or real(*a))
        net, xs = chain(n)
        assert list(C._horizontal_places(ft.trace(net, xs).root.body)) == []
        monkeypatch.setattr(C, "_edge", real)
        return len(calls)
    assert edges(48) <= 2.1 * edges(24)


def test_the_critical_path_of_a_chain_peels_each_layer_once(monkeypatch):
    """A chain of n maps has a critical path of n instances (one row through every layer);
    peeling looks again only at the statements whose inputs a round changed (the layer peeled
    and the next), not at every statement every round: linear in the layers, not quadratic."""
    def count(n):
        calls = []
        real = critical.union
        monkeypatch.setattr(critical, "union", lambda items: calls.append(1) or real(items))
        net, xs = chain(n)
        prog = ft.analyze(net, xs, schedule="original")
        assert prog.schedule.critical_path == n
        monkeypatch.setattr(critical, "union", real)
        return len(calls)
    assert count(48) <= 2.1 * count(24)


def test_captured_arrays_are_buffers_not_literals():
    """A captured 512 x 512 weight is a "const" buffer the code reads at call time: the source
    stays small (its literals were 5 MB of C) and the result is eager's; a captured 4-vector
    too; a Python scalar stays inline. A captured array changed after compiling is still
    refused (test_numerics)."""
    w, bias = rand((512, 512), 1) / 20, rand((4,), 2)
    xs = flist([6], [2, 512], 3)

    def net(xs):
        return xs.map(lambda x: ft.tanh(x @ w) * 0.5)

    def small(xs):
        return xs.map(lambda x: x[:, :4] + bias)
    prog = ft.compile(net, xs)
    assert len(prog.source) < 100_000
    consts = [b for b in prog.layout.buffers if b.kind == "const"]
    assert [tuple(b.element_shape) for b in consts] == [(512, 512)]
    assert_same(prog(xs), net(xs))
    prog = ft.compile(small, xs)
    assert [tuple(b.element_shape) for b in prog.layout.buffers if b.kind == "const"] == [(4,)]
    assert_same(prog(xs), small(xs))
    assert re.search(r"static const float k\d+\[1\] = \{0\.5\};", ft.compile(net, xs).source)  # 0.5: inline


def test_coarsening_shares_a_captured_weight_instead_of_copying_it():
    """Every coarsening pass works on a deep copy of the ETDG; a const buffer's data is shared
    by the copies (a captured 4096 x 4096 weight was copied 5 times: 3 s of a 4 s compile),
    and the program still reads the weight's values."""
    w = rand((64, 64), 4) / 8
    xs = flist([4], [1, 64], 5)

    def net(xs):
        return xs.map(lambda x: ft.tanh(x @ w)).map(lambda y: y * 2.0)
    etdg = ft.trace(net, xs)
    coarsened, _ = C.coarsen(etdg)
    before = [b.value for b in etdg.buffers if b.kind == "const"]
    after = [b.value for b in coarsened.buffers if b.kind == "const"]
    assert len(coarsened.statements) == 1 and len(after) == 1 and after[0] is before[0]
    assert np.array_equal(after[0], w)


def test_a_deep_statement_calls_one_function_per_gemm_and_loop_shape():
    """20 layers merged into one statement (more than OUTLINE_MATMULS matmuls): the first reads
    the batch's input tiles (an array of row pointers), the next 18 their temporaries' rows (one
    pointer each) and share one GEMM function; the last, of another width, has its own; the
    tanh loops are one function per shape. 5 layers keep their code in place."""
    def net_of(n):
        ws = [rand((16, 16), k) / 4 for k in range(n - 1)] + [rand((16, 32), 99) / 4]

        def net(xs):
            for w in ws:
                xs = xs.map(lambda x, w=w: ft.tanh(x @ w))
            return xs
        return net
    xs = flist([8], [1, 16], 7)
    net = net_of(20)
    prog = ft.compile(net, xs)
    names = re.findall(r"^static __attribute__\(\(noinline\)\) void (ft_\w+)\(", prog.source, re.M)
    calls = {n: len(re.findall(rf"\b{n}\(", prog.source)) - 1 for n in names}
    assert sorted(c for n, c in calls.items() if n.startswith("ft_gemm")) == [1, 1, 18], calls
    assert sorted(c for n, c in calls.items() if n.startswith("ft_elementwise")) == [1, 19], calls
    assert_same(prog(xs), net(xs))
    assert "ft_gemm" not in ft.compile(net_of(5), xs).source


def test_a_deep_encoder_calls_one_function_per_permute_softmax_and_slice():
    """Five encoder layers merged into one statement (more than OUTLINE_MATMULS matmuls): the
    reshapes, permutes, head slices, transposes, softmaxes and concats are calls of the module's
    functions, one per distinct loop, shared by the layers; the statement keeps no loop of its
    own inside the instance loop, and the result equals eager and a numpy encoder."""
    layers = 5
    net, (xs,) = compile_time.encoder(layers, np.random.default_rng(3), N=3, L=8, D=16, H=2)
    prog = ft.compile(net, xs)
    names = re.findall(r"^static __attribute__\(\(noinline\)\) void (ft_\w+)\(", prog.source, re.M)
    calls = {n: len(re.findall(rf"\b{n}\(", prog.source)) - 1 for n in names}
    for kind, per_layer in (("permute", 3), ("softmax", 2), ("transpose", 2), ("concat", 1)):
        assert sum(c for n, c in calls.items() if re.fullmatch(rf"ft_{kind}\d+", n)) == layers * per_layer, (kind, calls)
    assert len([n for n in names if n.startswith("ft_softmax")]) == 1, names
    statement = re.search(r"^static void S_\w+\(.*?^}", prog.source, re.M | re.S).group(0)
    assert "ft_expf" not in statement and "INFINITY" not in statement
    got = prog(xs).to_numpy()
    assert_same(prog(xs), net(xs))

    def numpy_encoder(x, wq, wk, wv, wo, w1, w2, H=2):  # [L, D] -> [L, D], heads by slicing columns
        q, k, v = x @ wq, x @ wk, x @ wv
        d = x.shape[1] // H
        heads = []
        for h in range(H):
            s = q[:, h * d:(h + 1) * d] @ k[:, h * d:(h + 1) * d].T / d ** 0.5
            p = np.exp(s - s.max(axis=1, keepdims=True))
            heads.append(p / p.sum(axis=1, keepdims=True) @ v[:, h * d:(h + 1) * d])
        a = np.concatenate(heads, axis=1) @ wo + x
        return np.maximum(a @ w1, 0) @ w2 + a
    rng = np.random.default_rng(3)  # the weights encoder() drew, drawn again in its order
    ws = [tuple(rng.standard_normal(shape).astype(np.float32) / np.sqrt(shape[0]).astype(np.float32)
                for shape in ((16, 16),) * 4 + ((16, 32), (32, 16))) for _ in range(layers)]
    want = []
    for x in xs.to_numpy().astype(np.float64):
        for w in ws:
            x = numpy_encoder(x, *(m.astype(np.float64) for m in w))
        want.append(x)
    want = np.stack(want)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_compile_time_rows_and_plot(tmp_path, monkeypatch):
    """Every stage timed per program, the schedule each got, checked against eager; a weight
    captured gives the source a weight passed as an input gives; the plot and the fitted
    exponent from the CSV."""
    families = compile_time.FAMILIES
    monkeypatch.setattr(compile_time, "FAMILIES", {
        "chain": (compile_time.chain, "layers", (2, 4, 8, 16)),
        "encoder": (compile_time.encoder, "encoder layers", (1, 2)),
        "captured": (families["captured"][0], families["captured"][1], (256,)),
        "input": (families["input"][0], families["input"][1], (256,))})
    df = compile_time.run("quick", str(tmp_path))
    got = pd.read_csv(tmp_path / "compile_time_quick.csv")
    assert len(got) == len(df) == 8 * (len(compile_time.STAGES) + 1)
    weights = got[got["stage"] == "total"].set_index("family")["source_bytes"]
    assert abs(weights["captured"] - weights["input"]) < 100 and weights["captured"] < 20_000
    assert set(got["stage"]) == set(compile_time.STAGES) | {"total"}
    assert (got["rel_error"] < 1e-5).all() and (got["seconds"] >= 0).all()
    chain_rows = got[(got["family"] == "chain") & (got["stage"] == "total")]
    assert (chain_rows["statements"] == 1).all() and (chain_rows["sequential_steps"] == 1).all()
    total = got[got["stage"] == "total"].set_index(["family", "size"])["seconds"]
    parts = got[got["stage"] != "total"].groupby(["family", "size"])["seconds"].sum()
    assert np.allclose(total.sort_index(), parts.sort_index())
    assert plot.exponent(got, "chain", first=1) is not None and plot.exponent(got, "encoder") is None
    assert str(tmp_path / "compile_time_quick.png") in plot.run(str(tmp_path), "quick", ["compile_time"])
    assert (got["wall_seconds"] > 0).all() and "chain: CPU seconds per stage" in compile_time.result_text(str(tmp_path), "quick")
