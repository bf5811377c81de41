"""polyft: polyhedral scheduling of nested-list DNN programs (after FractalTensor, SOSP '24)."""
from . import errors
from .affine import Length
from .types import FTType, Spec, parse_type, spec
from .fractaltensor import FractalTensor, Zip, arange
from .operators import map, reduce, foldl, foldr, scanl, scanr, zip, product
from .elementmath import (tanh, sigmoid, exp, log, sqrt, relu, maximum, minimum, max, sum, mean,
                          softmax, concat, zeros, zeros_like, ones, full, matmul, transpose, log1p, softplus,
                          abs, pow, where, logsumexp, reshape, squeeze, unsqueeze, scatter_add, index_add,
                          sin, cos, tan, erf, gelu, rsqrt, sign, floor, clip, var, stack,
                          logical_and, logical_or, logical_xor, logical_not)
from .tracing import trace
from .autodiff import vjp, grad
from . import autodiff_rules  # noqa: F401  (registers the adjoints autodiff records with)

__version__ = "0.1.0"


_DRIVER = ("analyze", "compile")  # polyft.program: islpy, cgen and the targets load on first use


def __getattr__(name):
    """PEP 562: `ft.analyze` and `ft.compile` come from the driver, imported on first use."""
    if name in _DRIVER:
        from . import program
        return getattr(program, name)
    raise AttributeError(f"module 'polyft' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_DRIVER])
