"""Issue 29's held-out-style models, written as a user would with its constructs, compiled (C,
cuda-emulated) on fresh inputs against references written independently: torch's conv1d,
embedding_bag (ragged bags), index_add, embedding backward and packed LSTM, and a CRF's partition
function by enumerating paths."""
import itertools

import numpy as np
import pytest
from helpers import rand
from test_ragged import ONE_TO_L, lstm_inputs, sentences
from test_workloads import _torch_lstm_weights

import polyft as ft
from polyft.testing import rel_error
from polyft.workloads import stacked_lstm

torch = pytest.importorskip("torch")
TARGETS = ["c", "cuda-emulated"]
C, K = 4, 3
DILATIONS = (1, 2, 4)
WAVE = [rand((C, C), 100 + k) / 2 for k in range(2 * len(DILATIONS))]
TRANS = rand((K, K), 110)


def wavenet(xs):
    """Dilated causal convolutions (kernel 2, dilation 1, 2, 4), each with a residual."""
    for k, d in enumerate(DILATIONS):
        a, b = WAVE[2 * k], WAVE[2 * k + 1]
        xs = xs.window(2, padding=(d, 0), dilation=d).map(lambda w: ft.tanh(w[0] @ a + w[1] @ b) + w[1])
    return xs


@pytest.mark.parametrize("target", TARGETS)
def test_wavenet_equals_torch_conv1d(target):
    prog = ft.compile(wavenet, ft.FractalTensor.from_numpy(rand((9, 1, C), 101), 1), target=target)
    x = rand((9, 1, C), 102)
    ref = torch.from_numpy(x[:, 0, :].T[None].copy())  # [batch 1, channels, time]
    for k, d in enumerate(DILATIONS):
        weight = torch.from_numpy(np.stack([WAVE[2 * k].T, WAVE[2 * k + 1].T], axis=2).copy())
        ref = torch.tanh(torch.nn.functional.conv1d(torch.nn.functional.pad(ref, (d, 0)), weight, dilation=d)) + ref
    assert rel_error(prog(ft.FractalTensor.from_numpy(x, 1)).to_numpy()[:, 0, :], ref[0].numpy().T) < 1e-5


def crf_log_partition(emss):
    """A linear-chain CRF's log partition function per ragged sentence (the forward algorithm)."""
    def step(alpha, em):
        return ft.logsumexp(alpha.T + TRANS, axis=0, keepdims=True) + em
    return emss.map(lambda ems: ft.logsumexp(ems.foldl(step, ft.zeros((1, K))), axis=1, keepdims=True))


def crf_by_paths(ems):
    """log sum over every tag path (a free start tag, then one per word) of exp(its score), float64."""
    scores = [sum(TRANS[p[t], p[t + 1]] + ems[t][0, p[t + 1]] for t in range(len(ems)))
              for p in itertools.product(range(K), repeat=len(ems) + 1)]
    return np.log(np.sum(np.exp(np.array(scores, np.float64))))


@pytest.mark.parametrize("target", TARGETS)
def test_crf_over_a_ragged_batch_equals_enumerating_paths(target):
    prog = ft.compile(crf_log_partition, sentences([3, 1, 4, 2], 111, K), target=target)
    emss = sentences([2, 4, 1, 3], 112, K)  # other lengths, same bound
    expected = [crf_by_paths([np.asarray(e, np.float64) for e in s]) for s in emss]
    assert rel_error(prog(emss).to_numpy().ravel(), expected) < 1e-6


V, D = 13, 5


def bag_and_segments(table, idss, segs, x):
    """A sum of embeddings per bag (a ragged list of ids given at call time), and a sum of x's
    rows per segment."""
    bags = idss.map(lambda ids: table.gather(ids).reduce(lambda s, e: s + e, ft.zeros((1, D))))
    return bags, ft.map(lambda ids, rows: ft.index_add(rows, ids, 4), segs, x)


def bag_inputs(bag_lengths, seed):
    r = np.random.default_rng(seed)
    idss = ft.FractalTensor.from_list([[np.int64(r.integers(V)) for _ in range(n)] for n in bag_lengths],
                                      element_shape=(), dtype="int64")
    return (ft.FractalTensor.from_numpy(rand((V, 1, D), seed), 1), idss,
            ft.FractalTensor.from_numpy(r.integers(0, 4, (2, 7)), 1),
            ft.FractalTensor.from_numpy(rand((2, 7, D), seed), 1))


