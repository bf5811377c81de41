"""The `polyft` command: what a user sees of the workloads and their ETDGs."""
import os
import shutil
import subprocess
import sys

import pytest

import polyft as ft
from polyft.cli import main
from polyft.workloads import WORKLOADS, stacked_rnn

STATE_READ = "ysss[i, j, k - 1]   M=[1 0 0; 0 1 0; 0 0 1] o=[0, 0, -1]   if k >= 1"
BLOCK = "block b0 [i < N, j < D, k < L]  p = [map, scanl, scanl]"


def polyft_script():
    """The installed console script (next to this interpreter, else on PATH)."""
    here = os.path.join(os.path.dirname(sys.executable), "polyft")
    return here if os.path.exists(here) else shutil.which("polyft")


def test_workloads_lists_all_seven_with_type_signatures(capsys):
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    assert len(WORKLOADS) == 7
    lines = out.splitlines()
    for name, mod in WORKLOADS.items():
        (k,) = [n for n, line in enumerate(lines) if line.split()[:1] == [name]]
        assert lines[k] == f"{name:<16} {mod.DESCRIPTION}"
        signature = ft.trace(mod.program, *mod.specs("small")).signature()
        assert lines[k + 1].strip() == signature
        assert signature.startswith(f"{name}(") and " -> " in signature
    assert ("stacked_rnn(xss: [N, L]float32[1, 8], ws: [D]float32[8, 8]) -> ysss: [N, D, L]float32[1, 8]"
            in out)


def test_workloads_with_another_preset(capsys):
    assert main(["workloads", "--preset", "paper"]) == 0
    assert "ysss: [N, D, L]float32[1, 512]" in capsys.readouterr().out


