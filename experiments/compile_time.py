"""How long getting code takes as programs grow: each stage of `ft.compile` against the number
of layers a Python loop unrolls, against statements per layer, and for a transformer encoder.

Five families of programs, each traced from concrete inputs and compiled for the C target
(the compiler's cache pointed at a fresh folder, so every build is real):

    chain        `xs = xs.map(lambda x: tanh(x @ w[k]))` for k < layers (H = 16, 8 rows), the
                 weights captured from the loop: LAYERS layers
    branches     8 layers of `s` sibling maps of the same input, joined by a sum: s = BRANCHES
    encoder      a transformer encoder (heads split by a reshape, 4 heads, an MLP) of ENCODER
                 layers over 4 sequences of 16 tokens of width 32
    captured     one layer `tanh(x @ w)` over 8 rows with an n x n weight the function
                 captures, n = WEIGHTS
    input        the same layer with the weight passed as an input: compiling a captured
                 weight should cost what compiling it as an input does (never C literals)

The stages, in the order ft.compile runs them: trace, coarsen (schedule/coarsen.py), model (the
ISL model), deps (flow dependences), schedule (the auto schedule), storage (contraction),
generate (C source), cc (the C compiler). Each row also gives the statements before and after
coarsening, the schedule's sequential steps and critical path (so a faster pipeline can be seen
to keep the schedule), and the source's size. `seconds` are CPU seconds of polyft and of the
compiler it runs (robust on a shared machine), `wall_seconds` the elapsed ones. The plot (compile_time_<preset>.png) draws
CPU seconds against the family's size on log-log axes with the fitted growth exponent of the
total from the fourth point on.

    python -m polyft.experiments.compile_time [--quick | --paper] [--out DIR] [--resume]
"""
from __future__ import annotations

import contextlib
import os
import resource
import tempfile
import time

import numpy as np
import pandas as pd

import polyft as ft
from polyft.deps.analyze import analyze as dependences
from polyft.deps.model import build
from polyft.emit.c_target import CTarget
from polyft.emit.runtime_c import CtypesRuntime
from polyft.schedule.coarsen import coarsen
from polyft.schedule.schedule import make_schedule
from polyft.schedule.storage import storage_mapping
from polyft.tracing import trace

from .common import meta, path, sweep
from .plot import exponent
from .reproduce import main

STAGES = ("trace", "coarsen", "model", "deps", "schedule", "storage", "generate", "cc")
LAYERS = (8, 16, 32, 64, 128, 256)
BRANCHES = (1, 2, 4, 8, 16)
ENCODER = (1, 2, 4, 8, 12)
WEIGHTS = (1024, 2048, 4096)


def chain(layers: int, rng) -> tuple:
    ws = [rng.standard_normal((16, 16)).astype(np.float32) / 4 for _ in range(layers)]

    def net(xs):
        for w in ws:
            xs = xs.map(lambda x, w=w: ft.tanh(x @ w))
        return xs
    return net, (ft.FractalTensor.from_numpy(rng.standard_normal((8, 1, 16)).astype(np.float32), depth=1),)


def branches(s: int, rng, layers: int = 8) -> tuple:
    ws = [[rng.standard_normal((16, 16)).astype(np.float32) / 4 for _ in range(s)] for _ in range(layers)]

    def net(xs):
        for layer in ws:
            ys = [xs.map(lambda x, w=w: ft.tanh(x @ w)) for w in layer]
            xs = ft.map(lambda *es: sum(es[1:], es[0]), *ys)
        return xs
    return net, (ft.FractalTensor.from_numpy(rng.standard_normal((8, 1, 16)).astype(np.float32), depth=1),)


