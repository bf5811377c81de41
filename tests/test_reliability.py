"""Reliability, round two (issue 28): schedules that would run for hours, programs traced from
several threads at once, compiled calls given the wrong kind of input, sizes past int64, eager
semantics that hold (inputs never modified, `x.T` one meaning), and the unclear cases, each a
`PolyftError` that says what to do. Fork, thread-count and compiler faults: test_threads.py,
test_cache_faults.py."""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
from helpers import assert_same, flist, in_threads, rand

import polyft as ft
from polyft.errors import (DepthError, DTypeError, InPlaceError, InputError, PolyftError, ScheduleError, ShapeError,
                           SpecError)
from polyft.schedule.schedule import SCAN_FLOOR, scan_size
from polyft.testing import rel_error
from polyft.workloads import stacked_rnn

pytestmark = pytest.mark.usefixtures("compile_cache")  # conftest.py: a temporary POLYFT_CACHE

SOURCE = pathlib.Path(__file__).read_text().splitlines()
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


def test_with_symbolic_lengths_the_count_is_checked_at_each_calls_lengths():
    """With the layers' count concrete (3) the spread schedule is injective for every L, so it
    compiles; a call at L = 5 would run 8e12 loop iterations: a ScheduleError before any native
    code runs, with the lengths; lengths where the loops stay small run and equal eager."""
    xss_spec, _ = stacked_rnn.specs("small")
    ws_spec = ft.spec("[3]float32[8, 8]")
    prog = ft.compile(stacked_rnn.program, xss_spec, ws_spec, schedule=SPREAD % 10 ** 12)
    xss, ws = stacked_rnn.inputs("small", 0)
    with pytest.raises(ScheduleError) as e:
        prog(xss, ws)  # symbolic-call
    at_line(e.value, "symbolic-call")
    assert "8e+12 iterations for 30 statement instances at L = 5, N = 2" in str(e.value)
    one = ft.FractalTensor.from_numpy(xss.to_numpy()[:, :1], 2)  # L = 1: k is 0, nothing is spread
    assert_same(prog(one, ws), stacked_rnn.program(one, ws))


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


def at_line(err, tag):
    """`err.where` is the line of this file tagged `# <tag>`."""
    lines = [n for n, text in enumerate(SOURCE, 1) if text.rstrip().endswith(f"# {tag}")]
    assert len(lines) == 1 and err.where and err.where.startswith(f"test_reliability.py:{lines[0]}: "), err.where


# -- a list of another depth, the same numbers -------------------------------------------------------
def tanh_rows(xs):
    return xs.map(lambda x: ft.tanh(x))


@pytest.mark.parametrize("depth", [2, 3])
def test_a_list_of_another_depth_is_a_depth_error_compiled_as_eagerly(depth):
    """`from_numpy(a, depth=2)` of the [L, 1, 8] array a has a [L, 1] list of float32[8]: eagerly
    tanh refuses its list elements; compiled, it ran on the same bytes and returned a result."""
    a = rand((4, 1, 8), 0)
    prog = ft.compile(tanh_rows, ft.spec("[L]float32[1, 8]"))
    other = ft.FractalTensor.from_numpy(a if depth == 2 else a.reshape(4, 1, 1, 8), depth)
    with pytest.raises(DepthError):
        tanh_rows(other)
    with pytest.raises(DepthError) as e:
        prog(other)  # depth-call
    at_line(e.value, "depth-call")
    assert "[L]float32[1, 8]" in str(e.value) and other.type_string in str(e.value) and "depth=1" in str(e.value)
    xs = ft.FractalTensor.from_numpy(a, 1)
    assert_same(prog(xs), tanh_rows(xs))


# -- sizes past int64 ----------------------------------------------------------------------------------
def outer(xss):
    return xss.map(lambda xs: xs.map(lambda x: ft.tanh(x)))


def test_memory_counts_bytes_exactly_past_int64():
    """memory() multiplied in int64 and wrapped to negative byte counts; it counts in Python ints."""
    prog = ft.analyze(tanh_rows, ft.spec("[N]float32[1, 8]"))
    mem = prog.memory({"N": 2 ** 62}).set_index("buffer")
    assert mem.loc["xs", "full_bytes"] == 2 ** 62 * 32 and mem.loc["out", "allocated_bytes"] == 2 ** 62 * 32
    prog = ft.analyze(outer, ft.spec("[N, M]float32[1, 8]"))
    assert prog.memory({"N": 2 ** 40, "M": 2 ** 40}).set_index("buffer").loc["xss", "full_bytes"] == 2 ** 85


