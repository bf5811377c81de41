"""experiments/plot.py from small hand-made CSVs: what each figure shows (one legend entry and
colour per system, fig7's speedups on top of polyft's bars, fig8's axes and readable ticks,
table7's small bars and short title, memory's ratios clear of its reference lines) and which
files run() reads and writes (preset-tagged names, only the named artefacts' plots)."""
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


def _fig8(workload="stacked_lstm", depths=(1, 2, 4)):
    rows = []
    for model, scale in (("middle", 1.0), ("large", 30.0)):
        for s in ("c-auto", "torch-nn-lstm"):
            rows += [_timing(workload, s, scale * d, model=model, panel="depth", depth=d, seq_len=8) for d in depths]
            rows += [_timing(workload, s, scale * n / 4, model=model, panel="seq_len", depth=2, seq_len=n)
                     for n in (8, 16, 32)]
    return pd.DataFrame(rows)


def _table7():
    return pd.DataFrame([dict(workload=w, plan=p, GB=gb) for w, d, m in (
        ("b2b_gemm", 0.0169, 0.0169), ("flash_attention", 6.47, 6.47), ("bigbird", 1.01, 2.15))
        for p, gb in (("deferred", d), ("materialised", m))])


def _memory():
    """Two workloads at two shapes, ratios on and between the reference lines (1x, 1.1x, 1.5x)."""
    return pd.DataFrame([dict(workload=w, preset=p, ratio_full=full, ratio_allocated=alloc, io_bytes=io, threads=2,
                              device="cpu", commit="abc")
                         for w, p, full, alloc, io in (("stacked_rnn", "paper", 1.0, 1.03, 1.14e9),
                                                       ("flash_attention", "paper", 22.83, 1.01, 3.22e9),
                                                       ("stacked_rnn", "small", 1.0, 1.0, 2050),
                                                       ("flash_attention", "small", 1.5, 1.1, 5120))])


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
    marks = ["on polyft's bar: speedup over the fastest baseline", "on a bar: the fastest baseline"]
    assert labels[-2:] == marks  # the marks on the bars explained, after the systems
    assert len(labels[:-2]) == len(measured) and set(labels[:-2]) == measured  # the absent triton: in the note only
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


def _bar_tops(ax) -> dict:
    """system -> [(x centre, top of its whisker in data units)] of its bars, left to right."""
    out = {}
    for c in ax.containers:
        if isinstance(c, BarContainer):
            for seg in c.errorbar.lines[2][0].get_segments():
                out.setdefault(c.get_label(), []).append((seg[0][0], max(seg[0][1], seg[1][1])))
    return out


def test_fig7_speedups_sit_on_polyfts_bars(close_figures):
    """Each speedup just above polyft's (c-auto's) bar, within its width; a star on the fastest
    baseline's bar; units on the axes; all labels one colour."""
    fig = plot.draw_fig7(_fig7())
    ax = fig.axes[0]
    fig.canvas.draw()
    labels = [t for t in ax.texts if t.get_gid() == "speedup"]
    stars = [t for t in ax.texts if t.get_gid() == "fastest baseline"]
    assert [t.get_text() for t in labels] == ["4.00x", "1.50x", "3.00x"]  # stacked RNN, flash attention, BigBird
    tops = _bar_tops(ax)
    for texts, system_tops in ((labels, tops["c-auto"]),
                               (stars, tops["torch-cell-loop"] + tops["torch-sdpa"] + tops["torch-blocked"])):
        for t in texts:
            x, y = ax.transData.transform(min(system_tops, key=lambda xy: abs(xy[0] - t.xy[0])))
            box = t.get_window_extent()
            assert 0 <= box.y0 - y <= 4 and box.x0 <= x <= box.x1  # points above the whisker's end
        assert len(texts) == 3
    bar_width = ax.transData.transform((0.84 / 4, 0))[0] - ax.transData.transform((0, 0))[0]
    assert all(t.get_window_extent().width < bar_width for t in labels)  # vertical: within the bar
    assert len({t.get_color() for t in labels}) == 1
    assert "ms" in ax.get_ylabel() and ax.get_xlabel()


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
    for depth_ax, length_ax in rows.values():  # the workload and the axis in every title
        assert depth_ax.get_title().startswith("stacked LSTM") and "time vs stack depth" in depth_ax.get_title()
        assert "time vs sequence length" in length_ax.get_title()


def test_fig8_ticks_readable(close_figures):
    fig = plot.draw_fig8(_fig8())
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
        assert ticks and min(t.get_fontsize() for t in ticks) >= 9
        assert ax.xaxis.label.get_fontsize() >= 9


def test_fig8_dilated_rnn_depth_ticked_at_its_layers_and_dilations(close_figures):
    """The dilated RNN adds one layer a point (1, 2, 3, 4): a linear axis whose ticks give the
    layers and the top layer's dilation (1, 2, 4, 8); its length sweep stays log2."""
    fig = plot.draw_fig8(_fig8("dilated_rnn", depths=(1, 2, 3, 4)))
    depth_ax, length_ax = fig.axes[:2]
    assert depth_ax.get_xscale() == "linear" and length_ax.get_xscale() == "log"
    assert list(depth_ax.get_xticks()) == [1, 2, 3, 4]
    assert [t.get_text() for t in depth_ax.get_xticklabels()] == ["1\n(\u00d71)", "2\n(\u00d72)", "3\n(\u00d74)",
                                                                  "4\n(\u00d78)"]
    assert "dilation" in depth_ax.get_xlabel()
    assert [t.get_text() for t in length_ax.get_xticklabels()] == ["8", "16", "32"]


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


def test_table7_short_title_ratios_under_names_paper_in_footnote(close_figures):
    fig = plot.draw_table7(_table7())
    ax = fig.axes[0]
    assert "\n" not in ax.get_title() and "Triton" not in ax.get_title()
    names = [t.get_text() for t in ax.get_xticklabels()]
    assert names == ["b2b GEMMs\n1.00x", "flash attention *\n1.00x", "BigBird *\n2.13x"]
    footnote = " ".join(t.get_text() for t in fig.texts)
    assert "Triton 2.28x" in footnote and "FlashAttention-2 1.04x" in footnote


def test_memory_ratios_clear_of_the_reference_lines(close_figures):
    fig = plot.draw_memory(_memory())
    fig.canvas.draw()
    paper, small = fig.axes
    assert [t.get_text().splitlines()[-1] for t in paper.get_xticklabels()] == ["1.00x \u2192 1.03x",
                                                                                "22.83x \u2192 1.01x"]
    legend = [t.get_text() for t in small.get_legend().get_texts()]
    assert legend[:3] == ["1x: inputs + outputs only", "1.1x", "1.5x"]
    for ax in (paper, small):
        lines = [ax.transData.transform((0, level))[1] for level in (1.0, 1.1, 1.5)]
        for t in ax.texts + ax.get_xticklabels():
            box = t.get_window_extent()
            assert not any(box.y0 <= y <= box.y1 for y in lines), t.get_text()


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
