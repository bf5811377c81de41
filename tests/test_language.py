"""Issue 29's constructs (elementwise math, reshapes, ...): each eagerly against an independent numpy
(or scipy) reference, and compiled (C, cuda-emulated) against eager on fresh random inputs."""
import shutil
import subprocess

import islpy as isl
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.special import logsumexp as scipy_logsumexp

import polyft as ft
from polyft.errors import AccessError, DepthError, IndexRangeError, InputError, ShapeError, WindowError
from polyft.testing import rel_error

TARGETS = ["c", "cuda-emulated"]


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def same_values(got, expected, tol=1e-5):
    """NaN and infinities at the same places with the same signs; the finite rest within tol."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    special = ~np.isfinite(expected)
    np.testing.assert_array_equal(got[special & ~np.isnan(expected)], expected[special & ~np.isnan(expected)])
    assert rel_error(got[~special], expected[~special]) < tol


def with_specials(shape, seed):
    """Random values with NaN, +-inf, +-0 and large magnitudes planted in."""
    x = rand(shape, seed) * 3
    flat = x.reshape(-1)
    flat[:7] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 80.0, -80.0]
    np.random.default_rng(seed).shuffle(flat)
    return x


# -- elementwise and math operations --------------------------------------------------------
X = rand((4, 6), 1)
X64 = X.astype(np.float64)


def test_eager_math_against_float64_references():
    assert rel_error(ft.softplus(X), np.log1p(np.exp(X64))) < 1e-6
    assert rel_error(ft.log1p(np.abs(X)), np.log(1 + np.abs(X64))) < 1e-6
    assert rel_error(ft.abs(X), np.sqrt(X64 * X64)) < 1e-7
    assert rel_error(ft.pow(np.abs(X), 1.5), np.exp(1.5 * np.log(np.abs(X64)))) < 1e-6
    mask = (X > 0).astype(np.float32)
    assert rel_error(ft.where(mask, X, -X), np.abs(X64)) < 1e-7
    for axis, keepdims in ((None, False), (1, True), (0, False), ((0, 1), True)):
        got = ft.logsumexp(X, axis, keepdims)
        expected = np.log(np.sum(np.exp(X64), axis=axis, keepdims=keepdims))
        assert np.shape(got) == np.shape(expected) and rel_error(got, expected) < 1e-6


def test_eager_edge_cases_are_numpys_and_scipys():
    big = np.array([1e4, -1e4, np.nan, np.inf, -np.inf], np.float32)
    with np.errstate(invalid="ignore"):
        same_values(ft.softplus(big), [1e4, 0, np.nan, np.inf, 0])
    rows = np.array([[-np.inf, -np.inf], [np.inf, 1], [np.nan, 1], [np.inf, -np.inf], [1e4, 1e4]], np.float32)
    same_values(ft.logsumexp(rows, axis=1), scipy_logsumexp(rows, axis=1))
    assert ft.logsumexp(rows, axis=1).dtype == np.float32
    assert ft.where(np.float32([np.nan, 0]), np.float32([1, 1]), np.float32([2, 2])).tolist() == [1, 2]
    assert str(ft.abs(np.float32(-0.0))) == "0.0" and (X ** 2).dtype == np.float32


def math_program(xs, ms):
    """Every new operation, traced through Python's operators where it has one."""
    def f(x, m):
        s = ft.softplus(x) + ft.log1p(abs(x)) + abs(x) ** 1.5 - 2 ** x
        return ft.where(m, s, ft.logsumexp(x, axis=1, keepdims=True)) + ft.logsumexp(x) + ft.pow(x * x, m)
    return ft.map(f, xs, ms)


@pytest.mark.parametrize("target", TARGETS)
def test_compiled_math_equals_eager_on_fresh_inputs(target):
    xs = ft.FractalTensor.from_numpy(rand((5, 4, 6), 2), 1)
    ms = ft.FractalTensor.from_numpy((rand((5, 4, 6), 3) > 0).astype(np.float32) * rand((5, 4, 6), 4), 1)
    prog = ft.compile(math_program, xs, ms, target=target)
    fresh = ft.FractalTensor.from_numpy(rand((5, 4, 6), 5), 1)
    with np.errstate(all="ignore"):
        expected = math_program(fresh, ms)
    same_values(prog(fresh, ms).to_numpy(), expected.to_numpy())