def test_inspect_stacked_rnn(capsys):
    assert main(["inspect", "stacked_rnn"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("etdg stacked_rnn(xss: [N, L]float32[1, 8], ws: [D]float32[8, 8])")
    assert BLOCK in out
    assert STATE_READ in out
    assert "depth 2, dimension 5" in out
    assert out.strip() == str(ft.trace(stacked_rnn.program, *stacked_rnn.specs()))


def test_inspect_writes_dot(tmp_path, capsys):
    path = tmp_path / "rnn.dot"
    assert main(["inspect", "stacked_rnn", "--dot", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {path}" in out and BLOCK in out
    dot = path.read_text()
    assert dot.startswith('digraph "stacked_rnn" {') and dot.rstrip().endswith("}")
    assert dot.count('subgraph "cluster_') == 1
    assert f'[label="{STATE_READ}"]' in dot
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg", str(path)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr


def test_inspect_deps(capsys):
    assert main(["inspect", "stacked_rnn", "--deps"]) == 0
    out = capsys.readouterr().out
    assert "flow dependences" in out and "distance vectors" in out


def test_unknown_workload_exits_2_naming_the_known_ones_and_the_user_forms(capsys):
    assert main(["inspect", "no_such_workload"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert "no workload 'no_such_workload'" in err and "FILE.py:FUNCTION" in err
    for name in WORKLOADS:
        assert name in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_inspect_help_lists_the_workloads(capsys):
    with pytest.raises(SystemExit) as info:
        main(["inspect", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in WORKLOADS)


@pytest.mark.parametrize("argv, message", [
    (["--deps", "--size", "N=two"], "--size expects name=value"),
    (["--deps", "--size", "Q=3"], "unknown lengths ['Q']"),
    (["--schedule", "{ S_b0[i, j, k] -> [i, j, k"], "cannot read the schedule"),
])
def test_argument_errors_come_before_any_output(argv, message, capsys):
    """A bad --size or --schedule is reported before the ETDG is printed, not after it."""
    assert main(["inspect", "stacked_rnn", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err, captured


def test_schedule_says_which_statements_coarsening_removed(capsys):
    """grid_rnn's b1 (a copy of a constant) is fused away: --schedule says so instead of
    silently listing no S_b1."""
    assert main(["inspect", "grid_rnn", "--schedule"]) == 0
    out = capsys.readouterr().out
    traced = {st.name for st in ft.trace(WORKLOADS["grid_rnn"].program, *WORKLOADS["grid_rnn"].specs("small")).statements}
    scheduled = {st.name for st in ft.analyze(WORKLOADS["grid_rnn"].program,
                                              *WORKLOADS["grid_rnn"].specs("small")).etdg.statements}
    assert traced - scheduled == {"S_b1"}
    [line] = [ln for ln in out.splitlines() if ln.strip().startswith("S_b1[")]
    assert "removed by coarsening" in line and "store in b1" in line
    assert not [ln for ln in out.splitlines() if "removed" in ln and ln.strip().startswith(("S_b2", "S_b3"))]


@pytest.mark.parametrize("name", ["auto", "original"])
def test_named_schedules_print_what_a_bare_schedule_flag_prints(capsys, name):
    """`--schedule auto` (what a user types after reading `schedule="auto"`) is the bare flag,
    not an ISL string to check."""
    assert main(["inspect", "stacked_lstm", "--schedule"]) == 0
    bare = capsys.readouterr().out
    assert main(["inspect", "stacked_lstm", "--schedule", name]) == 0
    assert capsys.readouterr().out == bare


def test_unknown_preset_exits_2_naming_the_presets(capsys):
    assert main(["inspect", "stacked_rnn", "--preset", "huge"]) == 2
    err = capsys.readouterr().err
    assert "huge" in err and all(p in err for p in stacked_rnn.PRESETS)
    assert "raise PolyftError" not in err and "_common.py" not in err


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "usage: polyft" in capsys.readouterr().err


def test_console_script():
    script = polyft_script()
    assert script is not None, "the polyft console script is not installed (pip install -e .)"
    done = subprocess.run([script, "inspect", "stacked_rnn"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert BLOCK in done.stdout and STATE_READ in done.stdout
    done = subprocess.run([script, "inspect", "nope"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no workload 'nope'" in done.stderr and "Traceback" not in done.stderr
    assert all(name in done.stderr for name in WORKLOADS)


def test_inspect_storage_shows_the_contracted_gates_and_bytes(capsys):
    """--storage: the stacked LSTM's gates keep one tile per (sentence, layer), not per step;
    local to a wavefront cell, a thread's scratch keeps those of one layer (the C target's
    placement); with concrete sizes the bytes per buffer follow, without them a hint."""
    assert main(["inspect", "stacked_lstm", "--storage", "--size", "N=2,D=3,L=5"]) == 0
    out = capsys.readouterr().out.split("storage (intermediate buffers")[1]
    gates = next(line for line in out.splitlines() if "cells" in line)
    assert gates.endswith("cells [N, D, 1, 4] of [N, D, L, 4]"), gates
    table = out.split("full_bytes")[1]
    row = next(line.split() for line in table.splitlines() if line.split()[:1] == [gates.split(":")[0]])
    assert "local    cells [N, 1, 1, 4] per thread running 1 iteration(s)" in out
    assert row[1] == "intermediate" and int(row[3]) == 0 and int(row[5]) == 0 and row[6] == "local"  # packed: 0
    assert int(row[2]) == 3 * 5 * int(row[4])  # D = 3 layers, L = 5 steps in 1 cell
    assert main(["inspect", "stacked_lstm", "--storage"]) == 0
    assert "give concrete --size for D, L, N" in capsys.readouterr().out


def test_inspect_plot_writes_the_schedule_picture(tmp_path, capsys):
    """--plot draws prog.schedule.plot() at the small preset's lengths, --size overriding them;
    a slice too large to draw fails before any output."""
    png = tmp_path / "rnn.png"
    assert main(["inspect", "stacked_rnn", "--plot", str(png), "--size", "D=4,L=6"]) == 0
    assert f"wrote {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    big = tmp_path / "big.png"
    assert main(["inspect", "stacked_rnn", "--plot", str(big), "--size", "D=60,L=60"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "3600 points" in captured.err and not big.exists()


# -- command-line mistakes: one line, no traceback; reproduce's folder and help ------------------------

@pytest.mark.parametrize("argv, says", [
    (["inspect", "stacked_rnn", "--plot", "/no/such/folder/x.png"], "--plot /no/such/folder/x.png: no folder"),
    (["inspect", "stacked_rnn", "--dot", "/no/such/folder/x.dot"], "--dot /no/such/folder/x.dot: no folder"),
    (["inspect", "no_such_workload"], "no workload 'no_such_workload'"),
    (["inspect", "stacked_rnn", "--size", "N=two"], "--size"),
    (["reproduce", "fig99"], "unknown artefacts fig99"),
])
def test_a_command_line_mistake_is_one_line_and_exit_2(argv, says, tmp_path):
    """As a user runs it (the console script, its own process): nothing on stdout, one line on
    stderr naming the mistake, no traceback, and no file written."""
    done = subprocess.run([polyft_script(), *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], done.stderr
    assert os.listdir(tmp_path) == []


def test_a_bad_spec_of_a_users_function_is_one_line(tmp_path):
    (tmp_path / "mine.py").write_text("def f(xs):\n    return xs.map(lambda x: x + 1)\n")
    done = subprocess.run([polyft_script(), "inspect", "mine.py:f", "--spec", "[N]float33[1, 8]"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "float33" in done.stderr, done.stderr


def test_reproduce_writes_a_fresh_folder_by_default_never_results(tmp_path, monkeypatch, capsys):
    """Without --out: out/<date>-<host>/, a new one for each run (-2, ...), the latest again with
    --resume; a results/ folder beside it (the committed record) is never touched."""
    from polyft.experiments.common import fresh_out

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    first = fresh_out()
    assert first.startswith(os.path.join("out", "")) and "results" not in first
    assert main(["reproduce", "table5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"writing into {first} (a new folder)\n")
    assert sorted(os.listdir(first)) == ["README.md", "table5_quick.txt"] and f"wrote {first}/table5_quick.txt" in out
    assert fresh_out(resume=True) == first and fresh_out() == first + "-2"
    assert main(["reproduce", "table5", "--no-plots"]) == 0
    assert capsys.readouterr().out.startswith(f"writing into {first}-2 (a new folder)\n")
    assert fresh_out(resume=True) == first + "-2"
    assert os.listdir(tmp_path / "results") == []
    assert main(["reproduce", "table5", "--out", "results"]) == 0  # named: written there
    assert "writing into results\n" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / "results")) == ["README.md", "table5_quick.txt"]


def test_reproduce_help_lists_every_artefact_and_module_main_runs(tmp_path):
    from polyft.experiments.registry import ARTEFACTS, PLOTS

    for argv in ([polyft_script(), "reproduce", "--help"], [sys.executable, "-m", "polyft.experiments.reproduce",
                                                             "--help"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        listed = done.stdout.split("artefacts (experiments/registry.py")[1]
        for name, artefact in ARTEFACTS.items():
            line = next(ln for ln in listed.splitlines() if ln.split()[:1] == [name])
            assert all(f in line for f in artefact.files), line
        assert all(p in listed for p in PLOTS)
    done = subprocess.run([sys.executable, "-m", "polyft.experiments.reproduce", "table5", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "j3 in [max(1, -L + j4 + 1), min(j4, D))" in done.stdout  # table5's result, as `polyft reproduce table5`
    assert sorted(os.listdir(tmp_path)) == ["README.md", "table5_quick.txt"]