def encoder(layers: int, rng, N: int = 4, L: int = 16, D: int = 32, H: int = 4) -> tuple:
    def weights(*shape):
        return rng.standard_normal(shape).astype(np.float32) / np.sqrt(shape[0]).astype(np.float32)
    ws = [(weights(D, D), weights(D, D), weights(D, D), weights(D, D), weights(D, 2 * D), weights(2 * D, D))
          for _ in range(layers)]

    def split(y):  # [L, D] -> [H, L, D // H]
        return y.reshape(L, H, D // H).transpose(1, 0, 2)

    def net(xs):
        for wq, wk, wv, wo, w1, w2 in ws:
            def layer(x, wq=wq, wk=wk, wv=wv, wo=wo, w1=w1, w2=w2):
                q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
                heads = [ft.softmax(q[h] @ k[h].T / (D // H) ** 0.5, axis=-1) @ v[h] for h in range(H)]
                a = ft.concat(heads, axis=1) @ wo + x
                return ft.relu(a @ w1) @ w2 + a
            xs = xs.map(layer)
        return xs
    return net, (ft.FractalTensor.from_numpy(rng.standard_normal((N, L, D)).astype(np.float32), depth=1),)


def weight(n: int, rng, captured: bool = True) -> tuple:
    w = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    xs = ft.FractalTensor.from_numpy(rng.standard_normal((8, 1, n)).astype(np.float32), depth=1)

    def layer(xs, w):
        return xs.map(lambda x: ft.tanh(x @ w))
    return (lambda xs: layer(xs, w), (xs,)) if captured else (layer, (xs, w))


FAMILIES = {"chain": (chain, "layers", LAYERS), "branches": (branches, "branches per layer", BRANCHES),
            "encoder": (encoder, "encoder layers", ENCODER),
            "captured": (weight, "weight side n (n x n, captured)", WEIGHTS),
            "input": (lambda n, rng: weight(n, rng, captured=False), "weight side n (n x n, an input)", WEIGHTS)}


@contextlib.contextmanager
def _fresh_cache():
    """The C compiler's cache in a new folder for the block: every build compiles."""
    old = os.environ.get("POLYFT_CACHE")
    with tempfile.TemporaryDirectory(prefix="polyft-compile-time-") as d:
        os.environ["POLYFT_CACHE"] = d
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("POLYFT_CACHE", None)
            else:
                os.environ["POLYFT_CACHE"] = old


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (the C compiler); os.times
    counts in 10 ms ticks, which left most stages at 0."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def measure(fn, inputs) -> dict:
    """CPU seconds per stage of compiling fn for the C target (every stage runs on one core,
    so on a shared machine CPU time measures the stage and wall time the neighbours too; the
    wall seconds are kept as `<stage>_wall`), and what the stages produced; the compiled
    program is checked against eager after."""
    out, t, w = {}, _cpu(), time.perf_counter()

    def lap(stage):
        nonlocal t, w
        now, wall = _cpu(), time.perf_counter()
        out[stage], out[f"{stage}_wall"], t, w = now - t, wall - w, now, wall
    etdg = trace(fn, *inputs)
    lap("trace")
    coarsened, _ = coarsen(etdg)
    lap("coarsen")
    model = build(coarsened)
    lap("model")
    deps = dependences(model)
    lap("deps")
    schedule = make_schedule(model, deps, "auto")
    lap("schedule")
    storage = storage_mapping(model, schedule, True)
    lap("storage")
    module = CTarget().generate(model, schedule, "fp32", storage)
    lap("generate")
    with _fresh_cache():
        CtypesRuntime(module)
    lap("cc")
    out.update(statements_traced=len(etdg.statements), statements=len(coarsened.statements),
               sequential_steps=schedule.sequential_steps, critical_path=schedule.critical_path,
               source_bytes=len(module.source))
    prog = ft.compile(fn, *inputs)
    got, want = prog(*inputs).to_numpy(), fn(*inputs).to_numpy()
    out["rel_error"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    return out


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    """Every family at every size (the same on both presets: this is CPU work); writes
    `out_dir`/compile_time_<preset>.csv, one row per program and stage."""
    info = meta()

    def point(p) -> list:
        family, n = p
        make, size_is, _ = FAMILIES[family]
        r = measure(*make(n, np.random.default_rng(n)))
        wall = {f"{s}_wall" for s in STAGES}
        extra = {"size_is": size_is, **{k: v for k, v in r.items() if k not in STAGES and k not in wall}}
        rows = [{"family": family, "size": n, "stage": s, "seconds": r[s], "wall_seconds": r[f"{s}_wall"],
                 **extra, **info} for s in STAGES]
        return rows + [{"family": family, "size": n, "stage": "total", "seconds": sum(r[s] for s in STAGES),
                        "wall_seconds": sum(r[f"{s}_wall"] for s in STAGES), **extra, **info}]
    points = [(family, n) for family, (_, _, sizes) in FAMILIES.items() for n in sizes]
    return sweep("compile_time", preset, out_dir, points, point, resume=resume,
                 key=lambda p: {"family": p[0], "size": p[1]})


def result_text(out_dir: str, preset: str) -> str:
    df = pd.read_csv(path(out_dir, "compile_time.csv", preset))
    parts = []
    for family in FAMILIES:
        sub = df[df["family"] == family]
        piv = sub.pivot_table(index="size", columns="stage", values="seconds", sort=False)
        e = exponent(df, family)
        parts.append(f"{family}: CPU seconds per stage" + ("" if e is None else f" (total grows as size^{e:.2f})")
                     + "\n" + piv[list(STAGES) + ["total"]].to_string(float_format=lambda v: f"{v:.3f}"))
    return "\n\n".join(parts)


if __name__ == "__main__":
    raise SystemExit(main("compile_time", __doc__))
