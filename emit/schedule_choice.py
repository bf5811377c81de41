"""The C target's choice between two schedules of one program, made by timing its calls.

The auto schedule's wavefront (§5) runs the layers of a stacked RNN side by side, so a step has
more parallel work the deeper the stack. But each step then touches every layer's weights: where
they outgrow the caches, a step streams them from memory, where the original order keeps one
layer's weights in cache for all its steps; and where the batch alone fills the cores, the
wavefront's parallelism buys nothing and its barrier every step costs. Which order wins depends
on the lengths, the caches, the cores and the load, known only when the program runs. Side by
side on a 2-core Zen 4 VM (stacked LSTM, H = 128, L = 32): N = 16, D = 32, auto 29.0 ms and
original 25.1; N = 4, D = 8, auto 2.0 ms and original 2.8.

So `ft.compile(..., schedule="auto")` for the C target also keeps the original order of the same
(coarsened) statements, `alternative="original"`, where it differs from the auto schedule: its
code is generated and compiled on the first call that tries it, and every call runs the schedule
measured faster for its lengths (emit.measured.MeasuredChoice; each schedule's first call is a
warm-up). Both run every statement instance once, on the same operands, and differ only in the
order of independent instances, so the choice does not change what is computed.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import islpy as isl

from polyft.errors import PolyftError
from polyft.schedule.schedule import ACCEPTED
from polyft.schedule.storage import storage_mapping

from .measured import MeasuredChoice


@dataclass
class Variant:
    """One schedule's generated code: the Module (source, layout) and the runtime running it."""
    name: str
    module: object
    runtime: object

    @property
    def layout(self):
        return self.module.layout


class ScheduleChoice:
    """The schedules a compiled program chooses between per call (module docstring).
    `schedules`: name -> Schedule (ISL strings: `.describe()`); `last`: the name of the latest
    call's; `fixed = name` pins one (None: measured); `built`: those compiled so far;
    `variant(name)`: its generated code (`.module.source`; the program's own `source` and
    `memory()` are its schedule='s)."""

    def __init__(self, schedules: dict, main: Variant, build):
        """`schedules`: name -> Schedule, `main`'s first; `build()`: the other's Variant."""
        self._variants = {main.name: main}
        self.schedules = dict(schedules)
        self._build = {name: build for name in self.schedules if name != main.name}
        self._lock = threading.Lock()
        self._choice = MeasuredChoice(list(self.schedules), warm_each=True)
        self._fixed = None
        self.last = None

    @property
    def options(self) -> tuple:
        return tuple(self.schedules)

    @property
    def fixed(self) -> str | None:
        return self._fixed

    @fixed.setter
    def fixed(self, name):
        if name is not None and name not in self.schedules:
            raise PolyftError(f"the program chooses between the schedules {', '.join(self.schedules)}; "
                              f"cannot pin {name!r}", op="schedule_choice")
        self._fixed = name

    @property
    def built(self) -> tuple:
        """The schedules whose code is compiled so far."""
        return tuple(n for n in self.schedules if n in self._variants)

    def best(self, key) -> str | None:
        """The schedule measured faster at the lengths `key` (None before both are)."""
        return self._choice.best(key)

    def variant(self, name: str) -> Variant:
        """The generated code of schedule `name`, built on first use."""
        with self._lock:
            if name not in self._variants:
                self._variants[name] = self._build.pop(name)()
        return self._variants[name]

    def run(self, key, call):
        """`call(variant)` on the schedule chosen for the lengths `key`; its result."""
        if self.fixed is not None:
            self.last = self.fixed
            return call(self.variant(self.fixed))

        def timed(name):
            self.last = name
            return call(self.variant(name))
        return self._choice.run(key, timed)


def schedule_choice(prog, alternative, generator, runtime, contract: bool) -> ScheduleChoice | None:
    """The choice for a CompiledProgram `prog` just built (None: it runs its one schedule).
    `alternative`: None (the original order where prog's schedule is "auto" on the C target),
    False (none), or a schedule= value."""
    if alternative is not None and alternative is not False and prog.target != "c":
        raise PolyftError(f"alternative= is for the C target, whose calls time the two schedules; the "
                          f"{prog.target} target runs one schedule: leave alternative unset", op="compile")
    if alternative is None:
        alternative = "original" if prog.target == "c" and prog.schedule.kind == "auto" else False
    if alternative is False:
        return None
    if not isinstance(alternative, (str, isl.Map, isl.UnionMap)):
        raise PolyftError(f"alternative= takes False (the schedule alone) or what schedule= takes ({ACCEPTED}); got "
                          f"the {type(alternative).__name__} {alternative!r}", op="compile")
    other = prog.schedule_as(alternative)
    if other.map.is_equal(prog.schedule.map):
        return None
    main = prog._variant
    name = other.kind if other.kind != main.name else f"{other.kind}-alternative"

    def build():
        storage = storage_mapping(prog.model, other, contract)
        module = generator.generate(prog.model, other, prog.precision, storage)
        return Variant(name, module, runtime(module, threads=prog._run.threads))
    return ScheduleChoice({main.name: prog.schedule, name: other}, main, build)
