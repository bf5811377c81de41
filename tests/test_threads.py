"""The C runtime's thread count per call (emit/threads.py): measured, pinned by $POLYFT_THREADS,
and invisible in the results.

* `ThreadChoice` with calls whose time depends on the count they run on (sleeps): it warms up,
  tries each count, keeps the faster, probes the slower ever more rarely while it loses, and
  switches when the load changes; separately per set of lengths; $POLYFT_THREADS pins it.
* `brief_spin`: GOMP_SPINCOUNT while libgomp loads, a user's setting left alone.
* a compiled program gives bit-identical results on one thread and on every core, and its
  calls go through the choice.
"""
from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest

import polyft as ft
from polyft.testing import rel_error
from polyft.emit import threads as T
from polyft.workloads import WORKLOADS


class Clock:
    """A call whose time is `cost[count]` seconds, the count being the one last set."""

    def __init__(self, cost):
        self.cost, self.count, self.counts = dict(cost), None, []

    def set(self, n):
        self.count = n

    def call(self):
        self.counts.append(self.count)
        time.sleep(self.cost[self.count])
        return 0


@pytest.fixture(autouse=True)
def measured(monkeypatch):
    """No pinned count unless a test sets one."""
    monkeypatch.delenv("POLYFT_THREADS", raising=False)


def started(cost: dict, most: int):
    clock = Clock(cost)
    return clock, T.ThreadChoice(clock.set, most=most)


def test_it_keeps_the_faster_count_and_probes_the_other_ever_more_rarely():
    clock, choice = started({1: 0.001, 4: 0.006}, most=4)
    for _ in range(60):
        choice.run((), clock.call)
    assert clock.counts[:3] == [4, 1, 4]  # warm-up on every core, then each count once
    probes = [k for k, n in enumerate(clock.counts) if n == 4 and k >= 3]
    gaps = np.diff(probes)
    assert len(probes) <= 6 and list(gaps) == sorted(gaps), probes  # 2, 4, 8, ... calls apart
    assert choice.best(()) == 1


def test_a_change_of_load_is_found_again():
    # milliseconds apart, not fractions of one: a loaded machine oversleeps by about a millisecond
    clock, choice = started({1: 0.016, 2: 0.004}, most=2)
    for _ in range(10):
        choice.run((), clock.call)
    assert choice.best(()) == 2
    clock.cost = {1: 0.004, 2: 0.024}  # another process takes a core
    for _ in range(12):
        choice.run((), clock.call)
    assert choice.best(()) == 1 and clock.counts[-6:].count(1) >= 5  # a probe of 2 at most


def test_each_set_of_lengths_is_measured_apart():
    clock, choice = started({1: 0.001, 2: 0.004}, most=2)
    for _ in range(6):
        choice.run(("small",), clock.call)
    clock.cost = {1: 0.004, 2: 0.001}
    for _ in range(6):
        choice.run(("large",), clock.call)
    assert (choice.best(("small",)), choice.best(("large",))) == (1, 2)


def test_polyft_threads_pins_the_count(monkeypatch):
    monkeypatch.setenv("POLYFT_THREADS", "3")
    clock, choice = started({3: 0.0}, most=8)
    for _ in range(5):
        choice.run((), clock.call)
    assert clock.counts == [3] * 5 and choice.best(()) is None


def test_one_core_means_one_thread():
    clock, choice = started({1: 0.0}, most=1)
    for _ in range(4):
        choice.run((), clock.call)
    assert clock.counts == [1] * 4


def test_brief_spin_leaves_a_users_setting_alone(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with T.brief_spin():
        assert os.environ["GOMP_SPINCOUNT"] == str(T.SPIN_COUNT)
    assert "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    with T.brief_spin():
        assert "GOMP_SPINCOUNT" not in os.environ


@pytest.mark.parametrize("name", ["stacked_lstm", "flash_attention"])
def test_results_do_not_depend_on_the_thread_count(name):
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=5)
    prog = ft.compile(mod.program, *inputs)
    outs = {}
    for n in (1, T.cores()):
        prog.threads.fixed = n
        outs[n] = prog(*inputs)
        assert prog.threads.last == n
    assert all(rel_error(o, outs[1]) == 0.0 for o in outs.values())  # bit for bit
    assert rel_error(outs[1], mod.program(*inputs)) < 1e-5
    prog.threads.fixed = None
    for _ in range(4):
        prog(*inputs)
    assert prog.threads.last in prog.threads.options


