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
    clock, choice = started({1: 0.004, 2: 0.001}, most=2)
    for _ in range(10):
        choice.run((), clock.call)
    assert choice.best(()) == 2
    clock.cost = {1: 0.001, 2: 0.006}  # another process takes a core
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
        outs = []
        for n in (1, 2, 3):
            prog.threads.fixed = n
            outs.append(prog(xs, w))
        assert all(rel_error(o, outs[0]) == 0.0 for o in outs)
        assert rel_error(outs[0], rows(xs, w)) < 1e-5
