"""Bad input of every class gets a clear `polyft.errors` exception, not a raw error from deep inside
numpy or islpy, nor a silently wrong result (issue 13, items 7-9).

Each test checks the class, the operator (`err.op`), the offending value / type / shape in the
message, and that `err.where` is the line of this file that did it (tagged `# <tag>`). Where the fix
was to accept the input (numpy ufuncs on traced values, any integer gather index, a gather of a
gather, an `isl.UnionMap` schedule), the test checks the compiled result against eager execution.
"""
import pathlib

import islpy as isl
import numpy as np
import pytest
from helpers import assert_same, rand

import polyft as ft
from polyft.errors import (DepthError, DTypeError, IndexRangeError, LengthMismatchError, PolyftError,
                           ScheduleError, SpecError, TracerControlFlowError, WindowError)
from polyft.etdg import ops

pytestmark = pytest.mark.usefixtures("compile_cache")  # conftest.py: a temporary POLYFT_CACHE

SOURCE = pathlib.Path(__file__).read_text().splitlines()
XS = ft.FractalTensor.from_numpy(rand((3, 1, 4), 0), 1)
W = rand((4, 4), 1)
SPEC = ft.spec("[L]float32[1, 4]")
ELEMENT = "float32[1, 4]"


def program(xs, w):
    return xs.map(lambda x: ft.tanh(x @ w))


def check(info, op, tag, *fragments):
    """The error names `op`, every fragment, and the line of this file tagged `# <tag>`."""
    err = info.value
    assert isinstance(err, PolyftError) and err.op == op, (err.op, str(err))
    lines = [n for n, text in enumerate(SOURCE, 1) if text.rstrip().endswith(f"# {tag}")]
    assert len(lines) == 1, tag
    assert err.where is not None and err.where.startswith(f"test_bad_input.py:{lines[0]}: "), err.where
    for fragment in fragments:
        assert fragment in str(err), (fragment, str(err))


# -- 7. Python and numpy on traced values ------------------------------------------------------

def endless(xs, w):
    return endless(xs, w)  # recursion-here


def endless_inside_map(xs, w):
    return xs.map(lambda x: endless_inside_map(xs, w))  # nested-recursion-here


def branch_on_sign(x):
    if x > 0:  # if-here
        return x
    return -x


def loop_while_positive(x):
    while x.sum() > 0:  # while-here
        x = x - 1.0
    return x


@pytest.mark.parametrize("f, tag, fragments", [
    (branch_on_sign, "if-here", ["`>`", ELEMENT, "Python int 0"]),
    (loop_while_positive, "while-here", ["`>`", "float32[]", "Python int 0"]),
    (lambda x: x if x == 0.5 else -x, "eq-here", ["`==`", ELEMENT, "Python float 0.5"]),  # eq-here
    (lambda x: x * bool(x), "bool-here", [ELEMENT, "bool()"]),  # bool-here
])
def test_python_control_flow_on_a_traced_value(f, tag, fragments):
    """A comparison or branch on a traced value cannot be decided while tracing."""
    with pytest.raises(TracerControlFlowError) as info:
        ft.trace(lambda xs: xs.map(f), XS)
    check(info, "control flow", tag, *fragments)


@pytest.mark.parametrize("f, tag, op, fragments", [
    (lambda x: np.sum(x), "np-sum-here", "np.sum", ["ft.sum", ELEMENT]),  # np-sum-here
    (lambda x: np.concatenate([x, x]), "np-concat-here", "np.concatenate", ["ft.concat"]),  # np-concat-here
    (lambda x: np.cbrt(x), "np-cbrt-here", "np.cbrt", ["element math", ELEMENT]),  # np-cbrt-here
    (lambda x: np.exp(x, dtype=np.float64), "np-kw-here", "np.exp", ["dtype=", "ft.exp"]),  # np-kw-here
    (lambda x: np.asarray(x), "np-asarray-here", "np.array", ["element math", ELEMENT]),  # np-asarray-here
])
def test_numpy_function_on_a_traced_value_names_the_polyft_one(f, tag, op, fragments):
    """numpy cannot compute on a traced value; the error says what to use instead."""
    with pytest.raises(TracerControlFlowError) as info:
        ft.trace(lambda xs: xs.map(f), XS)
    check(info, op, tag, *fragments)


def test_numpy_ufuncs_of_the_operator_table_are_traced_as_polyft_ops():
    """`np.tanh(x)` in a traced function is `ft.tanh(x)`: the same program runs eagerly and compiled."""
    def f(xs, w):
        return xs.map(lambda x: np.maximum(np.tanh(np.matmul(x, w)), np.add(x, -0.25)) * np.exp(-x))

    assert {"tanh", "maximum", "matmul", "add", "exp", "neg"} <= {op.op for op in ops(ft.trace(f, XS, W).root)}
    assert_same(ft.compile(f, XS, W)(XS, W), f(XS, W))