def edge_program(xs):
    return ft.map(lambda x: (ft.softplus(x), abs(x), ft.log1p(x), ft.logsumexp(x, axis=1),
                             ft.where(x, x ** 2, -1.0), ft.pow(2.0, x)), xs)


@pytest.mark.parametrize("target", TARGETS)
def test_compiled_edge_cases_equal_eager(target):
    """NaN, +-inf, -0 and overflowing values give numpy's results (positions of NaN and inf too)."""
    xs = ft.FractalTensor.from_numpy(with_specials((3, 4, 5), 6), 1)
    prog = ft.compile(edge_program, xs, target=target)
    with np.errstate(all="ignore"):
        expected = edge_program(xs)
    for got, want in zip(prog(xs), expected):
        same_values(got.to_numpy(), want.to_numpy())
    assert not np.signbit(prog(xs)[1].to_numpy()).any()  # |-0| is +0


def test_compiled_integer_math_and_a_fractional_mask():
    """Integer abs, powers and where stay integers; a mask of 0.5 is true (not cast to an int 0)."""
    ints = ft.FractalTensor.from_numpy(np.random.default_rng(7).integers(-9, 9, (4, 3)).astype(np.int64), 1)
    mask = np.float32([0.5, 0, -2])

    def f(xs):
        return ft.map(lambda x: ft.where(mask, abs(x) ** 2, x), xs)
    got = ft.compile(f, ints)(ints)
    assert got.dtype == "int64"
    np.testing.assert_array_equal(got.to_numpy(), np.where(mask != 0, np.abs(ints.to_numpy()) ** 2, ints.to_numpy()))


def test_math_shape_errors_name_the_operation():
    with pytest.raises(ShapeError, match="where.*broadcast"):
        ft.where(np.ones(3, np.float32), X, X)
    with pytest.raises(ShapeError, match="logsumexp.*axis 2"):
        ft.logsumexp(X, axis=2)
    xs = ft.FractalTensor.from_numpy(rand((2, 4, 6), 8), 1)
    with pytest.raises(ShapeError, match="where") as e:
        ft.trace(lambda xs: ft.map(lambda x: ft.where(x[:, :2], x, x), xs), xs)
    assert "test_language.py" in str(e.value)


# -- element reshapes -----------------------------------------------------------------------
def _factor(n, draw):
    """A random shape of n elements (rank 1 to 3)."""
    dims = []
    for _ in range(draw(st.integers(0, 2))):
        d = draw(st.sampled_from([k for k in range(1, n + 1) if n % k == 0]))
        dims.append(d)
        n //= d
    return tuple(dims + [n])


@st.composite
def reshape_chains(draw):
    """An element shape and 1-3 steps, each (kind, argument, numpy's function of it)."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    steps, cur = [], shape
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["reshape", "squeeze", "unsqueeze", "permute", "newaxis"]))
        if kind == "reshape":
            arg = _factor(int(np.prod(cur)), draw)
            cur = arg
        elif kind == "squeeze":
            arg = None
            cur = tuple(n for n in cur if n != 1)
        elif kind == "unsqueeze":
            arg = draw(st.integers(-len(cur) - 1, len(cur)))
            cur = np.expand_dims(np.zeros(cur), arg).shape
        elif kind == "permute":
            arg = tuple(draw(st.permutations(range(len(cur)))))
            cur = tuple(cur[a] for a in arg)
        else:
            arg = draw(st.integers(0, len(cur)))  # x[:, :, None] with `arg` slices before it
            cur = cur[:arg] + (1,) + cur[arg:]
        steps.append((kind, arg))
    return shape, steps


def apply_chain(x, steps):
    """The chain with polyft's functions (eager or traced)."""
    for kind, arg in steps:
        x = {"reshape": lambda: x.reshape(arg), "squeeze": lambda: ft.squeeze(x, arg),
             "unsqueeze": lambda: ft.unsqueeze(x, arg), "permute": lambda: ft.transpose(x, arg),
             "newaxis": lambda: x[(slice(None),) * arg + (None,)]}[kind]()
    return x * 2.0


def numpy_chain(x, steps):
    """The same chain with numpy's own functions: the independent reference."""
    for kind, arg in steps:
        x = {"reshape": lambda: np.reshape(x, arg), "squeeze": lambda: np.squeeze(x),
             "unsqueeze": lambda: np.expand_dims(x, arg), "permute": lambda: np.transpose(x, arg),
             "newaxis": lambda: np.expand_dims(x, arg)}[kind]()
    return x * 2.0


