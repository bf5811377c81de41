"""A character-level language model for the interop tests: an embedding, a two-layer LSTM and a
linear read-out, over a public-domain passage (the opening of Lewis Carroll's "Alice's Adventures
in Wonderland", 1865). The LSTM is polyft's stacked LSTM (polyft.workloads.stacked_lstm) run
through ft.torch.function / ft.jax.function; the reference is torch.nn.LSTM with the same weights.

The polyft models keep their parameters in torch.nn.LSTM's layout (weight_ih_l{d} [4H, H],
weight_hh_l{d} [4H, H], bias_ih_l{d}, bias_hh_l{d} [4H], gates stacked i, f, g, o) and build the
program's inputs from them inside the differentiated graph, so Adam (elementwise) updates the same
numbers in both models: our gate j (i, f, o, g) is torch's block TORCH_GATE[j], a weight enters
transposed (x @ w), and the two biases enter as their sum.
"""
from __future__ import annotations

import numpy as np

import polyft as ft
from polyft.workloads import stacked_lstm

TEXT = ("Alice was beginning to get very tired of sitting by her sister on the bank, and of having "
        "nothing to do: once or twice she had peeped into the book her sister was reading, but it had no "
        "pictures or conversations in it, 'and what is the use of a book,' thought Alice 'without pictures "
        "or conversations?' So she was considering in her own mind (as well as she could, for the hot day "
        "made her feel very sleepy and stupid), whether the pleasure of making a daisy-chain would be worth "
        "the trouble of getting up and picking the daisies, when suddenly a White Rabbit with pink eyes ran "
        "close by her.")
CHARS = sorted(set(TEXT))
IDS = np.array([CHARS.index(c) for c in TEXT], np.int64)
D = 2  # layers
GATES = np.array(stacked_lstm.TORCH_GATE)  # indexes torch tensors and JAX arrays alike


def top_layer(xss, wss, uss, bss):
    """The stacked LSTM's top layer: xss [N, L]float32[1, H] -> [N, L]float32[1, H]."""
    hsss, _ = stacked_lstm.program(xss, wss, uss, bss)
    return hsss.map(lambda hss: hss[-1])


def specs(H: int, dtype: str = "float32"):
    """N and L symbolic; the two layers concrete (the gradient of hss[-1] needs the length)."""
    return (ft.spec(f"[N, L]{dtype}[1, {H}]"), ft.spec(f"[{D}, 4]{dtype}[{H}, {H}]"),
            ft.spec(f"[{D}, 4]{dtype}[{H}, {H}]"), ft.spec(f"[{D}, 4]{dtype}[1, {H}]"))


def batches(steps: int, N: int, L: int, seed: int = 0):
    """`steps` batches of (inputs [N, L], next characters [N, L]) cut from TEXT at random places."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(IDS) - L - 1, N)
        window = np.stack([IDS[s:s + L + 1] for s in starts])
        yield window[:, :-1], window[:, 1:]


def torch_models(H: int, seed: int = 0):
    """(reference, polyft): torch.nn modules (float32) with the same initial weights."""
    import torch

    class Reference(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(len(CHARS), H)
            self.lstm = torch.nn.LSTM(H, H, D, batch_first=True)
            self.readout = torch.nn.Linear(H, len(CHARS))

        def forward(self, ids):
            return self.readout(self.lstm(self.embed(ids))[0])

    class Polyft(torch.nn.Module):
        def __init__(self, reference):
            super().__init__()
            self.embed = torch.nn.Embedding(len(CHARS), H)
            self.lstm = torch.nn.LSTM(H, H, D, batch_first=True)  # its parameters only: the layout
            self.readout = torch.nn.Linear(H, len(CHARS))
            self.load_state_dict(reference.state_dict())
            self.cell = ft.torch.function(top_layer, *specs(H), coarsen=False, alternative=False)

        def forward(self, ids):
            N, L = ids.shape
            xss = self.embed(ids).reshape(N, L, 1, H)
            p = dict(self.lstm.named_parameters())
            wss = torch.stack([p[f"weight_ih_l{d}"].view(4, H, H)[GATES].transpose(1, 2) for d in range(D)])
            uss = torch.stack([p[f"weight_hh_l{d}"].view(4, H, H)[GATES].transpose(1, 2) for d in range(D)])
            bss = torch.stack([(p[f"bias_ih_l{d}"] + p[f"bias_hh_l{d}"]).view(4, 1, H)[GATES] for d in range(D)])
            return self.readout(self.cell(xss, wss, uss, bss).reshape(N, L, H))

    torch.manual_seed(seed)
    reference = Reference()
    return reference, Polyft(reference)


def train_torch(model, steps: int, N: int, L: int, lr: float = 1e-2) -> list:
    """The loss before each of `steps` Adam steps (cross-entropy of the next character), on one
    torch thread (the tensors are tiny: more threads only wait for each other on a busy machine)."""
    import torch
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for ids, targets in batches(steps, N, L):
            logits = model(torch.from_numpy(ids))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, len(CHARS)),
                                                     torch.from_numpy(targets).reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return losses


def train_jax(state: dict, H: int, steps: int, N: int, L: int, lr: float = 1e-2) -> list:
    """The same model in JAX with polyft's LSTM (ft.jax.function), from `state` (the torch
    reference's state_dict as numpy arrays), trained by Adam written out (torch.optim.Adam's
    update: bias-corrected moments, eps added to the root): the loss before each step."""
    import jax
    import jax.numpy as jnp
    cell = ft.jax.function(top_layer, *specs(H), coarsen=False, alternative=False)

    def loss_fn(p, ids, targets):
        xss = p["embed.weight"][ids].reshape(N, L, 1, H)
        wss = jnp.stack([p[f"lstm.weight_ih_l{d}"].reshape(4, H, H)[GATES].transpose(0, 2, 1) for d in range(D)])
        uss = jnp.stack([p[f"lstm.weight_hh_l{d}"].reshape(4, H, H)[GATES].transpose(0, 2, 1) for d in range(D)])
        bss = jnp.stack([(p[f"lstm.bias_ih_l{d}"] + p[f"lstm.bias_hh_l{d}"]).reshape(4, 1, H)[GATES] for d in range(D)])
        logits = cell(xss, wss, uss, bss).reshape(N, L, H) @ p["readout.weight"].T + p["readout.bias"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, targets[..., None], -1).mean()

    @jax.jit
    def step(p, m, v, t, ids, targets):
        loss, g = jax.value_and_grad(loss_fn)(p, ids, targets)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        p = jax.tree.map(lambda p, m, v: p - lr / (1 - 0.9 ** t) * m / (jnp.sqrt(v / (1 - 0.999 ** t)) + 1e-8),
                         p, m, v)
        return loss, p, m, v

    params = {k: jnp.asarray(a) for k, a in state.items()}
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    losses = []
    for t, (ids, targets) in enumerate(batches(steps, N, L), start=1):
        loss, params, m, v = step(params, m, v, jnp.float32(t), ids, targets)
        losses.append(float(loss))
    return losses
