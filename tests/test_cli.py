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


def test_unknown_workload_exits_2_naming_the_known_ones(capsys):
    assert main(["inspect", "no_such_workload"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.startswith("error: ") and "no_such_workload" in err
    for name in WORKLOADS:
        assert name in err
    # the location shown is the caller's, not a line of polyft's own source
    assert "raise PolyftError" not in err and "__init__.py" not in err


def test_unknown_preset_exits_2_naming_the_presets(capsys):
    assert main(["inspect", "stacked_rnn", "--preset", "huge"]) == 2
    err = capsys.readouterr().err
    assert "huge" in err and all(p in err for p in stacked_rnn.PRESETS)
    assert "raise PolyftError" not in err and "_common.py" not in err


def test_bad_size_exits_2(capsys):
    assert main(["inspect", "stacked_rnn", "--deps", "--size", "N=two"]) == 2
    assert "--size expects name=value" in capsys.readouterr().err


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
    assert done.returncode == 2 and "known workloads: " + ", ".join(WORKLOADS) in done.stderr


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
    assert row[1] == "intermediate" and int(row[3]) == 0 and row[5] == "local"
    assert int(row[2]) == 3 * 5 * int(row[4])  # D = 3 layers, L = 5 steps in 1 cell
    assert main(["inspect", "stacked_lstm", "--storage"]) == 0
    assert "give concrete --size for D, L, N" in capsys.readouterr().out
