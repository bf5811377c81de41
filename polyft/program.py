"""`ft.analyze`: trace, model and analyse a program (and, with issue-by-issue growth, schedule
and compile it). The one place where the language reaches into deps/ and schedule/, lazily,
so that `import polyft` stays light and the packages keep their left-to-right order."""
from __future__ import annotations

from .tracing import trace


class Program:
    """A traced program with its polyhedral model and dependences (paper §4.4–§5)."""

    def __init__(self, fn, args, sizes=None):
        from deps.analyze import analyze
        from deps.model import build
        self.fn = fn
        self.etdg = trace(fn, *args)
        self.model = build(self.etdg, sizes)
        self.deps = analyze(self.model)

    def __repr__(self):
        return f"<Program {self.etdg.signature()}>"


def analyze(fn, *inputs_or_specs, sizes=None) -> Program:
    """Trace `fn` and build its ISL model and dependences; no code generation.

    `sizes` (e.g. {"L": 8}) fixes symbolic lengths as an ISL context.
    """
    return Program(fn, inputs_or_specs, sizes)
