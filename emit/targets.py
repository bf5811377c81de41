"""The targets `ft.compile` knows, by name: the Target generating a module, and the Runtime
class running it."""
from __future__ import annotations

from polyft.errors import CompileError

from .c_target import CTarget
from .cuda_target import CudaTarget
from .runtime_c import CtypesRuntime
from .runtime_cuda import EMULATED_THREADS, EmulatedRuntime, PyCudaRuntime

TARGETS = {"c": (CTarget(), CtypesRuntime),
           "cuda": (CudaTarget(), PyCudaRuntime),
           "cuda-emulated": (CudaTarget(EMULATED_THREADS), EmulatedRuntime)}


def select(name: str, precision: str = "fp32") -> tuple:
    """(target, runtime class) for a target name, once the target is known to generate
    matmuls of `precision`."""
    if name not in TARGETS:
        raise CompileError(f"unknown target {name!r}; available: {', '.join(TARGETS)}", op="compile")
    target, runtime = TARGETS[name]
    if precision not in target.precisions:
        others = sorted({t.name for t, _ in TARGETS.values() if precision in t.precisions})
        if not others:
            known = dict.fromkeys(p for t, _ in TARGETS.values() for p in t.precisions)
            raise CompileError(f"unknown precision {precision!r}; available: {', '.join(known)}", op="compile")
        raise CompileError(f"precision {precision!r} is for the {' and '.join(others)} targets; the {target.name} "
                           f"target computes in {', '.join(target.precisions)}", op="compile")
    return target, runtime
