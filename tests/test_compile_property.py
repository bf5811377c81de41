"""Property test of the C target: hypothesis-generated programs, compiled and run, equal eager
execution (relative error < 1e-5 in float32), under the "auto" and the "original" schedule.

A program is a nest of 1-3 levels over an input list xs ([A, B, C]float32[2, 3], lengths 1-4)
and a tensor w (float32[3, 3]). Each level applies an access transform to its list (shift,
slice with a positive or negative stride, reverse, window with or without padding, stride
split + merge, gather, zip with a reversed or shifted copy of itself), then a compute operator
(map, reduce, foldl, foldr, scanl, scanr; aggregates with or without init, optionally on each
row of a strided_split), whose function runs the next level on each element; at the bottom,
element math on a [2, 3] tile (+ - * /, @, tanh, sigmoid, exp, max/sum with and without axis,
softmax, concat, static slicing, transpose). Sometimes a view of the input is returned too.

Half of the examples are compiled from `ft.spec`s (symbolic lengths), half from the concrete
inputs; the inputs are fresh seeded random data. Programs are tiny, so gcc is quick; compiled
objects go to a temporary cache directory (POLYFT_CACHE).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import polyft as ft
from polyft.errors import AccessError

from helpers import assert_same

EXAMPLES = 100  # per schedule


pytestmark = pytest.mark.usefixtures("compile_cache")  # conftest.py: a temporary POLYFT_CACHE


# -- the building blocks -----------------------------------------------------------------------
ELEMENT = {  # x: [2, 3], w: [3, 3] -> [2, 3]
    "tanh(x@w)": lambda x, w: ft.tanh(x @ w),
    "x/(1+x*x)": lambda x, w: x / (1.0 + x * x),
    "sigmoid(x)-x": lambda x, w: ft.sigmoid(x) - x,
    "exp(-x*x)": lambda x, w: ft.exp(-(x * x)),
    "x-max(x,1,keep)": lambda x, w: x - ft.max(x, axis=1, keepdims=True),
    "x-max(x,0)": lambda x, w: x - ft.max(x, axis=0),
    "x*tanh(sum(x,0,keep))": lambda x, w: x * ft.tanh(ft.sum(x, axis=0, keepdims=True)),
    "x-sum(x)/6": lambda x, w: x - ft.sum(x) / 6.0,
    "softmax(x)": lambda x, w: ft.softmax(x, axis=-1),
    "softmax(x,0)+x": lambda x, w: ft.softmax(x, axis=0) + x,
    "concat columns": lambda x, w: ft.concat((x[:, 2:], x[:, :2] * 2.0), axis=1),
    "concat rows": lambda x, w: ft.concat((x[1:], -x[:1]), axis=0),
    "(w@x.T).T": lambda x, w: ft.transpose(w @ x.T),
    "x.T.T*w[0]": lambda x, w: x.T.T * w[0],
    "x[::-1]*x[:,1:2]": lambda x, w: x[::-1] * x[:, 1:2],
}
COMBINE = {  # an aggregate's step on [2, 3] tiles (lifted elementwise to lists)
    "s+x": lambda s, x, w: s + x,
    "s*0.5-x": lambda s, x, w: s * 0.5 - x,
    "tanh(s@w+x)": lambda s, x, w: ft.tanh(s @ w + x),
    "s*tanh(x)": lambda s, x, w: s * ft.tanh(x),
    "maximum(s,x)": lambda s, x, w: ft.maximum(s, x),
    "softmax(s+x)": lambda s, x, w: ft.softmax(s + x, axis=-1),
    "s/(1+x*x)": lambda s, x, w: s / (1.0 + x * x),
}
PAIR = {  # how a window's elements, or a zip's pair, become one element
    "add": lambda a, b: a + b,
    "max": lambda a, b: ft.maximum(a, b),
    "a-b/2": lambda a, b: a - b * 0.5,
}
AGGREGATES = ("reduce", "foldl", "foldr", "scanl", "scanr")


@dataclass(frozen=True)
class Elem:
    math: str


@dataclass(frozen=True)
class Level:
    """One level of the nest: an access transform, then an operator (optionally per row of a
    strided_split), whose function runs `child` on each element."""

    transform: tuple
    op: str
    init: bool  # aggregates: init = the child's result on the first element; else no init
    split: int  # 0, or d: the operator runs on each row of strided_split(d)
    comb: str
    pair: str  # combines a window's elements or a zip's pair
    child: object  # Level | Elem
    elem_depth: int  # depth of the element the child gets
    child_out: int  # depth of what the child returns
    pair_state: bool = False  # (top level only) the state is a pair of the child's type; a map returns a pair


def lift(f, depth):
    if depth == 0:
        return f
    inner = lift(f, depth - 1)
    return lambda a, b: ft.map(inner, a, b)


def transform(x, t):
    kind = t[0]
    if kind == "id":
        return x
    if kind == "shift":
        return x.shift(t[1])
    if kind == "slice":
        return x[t[1]:t[2]:t[3]]
    if kind == "reverse":
        return x.reverse()
    if kind == "window":
        return x.window(t[1], t[2], t[3])
    if kind == "splitmerge":
        return x.strided_split(t[1]).strided_merge()
    if kind == "gather":
        return x.gather(np.array(t[1], dtype=np.int64))
    if kind == "zip_rev":
        return ft.zip(x, x.reverse())
    if kind == "zip_shift":
        return ft.zip(x[:-t[1]], x.shift(t[1]))
    raise ValueError(kind)


def make_body(plan, w):
    """The function of one level on its input (a list, or at the bottom a tile); `w[0]` is the
    program's tensor argument (eager or traced) while the program runs."""
    if isinstance(plan, Elem):
        f = ELEMENT[plan.math]
        return lambda x: f(x, w[0])
    child = make_body(plan.child, w)
    step = COMBINE[plan.comb]
    comb = lift(lambda s, x: step(s, x, w[0]), plan.child_out)
    pair = lift(PAIR[plan.pair], plan.elem_depth)
    kind = plan.transform[0]

    def prep(e):  # an element of the transformed list -> the child's input
        if kind == "window":
            return ft.reduce(pair, e)
        if kind.startswith("zip"):
            return pair(*e)
        return e

    def run_op(xs):
        if plan.op == "map":
            if plan.pair_state:
                return xs.map(lambda e: (lambda c: (c, comb(c, c)))(child(prep(e))))
            return xs.map(lambda e: child(prep(e)))
        init = child(prep(xs[0])) if plan.init else None
        if plan.pair_state:
            init = (init, comb(init, init))

        def f(s, e):
            c = child(prep(e))
            if plan.pair_state:
                return comb(s[0], c), comb(c, s[1])
            return comb(s, c)
        g = (lambda e, s: f(s, e)) if plan.op in ("foldr", "scanr") else f
        return getattr(ft, plan.op)(g, xs, init)

    def body(x):
        xs = transform(x, plan.transform)
        if plan.split:
            out = xs.strided_split(plan.split).map(run_op)
            return out.strided_merge() if plan.op in ("map", "scanl", "scanr") else out
        return run_op(xs)
    return body


