"""The call path of a compiled program (`prog(*inputs)`, `prog.run_arrays`): what a call needs
beyond its inputs' data is computed once per set of input shapes, so the Python work of a call
does not grow with the data.

Per set of input shapes and dtypes (`CallPath.key`), the first call runs every check of
CompiledProgram._checked (lengths, assumptions, addressability, the schedule's limits) and keeps
the lengths; per schedule variant and lengths, a `_Plan` keeps each buffer's shape, the
constants as the code reads them, the lengths as the runtime takes them and the output tree.
Inputs that are contiguous and of the stored dtype are passed where they are (no copy).

Buffers a call allocates are recycled from the program's earlier calls, but only those nothing
references any more: an intermediate always (the program owns it), an output once the caller
has dropped every value that views it (its refcount says so: a FractalTensor, a numpy view, a
torch tensor from torch.from_numpy or a memoryview all hold a reference). A value a caller
holds is never overwritten by a later call; a dropped one lends its pages to the next call,
which then writes memory already mapped instead of faulting in fresh pages (a 256 KiB output
took 64 page faults a call when allocated afresh). The program keeps at most POOL sets of
these buffers alive between calls.

Programs with ragged inputs (lengths that are data) take CompiledProgram's general path.
"""
from __future__ import annotations

import ctypes
import math
import sys

import numpy as np

from polyft.emit.c_statements import native_dtype

from . import pytree
from .errors import InputError, OutOfMemoryError, RaggedError
from .fractaltensor import FractalTensor, _read_only

POOL = 2  # sets of recycled buffers a plan keeps between calls (one per concurrent caller, roughly)
MAX_KEYS = 256  # sets of input shapes remembered; beyond, the memory is cleared and starts again
CONSTANT = ("const", "index")  # the kinds of buffer whose values the program holds


def _free_count() -> int:
    """sys.getrefcount of an array that only a list references, read as _Plan.run reads it: 2 on
    CPython up to 3.13 (the list's and the argument's); measured, as interpreters that borrow
    the argument's reference report one less. Anything holding the array adds one."""
    probe = [np.empty(1)]
    return sys.getrefcount(probe[0])


_FREE = _free_count()


def constant(b) -> np.ndarray:
    """A constant buffer's array as the generated code reads it."""
    return np.ascontiguousarray(b.value, dtype=native_dtype(b.dtype))


def _same(dtype, native):
    """`native`, as the very object `dtype` where they are equal (the key compares by identity)."""
    return dtype if dtype == native else native


def contiguous(name: str, arr: np.ndarray, dtype) -> np.ndarray:
    """`arr` as the contiguous native-order array generated code reads (itself where it is one);
    OutOfMemoryError naming the input when the copy does not fit."""
    try:
        return np.ascontiguousarray(arr, dtype=dtype)
    except MemoryError:
        size = arr.size * np.dtype(dtype).itemsize
        why = ("broadcast (a stride of 0)" if 0 in arr.strides and arr.size > 1 else "strided, or not in native "
               "byte order") if not arr.flags.c_contiguous or arr.dtype != dtype else "contiguous"
        raise OutOfMemoryError(f"input {name} {list(arr.shape)} {arr.dtype} is {why}: the compiled code reads a "
                               f"contiguous copy, {size / 2**30:.3g} GiB, which cannot be allocated; pass a "
                               "contiguous array (np.ascontiguousarray) or use smaller lengths", op="call") from None


def allocate(b, shape) -> np.ndarray:
    """The array for buffer `b`; OutOfMemoryError naming it when numpy cannot allocate it."""
    try:
        return np.empty(shape, dtype=native_dtype(b.dtype))
    except MemoryError:
        size = math.prod(shape) * native_dtype(b.dtype).itemsize
        raise OutOfMemoryError(f"cannot allocate buffer {b.name} {list(shape)} {b.dtype} ({size / 2**30:.3g} GiB) for "
                               "this call: use smaller lengths", op="call") from None


