"""The auto schedule weighs synchronisation (schedule/reorder.py outer_parallel): independent
dims with no reuse go outermost where the wavefront has no width of its own; the stacked RNN's
wavefront (its steps wide, its batch rows sharing weights) stays."""
import numpy as np

import polyft as ft
from polyft.workloads import get


def linear_recurrences(ass, bss):
    """A map over independent sequences of h = a * h + b (no data shared between sequences)."""
    return ft.map(lambda a_s, b_s: ft.scanl(lambda h, ab: ab[0] * h + ab[1], ft.zip(a_s, b_s),
                                            init=ft.zeros((1, 16))), ass, bss)


def rnn_over_sequences(xss, w):
    """The same map, where every sequence's step reads one weight (reuse along the map)."""
    return ft.map(lambda xs: ft.scanl(lambda h, x: ft.tanh(h @ w + x), xs, init=ft.zeros((1, 16))), xss)


def _lists(shape, seed):
    rng = np.random.default_rng(seed)
    return ft.FractalTensor.from_numpy((rng.random(shape) * 0.5).astype(np.float32), depth=2)


def test_independent_sequences_run_outermost_without_barriers():
    ass, bss = _lists((8, 32, 1, 16), 0), _lists((8, 32, 1, 16), 1)
    prog = ft.compile(linear_recurrences, ass, bss)
    (m,) = prog.schedule.per_statement.values()
    assert "-> [0, i, j, 0]" in str(m), m  # the sequences outside, their steps inside
    assert prog.schedule.parallel[:3] == [True, True, False]
    assert "no barrier inside" in prog.schedule.describe()
    assert prog.schedule_choice is None  # the same order as written: nothing left to measure
    expected = linear_recurrences(ass, bss).to_numpy()
    np.testing.assert_allclose(prog(ass, bss).to_numpy(), expected, rtol=1e-6, atol=1e-6)


def test_shared_weights_keep_the_wide_step():
    xss, w = _lists((8, 32, 1, 16), 2), np.random.default_rng(3).standard_normal((16, 16)).astype(np.float32) / 4
    prog = ft.analyze(rnn_over_sequences, xss, w)
    (m,) = prog.schedule.per_statement.values()
    assert "-> [0, j, i, 0]" in str(m), m  # each step's rows together: one GEMM per step
    assert "share operands" in prog.schedule.describe()


def test_stacked_rnn_keeps_its_wavefront():
    mod = get("stacked_rnn")
    prog = ft.analyze(mod.program, *mod.inputs("small", seed=1, N=4, L=8, D=3, H=16))
    (m,) = prog.schedule.per_statement.values()
    assert "-> [0, j + k, j, i, 0]" in str(m), m
    assert "inside the wavefront" in prog.schedule.describe()