# -- strategies ------------------------------------------------------------------------------
@st.composite
def transforms(draw, n):
    """(transform, its length, whether that is the same symbolic length as n) for a list of
    length n."""
    options = ["id", "reverse"]
    if n > 1:
        options += ["shift", "slice", "zip_rev", "zip_shift", "window", "gather"]
    if n % 2 == 0:
        options.append("splitmerge")
    kind = draw(st.sampled_from(options))
    if kind in ("id", "reverse", "zip_rev"):
        return (kind,), n, True
    if kind == "splitmerge":
        return ("splitmerge", 2), n, True
    if kind == "shift":
        k = draw(st.sampled_from([k for k in (-2, -1, 1, 2) if abs(k) < n]))
        return ("shift", k), n - abs(k), False
    if kind == "zip_shift":
        k = draw(st.integers(1, n - 1))
        return ("zip_shift", k), n - k, False
    if kind == "slice":
        s = draw(st.sampled_from([1, 2, -1, -2]))
        a = draw(st.sampled_from([None, 0, 1, -1, n - 1]))
        b = draw(st.sampled_from([None, 0, 1, -1, n]))
        m = len(range(n)[a:b:s])
        assume(m >= 1)
        return ("slice", a, b, s), m, False
    if kind == "window":
        pad = draw(st.sampled_from([0, 1, (1, 0), (0, 2)]))
        lo, hi = (pad, pad) if isinstance(pad, int) else pad
        size = draw(st.integers(1, min(3, n + lo + hi)))
        stride = draw(st.integers(1, 2))
        return ("window", size, stride, pad), (n + lo + hi - size) // stride + 1, False
    if kind == "gather":
        idx = tuple(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4)))
        return ("gather", idx), len(idx), False
    raise AssertionError(kind)