@pytest.mark.parametrize("method", ["map", "window", "reduce", "gather"])
def test_list_operator_on_a_tensor_element_is_a_depth_error(method):
    with pytest.raises(DepthError) as info:
        ft.trace(lambda xs: xs.map(lambda x: getattr(x, method)(ft.tanh)), XS)  # element-method-here
    check(info, method, "element-method-here", f"`.{method}`", ELEMENT, "depth 0")


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("expr, tag, op, fragments", [
    (lambda xs: xs * 2.0, "times-float-here", "*", ["Python float 2.0"]),  # times-float-here
    (lambda xs: 2.0 / xs, "float-over-here", "/", ["Python float 2.0"]),  # float-over-here
    (lambda xs: xs + xs, "list-plus-here", "+", []),  # list-plus-here
    (lambda xs: np.tanh(xs), "np-on-list-here", "np.tanh", []),  # np-on-list-here
])
def test_arithmetic_on_a_list_is_a_depth_error(traced, expr, tag, op, fragments):
    """Arithmetic works on the elements; on a list it would be Python's list repetition or numpy's
    densification, eagerly and traced alike."""
    with pytest.raises(DepthError) as info:
        ft.trace(expr, XS) if traced else expr(XS)
    check(info, op, tag, "the list [3]float32[1, 4]", "map", *fragments)


def test_tensor_plus_list_inside_a_traced_function_is_a_depth_error():
    with pytest.raises(DepthError) as info:
        ft.trace(lambda xs: xs.map(lambda x: x + xs), XS)  # tensor-plus-list-here
    check(info, "add", "tensor-plus-list-here", "[3]float32[1, 4]")


@pytest.mark.parametrize("fn, tag", [(endless, "recursion-here"),
                                     (endless_inside_map, "nested-recursion-here")])
def test_endless_recursion_while_tracing_names_the_function(fn, tag):
    with pytest.raises(TracerControlFlowError) as info:
        ft.trace(fn, XS, W)
    check(info, "trace", tag, f"{fn.__name__} recursed", "recursion limit")


# -- 8. gather, window and sizes -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"])
def test_gather_takes_indices_of_every_integer_dtype(dtype):
    def f(xs, w):
        return xs.gather(np.array([2, 0, 2], dtype=dtype)).map(lambda x: ft.tanh(x @ w))

    assert_same(ft.compile(f, XS, W)(XS, W), f(XS, W))


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("indices, fragment", [(np.array([0.0, 1.0]), "float64"),
                                               (np.array([True, False]), "bool")])
def test_gather_with_non_integer_indices_is_a_dtype_error(traced, indices, fragment):
    with pytest.raises(DTypeError) as info:
        ft.trace(lambda xs: xs.gather(indices), XS) if traced else XS.gather(indices)  # gather-dtype-here
    check(info, "gather", "gather-dtype-here", fragment, "integer dtype", "uint64")


@pytest.mark.parametrize("arg, bound", [(XS, "[0, 3)"), (SPEC, "[0, 2**63)")])
def test_gather_index_past_int64_is_an_index_range_error(arg, bound):
    """A uint64 index past int64 must not wrap around to a negative position."""
    big = np.array([1, 2**63 + 5], dtype=np.uint64)
    with pytest.raises(IndexRangeError) as info:
        ft.trace(lambda xs: xs.gather(big), arg)  # gather-big-here
    check(info, "gather", "gather-big-here", str(2**63 + 5), bound, "uint64")


@pytest.mark.parametrize("f", [
    lambda xs, w: xs.gather([2, 0, 1]).gather([1, 0, 0]).map(lambda x: ft.tanh(x @ w)),
    lambda xs, w: xs.gather([0, 2, 1]).reverse().gather([2, 0]).scanl(lambda s, x: ft.tanh(s @ w + x)),
    lambda xs, w: xs.shift(1).gather(np.array([1, 0, 1], dtype=np.int8)).map(lambda x: x @ w),
], ids=["gather of a gather", "gather of a reversed gather", "gather of a shifted list"])
def test_gather_of_a_gathered_or_shifted_view_composes_the_indices(f):
    for args in ((XS, W), (SPEC, W)):
        assert_same(ft.compile(f, *args)(XS, W), f(XS, W))


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("size, padding, fragment", [(2, 2**40, "1099511627776"), (2, (0, 2), "(0, 2)"),
                                                     (3, -1, "(-1, -1)")])
