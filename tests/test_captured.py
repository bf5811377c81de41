"""Values a program captures (a closure's numpy arrays and FractalTensors) are compiled in: a
change after compiling is an InputError at the next call, for a FractalTensor as for an array
(etdg.Captured). A read-only capture is checked by its pointer and flags, not by hashing its
bytes on every call; a small writable one is compared with a copy of its bytes, a large one hashed."""
from __future__ import annotations

import numpy as np
import pytest

import polyft as ft
from polyft import etdg
from polyft.errors import InputError
from polyft.testing import rel_error

pytestmark = pytest.mark.usefixtures("compile_cache")


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return ft.FractalTensor.from_numpy(rng.standard_normal((3, 1, 4)).astype(np.float32), 1)


def test_a_captured_fractaltensor_changed_after_compiling_is_an_input_error():
    base = np.random.default_rng(1).standard_normal((3, 1, 4)).astype(np.float32)
    bias = ft.FractalTensor.from_numpy(base, 1)  # a read-only view of `base`, which stays writable

    def fn(xs):
        return ft.map(lambda x, b: x + b, xs, bias)
    xs = inputs()
    prog = ft.compile(fn, xs, target="c")
    assert rel_error(prog(xs), fn(xs)) < 1e-6
    base[1, 0, 2] += 1.0
    with pytest.raises(InputError) as e:
        prog(xs)
    msg = str(e.value)
    assert "FractalTensor [3]float32[1, 4]" in msg and "changed after compiling" in msg and "input" in msg, msg


def test_a_captured_array_changed_after_compiling_is_still_an_input_error():
    w = np.eye(4, dtype=np.float32)

    def fn(xs):
        return xs.map(lambda x: x @ w)
    prog = ft.compile(fn, inputs(), target="c")
    w[0, 0] = 2.0
    with pytest.raises(InputError, match=r"numpy array float32\[4, 4\].*changed after compiling"):
        prog(inputs())


def hashes(monkeypatch) -> list:
    """The arrays etdg.digest hashes from now on."""
    seen, real = [], etdg.digest
    monkeypatch.setattr(etdg, "digest", lambda a: seen.append(np.shape(a)) or real(a))
    return seen


def test_a_read_only_capture_is_not_hashed_each_call(monkeypatch):
    w = np.random.default_rng(2).standard_normal((64, 4)).astype(np.float32)
    w.flags.writeable = False
    rows = np.random.default_rng(3).standard_normal((3, 1, 64)).astype(np.float32)
    rows.flags.writeable = False
    captured_list = ft.FractalTensor.from_numpy(rows, 1)

    def fn(xs):
        return ft.map(lambda x, r: r @ w + x, xs, captured_list)
    xs = inputs()
    prog = ft.compile(fn, xs, target="c")
    seen = hashes(monkeypatch)
    for _ in range(5):
        assert rel_error(prog(xs), fn(xs)) < 1e-5
    assert seen == []
    w.flags.writeable = True  # thawed: hashed again, and a change is seen
    w[3, 1] = 7.0
    with pytest.raises(InputError, match="changed after compiling"):
        prog(xs)
    assert seen


def test_a_large_writable_capture_is_hashed_each_call(monkeypatch):
    cols = etdg.SNAPSHOT_BYTES // 16 + 1  # a [4, cols] float32 weight: over the snapshot's size
    w = np.random.default_rng(4).standard_normal((4, cols)).astype(np.float32)

    def fn(xs):
        return xs.map(lambda x: x @ w)
    prog = ft.compile(fn, inputs(), target="c")
    prog(inputs())  # the first call at a shape also runs the full checks
    seen = hashes(monkeypatch)
    prog(inputs())
    prog(inputs())
    assert seen == [(4, cols), (4, cols)]


def test_a_small_writable_capture_is_compared_with_a_copy(monkeypatch):
    w = np.eye(4, dtype=np.float32)

    def fn(xs):
        return xs.map(lambda x: x @ w)
    prog = ft.compile(fn, inputs(), target="c")
    seen = hashes(monkeypatch)
    prog(inputs())
    assert seen == []
    w[3, 1] = 0.5
    with pytest.raises(InputError, match="changed after compiling"):
        prog(inputs())


def test_a_read_only_view_of_a_writable_array_is_hashed(monkeypatch):
    base = np.eye(4, dtype=np.float32)
    w = base[:, :]
    w.flags.writeable = False  # `base` can still change it

    def fn(xs):
        return xs.map(lambda x: x @ w)
    prog = ft.compile(fn, inputs(), target="c")
    base[2, 2] = 3.0
    with pytest.raises(InputError, match="changed after compiling"):
        prog(inputs())
