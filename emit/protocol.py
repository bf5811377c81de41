"""The target protocol, after loopy's split of its `target/` from execution: a Target turns a
scheduled model into a Module (source text, buffer layout, whatever its runtime needs); a
Runtime loads a Module and runs it on numpy arrays. Targets: C (emit.c_target) and CUDA
(emit.cuda_target); runtimes: ctypes (emit.runtime_c), PyCUDA and the CUDA emulator
(emit.runtime_cuda); emit.targets pairs them under the names `ft.compile` takes.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from polyft.schedule.storage import extents


class Layout:
    """The buffers a program touches, in the order its entry point takes them, and how each is
    stored: with a storage mapping (schedule.storage.Storage) a contracted buffer keeps only
    its cells; without one every buffer holds one element per instance. `local` (buffer name
    -> storage.Batch) names the buffers the target keeps in a per-thread scratch it allocates
    itself (their cells are those of one thread's batch); the caller allocates the others.
    `packed` names the read-only buffers of which a call keeps a packed copy (the C target's
    large shared matrices: c_target.packed_weights). `narrow` (buffer name -> C type) names the
    buffers global memory holds at half width (emit.halves; the CUDA target under fp16/bf16)."""

    def __init__(self, etdg, storage=None, local=None, packed=(), narrow=None):
        self.buffers = list({id(b.resolve()): b.resolve() for b in etdg.buffers}.values())
        self.index = {id(b): k for k, b in enumerate(self.buffers)}
        self.storage = storage
        self.local = dict(local or {})
        self.packed = frozenset(packed)
        self.narrow = dict(narrow or {})

    def slot(self, buf) -> int:
        return self.index[id(buf.resolve())]

    def batch(self, buf):
        """The storage.Batch of a local buffer's scratch; None for a buffer in global memory."""
        return self.local.get(buf.resolve().name)

    def dims(self, buf) -> list:
        """The stored list dims: Lengths, or ints (a modulus; 1 for a dropped dim)."""
        return self.storage.of(buf).cell_dims(self.batch(buf)) if self.storage else list(buf.resolve().dims)

    def cell(self, buf, idx: list) -> list:
        """An element's index (C expressions per list dim) as its cell's: None for a dropped dim."""
        if not self.storage:
            return list(idx)
        s, batch = self.storage.of(buf), self.batch(buf)
        return [s.cell_index(r, e, batch) for r, e in enumerate(idx)]

    def cells_shape(self, buf, params: dict) -> tuple:
        """The shape of the buffer's cells (one thread's scratch for a local buffer), for the
        lengths in `params`."""
        return extents(self.dims(buf), params, buf.resolve().dims) + tuple(buf.resolve().element_shape)

    def shape(self, buf, params: dict) -> tuple:
        """The array shape the caller allocates: the cells, nothing for a local buffer."""
        return (0,) if self.batch(buf) else self.cells_shape(buf, params)


@dataclass(frozen=True)
class Module:
    """What a target generates: the source text, the buffer layout, and the ISL parameters
    in the order the entry point takes their values."""
    source: str
    layout: Layout
    params: tuple


class Target(ABC):
    """Generates a Module for a polyhedral model under a schedule."""

    name = ""  # in messages: "the C target"
    precisions: tuple = ("fp32",)  # the matmul operand precisions it generates

    @abstractmethod
    def generate(self, model, schedule, precision: str = "fp32", storage=None) -> Module:
        """The module for `model` (deps.model.PolyModel) under `schedule` (schedule.Schedule),
        its buffers stored as `storage` (schedule.storage.Storage; None: uncontracted)."""


class Runtime(ABC):
    """Loads a Module; runs it on numpy arrays, one per layout buffer (contiguous, of
    c_statements.native_dtype), and the values of its parameters (name -> int)."""

    def __init__(self, module: Module):
        self.module = module

    @abstractmethod
    def bind(self, arrays: list, values: dict) -> tuple:
        """(run, fetch): `run()` runs the program on the arrays where the runtime keeps them
        (what a benchmark times), `fetch()` copies the outputs back into them."""

    def __call__(self, arrays: list, values: dict) -> None:
        run, fetch = self.bind(arrays, values)
        run()
        fetch()
