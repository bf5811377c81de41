"""Schedule pictures (schedule/picture.py, `Schedule.plot`), checked against brute force: the
program is run instance by instance (polyft.interpret, no ISL), and what each band panel draws
must be exactly the slice's instances (markers), its writer -> reader pairs (arrows), and the
ranks of the instances' times (each instance's time vector from the schedule) on the schedule's
sequential dims (colours, and the numbers in the markers); the wavefront's hyperplanes are lines
of equal step on the "auto" panel only. Each timeline (under a band panel) has every statement of
the program as a row, its instances counted per step, and the dependences between statements;
the legend names every mark, the axes say which operator's dim they are.

* the stacked RNN (Figures 5/6): D·L steps as written, L + D - 1 as a wavefront, lines j + k = c;
* the grid RNN (a 3-D band inside the batch map, sliced), flash attention (a 1-D band of three
  statements, one with an inner dim) and the stacked LSTM (two statements per band point);
* a band without dependences: no arrows, one step;
* symbolic lengths without sizes, too many points, a wrong slice or band: PolyftError;
* the figure saves as PNG.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import polyft as ft
from polyft import interpret
from polyft.errors import PolyftError
from polyft.schedule.schedule import make_schedule
from polyft.workloads import dilated_rnn, flash_attention, grid_rnn, stacked_lstm, stacked_rnn

from helpers import flist, rand
from test_schedule import brute_flow, times


def ran(etdg, inputs) -> set:
    """Every statement instance (name, index tuple) the interpreter runs."""
    out = set()
    interpret.run(etdg, *inputs, record=lambda st, env, reads, writes: out.add(
        (st.name, tuple(env[d] for d in st.dims))))
    return out


def panels(fig) -> list:
    """The band panels: original, then the other schedule."""
    return [ax for ax in fig.axes if ax.get_gid() == "band"]


def timelines(fig) -> list:
    return [ax for ax in fig.axes if ax.get_gid() == "timeline"]


def legend(fig) -> list:
    return [t.get_text() for t in fig.legends[0].get_texts()]


def numbers(ax) -> dict:
    """(x, y) -> the step written in the marker there."""
    return {tuple(map(float, t.get_position())): int(t.get_text()) for t in ax.texts if t.get_gid() == "step"}


def timeline(ax) -> tuple[dict, set]:
    """((statement, step) -> instances written under its marker, {(statement, step) -> (statement,
    step)} arrows), read back from the drawn timeline."""
    rows = [t.get_text() for t in ax.get_yticklabels()]

    def at(xy):
        return rows[round(xy[1])], round(xy[0])
    counts = {at(t.xy): int(t.get_text()) for t in ax.texts if t.get_gid() == "count"}
    marked = {at(xy) for c in ax.collections if (c.get_gid() or "").startswith("timeline ") for xy in c.get_offsets()}
    assert marked == set(counts)  # a count under every marker, none elsewhere
    return counts, {(at(a.xyann), at(a.xy)) for a in ax.texts if a.get_gid() == "dependence"}


def drawn(ax) -> dict:
    """(x, y) of every marker -> (statement, its step, its colour)."""
    out = {}
    for c in ax.collections:
        if (c.get_gid() or "").startswith("instances "):
            name = c.get_gid().split()[1]
            for xy, step, rgba in zip(c.get_offsets(), c.get_array(), c.to_rgba(c.get_array())):
                key = tuple(float(v) for v in xy)
                assert key not in out, f"two markers at {key}"
                out[key] = (name, int(step), tuple(rgba))
    return out


def arrows(ax) -> set:
    return {(tuple(map(float, a.xyann)), tuple(map(float, a.xy))) for a in ax.texts if a.get_gid() == "dependence"}


def hyperplanes(ax) -> list:
    return [line for line in ax.lines if line.get_gid() == "hyperplane"]


def steps(prog, schedule, instances, where) -> dict:
    """Marker position -> the first step of its instances: the rank of an instance's time on the
    schedule's sequential dims among those of `instances`; `where(instance)` is its marker's position."""
    when = times(prog.model, schedule)
    seq = {inst: tuple(when[inst][k] for k, par in enumerate(schedule.parallel) if not par) for inst in instances}
    rank = {t: r for r, t in enumerate(sorted(set(seq.values())))}
    out = {}
    for inst, t in seq.items():
        xy = where(inst)
        out[xy] = min(out.get(xy, rank[t]), rank[t])
    return out


# -- the stacked RNN ---------------------------------------------------------------------------

N, D, L = 2, 4, 6


@pytest.fixture(scope="module")
def rnn():
    inputs = stacked_rnn.inputs("small", seed=3, N=N, D=D, L=L)
    prog = ft.analyze(stacked_rnn.program, *inputs)
    return prog, inputs, prog.schedule.plot(slice_at={"i": 1})


def test_rnn_two_panels_titled_by_their_steps(rnn):
    prog, inputs, fig = rnn
    xss, ws = inputs
    d, l = len(ws), len(xss[0])  # the lengths as the inputs give them
    original, auto = panels(fig)
    assert original.get_title() == f"original schedule: {d * l} steps in this slice"
    assert auto.get_title() == f"auto schedule: {l + d - 1} steps in this slice"
    assert prog.schedule.sequential_steps == l + d - 1
    for ax in (original, auto):  # time along x, the layers up, named by their operators
        assert (ax.get_xlabel(), ax.get_ylabel()) == (f"k: step of the scanl over {l}", f"j: step of the scanl over {d}")
    assert fig._suptitle.get_text() == "band b0 [i, j, k] at i = 1 (top); every statement of the program on one " \
                                       "time axis (bottom)"


def test_rnn_legend_names_every_mark(rnn):
    *_, fig = rnn
    texts = legend(fig)
    assert texts[0] == "S_b0 [i, j, k]"
    for mark in ("colour, number in a marker", "arrow: flow dependence", "red line: hyperplane",
                 "number under a marker (bottom): instances"):
        assert sum(t.startswith(mark) for t in texts) == 1, mark
    colourbars = [ax for ax in fig.axes if ax.get_gid() not in ("band", "timeline")]
    assert [ax.get_ylabel() for ax in colourbars] == [f"sequential step ({k} schedule, this slice)"
                                                      for k in ("original", "auto")]
    assert [len(ax.get_yticks()) for ax in colourbars] == [12, L + D - 1]  # 24 steps: every other; 9: each


def test_rnn_markers_and_colours_are_the_slice_and_its_steps(rnn):
    prog, inputs, fig = rnn
    original = make_schedule(prog.model, prog.deps, "original")
    mine = {inst for inst in ran(prog.etdg, inputs) if inst[1][0] == 1}
    for ax, schedule in zip(panels(fig), (original, prog.schedule)):
        expected = steps(prog, schedule, mine, lambda inst: (float(inst[1][2]), float(inst[1][1])))  # (k, j)
        got = drawn(ax)
        assert len(got) == len(mine) == D * L
        assert {xy: step for xy, (_, step, _) in got.items()} == expected
        colours = {rgba for _, _, rgba in got.values()}
        assert len(colours) == len(set(expected.values())) == schedule.sequential_steps
        assert numbers(ax) == expected  # each marker's step written in it


def test_rnn_timelines_count_every_instance_by_step(rnn):
    """Under each band panel, the whole program (every i) on one axis: the instances per step and
    the dependences between steps, as brute force gives them."""
    prog, inputs, fig = rnn
    original = make_schedule(prog.model, prog.deps, "original")
    every = ran(prog.etdg, inputs)
    for ax, schedule in zip(timelines(fig), (original, prog.schedule)):
        step = steps(prog, schedule, every, lambda inst: inst)
        counts, arrows_ = timeline(ax)
        assert counts == dict(Counter((inst[0], s) for inst, s in step.items()))
        assert arrows_ == {((a[0], step[a]), (b[0], step[b])) for a, b in brute_flow(prog.etdg, inputs)}
        assert ax.get_title() == f"every statement, {schedule.kind} schedule: {schedule.sequential_steps} steps"
    assert sorted(timeline(timelines(fig)[1])[0].values()) == sorted(  # j + k = c: N instances per (j, k)
        N * sum(j + k == c for j in range(D) for k in range(L)) for c in range(L + D - 1))


def test_rnn_arrows_are_the_flow_dependences(rnn):
    prog, inputs, fig = rnn
    pairs = {((k1, j1), (k2, j2)) for (_, (i1, j1, k1)), (_, (i2, j2, k2)) in brute_flow(prog.etdg, inputs)
             if i1 == i2 == 1}
    assert len(pairs) == (D - 1) * L + D * (L - 1)  # the layer below and the step before
    for ax in panels(fig):
        assert arrows(ax) == {tuple(tuple(map(float, p)) for p in pair) for pair in pairs}


def _distance(line, xy) -> float:
    (x1, y1), (x2, y2) = line.get_xy1(), line.get_xy2()
    return abs((x2 - x1) * (xy[1] - y1) - (y2 - y1) * (xy[0] - x1)) / np.hypot(x2 - x1, y2 - y1)


def test_rnn_hyperplanes_are_the_wavefront_on_the_auto_panel_only(rnn):
    _, _, fig = rnn
    original, auto = panels(fig)
    assert hyperplanes(original) == []
    lines = hyperplanes(auto)
    got = drawn(auto)
    assert len(lines) == len({step for _, step, _ in got.values()}) == L + D - 1
    for line in lines:
        (x1, y1), (x2, y2) = line.get_xy1(), line.get_xy2()
        assert np.isclose(x2 - x1, -(y2 - y1))  # j + k = c
        on = {step for xy, (_, step, _) in got.items() if _distance(line, xy) < 1e-9}
        assert len(on) == 1  # one step per hyperplane
    assert all(sum(_distance(line, xy) < 1e-9 for line in lines) == 1 for xy in got)


def test_rnn_saves_as_png(rnn, tmp_path):
    *_, fig = rnn
    fig.savefig(tmp_path / "rnn.png")
    assert (tmp_path / "rnn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- lengths and arguments -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def symbolic():
    return ft.analyze(stacked_rnn.program, *stacked_rnn.specs("small"))


def test_symbolic_lengths_need_sizes(symbolic):
    with pytest.raises(PolyftError, match=r"plot: .*give sizes for D, L, N"):
        symbolic.schedule.plot()
    with pytest.raises(PolyftError, match=r"give sizes for D, L \("):
        symbolic.schedule.plot({"N": 2})
    fig = symbolic.schedule.plot({"N": 1, "D": 2, "L": 3})
    assert len(drawn(panels(fig)[1])) == 2 * 3


def test_refuses_too_many_points(symbolic):
    with pytest.raises(PolyftError, match=r"has 10000 points .* more than the 2000"):
        symbolic.schedule.plot({"N": 1, "D": 100, "L": 100})


def test_wrong_slice_or_band(symbolic):
    sizes = {"N": 2, "D": 2, "L": 3}
    with pytest.raises(PolyftError, match=r"slice_at names \['k'\].* not drawn of band b0 are \['i'\]"):
        symbolic.schedule.plot(sizes, slice_at={"k": 0})
    with pytest.raises(PolyftError, match=r"no instances at \{'i': 2\}"):
        symbolic.schedule.plot(sizes, slice_at={"i": 2})
    with pytest.raises(PolyftError, match=r"no band 'b9'; the schedule's bands are b0 \[i, j, k\]"):
        symbolic.schedule.plot(sizes, band="b9")


# -- other bands ---------------------------------------------------------------------------------


def test_grid_rnn_slices_its_3d_band():
    inputs = grid_rnn.inputs("small", seed=5)
    prog = ft.analyze(grid_rnn.program, *inputs)
    fig = prog.schedule.plot(slice_at={"j": 1})
    assert fig._suptitle.get_text().startswith("band b3 [j, k, l] at i = 0, j = 1 (top)")
    band = next(b for b in prog.schedule.bands if len(b.dims) == 3)
    mine = {(name, idx) for name, idx in ran(prog.etdg, inputs) if name in band.statements and idx[:2] == (0, 1)}
    original = make_schedule(prog.model, prog.deps, "original")
    for ax, schedule in zip(panels(fig), (original, prog.schedule)):
        expected = steps(prog, schedule, mine, lambda inst: (float(inst[1][3]), float(inst[1][2])))  # (l, k)
        assert {xy: step for xy, (_, step, _) in drawn(ax).items()} == expected
        assert len(expected) == grid_rnn.PRESETS["small"]["L1"] * grid_rnn.PRESETS["small"]["L2"]
    assert hyperplanes(panels(fig)[1]) and not hyperplanes(panels(fig)[0])
    for ax, schedule in zip(timelines(fig), (original, prog.schedule)):  # every statement, the program's steps
        assert [t.get_text() for t in ax.get_yticklabels()] == list(prog.model.domains)
        counts, _ = timeline(ax)
        assert len({step for _, step in counts}) == schedule.sequential_steps  # a map beside the scan: parallel
        assert sum(counts.values()) == len(ran(prog.etdg, inputs))


def test_flash_attention_draws_a_1d_band_of_three_statements():
    """One row per statement; a statement with an inner dim is one marker per band point, and
    the arrows are the dependences projected onto the band."""
    inputs = flash_attention.inputs("small", seed=2)
    prog = ft.analyze(flash_attention.program, *inputs)
    fig = prog.schedule.plot()
    ax = panels(fig)[1]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    band = next(b for b in prog.schedule.bands if len(b.statements) == 3)
    assert sorted(rows) == sorted(band.statements)
    instances = ran(prog.etdg, inputs)
    expected = {(float(idx[0]), float(rows.index(name))) for name, idx in instances if name in rows}
    assert set(drawn(ax)) == expected
    assert len(expected) == 3 * len({idx[0] for name, idx in instances if name in rows})
    assert len(expected) < len([x for x in instances if x[0] in rows])  # the inner dim is projected
    first = steps(prog, prog.schedule, {x for x in instances if x[0] in rows},
                  lambda inst: (float(inst[1][0]), float(rows.index(inst[0]))))
    assert {xy: step for xy, (_, step, _) in drawn(ax).items()} == first  # a marker: its instances' first step
    projected = {((float(a[1][0]), float(rows.index(a[0]))), (float(b[1][0]), float(rows.index(b[0]))))
                 for a, b in brute_flow(prog.etdg, inputs) if a[0] in rows and b[0] in rows}
    assert arrows(ax) == {pair for pair in projected if pair[0] != pair[1]} and arrows(ax)
    assert hyperplanes(ax) == []  # a hyperplane of a 1-D band is a point


def test_a_band_without_dependences_is_one_step():
    def double(xs, w):
        return xs.map(lambda x: x @ w)

    prog = ft.analyze(double, flist([7], [1, 4], seed=11), rand((4, 4), seed=12))
    fig = prog.schedule.plot()
    for ax in panels(fig):
        got = drawn(ax)
        assert len(got) == 7 and {step for _, step, _ in got.values()} == {0}
        assert arrows(ax) == set() and hyperplanes(ax) == []
        assert ax.get_title().endswith(": 1 step in this slice")


def test_stacked_lstm_draws_two_statements_per_point():
    """Two statements at every band point: two markers side by side, told apart by a legend,
    and one set of hyperplanes j + k = c for both."""
    prog = ft.analyze(stacked_lstm.program, *stacked_lstm.inputs("small", seed=4))
    band = next(b for b in prog.schedule.bands if len(b.dims) == 3)
    d, l = stacked_lstm.PRESETS["small"]["D"], stacked_lstm.PRESETS["small"]["L"]
    fig = prog.schedule.plot()
    ax = panels(fig)[1]
    assert len(band.statements) == 2
    assert len(drawn(ax)) == 2 * d * l
    texts = legend(fig)
    assert all(sum(t.startswith(f"{s} [") for t in texts) == 1 for s in band.statements)
    assert len(hyperplanes(ax)) == l + d - 1
    shapes = {c.get_gid().split()[1]: c.get_paths()[0].vertices.shape for c in ax.collections}
    assert shapes[band.statements[0]] != shapes[band.statements[1]]  # told apart by their markers


def test_timeline_shows_the_dependences_between_bands():
    """The dilated RNN: seven statements in four bands, one row each; arrows between statements of
    different bands, every one forward in time."""
    inputs = dilated_rnn.inputs("small", seed=6)
    prog = ft.analyze(dilated_rnn.program, *inputs)
    fig = prog.schedule.plot()
    pairs = {(a[0], b[0]) for a, b in brute_flow(prog.etdg, inputs)}
    band_of = {s: max((b for b in prog.schedule.bands if s in b.statements), key=lambda b: b.outer + len(b.dims))
               .block.name for s in prog.model.domains}  # the innermost
    for ax in timelines(fig):
        assert [t.get_text() for t in ax.get_yticklabels()] == list(prog.model.domains)
        _, drawn_arrows = timeline(ax)
        assert {(a[0], b[0]) for a, b in drawn_arrows} == pairs
        assert any(band_of[a[0]] != band_of[b[0]] for a, b in drawn_arrows)
        assert all(a[1] < b[1] for a, b in drawn_arrows)
