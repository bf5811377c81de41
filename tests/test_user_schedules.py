"""Schedules written by hand: every way a user writes one compiles, runs and equals
eager, for programs traced from `ft.spec`s and from concrete inputs; a schedule polyft cannot
use is a ScheduleError that says why (a violating pair of instances, the statements expected
and given, a misspelled name, two instances at one time); `polyft inspect --schedule "<isl>"`;
the README's cookbook; and `Schedule.T` agreeing with the schedule's map (a scanr's dim runs
backwards: its column is negative)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import polyft as ft
from polyft.cli import main
from polyft.deps.isl_helpers import maps
from polyft.emit.isl_ast import build_ast
from polyft.errors import ScheduleError
from polyft.schedule.schedule import time_rows
from polyft.testing import rel_error
from polyft.workloads import stacked_rnn

pytestmark = pytest.mark.usefixtures("compile_cache")

SMALL = {"N": 2, "D": 3, "L": 5}  # stacked_rnn's "small" preset
WAVE = "{ S_b0[i, j, k] -> [j + k, j, i] }"
FORMS = {
    "string": WAVE,
    "prefixed": "[D, L, N] -> { S_b0[i, j, k] -> [j + k, j, i] }",
    "prefixed-other-order": "[N, L, D] -> { S_b0[i, j, k] -> [j + k, j, i] }",
    "prefixed-bounded": "[D, L, N] -> { S_b0[i, j, k] -> [j + k, j, i] : 0 <= i < N and 0 <= j < D and 0 <= k < L }",
    "bounded-no-prefix": "{ S_b0[i, j, k] -> [j + k, j, i] : i >= 0 and j >= 0 and k >= 0 }",
    "isl.Map": lambda: isl.Map("[D, L, N] -> { S_b0[i, j, k] -> [j + k, j, i] }"),
    "isl.UnionMap": lambda: isl.UnionMap(WAVE),
}
SOURCES = ["specs", "specs+sizes", "inputs"]


def rnn_args(source):
    """(args to trace from, sizes=) for a source of the stacked RNN."""
    if source == "inputs":
        return stacked_rnn.inputs("small", 0), None
    return stacked_rnn.specs("small"), (SMALL if source == "specs+sizes" else None)


def form(name):
    f = FORMS[name]
    return f() if callable(f) else f


def expected_map(prog, text):
    """`text` over the program's statement domains: what every form must come to."""
    doms = None
    for d in prog.model.domains.values():
        doms = isl.UnionSet.from_set(d) if doms is None else doms.union(isl.UnionSet.from_set(d))
    return isl.UnionMap(text).intersect_params(prog.model.context).intersect_domain(doms)


def error_of(fn, *args, **kw) -> str:
    with pytest.raises(ScheduleError) as info:
        ft.analyze(fn, *args, **kw)
    return info.value.detail


# -- every form of one schedule ----------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", list(FORMS))
def test_each_form_compiles_runs_and_equals_eager(name, source):
    args, sizes = rnn_args(source)
    prog = ft.compile(stacked_rnn.program, *args, schedule=form(name), sizes=sizes, target="c")
    assert prog.schedule.kind == "user"
    assert prog.schedule.map.is_equal(expected_map(prog, WAVE)), prog.schedule.map
    assert prog.schedule.parallel == [False, True, True]
    # all lengths known: the wavefront's L + D - 1 steps (this failed for a prefixed string)
    assert prog.schedule.sequential_steps == (None if source == "specs" else SMALL["L"] + SMALL["D"] - 1)
    seed = 100 + list(FORMS).index(name) * 7 + SOURCES.index(source)
    over = {} if source != "specs" else {"N": 3, "L": 4}  # parametric code: other lengths too
    inputs = stacked_rnn.inputs("small", seed, **over)
    assert rel_error(prog(*inputs), stacked_rnn.program(*inputs)) < 1e-5


H = 4


