"""Ragged batches compiled (issue 29): a list whose last level's lengths vary per element runs in C
and in cuda-emulated with the lengths as call-time data, equal to eager execution and to numpy
written independently; instances past a length never run; bad lengths fail before native code."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from helpers import assert_same, flist, rand
from test_cuda import TARGETS as CUDA_TARGETS
from test_cuda import _nvcc

import polyft as ft
import polyft.calls
from polyft import errors
from polyft.testing import rel_error
from polyft.workloads import stacked_lstm

TARGETS = ["c", *CUDA_TARGETS]  # "cuda" too where a GPU and PyCUDA are
H = 4


def sentences(lengths, seed, width=H):
    """A ragged batch: sentence i has lengths[i] random [1, width] words."""
    rng = np.random.default_rng(seed)
    return ft.FractalTensor.from_list([[rng.standard_normal((1, width)).astype(np.float32) for _ in range(n)]
                                       for n in lengths], element_shape=(1, width), dtype="float32")


def words(x):
    """Every element of a (ragged) FractalTensor in order, concatenated (for numpy references)."""
    if x.depth == 1:
        return np.concatenate([np.asarray(e).ravel() for e in x] or [np.zeros(0, np.float32)])
    return np.concatenate([words(c) for c in x] or [np.zeros(0, np.float32)])


def lengths(x) -> list:
    return [len(c) if c.depth == 1 else lengths(c) for c in x]


W, U = rand((H, H), 1) / 2, rand((H, H), 2) / 2


def mapped(xss):
    return xss.map(lambda xs: xs.map(lambda x: ft.tanh(x @ W) + x))


def scanned(xss):
    return xss.map(lambda xs: xs.scanl(lambda s, x: ft.tanh(x @ W + s @ U), ft.zeros((1, H))))


def folded(xss):
    return xss.map(lambda xs: xs.foldl(lambda s, x: ft.tanh(x @ W + s @ U), ft.zeros((1, H))))


def np_scan(sentence):
    """The states after each word, by a numpy loop."""
    s, out = np.zeros((1, H), np.float32), []
    for x in sentence:
        s = np.tanh(np.asarray(x) @ W + s @ U)
        out.append(s)
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_map_over_ragged(target):
    xss = sentences([3, 1, 5, 0, 2], 10)
    prog = ft.compile(mapped, xss, target=target)
    again = sentences([2, 4, 1, 5, 3], 11)  # other lengths, same bound
    for x in (xss, again):
        got = prog(x)
        assert got.type_string == "[5, *]float32[1, 4]" and lengths(got) == lengths(x)
        assert_same_ragged(got, mapped(x))
        ref = np.concatenate([(np.tanh(np.asarray(w) @ W) + np.asarray(w)).ravel() for s in x for w in s])
        assert rel_error(words(got), ref) < 1e-5


@pytest.mark.parametrize("target", TARGETS)
def test_scanl_over_each_sentence(target):
    xss = sentences([4, 1, 0, 6, 2], 12)
    prog = ft.compile(scanned, xss, target=target)
    got = prog(xss)
    assert lengths(got) == [4, 1, 0, 6, 2]
    assert_same_ragged(got, scanned(xss))
    assert rel_error(words(got), np.concatenate([np.ravel(s) for sent in xss for s in np_scan(sent)])) < 1e-5


@pytest.mark.parametrize("target", TARGETS)
def test_foldl_over_each_sentence(target):
    xss = sentences([4, 1, 6, 2], 13)
    prog = ft.compile(folded, xss, target=target)
    for x in (xss, sentences([6, 6, 1, 3], 14)):
        got = prog(x)
        assert_same(got, folded(x))
        assert rel_error(got.to_numpy(), np.stack([np_scan(s)[-1] for s in x])) < 1e-5


def np_lstm(sentence, wss, uss, bss):
    """The stacked LSTM on one sentence by numpy loops: per layer, the hidden and cell states."""
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    xs, hss, css = [np.asarray(x) for x in sentence], [], []
    for d in range(len(wss)):
        h = c = np.zeros((1, H), np.float32)
        hs, cs = [], []
        for x in xs:
            g = [x @ np.asarray(wss[d][j]) + h @ np.asarray(uss[d][j]) + np.asarray(bss[d][j]) for j in range(4)]
            c = sig(g[1]) * c + sig(g[0]) * np.tanh(g[3])
            h = sig(g[2]) * np.tanh(c)
            hs.append(h)
            cs.append(c)
        hss.append(hs)
        css.append(cs)
        xs = hs
    return hss, css


def lstm_inputs(lengths_, seed, D=3):
    wss = flist([D, 4], (H, H), seed + 1)
    uss = flist([D, 4], (H, H), seed + 2)
    bss = flist([D, 4], (1, H), seed + 3)
    return sentences(lengths_, seed), wss, uss, bss


L = 6
ONE_TO_L = [3, 1, 6, 2, 5, 4]  # a batch of sentences of lengths 1..L


@pytest.mark.parametrize("target", TARGETS)
def test_stacked_lstm_over_sentences_of_lengths_1_to_L(target):
    args = lstm_inputs(ONE_TO_L, 20)
    prog = ft.compile(stacked_lstm.program, *args, target=target)
    hsss, csss = prog(*args)
    eager = stacked_lstm.program(*args)
    assert hsss.type_string == "[6, 3, *]float32[1, 4]" and lengths(hsss) == [[n] * 3 for n in ONE_TO_L]
    assert_same_ragged(hsss, eager[0])
    assert_same_ragged(csss, eager[1])
    refs = [np_lstm(s, *args[1:]) for s in args[0]]
    assert rel_error(words(hsss), np.concatenate([np.ravel(h) for hss, _ in refs for hs in hss for h in hs])) < 1e-5
    assert rel_error(words(csss), np.concatenate([np.ravel(c) for _, css in refs for cs in css for c in cs])) < 1e-5
    assert "block b2 [j < 3, k < xss_len[i] <= 6]" in str(prog.traced)  # layers, then the guarded time dim
    # dependences on the bounding domain: the schedule of the padded program, its wavefront
    padded = ft.analyze(stacked_lstm.program, flist([6, L], (1, H), 24), *args[1:])
    assert prog.schedule.sequential_steps == padded.schedule.sequential_steps
    assert str(prog.schedule.map) == str(padded.schedule.map)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_nvcc_compiles_the_ragged_stacked_lstm(tmp_path):
    prog = ft.compile(stacked_lstm.program, *lstm_inputs(ONE_TO_L, 25), target="cuda-emulated")
    assert "return;" in prog.source  # the guards
    _nvcc(prog.source, tmp_path)


def test_stacked_lstm_from_a_spec_runs_any_batch():
    """`[N, <=L]`: the bound is symbolic, each call's longest sentence (or sizes=) sets it."""
    specs = [ft.spec("[N, <=L]float32[1, 4]"), ft.spec("[D, 4]float32[4, 4]"), ft.spec("[D, 4]float32[4, 4]"),
             ft.spec("[D, 4]float32[1, 4]")]
    prog = ft.compile(stacked_lstm.program, *specs)
    assert str(prog.etdg.inputs[0][1].type) == "[N, <=L]float32[1, 4]"
    for lens, seed in (([2, 7, 1], 30), ([1, 2, 3, 4, 5], 31), ([0, 3], 32)):
        args = lstm_inputs(lens, seed, D=2)
        got = prog(*args)
        assert_same_ragged(got[0], stacked_lstm.program(*args)[0])


