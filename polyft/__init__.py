"""polyft: polyhedral scheduling of nested-list DNN programs (after FractalTensor, SOSP '24)."""
from . import errors
from .types import FTType, Length, Spec, parse_type, spec
from .fractaltensor import FractalTensor, Zip
from .operators import map, reduce, foldl, foldr, scanl, scanr, zip, product
from .elementmath import (tanh, sigmoid, exp, log, sqrt, relu, maximum, minimum, max, sum, mean,
                          softmax, concat, zeros, zeros_like, ones, full, matmul, transpose)

__version__ = "0.1.0"


def trace(fn, *inputs_or_specs):
    """Trace `fn` on concrete inputs or `ft.spec`s into an ETDG (paper §4.4)."""
    from .tracing import trace as _trace
    return _trace(fn, *inputs_or_specs)


def analyze(fn, *inputs_or_specs, schedule="auto", sizes=None, coarsen=None):
    """Trace `fn`, coarsen it (with schedule="auto"), build its polyhedral model and
    dependences, and schedule it (no code generation)."""
    from .program import analyze as _analyze
    return _analyze(fn, *inputs_or_specs, schedule=schedule, sizes=sizes, coarsen=coarsen)


def compile(fn, *inputs_or_specs, target="c", schedule="auto", sizes=None, coarsen=None, precision="fp32"):
    """Trace, analyse, schedule and generate code for `fn` (target "c", "cuda" or
    "cuda-emulated"); call the result on inputs. `precision` of matmul operands on the CUDA
    targets: "fp32", or "tf32" / "fp16" / "bf16" on tensor cores where the tile shapes allow."""
    from .program import compile as _compile
    return _compile(fn, *inputs_or_specs, target=target, schedule=schedule, sizes=sizes, coarsen=coarsen,
                    precision=precision)