def assert_same_bits_on_1_to_3_threads(prog, fn, *inputs):
    """`prog` gives the same bits on 1, 2 and 3 threads, and agrees with `fn` run eagerly."""
    outs = []
    for n in (1, 2, 3):
        prog.threads.fixed = n
        outs.append(prog(*inputs))
    assert all(rel_error(o, outs[0]) == 0.0 for o in outs)
    assert rel_error(outs[0], fn(*inputs)) < 1e-5


def test_tiles_of_a_parallel_loop_are_split_among_the_threads():
    """A tiled parallel loop advances by ft_split(iterations, 16): at most 16 instances a
    tile, narrower when the threads would otherwise not all get one (16 map instances were
    one tile, one thread's work); any count of threads gives the same bits."""
    def rows(xs, w):
        return xs.map(lambda x: ft.tanh(x @ w))
    w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32) / 6
    prog = ft.compile(rows, ft.spec("[N]float32[2, 32]"), ft.spec("float32[32, 32]"))
    assert "c1 += c1_w" in prog.source and "ft_split(" in prog.source
    for N in (1, 5, 16, 33):
        xs = ft.FractalTensor.from_numpy(np.random.default_rng(N).standard_normal((N, 2, 32)).astype(np.float32), 1)
        assert_same_bits_on_1_to_3_threads(prog, rows, xs, w)


def test_a_parallel_loop_around_a_tiled_one_is_flattened():
    """A parallel loop whose body is a tiled parallel loop runs as one loop over (outer
    iteration, tile), the tiles ft_split(inner, 16, outer) wide: with fewer outer iterations
    than threads (a wavefront step over one layer) the inner tiles are still shared out.
    Every shape, including empty and single iterations, gives the same bits on 1-3 threads."""
    def rows(xss, w):
        return xss.map(lambda xs: xs.map(lambda x: ft.tanh(x @ w)))
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) / 8
    prog = ft.compile(rows, ft.spec("[M, N]float32[8, 64]"), ft.spec("float32[64, 64]"))
    assert re.search(r"const long c2_w = ft_split\(.*, 16, c1_m\);", prog.source), prog.source
    assert re.search(r"for \(long c1_c2 = 0; c1_c2 < c1_m \* c2_t; c1_c2 \+= 1\)", prog.source)
    for M, N in ((1, 16), (1, 1), (2, 33), (3, 5), (5, 2)):
        xss = ft.FractalTensor.from_numpy(
            np.random.default_rng(M * N).standard_normal((M, N, 8, 64)).astype(np.float32), 2)
        assert_same_bits_on_1_to_3_threads(prog, rows, xss, w)


def test_only_a_tiled_loop_with_bounds_of_its_own_is_flattened():
    """An inner loop whose bounds use the outer iterator (a triangle) keeps its own loop."""
    from polyft.emit.isl_ast import _tiled_inside, build_ast, loop_key
    import islpy as isl
    for text, flat in (("[N] -> { S[i, j] -> [i, j] : 0 <= i < N and 0 <= j < 16 }", True),
                       ("[N] -> { S[i, j] -> [i, j] : 0 <= i < N and 0 <= j <= i }", False)):
        ast = build_ast(isl.UnionMap(text), isl.Set("[N] -> { : N > 2 }"))
        inner = ast.for_get_body()
        assert _tiled_inside(ast, inner, [True, True], {loop_key(inner): 16}) == flat
        assert not _tiled_inside(ast, inner, [True, True], {})  # not tiled
        assert not _tiled_inside(ast, inner, [True, False], {loop_key(inner): 16})  # not parallel