def test_sizes_whose_buffers_pass_int64_are_a_spec_error():
    """The generated code's offsets are C longs: a buffer of more than 2**63 bytes cannot be indexed."""
    with pytest.raises(SpecError) as e:
        ft.analyze(outer, ft.spec("[N, M]float32[1, 8]"), sizes={"N": 2 ** 30, "M": 2 ** 30})
    assert "buffer xss" in str(e.value) and str(2 ** 60 * 8) in str(e.value) and "2**63" in str(e.value)
    ft.analyze(outer, ft.spec("[N, M]float32[1, 8]"), sizes={"N": 2 ** 20, "M": 2 ** 20})  # 2**45 bytes: fine
    with pytest.raises(SpecError, match=r"buffer xs \[4611686018427387904\]float32\[1, 8\] would hold"):
        ft.analyze(tanh_rows, ft.spec("[4611686018427387904]float32[1, 8]"))  # lengths in the spec itself
    with pytest.raises(SpecError, match="one element would pass 2\\*\\*63 bytes"):
        ft.analyze(tanh_rows, ft.spec("[N]float32[4611686018427387904, 8]"))  # numpy's ValueError while tracing


def test_a_call_whose_buffers_pass_int64_is_an_input_error_before_any_copy():
    """Each row of a [2**42] list of float32[1, 1] (a broadcast view: no memory behind it) widened to
    2**20 columns: the output would be 2**64 bytes. Refused before the call copies or allocates."""
    wide = np.ones((1, 2 ** 20), np.float32)
    prog = ft.compile(lambda xs: xs.map(lambda x: x * wide), ft.spec("[N]float32[1, 1]"))
    huge = np.broadcast_to(np.zeros((1, 1, 1), np.float32), (2 ** 42, 1, 1))
    with pytest.raises(InputError) as e:
        prog(huge)
    assert "buffer out" in str(e.value) and f"N = {2 ** 42}" in str(e.value) and "2**64" in str(e.value)


# -- x.T and transpose(axes) -----------------------------------------------------------------------------
def test_x_T_is_numpys_every_axis_reversed_eagerly_and_compiled():
    """Eagerly `x.T` of a [5, 3, 2] element is numpy's [2, 3, 5]; compiled code swapped the last two
    ([5, 2, 3]) without a word. Now the traced `x.T` means numpy's too (a permute of every axis);
    on 2-D and 1-D elements too."""
    xs = flist([2], (5, 3, 2), 0)
    assert tanh_rows(xs).map(lambda x: x.T).element_shape == (2, 3, 5)
    for shape in [(5, 3, 2), (3, 4), (4,)]:
        ys = flist([3], shape, 1)

        def f(ys):
            return ys.map(lambda y: y.T * 2.0)
        assert_same(ft.compile(f, ys)(ys), f(ys))
        assert np.array_equal(f(ys).to_numpy(), 2 * ys.to_numpy().transpose(0, *range(len(shape), 0, -1)))


@pytest.mark.parametrize("how", ["ft.transpose(x)", "ft.transpose(x, (0, 2, 1))", "x.transpose(0, 2, 1)",
                                 "x.transpose((0, 2, 1))", "ft.transpose(x, (-3, -1, -2))"])
def test_a_transpose_of_the_last_two_axes_compiles_and_equals_eager(how):
    xs = flist([3], (2, 4, 3), 2)

    def f(xs):
        return xs.map(lambda x: eval(how, {"ft": ft, "x": x}) + 1.0)
    assert f(xs).element_shape == (2, 3, 4)
    assert_same(ft.compile(f, xs)(xs), f(xs))


def test_transpose_with_other_axes_is_numpys_eagerly_and_compiled():
    xs = flist([3], (2, 4, 3), 3)

    def f(xs):
        return xs.map(lambda x: ft.transpose(x, (1, 0, 2)))
    assert np.array_equal(f(xs).to_numpy(), xs.to_numpy().transpose(0, 2, 1, 3))
    assert_same(ft.compile(f, xs)(xs), f(xs))
    with pytest.raises(ShapeError, match="not a permutation"):
        ft.transpose(rand((2, 3), 0), (0, 0))