def test_no_padding_work_in_the_emulator():
    """The emulator counts every load and store: the cell statement runs once per word and layer
    (63 of the bounding domain's 6 * 3 * 6 = 108 instances), its gates 4 times that (each gate
    instance loads its [4, 4] weight once), the first layer's gates read each word 4 times."""
    args = lstm_inputs(ONE_TO_L, 21)
    prog = ft.compile(stacked_lstm.program, *args, target="cuda-emulated")
    traffic = prog.emulated_traffic(*args).set_index("buffer")
    tile = H * 4  # bytes of a [1, 4] float32 state
    ran = 3 * sum(ONE_TO_L)
    assert traffic.loc["hsss", "written_bytes"] == ran * tile
    assert traffic.loc["csss", "written_bytes"] == ran * tile
    assert traffic.loc["wss", "read_bytes"] == 4 * ran * H * tile
    assert traffic.loc["xss", "read_bytes"] == 4 * sum(ONE_TO_L) * tile
    assert ran < 3 * len(ONE_TO_L) * L


@pytest.mark.parametrize("target", ["c", "cuda-emulated"])  # the host arrays are the buffers
def test_no_padding_work_leaves_padded_cells_untouched(target, monkeypatch):
    """Every array the call allocates starts as NaN: after the call the cells within the lengths
    are written and every cell past them is still NaN (no instance past a length ran)."""
    arrays = []

    def allocate(b, shape):
        a = np.full(shape, np.nan, dtype=np.float32 if b.dtype == "float32" else b.dtype)
        arrays.append((b.name, a))
        return a
    monkeypatch.setattr(polyft.calls, "allocate", allocate)
    args = lstm_inputs(ONE_TO_L, 22)
    prog = ft.compile(stacked_lstm.program, *args, target=target, contract=False)
    prog(*args)
    out = dict(arrays)
    for name in ("hsss", "csss"):
        a = out[name]  # [N, D, L, 1, H]
        for i, n in enumerate(ONE_TO_L):
            assert np.isfinite(a[i, :, :n]).all() and np.isnan(a[i, :, n:]).all(), (name, i)


