"""Plots and derived tables, drawn only from one preset's CSVs in results/ (never from memory).
Every file read and written carries the preset in its name (registry.tagged: fig7_quick.csv ->
fig7_quick.png), so a --paper run never reads a quick CSV nor overwrites a quick plot:

* fig2.png    Figure 2: time against depth, stacked RNN and stacked LSTM, one line per system
* fig7.png    Figure 7: time per workload and system (bars, log scale), polyft's speedup over
              the best baseline written on polyft's bar, a star on that baseline's; the
              speedups: fig7_speedup.csv
* fig8.png    Figure 8: stacked LSTM, dilated RNN, grid RNN against depth and sequence length,
              "middle" and "large" models
* table7.png  Table 7 (model): GB moved with deferred vs materialised views per workload (log),
              the paper's measured ratios in a footnote
* memory.png  memory before vs after storage contraction per workload, relative to inputs +
              outputs (log), paper shape and small shape
* depth_scaling.csv  time(deepest) / time(depth 1) per system, from fig2 and fig8's depth
              panels, and time(depth 20) / time(depth 1) where depth 20 was measured (the
              paper: with the parallelism exposed, time must not grow linearly with depth;
              the paper's baselines at depth 20: cuDNN 12.99, TVM 16.65, PyTorch JIT 20.94,
              TF AutoGraph 21.20)

PLOT_SOURCES says which artefacts' CSVs each file is drawn from; run(..., artefacts) redraws only
the files of the named artefacts, and an output none of whose CSVs exists is skipped. Only rows
with status "ok" are drawn; the other systems (absent here) are named in a note under each figure.

    python -m polyft.experiments.plot [--quick | --paper] [--out results] [ARTEFACT ...]
"""
from __future__ import annotations

import argparse
import os
import zlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402
import pandas as pd  # noqa: E402

from .common import preset as preset_of, preset_args  # noqa: E402
from .registry import ARTEFACTS, tagged, write_index  # noqa: E402
from .paper import PAPER_DRAM  # noqa: E402

# one colour and marker per system, the same in every figure and legend order (polyft's own systems
# in red/blue; a torch baseline's -cuda variant: a darker shade, dashed, same marker)
STYLE = {
    "c-auto": ("tab:red", "o", "-"), "c-original": ("tab:blue", "s", "--"), "c-auto-1thread": ("salmon", "o", ":"),
    "c-tiled-wavefront": ("firebrick", "d", "-."), "c-wavefront": ("coral", "h", "--"),
    "polyft-cuda-auto": ("darkred", "o", "-"), "polyft-cuda-original": ("navy", "s", "--"),
    "numpy-eager": ("tab:gray", "x", ":"),
    "torch-cell-loop": ("tab:orange", "^", "-"), "torch-nn-lstm": ("tab:green", "D", "-"),
    "torch-matmul": ("goldenrod", "v", "-"), "torch-sdpa": ("tab:cyan", "<", "-"),
    "torch-blocked": ("tab:pink", ">", "-"), "jax-jit": ("darkmagenta", "X", "-"),
    "torch-cell-loop-cuda": ("tab:brown", "^", "--"), "torch-nn-lstm-cuda": ("darkgreen", "D", "--"),
    "torch-matmul-cuda": ("darkgoldenrod", "v", "--"), "torch-sdpa-cuda": ("teal", "<", "--"),
    "torch-blocked-cuda": ("mediumvioletred", ">", "--"), "torch-compile-cuda": ("tab:purple", "P", "-"),
    "triton": ("tab:olive", "*", "-"),
}
# for systems STYLE does not know: picked by a checksum of the name, so stable across figures and runs
_SPARE = [(c, m) for m in "oshpX*" for c in ("black", "indigo", "lime", "maroon", "deepskyblue", "sienna")]
OURS = ("polyft-cuda-auto", "c-auto")  # the system reported as polyft, first one present
NOT_BASELINES = ("numpy-eager", "c-", "polyft-")  # eager numpy is the reference, not a baseline
TITLES = {"stacked_rnn": "stacked RNN", "stacked_lstm": "stacked LSTM", "dilated_rnn": "dilated RNN",
          "grid_rnn": "grid RNN", "b2b_gemm": "b2b GEMMs", "flash_attention": "flash attention",
          "bigbird": "BigBird"}