def scan_then_map(xss, w):
    """Two statements: S_b0[i, j] scans each sentence, S_b1[i, j] maps over its outputs."""
    hs = xss.map(lambda xs: xs.scanl(lambda s, x: ft.tanh(x @ w + s), ft.zeros((1, H))))
    return hs.map(lambda h: h.map(lambda y: y @ w + 1.0))


def two_inputs(seed, n=2, length=5):
    rng = np.random.default_rng(seed)
    xss = ft.FractalTensor.from_numpy(rng.standard_normal((n, length, 1, H)).astype(np.float32), depth=2)
    return xss, (rng.standard_normal((H, H)) / 2).astype(np.float32)


TWO_SPECS = (ft.spec(f"[N, L]float32[1, {H}]"), ft.spec(f"float32[{H}, {H}]"))
FUSED = "{ S_b0[i, j] -> [i, j, 0]; S_b1[i, j] -> [i, j, 1] }"


@pytest.mark.parametrize("source", ["specs", "inputs"])
@pytest.mark.parametrize("text, parallel", [
    (FUSED, [True, False, False]),                                            # fused
    ("[L, N] -> { S_b0[i, j] -> [i, j, 0] : 0 <= i < N and 0 <= j < L; "
     "S_b1[i, j] -> [i, j, 1] : 0 <= i < N and 0 <= j < L }", [True, False, False]),
    ("{ S_b0[i, j] -> [j, i, 0]; S_b1[i, j] -> [j, i, 1] }", [False, True, False]),  # fused, interchanged
    ("{ S_b0[i, j] -> [1, i, j]; S_b1[i, j] -> [2, j, i] }", [False, True, False]),  # split, S_b1 interchanged
])
def test_two_statements_every_form(text, parallel, source):
    args = TWO_SPECS if source == "specs" else two_inputs(0)
    prog = ft.compile(scan_then_map, *args, schedule=isl.UnionMap(text) if "[L, N]" in text else text)
    assert prog.schedule.kind == "user" and set(prog.schedule.per_statement) == {"S_b0", "S_b1"}
    assert prog.schedule.parallel == parallel
    inputs = two_inputs(7, *((3, 4) if source == "specs" else (2, 5)))
    assert rel_error(prog(*inputs), scan_then_map(*inputs)) < 1e-5


def test_lengths_of_a_schedule_for_a_program_from_concrete_inputs():
    """Traced from arrays, the program's lengths are numbers: a schedule's own lengths are fixed
    where its bounds are exactly the domains, and must not matter otherwise."""
    inputs = stacked_rnn.inputs("small", 3)
    shifted = "[D, L, N] -> { S_b0[i, j, k] -> [j + k - L, j, i] : 0 <= i < N and 0 <= j < D and 0 <= k < L }"
    prog = ft.compile(stacked_rnn.program, *inputs, schedule=shifted)
    assert prog.schedule.map.is_equal(isl.UnionMap(
        "{ S_b0[i, j, k] -> [j + k - 5, j, i] : 0 <= i < 2 and 0 <= j < 3 and 0 <= k < 5 }"))
    assert rel_error(prog(*inputs), stacked_rnn.program(*inputs)) < 1e-5
    msg = error_of(stacked_rnn.program, *inputs, schedule="[D, L, N] -> { S_b0[i, j, k] -> [j + k - L, j, i] }")
    assert "depend on L," in msg and "concrete inputs" in msg and "D, L" not in msg


# -- what a ScheduleError says -------------------------------------------------------------------

PAIR = re.compile(r"(S_b\d\[[\d, ]+\]) must run before (S_b\d\[[\d, ]+\])")


def instance(text) -> tuple:
    name, coords = re.fullmatch(r"(\w+)\[([\d, ]*)\]", text).groups()
    return name, [int(c) for c in coords.split(",") if c.strip()]