# -- programs are functional: inputs never change ----------------------------------------------------
def add_in_place(xs):
    def f(x):
        x += 1.0
        return x
    return xs.map(f)


def accumulate_in_place(xs):
    def step(s, x):
        s += x  # the state, in place
        return s
    return xs.scanl(step)


@pytest.mark.parametrize("fn", [add_in_place, accumulate_in_place])
def test_in_place_arithmetic_changes_the_functions_own_value_only(fn):
    """Eagerly `x += 1` changed the caller's list (and its array), so a second call disagreed with
    the first; a user function now gets its own copy of each element, so it means `x = x + 1`,
    as it always did when traced."""
    a = rand((5, 2, 3), 4)
    keep = a.copy()
    xs = ft.FractalTensor.from_numpy(a, 1)
    first, second = fn(xs), fn(xs)
    assert np.array_equal(a, keep) and np.array_equal(xs.to_numpy(), keep)
    assert np.array_equal(first.to_numpy(), second.to_numpy())
    expected = keep + 1.0 if fn is add_in_place else np.cumsum(keep, axis=0)
    assert np.allclose(first.to_numpy(), expected)
    assert_same(ft.compile(fn, xs)(xs), first)


def zero_two_columns(xs):
    def f(x):
        x[:, 0:2] = 0.0  # setitem-here
        return x
    return xs.map(f)


def test_item_assignment_on_a_traced_value_is_an_in_place_error():
    """It was a raw TypeError; eagerly it changes the function's own copy."""
    xs = flist([3], (2, 4), 5)
    with pytest.raises(InPlaceError) as e:
        ft.compile(zero_two_columns, xs)
    at_line(e.value, "setitem-here")
    assert "`x[:, 0:2] = ...`" in str(e.value) and "float32[2, 4]" in str(e.value)
    before = xs.to_numpy()
    assert np.array_equal(zero_two_columns(xs).to_numpy()[:, :, :2], np.zeros((3, 2, 2)))
    assert np.array_equal(xs.to_numpy(), before)


def test_a_write_into_a_lists_element_is_an_in_place_error():
    """A list's elements are read-only views: a function given a whole inner list cannot write
    into it (eagerly; traced, lists have no item assignment at all)."""
    xss = flist([2, 3], (2, 2), 6)

    def f(xs):
        xs[0][0, 0] = 1.0  # list-write-here
        return xs

    with pytest.raises(InPlaceError) as e:
        xss.map(f)
    at_line(e.value, "list-write-here")
    with pytest.raises(ValueError, match="read-only"):
        xss[0][0][0, 0] = 1.0  # and outside a program, numpy's own error


# -- several threads at once ------------------------------------------------------------------------------
def gated_rows(xs, w, u):
    return xs.scanl(lambda h, x: ft.tanh(x @ w + h @ u), ft.zeros((1, 16)))


def test_tracing_analysis_and_compilation_from_four_threads_at_once():
    """The trace in progress was module-global: of 12 concurrent compiles 9 raised "trace() called
    while tracing". Each thread now traces on its own; 4 threads x (trace, analyze, compile, call)
    give what one thread gives, bit for bit, and what eager execution gives."""
    import threading
    xs, w, u = flist([6], (1, 16), 7), rand((16, 16), 8) / 4, rand((16, 16), 9) / 4
    ready, results, failures = threading.Barrier(4), {}, []

    def work(k):
        try:
            ready.wait()
            etdg = ft.trace(gated_rows, xs, w, u)
            prog = ft.analyze(gated_rows, xs, w, u)
            compiled = ft.compile(gated_rows, xs, w, u)
            compiled.threads.fixed = 1
            results[k] = (etdg.signature(), str(prog.schedule.map), compiled.source, compiled(xs, w, u).to_numpy())
        except Exception as e:  # reported below, with the thread
            failures.append((k, repr(e)))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not failures, failures
    one = ft.compile(gated_rows, xs, w, u)
    one.threads.fixed = 1
    expected = (ft.trace(gated_rows, xs, w, u).signature(), str(ft.analyze(gated_rows, xs, w, u).schedule.map),
                one.source, one(xs, w, u).to_numpy())
    for k in range(4):
        assert results[k][:3] == expected[:3]
        assert np.array_equal(results[k][3], expected[3])
    assert rel_error(expected[3], gated_rows(xs, w, u).to_numpy()) < 1e-5


