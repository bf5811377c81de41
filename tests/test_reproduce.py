"""Running artefacts: `polyft reproduce NAME` and `python -m polyft.experiments.NAME` print the
artefact's result and list every file written, files carry their preset, sweeps resume, the
progress bar stays off stderr when it is not a terminal. Cheap: table5, or sweeps whose
measurements are replaced by fakes."""
import importlib
import inspect
import io
import os
import subprocess
import sys

import pandas as pd
import pytest

from polyft.cli import main
from polyft.experiments import common, fig8, measure, plot, registry

TABLE5_BOUNDS = "j3 in [max(1, -L + j4 + 1), min(j4, D))"


def _written(out: str) -> list:
    return [line.removeprefix("wrote ") for line in out.splitlines() if line.startswith("wrote ")]


def test_reproduce_one_artefact_prints_its_result_and_lists_its_files(tmp_path, capsys):
    assert main(["reproduce", "table5", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert TABLE5_BOUNDS in out and "j1 in [0, 8)" in out  # Table 5 itself, at the quick sizes
    assert sorted(os.listdir(tmp_path)) == ["README.md", "table5_quick.txt"]  # no plots, no other tables
    assert sorted(_written(out)) == [str(tmp_path / "README.md"), str(tmp_path / "table5_quick.txt")]
    assert out.rstrip().splitlines()[-2:] == [f"wrote {f}" for f in sorted(_written(out))]  # the list ends the run
    assert "| table5_quick.txt | table5 | quick |" in (tmp_path / "README.md").read_text()


def test_the_artefact_command_line_runs_the_same_with_the_same_default(tmp_path, capsys):
    assert main(["reproduce", "table5", "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    done = subprocess.run([sys.executable, "-m", "polyft.experiments.table5", "--out", str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert TABLE5_BOUNDS in done.stdout and f"wrote {tmp_path / 'b' / 'table5_quick.txt'}" in done.stdout
    assert sorted(os.listdir(tmp_path / "b")) == ["README.md", "table5_quick.txt"]
    assert (tmp_path / "a" / "table5_quick.txt").read_text() == (tmp_path / "b" / "table5_quick.txt").read_text()


def test_paper_writes_paper_files_and_leaves_the_quick_ones(tmp_path, capsys):
    assert main(["reproduce", "table5", "--out", str(tmp_path)]) == 0
    quick = tmp_path / "table5_quick.txt"
    before = (quick.stat().st_mtime_ns, quick.read_text())
    assert main(["reproduce", "table5", "--paper", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "j1 in [0, 512)" in (tmp_path / "table5_paper.txt").read_text()
    assert (quick.stat().st_mtime_ns, quick.read_text()) == before
    assert str(quick) not in _written(out.split("[table5] ok")[-1])
    index = (tmp_path / "README.md").read_text()
    assert "| table5_quick.txt | table5 | quick |" in index and "| table5_paper.txt | table5 | paper |" in index


def test_unknown_artefact_fails_before_anything_runs(tmp_path, capsys):
    out_dir = tmp_path / "out"
    assert main(["reproduce", "table5", "fig99", "--out", str(out_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: reproduce: unknown artefacts fig99; known: ")
    assert all(name in captured.err for name in registry.ARTEFACTS) and "raise PolyftError" not in captured.err
    assert "[table5]" not in captured.out and not out_dir.exists()
    with pytest.raises(SystemExit) as info:
        main(["reproduce", "table5", "--quick", "--paper", "--out", str(out_dir)])
    assert info.value.code == 2 and not out_dir.exists()


@pytest.mark.parametrize("name", sorted(registry.ARTEFACTS))
def test_every_artefact_runs_alike(name):
    """run(preset="quick", out_dir, resume) and result_text(out_dir, preset) everywhere, and a
    command line through reproduce.main (table7's adds --ncu to it)."""
    mod = importlib.import_module(registry.ARTEFACTS[name].module)
    params = inspect.signature(mod.run).parameters
    assert list(params)[:3] == ["preset", "out_dir", "resume"]
    assert params["preset"].default == "quick" and params["resume"].default is False
    assert list(inspect.signature(mod.result_text).parameters) == ["out_dir", "preset"]
    source = inspect.getsource(mod)
    assert f'main("{name}", __doc__)' in source or 'command_line("table7", __doc__)' in source


# -- sweeps: resume and progress ---------------------------------------------------------------

class Interrupt(Exception):
    pass


def _fake_measure(calls: list, fail_after=None):
    """measure.measure without measuring: two systems' rows per point; `calls` records the
    points measured; the call after `fail_after` points raises (an interrupted run)."""
    def fake(workload, sizes, preset="quick", repeats=None, warmup=None, extra=None, info=None, by_hand=False):
        if fail_after is not None and len(calls) == fail_after:
            raise Interrupt
        calls.append((workload, measure.shape_string(sizes), tuple((extra or {}).items())))
        return [dict(workload=workload, shape=measure.shape_string(sizes), **(extra or {}), system=s, status="ok",
                     seconds=1e-3 * len(calls), preset=preset) for s in ("c-auto", "torch-cell-loop")]
    return fake


def test_resume_measures_only_the_missing_points(tmp_path, monkeypatch, capsys):
    points = fig8.points("quick")
    first = []
    monkeypatch.setattr(measure, "measure", _fake_measure(first, fail_after=5))
    with pytest.raises(Interrupt):
        fig8.run("quick", str(tmp_path))
    csv = tmp_path / "fig8_quick.csv"
    assert len(pd.read_csv(csv)) == 2 * 5  # every finished point was written before the interruption

    second = []
    monkeypatch.setattr(measure, "measure", _fake_measure(second))
    drawn = []
    monkeypatch.setattr(plot, "run", lambda *args: drawn.append(args) or [])
    monkeypatch.setattr(plot, "summary", lambda *args: "DERIVED TABLES")
    assert main(["reproduce", "fig8", "--resume", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert len(second) == len(points) - 5 and not set(first) & set(second)
    df = pd.read_csv(csv)
    key = ["workload", "shape", "model", "panel", "depth", "seq_len", "system"]
    assert len(df) == 2 * len(points) and not df.duplicated(key).any()
    assert list(dict.fromkeys(zip(df["model"], df["panel"], df["workload"], df["depth"], df["seq_len"]))) == [
        (p.extra["model"], p.extra["panel"], p.workload, p.extra["depth"], p.extra["seq_len"]) for p in points]
    assert drawn == [(str(tmp_path), "quick", ["fig8"])]  # only fig8's plots
    assert "median ms per system" in out and "DERIVED TABLES" in out and f"wrote {csv}" in out

    third = []  # without --resume: afresh
    monkeypatch.setattr(measure, "measure", _fake_measure(third))
    fig8.run("quick", str(tmp_path))
    assert len(third) == len(points) and len(pd.read_csv(csv)) == 2 * len(points)


def _sweep(tmp_path, measured, resume=False):
    return common.sweep("demo", "quick", str(tmp_path), [1, 2, 3], lambda p: measured.append(p) or [{"n": p}],
                        key=lambda p: {"n": p}, resume=resume)


def test_resume_drops_points_no_longer_swept_and_keeps_the_rest(tmp_path):
    pd.DataFrame({"n": [1, 9, 2], "x": ["a", "b", "c"]}).to_csv(tmp_path / "demo_quick.csv", index=False)
    measured = []
    df = _sweep(tmp_path, measured, resume=True)
    assert measured == [3] and list(df["n"]) == [1, 2, 3] and list(df["x"].fillna("-")) == ["a", "c", "-"]
    pd.DataFrame({"m": [1]}).to_csv(tmp_path / "demo_quick.csv", index=False)
    with pytest.raises(Exception, match="cannot resume"):
        _sweep(tmp_path, [], resume=True)


def test_progress_only_on_a_terminal(tmp_path, monkeypatch, capsys):
    _sweep(tmp_path, [])
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    _sweep(tmp_path, [])
    assert "demo" in terminal.getvalue() and "/3" in terminal.getvalue()
