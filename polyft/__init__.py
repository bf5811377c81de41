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
_INTEROP = {"torch": "interop_torch", "jax": "interop_jax"}  # ft.torch / ft.jax: torch and JAX are optional


def __getattr__(name):
    """PEP 562: `ft.analyze` and `ft.compile` come from the driver, `ft.torch` and `ft.jax` from
    the interop modules, each imported on first use (so `import polyft` imports neither torch nor JAX)."""
    if name in _DRIVER:
        from . import program
        return getattr(program, name)
    if name in _INTEROP:
        import importlib
        module = importlib.import_module(f".{_INTEROP[name]}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'polyft' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_DRIVER, *_INTEROP])
