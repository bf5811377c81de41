"""User names reaching ISL and generated code (polyft.names): any Python identifier works as a
length or an argument name, whatever ISL or C make of the word, and compiled equals eager.

The names are the ones that broke generated C (keywords, the generated code's own identifiers:
`c1_w` read itself), ISL (keywords, its existentials `e0`, its loop iterators `c1`) or were
refused (outside ASCII). Spec parsing takes ASCII digits only."""
from __future__ import annotations

import numpy as np
import pytest

import polyft as ft
from polyft import names
from polyft.errors import SpecError
from polyft.testing import rel_error

pytestmark = pytest.mark.usefixtures("compile_cache")

NAMES = ["c1_w", "c1_n", "int", "for", "sizeof", "NULL", "c", "ctx", "params", "b0", "S_b0_t0", "min", "max",
         "mod", "exists", "true", "c1", "e0", "xé", "データ", "None", "True", "EOF", "NAN", "FILE", "Sum"]


def program(arg: str):
    """xss.map(xs -> scanl(h, x -> tanh(x @ w + h))) with its first argument named `arg`."""
    if arg in ("for", "None", "True"):  # not argument names Python takes
        arg = "xss"
    ns = {"ft": ft}
    exec(f"def fn({arg}, w):\n"
         f"    return {arg}.map(lambda xs: ft.scanl(lambda h, x: ft.tanh(x @ w + h), xs, ft.zeros((1, 4))))\n", ns)
    return ns["fn"]


def inputs(outer, inner, seed=0):
    rng = np.random.default_rng(seed)
    xss = ft.FractalTensor.from_numpy(rng.standard_normal((outer, inner, 1, 4)).astype(np.float32), 2)
    return xss, (rng.standard_normal((4, 4)) / 2).astype(np.float32)


@pytest.mark.parametrize("name", NAMES)
def test_any_identifier_as_a_length_and_an_argument(name):
    fn = program(name)
    prog = ft.compile(fn, ft.spec(f"[L, {name}]float32[1, 4]"), ft.spec("float32[4, 4]"), target="c")
    for outer, inner in ((3, 5), (2, 1)):
        xss, w = inputs(outer, inner)
        assert rel_error(prog(xss, w), fn(xss, w)) < 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_any_identifier_as_both_lengths(name):
    fn = program(name)
    prog = ft.compile(fn, ft.spec(f"[{name}, {name}]float32[1, 4]"), ft.spec("float32[4, 4]"), target="c")
    xss, w = inputs(3, 3, seed=1)
    assert rel_error(prog(xss, w), fn(xss, w)) < 1e-5


@pytest.mark.parametrize("name", ["c1_w", "exists", "xé", "ctx", "None", "Sum", "Max"])
def test_the_emulated_cuda_target_too(name):
    fn = program(name)
    prog = ft.compile(fn, ft.spec(f"[{name}, L]float32[1, 4]"), ft.spec("float32[4, 4]"), target="cuda-emulated")
    xss, w = inputs(4, 3, seed=2)
    assert rel_error(prog(xss, w), fn(xss, w)) < 1e-5


@pytest.mark.parametrize("name", ["c0_w", "c0_n", "c0", "ft_split", "min"])
def test_a_length_named_like_the_tiled_loops_own_names(name):
    """A map over a list of length `c0_w`: the generated C tiles loop c0 by a width it names c0_w."""
    def fn(xs, w):
        return xs.map(lambda x: ft.tanh(x @ w))
    prog = ft.compile(fn, ft.spec(f"[{name}]float32[1, 4]"), ft.spec("float32[4, 4]"), target="c")
    for n in (1, 37, 300):
        xss, w = inputs(n, 1, seed=n)
        xs = ft.FractalTensor.from_numpy(xss.to_numpy()[:, 0], 1)
        assert rel_error(prog(xs, w), fn(xs, w)) < 1e-5