def _style(system):
    """(colour, marker, line style) of a system: STYLE's, else one of _SPARE by crc32 (not hash(),
    which changes from run to run)."""
    if system in STYLE:
        return STYLE[system]
    color, marker = _SPARE[zlib.crc32(system.encode()) % len(_SPARE)]
    return color, marker, "-."


def _read(out_dir, name):
    path = os.path.join(out_dir, name)
    # the commit as text: a short hash like 41865e8 would read as the number 4.1865e12
    return pd.read_csv(path, dtype={"commit": str}) if os.path.exists(path) else None


def _ok(df):
    return df[df["status"] == "ok"]


def _where(df) -> str:
    """'CPU: <device>, N threads, preset P, commit C' from the measured rows."""
    ok = _ok(df)
    devices = ", ".join(sorted(set(ok["device"])))
    threads = ", ".join(str(t) for t in sorted(set(ok["threads"]))) if "threads" in ok else "?"
    return (f"{devices}; threads per system: {threads}; preset {', '.join(sorted(set(df['preset'])))}; "
            f"commit {', '.join(sorted(set(df['commit'].astype(str))))}; median of {int(ok['repeats'].max())}, "
            f"bars min-max")


def _absent_note(df) -> str:
    gone = df[df["status"] != "ok"].drop_duplicates("system")
    if gone.empty:
        return ""
    parts = [f"{r.system} ({r.status.split(':', 1)[-1].strip()})" for r in gone.itertuples()]
    return "not measured: " + "; ".join(parts)


def _footer(fig, df):
    note = _absent_note(df)
    text = _where(df) + ("\n" + _wrap(note, 170) if note else "")
    fig.text(0.01, 0.005, text, fontsize=6.5, va="bottom", ha="left", color="dimgray")


def _wrap(text, width):
    words, lines, line = text.split(" "), [], ""
    for w in words:
        if len(line) + len(w) + 1 > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join(lines + [line])


