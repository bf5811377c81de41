"""The operator table (`primitives.PRIMITIVES`) and the tables keyed by its names elsewhere: every
primitive is reachable by users, differentiable (or refused by name), emitted by both targets,
modelled in ISL with its element access relation, and recorded from the numpy ufunc of its name;
every helper an emitted expression calls is defined in both targets' preludes."""
import re

import numpy as np

import polyft as ft
from polyft import tracing
from polyft.autodiff_rules import RULES
from polyft.emit import c_target, cuda_target
from polyft.emit.c_statements import _C_NAMES, _LOCAL, BINARY, UNARY, StatementBody
from polyft.emit.cuda_statements import CudaStatementBody
from polyft.primitives import PRIMITIVES
from polyft.schedule import lower

# primitives without an adjoint, each refused by name when differentiated (autodiff.bind): none now
NOT_DIFFERENTIABLE: set = set()
# Value's Python operators (and internal operations) that are no `ft.` function
OPERATORS = {"add": "__add__", "sub": "__sub__", "mul": "__mul__", "truediv": "__truediv__", "neg": "__neg__",
             "getitem": "__getitem__", "greater": "__gt__", "less": "__lt__", "greater_equal": "__ge__",
             "less_equal": "__le__", "equal": "__eq__", "not_equal": "__ne__", "permute": "transpose",
             "copy": None, "astype": "astype"}


def test_every_primitive_is_reachable_by_users():
    for name in PRIMITIVES:
        if name in tracing._NOT_FT:
            assert name in OPERATORS and (OPERATORS[name] is None or hasattr(tracing.Value, OPERATORS[name])), name
        else:
            assert callable(getattr(ft, name, None)), f"ft.{name}"
    assert set(tracing._NOT_FT) <= set(PRIMITIVES)


def test_every_primitive_has_an_adjoint_or_is_refused():
    for name in PRIMITIVES:
        assert (name in RULES) != (name in NOT_DIFFERENTIABLE), name
    assert set(RULES) <= set(PRIMITIVES)


def test_every_primitive_is_emitted_by_both_targets():
    for name in PRIMITIVES:
        for body in (StatementBody, CudaStatementBody):
            assert name in UNARY or name in BINARY or callable(getattr(body, f"_op_{name}", None)), (body, name)
    assert not set(UNARY) & set(BINARY) and set(UNARY) | set(BINARY) <= set(PRIMITIVES)


def test_elementwise_code_is_modelled_elementwise_in_isl():
    """What the targets compute element by element reads its operands element by element (broadcast):
    the access relation is exact, not the conservative all-to-all of unknown operations."""
    assert set(UNARY) <= lower._IDENTITY_OPS and set(BINARY) <= lower._BROADCAST_OPS
    assert lower._IDENTITY_OPS | lower._BROADCAST_OPS <= set(PRIMITIVES)


def _called(template: str) -> set:
    names = set()
    for f in ("", "f"):
        text = template.format(x="x", a="a", b="b", c="c", f=f)
        names |= set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text))
    return names


def test_every_function_an_expression_calls_is_defined_or_libm():
    """ft_ helpers are defined in both preludes (the C target's, the CUDA target's); any other name
    is C's or libm's and listed in _C_NAMES, so an outlined loop may call it."""
    c_prelude = c_target.PRELUDE
    cuda_prelude = cuda_target.PRELUDE + cuda_target.LIBRARY
    for name, template in {**UNARY, **BINARY}.items():
        for fn in _called(template):
            if _LOCAL.fullmatch(fn):
                for prelude in (c_prelude, cuda_prelude):
                    assert re.search(rf"#define {fn}\b|\b{fn}\s*\([^;]*\)\s*\{{", prelude), (name, fn)
            else:
                assert fn in _C_NAMES, (name, fn)


def test_numpy_ufuncs_of_a_primitives_name_record_it():
    for name in PRIMITIVES:
        ufunc = getattr(np, name, None)
        if isinstance(ufunc, np.ufunc):
            assert tracing._UFUNCS.get(ufunc) == name, name
    assert set(tracing._UFUNCS.values()) <= set(PRIMITIVES)
