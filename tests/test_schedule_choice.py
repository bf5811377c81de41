"""The C target's measured choice between the auto schedule and another (emit/schedule_choice.py,
emit/measured.py).

* `MeasuredChoice` with `warm_each` (a fake clock): each option warms up once, uncounted, then
  each is tried, then the faster runs and the other is probed.
* A compiled stacked LSTM: the auto schedule races the original order by default; the original
  order's code is built on its first call; the two give bit-identical results, also through
  bind(); pinned thread counts hold for both; programs whose auto schedule is the original order
  (b2b GEMM) have no choice; alternative=False and hand schedules as alternatives; bad
  alternatives fail at compile time with a PolyftError.
"""
from __future__ import annotations

import numpy as np
import pytest

import polyft as ft
from polyft.emit.measured import MeasuredChoice
from polyft.errors import PolyftError, ScheduleError
from polyft.testing import rel_error
from polyft.workloads import b2b_gemm, stacked_lstm

from helpers import in_threads


@pytest.fixture(autouse=True)
def measured(monkeypatch):
    """Thread counts measured, not pinned by the environment, unless a test pins one."""
    monkeypatch.delenv("POLYFT_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_each_option_warms_up_once_then_the_faster_is_kept():
    now, ran = [0], []
    cost = {"auto": 5, "original": 2}
    choice = MeasuredChoice(["auto", "original"], warm_each=True, clock=lambda: now[0])

    def call(option):
        ran.append(option)
        now[0] += 100 if ran.count(option) == 1 else cost[option]  # the first call of each is slow
    for _ in range(12):
        choice.run((), call)
    # warm-ups (not counted: the slow first calls do not decide), one try each, then the faster
    # with probes of the other after 2 calls, then 4
    assert ran == ["auto", "original", "auto", "original", "original", "original", "auto",
                   "original", "original", "original", "original", "auto"]
    assert choice.best(()) == "original"


def test_without_warm_each_only_the_first_call_warms_up():
    now, ran = [0], []
    choice = MeasuredChoice([1, 2], first=2, clock=lambda: now[0])

    def call(option):
        ran.append(option)
        now[0] += {1: 1, 2: 3}[option]
    for _ in range(4):
        choice.run((), call)
    assert ran == [2, 1, 2, 1]


INPUTS = stacked_lstm.inputs("small", seed=3, N=3, H=16, D=3, L=5)


def _arrays(out):
    return [np.asarray(x.to_numpy() if hasattr(x, "to_numpy") else x) for x in out]


@pytest.fixture(scope="module")
def lstm():
    return ft.compile(stacked_lstm.program, *INPUTS)


def test_the_auto_schedule_races_the_original_order_built_on_first_use(lstm):
    choice = lstm.schedule_choice
    assert choice.options == ("auto", "original")
    assert choice.schedules["auto"] is lstm.schedule
    assert choice.schedules["original"].kind == "original"
    assert "S_b3" in str(choice.schedules["original"].map)  # the coarsened statements, as the auto schedule's
    ref = _arrays(stacked_lstm.program(*INPUTS))
    outs = {}
    for _ in range(8):
        out = _arrays(lstm(*INPUTS))
        outs.setdefault(choice.last, out)
        assert max(rel_error(o, r) for o, r in zip(out, ref)) < 1e-5
    assert set(outs) == {"auto", "original"} and choice.best((None,)) in outs  # (pinned threads, lengths)
    for a, b in zip(outs["auto"], outs["original"]):  # the same instances on the same operands
        assert np.array_equal(a, b)


def test_the_original_order_is_compiled_only_when_tried():
    prog = ft.compile(stacked_lstm.program, *INPUTS)
    prog(*INPUTS)
    assert prog.schedule_choice.last == "auto" and prog.schedule_choice.built == ("auto",)
    prog(*INPUTS)
    assert prog.schedule_choice.last == "original" and prog.schedule_choice.built == ("auto", "original")


def test_bind_runs_both_schedules_on_their_own_buffers(lstm):
    go, fetch = lstm.bind(*INPUTS)
    ran = set()
    for _ in range(6):
        go()
        fetch()
        ran.add(lstm.schedule_choice.last)
    assert ran == {"auto", "original"}


def test_a_pinned_schedule_and_a_pinned_thread_count_hold_for_every_call(lstm):
    choice = lstm.schedule_choice
    try:
        lstm.threads.fixed = 1
        for name in ("original", "auto"):
            choice.fixed = name
            for _ in range(3):
                lstm(*INPUTS)
                assert (choice.last, lstm.threads.last) == (name, 1)
        choice.fixed = None
        for _ in range(4):
            lstm(*INPUTS)
            assert lstm.threads.last == 1
    finally:
        lstm.threads.fixed = choice.fixed = None
    with pytest.raises(PolyftError, match="auto, original"):
        choice.fixed = "wavefront"


def test_no_choice_where_the_auto_schedule_is_the_original_order_or_none_is_asked():
    ins = b2b_gemm.inputs("small")
    assert ft.compile(b2b_gemm.program, *ins).schedule_choice is None
    assert ft.compile(stacked_lstm.program, *INPUTS, alternative=False).schedule_choice is None
    assert ft.compile(stacked_lstm.program, *INPUTS, schedule="original").schedule_choice is None


def test_a_hand_schedule_as_the_alternative():
    prog = ft.compile(stacked_lstm.program, *INPUTS, alternative=stacked_lstm.tiled_wavefront(2))
    assert prog.schedule_choice.options == ("auto", "user")
    ref = _arrays(stacked_lstm.program(*INPUTS))
    for _ in range(4):
        out = _arrays(prog(*INPUTS))
        assert max(rel_error(o, r) for o, r in zip(out, ref)) < 1e-5
    assert prog.schedule_choice.built == ("auto", "user")


def test_bad_alternatives_fail_at_compile_time():
    with pytest.raises(ScheduleError):  # not ISL
        ft.compile(stacked_lstm.program, *INPUTS, alternative="{ S_b3[i] -> [i")
    with pytest.raises(ScheduleError):  # illegal: runs the layers backwards in time
        ft.compile(stacked_lstm.program, *INPUTS,
                   alternative="{ S_b0[i, j, k] -> [-j, -k, i, 1, 0]; S_b3[i, j, k, l] -> [-j, -k, i, 0, l] }")
    with pytest.raises(PolyftError, match="alternative= takes False .* got the bool True"):
        ft.compile(stacked_lstm.program, *INPUTS, alternative=True)
    with pytest.raises(PolyftError, match="C target"):
        ft.compile(stacked_lstm.program, *INPUTS, target="cuda-emulated", alternative="original")


def test_four_threads_calling_at_once_build_the_original_order_once():
    """The calls that first try the original order come from several threads at once: it is
    compiled once (under a lock) and every call gives the first call's bits."""
    prog = ft.compile(stacked_lstm.program, *INPUTS)
    expected = _arrays(prog(*INPUTS))
    builds, same = [], []
    build = prog.schedule_choice._build["original"]  # generates and compiles the original order

    def counted():
        builds.append(1)
        return build()
    prog.schedule_choice._build["original"] = counted

    def work():
        for _ in range(6):
            same.append(all(np.array_equal(a, b) for a, b in zip(_arrays(prog(*INPUTS)), expected)))
    in_threads(work)
    assert len(same) == 24 and all(same)
    assert prog.schedule_choice.built == ("auto", "original") and len(builds) == 1