@pytest.mark.parametrize("target", TARGETS)
def test_embedding_bag_and_index_add_equal_torch(target):
    prog = ft.compile(bag_and_segments, *bag_inputs([3, 1, 6, 2], 120), target=target)
    table, idss, segs, x = bag_inputs([4, 2, 1, 5], 122)  # fresh ids (other bag sizes) and rows
    bags, sums = prog(table, idss, segs, x)
    flat = torch.tensor([int(i) for ids in idss for i in ids])
    offsets = torch.tensor(np.cumsum([0] + [len(ids) for ids in idss][:-1]))
    ref_bags = torch.nn.functional.embedding_bag(flat, torch.from_numpy(table.to_numpy()[:, 0]), offsets, mode="sum")
    assert rel_error(bags.to_numpy()[:, 0], ref_bags.numpy()) < 1e-6
    segs, x = torch.from_numpy(segs.to_numpy()), torch.from_numpy(x.to_numpy())
    ref_sums = [torch.zeros(4, D).index_add_(0, segs[b], x[b]) for b in range(2)]
    assert rel_error(sums.to_numpy(), np.stack([s.numpy() for s in ref_sums])) < 1e-6


@pytest.mark.parametrize("target", TARGETS)
def test_ragged_stacked_lstm_equals_torch_packed_sequences(target):
    """Sentences of lengths 1..L through the stacked LSTM, against torch.nn.LSTM on the packed batch."""
    prog = ft.compile(stacked_lstm.program, *lstm_inputs(ONE_TO_L, 130), target=target)
    xss, wss, uss, bss = lstm_inputs(ONE_TO_L[::-1], 131)  # fresh words and weights
    hsss, csss = prog(xss, wss, uss, bss)
    H, depth = xss.element_shape[-1], len(wss)
    lstm = torch.nn.LSTM(H, H, num_layers=depth, batch_first=True)
    _torch_lstm_weights(lstm, wss.to_numpy(), uss.to_numpy(), bss.to_numpy(), stacked_lstm.TORCH_GATE)
    padded = torch.zeros(len(xss), max(ONE_TO_L), H)
    for i, s in enumerate(xss):
        padded[i, :len(s)] = torch.from_numpy(np.concatenate([np.asarray(w) for w in s]))
    lens = torch.tensor(ONE_TO_L[::-1])
    with torch.no_grad():
        packed, (hn, cn) = lstm(torch.nn.utils.rnn.pack_padded_sequence(padded, lens, batch_first=True,
                                                                         enforce_sorted=False))
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(packed, batch_first=True)
    for i, n in enumerate(ONE_TO_L[::-1]):
        top = np.concatenate([np.asarray(h) for h in hsss[i][depth - 1]])
        assert top.shape == (n, H) and rel_error(top, out[i, :n].numpy()) < 1e-5
        last_h = np.stack([np.asarray(hsss[i][d][n - 1])[0] for d in range(depth)])
        last_c = np.stack([np.asarray(csss[i][d][n - 1])[0] for d in range(depth)])
        assert rel_error(last_h, hn[:, i].numpy()) < 1e-5 and rel_error(last_c, cn[:, i].numpy()) < 1e-5


def table_gradient(d_rows, idss):
    """The embedding table's gradient over a batch: every sentence's row gradients added into the
    rows of its ids, the sentences summed by a reduce (a dependence chain: no two add at once)."""
    return ft.zip(d_rows, idss).reduce(lambda g, di: g + ft.scatter_add(di[0], di[1], V), ft.zeros((V, D)))


@pytest.mark.parametrize("target", TARGETS)
def test_embedding_gradient_over_a_batch_equals_torch_autograd(target):
    def inputs(seed):
        ids = np.random.default_rng(seed).integers(0, V, (4, 6))
        ids[:, :2] = 3  # the same row from every sentence
        return ft.FractalTensor.from_numpy(rand((4, 6, D), seed), 1), ft.FractalTensor.from_numpy(ids, 1)
    prog = ft.compile(table_gradient, *inputs(140), target=target)
    assert {(1,)} in prog.deps.distances.values()  # the sentences' additions in order, one after another
    d_rows, idss = inputs(141)
    weight = torch.zeros(V, D, dtype=torch.float64, requires_grad=True)
    out = torch.nn.functional.embedding(torch.from_numpy(idss.to_numpy()), weight)
    out.backward(torch.from_numpy(d_rows.to_numpy().astype(np.float64)))
    assert rel_error(np.asarray(prog(d_rows, idss)), weight.grad.numpy()) < 1e-6
