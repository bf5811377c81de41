"""A new user's own function, with the README's section "Inspecting your own program" alone:
its gru.py (a GRU over sentences with a read-out) saved to a fresh directory, every shell
command of the section run on it (exit statuses and the output lines the README shows),
the module form, the command line's errors (one line, exit 2), `python gru.py` (the Python
path), and the compiled GRU, under the auto schedule and a hand schedule named from what
`--schedule` prints, against eager numpy, a numpy GRU written batched in float64 and
torch.nn.GRU. Also what `schedule.describe()` reports of coarsening (schedule/provenance.py)
on the bundled workloads."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import polyft as ft
from polyft.cli import main
from polyft.errors import ScheduleError
from polyft.loading import load_function
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS

from helpers import shell_commands

pytestmark = pytest.mark.usefixtures("compile_cache")

README = Path(__file__).resolve().parents[1] / "README.md"
SPECS = ("[N, L]float32[1, 8]", "float32[8, 24]", "float32[8, 24]", "float32[8, 8]")
SPEC_ARGS = [a for s in SPECS for a in ("--spec", s)]


def section() -> tuple:
    """(gru.py's source, [(command, exit status, output lines shown)]) from the README section."""
    text = README.read_text()
    start = text.index("## Inspecting your own program")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", text[start:end if end > 0 else None], re.S | re.M)
    [source] = [code for lang, code in blocks if lang == "python" and code.startswith("# gru.py")]
    commands = [(body, status, shown) for lang, code in blocks if lang == "bash"
                for body, _, status, shown in shell_commands(code)]
    return source, commands


SOURCE, COMMANDS = section()


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A fresh directory holding the README's gru.py, as a new user saves it."""
    d = tmp_path_factory.mktemp("user")
    (d / "gru.py").write_text(SOURCE)
    return d


def run(argv, cwd) -> subprocess.CompletedProcess:
    """A shell command as the user types it; `polyft` is this interpreter's CLI."""
    if argv[0] == "polyft":
        argv = [sys.executable, "-m", "polyft.cli", *argv[1:]]
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_section_shows_every_view_on_the_users_file():
    flags = {w for cmd, _, _ in COMMANDS for w in shlex.split(cmd)}
    assert {"--deps", "--coarsen", "--schedule", "--storage", "--plot", "--profile", "--size"} <= flags
    assert all(shlex.split(cmd)[:3] in (["polyft", "inspect", "gru.py:gru"], ["polyft", "inspect", "gru:gru"])
               for cmd, _, _ in COMMANDS)
    assert any(status == 1 for _, status, _ in COMMANDS), "an illegal hand schedule (exit status 1) is shown"


@pytest.mark.parametrize("command, status, shown", COMMANDS, ids=[f"cmd{k}" for k in range(len(COMMANDS))])
def test_readme_command_runs_on_the_users_file(command, status, shown, home):
    done = run(shlex.split(command), home)
    assert done.returncode == status, f"{command}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr}"
    assert "Traceback" not in done.stderr
    if "--profile" not in command:  # every other view prints the ETDG first
        assert done.stdout.startswith("etdg gru(xss: [N, L]float32[1, 8]")
    lines = [ln.strip() for ln in done.stdout.splitlines()]
    for expected in shown:
        prefix = expected.removesuffix("...").rstrip()
        assert any(ln.startswith(prefix) for ln in lines), f"{command}: no output line {expected!r}"
    if "--plot" in command:
        png = home / shlex.split(command)[shlex.split(command).index("--plot") + 1]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_schedule_names_the_statements_a_hand_schedule_uses(home, capsys, monkeypatch):
    """--schedule says the read-out was merged into the scan and names the traced statements;
    a hand schedule written with those names compiles and equals eager; with coarsen=True the
    same names are an error naming the statement each became part of."""
    monkeypatch.chdir(home)
    assert main(["inspect", "gru.py:gru", *SPEC_ARGS, "--schedule", "--size", "N=2", "--size", "L=5"]) == 0
    out = capsys.readouterr().out
    assert "S_b0[i, j] runs traced S_b0[i, j] + S_b1[i, j] (vertical merge)" in out
    [names] = re.findall(r"names the traced statements: (.*?);", out)
    assert names == "S_b0[i, j], S_b1[i, j]"
    gru, inputs = load_function("gru.py:gru"), gru_inputs(np.random.default_rng(7), 2, 5)
    scan, readout = re.findall(r"S_\w+\[[^\]]*\]", names)
    hand = f"{{ {scan} -> [j, i, 0]; {readout} -> [j, i, 1] }}"  # step j of every sentence, read out at once
    prog = ft.compile(gru, *map(ft.spec, SPECS), schedule=hand)
    assert prog.schedule.kind == "user" and rel_error(prog(*inputs), gru(*inputs)) < 1e-5
    with pytest.raises(ScheduleError, match=r"S_b1\[i, j\] is part of S_b0\[i, j\]"):
        ft.analyze(gru, *map(ft.spec, SPECS), schedule=hand, coarsen=True)


def test_the_module_form_inspects_the_same_program(home):
    by_file = run(["polyft", "inspect", "gru.py:gru", *SPEC_ARGS], home)
    by_module = run(["polyft", "inspect", "gru:gru", *SPEC_ARGS], home)
    assert by_file.returncode == by_module.returncode == 0, by_module.stderr
    assert by_module.stdout == by_file.stdout


@pytest.mark.parametrize("argv, message", [
    (["nothere.py:gru", *SPEC_ARGS], "no file 'nothere.py'"),
    (["gru.py:lstm", *SPEC_ARGS], "gru.py defines no 'lstm'; its functions: gru"),
    (["gru.py:gru", *SPEC_ARGS[:4]], "gru(xss, w, u, wo) takes 4 input(s), got 2 --spec"),
    (["gru.py:gru", "--spec", "[N, L]float32[1, 8", *SPEC_ARGS[2:]], "--spec for xss: cannot parse the type"),
    (["gru.py:gru", "--spec", "[N, L]floaty[1, 8]", *SPEC_ARGS[2:]], "--spec for xss: unknown dtype 'floaty'"),
    (["gru.py:gru", *SPEC_ARGS, "--plot", "x.png"], "--plot needs concrete lengths: give --size L=4,N=4"),
    (["gru.py:gru", *SPEC_ARGS, "--preset", "small"], "--preset sizes the bundled workloads"),
    (["gru.py:gru", *SPEC_ARGS, "--size", "Q=3"], "unknown lengths ['Q']"),
    (["stacked_rnn", *SPEC_ARGS], "--spec gives the inputs of your own function"),
    (["gru", *SPEC_ARGS], "no workload 'gru': name a bundled one"),
    (["broken.py:f", *SPEC_ARGS], "importing broken.py failed: NameError: name 'undefined_name' is not defined "
                                  "(line 2)"),
    (["nopackage.gru:gru", *SPEC_ARGS], "no module 'nopackage'"),
])
def test_command_line_errors_are_one_line(argv, message, home):
    (home / "broken.py").write_text("import polyft\nx = undefined_name\n")
    done = run(["polyft", "inspect", *argv], home)
    assert done.returncode == 2 and done.stdout == "" and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_file_named_like_a_loaded_module_does_not_replace_it(tmp_path):
    import random

    (tmp_path / "random.py").write_text("import polyft as ft\n\ndef f(xs):\n    return xs.map(ft.tanh)\n")
    f = load_function(f"{tmp_path / 'random.py'}:f")
    assert sys.modules["random"] is random and f.__module__ == "_polyft_user_random"
    xs = ft.FractalTensor.from_numpy(np.random.default_rng(3).standard_normal((3, 1, 4)).astype(np.float32), depth=1)
    assert rel_error(ft.compile(f, ft.spec("[N]float32[1, 4]"))(xs), np.tanh(xs.to_numpy())) < 1e-6


def test_python_gru_py_runs_its_walkthrough(home):
    """`python gru.py`: the section's Python path (eager, trace, analyze, describe, a hand
    schedule, compile, memory, the picture), checking itself against eager."""
    done = run([sys.executable, "gru.py"], home)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (home / "gru_schedule.png").read_bytes()[:4] == b"\x89PNG"


# -- the compiled GRU against references written independently ------------------------------------

def gru_inputs(rng, n, length, h=8):
    xss = ft.FractalTensor.from_numpy(rng.standard_normal((n, length, 1, h)).astype(np.float32), depth=2)
    w, u = (rng.standard_normal((h, 3 * h)).astype(np.float32) * 0.4 for _ in range(2))
    wo = rng.standard_normal((h, h)).astype(np.float32) * 0.4
    return xss, w, u, wo


def numpy_gru(x, w, u, wo) -> np.ndarray:
    """The GRU in float64, all sentences at once, gates split from the packed columns."""
    x, w, u, wo = (np.asarray(a, dtype=np.float64) for a in (x, w, u, wo))
    n, length, _, h = x.shape
    (wr, wz, wn), (ur, uz, un) = np.split(w, 3, axis=1), np.split(u, 3, axis=1)
    state, out = np.zeros((n, h)), np.empty((n, length, 1, h))
    for t in range(length):
        xt = x[:, t, 0]
        r = 1 / (1 + np.exp(-(xt @ wr + state @ ur)))
        z = 1 / (1 + np.exp(-(xt @ wz + state @ uz)))
        cand = np.tanh(xt @ wn + r * (state @ un))
        state = (1 - z) * cand + z * state
        out[:, t, 0] = state @ wo
    return out


def torch_gru(x, w, u, wo) -> np.ndarray:
    """torch.nn.GRU (no biases) with the same weights: its rows are our columns."""
    n, length, _, h = x.shape
    cell = torch.nn.GRU(h, h, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        cell.weight_ih_l0.copy_(torch.from_numpy(np.asarray(w, np.float64).T))
        cell.weight_hh_l0.copy_(torch.from_numpy(np.asarray(u, np.float64).T))
        hs, _ = cell(torch.from_numpy(np.asarray(x, np.float64).reshape(n, length, h)))
    return (hs.numpy() @ np.asarray(wo, np.float64)).reshape(n, length, 1, h)


@pytest.mark.parametrize("n, length", [(2, 5), (3, 1), (1, 9)])
def test_compiled_gru_equals_eager_numpy_and_torch(n, length, home):
    gru = load_function(str(home / "gru.py") + ":gru")
    inputs = gru_inputs(np.random.default_rng(100 + 10 * n + length), n, length)
    x = inputs[0].to_numpy()
    eager = gru(*inputs).to_numpy()
    want, torch_want = numpy_gru(x, *inputs[1:]), torch_gru(x, *inputs[1:])
    assert rel_error(torch_want, want) < 1e-12  # the two references agree
    assert rel_error(eager, want) < 1e-5
    for target in ("c", "cuda-emulated"):  # symbolic N, L: one program for every size
        prog = ft.compile(gru, *map(ft.spec, SPECS), target=target)
        got = prog(*inputs).to_numpy()
        assert rel_error(got, eager) < 1e-5 and rel_error(got, torch_want) < 1e-5, target
        assert prog.schedule.coarsening.runs == {"S_b0": ["S_b0", "S_b1"]}  # the read-out runs in the scan


# -- schedule.describe() on the bundled workloads ----------------------------------------------

@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_traced_statement_is_scheduled_once_or_reported_removed(name):
    mod = WORKLOADS[name]
    prog = ft.analyze(mod.program, *mod.specs("small"))
    c = prog.schedule.coarsening
    ran = [m for ms in c.runs.values() for m in ms]
    assert sorted(ran + list(c.removed)) == sorted(st.name for st in prog.traced.statements)
    assert set(c.runs) == {st.name for st in prog.etdg.statements}
    text = prog.schedule.describe(prog.model.context)
    assert all(inst in text for inst in c.traced.values())  # every traced name, for a hand schedule
    assert all(why for why in c.removed.values())  # each removal with the log line that did it


def test_a_block_name_coarsening_reuses_is_not_taken_for_the_traced_one():
    """BigBird: coarsening splits traced S_b1's dims into a new child block it names b6, after
    the traced b6 was merged away: the scheduled S_b6 runs S_b1, the traced S_b6 is in S_b0."""
    mod = WORKLOADS["bigbird"]
    c = ft.analyze(mod.program, *mod.specs("small")).schedule.coarsening
    assert c.runs["S_b6"] == ["S_b1"]
    assert "S_b6" in c.runs["S_b0"] and c.scheduled["S_b6"] == "S_b6[i, j, k]" and c.traced["S_b6"] == "S_b6[i, j]"
    with pytest.raises(ScheduleError, match=r"S_b3\[i, j\] is part of S_b0\[i, j\]"):
        ft.analyze(mod.program, *mod.specs("small"), schedule="{ S_b3[i, j] -> [i, j] }", coarsen=True)


def test_describe_without_coarsening_names_the_traced_statements():
    mod = WORKLOADS["stacked_lstm"]
    prog = ft.analyze(mod.program, *mod.specs("small"), schedule="original")
    assert "statements as traced (no coarsening); a hand schedule names them: S_b1[i, j], S_b3[i, j, k, l], " \
           "S_b2[i, j, k]" in prog.schedule.describe()
    auto = ft.analyze(mod.program, *mod.specs("small")).schedule.describe()
    assert "S_b0[i, j, k] runs traced S_b2[i, j, k] (perfect nest flattened)" in auto
    assert "S_b1[i, j] removed by coarsening: dead: nothing reads t0" in auto
