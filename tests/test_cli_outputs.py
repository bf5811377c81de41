"""Where the `polyft` command writes (polyft.outputs): checked before anything is printed, written
exactly as named; DOT names escaped; an empty CSV met by --resume named."""
from __future__ import annotations

import os
import re

import pytest

from polyft.cli import main
from polyft.errors import PolyftError


def fails_before_output(argv, says, capsys):
    assert main(argv) == 2
    got = capsys.readouterr()
    assert got.out == "", got.out
    lines = got.err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], got.err


@pytest.mark.parametrize("name", ["out", "fig.PNG", "picture.svg"])
def test_plot_writes_exactly_the_path_it_names(tmp_path, capsys, name):
    target = tmp_path / name
    assert main(["inspect", "stacked_rnn", "--plot", str(target), "--size", "D=2,L=3"]) == 0
    assert f"wrote {target}" in capsys.readouterr().out
    assert os.listdir(tmp_path) == [name]
    head = target.read_bytes()[:8]
    assert head.startswith(b"<?xml") or b"<svg" in target.read_bytes()[:400] if name.endswith("svg") \
        else head == b"\x89PNG\r\n\x1a\n"


def test_plot_into_an_unknown_format_is_an_error_before_output(tmp_path, capsys):
    fails_before_output(["inspect", "stacked_rnn", "--plot", str(tmp_path / "fig.PNG.bak")],
                        ".bak is not a picture format", capsys)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("option", ["--plot", "--dot"])
def test_into_a_folder_or_proc_is_an_error_before_output(tmp_path, capsys, option):
    fails_before_output(["inspect", "stacked_rnn", option, str(tmp_path)], "that is a folder", capsys)
    fails_before_output(["inspect", "stacked_rnn", option, "/proc/polyft-test.png"], "cannot create a file in /proc",
                        capsys)
    fails_before_output(["inspect", "stacked_rnn", option, "/proc/self/status"], "/proc/self/status", capsys)


def test_dot_escapes_the_functions_name(tmp_path, capsys):
    (tmp_path / "mine.py").write_text('def f(xs):\n    return xs.map(lambda x: x + 1)\n\n\nf.__name__ = \'a"b\\\\c\'\n')
    out = tmp_path / "g.dot"
    assert main(["inspect", f"{tmp_path / 'mine.py'}:f", "--spec", "[N]float32[1, 4]", "--dot", str(out)]) == 0
    capsys.readouterr()
    dot = out.read_text()
    assert dot.startswith('digraph "a\\"b\\\\c" {'), dot.splitlines()[0]
    for line in dot.splitlines():  # every quoted string closed: quotes not escaped come in pairs
        assert len(re.findall(r'(?<!\\)(?:\\\\)*"', line)) % 2 == 0, line


@pytest.mark.parametrize("where", ["a file", "below a file", "/proc"])
def test_reproduce_out_is_checked_before_output(tmp_path, capsys, where):
    (tmp_path / "f").write_text("")
    out = {"a file": tmp_path / "f", "below a file": tmp_path / "f" / "sub", "/proc": "/proc/polyft-test"}[where]
    fails_before_output(["reproduce", "table5", "--out", str(out)], "--out", capsys)
    assert os.listdir(tmp_path) == ["f"]


def test_resume_from_an_empty_csv_names_it(tmp_path):
    from polyft.experiments.common import _measured

    empty = tmp_path / "fig7_quick.csv"
    empty.write_text("")
    with pytest.raises(PolyftError) as e:
        _measured(str(empty), ["workload"])
    assert str(empty) in str(e.value) and "empty" in str(e.value) and "--resume" in str(e.value)
