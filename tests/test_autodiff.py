"""ft.vjp / ft.grad: gradients of nested-list programs against torch.autograd and central finite
differences (float64), eagerly; the pullback as a compiled program (C, cuda-emulated)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nests import TRANSFORMS, Kit, bodies, list_lengths, nest_inputs, nest_program

import polyft as ft
from polyft.autodiff import DifferentiationError
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS, stacked_lstm, stacked_rnn

torch = pytest.importorskip("torch")


def ones_like_out(out):
    """Cotangents of ones for every output (the loss is the sum of the outputs)."""
    if isinstance(out, tuple):
        return tuple(ones_like_out(o) for o in out)
    return ft.FractalTensor.from_numpy(np.ones_like(out.to_numpy()), out.depth)


def torch_stacked_rnn(x, w):
    """Listing 1 in torch: every layer's outputs, summed."""
    N, L = x.shape[:2]
    total = 0
    for n in range(N):
        hs = [x[n, t] for t in range(L)]
        for d in range(w.shape[0]):
            s, new = torch.zeros_like(hs[0]), []
            for t in range(L):
                s = hs[t] @ w[d] + s
                new.append(s)
            hs = new
            total = total + sum(h.sum() for h in hs)
    return total


def torch_stacked_lstm(x, ws, us, bs):
    """Listing 2 in torch (gates i, f, o, g): every layer's h and c, summed."""
    N, L = x.shape[:2]
    total = 0
    for n in range(N):
        hs = [x[n, t] for t in range(L)]
        for d in range(ws.shape[0]):
            h = c = torch.zeros_like(hs[0])
            new = []
            for t in range(L):
                g = [hs[t] @ ws[d, k] + h @ us[d, k] + bs[d, k] for k in range(4)]
                c = torch.sigmoid(g[1]) * c + torch.sigmoid(g[0]) * torch.tanh(g[3])
                h = torch.sigmoid(g[2]) * torch.tanh(c)
                new.append(h)
                total = total + h.sum() + c.sum()
            hs = new
    return total


