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
objects go to a temporary cache directory (POLYFT_CACHE). A longer run with other examples:
`POLYFT_EXAMPLES=1000 pytest tests/test_compile_property.py --hypothesis-seed=7`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import polyft as ft
from polyft.errors import AccessError

from helpers import assert_same
from nests import Kit, bodies, list_lengths, nest_inputs, nest_program, nest_specs, transforms

EXAMPLES = int(os.environ.get("POLYFT_EXAMPLES", 100))  # per schedule; more: POLYFT_EXAMPLES=1000

pytestmark = pytest.mark.usefixtures("compile_cache")  # conftest.py: a temporary POLYFT_CACHE


# -- the building blocks (the nests themselves: tests/nests.py) ------------------------------
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
KIT = Kit(ELEMENT, COMBINE, tile=(2, 3), w_shape=(3, 3), w_scale=0.6, pair=PAIR,
          window_pads=(0, 1, (1, 0), (0, 2)), pair_state=True)


# -- strategies ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    plan: object
    lengths: tuple
    extra: tuple | None  # a transform of xs returned as a second output
    symbolic: bool
    seed: int


@st.composite
def cases(draw):
    lengths = draw(list_lengths())
    plan, _ = draw(bodies(lengths, KIT, top=True))
    extra = draw(st.none() | transforms(lengths[0][0], KIT).map(lambda t: t[0]))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    # (specs or inputs by the seed's parity: a drawn boolean leans heavily towards False)
    return Case(plan, tuple(n for n, _ in lengths), extra, seed % 2 == 1, seed)


# -- the check -------------------------------------------------------------------------------
def check(case: Case, schedule: str):
    xs, w = nest_inputs(case.lengths, KIT, case.seed)
    program = nest_program(case.plan, KIT, case.extra)
    expected = program(xs, w)
    args = nest_specs(len(case.lengths), KIT) if case.symbolic else (xs, w)
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