@pytest.mark.parametrize("spec", ["[N, c2_w]", "[c1_m, c2_w]", "[c2_n, N]"])
def test_a_length_named_like_the_flattened_loops_width(spec):
    """A map of maps: the generated C splits loop c2 into tiles `c2_w` wide (`const long c2_w =
    ft_split(<trips>, ...)`); a length of that name was the trip count reading itself."""
    def fn(xss, w):
        return xss.map(lambda xs: xs.map(lambda x: ft.tanh(x @ w)))
    prog = ft.compile(fn, ft.spec(f"{spec}float32[1, 4]"), ft.spec("float32[4, 4]"), target="c")
    for outer, inner in ((3, 300), (300, 3), (2, 2)):
        xss, w = inputs(outer, inner, seed=outer)
        assert rel_error(prog(xss, w), fn(xss, w)) < 1e-5


def test_names_that_look_alike_stay_apart():
    """`xé` and the ASCII `x_ue9_` (what an escape might spell it), `c1_w` and `c1__w`: distinct lengths."""
    def fn(a, b):
        return a.map(lambda x: x * 2.0), b.map(lambda y: y + 1.0)
    for n1, n2 in (("xé", "x_ue9_"), ("c1_w", "c1__w"), ("ftu_a", "a")):
        prog = ft.compile(fn, ft.spec(f"[{n1}]float32[2]"), ft.spec(f"[{n2}]float32[2]"), target="c")
        a = ft.FractalTensor.from_numpy(np.arange(6, dtype=np.float32).reshape(3, 2), 1)
        b = ft.FractalTensor.from_numpy(np.arange(10, dtype=np.float32).reshape(5, 2), 1)
        for got, want in zip(prog(a, b), fn(a, b)):
            assert rel_error(got, want) < 1e-6


def test_written_is_one_to_one_and_shown_inverts_it():
    rng = np.random.default_rng(0)
    pool = "abcxyzABC019_éデータ"
    more = ["".join(rng.choice(list(pool), size=rng.integers(1, 6))) for _ in range(2000)]
    idents = {n for n in NAMES + more + ["N", "L", "L2", "Seq", "ftu_x", "x_ue9_", "a__b"] if n.isidentifier()}
    written = {n: names.written(n) for n in idents}
    assert len(set(written.values())) == len(idents)
    for n, w in written.items():
        assert w.isascii() and w.isidentifier() and names.shown(w) == n
        assert w == n or w.startswith(names.PREFIX)


def test_the_papers_names_print_as_written():
    """The ISL strings users read keep lengths and buffers as they wrote them."""
    def f(xs, w):
        return xs.map(lambda x: x @ w)
    prog = ft.analyze(f, ft.spec("[L2]float32[1, 4]"), ft.spec("float32[4, 4]"))
    text = str(prog.model.reads)
    assert "[L2] ->" in text and "xs[" in text and "w[" in text, text


def test_sizes_take_the_users_names():
    fn = program("xé")
    prog = ft.analyze(fn, ft.spec("[バッチ, L]float32[1, 4]"), ft.spec("float32[4, 4]"))
    table = prog.memory(sizes={"バッチ": 3, "L": 2})
    assert len(table) > 0


@pytest.mark.parametrize("text", ["float32[²]", "[²]float32[4]", "[N]float32[٣]", "float32[4, ⁵]",
                                  "[N, ½]float32[2]"])
def test_spec_digits_are_ascii_only(text):
    with pytest.raises(SpecError) as e:
        ft.spec(text)
    assert "ASCII digits" in str(e.value) and repr(text) in str(e.value)


def test_the_headers_macros_of_the_kept_form_are_taken():
    """Every macro of the form kept as written that the generated C's headers define is in TAKEN
    (a length of that name would be replaced by the macro)."""
    import re
    import subprocess

    from polyft.emit import runtime_c
    headers = "".join(f"#include <{h}>\n" for h in ("math.h", "stddef.h", "stdlib.h", "string.h", "omp.h",
                                                     "stdint.h", "stdio.h"))
    r = subprocess.run([runtime_c.compiler(), *runtime_c.compile_flags()[:1], "-fopenmp", "-std=c99", "-dM", "-E",
                        "-x", "c", "-"], input=headers, capture_output=True, text=True, check=True)
    macros = {m for m in re.findall(r"^#define (\w+)", r.stdout, re.M) if re.fullmatch(r"[A-Z][A-Za-z0-9]*", m)}
    assert macros and all(names.written(m) != m for m in macros), sorted(m for m in macros if names.written(m) == m)


def test_the_paper_style_lengths_are_kept():
    for n in ("N", "L2", "NH", "MT", "TQ", "Seq"):
        assert names.written(n) == n
