"""Reliability, round two (issue 28): schedules that would run for hours, programs traced from
several threads at once, compiled calls given the wrong kind of input, sizes past int64, eager
semantics that hold (inputs never modified, `x.T` one meaning), and the unclear cases, each a
`PolyftError` that says what to do. Fork, thread-count and compiler faults: test_threads.py,
test_cache_faults.py."""
from __future__ import annotations

import numpy as np
import pytest

import polyft as ft
from polyft.errors import ScheduleError
from polyft.schedule.schedule import SCAN_FLOOR, scan_size
from polyft.testing import rel_error
from polyft.workloads import stacked_rnn

pytestmark = pytest.mark.usefixtures("compile_cache")  # conftest.py: a temporary POLYFT_CACHE

SMALL = {"N": 2, "D": 3, "L": 5}  # stacked_rnn's "small" preset
SPREAD = "{ S_b0[i, j, k] -> [i, %d * k + j, 0] }"  # legal: k's steps keep their order


# -- a schedule whose loops are almost all empty ---------------------------------------------------
@pytest.mark.parametrize("source", ["inputs", "specs+sizes"])
def test_a_schedule_spreading_few_instances_over_a_huge_range_is_rejected_with_the_count(source):
    """`[i, 10**12 * k + j, 0]` is legal, but its loop over the second time dim visits every value
    from 0 to 4 * 10**12 for 30 instances: it ran effectively forever; now a ScheduleError before any
    code is generated, with the count."""
    args = stacked_rnn.inputs("small", 0) if source == "inputs" else stacked_rnn.specs("small")
    sizes = None if source == "inputs" else SMALL
    with pytest.raises(ScheduleError) as e:
        ft.compile(stacked_rnn.program, *args, sizes=sizes, schedule=SPREAD % 10 ** 12)
    msg = str(e.value)
    assert "8e+12 iterations for 30 statement instances" in msg and "coefficients" in msg, msg


def test_the_scan_count_is_exact_for_boxes_and_spread_schedules():
    """The counts the check compares: the wavefront's loops, the nest's own, a spread schedule's
    (2 values of i times 4 * 10**6 + 3 of the second dim), and a moderate spread still compiles
    and equals eager (the check is a bound on wasted time, not on coefficients)."""
    args = stacked_rnn.inputs("small", 0)
    wave = ft.analyze(stacked_rnn.program, *args, schedule="{ S_b0[i, j, k] -> [j + k, j, i] }")
    # c0 = j + k in [0, 6], j in [0, 2] under it (3 at most), i in [0, 1]
    assert scan_size(wave.model, wave.schedule.per_statement, wave.model.sizes) == (7 * 3 * 2, 30)
    prog = ft.compile(stacked_rnn.program, *args, schedule=SPREAD % 10 ** 6)
    assert scan_size(prog.model, prog.schedule.per_statement, prog.model.sizes) == (2 * (4 * 10 ** 6 + 3), 30)
    assert 2 * (4 * 10 ** 6 + 3) < SCAN_FLOOR
    assert rel_error(prog(*args), stacked_rnn.program(*args)) < 1e-5
