"""Ragged lists compiled: a list level whose length varies per element, given at call time.

The polyhedral model sees a ragged level at its bound (`[N, <=L]`: at most L; the longest of a
concrete example), so domains stay rectangular and dependences are computed on the bounding
domain: an over-approximation, so a schedule legal for it is legal for every set of lengths.
What makes the program ragged is a guard per statement instance, `k < len[i]`, that the
generated code tests before running it (emit.c_family): instances past an element's length never
run, and their cells are never written.

`Ragged` is that length: a `Length` (its bound, which is what prints and what ISL gets) that
also names the call-time buffer of lengths and where to read it (`at`: one expression per
enclosing list level). Inside a traced program `at` is over iteration dims and view
placeholders; in a buffer's dims it is over the buffer's own coordinates (dims named `e<r>`,
op "coord"), so it survives copies of the ETDG.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .affine import Aff, IterDim, Length
from .errors import InputError, RaggedError


class Ragged(Length):
    """The length of a ragged level: at most `bound`; `lengths[at]` for each element."""

    def __init__(self, bound, lengths=None, at=(), last=None):
        b = Length.of(bound)
        super().__init__(b.terms, b.const, b.floors)
        self.bound = b
        self.lengths = lengths  # the etdg.Buffer of lengths (int64, one per element of the levels above)
        self.last = last  # the etdg.Buffer of lengths - 1 (where a fold over the level ends)
        self.at = tuple(Aff.of(a) for a in at)

    @property
    def text(self) -> str:
        """As a type string shows it: `<=L`."""
        return f"<={self.bound}"

    @property
    def guard(self) -> str:
        """As an ETDG printout shows an iteration dim's extent: `xss_len[i] <= 6`."""
        return f"{_name(self.lengths)}[{', '.join(map(str, self.at))}] <= {self.bound}"

    def substitute_dims(self, env: dict) -> "Ragged":
        """The same length with the dims of `at` replaced (env: IterDim -> Aff)."""
        return Ragged(self.bound, self.lengths, [a.substitute(env) for a in self.at], self.last)

    def __eq__(self, other):
        if not isinstance(other, Ragged):
            return False if isinstance(other, Length) else NotImplemented
        return (str(self.bound), _name(self.lengths), [str(a) for a in self.at]) == \
            (str(other.bound), _name(other.lengths), [str(a) for a in other.at])

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(("ragged", str(self.bound)))


def _name(buf) -> str | None:
    return None if buf is None else buf.resolve().name


def text(n) -> str:
    """A length as type strings show it (`<=L` for a ragged one)."""
    return n.text if isinstance(n, Ragged) else str(n)


def is_ragged(n) -> bool:
    return isinstance(n, Ragged)


def coordinate(r: int) -> IterDim:
    """The stand-in for a buffer's coordinate r in the `at` of a ragged buffer dim."""
    return IterDim(f"e{r}", 0, "coord")


def to_coordinates(n, order) -> Length:
    """A length in a buffer's dims: `at` over the dims/placeholders `order` (the buffer's
    coordinates, outermost first) rewritten over coordinate stand-ins."""
    if not isinstance(n, Ragged):
        return n
    env = {d: Aff.of(coordinate(r)) for r, d in enumerate(order)}
    missing = [d for a in n.at for d in a.dims if d not in env]
    if missing:
        raise RaggedError(f"a ragged length {n.text} escapes the lists that give its lengths (it depends on "
                          f"{missing}); return or store whole ragged lists", op="trace")
    return n.substitute_dims(env)


def from_coordinates(n, order) -> Length:
    """The inverse of `to_coordinates`: coordinates r -> `order[r]` (Affs, dims or placeholders)."""
    if not isinstance(n, Ragged):
        return n
    env = {d: Aff.of(order[int(d.name[1:])]) for a in n.at for d in a.dims if d.op == "coord"}
    return n.substitute_dims(env)


def ragged_length(n, op: str):
    """Refuse `op` on a ragged level (it would need the element's length as a static one)."""
    if isinstance(n, Ragged):
        raise RaggedError(f"{op} on a ragged level {n.text} (its length is known only when the program runs) is "
                          "not supported compiled; map or scanl/foldl over it (with init), or run eagerly", op=op)


# ---------------------------------------------------------------------------------------
# Call time


@dataclass
class RaggedInput:
    """A program input with a ragged level (its last list level)."""

    name: str  # the input
    level: int  # which list level is ragged (the last)
    bound: Length  # its bound
    lengths: object  # the etdg.Buffers of lengths and of lengths - 1 (matched by name in copies)
    last: object
    minimum: int = 0  # the shortest length the program can run (1 where it folds over the level)
    why: str = ""  # what needs that minimum, for the message
    example: np.ndarray | None = field(default=None, repr=False)  # the lengths of a concrete example


def lengths_of(x, level: int) -> np.ndarray:
    """The lengths of level `level` of the FractalTensor x (the levels above must be regular)."""
    levels = x._level_lengths()[:level]
    if any(len(s) > 1 for s in levels):
        raise RaggedError(f"only the last list level may be ragged compiled, got {x.type_string}", op="trace")
    shape = tuple(min(s, default=0) for s in levels)
    out = np.zeros(shape, dtype=np.int64)
    for idx in np.ndindex(*shape):
        node = x
        for i in idx:
            node = node._items[i]
        out[idx] = len(node._items)
    return out


def padded(x, level: int, lens: np.ndarray, width: int) -> np.ndarray:
    """x as a dense array whose ragged level is `width` long, zeros past each element's length."""
    out = np.zeros(lens.shape + (width,) + tuple(x.element_shape), dtype=x.dtype)
    for idx in np.ndindex(*lens.shape):
        node = x
        for i in idx:
            node = node._items[i]
        for k, item in enumerate(node._items):
            out[idx + (k,)] = item
    return out


def check_lengths(r: RaggedInput, lens: np.ndarray, bound: int) -> None:
    """Lengths within [minimum, bound], else an InputError naming the element (nothing runs)."""
    shown = str(bound) if str(r.bound) == str(bound) else f"{r.bound} = {bound}"
    for bad, what in ((lens < r.minimum, f"shorter than {r.minimum} ({r.why})" if r.minimum else "negative"),
                      (lens > bound, f"longer than the bound {shown} the program was compiled for")):
        if bad.any():
            k = tuple(int(v) for v in np.argwhere(bad)[0])
            raise InputError(f"input {r.name}: element {list(k)} has length {int(lens[k])}, {what}; nothing ran",
                             op="call")


def length_at(n: Ragged, prefix: tuple, lengths: dict) -> int:
    """The length of the ragged dim `n` in the list at `prefix` (the coordinates of the levels
    above it), read from a call's `lengths` (buffer name -> array of lengths)."""
    env = {d: prefix[int(d.name[1:])] for a in n.at for d in a.dims}
    return int(lengths[_name(n.lengths)][tuple(a.evaluate(env) for a in n.at)])


def used_elements(dims, lengths: dict, sizes: dict) -> int:
    """How many elements of a buffer with these list dims lie within the ragged lengths."""
    def count(prefix: tuple) -> int:
        level = len(prefix)
        if level == len(dims):
            return 1
        n = dims[level]
        extent = length_at(n, prefix, lengths) if isinstance(n, Ragged) else n.evaluate(sizes)
        if level + 1 == len(dims) or not any(isinstance(m, Ragged) for m in dims[level + 1:]):
            rest = int(np.prod([m.evaluate(sizes) for m in dims[level + 1:]], dtype=np.int64))
            return extent * rest
        return sum(count(prefix + (k,)) for k in range(extent))
    return count(())