def time_of(user: isl.UnionMap, text, at: isl.Set) -> list:
    name, coords = instance(text)
    point = isl.Set(f"{{ {name}[{', '.join(map(str, coords))}] }}")
    (m,) = [m for m in maps(user.intersect_params(at)) if m.get_tuple_name(isl.dim_type.in_) == name]
    t = m.intersect_domain(point).range()
    assert t.is_singleton(), (text, t)
    p = t.sample_point()
    return [p.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(t.dim(isl.dim_type.set))]


def lengths(msg, names) -> isl.Set:
    found = dict(re.findall(r"(\w+) = (\d+)", msg.split("(for ")[1].split(")")[0])) if "(for " in msg else {}
    conds = " and ".join(f"{n} = {found[n]}" for n in names if n in found) or "true"
    return isl.Set(f"[{', '.join(names)}] -> {{ : {conds} }}")


@pytest.mark.parametrize("fn, args, text", [
    (stacked_rnn.program, stacked_rnn.specs("small"), "{ S_b0[i, j, k] -> [i, j, -k] }"),
    (stacked_rnn.program, stacked_rnn.specs("small"), "{ S_b0[i, j, k] -> [i, -j, k] }"),
    (stacked_rnn.program, stacked_rnn.specs("small"), "{ S_b0[i, j, k] -> [k - j, j, i] }"),
    (stacked_rnn.program, stacked_rnn.inputs("small", 0), "{ S_b0[i, j, k] -> [i, 4 - k, j] }"),
    (scan_then_map, TWO_SPECS, "{ S_b0[i, j] -> [i, j, 1]; S_b1[i, j] -> [i, j, 0] }"),
    (scan_then_map, two_inputs(0), "{ S_b0[i, j] -> [i, j, 0]; S_b1[i, j] -> [i, j, 0] }"),
])
def test_illegal_schedule_names_one_violating_pair(fn, args, text):
    msg = error_of(fn, *args, schedule=text)
    found = PAIR.search(msg)
    assert found, msg
    first, second = found.groups()
    prog = ft.analyze(fn, *args, schedule="original")
    params = prog.model.params
    at = lengths(msg, params).intersect(prog.model.context) if params else prog.model.context
    # the pair is a dependence of the program ...
    (src, s), (dst, d) = instance(first), instance(second)
    pair = isl.Map(f"{{ {src}[{', '.join(map(str, s))}] -> {dst}[{', '.join(map(str, d))}] }}")
    assert any(not m.intersect_params(at).intersect(pair).is_empty() for m in maps(prog.deps.all)), msg
    # ... which the schedule runs backwards (or at one time)
    user = isl.UnionMap(text)
    assert time_of(user, first, at) >= time_of(user, second, at), msg
    assert f"scheduled {first} at {time_of(user, first, at)} and {second} at {time_of(user, second, at)}" in msg
    # the violated dependence is printed once, the schedule's maps not at all
    violated = re.search(r"violates the dependence (.*?\}) \(scheduled", msg).group(1)
    assert msg.count(violated) == 1 and "] -> [" not in msg, msg


@pytest.mark.parametrize("fn, args, text, given, expected", [
    (stacked_rnn.program, stacked_rnn.specs("small"), "{ S_b0[i, j] -> [i, j] }", "S_b0[i, j] (2 dims)",
     "S_b0[i, j, k]"),
    (stacked_rnn.program, stacked_rnn.inputs("small", 0), "{ S_b0[a, b, c, d] -> [a, b, c, d] }",
     "S_b0[a, b, c, d] (4 dims)", "S_b0[i, j, k]"),
    (scan_then_map, TWO_SPECS, "{ S_b0[i, j] -> [i, j, 0]; S_b1[i] -> [i, 0, 1] }", "S_b1[i] (1 dims)",
     "S_b0[i, j], S_b1[i, j]"),
])
def test_wrong_arity_names_the_statements_expected_and_given(fn, args, text, given, expected):
    msg = error_of(fn, *args, schedule=text)
    name = given.split("[")[0]
    assert f"the schedule gives {given}" in msg and f"{name} has " in msg, msg
    assert f"the program's statements are {expected}" in msg, msg