_fresh = itertools.count()


@st.composite
def bodies(draw, lengths, top=False):
    """(plan, output lengths) for an input of the given lengths ([] = a [2, 3] tile).

    Lengths are (value, symbol) pairs: the symbol stands for the length in a trace on specs,
    so that an aggregate without init (whose state is the raw first element) is only drawn
    where its state keeps its type symbolically too, not only at the concrete sizes."""
    if not lengths:
        return Elem(draw(st.sampled_from(sorted(ELEMENT)))), []
    (n, sym), rest = lengths[0], lengths[1:]
    t, m, same = draw(transforms(n))
    m_sym = sym if same else f"t{next(_fresh)}"
    child, child_out = draw(bodies(rest))
    op = draw(st.sampled_from(("map",) + AGGREGATES))
    can_skip_init = t[0] not in ("window", "zip_rev", "zip_shift") and child_out == rest
    init = op != "map" and (not can_skip_init or draw(st.booleans()))
    split = 2 if m % 2 == 0 and draw(st.integers(0, 3)) == 0 else 0
    row = (m // 2, f"{m_sym}/2") if split else (m, m_sym)
    out = [row] + child_out if op == "map" or op.startswith("scan") else child_out
    if split:  # rows merged back (map, scans), or one fold per row
        out = [(m, m_sym)] + out[1:] if op in ("map", "scanl", "scanr") else [(2, "2")] + out
    pair_state = top and not split and (op == "map" or init) and draw(st.integers(0, 3)) == 0
    plan = Level(t, op, init, split, draw(st.sampled_from(sorted(COMBINE))),
                 draw(st.sampled_from(sorted(PAIR))), child, len(rest), len(child_out), pair_state)
    return plan, out


@dataclass(frozen=True)
class Case:
    plan: object
    lengths: tuple
    extra: tuple | None  # a transform of xs returned as a second output
    symbolic: bool
    seed: int


@st.composite
def cases(draw):
    depth = draw(st.integers(1, 3))
    lengths = [(draw(st.integers(1, 4)), "ABC"[k]) for k in range(depth)]
    plan, _ = draw(bodies(lengths, top=True))
    extra = draw(st.none() | transforms(lengths[0][0]).map(lambda t: t[0]))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    # (specs or inputs by the seed's parity: a drawn boolean leans heavily towards False)
    return Case(plan, tuple(n for n, _ in lengths), extra, seed % 2 == 1, seed)


# -- the check -------------------------------------------------------------------------------
def check(case: Case, schedule: str):
    rng = np.random.default_rng(case.seed)
    xs = ft.FractalTensor.from_numpy(rng.standard_normal(case.lengths + (2, 3)).astype(np.float32),
                                     depth=len(case.lengths))
    w = (rng.standard_normal((3, 3)) * 0.6).astype(np.float32)
    cell = [None]
    body = make_body(case.plan, cell)

    def program(xs, w):
        cell[0] = w
        out = body(xs)
        return out if case.extra is None else (out, transform(xs, case.extra))

    expected = program(xs, w)
    if case.symbolic:
        names = "ABC"[:len(case.lengths)]
        args = (ft.spec(f"[{', '.join(names)}]float32[2, 3]"), ft.spec("float32[3, 3]"))
    else:
        args = (xs, w)
    try:
        prog = ft.compile(program, *args, target="c", schedule=schedule)
    except AccessError as e:  # a documented limitation of gather, not a wrong answer
        assume("gather of a" not in str(e))
        raise
    assert_same(prog(xs, w), expected)


PROPERTY = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@PROPERTY
@given(cases())
def test_random_programs_auto_schedule(case):
    check(case, "auto")


@PROPERTY
@given(cases())
def test_random_programs_original_schedule(case):
    check(case, "original")