def _log_y(ax):
    """Log time axis labelled with plain numbers (1, 10, 100), no minor labels."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _lines(ax, df, x, log2=False):
    """One line per system: median time (ms) against column x (log2 axis if log2), min-max as
    error bars."""
    for system, g in _ok(df).groupby("system", sort=False):
        g = g.sort_values(x)
        color, marker, ls = _style(system)
        med = g["seconds"] * 1e3
        err = [med - g["seconds_min"] * 1e3, g["seconds_max"] * 1e3 - med]
        ax.errorbar(g[x], med, yerr=err, label=system, color=color, marker=marker, ls=ls, ms=4, lw=1.3,
                    capsize=2, elinewidth=0.7)
    ok = _ok(df)
    ours = next((s for s in OURS if (ok["system"] == s).any()), None)
    if x == "depth" and ours:  # what linear growth in depth would look like, from polyft's first point
        g = ok[ok["system"] == ours].sort_values(x)
        d0, t0 = g[x].iloc[0], g["seconds"].iloc[0] * 1e3
        ax.plot(g[x], t0 * g[x] / d0, color="black", ls=(0, (1, 3)), lw=1, label=f"linear in depth (from {ours})")
    _log_y(ax)
    ax.grid(True, which="both", alpha=0.3)
    if log2:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(sorted(set(df[x])))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _legend(fig, axes, y=0.955, ncol=6):
    """One legend for the figure, one entry per system drawn in any panel, in STYLE's order so
    that every figure lists the systems alike (others, e.g. the linear reference, last)."""
    handles = {}
    for ax in np.ravel(axes):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    order = list(STYLE)
    labels = sorted(handles, key=lambda lab: order.index(lab) if lab in order else len(order))
    return fig.legend([handles[lab] for lab in labels], labels, loc="upper center", ncol=min(len(labels), ncol),
                      fontsize=8, frameon=False, bbox_to_anchor=(0.5, y))


def _common_shape(g, drop) -> str:
    """The sizes shared by every row of g, without the swept ones."""
    shapes = [dict(kv.split("=") for kv in s.split()) for s in g["shape"]]
    keys = [k for k in shapes[0] if k not in drop and all(s.get(k) == shapes[0][k] for s in shapes)]
    return " ".join(f"{k}={shapes[0][k]}" for k in keys)


def draw_fig2(df) -> Figure:
    """Figure 2; depth on a linear axis: the sweep steps by 4 layers (1, 4, 8, ..., 32), which
    a log2 axis would crowd at the deep end."""
    workloads = list(dict.fromkeys(df["workload"]))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.2 * len(workloads), 4.4), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        g = df[df["workload"] == w]
        _lines(ax, g, "depth")
        ax.set_title(f"{TITLES.get(w, w)} ({_common_shape(g, ['D'])})", fontsize=10)
        ax.set_xlabel("stack depth (layers)")
        ax.set_ylabel("time (ms, log)")
    fig.suptitle("Figure 2: time against stack depth (median, min-max bars)", fontsize=11, y=0.995)
    _legend(fig, axes, y=0.94)
    _footer(fig, df)
    fig.tight_layout(rect=(0, 0.08, 1, 0.9))
    return fig


def draw_fig8(df) -> Figure:
    """Figure 8, one row per workload and model size: time against depth beside time against
    sequence length, the two sharing the row's y axis (one model's times, so the sweeps compare
    by height). Both x axes are log2 where the sweep doubles (depth 1-2-4-8, length 8-16-32,
    grid side 4-8-16): their points sit evenly, and with the log time axis a growth like n^k is
    a line of slope k in either panel (the linear-in-depth reference: slope 1). The dilated
    RNN's depth adds one layer a point (its top layer's dilation doubles): a linear axis, each
    tick naming the dilation too."""
    rows = [(w, m) for w in dict.fromkeys(df["workload"]) for m in dict.fromkeys(df["model"])]
    height = 3.0 * len(rows) + 1.3
    fig, axes = plt.subplots(len(rows), 2, figsize=(10, height), sharey="row", squeeze=False)
    for (w, model), row in zip(rows, axes):
        for ax, panel in zip(row, ("depth", "seq_len")):
            g = df[(df["workload"] == w) & (df["model"] == model) & (df["panel"] == panel)]
            if g.empty:
                ax.set_visible(False)
                continue
            dilated = w == "dilated_rnn" and panel == "depth"
            _lines(ax, g, panel, log2=not dilated)
            swept, axis = (["D"], "stack depth") if panel == "depth" else \
                (["L", "L1", "L2"], "grid side" if w == "grid_rnn" else "sequence length")
            ax.set_title(f"{TITLES.get(w, w)}, {model} model: time vs {axis}\n{_common_shape(g, swept)}", fontsize=9.5)
            if dilated:
                ax.set_xticklabels([f"{d:g}\n(\u00d7{2 ** (d - 1):g})" for d in ax.get_xticks()])
                ax.set_xlabel("stack depth (layers; \u00d7: the top layer's dilation)", fontsize=9)
            else:
                ax.set_xlabel(f"{axis} ({'layers' if panel == 'depth' else 'steps'}, log2 scale)" if w != "grid_rnn"
                              or panel == "depth" else "grid side L1 = L2 (cells, log2 scale)", fontsize=9)
            ax.tick_params(labelsize=9)
        row[0].set_ylabel("time per run (ms, log)", fontsize=9)
        lo, hi = row[0].get_ylim()
        if hi / lo > 10 ** 2.5:  # 1-2-5 labels would touch: decades only (the row shares its locator)
            row[0].yaxis.set_major_locator(LogLocator(base=10, subs=(1.0,)))
    fig.suptitle("Figure 8: scaling with depth and sequence length (\"middle\" and \"large\" models; median, "
                 "whiskers min-max)", fontsize=11, y=1 - 0.1 / height)
    _legend(fig, axes, y=1 - 0.4 / height, ncol=5)
    _footer(fig, df)
    fig.tight_layout(rect=(0, 0.5 / height, 1, 1 - 0.6 / height))
    return fig


def speedups(df) -> pd.DataFrame:
    """Per workload: polyft's system (OURS) against the fastest baseline (not eager numpy)."""
    rows = []
    for w, g in _ok(df).groupby("workload", sort=False):
        ours = next((g[g["system"] == s].iloc[0] for s in OURS if (g["system"] == s).any()), None)
        base = g[~g["system"].str.startswith(NOT_BASELINES)].sort_values("seconds")
        if ours is None or base.empty:
            continue
        best = base.iloc[0]
        rows.append(dict(workload=w, shape=ours["shape"], polyft=ours["system"], polyft_seconds=ours["seconds"],
                         best_baseline=best["system"], baseline_seconds=best["seconds"],
                         speedup=best["seconds"] / ours["seconds"], device=ours["device"]))
    return pd.DataFrame(rows)