def test_a_traced_value_used_in_another_thread_is_an_error():
    import threading
    kept, seen = [], []
    ft.trace(lambda xs: xs.map(lambda x: kept.append(x) or x * 2.0), flist([2], (1, 4), 0))

    def elsewhere():
        try:
            kept[0] * 3.0
        except Exception as e:
            seen.append(e)
    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert isinstance(seen[0], ft.errors.PolyftError) and "after its trace ended" in str(seen[0])


# -- valid programs that raised, and misuse that raised raw errors -----------------------------------------
def returned_twice(xs):
    y = xs.map(lambda x: ft.tanh(x))
    return y, y


def named_like_a_buffer(xs):
    a = xs.map(lambda x: ft.tanh(x))  # the tracer's buffer t0
    t1 = a.map(lambda x: x * 2.0)
    t0 = t1.map(lambda x: x + 1.0)
    return t0, t1


def returned_twice_among_others(xs):
    a = xs.map(lambda x: ft.tanh(x))
    return a, a.map(lambda x: x * 2.0), a


@pytest.mark.parametrize("fn", [returned_twice, named_like_a_buffer, returned_twice_among_others])
def test_valid_programs_that_were_single_assignment_errors(fn):
    """A value returned twice, or a variable named like an internal buffer, made two buffers of
    one name ("a buffer element is written twice"). Each output gets a buffer and a name of its own."""
    xs = flist([3], (1, 4), 10)
    prog = ft.compile(fn, xs)
    names = [b.name for b in prog.etdg.outputs]
    assert len(set(names)) == len(names) and len({b.name for b in prog.etdg.buffers}) == len(prog.etdg.buffers)
    assert_same(prog(xs), fn(xs))
    if fn is named_like_a_buffer:
        assert names == ["t0", "t1"]


def added(xs, ys):
    return ft.map(lambda x, y: x + y, xs, ys)


def test_keyword_arguments_by_the_functions_parameter_names():
    xs, ys = flist([3], (1, 4), 11), flist([3], (1, 4), 12)
    prog = ft.compile(added, xs, ys)
    for got in (prog(xs=xs, ys=ys), prog(ys=ys, xs=xs), prog(xs, ys=ys)):
        assert_same(got, added(xs, ys))
    for bad, fragment in [(lambda: prog(xs, zs=ys), "unknown or given twice: zs; missing: ys"),
                          (lambda: prog(xs, xs=xs), "unknown or given twice: xs; missing: ys")]:
        with pytest.raises(InputError) as e:
            bad()
        assert "takes (xs, ys)" in str(e.value) and fragment in str(e.value), str(e.value)


def test_pickling_a_program_says_what_to_do_and_deepcopy_shares_it():
    import copy
    import pickle
    xs = flist([3], (1, 4), 13)
    prog = ft.compile(tanh_rows, xs)
    for program in (prog, ft.analyze(tanh_rows, xs)):
        with pytest.raises(PolyftError) as e:
            pickle.dumps(program)
        assert e.value.op == "pickle" and "ft.compile" in str(e.value) and "fork" in str(e.value)
    assert copy.deepcopy(prog) is prog and copy.deepcopy([prog])[0] is prog
    assert_same(copy.deepcopy(prog)(xs), tanh_rows(xs))


@pytest.mark.parametrize("fn", [
    lambda xs: xs.map(lambda x: ft.tanh(x)),
    lambda xs: xs.scanl(lambda s, x: s + x, ft.zeros((1, 4))),
    lambda xs: xs.shift(1).map(lambda x: x * 2.0),
    lambda xs: xs.reduce(lambda s, x: s + x, ft.ones((1, 4))),
], ids=["map", "scanl", "shift", "reduce"])
def test_empty_lists_compile_from_concrete_inputs(fn):
    """A program traced from a list of length 0 has no instances: the storage mapping took the time
    space from the (empty) union of the schedule's maps, a raw IndexError."""
    empty = ft.FractalTensor.from_numpy(np.zeros((0, 1, 4), np.float32), 1)
    assert_same(ft.compile(fn, empty)(empty), fn(empty))


