"""`ft.analyze`: trace, model, analyse and schedule a program (no code generation). The one
place where the language reaches into deps/ and schedule/, lazily, so that `import polyft`
stays light and the packages keep their left-to-right order."""
from __future__ import annotations

from .tracing import trace


class Program:
    """A traced program with its polyhedral model, dependences and schedule (§4.4–§5)."""

    def __init__(self, fn, args, schedule="auto", sizes=None):
        from deps.analyze import analyze
        from deps.model import build
        from schedule.schedule import make_schedule
        self.fn = fn
        self.etdg = trace(fn, *args)
        self.model = build(self.etdg, sizes)
        self.deps = analyze(self.model)
        self.schedule = make_schedule(self.model, self.deps, schedule)

    def original_schedule(self):
        from schedule.schedule import make_schedule
        return make_schedule(self.model, self.deps, "original")

    def __repr__(self):
        return f"<Program {self.etdg.signature()}, {self.schedule.kind} schedule>"


def analyze(fn, *inputs_or_specs, schedule="auto", sizes=None) -> Program:
    """Trace `fn`, build its ISL model and dependences, and schedule it.

    `schedule`: "auto" (the paper's reordering), "original" (the nest as written), or an ISL
    schedule (string or isl.UnionMap) to check and use. `sizes` (e.g. {"L": 8}) fixes
    symbolic lengths as an ISL context; with all lengths known, `sequential_steps` is set.
    """
    return Program(fn, inputs_or_specs, schedule, sizes)
