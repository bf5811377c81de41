"""The target protocol, after loopy's split of its `target/` from execution: a Target turns a
scheduled model into a Module (source text, buffer layout, whatever its runtime needs); a
Runtime loads a Module and runs it on numpy arrays. Targets: C (emit.c_target) and CUDA
(emit.cuda_target); runtimes: ctypes (emit.runtime_c), PyCUDA and the CUDA emulator
(emit.runtime_cuda); emit.targets pairs them under the names `ft.compile` takes.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


class Layout:
    """The buffers a program touches, in the order its entry point takes them."""

    def __init__(self, etdg):
        self.buffers = list({id(b.resolve()): b.resolve() for b in etdg.buffers}.values())
        self.index = {id(b): k for k, b in enumerate(self.buffers)}

    def slot(self, buf) -> int:
        return self.index[id(buf.resolve())]


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
    def generate(self, model, schedule, precision: str = "fp32") -> Module:
        """The module for `model` (deps.model.PolyModel) under `schedule` (schedule.Schedule)."""


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