def test_misspelled_or_missing_statement():
    msg = error_of(stacked_rnn.program, *stacked_rnn.specs("small"), schedule="{ S_bo[i, j, k] -> [j + k, j, i] }")
    assert "S_bo[i, j, k] (did you mean S_b0[i, j, k]?)" in msg and "statements are S_b0[i, j, k]" in msg, msg
    msg = error_of(scan_then_map, *TWO_SPECS, schedule="{ S_b0[i, j] -> [i, j, 0]; S_b2[i, j] -> [i, j, 1] }")
    assert "S_b2[i, j] (did you mean S_b" in msg and "S_b0[i, j], S_b1[i, j]" in msg, msg
    msg = error_of(scan_then_map, *TWO_SPECS, schedule="{ S_b0[i, j] -> [i, j, 0] }")
    assert "no time to S_b1[i, j]" in msg and "it gives S_b0[i, j]" in msg, msg


@pytest.mark.parametrize("fn, args, text, dims", [
    (stacked_rnn.program, stacked_rnn.specs("small"), "{ S_b0[i, j, k] -> [j + k, j] }", "dim i apart: add it"),
    (stacked_rnn.program, stacked_rnn.inputs("small", 0), "{ S_b0[i, j, k] -> [j + k, i] }",
     "dims j, k apart: add them"),
    (scan_then_map, two_inputs(0), "{ S_b0[i, j] -> [i, j]; S_b1[i, j] -> [i + 1, j] }", "orders S_b"),
])
def test_non_injective_schedule_names_two_instances_at_one_time(fn, args, text, dims):
    """polyft does not complete a schedule: it names the instances and what to add."""
    msg = error_of(fn, *args, schedule=text)
    found = re.search(r"(S_b\d\[[\d, ]+\]) and (S_b\d\[[\d, ]+\]) are both at (\[[-\d, ]+\])", msg)
    assert found and dims in msg, msg
    first, second, time = found.groups()
    assert first != second
    prog = ft.analyze(fn, *args, schedule="original")
    at = lengths(msg, prog.model.params).intersect(prog.model.context) if prog.model.params else prog.model.context
    user = isl.UnionMap(text)
    assert str(time_of(user, first, at)) == str(time_of(user, second, at)) == time, msg


# -- Schedule.T agrees with the map ----------------------------------------------------------------


def scanr_program(xss, w):
    return xss.map(lambda xs: xs.scanr(lambda x, s: ft.tanh(x @ w + s), ft.zeros((1, H))))


def lstm_like_reverse(xs, w):
    return xs.scanr(lambda x, s: ft.tanh(x @ w + s), ft.zeros((1, H)))


@pytest.mark.parametrize("kind", ["auto", "original"])
@pytest.mark.parametrize("fn, args", [
    (scanr_program, TWO_SPECS),
    (lstm_like_reverse, (ft.spec(f"[L]float32[1, {H}]"), TWO_SPECS[1])),
    (stacked_rnn.program, stacked_rnn.specs("small")),
])
def test_T_is_the_linear_part_of_the_map(fn, args, kind):
    prog = ft.analyze(fn, *args, schedule=kind, sizes={p: 3 for p in ft.trace(fn, *args).params})
    for name, m in prog.schedule.per_statement.items():
        rows = [r for r, _ in time_rows(m) if any(r)]
        assert rows == prog.schedule.T[name].tolist(), (name, m, prog.schedule.T[name])
    if fn is not stacked_rnn.program:  # the scan runs j = L - 1 down to 0
        assert any(c < 0 for row in next(iter(prog.schedule.T.values())).tolist() for c in row)


# -- polyft inspect --schedule "<isl>" ------------------------------------------------------------