def test_memory_reports_padded_and_used_cells():
    args = lstm_inputs(ONE_TO_L, 23)
    prog = ft.compile(stacked_lstm.program, *args)
    mem = prog.memory().set_index("buffer")
    assert mem.loc["xss", "padded_cells"] == 6 * L and mem.loc["xss", "used_cells"] == sum(ONE_TO_L)
    assert mem.loc["hsss", "padded_cells"] == 6 * 3 * L and mem.loc["hsss", "used_cells"] == 3 * sum(ONE_TO_L)
    assert mem.loc["wss", "padded_cells"] == mem.loc["wss", "used_cells"] == 12
    assert mem.loc["xss_len", "role"] == "lengths"
    other = prog.memory(lengths={"xss": [1] * 6}).set_index("buffer")
    assert other.loc["hsss", "used_cells"] == 3 * 6


# ---------------------------------------------------------------------------------------
# bad input: errors before native code runs, nothing written


@pytest.fixture
def no_native(monkeypatch):
    """A compiled program whose native code must not run."""
    def compiled(fn, *args, **kw):
        prog = ft.compile(fn, *args, **kw)

        def refuse(*a, **k):
            raise AssertionError("native code ran")
        monkeypatch.setattr(prog, "_run", refuse)
        return prog
    return compiled


def test_too_long_for_the_compiled_bound(no_native):
    prog = no_native(scanned, ft.spec("[N, <=4]float32[1, 4]"))
    with pytest.raises(errors.InputError) as info:
        prog(sentences([2, 5, 1], 40))  # too-long-here
    e = info.value
    assert e.op == "call" and "input xss" in str(e) and "element [1] has length 5" in str(e) and "<=4" not in str(e)
    assert "longer than the bound 4 the program was compiled for; nothing ran" in str(e) and "too-long-here" in e.where
    at_size = no_native(scanned, ft.spec("[N, <=L]float32[1, 4]"), sizes={"L": 4})  # a symbolic bound, sized
    with pytest.raises(errors.InputError, match="element \\[1\\] has length 5, longer than the bound L = 4 the"):
        at_size(sentences([2, 5, 1], 40))


def test_fold_needs_a_word(no_native):
    prog = no_native(folded, sentences([2, 3], 41))
    with pytest.raises(errors.InputError, match=r"element \[1\] has length 0, shorter than 1 \(foldl at "):
        prog(sentences([2, 0], 42))


def test_negative_lengths():
    padded = rand((3, 4, 1, H), 43)
    with pytest.raises(errors.RaggedError) as info:
        ft.FractalTensor.from_padded(padded, [2, -1, 4])  # negative-here
    assert info.value.op == "from_padded" and "length -1 at [1]" in str(info.value)
    assert "negative-here" in info.value.where
    xss = ft.FractalTensor.from_padded(padded, [2, 0, 4])  # views of the padded rows
    assert lengths(xss) == [2, 0, 4] and np.array_equal(xss[2][3], padded[2, 3])
    assert_same_ragged(ft.compile(mapped, xss)(xss), mapped(xss))


def test_ragged_and_regular_mismatch(no_native):
    regular = no_native(mapped, flist([3, 4], (1, H), 44))
    with pytest.raises(errors.InputError, match=r"input xss is the ragged list \[3, \*\]float32\[1, 4\], but the "
                                                r"program was compiled for the regular \[3, 4\]"):
        regular(sentences([4, 2, 4], 45))
    ragged = no_native(mapped, sentences([4, 2, 4], 46))
    with pytest.raises(errors.InputError, match=r"input xss was compiled as the ragged list \[3, <=4\]float32"):
        ragged(rand((3, 4, 1, H), 47))


def test_a_regular_list_is_a_ragged_batch_of_equal_lengths():
    prog = ft.compile(scanned, sentences([4, 2, 4], 49))
    x = flist([3, 4], (1, H), 50)
    assert_same_ragged(prog(x), scanned(x))


@pytest.mark.parametrize("body, op", [
    (lambda xss: xss.map(lambda xs: xs[1:]), "a slice"),
    (lambda xss: xss.map(lambda xs: xs.scanr(lambda x, s: x + s, ft.zeros((1, H)))), "scanr"),
    (lambda xss: xss.map(lambda xs: xs.scanl(lambda s, x: x + s)), "scanl"),
    (lambda xss: xss.map(lambda xs: xs.window(2)), "window"),
    (lambda xss: ft.transpose(xss), "transpose"),
])
def test_unsupported_operations_on_a_ragged_level(body, op):
    with pytest.raises(errors.RaggedError) as info:
        ft.compile(body, sentences([3, 1, 2], 51))
    assert op in str(info.value) and "ragged" in str(info.value) and "test_ragged.py" in info.value.where


def assert_same_ragged(got, expected):
    """Same type string and lengths at every level, values within 1e-5 relative error."""
    assert isinstance(got, ft.FractalTensor) and got.type_string == expected.type_string
    assert lengths(got) == lengths(expected)
    assert rel_error(words(got), words(expected)) < 1e-5
