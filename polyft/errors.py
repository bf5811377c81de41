"""One error family for everything polyft rejects.

Every error names the operator involved, the offending shapes or types, and the line
of the user's program it came from, so that a mistake is reported where it was made
and not deep inside numpy or islpy.
"""
from __future__ import annotations

import os
import sys
import traceback

_PKG_ROOTS = tuple(
    os.path.dirname(os.path.abspath(__file__)).rsplit(os.sep, 1)[0] + os.sep + name + os.sep
    for name in ("polyft", "deps", "schedule", "emit")
)
_USER_CODE_INSIDE = os.sep + "polyft" + os.sep + "workloads" + os.sep


def _is_library_file(filename: str) -> bool:
    if filename.startswith("<frozen") or os.path.basename(filename) == "polyft":
        return True  # the interpreter's machinery (runpy, importlib) and the console script
    path = os.path.abspath(filename)
    if _USER_CODE_INSIDE in path and not os.path.basename(path).startswith("_"):
        return False  # the bundled workloads are user programs too (not the registry and helpers)
    if "importlib" in path or path.startswith("<"):
        return True
    return path.startswith(_PKG_ROOTS)


def user_location(tb=None) -> str | None:
    """`file:line: source` of the innermost frame in user code.

    With a traceback, look there (the failing line of an eagerly run user function);
    otherwise look at the current call stack (the line that called a polyft operator).
    """
    frames = traceback.extract_tb(tb) if tb is not None else traceback.extract_stack()[:-1]
    for frame in reversed(frames):
        if not _is_library_file(frame.filename):
            src = (frame.line or "").strip()
            return f"{os.path.basename(frame.filename)}:{frame.lineno}: {src}"
    return None


def user_frames(tb) -> list:
    """The frames of a traceback that are in user code, outermost first."""
    return [frame for frame in traceback.extract_tb(tb) if not _is_library_file(frame.filename)]


class PolyftError(Exception):
    """Base of every error polyft raises for a program or input it rejects."""

    def __init__(self, message: str, *, op: str | None = None, where: str | None = None):
        self.op = op
        self.where = where if where is not None else user_location()
        self.detail = message
        parts = [f"{op}: {message}" if op else message]
        if self.where:
            parts.append(f"  at {self.where}")
        super().__init__("\n".join(parts))


class SpecError(PolyftError):
    """A malformed type string or spec."""


class ShapeError(PolyftError):
    """Static element shapes that do not fit an element operation."""


class DTypeError(PolyftError):
    """Element dtypes that do not fit an operation."""


class DepthError(PolyftError):
    """A FractalTensor of the wrong depth for an operator."""


class LengthMismatchError(PolyftError):
    """Lists zipped or mapped together that have different lengths."""


class StateTypeError(PolyftError):
    """An aggregate's state whose type changes between init and the function's result."""


class EmptyReduceError(PolyftError):
    """An aggregate without init over an empty list."""


class WindowError(PolyftError):
    """A window or slice that does not fit the list."""


class IndexRangeError(PolyftError):
    """An index (gather, element access) outside the list."""


class ReturnTypeError(PolyftError):
    """A user function that returns something other than a tensor, list or tuple of them."""


class TracerControlFlowError(PolyftError):
    """Python control flow (if, while, comparisons, int(), bool(), recursion) or a numpy function
    on a value known only at run time."""


class RaggedError(PolyftError):
    """A ragged list where a regular one is needed (to_numpy, tracing)."""


class InPlaceError(PolyftError):
    """An element changed in place (`x[:, 0] = 0` on a traced value, a write into a list's element):
    programs are functional, so a new value is built instead."""


class AccessError(PolyftError):
    """An access that is neither quasi-affine nor a declared gather."""


class SingleAssignmentError(PolyftError):
    """A buffer node written twice, breaking the single assignment property."""


class ScheduleError(PolyftError):
    """A schedule that violates a dependence, or that cannot be built."""


class CompileError(PolyftError):
    """The native compiler rejected generated source."""


class InputError(PolyftError):
    """Inputs at call time that do not match what a program was compiled for."""


class SettingError(PolyftError):
    """An environment variable or setting polyft reads (POLYFT_THREADS, OMP_NUM_THREADS,
    POLYFT_CC_TIMEOUT, a thread count) with a value it cannot use."""


class InputDepthError(DepthError, InputError):
    """A call-time input list of another depth than compiled for: the DepthError an operator raises
    for it eagerly, and an InputError like every other mismatched input."""


class DeviceError(PolyftError):
    """No usable GPU, or a kernel launch that failed."""


class OutOfMemoryError(PolyftError, MemoryError):
    """Generated code could not allocate what it needs at run time."""


def reraise_from_user_code(op: str, exc: BaseException) -> "PolyftError":
    """Turn a numpy error raised inside an eagerly run user function into a ShapeError.

    numpy's own message already names the shapes; we add the operator and the user's line.
    """
    where = user_location(sys.exc_info()[2])
    return ShapeError(f"{type(exc).__name__} in the user function: {exc}", op=op, where=where)