class CallPath:
    """The call path of one CompiledProgram without ragged inputs (module docstring)."""

    def __init__(self, prog):
        self.prog = prog
        self.inputs = [(k, buf, np.dtype(buf.dtype), _same(np.dtype(buf.dtype), native_dtype(buf.dtype)))
                       for k, (_, buf) in enumerate(prog.etdg.inputs) if buf is not None]
        self.count = len(prog.etdg.inputs)
        self.captured = list(prog.traced.captured)
        self.index_checks = [(dict(prog.etdg.inputs)[c.ids], c) for c in getattr(prog.traced, "index_checks", ())]
        self.outputs = [(b, np.dtype(b.dtype), b.depth) for b in (b.resolve() for b in prog.etdg.outputs)]
        self.tree = pytree.structure(prog.etdg.out_tree)
        self._params = {}  # key -> the checked lengths
        self._plans = {}  # (variant name, lengths) -> _Plan

    def key(self, inputs) -> tuple:
        """(key, {buffer: array}): the inputs' shapes and list depths, and their arrays as the code
        reads them (in place); None for the key where an input is not contiguous in the stored dtype
        (the full check copies it, once it has checked the lengths), or a list is ragged (it names it)."""
        given, key = {}, []
        for k, buf, dtype, native in self.inputs:
            arg = inputs[k]
            if isinstance(arg, FractalTensor):
                try:
                    arr, depth = arg.dense_view(), arg.depth
                except RaggedError:  # the full check says what the program takes
                    return None, given
            else:
                arr, depth = np.asarray(arg), None
            if arr.dtype != dtype or dtype is not native or not arr.flags.c_contiguous:
                return None, given  # copied by the full check, after it has checked the lengths
            key.append((arr.shape, depth))
            given[buf] = arr
        return tuple(key), given

    def checked(self, inputs) -> tuple:
        """(lengths, their key, {buffer: array}) of the inputs, checked: in full the first time a
        key is seen."""
        for c in self.captured:  # the data of a constant can change between calls (not its shape)
            if c.changed():
                self.prog._checked(inputs)  # raises, naming it
        if len(inputs) != self.count:
            self.prog._checked(inputs)  # raises
        key, given = self.key(inputs)
        known = self._params.get(key)
        if known is None:
            params, checked = self.prog._checked(inputs)  # raises where a dtype is wrong (key None)
            known = params, tuple(sorted(params.items()))
            if key is None:
                return (*known, checked)
            if len(self._params) >= MAX_KEYS:
                self._params.clear()
            self._params[key] = known
        params, lengths = known
        for buf, check in self.index_checks:  # ids are data: checked every call
            check.check(given[buf], params, InputError)
        if getattr(self.prog, "_called_lengths", None):
            self.prog._called_lengths = {}
        return params, lengths, given

    def storage_after(self, inputs) -> dict:
        """{buffer: array} of the outputs once the program has run on `inputs`."""
        params, lengths, given = self.checked(inputs)
        return self.prog._on_schedule(params, lambda variant: self.plan(variant, params, lengths).run(given))

    def plan(self, variant, params, lengths) -> "_Plan":
        plan = self._plans.get((variant.name, lengths))
        if plan is None:
            if len(self._plans) >= MAX_KEYS:
                self._plans.clear()
            plan = self._plans[variant.name, lengths] = _Plan(variant, params, [b for b, _, _ in self.outputs])
        return plan

    def result(self, storage: dict):
        """The outputs (as assemble_outputs builds them) from the buffers the call ran on."""
        flat = []
        for b, dtype, depth in self.outputs:
            arr = storage[b]
            if arr.dtype != dtype:
                arr = arr.astype(dtype)
            flat.append(FractalTensor._wrap(_read_only(arr), depth, b.dtype) if depth else arr)
        return flat[0] if self.tree is None else pytree.unflatten(self.tree, flat)


