"""experiments/plot.py from small hand-made CSVs: what each figure shows (one legend entry and
colour per system, fig8's axes, table7's small bars) and which files run() reads and writes
(preset-tagged names, only the named artefacts' plots)."""
import os
from collections import Counter

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from matplotlib.container import BarContainer, ErrorbarContainer

from polyft.experiments import plot, registry
from polyft.experiments.registry import tagged


def _timing(workload, system, ms, status="ok", **extra):
    """One row of a timing CSV (fig2, fig7, fig8) with the columns plot.py reads."""
    return dict(workload=workload, shape="N=2 H=8 L=4 D=2", system=system, device="cpu", status=status,
                seconds=ms / 1e3, seconds_min=0.9 * ms / 1e3, seconds_max=1.1 * ms / 1e3, repeats=3, threads=2,
                preset="quick", commit="abc", **extra)


def _fig7():
    rows = [_timing("stacked_rnn", s, ms) for s, ms in
            (("numpy-eager", 50.0), ("c-original", 1.2), ("c-auto", 1.0), ("torch-cell-loop", 4.0))]
    rows += [_timing("flash_attention", s, ms) for s, ms in (("c-auto", 2.0), ("torch-sdpa", 3.0))]
    rows += [_timing("bigbird", s, ms) for s, ms in (("c-auto", 2.0), ("torch-blocked", 6.0), ("numpy-eager", 1.0))]
    rows.append(_timing("bigbird", "triton", np.nan, status="absent: no GPU"))
    return pd.DataFrame(rows)


def _fig2():
    return pd.DataFrame([_timing(w, s, base + per * d, depth=d) for w in ("stacked_rnn", "stacked_lstm")
                         for s, base, per in (("c-auto", 1.0, 0.25), ("torch-cell-loop", 0.0, 2.0))
                         for d in (1, 4, 8)])


def _fig8():
    rows = []
    for model, scale in (("middle", 1.0), ("large", 30.0)):
        for s in ("c-auto", "torch-nn-lstm"):
            rows += [_timing("stacked_lstm", s, scale * d, model=model, panel="depth", depth=d, seq_len=8)
                     for d in (1, 2, 4)]
            rows += [_timing("stacked_lstm", s, scale * n / 4, model=model, panel="seq_len", depth=2, seq_len=n)
                     for n in (8, 16, 32)]
    return pd.DataFrame(rows)


def _table7():
    return pd.DataFrame([dict(workload=w, plan=p, GB=gb) for w, d, m in (
        ("b2b_gemm", 0.0169, 0.0169), ("flash_attention", 6.47, 6.47), ("bigbird", 1.01, 2.15))
        for p, gb in (("deferred", d), ("materialised", m))])


def _write(out_dir, preset="quick", **frames):
    for artefact, df in frames.items():
        df.to_csv(os.path.join(out_dir, tagged(f"{artefact}.csv", preset)), index=False)


def _colours(fig) -> dict:
    """system -> RGBA of its bars or line, from every panel of fig."""
    out = {}
    for ax in fig.axes:
        for c in ax.containers:
            if isinstance(c, BarContainer):
                out.setdefault(c.get_label(), to_rgba(c.patches[0].get_facecolor()))
            elif isinstance(c, ErrorbarContainer) and c.lines[0] is not None:  # not a bar's error bar
                out.setdefault(c.get_label(), to_rgba(c.lines[0].get_color()))
    return out


@pytest.fixture
def close_figures():
    yield
    plt.close("all")


def test_fig7_one_legend_entry_and_colour_per_system(close_figures):
    df = _fig7()
    fig = plot.draw_fig7(df)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    measured = set(df.loc[df["status"] == "ok", "system"])
    assert len(labels) == len(measured) and set(labels) == measured  # the absent triton: in the note only
    colours = _colours(fig)
    assert set(colours) == measured
    assert len(set(colours.values())) == len(measured)
    assert colours["torch-cell-loop"] != colours["torch-sdpa"] != colours["torch-blocked"] != colours["torch-cell-loop"]


def test_same_system_same_colour_in_every_figure(close_figures):
    c7, c2, c8 = (_colours(draw(df)) for draw, df in ((plot.draw_fig7, _fig7()), (plot.draw_fig2, _fig2()),
                                                      (plot.draw_fig8, _fig8())))
    assert c2["c-auto"] == c7["c-auto"] == c8["c-auto"]
    assert c2["torch-cell-loop"] == c7["torch-cell-loop"]
    assert c8["torch-nn-lstm"] not in (c8["c-auto"], c7["torch-cell-loop"])


def test_unknown_systems_get_distinct_stable_styles():
    assert plot._style("my-new-baseline") == plot._style("my-new-baseline")
    assert plot._style("my-new-baseline")[:2] != plot._style("another-one")[:2]


def test_fig8_rows_share_y_and_both_sweeps_have_one_x_scale(close_figures):
    fig = plot.draw_fig8(_fig8())
    rows = {}
    for ax in fig.axes:
        rows.setdefault(ax.get_subplotspec().rowspan.start, []).append(ax)
    assert len(rows) == 2  # stacked LSTM middle, stacked LSTM large
    for depth_ax, length_ax in rows.values():
        assert "depth" in depth_ax.get_xlabel() and "sequence length" in length_ax.get_xlabel()
        assert depth_ax.get_xscale() == length_ax.get_xscale() == "log"
        assert depth_ax.get_shared_y_axes().joined(depth_ax, length_ax)
        assert depth_ax.get_ylim() == length_ax.get_ylim()
    middle, large = rows[0][0], rows[1][0]
    assert "middle" in middle.get_title() and "large" in large.get_title()
    assert not middle.get_shared_y_axes().joined(middle, large)  # 30x apart: each row its own y