def test_cli_legal_schedule(capsys):
    assert main(["inspect", "stacked_rnn", "--schedule", WAVE, "--size", "N=2,D=3,L=4"]) == 0
    out = capsys.readouterr().out.split("user schedule")[1]
    assert "legal: yes" in out and "sequential steps: 6" in out, out
    assert "time dims (outer to inner): c0 seq, c1 par, c2 par" in out and "parallel dims: c1, c2" in out, out
    prog = ft.analyze(stacked_rnn.program, *stacked_rnn.specs("small"), schedule=WAVE, sizes={"N": 2, "D": 3, "L": 4})
    nest = build_ast(prog.schedule.map, prog.model.context).to_C_str()
    assert "for (int c0 = 0; c0 <= 5; c0 += 1)" in nest
    assert "\n".join("  " + ln for ln in nest.splitlines()) in out, out
    # parametric (no --size): the steps need sizes, the rest is printed
    assert main(["inspect", "stacked_rnn", "--schedule", FORMS["prefixed"]]) == 0
    out = capsys.readouterr().out
    assert "legal: yes" in out and "give concrete --size for D, L, N" in out and "c0 < D + L - 1" in out, out


@pytest.mark.parametrize("text, reason", [
    ("{ S_b0[i, j, k] -> [i, j, -k] }", "S_b0[0, 0, 0] must run before S_b0[0, 0, 1]"),
    ("{ S_b0[i, j, k] -> [j + k, j] }", "two instances at one time"),
])
def test_cli_illegal_schedule(capsys, text, reason):
    assert main(["inspect", "stacked_rnn", "--schedule", text, "--size", "N=2,D=3,L=4"]) == 1
    out = capsys.readouterr().out.split("user schedule")[1]
    assert "legal: no" in out and reason in out and "legal: yes" not in out, out
    assert "loop nest" in out and "for (int c0 = 0;" in out, out


def test_cli_schedule_errors_and_the_flag_without_a_value(capsys):
    assert main(["inspect", "stacked_rnn", "--schedule", "{ S_bo[i, j, k] -> [i, j, k] }"]) == 2
    assert "did you mean S_b0[i, j, k]?" in capsys.readouterr().err
    assert main(["inspect", "stacked_rnn", "--schedule", "--size", "N=2,D=3,L=4"]) == 0
    out = capsys.readouterr().out
    assert "schedules (original | auto):" in out and "user schedule" not in out
    assert "T = [[0, 1, 1], [0, 1, 0], [1, 0, 0]]: auto time dims c1, c2, c3" in out, out


# -- the README's cookbook --------------------------------------------------------------------------


def cookbook() -> list:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "\n### Schedules by hand\n" in text
    section = text.split("\n### Schedules by hand\n")[1].split("\n## ")[0]
    assert "\n## See the ETDG, the ISL model, the schedule\n" in text.split("\n### Schedules by hand\n")[0]
    return re.findall(r"```(python|bash)\n(.*?)```", section, re.S)


def test_readme_cookbook_runs(capsys):
    blocks = cookbook()
    assert [lang for lang, _ in blocks] == ["python", "bash"]
    namespace = {}
    exec(compile(blocks[0][1], "README.md (Schedules by hand)", "exec"), namespace)
    for example in ("[i, k, j]", "[i, j, j + k]", "[j + k, j, i]", "S_b1[i, j] -> [i, j, 1]"):
        assert example in blocks[0][1]  # interchange, skew, wavefront, fusion
    commands = [ln for ln in blocks[1][1].splitlines() if ln.startswith("polyft ")]
    assert len(commands) == 2
    for line in commands:
        capsys.readouterr()
        status = main(shlex.split(line, comments=True)[1:])
        out = capsys.readouterr().out
        if "exit status 1" in line:
            assert status == 1 and "legal: no" in out, out
        else:
            assert status == 0 and "legal: yes" in out and "sequential steps: 6" in out, out
