"""Random nests of compute and access operators, for the hypothesis tests (test_bruteforce,
test_compile_property, test_schedule).

A nest is a tree of `Level`s over an input list xs and a tensor argument w. Each level applies
an access transform to its list (shift, slice, reverse, window with or without padding, stride
split + merge, gather, zip with a reversed or shifted copy of itself), then a compute operator
(map, reduce, foldl, foldr, scanl, scanr; aggregates with or without init, optionally on each
row of a strided_split), whose function runs the level below (`child`) on each element; at the
bottom (`Elem`), element math on a tile. Optionally a level's result feeds a further nest
(`then`: a consumer reading the producer's result), or the top level's state is a pair.

What a family of nests is made of (the element math, the aggregate steps, the tile and w
shapes, which transforms, which window paddings and slices, consumer nests, pair states) is a
`Kit`: each test module defines its own.

The test modules import it as `nests` (pytest puts tests/ on sys.path; see helpers.py).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

import polyft as ft

AGGREGATES = ("reduce", "foldl", "foldr", "scanl", "scanr")
KEEPS_LEVEL = ("map", "scanl", "scanr")  # the operators whose result has one element per element
TRANSFORMS = ("id", "reverse", "shift", "slice", "zip_rev", "zip_shift", "window", "gather", "splitmerge")


def add(a, b):
    return a + b


def lift(f, depth):
    """f on tensors -> f elementwise on lists of the given depth (one nested map)."""
    if depth == 0:
        return f
    inner = lift(f, depth - 1)
    return lambda a, b: ft.map(inner, a, b)


@dataclass(frozen=True)
class Kit:
    """The building blocks of a family of nests."""

    element: dict  # name -> f(x, w): a tile -> a tile
    combine: dict  # name -> f(s, x, w): an aggregate's step on tiles (lifted elementwise to lists)
    tile: tuple  # the shape of xs's elements
    w_shape: tuple  # the tensor argument w
    w_scale: float  # w = standard normal * w_scale
    pair: dict = field(default_factory=lambda: {"add": add})  # a window's elements, or a zip's pair -> one element
    kinds: tuple = TRANSFORMS  # the access transforms drawn
    window_pads: tuple = (0, 1)  # an int pads both ends, a pair (lo, hi) each end
    slices: str = "any"  # "any": x[a:b:s], s in ±1, ±2; "forward": x[a::s], a in {0, 1}, s in {1, 2}
    then: bool = False  # draw consumer nests reading a level's result
    pair_state: bool = False  # the top level's state may be a pair of the child's type


@dataclass(frozen=True)
class Elem:
    math: str


@dataclass(frozen=True)
class Level:
    """One level of the nest: an access transform, then an operator (optionally per row of a
    strided_split, merged back), whose function runs `child` on each element."""

    transform: tuple
    op: str
    # aggregates: "first": init = the child's result on the first element; "none": no init (the
    # state is the first element); "zeros": init = zeros of the tile (only where the child gives one)
    init: str
    split: int  # 0, or d: the operator runs on each row of strided_split(d), strided_merge after
    comb: str
    child: object  # Level | Elem
    elem_depth: int  # depth of the element the child gets
    child_out: int  # depth of what the child returns
    pair: str = "add"  # combines a window's elements or a zip's pair
    pair_state: bool = False  # the state is a pair of the child's type; a map returns a pair
    then: object = None  # Level | None: a further nest run on this level's result (a list)


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


def make_body(plan, w, kit: Kit):
    """The function of one level on its input x (a list or, at the bottom, a tile); `w[0]` is
    the program's tensor argument (eager or traced) while the program runs."""
    if isinstance(plan, Elem):
        f = kit.element[plan.math]
        return lambda x: f(x, w[0])
    child = make_body(plan.child, w, kit)
    step = kit.combine[plan.comb]
    comb = lift(lambda s, x: step(s, x, w[0]), plan.child_out)
    pair = lift(kit.pair[plan.pair], plan.elem_depth)
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
        init = {"first": lambda: child(prep(xs[0])), "none": lambda: None,
                "zeros": lambda: ft.zeros(kit.tile)}[plan.init]()
        if plan.pair_state:
            init = (init, comb(init, init))

        def f(s, e):
            c = child(prep(e))
            if plan.pair_state:
                return comb(s[0], c), comb(c, s[1])
            return comb(s, c)
        g = (lambda e, s: f(s, e)) if plan.op in ("foldr", "scanr") else f
        return getattr(ft, plan.op)(g, xs, init)

    then = make_body(plan.then, w, kit) if plan.then is not None else (lambda y: y)

    def body(x):
        xs = transform(x, plan.transform)
        if plan.split:
            out = xs.strided_split(plan.split).map(run_op)
            return then(out.strided_merge() if plan.op in KEEPS_LEVEL else out)
        return then(run_op(xs))
    return body


def nest_program(plan, kit: Kit, extra=None):
    """program(xs, w): the nest on xs; with `extra` (a transform), that view of xs too."""
    cell = [None]
    body = make_body(plan, cell, kit)

    def program(xs, w):
        cell[0] = w
        out = body(xs)
        return out if extra is None else (out, transform(xs, extra))
    return program


def nest_inputs(lengths, kit: Kit, seed):
    """(xs, w): seeded random data, xs of the given lengths (its elements tiles)."""
    rng = np.random.default_rng(seed)
    xs = ft.FractalTensor.from_numpy(rng.standard_normal(tuple(lengths) + kit.tile).astype(np.float32),
                                     depth=len(lengths))
    w = (rng.standard_normal(kit.w_shape) * kit.w_scale).astype(np.float32)
    return xs, w