@settings(max_examples=25, deadline=None)
@given(reshape_chains(), st.integers(0, 2 ** 16))
def test_property_reshape_chains_compiled_equal_numpy(chain, seed):
    shape, steps = chain
    xs = ft.FractalTensor.from_numpy(rand((3,) + shape, seed), 1)
    expected = np.stack([numpy_chain(x, steps) for x in xs.to_numpy()])
    np.testing.assert_array_equal(ft.map(lambda x: apply_chain(x, steps), xs).to_numpy(), expected)
    fresh = ft.FractalTensor.from_numpy(rand((3,) + shape, seed + 1), 1)
    for target in TARGETS:
        prog = ft.compile(lambda xs: ft.map(lambda x: apply_chain(x, steps), xs), xs, target=target)
        np.testing.assert_array_equal(prog(fresh).to_numpy(),
                                      np.stack([numpy_chain(x, steps) for x in fresh.to_numpy()]), err_msg=target)


def heads_program(xs, wq):
    """Attention heads split by reshape and a permute, joined by concat (the README's encoder)."""
    L, D = xs.element_shape
    H = 2

    def attend(x):
        q = (x @ wq).reshape(L, H, D // H).transpose(1, 0, 2)  # [H, L, D/H]
        heads = [ft.softmax(q[h] @ q[h].T, axis=-1) @ q[h] for h in range(H)]
        return ft.concat(heads, axis=1) + ft.squeeze(x[None], 0)
    return xs.map(attend)


@pytest.mark.parametrize("target", TARGETS)
def test_heads_split_by_reshape_compile_and_equal_a_numpy_reference(target):
    xs, wq = ft.FractalTensor.from_numpy(rand((3, 6, 8), 9), 1), rand((8, 8), 10) / 3
    prog = ft.compile(heads_program, xs, wq, target=target)
    fresh = rand((3, 6, 8), 11)
    q = (fresh.astype(np.float64) @ wq).reshape(3, 6, 2, 4).transpose(0, 2, 1, 3)
    s = q @ q.transpose(0, 1, 3, 2)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ q  # [3, H, L, dh]
    expected = o.transpose(0, 2, 1, 3).reshape(3, 6, 8) + fresh
    assert rel_error(prog(ft.FractalTensor.from_numpy(fresh, 1), wq), expected) < 1e-5


def test_an_elements_flatten_is_numpys_not_the_list_operator():
    xs = ft.FractalTensor.from_numpy(rand((2, 3, 4), 13), 1)
    prog = ft.compile(lambda xs: xs.map(lambda x: x.flatten() * 2.0), xs)
    np.testing.assert_array_equal(prog(xs).to_numpy(), xs.to_numpy().reshape(2, 12) * 2)


def test_reshape_errors_name_the_operation_the_shapes_and_the_line():
    with pytest.raises(ShapeError, match=r"reshape: cannot reshape \[4, 6\] \(24 elements\) into \[5, 5\]"):
        ft.reshape(X, (5, 5))
    with pytest.raises(ShapeError, match="squeeze: axis 0 of"):
        ft.squeeze(X, 0)
    xs = ft.FractalTensor.from_numpy(rand((2, 4, 6), 12), 1)
    with pytest.raises(ShapeError, match=r"\[4, 6\] \(24 elements\) into \[5, -1\]") as e:
        ft.compile(lambda xs: xs.map(lambda x: x.reshape(5, -1)), xs)  # bad-reshape
    assert e.value.op == "reshape" and "bad-reshape" in str(e.value)
    with pytest.raises(ShapeError, match="one -1 at most"):
        ft.reshape(X, (-1, -1))


# -- list reshapes: transpose of list dims, flatten, split, dilated windows ------------------
@st.composite
def list_chains(draw):
    """List lengths (depth 2 or 3) and 1-3 list reshapes valid for them."""
    lengths = tuple(draw(st.lists(st.integers(1, 4), min_size=2, max_size=3)))
    steps, cur = [], lengths
    for _ in range(draw(st.integers(1, 3))):
        kinds = ["split", "window"] + (["transpose", "flatten"] if len(cur) >= 2 else []) + \
            (["permute3"] if len(cur) >= 3 else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "transpose":
            arg, cur = None, (cur[1], cur[0]) + cur[2:]
        elif kind == "permute3":
            arg = tuple(draw(st.permutations(range(3))))
            cur = tuple(cur[a] for a in arg) + cur[3:]
        elif kind == "flatten":
            arg, cur = None, (cur[0] * cur[1],) + cur[2:]
        elif kind == "split":
            arg = draw(st.sampled_from([k for k in range(1, cur[0] + 1) if cur[0] % k == 0]))
            cur = (cur[0] // arg, arg) + cur[1:]
        else:
            size, dilation = draw(st.integers(1, 3)), draw(st.integers(1, 3))
            span = (size - 1) * dilation + 1
            pad = draw(st.integers(0, span - 1))
            if span > cur[0] + 2 * pad:
                continue
            stride = draw(st.integers(1, 3))
            arg = (size, stride, pad, dilation)
            cur = ((cur[0] + 2 * pad - span) // stride + 1, size) + cur[1:]
        steps.append((kind, arg))
        if len(cur) > 4:
            break
    return lengths, steps


def apply_list_chain(xs, steps):
    for kind, arg in steps:
        xs = {"transpose": lambda: ft.transpose(xs), "permute3": lambda: ft.transpose(xs, arg),
              "flatten": lambda: xs.flatten(), "split": lambda: xs.split(arg),
              "window": lambda: xs.window(arg[0], arg[1], arg[2], dilation=arg[3])}[kind]()
    return xs


def numpy_list_chain(a, steps):
    """The same views on a dense array whose leading axes are the list dims."""
    for kind, arg in steps:
        if kind == "transpose":
            a = np.swapaxes(a, 0, 1)
        elif kind == "permute3":
            a = np.transpose(a, arg + tuple(range(3, a.ndim)))
        elif kind == "flatten":
            a = a.reshape((-1,) + a.shape[2:])
        elif kind == "split":
            a = a.reshape((-1, arg) + a.shape[1:])
        else:
            size, stride, pad, dilation = arg
            p = np.concatenate([np.zeros((pad,) + a.shape[1:], a.dtype), a, np.zeros((pad,) + a.shape[1:], a.dtype)])
            count = (len(p) - (size - 1) * dilation - 1) // stride + 1
            a = p[np.arange(count)[:, None] * stride + np.arange(size)[None, :] * dilation]
    return a


@settings(max_examples=25, deadline=None)
@given(list_chains(), st.integers(0, 2 ** 16))
def test_property_list_reshapes_are_views_equal_to_numpy_eagerly_and_compiled(chain, seed):
    lengths, steps = chain
    a = rand(lengths + (2,), seed)
    xs = ft.FractalTensor.from_numpy(a, len(lengths))
    expected = numpy_list_chain(a, steps)
    got = apply_list_chain(xs, steps)
    np.testing.assert_array_equal(got.to_numpy(), expected)
    fresh = rand(lengths + (2,), seed + 1)
    for target in TARGETS:
        prog = ft.compile(lambda xs: apply_list_chain(xs, steps), xs, target=target)
        np.testing.assert_array_equal(prog(ft.FractalTensor.from_numpy(fresh, len(lengths))).to_numpy(),
                                      numpy_list_chain(fresh, steps), err_msg=target)


def blocked_matmul(a, b):
    """C[i][j] = sum_k A[i][k] @ B[k][j] over tiles: B's tile columns by ft.transpose, no rearranging."""
    def row(a_row):
        return ft.transpose(b).map(lambda b_col: ft.zip(a_row, b_col).reduce(
            lambda s, ab: s + ab[0] @ ab[1], ft.zeros((a.element_shape[0], b.element_shape[1]))))
    return a.map(row)


@pytest.mark.parametrize("target", TARGETS)
def test_blocked_matmul_over_transposed_tiles_is_one_matmul(target):
    A, B = rand((3, 4, 8, 4), 20), rand((4, 2, 4, 8), 21)
    a, b = ft.FractalTensor.from_numpy(A, 2), ft.FractalTensor.from_numpy(B, 2)
    dense = A.astype(np.float64).transpose(0, 2, 1, 3).reshape(24, 16) @ \
        B.astype(np.float64).transpose(0, 2, 1, 3).reshape(16, 16)  # the whole matrices
    expected = dense.reshape(3, 8, 2, 8).transpose(0, 2, 1, 3)
    assert rel_error(blocked_matmul(a, b), expected) < 1e-5
    prog = ft.compile(blocked_matmul, a, b, target=target)
    assert rel_error(prog(a, b), expected) < 1e-5
    assert {buf.kind for buf in prog.etdg.buffers} <= {"input", "output", "intermediate"}
    assert not any("transpose" in str(buf) for buf in prog.etdg.buffers)


def test_list_views_share_the_elements_eagerly_and_copy_nothing_when_traced():
    xss = ft.FractalTensor.from_numpy(rand((3, 4, 2), 22), 2)
    t = ft.transpose(xss)
    assert all(t[j][i] is xss[i][j] for i in range(3) for j in range(4))
    assert t.flatten()[5] is xss[2][1] and xss.flatten().split(4)[2][3] is xss[2][3]
    etdg = ft.trace(lambda xss: ft.transpose(xss).flatten().split(2).window(2, dilation=2).map(
        lambda ws: ws.map(lambda w: w.map(lambda v: v * 2.0))), xss)
    assert [b.kind for b in etdg.buffers] == ["input", "output"]  # views only: one statement reads xss


def test_list_reshapes_with_symbolic_lengths():
    """split assumes its size divides N; flatten needs a concrete inner length (t // J, t % J)."""
    xs = ft.FractalTensor.from_numpy(rand((3, 6, 2), 23), 2)
    prog = ft.compile(lambda xs: ft.transpose(xs).flatten().split(3).map(lambda y: y.map(lambda v: v + 1.0)),
                      ft.spec("[3, N]float32[2]"))
    np.testing.assert_array_equal(prog(xs).to_numpy(), np.swapaxes(xs.to_numpy(), 0, 1).reshape(6, 3, 2) + 1)
    with pytest.raises(AccessError, match="flatten: the inner length M is symbolic"):
        ft.trace(lambda xs: xs.flatten(), ft.spec("[3, M]float32[2]"))


def test_list_reshape_errors_name_the_operator():
    xs = ft.FractalTensor.from_numpy(rand((6, 2), 24), 1)
    with pytest.raises(WindowError, match="split: chunks of 4 do not divide"):
        xs.split(4)
    with pytest.raises(WindowError, match="split"):
        ft.trace(lambda xs: xs.split(4), xs)
    with pytest.raises(DepthError, match="transpose: swaps the two outer list dims"):
        ft.transpose(xs)
    with pytest.raises(WindowError, match="dilated by 3"):
        xs.window(3, dilation=3)
    with pytest.raises(WindowError, match="dilated by 3"):
        ft.trace(lambda xs: xs.window(3, dilation=3), xs)
    with pytest.raises(WindowError, match="< the span"):
        xs.window(2, padding=4, dilation=3)


# -- runtime gather: ids given at call time ------------------------------------------------
def embed(table, idss):
    """An embedding lookup by token ids known only at call time, then a layer on each row."""
    return idss.map(lambda ids: table.gather(ids).map(lambda e: ft.tanh(e * 2.0)))


def ids_of(shape, bound, seed, dtype=np.int64):
    return ft.FractalTensor.from_numpy(np.random.default_rng(seed).integers(0, bound, shape).astype(dtype),
                                       len(shape))


@pytest.mark.parametrize("target", TARGETS)
def test_embedding_lookup_by_call_time_ids_equals_numpy_indexing(target):
    table = ft.FractalTensor.from_numpy(rand((11, 1, 4), 30), 1)
    prog = ft.compile(embed, ft.spec("[V]float32[1, 4]"), ft.spec("[N, L]int64[]"), target=target)
    for seed, (n, length) in ((31, (3, 5)), (32, (2, 7))):  # fresh ids, other lengths, one program
        idss = ids_of((n, length), 11, seed)
        expected = np.tanh(2.0 * table.to_numpy().astype(np.float64)[idss.to_numpy()])
        assert rel_error(embed(table, idss), expected) < 1e-6
        assert rel_error(prog(table, idss), expected) < 1e-6


@pytest.mark.parametrize("target", TARGETS)
def test_runtime_gather_is_a_may_read_of_the_whole_dim_and_int32_ids_work(target):
    table = ft.FractalTensor.from_numpy(rand((6, 2), 33), 1)
    prog = ft.compile(lambda table, ids: table.gather(ids).map(lambda e: e + 1.0), table,
                      ids_of((9,), 6, 34, np.int32), target=target)
    ids = ids_of((9,), 6, 32, np.int32)  # fresh ids
    np.testing.assert_array_equal(prog(table, ids).to_numpy(), table.to_numpy()[ids.to_numpy()] + 1)
    reads = str(prog.model.reads)
    assert "table[" in reads and "0 <= g0 <= 5" in reads.replace("g0 < 6", "g0 <= 5")  # every row may be read


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bad", [11, -1, 2 ** 40])
def test_out_of_range_ids_are_an_input_error_before_native_code_runs(target, bad, monkeypatch):
    table = ft.FractalTensor.from_numpy(rand((11, 1, 4), 35), 1)
    prog = ft.compile(embed, table, ids_of((3, 5), 11, 36), target=target)
    ids = ids_of((3, 5), 11, 37).to_numpy()
    ids[2, 1] = bad
    monkeypatch.setattr(prog, "_run", lambda *args: pytest.fail("native code ran"))
    with pytest.raises(InputError) as e:
        prog(table, ft.FractalTensor.from_numpy(ids, 2))
    assert e.value.op == "gather" and f"idss[2, 1] = {bad}" in str(e.value) and "[0, 11)" in str(e.value)
    assert "table.gather(ids)" in str(e.value)  # the user's line of the gather
    with pytest.raises(IndexRangeError, match="gather"):  # eagerly: the gather's own check
        embed(table, ft.FractalTensor.from_numpy(ids, 2))


def ragged_ids(lengths, bound, seed):
    rng = np.random.default_rng(seed)
    return ft.FractalTensor.from_list([[np.int64(rng.integers(bound)) for _ in range(n)] for n in lengths],
                                      element_shape=(), dtype="int64")


@pytest.mark.parametrize("target", TARGETS)
def test_ragged_token_ids_from_a_spec(target, monkeypatch):
    """Sentences of different lengths looked up by one program; an id out of range is found within
    the lengths, before native code runs."""
    table = ft.FractalTensor.from_numpy(rand((11, 1, 4), 42), 1)
    prog = ft.compile(embed, ft.spec("[V]float32[1, 4]"), ft.spec("[N, <=L]int64[]"), target=target)
    idss = ragged_ids([3, 1, 5], 11, 43)
    got = prog(table, idss)
    assert got.type_string == "[3, *]float32[1, 4]" and [len(s) for s in got] == [3, 1, 5]
    expected = [np.tanh(2.0 * table.to_numpy().astype(np.float64)[[int(i) for i in ids]]) for ids in idss]
    assert rel_error(np.concatenate([np.stack(list(map(np.asarray, s))) for s in got]), np.concatenate(expected)) < 1e-6
    bad = ft.FractalTensor.from_list([[np.int64(1)] * 2, [np.int64(-3)], [np.int64(0)]], element_shape=(),
                                     dtype="int64")
    monkeypatch.setattr(prog, "_run", lambda *args: pytest.fail("native code ran"))
    with pytest.raises(InputError, match=r"gather: index idss\[1, 0\] = -3 is outside \[0, 11\)"):
        prog(table, bad)


def test_runtime_gather_ids_that_are_not_an_input_are_refused_at_tracing():
    table = ft.FractalTensor.from_numpy(rand((6, 2), 38), 1)
    ids = ids_of((4,), 6, 39)
    with pytest.raises(AccessError, match="gather: runtime gather ids must be a program input"):
        ft.trace(lambda table, ids: table.gather(ids.reverse()), table, ids)
    with pytest.raises(AccessError, match="integer scalars"):
        ft.trace(lambda table, xs: table.gather(xs), table, table)


@pytest.mark.parametrize("target", TARGETS)
def test_runtime_gather_from_a_computed_list_waits_for_all_of_it(target):
    """The may-read of the whole dim orders the gather after every write of the table it reads."""
    table = ft.FractalTensor.from_numpy(rand((7, 1, 4), 40), 1)

    def f(table, ids):
        return table.map(lambda e: e * 3.0).gather(ids).map(lambda e: e + 1.0)
    ids = ids_of((9,), 7, 41)
    prog = ft.compile(f, table, ids, target=target)
    assert rel_error(prog(table, ids), 3.0 * table.to_numpy()[ids.to_numpy()] + 1.0) < 1e-6
    every_pair = isl.UnionMap("{ S_b0[g] -> S_b1[q] : 0 <= g < 7 and 0 <= q < 9 }")
    assert every_pair.is_subset(prog.deps.may_flow)  # each gathered row after each write of the table
    assert prog.deps.flow.is_empty()  # no exact dependence: the ids are not known when it is scheduled


# -- scatter_add / index_add -----------------------------------------------------------------
def table_gradient(d_rows, idss, V=7):
    """The embedding's gradient: each sentence's row gradients added into the rows of its token ids."""
    return ft.map(lambda d, ids: ft.scatter_add(d, ids, V), d_rows, idss)


def segment_max(xs, segs, S=5):
    return ft.map(lambda x, s: ft.index_add(ft.relu(x), s, S, combine="max"), xs, segs)


def loop_reference(x, ids, n, combine):
    """out[ids[q]] (+)= x[q] by a Python loop in float64: the independent reference."""
    out = np.zeros((n,) + x.shape[1:]) if combine == "sum" else np.full((n,) + x.shape[1:], -np.inf)
    for q, k in enumerate(ids):
        out[k] = out[k] + x[q] if combine == "sum" else np.maximum(out[k], x[q])
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("program, n, combine", [(table_gradient, 7, "sum"), (segment_max, 5, "max")])
def test_scatter_add_equals_a_loop_with_repeated_ids(target, program, n, combine):
    x = rand((3, 9, 4), 50)
    ids = np.random.default_rng(51).integers(0, n, (3, 9))
    ids[:, :3] = 1  # repeated ids: the writes to one row must all land
    xs, idss = ft.FractalTensor.from_numpy(x, 1), ft.FractalTensor.from_numpy(ids.astype(np.int64), 1)
    src = np.maximum(x, 0) if combine == "max" else x
    expected = np.stack([loop_reference(src[b].astype(np.float64), ids[b], n, combine) for b in range(3)])
    got_eager = program(xs, idss).to_numpy()
    np.testing.assert_array_equal(np.isinf(got_eager), np.isinf(expected))  # rows no id names: -inf for max
    finite = np.isfinite(expected)
    assert rel_error(got_eager[finite], expected[finite]) < 1e-6
    prog = ft.compile(program, xs, idss, target=target)
    fresh = rand((3, 9, 4), 52)
    src = np.maximum(fresh, 0) if combine == "max" else fresh
    expected = np.stack([loop_reference(src[b].astype(np.float64), ids[b], n, combine) for b in range(3)])
    got = prog(ft.FractalTensor.from_numpy(fresh, 1), idss).to_numpy()
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    assert rel_error(got[np.isfinite(expected)], expected[np.isfinite(expected)]) < 1e-6


def test_scatter_ids_are_checked_on_each_call_and_must_come_from_an_input(monkeypatch):
    xs = ft.FractalTensor.from_numpy(rand((2, 9, 4), 53), 1)
    ids = np.random.default_rng(54).integers(0, 7, (2, 9)).astype(np.int64)
    prog = ft.compile(table_gradient, xs, ft.FractalTensor.from_numpy(ids, 1))
    ids[1, 4] = 7
    monkeypatch.setattr(prog, "_run", lambda *args: pytest.fail("native code ran"))
    with pytest.raises(InputError) as e:
        prog(xs, ft.FractalTensor.from_numpy(ids, 1))
    assert e.value.op == "scatter_add" and "idss[1, 4] = 7" in str(e.value) and "[0, 7)" in str(e.value)
    with pytest.raises(IndexRangeError, match="scatter_add: id 7 at 4"):
        table_gradient(xs, ft.FractalTensor.from_numpy(ids, 1))
    with pytest.raises(AccessError, match="scatter_add: the ids .* must be read from a program input"):
        ft.trace(lambda xs, idss: ft.map(lambda d, i: ft.scatter_add(d, i + 1, 8), xs, idss), xs,
                 ft.FractalTensor.from_numpy(ids, 1))
    with pytest.raises(ShapeError, match=r"scatter_add: needs x \[L, ...\] and ids \[L\]"):
        ft.scatter_add(rand((9, 4), 55), np.zeros(8, np.int64), 3)


SEGMENTS = np.array([3, 0, 3, 1, 0, 3, 2, 2, 0])  # ids known when traced: no row 4


def segment_sum_and_max(xs):
    return xs.map(lambda x: (ft.scatter_add(x, SEGMENTS, 5), ft.index_add(x, SEGMENTS, 5, combine="max")))


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_add_by_ids_known_when_traced_equals_numpys_ufunc_at(target):
    prog = ft.compile(segment_sum_and_max, ft.FractalTensor.from_numpy(rand((2, 9, 3), 56), 1), target=target)
    x = rand((2, 9, 3), 57).astype(np.float64)
    sums, maxes = np.zeros((2, 5, 3)), np.full((2, 5, 3), -np.inf)
    for b in range(2):
        np.add.at(sums[b], SEGMENTS, x[b])
        np.maximum.at(maxes[b], SEGMENTS, x[b])
    got_sum, got_max = prog(ft.FractalTensor.from_numpy(x.astype(np.float32), 1))
    same_values(got_sum.to_numpy(), sums)
    same_values(got_max.to_numpy(), maxes)  # row 4: -inf


# -- the CUDA target's source for all of it compiles for real GPUs ---------------------------
def everything(table, idss, idt, xs):
    """Each new construct once: math, a permute and reshapes, a runtime gather (ids as a list),
    scatter_add (ids as a tensor), a list transpose and a dilated window."""
    def row(ids, i, x):
        e = table.gather(ids).map(lambda t: ft.softplus(t) ** 2 + ft.where(t, abs(t), ft.log1p(t * t)))
        g = ft.scatter_add(x, i, 11, combine="max")
        h = ft.transpose(x.reshape(2, 3, 2), (2, 0, 1)).reshape(6, 2)[None]
        return e, g + ft.logsumexp(g, axis=1, keepdims=True), ft.squeeze(h, 0)
    emb, g, h = ft.map(row, idss, idt, xs)
    return emb, g, h, ft.transpose(emb.window(2, dilation=2)).map(lambda w: w.map(lambda r: r.map(lambda v: v * 2.0)))


def everything_inputs(seed):
    table = ft.FractalTensor.from_numpy(rand((11, 1, 4), seed), 1)
    ids = np.random.default_rng(seed + 1).integers(0, 11, (3, 6)).astype(np.int64)
    return (table, ft.FractalTensor.from_numpy(ids, 2), ft.FractalTensor.from_numpy(ids, 1),
            ft.FractalTensor.from_numpy(rand((3, 6, 2), seed + 2), 1))


@pytest.mark.parametrize("target", TARGETS)
def test_every_construct_in_one_program_equals_eager(target):
    prog = ft.compile(everything, *everything_inputs(60), target=target)
    args = everything_inputs(63)  # fresh values and ids
    with np.errstate(all="ignore"):
        expected = everything(*args)
    for g, e in zip(prog(*args), expected):
        same_values(g.to_numpy(), e.to_numpy())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_nvcc_compiles_every_construct_for_sm80_and_sm90(tmp_path):
    from polyft.emit.cuda_target import CudaTarget
    prog = ft.analyze(everything, *everything_inputs(60))
    (tmp_path / "k.cu").write_text(CudaTarget().generate(prog.model, prog.schedule).source)
    r = subprocess.run(["nvcc", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
                        "-c", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_an_embedding_before_a_stacked_lstm_keeps_its_schedule():
    """The may-read of the whole table creates no dependence (the table is an input): the tagger's
    schedule runs in as many sequential steps as the LSTM fed with embedded inputs, and both equal eager."""
    from polyft.workloads import stacked_lstm

    _, wss, uss, bss = stacked_lstm.inputs("small", N=2, D=2, L=5, H=8)
    table = ft.FractalTensor.from_numpy(rand((13, 1, 8), 70), 1)
    idss = ids_of((2, 5), 13, 71)

    def head(hsss):
        return hsss.map(lambda hss: hss[-1].map(lambda h: ft.logsumexp(h, axis=1, keepdims=True) - h))

    def tagger(table, idss, wss, uss, bss):
        return head(stacked_lstm.program(idss.map(lambda ids: table.gather(ids)), wss, uss, bss)[0])

    def embedded(xss, wss, uss, bss):
        return head(stacked_lstm.program(xss, wss, uss, bss)[0])
    xss = ft.FractalTensor.from_numpy(table.to_numpy()[idss.to_numpy()], 2)
    expected = embedded(xss, wss, uss, bss)
    prog = ft.compile(tagger, table, idss, wss, uss, bss)
    assert rel_error(prog(table, idss, wss, uss, bss), expected) < 1e-5
    assert prog.schedule.sequential_steps == ft.analyze(embedded, xss, wss, uss, bss).schedule.sequential_steps