def torch_grads(fn, arrays):
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    fn(*ts).backward()
    return [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("workload, reference", [(stacked_rnn, torch_stacked_rnn),
                                                 (stacked_lstm, torch_stacked_lstm)])
def test_stacked_rnn_and_lstm_equal_torch(workload, reference):
    inputs = workload.inputs("small", seed=3, N=2, D=3, L=4, H=6)
    out, pullback = ft.vjp(workload.program, *inputs)
    np.testing.assert_allclose(rel_error(out, workload.program(*inputs)), 0, atol=1e-7)
    grads = pullback(ones_like_out(out))
    expected = torch_grads(reference, [x.to_numpy() for x in inputs])
    assert len(grads) == len(inputs)
    for g, e in zip(grads, expected):
        assert rel_error(g, e) < 1e-4


def rnn_case(N=2, D=3, L=4, H=8, seed=1):
    """The stacked RNN's inputs, its pullback and a random cotangent."""
    xss, ws = stacked_rnn.inputs("small", seed=seed, N=N, D=D, L=L, H=H)
    out, pullback = ft.vjp(stacked_rnn.program, xss, ws)
    rng = np.random.default_rng(seed + 1)
    ct = ft.FractalTensor.from_numpy(rng.standard_normal(out.to_numpy().shape).astype(np.float32), 3)
    return xss, ws, pullback, ct


@pytest.mark.parametrize("target", ["c", "cuda-emulated"])
def test_compiled_pullback_equals_eager(target):
    """The pullback is a program: compiled (the forward's results as its constants) it computes
    the eager gradients."""
    _, _, pullback, ct = rnn_case(D=2, L=3)
    expected = pullback(ct)
    got = ft.compile(pullback, ct, target=target)(ct)
    for g, e in zip(got, expected):
        assert rel_error(g, e) < 1e-5


def test_compiled_forward_and_backward_program():
    """vjp inside a program: forward and backward traced into one ETDG from specs (symbolic N, D, L),
    compiled to C once, equal to eager at two sizes."""
    def backward(xss, ws, ct):
        _, pullback = ft.vjp(stacked_rnn.program, xss, ws)
        return pullback(ct)

    prog = ft.compile(backward, ft.spec("[N, L]float32[1, 8]"), ft.spec("[D]float32[8, 8]"),
                      ft.spec("[N, D, L]float32[1, 8]"), target="c")
    for N, D, L in ((2, 3, 4), (1, 2, 6)):
        xss, ws, _, ct = rnn_case(N=N, D=D, L=L)
        for g, e in zip(prog(xss, ws, ct), backward(xss, ws, ct)):
            assert rel_error(g, e) < 1e-5


def wavefront_steps(prog) -> int:
    """How many time steps the backward's nest of two reversed scans (layers, time) takes under the schedule."""
    import islpy as isl
    st = next(s for s in prog.etdg.statements if [d.op for d in s.dims].count("scanr") == 2)
    times = set()
    prog.schedule.map.intersect_domain(isl.UnionSet.from_set(prog.model.domains[st.name])).range().foreach_point(
        lambda p: times.add(p.get_coordinate_val(isl.dim_type.set, 0).to_python()))
    return len(times)


@pytest.mark.parametrize("D, L", [(2, 4), (4, 4), (3, 7)])
def test_backward_schedule_is_a_reversed_wavefront(D, L):
    """Under "auto" the backward of the stacked RNN is one nest of reversed scans over layers and time
    whose instances run in L + D - 1 steps (its critical path); the whole pullback adds one step before
    (zeros, indicators) and one after (the gradients copied out)."""
    _, _, pullback, ct = rnn_case(N=1, D=D, L=L, H=4)
    prog = ft.analyze(pullback, ct)
    assert wavefront_steps(prog) == L + D - 1
    assert prog.schedule.sequential_steps == prog.schedule.critical_path <= L + D + 1


def test_lstm_backward_schedule_is_a_reversed_wavefront():
    """Under "auto" the stacked LSTM's backward reaches its critical path: each statement of the
    nest of reversed scans (layers j, time k) runs at one hyperplane over both, θ = a·j + b·k + c
    with a, b < 0 (layer j - 1 and step k - 1 start while j and k still run), where the bands
    run the layers one after the other. A time step is a chain of statements (the gates' cotangents,
    their reductions), so the slopes are that chain's length, and one more across layers, whose
    first map waits for the layer above (the top one reads the cotangent given)."""
    from polyft.schedule.schedule import time_rows
    D, L = 3, 7
    inputs = stacked_lstm.inputs("small", seed=3, N=2, D=D, L=L, H=4)
    out, pullback = ft.vjp(stacked_lstm.program, *inputs)
    prog = ft.analyze(pullback, ones_like_out(out))
    s = prog.schedule
    assert s.sequential_steps == s.critical_path < s.band_steps
    nest = [st for st in prog.etdg.statements if [d.op for d in st.dims].count("scanr") == 2]
    assert nest
    for st in nest:
        (coeffs, _), *_ = time_rows(s.hyperplanes[st.name])
        (j, k) = (n for n, d in enumerate(st.dims) if d.op == "scanr")
        assert coeffs[j] < 0 and coeffs[k] < 0, (st.name, coeffs)
    # the path grows by a step's chain per time step and layer, not by the product D * L
    assert s.critical_path <= (L + D - 1) * (max(-min(time_rows(s.hyperplanes[st.name])[0][0]) for st in nest) + 1)


def central_differences(fn, arrays, k, eps=1e-6):
    """d sum(fn(...)) / d arrays[k], by central differences in float64."""
    base = [a.copy() for a in arrays]
    grad = np.zeros_like(base[k])
    for idx in np.ndindex(base[k].shape):
        vals = []
        for sign in (1, -1):
            moved = [a.copy() for a in base]
            moved[k][idx] += sign * eps
            vals.append(fn(*moved))
        grad[idx] = (vals[0] - vals[1]) / (2 * eps)
    return grad


def mixed_program(xss, w):
    """map, scanl with a captured weight, reduce, foldr, zip, shift, reverse, slices and element math."""
    def row(xs):
        hs = xs.scanl(lambda s, x: ft.tanh(x @ w + s), np.zeros((1, 3)))
        ys = ft.map(lambda a, b: ft.sigmoid(a) * b, hs.shift(1), xs.reverse()[:-1])
        peak = ys.reduce(lambda m, y: ft.maximum(m, y), np.full((1, 3), -5.0))
        back = ys.foldr(lambda y, s: ft.softmax(y + s, axis=-1) * y + 0.5 * s, np.zeros((1, 3)))
        return ft.sum(peak * back) + ft.mean(ft.exp(hs[0] * 0.5)) + ft.sum(ft.concat((hs[1], hs[2]), axis=1)[:, 1:4])
    return xss.map(row)


def test_mixed_operators_equal_finite_differences():
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((2, 5, 1, 3)), rng.standard_normal((3, 3)) * 0.5

    def loss(x, w):
        return float(mixed_program(ft.FractalTensor.from_numpy(x, 2), w).to_numpy().sum())

    gx, gw = ft.vjp(mixed_program, ft.FractalTensor.from_numpy(x, 2), w)[1](
        ft.FractalTensor.from_numpy(np.ones((2,)), 1))
    assert rel_error(gx, central_differences(loss, [x, w], 0)) < 1e-6
    assert rel_error(gw, central_differences(loss, [x, w], 1)) < 1e-6


def test_grad_of_a_scalar_loss():
    """ft.grad: one gradient per argnum, equal to the vjp with a cotangent of 1."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((3, 4, 1, 3)), rng.standard_normal((3, 3))

    def loss(xss, w):
        return xss.map(lambda xs: xs.foldl(lambda s, x: s + ft.sum(ft.tanh(x @ w)), np.zeros(()))) \
                  .reduce(lambda a, b: a + b, np.zeros(()))

    xss = ft.FractalTensor.from_numpy(x, 2)
    gw = ft.grad(loss, argnums=1)(xss, w)
    gx, gw2 = ft.grad(loss, argnums=(0, 1))(xss, w)
    expected = torch_grads(lambda X, W: torch.tanh(X @ W).sum(), [x, w])
    assert rel_error(gw, expected[1]) < 1e-10 and rel_error(gw2, expected[1]) < 1e-10
    assert rel_error(gx, expected[0]) < 1e-10


def test_errors_name_the_operator_and_line():
    xss = ft.FractalTensor.from_numpy(np.ones((2, 3, 1, 2)), 2)
    with pytest.raises(DifferentiationError, match="grad needs a function with one scalar output") as e:
        ft.grad(lambda xss: xss.map(lambda xs: xs.reduce(lambda a, b: a + b)))(xss)
    assert e.value.op == "grad"
    with pytest.raises(DifferentiationError, match="the output int32.* integer dtype") as e:
        ft.vjp(lambda x: x.astype("int32"), np.ones((2, 2)))
    assert e.value.op == "astype" and 'x.astype("int32")' in e.value.where  # the line that made it
    with pytest.raises(DifferentiationError, match="input 1 .* integer dtype int64") as e:  # ids have no gradient
        ft.vjp(lambda xs, ids: xs.gather(ids), xss[0], ft.FractalTensor.from_numpy(np.array([0, 2]), 1))
    _, pullback = ft.vjp(lambda x: ft.scatter_add(x, np.array([0, 1, 0]), 2, combine="max"), np.ones((3, 2)))
    with pytest.raises(DifferentiationError, match="has no gradient") as e:
        pullback(np.ones((2, 2)))
    assert e.value.op == "scatter_add" and "test_autodiff.py" in e.value.where
    with pytest.raises(DifferentiationError, match="input 0 is a Python int"):
        ft.vjp(lambda x: x, 3)


# -- gather: its adjoint is a scatter-add by the same ids ------------------------------------
V, D = 7, 4


def embedding_case(seed=0, N=3, L=5):
    """A table [V]float32[1, D], ids [N, L] with repeats (id 2 three times in row 0) and a random cotangent."""
    rng = np.random.default_rng(seed)
    table = ft.FractalTensor.from_numpy(rng.standard_normal((V, 1, D)).astype(np.float32), 1)
    ids = rng.integers(0, V, (N, L))
    ids[0, :3] = 2
    w = rng.standard_normal((D, D)).astype(np.float32)
    ct = rng.standard_normal((N, L, 1, D)).astype(np.float32)
    return table, ft.FractalTensor.from_numpy(ids, 2), w, ct


def embed(table, idss, w):
    return idss.map(lambda ids: table.gather(ids).map(lambda e: ft.tanh(e @ w)))


def torch_embedding_grad(table, ids, w, ct):
    t = torch.tensor(table.to_numpy()[:, 0], requires_grad=True)
    y = torch.tanh(torch.nn.functional.embedding(torch.tensor(ids.to_numpy()), t) @ torch.tensor(w))
    (y * torch.tensor(ct[:, :, 0])).sum().backward()
    return t.grad.numpy()[:, None]


def test_gather_by_call_time_ids_equals_torch_embedding_backward():
    """ids given as a list (an input of the program): the table's gradient is torch's embedding backward."""
    table, idss, w, ct = embedding_case()
    out, pullback = ft.vjp(lambda t: embed(t, idss, w), table)
    (g,) = pullback(ft.FractalTensor.from_numpy(ct, 2))
    assert rel_error(g, torch_embedding_grad(table, idss, w, ct)) < 1e-6


@pytest.mark.parametrize("target", ["c", "cuda-emulated"])
def test_gather_by_call_time_ids_compiled(target):
    """Forward and backward in one program with the ids a program input ([N, L]int64[], read when it
    runs): compiled, equal to torch's embedding backward for two batches of ids."""
    def table_grad(table, idss, ct):
        _, pullback = ft.vjp(lambda t: embed(t, idss, w), table)
        return pullback(ct)[0]

    table, _, w, _ = embedding_case()
    prog = ft.compile(table_grad, table, ft.spec("[N, L]int64[]"), ft.spec("[N, L]float32[1, 4]"), target=target)
    for seed, (N, L) in ((1, (3, 5)), (2, (2, 6))):
        _, idss, _, ct = embedding_case(seed, N, L)
        got = prog(table, idss, ft.FractalTensor.from_numpy(ct, 2))
        assert rel_error(got, torch_embedding_grad(table, idss, w, ct)) < 1e-5


@pytest.mark.parametrize("target", [None, "c", "cuda-emulated"])
def test_gather_by_constant_ids(target):
    """Constant ids with repeats (and an element never gathered) on a list of lists: eagerly, and the
    pullback compiled, equal to numpy's add.at of the cotangents."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 3, 1, 2)).astype(np.float32)
    ids = np.array([0, 2, 2, 5, 2, 1])
    out, pullback = ft.vjp(lambda xss: xss.gather(ids).map(lambda xs: xs.map(lambda e: e * e)),
                           ft.FractalTensor.from_numpy(x, 2))
    ct = ft.FractalTensor.from_numpy(rng.standard_normal((len(ids), 3, 1, 2)).astype(np.float32), 2)
    expected = np.zeros_like(x)
    np.add.at(expected, ids, 2 * x[ids] * ct.to_numpy())
    run = pullback if target is None else ft.compile(pullback, ct, target=target)
    assert rel_error(run(ct)[0], expected) < 1e-6


@pytest.fixture
def float64_constants(monkeypatch):
    """The workloads build their constants with ft.zeros / ft.full (float32 by default): in float64
    here, so that their gradients can be checked by finite differences to 1e-6."""
    for name in ("zeros", "full"):
        make = getattr(ft, name)
        monkeypatch.setattr(ft, name, lambda *a, dtype="float64", make=make: make(*a, dtype=dtype))


def as_float64(x):
    return ft.FractalTensor.from_numpy(x.to_numpy().astype(np.float64), x.depth) if isinstance(x, ft.FractalTensor) \
        else np.asarray(x, np.float64)


def total(out) -> float:
    return float(sum(o.to_numpy().sum() for o in (out if isinstance(out, tuple) else (out,))))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_gradients_equal_finite_differences(name, float64_constants):
    """loss = the sum of the outputs: <gradient, v> equals the central difference along v for random
    directions v, in float64."""
    mod = WORKLOADS[name]
    inputs = [as_float64(x) for x in mod.inputs("small", seed=4)]
    out, pullback = ft.vjp(mod.program, *inputs)
    grads = [g.to_numpy() if hasattr(g, "to_numpy") else np.asarray(g) for g in pullback(ones_like_out(out))]
    arrays = [x.to_numpy() if hasattr(x, "to_numpy") else x for x in inputs]

    def loss(*arrs):
        return total(mod.program(*[ft.FractalTensor.from_numpy(a, x.depth) if hasattr(x, "depth") else a
                                   for a, x in zip(arrs, inputs)]))

    rng = np.random.default_rng(11)
    for _ in range(3):
        v = [rng.standard_normal(a.shape) for a in arrays]
        eps = 1e-5
        up, down = loss(*[a + eps * d for a, d in zip(arrays, v)]), loss(*[a - eps * d for a, d in zip(arrays, v)])
        fd = (up - down) / (2 * eps)
        ad = sum(float((g * d).sum()) for g, d in zip(grads, v))
        assert abs(ad - fd) <= 1e-6 * max(1.0, abs(fd))


@pytest.mark.parametrize("target", ["c", "cuda-emulated"])
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_pullbacks_compile(name, target):
    """Each workload's pullback, compiled without coarsening (one statement per operation node),
    equals the eager pullback for random cotangents (which equals central differences above)."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=5)
    out, pullback = ft.vjp(mod.program, *inputs)
    rng = np.random.default_rng(6)
    cts = [ft.FractalTensor.from_numpy(rng.standard_normal(o.to_numpy().shape).astype(np.float32), o.depth)
           for o in (out if isinstance(out, tuple) else (out,))]
    expected = pullback(*cts)
    got = ft.compile(pullback, *cts, target=target, coarsen=False)(*cts)
    for g, e in zip(got, expected):
        assert rel_error(g, e) < 1e-5


# -- random nests (tests/nests.py) against finite differences ----------------------------------
NEST_KIT = Kit(
    element={"tanh(x@w)": lambda x, w: ft.tanh(x @ w), "x*sigmoid(x)": lambda x, w: x * ft.sigmoid(x),
             "softmax(x)*w[1]": lambda x, w: ft.softmax(x, axis=-1) * w[1],
             "concat": lambda x, w: ft.concat((x[:, 1:], x[:, :1] * 0.5), axis=1),
             "x-mean(x,0)": lambda x, w: x - ft.mean(x, axis=0, keepdims=True)},
    combine={"s+x": lambda s, x, w: s + x, "tanh(s@w)+x": lambda s, x, w: ft.tanh(s @ w) + x,
             "s*exp(-x*x)": lambda s, x, w: s * ft.exp(-(x * x)), "maximum": lambda s, x, w: ft.maximum(s, x)},
    tile=(2, 3), w_shape=(3, 3), w_scale=0.5, pair={"add": lambda a, b: a + b, "a*b": lambda a, b: a * b},
    kinds=TRANSFORMS, window_pads=(0, 1, (1, 0)))


@settings(max_examples=int(os.environ.get("POLYFT_EXAMPLES", 25)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(lengths=list_lengths(), data=st.data(), seed=st.integers(0, 2 ** 16))
def test_random_nests_equal_finite_differences(lengths, data, seed):
    plan, _ = data.draw(bodies(lengths, NEST_KIT, top=True))
    xs, w = nest_inputs([n for n, _ in lengths], NEST_KIT, seed)
    x, w = xs.to_numpy().astype(np.float64), w.astype(np.float64)
    depth = xs.depth
    with pytest.MonkeyPatch.context() as mp:
        for name in ("zeros", "full"):  # the nests' constants in float64 too
            make = getattr(ft, name)
            mp.setattr(ft, name, lambda *a, dtype="float64", make=make: make(*a, dtype=dtype))
        program = nest_program(plan, NEST_KIT)
        out, pullback = ft.vjp(program, ft.FractalTensor.from_numpy(x, depth), w)
        outs = out if isinstance(out, tuple) else (out,)
        cts = [ft.FractalTensor.from_numpy(np.ones_like(o.to_numpy()), o.depth) if hasattr(o, "depth")
               else np.ones_like(o) for o in outs]
        gx, gw = pullback(*cts)

        def loss(x, w):
            res = program(ft.FractalTensor.from_numpy(x, depth), w)
            return sum(float(np.sum(r.to_numpy() if hasattr(r, "to_numpy") else r))
                       for r in (res if isinstance(res, tuple) else (res,)))

        rng = np.random.default_rng(seed)
        dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
        eps = 1e-6
        fd = (loss(x + eps * dx, w + eps * dw) - loss(x - eps * dx, w - eps * dw)) / (2 * eps)
        ad = float(np.sum(gx.to_numpy() * dx) + np.sum(np.asarray(gw) * dw))
        assert abs(ad - fd) <= 1e-5 * max(1.0, abs(fd))