@pytest.mark.parametrize("fn", [lambda xs: xs[0:0].map(lambda x: x * 2.0),
                                lambda xs: xs.gather([]).map(lambda x: x * 2.0)], ids=["slice", "gather"])
def test_empty_accesses_of_a_list_compile(fn):
    xs = flist([3], (1, 4), 14)
    assert_same(ft.compile(fn, xs)(xs), fn(xs))


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int8", "int16", "uint64", "complex64"])
def test_numpy_inputs_of_a_dtype_compiled_code_lacks_are_a_dtype_error(dtype):
    """Eagerly x + x works on them; compiled, they were a KeyError in the C generator."""
    a = np.ones((1, 4), dtype=dtype)
    with pytest.raises(DTypeError) as e:
        ft.compile(lambda x: x + x, a)
    assert f"input x is {dtype}" in str(e.value) and ".astype(np.float32)" in str(e.value)
    mask = np.ones((1, 4), dtype=dtype)
    with pytest.raises(DTypeError) as e:
        ft.compile(lambda xs: xs.map(lambda x: x * mask), flist([2], (1, 4), 0))  # captured-here
    at_line(e.value, "captured-here")
    assert f"captured array {dtype}[1, 4]" in str(e.value)


@pytest.mark.parametrize("source", ["inputs", "specs"])
def test_a_schedule_naming_a_length_the_program_lacks_means_the_same_from_specs_and_inputs(source):
    """`[Q] -> {...: Q > 0}`: Q is not the program's, and a condition on it alone holds for some Q;
    from inputs it dropped out, from specs the schedule came out empty ("gives no time to S_b0, it
    gives none"). Both now schedule as without it; a time that depends on Q is a ScheduleError."""
    args = stacked_rnn.inputs("small", 0) if source == "inputs" else stacked_rnn.specs("small")
    plain = ft.analyze(stacked_rnn.program, *args, schedule="{ S_b0[i, j, k] -> [j + k, j, i] }")
    with_q = ft.analyze(stacked_rnn.program, *args, schedule="[Q] -> { S_b0[i, j, k] -> [j + k, j, i] : Q > 0 }")
    assert with_q.schedule.map.is_equal(plain.schedule.map)
    with pytest.raises(ScheduleError, match="depend on Q, which the program does not know"):
        ft.analyze(stacked_rnn.program, *args, schedule="[Q] -> { S_b0[i, j, k] -> [j + k + Q, j, i] }")


def test_one_compiled_program_called_from_four_threads_at_once():
    """Each call has its own buffers and scratch, and each calling thread its own OpenMP pool: 4
    threads x 10 calls (on the counts the program measures) give one call's bits."""
    xs, w, u = flist([6], (1, 16), 15), rand((16, 16), 16) / 4, rand((16, 16), 17) / 4
    prog = ft.compile(gated_rows, xs, w, u)
    expected = prog(xs, w, u).to_numpy()
    same = []
    in_threads(lambda: same.extend(np.array_equal(prog(xs, w, u).to_numpy(), expected) for _ in range(10)))
    assert len(same) == 40 and all(same)


def test_a_buffer_numpy_cannot_allocate_is_an_out_of_memory_error_naming_it(monkeypatch):
    """numpy's MemoryError for a call's output (simulated: a real one needs the memory to fail)."""
    from polyft import calls
    from polyft.errors import OutOfMemoryError
    prog = ft.compile(tanh_rows, ft.spec("[N]float32[1, 4096]"))
    xs = flist([3], (1, 4096), 18)
    real = np.empty

    def refuse_large(shape, *a, **k):  # the call's buffers, not other arrays (to_numpy's)
        if np.prod(shape) > 10_000 and sys._getframe(1).f_globals["__name__"] == calls.__name__:
            raise MemoryError("Unable to allocate")
        return real(shape, *a, **k)
    monkeypatch.setattr(calls.np, "empty", refuse_large)
    with pytest.raises(OutOfMemoryError) as e:
        prog(xs)
    assert "buffer out [3, 1, 4096] float32" in str(e.value) and isinstance(e.value, MemoryError)
    monkeypatch.undo()
    assert_same(prog(xs), tanh_rows(xs))