def nest_specs(depth, kit: Kit):
    """The specs of (xs, w) with symbolic lengths A, B, C."""
    shape = ", ".join(map(str, kit.tile))
    return (ft.spec(f"[{', '.join('ABC'[:depth])}]float32[{shape}]"),
            ft.spec(f"float32[{', '.join(map(str, kit.w_shape))}]"))


# -- strategies ------------------------------------------------------------------------------
@st.composite
def list_lengths(draw):
    """The lengths of a nest's input: 1-3 levels of 1-4 elements, as (value, symbol) pairs
    (symbols A, B, C)."""
    depth = draw(st.integers(1, 3))
    return [(draw(st.integers(1, 4)), "ABC"[k]) for k in range(depth)]


@st.composite
def transforms(draw, n, kit: Kit):
    """(transform, its length, whether that is the same symbolic length as n's) for a list of
    length n."""
    options = ["id", "reverse"]
    if n > 1:
        options += ["shift", "slice", "zip_rev", "zip_shift", "window", "gather"]
    if n % 2 == 0:
        options.append("splitmerge")
    kind = draw(st.sampled_from([k for k in options if k in kit.kinds]))
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
        if kit.slices == "forward":
            s, a, b = draw(st.sampled_from([1, 2])), draw(st.sampled_from([0, 1])), None
        else:
            s = draw(st.sampled_from([1, 2, -1, -2]))
            a = draw(st.sampled_from([None, 0, 1, -1, n - 1]))
            b = draw(st.sampled_from([None, 0, 1, -1, n]))
        m = len(range(n)[a:b:s])
        assume(m >= 1)
        return ("slice", a, b, s), m, False
    if kind == "window":
        pad = draw(st.sampled_from(kit.window_pads))
        lo, hi = (pad, pad) if isinstance(pad, int) else pad
        size = draw(st.integers(max(lo, hi) + 1, min(3, n + lo + hi)))  # padding < size (window_args)
        stride = draw(st.integers(1, 2))
        return ("window", size, stride, pad), (n + lo + hi - size) // stride + 1, False
    if kind == "gather":
        idx = tuple(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4)))
        return ("gather", idx), len(idx), False
    raise AssertionError(kind)


_fresh = itertools.count()


@st.composite
def bodies(draw, lengths, kit: Kit, top=False):
    """(plan, output lengths) for an input of the given lengths ([] = a tile).

    Lengths are (value, symbol) pairs: the symbol stands for the length in a trace on specs,
    so that an aggregate without init (whose state is the raw first element) is only drawn
    where its state keeps its type symbolically too, not only at the concrete sizes."""
    if not lengths:
        return Elem(draw(st.sampled_from(sorted(kit.element)))), []
    (n, sym), rest = lengths[0], lengths[1:]
    t, m, same = draw(transforms(n, kit))
    m_sym = sym if same else f"t{next(_fresh)}"
    child, child_out = draw(bodies(rest, kit))
    op = draw(st.sampled_from(("map",) + AGGREGATES))
    # no init: the state is the raw first element, so the child must keep its type
    can_skip_init = t[0] not in ("window", "zip_rev", "zip_shift") and child_out == rest
    init = op != "map" and (not can_skip_init or draw(st.booleans()))
    split = 2 if m % 2 == 0 and draw(st.integers(0, 3)) == 0 else 0
    row = (m // 2, f"{m_sym}/2") if split else (m, m_sym)
    out = [row] + child_out if op in KEEPS_LEVEL else child_out
    if split:  # rows merged back (map, scans), or one fold per row
        out = [(m, m_sym)] + out[1:] if op in KEEPS_LEVEL else [(2, "2")] + out
    pair_state = (kit.pair_state and top and not split and (op == "map" or init)
                  and draw(st.integers(0, 3)) == 0)
    then = None
    if kit.then and not pair_state and out and draw(st.integers(0, 3)) == 0:
        then, out = draw(bodies(out, kit))  # a consumer nest reading this one's result
    plan = Level(t, op, "first" if init else "none", split, draw(st.sampled_from(sorted(kit.combine))),
                 child, len(rest), len(child_out), draw(st.sampled_from(sorted(kit.pair))), pair_state, then)
    return plan, out


@st.composite
def scheduled_nests(draw, kit):
    """(plan, list lengths, seed, schedule): a nest of one or two levels under the "auto"
    schedule, up to three under the "original" one (coarsening, with the "auto" schedule,
    can take minutes on some three-level nests)."""
    schedule = draw(st.sampled_from(("auto", "original")))
    lengths = draw(list_lengths().filter(lambda ls: schedule == "original" or len(ls) <= 2))
    plan, _ = draw(bodies(lengths, kit, top=True))
    return plan, [n for n, _ in lengths], draw(st.integers(0, 2 ** 16)), schedule


def analyze_nest(case, kit):
    """(prog, (xs, w), program) of a `scheduled_nests` case: traced on the nest's concrete
    inputs, or (by the seed's parity) on specs with the lengths as `sizes=`. A gather of a
    shifted, strided or padded view (a documented limitation) is assumed away."""
    from polyft import interpret
    from polyft.errors import AccessError
    plan, lengths, seed, schedule = case
    xs, w = nest_inputs(lengths, kit, seed)
    program = nest_program(plan, kit)
    try:
        if seed % 2:
            specs = nest_specs(len(lengths), kit)
            sizes = interpret.bind_params(ft.trace(program, *specs), (xs, w))
            prog = ft.analyze(program, *specs, schedule=schedule, sizes=sizes)
        else:
            prog = ft.analyze(program, xs, w, schedule=schedule)
    except AccessError as e:
        assume("gather of a" not in str(e))
        raise
    return prog, (xs, w), program