def draw_fig7(df) -> Figure:
    """Figure 7: bars per workload and system, one legend entry and colour per system; polyft's
    speedup over the fastest baseline written on top of polyft's bar (its whisker's end: the
    highest thing drawn for it), vertically so that it stays within the bar's width, and a star
    on top of that baseline's bar."""
    ok = _ok(df)
    workloads = list(dict.fromkeys(df["workload"]))
    order = list(dict.fromkeys(ok["system"]))
    most = max((ok["workload"] == w).sum() for w in workloads)
    width = 0.84 / max(most, 1)
    fig, ax = plt.subplots(figsize=(12, 6))
    top = {}  # (workload, system) -> (x, the top of its whisker in ms)
    for i, w in enumerate(workloads):  # the systems measured for w, side by side around x = i
        g = ok[ok["workload"] == w].set_index("system").loc[[s for s in order if s in set(ok[ok["workload"] == w]["system"])]]
        for k, (system, r) in enumerate(g.iterrows()):
            color, _, _ = _style(system)
            med, x = r["seconds"] * 1e3, i + (k - (len(g) - 1) / 2) * width
            ax.bar(x, med, width * 0.92, color=color, label=system,
                   yerr=[[med - r["seconds_min"] * 1e3], [r["seconds_max"] * 1e3 - med]], capsize=1.5,
                   error_kw=dict(elinewidth=0.6, ecolor="black"), hatch="//" if system.endswith("original") else None,
                   edgecolor="white", lw=0.3)
            top[w, system] = x, r["seconds_max"] * 1e3
    sp = speedups(df)
    for r in sp.itertuples():
        ax.annotate(f"{r.speedup:.2f}x", top[r.workload, r.polyft], xytext=(0, 2), textcoords="offset points",
                    rotation=90, ha="center", va="bottom", fontsize=9, gid="speedup")
        ax.annotate("\u2605", top[r.workload, r.best_baseline], xytext=(0, 1), textcoords="offset points",
                    ha="center", va="bottom", fontsize=9, gid="fastest baseline")
    if len(sp):  # legend entries for the two marks (artists that draw nothing)
        ax.plot([], [], ls="", marker="$1.5x$", ms=16, color="black",
                label="on polyft's bar: speedup over the fastest baseline")
        ax.plot([], [], ls="", marker="*", ms=8, color="black", label="on a bar: the fastest baseline")
    _log_y(ax)
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels([f"{TITLES.get(w, w)}\n{_wrap(ok[ok['workload'] == w]['shape'].iloc[0], 17)}"
                        for w in workloads], fontsize=9)
    ax.tick_params(axis="y", labelsize=9)
    ax.set_xlabel("workload and its sizes", fontsize=9)
    ax.set_ylabel("time per run (ms, log scale)")
    ax.set_ylim(top=ok["seconds_max"].max() * 1e3 * 6)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ours = ", ".join(dict.fromkeys(sp["polyft"])) if len(sp) else "none measured"
    fig.suptitle(f"Figure 7: end-to-end time per workload and system (median, whiskers min-max); polyft: {ours}\n"
                 "speedup = fastest baseline's time / polyft's (eager numpy is the reference, not a baseline; "
                 "<1x: the baseline is faster)", fontsize=10, y=0.995)
    rows = -(-len(_legend(fig, [ax], y=0.93, ncol=5).get_texts()) // 5)
    _footer(fig, df)
    fig.subplots_adjust(left=0.06, right=0.99, top=0.915 - 0.037 * rows, bottom=0.25)
    return fig


def draw_table7(df) -> Figure:
    """Table 7's model as bars on a log axis with the GB written on every bar: the workloads span
    three orders of magnitude (b2b GEMMs' 0.017 GB beside flash attention's 6.5 GB), so at linear
    scale the small ones would not show. The ratio materialised / deferred is under each
    workload's name; the paper's measured numbers are in the footnote."""
    piv = df.pivot_table(index="workload", columns="plan", values="GB", sort=False)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    x = np.arange(len(piv))
    for k, (plan, color) in enumerate((("deferred", "tab:red"), ("materialised", "tab:gray"))):
        bars = ax.bar(x + (k - 0.5) * 0.38, piv[plan], 0.36, label=f"{plan} views", color=color)
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in piv[plan]], fontsize=8, padding=1)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{TITLES.get(w, w)}{' *' if w in PAPER_DRAM else ''}\n"
                        f"{r['materialised'] / r['deferred']:.2f}x" for w, r in piv.iterrows()], fontsize=9)
    _log_y(ax)
    ax.tick_params(axis="y", labelsize=9)
    ax.set_ylabel("GB moved (model, log scale)")
    ax.set_xlabel("workload; under it: GB materialised / GB deferred", fontsize=9)
    ax.set_ylim(piv.values.min() * 0.3, piv.values.max() * 4)
    ax.legend(fontsize=9, loc="upper left")
    ax.set_title("Table 7 (model): GB moved with deferred vs materialised views", fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    paper = "; ".join(f"{TITLES[w]}: " + ", ".join(f"{k} {v / d['FractalTensor']:.2f}x" for k, v in d.items()
                                                   if k != "FractalTensor") for w, d in PAPER_DRAM.items())
    fig.text(0.01, 0.01, "Paper shapes, ideal cache, float32. * in the paper's Table 7: A100 DRAM bytes measured, "
             "relative to FractalTensor:\n" + paper, fontsize=8, va="bottom", ha="left", color="dimgray")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def _bytes(n) -> str:
    """1234567 -> '1.23 MB'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def draw_memory(df) -> Figure:
    """Per workload, total bytes (inputs + outputs + intermediates) with one element per
    instance and as contracted, relative to inputs + outputs (log), one panel per shape; the
    two ratios under each workload's name, clear of the reference lines at 1x, 1.1x and 1.5x."""
    shapes = [p for p in ("paper", "small") if (df["preset"] == p).any()]
    shapes += [p for p in dict.fromkeys(df["preset"]) if p not in shapes]
    fig, axes = plt.subplots(1, len(shapes), figsize=(8 * len(shapes), 4.9), squeeze=False)
    top = max(df["ratio_full"].max(), df["ratio_allocated"].max())
    for ax, shape in zip(axes[0], shapes):
        g = df[df["preset"] == shape].reset_index(drop=True)
        x = np.arange(len(g))
        ax.bar(x - 0.2, g["ratio_full"], 0.38, color="tab:gray", label="one element per instance (before)")
        ax.bar(x + 0.2, g["ratio_allocated"], 0.38, color="tab:red", label="contracted, local buffers in each thread's scratch (after)")
        for level, ls, what in ((1.0, "-", "1x: inputs + outputs only"), (1.1, ":", "1.1x"), (1.5, "--", "1.5x")):
            ax.axhline(level, color="black", ls=ls, lw=0.7, alpha=0.6, label=what)
        ax.set_yscale("log")
        ax.set_ylim(0.8, top * 3)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(x)
        ax.set_xticklabels([f"{TITLES.get(r.workload, r.workload)}\nio {_bytes(r.io_bytes)}\n"
                            f"{r.ratio_full:.2f}x \u2192 {r.ratio_allocated:.2f}x" for r in g.itertuples()], fontsize=8)
        ax.tick_params(axis="y", labelsize=9)
        ax.set_ylabel("total bytes / (inputs + outputs), log")
        ax.set_title(f"{shape} shape", fontsize=10)
        ax.grid(True, axis="y", which="major", alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper right")
    threads = ", ".join(str(t) for t in sorted(set(df["threads"]))) if "threads" in df else "?"
    fig.suptitle("Memory before and after storage contraction (auto schedule): total allocated bytes relative "
                 f"to inputs + outputs\n(C target, {threads} threads' scratch); under each workload: its inputs + "
                 "outputs (io) and the ratios before \u2192 after", fontsize=10)
    fig.text(0.01, 0.005, f"{', '.join(sorted(set(df['device'].astype(str))))}; commit "
             f"{', '.join(sorted(set(df['commit'].astype(str))))}; static analysis (prog.memory), nothing executed",
             fontsize=6.5, va="bottom", ha="left", color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 0.93))
    return fig


def exponent(df: pd.DataFrame, family: str, first: int = 2) -> float | None:
    """compile_time: the fitted growth exponent of a family's total seconds against its size
    (log-log least squares) from its `first`-th size on (the small sizes are fixed costs: a
    chain's first two, 8 and 16 layers, keep every GEMM inline, so the fit runs from 32 to 256
    layers as the issue's target does); None with fewer than 2 points."""
    tot = df[(df["family"] == family) & (df["stage"] == "total")].sort_values("size").iloc[first:]
    if len(tot) < 2:
        return None
    return float(np.polyfit(np.log(tot["size"]), np.log(tot["seconds"]), 1)[0])


def draw_compile_time(df) -> Figure:
    """compile_time: seconds per stage of ft.compile (and their total) against each family's
    size on log-log axes, so growth like n^k is a line of slope k; the total's fitted exponent
    (from the third size on) in each panel's title, and n^1 through the total at that size.
    Panels three a row; the captured weight's and the input weight's share their y axis."""
    families = list(dict.fromkeys(df["family"]))
    stages = [s for s in dict.fromkeys(df["stage"]) if s != "total"]
    rows = -(-len(families) // 3)
    fig, axes = plt.subplots(rows, min(3, len(families)), figsize=(5.2 * min(3, len(families)), 4.2 * rows + 0.8),
                             squeeze=False)
    colours = plt.get_cmap("tab10")
    for ax, family in zip(axes.flat, families):
        g = df[df["family"] == family]
        for k, stage in enumerate(stages + ["total"]):
            s = g[(g["stage"] == stage) & (g["seconds"] > 0)].sort_values("size")
            ax.plot(s["size"], s["seconds"], marker="o", ms=3, lw=2.2 if stage == "total" else 1.1,
                    color="black" if stage == "total" else colours(k), label=stage)
        tot = g[g["stage"] == "total"].sort_values("size")
        start = tot.iloc[min(2, len(tot) - 1):]
        ax.plot(start["size"], start["seconds"].iloc[0] * start["size"] / start["size"].iloc[0], color="gray",
                ls=(0, (1, 3)), lw=1, label="n^1 from the fit's first total")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(sorted(set(g["size"])))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        _log_y(ax)
        ax.grid(True, which="both", alpha=0.3)
        e = exponent(df, family)
        ax.set_title(f"{family}: " + (f"total {tot['seconds'].iloc[-1]:.2f} s at {tot['size'].iloc[-1]:g}" if e is None
                                      else f"total ~ size^{e:.2f} (from {start['size'].iloc[0]:g})"), fontsize=10)
        ax.set_xlabel(f"{g['size_is'].iloc[0]} (log2)")
        ax.set_ylabel("CPU seconds (log)")
    for ax in axes.flat[len(families):]:
        ax.set_visible(False)
    weights = [ax for ax, family in zip(axes.flat, families) if family in ("captured", "input")]
    if len(weights) == 2:
        lo = min(a.get_ylim()[0] for a in weights)
        hi = max(a.get_ylim()[1] for a in weights)
        for a in weights:
            a.set_ylim(lo, hi)
    fig.suptitle("compile time: each stage of ft.compile against the program's size", fontsize=11, y=0.995)
    _legend(fig, axes, y=1 - 0.5 / fig.get_figheight(), ncol=10)
    fig.text(0.01, 0.005, f"CPU: {', '.join(sorted(set(df['device'])))}; commit "
             f"{', '.join(sorted(set(df['commit'].astype(str))))}; one run per program, the C compiler's cache empty; "
             "CPU time of polyft and the compiler (wall time in the CSV); a stage measured at 0 s is not drawn",
             fontsize=6.5, va="bottom", ha="left", color="dimgray")
    fig.tight_layout(rect=(0, 0.3 / fig.get_figheight(), 1, 1 - 0.9 / fig.get_figheight()))
    return fig


def depth_scaling(fig2=None, fig8=None) -> pd.DataFrame:
    """time(deepest) / time(shallowest) per (artefact, workload, model, system), from the
    depth sweeps (fig2; fig8's depth panels), either of which may be missing (None)."""
    rows = []
    for artefact, df in (("fig2", fig2), ("fig8", fig8)):
        if df is None:
            continue
        df = _ok(df)
        if "panel" in df:
            df = df[df["panel"] == "depth"]
        model = df["model"] if "model" in df else pd.Series("-", index=df.index)
        for (w, m, s), g in df.assign(model=model).groupby(["workload", "model", "system"], sort=False):
            lo, hi = g.loc[g["depth"].idxmin()], g.loc[g["depth"].idxmax()]
            if lo["depth"] == hi["depth"]:
                continue
            rows.append(dict(artefact=artefact, workload=w, model=m, shape=_common_shape(g, ["D"]), system=s,
                             depth_min=int(lo["depth"]), depth_max=int(hi["depth"]), seconds_at_min=lo["seconds"],
                             seconds_at_max=hi["seconds"], ratio=hi["seconds"] / lo["seconds"],
                             linear_ratio=hi["depth"] / lo["depth"],
                             ratio_at_20=(g.loc[g["depth"] == 20, "seconds"].iloc[0] / lo["seconds"]
                                          if lo["depth"] == 1 and (g["depth"] == 20).any() else float("nan")),
                             device=lo["device"]))
    return pd.DataFrame(rows)


# every file this script writes (untagged name) -> the artefacts whose CSVs it is made from, and
# the function making it from those CSVs (in that order; None for a missing one): a Figure or a table
_OUTPUTS = {
    "fig2.png": (("fig2",), draw_fig2),
    "fig7.png": (("fig7",), draw_fig7),
    "fig7_speedup.csv": (("fig7",), speedups),
    "fig8.png": (("fig8",), draw_fig8),
    "table7.png": (("table7",), draw_table7),
    "memory.png": (("memory",), draw_memory),
    "depth_scaling.csv": (("fig2", "fig8"), depth_scaling),
    "compile_time.png": (("compile_time",), draw_compile_time),
}
PLOT_SOURCES = {name: sources for name, (sources, _) in _OUTPUTS.items()}
# the derived tables summary() shows: caption, columns (None: all), number format
_TABLES = {
    "fig7_speedup.csv": ("fig7: polyft's speedup over the fastest baseline (not eager numpy) per workload",
                         None, "{:.4g}"),
    "depth_scaling.csv": ("depth scaling: time(deepest) / time(depth 1); linear growth would be depth_max "
                          "(paper's baselines at depth 20: cuDNN 12.99, TVM 16.65, PyTorch JIT 20.94, TF 21.20)",
                          ["artefact", "workload", "model", "system", "depth_max", "ratio", "ratio_at_20"], "{:.2f}"),
}


def _wanted(artefacts) -> list:
    """The outputs (untagged names) made from the named artefacts' CSVs; all for None."""
    if artefacts is None:
        return list(_OUTPUTS)
    unknown = sorted(set(artefacts) - set(ARTEFACTS))
    if unknown:
        raise ValueError(f"unknown artefacts {unknown}; known: {', '.join(ARTEFACTS)}")
    return [name for name, (sources, _) in _OUTPUTS.items() if set(sources) & set(artefacts)]


def _made(out_dir, preset, names):
    """(name, Figure or DataFrame) for each output in names of which at least one source CSV of
    this preset exists, made one at a time (so each figure can be closed before the next)."""
    frames = {}
    for name in names:
        sources, make = _OUTPUTS[name]
        for a in sources:
            if a not in frames:
                frames[a] = _read(out_dir, tagged(f"{a}.csv", preset))
        dfs = [frames[a] for a in sources]
        if any(df is not None for df in dfs):
            yield name, make(*dfs)


def run(out_dir: str = "results", preset: str = "quick", artefacts=None) -> list:
    """Draw the plots and write the derived CSVs of the named artefacts (all for None) from this
    preset's CSVs in out_dir, as tagged files there; returns the paths written. Prints nothing:
    summary() has the derived tables."""
    written = []
    for name, made in _made(out_dir, preset, _wanted(artefacts)):
        path = os.path.join(out_dir, tagged(name, preset))
        if isinstance(made, Figure):
            made.savefig(path, dpi=130)
            plt.close(made)
        elif made.empty:  # e.g. no depth swept twice
            continue
        else:
            made.to_csv(path, index=False)
        written.append(path)
    return written


def summary(out_dir: str = "results", preset: str = "quick", artefacts=None) -> str:
    """The derived tables (fig7's speedups, depth scaling) of the named artefacts (all for None)
    as text, made from this preset's CSVs like run's; "" when there are none."""
    names = [name for name in _wanted(artefacts) if name in _TABLES]
    parts = []
    for name, table in _made(out_dir, preset, names):
        caption, columns, fmt = _TABLES[name]
        if len(table):
            text = table[columns or list(table)].to_string(index=False, float_format=fmt.format)
            parts.append(f"{caption}\n{text}")
    return "\n\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    preset_args(ap, out="results")  # redraws the CSVs where they are
    ap.add_argument("artefacts", nargs="*", metavar="ARTEFACT", help="redraw only what these artefacts' CSVs "
                    f"make (default: everything); of {', '.join(ARTEFACTS)}")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.artefacts) - set(ARTEFACTS))
    if unknown:
        ap.error(f"unknown artefacts {unknown}")
    names, preset = args.artefacts or None, preset_of(args)
    written = run(args.out, preset, names)
    text = summary(args.out, preset, names)
    if text:
        print(text + "\n")
    for path in written:
        print(f"[plot] wrote {path}")
    if not written:
        print(f"[plot] nothing to draw: no {preset} CSVs for these artefacts in {args.out}")
    print(f"[plot] wrote {write_index(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
