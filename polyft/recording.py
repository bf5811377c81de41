"""Whether ft.vjp / ft.grad is recording now, and what computes an operation then.

The language's operators (operators, elementmath) sit below autodiff: they ask here, and the
autodiff modules register their handlers when they load (`HANDLERS`), so nothing below autodiff
imports it. Values being differentiated exist only once autodiff has loaded, so an operation
that finds a tape or such a value always finds the handlers too.
"""
from __future__ import annotations

import threading

_LOCAL = threading.local()  # .stack: the tapes being recorded, innermost last (None: paused)
HANDLERS: dict = {}  # "compute", "bind", "access", "rules" -> the autodiff modules' functions


def stack() -> list:
    if not hasattr(_LOCAL, "stack"):
        _LOCAL.stack = []
    return _LOCAL.stack


def recording():
    """The tape that operations on stand-ins are recorded on now (None: none, or paused while
    an operator computes its primal)."""
    s = stack()
    return s[-1] if s else None
