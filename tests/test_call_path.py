"""The call path of compiled programs (polyft/calls.py): a call's Python work does not grow with
the data, inputs are read in place, intermediates are recycled, and an output a caller holds is
never overwritten by a later call. Counted, not timed."""
import sys
import threading

import numpy as np
import pytest

import polyft as ft
import polyft.calls as calls


def affine(xs, w):
    return xs.map(lambda x: ft.tanh(x @ w) * 2.0 + x)  # intermediates between the matmul and the output


def _inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    xs = ft.FractalTensor.from_numpy(rng.standard_normal((n, 1, n)).astype(np.float32), depth=1)
    return xs, rng.standard_normal((n, n)).astype(np.float32) / n


def _expected(xs, w):
    x = xs.to_numpy()
    return np.tanh(x @ w) * 2.0 + x


def _python_calls(fn) -> int:
    """How many Python functions (and builtins) one call of `fn` enters."""
    count = [0]

    def profile(frame, event, arg):
        if event in ("call", "c_call"):
            count[0] += 1
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]


def _compiled(n):
    p = ft.compile(affine, ft.spec(f"[N]float32[1, {n}]"), ft.spec(f"float32[{n}, {n}]"))
    p.threads.fixed = 1  # (the measured thread choice's bookkeeping differs on its first calls)
    return p


@pytest.fixture(scope="module")
def prog():
    return _compiled(16)


def test_python_work_does_not_grow_with_the_data():
    counts = {}
    for n in (8, 256):
        prog, (xs, w) = _compiled(n), _inputs(n)
        for _ in range(3):  # the first call at a shape checks in full and plans
            prog(xs, w)
        counts[n] = _python_calls(lambda: prog(xs, w))
    assert counts[8] == counts[256], counts


def test_no_allocation_per_call_once_warm(prog, monkeypatch):
    xs, w = _inputs(16)
    for _ in range(3):
        prog(xs, w)
    made = []
    real = calls.allocate
    monkeypatch.setattr(calls, "allocate", lambda b, shape: made.append(b.name) or real(b, shape))
    for _ in range(5):
        np.testing.assert_allclose(prog(xs, w).to_numpy(), _expected(xs, w), rtol=1e-5, atol=1e-5)
    assert made == []  # neither the intermediates nor the dropped outputs


def test_held_outputs_are_never_overwritten(prog, monkeypatch):
    """Each result a caller keeps (as a FractalTensor, a numpy view, a memoryview or an array from
    run_arrays) keeps its values through later calls; only dropped ones are recycled."""
    inputs = [_inputs(16, seed) for seed in range(6)]
    kept = [prog(*inputs[0]), prog(*inputs[1]).to_numpy(), np.asarray(prog(*inputs[2]).dense_view()[3:]),
            memoryview(prog.run_arrays(*inputs[3])[0]), prog.run_arrays(*inputs[4])[0]]
    for _ in range(4):
        prog(*inputs[5])
    got = [kept[0].to_numpy(), kept[1], kept[2], np.asarray(kept[3]), kept[4]]
    want = [_expected(*i) for i in inputs[:5]]
    want[2] = want[2][3:]
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_inputs_in_place_and_converted(prog):
    """A contiguous input of the right dtype is read where it is; a strided one is copied first,
    and the results agree."""
    xs, w = _inputs(16)
    wide = np.zeros((16, 32), np.float32)
    wide[:, ::2] = w
    strided = wide[:, ::2]
    assert not strided.flags.c_contiguous
    np.testing.assert_allclose(prog(xs, strided).to_numpy(), prog(xs, w).to_numpy(), rtol=0, atol=0)


def test_wrong_input_still_raises_after_planning(prog):
    xs, w = _inputs(16)
    prog(xs, w)
    with pytest.raises(ft.errors.InputError, match="should be float32"):
        prog(xs, w.astype(np.float64))
    with pytest.raises(ft.errors.InputError):
        prog(xs, np.zeros((4, 4), np.float32))
    with pytest.raises(ft.errors.InputError, match="expected 2 inputs"):
        prog(xs)


def test_concurrent_calls_do_not_share_buffers(prog):
    inputs = [_inputs(16, seed) for seed in range(4)]
    errors = []

    def work(i):
        for _ in range(20):
            got = prog(*inputs[i]).to_numpy()
            if not np.allclose(got, _expected(*inputs[i]), rtol=1e-5, atol=1e-5):
                errors.append(i)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_captured_constant_changed_is_still_caught():
    w = np.eye(4, dtype=np.float32)
    p = ft.compile(lambda xs: xs.map(lambda x: x @ w), ft.spec("[N]float32[1, 4]"))
    xs = ft.FractalTensor.from_numpy(np.ones((3, 1, 4), np.float32), depth=1)
    p(xs)
    w[0, 0] = 2.0
    with pytest.raises(ft.errors.InputError, match="changed after compiling"):
        p(xs)