class _Plan:
    """What a call of one schedule variant at one set of lengths needs besides its inputs: the
    shapes of the buffers a call makes (intermediates and outputs), the constants, and sets of
    made buffers from earlier calls (`_Work`) with the entry point's arguments ready for the C
    runtime (their addresses): a call writes only its inputs' addresses, and an output's where the
    caller still holds the previous one, so its Python work does not grow with the intermediates."""

    def __init__(self, variant, params, outputs):
        layout = variant.layout
        self.variant, self.params = variant, params
        self.buffers = layout.buffers
        self.fixed = {b: constant(b) for b in layout.buffers if b.kind in CONSTANT}
        self.made = [b for b in layout.buffers if b.kind not in CONSTANT and b.kind != "input"]
        self.shapes = [layout.shape(b, params) for b in self.made]
        self.made_at = [layout.slot(b) for b in self.made]
        self.inputs_at = [(j, b) for j, b in enumerate(layout.buffers) if b.kind == "input"]
        made = {id(b): k for k, b in enumerate(self.made)}
        self.outputs = [(b, made.get(id(b))) for b in outputs]  # (an output may be an input or a constant)
        self.handed_out = sorted({k for _, k in self.outputs if k is not None})
        caller = getattr(variant.runtime, "caller", None)
        self.pointers, self.call = caller(params) if caller is not None else (None, None)
        self.pool = []  # _Work sets from earlier calls

    def _work(self) -> "_Work":
        arrays = [allocate(b, shape) for b, shape in zip(self.made, self.shapes)]
        pointers = None
        if self.pointers is not None:
            pointers = self.pointers()
            for j, b in enumerate(self.buffers):
                if b in self.fixed:
                    pointers[j] = _address(self.fixed[b])
            for j, a in zip(self.made_at, arrays):
                pointers[j] = _address(a)
        return _Work(arrays, pointers)

    def run(self, given: dict) -> dict:
        """Run the variant on the `given` input arrays; {buffer: array} of the outputs."""
        work = self.pool.pop() if self.pool else self._work()  # list.pop: a set goes to one caller, across threads too
        arrays = work.arrays
        for k in self.handed_out:
            if sys.getrefcount(arrays[k]) != _FREE:  # a caller holds the last one: this call writes a new one
                arrays[k] = allocate(self.made[k], self.shapes[k])
                if work.pointers is not None:
                    work.pointers[self.made_at[k]] = _address(arrays[k])
        if self.call is not None:
            for j, b in self.inputs_at:
                work.pointers[j] = _address(given[b])
            self.call(work.pointers)
        else:
            storage = {**given, **self.fixed, **dict(zip(self.made, arrays))}
            self.variant.runtime([storage[b] for b in self.buffers], self.params)
        out = {b: arrays[k] if k is not None else given.get(b, self.fixed.get(b)) for b, k in self.outputs}
        if len(self.pool) < POOL:
            self.pool.append(work)
        return out


class _Work:
    """One set of the buffers a call makes, and the entry point's arguments pointing at them."""

    def __init__(self, arrays, pointers):
        self.arrays, self.pointers = arrays, pointers


def _data_pointer():
    """A function giving where an array's data start, cheaper than a.ctypes.data (which builds a
    ctypes object) or __array_interface__ (a dict, with the dtype described in Python): NumPy's
    PyArray_DATA, the `data` field that follows the object header in every ndarray (a field of
    NumPy's ABI, which C extensions compiled long ago still read). Checked against
    __array_interface__ on probe arrays; where the layout differs (another Python build), that."""
    offset = object.__basicsize__  # PyObject_HEAD
    read = ctypes.c_void_p.from_address

    def fast(a):
        return read(id(a) + offset).value

    def slow(a):
        return a.__array_interface__["data"][0]
    probes = [np.empty(3), np.empty((4, 5), np.float32)[1:], np.arange(7)[2:]]
    return fast if all(fast(a) == slow(a) for a in probes) else slow


_address = _data_pointer()