def test_window_padding_out_of_bounds_is_a_window_error(traced, size, padding, fragment):
    """Padding on a side must be less than the window: more only adds windows of zeros (and a
    padding of 2**40 would allocate terabytes)."""
    with pytest.raises(WindowError) as info:
        ft.trace(lambda xs: xs.window(size, 1, padding), XS) if traced else XS.window(size, 1, padding)  # pad-here
    check(info, "window", "pad-here", fragment, "padding < size")


@pytest.mark.parametrize("value", ["abc", 2.5, -1, True, 2**70, None])
def test_sizes_must_be_lengths(value):
    with pytest.raises(SpecError) as info:
        ft.analyze(program, SPEC, W, sizes={"L": value})  # sizes-here
    check(info, "sizes", "sizes-here", f"'L': {value!r}", type(value).__name__)


def test_sizes_checked_by_compile_and_must_name_lengths():
    with pytest.raises(SpecError) as info:
        ft.compile(program, SPEC, W, sizes={"L": "8"})  # compile-sizes-here
    check(info, "sizes", "compile-sizes-here", "'L': '8'", "str")
    with pytest.raises(LengthMismatchError) as info:
        ft.analyze(program, SPEC, W, sizes={"M": 3})  # unknown-size-here
    check(info, "sizes", "unknown-size-here", "['M']", "['L']")
    with pytest.raises(SpecError) as info:
        ft.analyze(program, SPEC, W, sizes=[("L", 3)])  # sizes-list-here
    check(info, "sizes", "sizes-list-here", "dict", "list")
    assert ft.analyze(program, SPEC, W, sizes={"L": np.int64(3)}).model.sizes == {"L": 3}


# -- 9. schedules ----------------------------------------------------------------------------------

@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("schedule", [12345, None, 1.5, ["auto"]])
def test_schedule_of_the_wrong_type_is_a_schedule_error(compile, schedule):
    """Anything but the accepted kinds was silently taken as the original schedule."""
    with pytest.raises(ScheduleError) as info:
        (ft.compile if compile else ft.analyze)(program, XS, W, schedule=schedule)  # schedule-type-here
    check(info, "schedule", "schedule-type-here", repr(schedule), '"auto"', '"original"', "ISL", "isl.UnionMap")


@pytest.mark.parametrize("make", [isl.UnionMap, isl.Map, str], ids=["UnionMap", "Map", "string"])
def test_user_schedule_as_an_isl_object_or_string(make):
    text = "{ S_b0[i] -> [2 - i, 0] }"  # the map's instances backwards: they are independent
    prog = ft.compile(program, XS, W, schedule=make(text))
    assert prog.schedule.kind == "user"
    assert prog.schedule.map.is_equal(isl.UnionMap(text).intersect_domain(isl.UnionSet("{ S_b0[i] : 0 <= i < 3 }")))
    assert_same(prog(XS, W), program(XS, W))


@pytest.mark.parametrize("text, fragments", [
    ("{ S_b0[i, j] -> [0, i, j] }", ["S_b0", "2 dims", "S_b0[i]"]),
    ("{ S_b0[] -> [0] }", ["S_b0", "0 dims", "S_b0[i]"]),
])
def test_user_schedule_of_the_wrong_arity_names_the_statement(text, fragments):
    with pytest.raises(ScheduleError) as info:
        ft.analyze(program, XS, W, schedule=text)  # arity-here
    check(info, "schedule", "arity-here", *fragments)


def two_maps(xs, w):
    return xs.map(ft.tanh), xs.map(lambda x: x @ w)


def test_user_schedule_with_time_vectors_of_different_lengths():
    with pytest.raises(ScheduleError) as info:
        ft.analyze(two_maps, XS, W, schedule="{ S_b0[i] -> [0, i]; S_b1[i] -> [1, i, 0] }")  # width-here
    check(info, "schedule", "width-here", "S_b1 gets 3 dims", "S_b0 gets 2", "pad")


@pytest.mark.parametrize("fn, args, text, fragments", [
    (program, (XS, W), "{ S_b0[i] -> [0, 0] }", ["S_b0[1] and S_b0[0]", "[0, 0]"]),
    (program, (SPEC, W), "{ S_b0[i] -> [0] }", ["S_b0[", "(for L = "]),
    (two_maps, (XS, W), "{ S_b0[i] -> [i, 0]; S_b1[i] -> [i, 0] }", ["S_b0[", "S_b1["]),
])
def test_user_schedule_running_two_instances_at_one_time(fn, args, text, fragments):
    """Nothing would order the two instances."""
    with pytest.raises(ScheduleError) as info:
        ft.compile(fn, *args, schedule=text)  # collision-here
    check(info, "schedule", "collision-here", "two instances at one time", *fragments)