def test_table7_log_axis_and_every_bar_labelled(close_figures):
    df = _table7()
    fig = plot.draw_table7(df)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    texts = Counter(t.get_text() for t in ax.texts)
    for gb, n in Counter(f"{v:.3g}" for v in df["GB"]).items():
        assert texts[gb] == n, gb  # "0.0169" twice: both b2b bars
    bars = [p for c in ax.containers for p in c.patches]
    assert len(bars) == len(df)
    lowest = min(bars, key=lambda p: p.get_height())
    _, top = ax.transAxes.inverted().transform(ax.transData.transform((0, lowest.get_height())))
    assert top > 0.1  # the b2b bar rises visibly above the axis


def test_run_reads_and_writes_tagged_names(tmp_path, capsys):
    _write(tmp_path, fig2=_fig2(), fig7=_fig7(), fig8=_fig8(), table7=_table7())
    written = plot.run(str(tmp_path), "quick")
    expected = {"fig2.png", "fig7.png", "fig7_speedup.csv", "fig8.png", "table7.png", "depth_scaling.csv"}
    assert sorted(written) == sorted(str(tmp_path / tagged(n, "quick")) for n in expected)
    assert all(os.path.getsize(p) > 0 for p in written)
    assert capsys.readouterr().out == ""  # the tables are summary()'s
    sp = pd.read_csv(tmp_path / "fig7_speedup_quick.csv").set_index("workload")
    assert sp.loc["bigbird", "best_baseline"] == "torch-blocked"  # eager numpy is not a baseline
    assert sp.loc["bigbird", "speedup"] == pytest.approx(3.0)
    ds = pd.read_csv(tmp_path / "depth_scaling_quick.csv")
    fig2 = ds[(ds["artefact"] == "fig2") & (ds["workload"] == "stacked_rnn")].set_index("system")["ratio"]
    assert fig2["c-auto"] == pytest.approx(3.0 / 1.25) and fig2["torch-cell-loop"] == pytest.approx(8.0)
    assert set(ds[ds["artefact"] == "fig8"]["model"]) == {"middle", "large"}


def test_run_draws_only_the_named_artefacts(tmp_path):
    _write(tmp_path, fig2=_fig2(), fig7=_fig7())
    assert plot.run(str(tmp_path), "quick", ["fig7"]) == [str(tmp_path / "fig7_quick.png"),
                                                           str(tmp_path / "fig7_speedup_quick.csv")]
    assert not (tmp_path / "fig2_quick.png").exists() and not (tmp_path / "depth_scaling_quick.csv").exists()
    # depth scaling is made from fig2 and fig8: naming fig8 redraws it from the fig2 CSV there is
    assert plot.run(str(tmp_path), "quick", ["fig8"]) == [str(tmp_path / "depth_scaling_quick.csv")]
    assert not (tmp_path / "fig2_quick.png").exists()


def test_artefact_without_plot_draws_nothing(tmp_path):
    _write(tmp_path, fig2=_fig2(), fig7=_fig7(), table7=_table7())
    before = sorted(os.listdir(tmp_path))
    assert plot.run(str(tmp_path), "quick", ["table5"]) == []
    assert plot.summary(str(tmp_path), "quick", ["table5"]) == ""
    assert sorted(os.listdir(tmp_path)) == before
    with pytest.raises(ValueError, match="fig99"):
        plot.run(str(tmp_path), "quick", ["fig99"])


def test_paper_run_never_reads_quick_csvs(tmp_path):
    _write(tmp_path, fig7=_fig7(), fig2=_fig2())
    assert plot.run(str(tmp_path), "paper") == []
    paper = _fig7()
    paper = paper[paper["workload"] == "flash_attention"]
    _write(tmp_path, "paper", fig7=paper)
    assert plot.run(str(tmp_path), "paper") == [str(tmp_path / "fig7_paper.png"),
                                                 str(tmp_path / "fig7_speedup_paper.csv")]
    assert list(pd.read_csv(tmp_path / "fig7_speedup_paper.csv")["workload"]) == ["flash_attention"]
    assert not (tmp_path / "fig7_quick.png").exists()


def test_plot_sources_name_the_registry_files():
    assert set(plot.PLOT_SOURCES) == set(registry.PLOTS)  # the index describes every file drawn
    assert all(set(src) <= set(registry.ARTEFACTS) for src in plot.PLOT_SOURCES.values())
    assert plot.PLOT_SOURCES["depth_scaling.csv"] == ("fig2", "fig8")
    assert plot.PLOT_SOURCES["fig7.png"] == plot.PLOT_SOURCES["fig7_speedup.csv"] == ("fig7",)


def test_summary_has_the_derived_tables(tmp_path):
    _write(tmp_path, fig2=_fig2(), fig7=_fig7())
    text = plot.summary(str(tmp_path), "quick")
    assert "speedup" in text and "torch-blocked" in text and "depth scaling" in text
    only7 = plot.summary(str(tmp_path), "quick", ["fig7"])
    assert "torch-blocked" in only7 and "depth scaling" not in only7
    assert plot.summary(str(tmp_path), "paper") == ""


def test_command_line(tmp_path, capsys):
    _write(tmp_path, fig2=_fig2(), fig7=_fig7())
    assert plot.main(["--out", str(tmp_path), "fig7"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "fig7_quick.png") in out and "fig2_quick.png" not in out
    assert (tmp_path / "README.md").exists()
    assert plot.main(["--out", str(tmp_path), "--paper"]) == 0
    assert "nothing to draw" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        plot.main(["--out", str(tmp_path), "fig99"])
