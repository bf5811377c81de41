"""FractalTensor types: depth, programmable lengths (concrete or symbolic), element shape, dtype.

The type string is the paper's notation: `[N, L]float32[1, 512]` is a depth-2 list with
programmable lengths N (outer) and L, whose elements are static float32 tensors of shape
[1, 512]. `float32[512, 512]` (no brackets in front) is a plain static-shape tensor.
Lengths are `affine.Length` expressions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .affine import Length
from .errors import SpecError
from .names import written
from .ragged import Ragged
from .ragged import text as length_text

DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
          "int32": np.int32, "int64": np.int64}


def dtype_name(dtype) -> str:
    return np.dtype(dtype).name


@dataclass(frozen=True)
class FTType:
    """The type of a FractalTensor (depth >= 1) or of a static tensor (depth 0)."""

    lengths: tuple  # of Length, outermost first; () for a static tensor
    element_shape: tuple
    dtype: str = "float32"

    @property
    def depth(self) -> int:
        return len(self.lengths)

    def __str__(self):
        prog = f"[{', '.join(length_text(n) for n in self.lengths)}]" if self.lengths else ""
        return f"{prog}{self.dtype}[{', '.join(str(s) for s in self.element_shape)}]"

    @property
    def is_concrete(self) -> bool:
        return all(Length.of(n).is_concrete for n in self.lengths)

    def same_structure(self, other: "FTType") -> bool:
        """Equal depth, element shape and dtype (lengths may differ)."""
        return (self.depth == other.depth and tuple(self.element_shape) == tuple(other.element_shape)
                and self.dtype == other.dtype)


_TYPE_RE = re.compile(r"^\s*(?:\[(?P<prog>[^\]]*)\])?\s*(?P<dtype>[a-z]+\d*)\s*\[(?P<static>[^\]]*)\]\s*$")


def _number(tok: str) -> bool:
    """Whether `tok` is a whole number in ASCII digits (str.isdigit also takes '²', which int() refuses)."""
    return tok.isascii() and tok.isdigit()


def parse_type(text: str) -> FTType:
    """Parse `[N, L]float32[1, 512]` or `float32[512, 512]`."""
    m = _TYPE_RE.match(text)
    if not m:
        raise SpecError(f"cannot parse the type {text!r}; expected e.g. '[N, L]float32[1, 512]'", op="spec")
    dtype = m.group("dtype")
    if dtype not in DTYPES:
        raise SpecError(f"unknown dtype {dtype!r} in {text!r}; known: {', '.join(DTYPES)}", op="spec")
    lengths = []
    if m.group("prog") is not None:
        for tok in m.group("prog").split(","):
            tok = tok.strip()
            if not tok:
                raise SpecError(f"an empty programmable length in {text!r}", op="spec")
            ragged = tok.startswith("<=")  # `<=L`: a ragged level, each element at most L long
            if ragged and not lengths:
                raise SpecError(f"the outermost list level cannot be ragged (its length is one number): {text!r}",
                                op="spec")
            tok = tok[2:].strip() if ragged else tok
            if _number(tok):
                n = Length.of(int(tok))
            elif tok.isidentifier():
                n = Length.of(written(tok))  # any identifier: polyft.names spells it for ISL and C
            else:
                raise SpecError(f"a programmable length must be a number (ASCII digits) or a name (an "
                                f"identifier), not {tok!r} in {text!r}", op="spec")
            lengths.append(Ragged(n) if ragged else n)
        if not lengths:
            raise SpecError(f"a FractalTensor type needs at least one programmable length: {text!r}", op="spec")
        if any(isinstance(n, Ragged) for n in lengths[:-1]):
            raise SpecError(f"only the last list level may be ragged (`<=L`): {text!r}", op="spec")
    static = []
    for tok in m.group("static").split(",") if m.group("static").strip() else ():  # `int64[]`: scalars
        tok = tok.strip()
        if not _number(tok):
            raise SpecError(f"static dims must be integers (ASCII digits), got {tok!r} in {text!r}", op="spec")
        static.append(int(tok))
    return FTType(tuple(lengths), tuple(static), dtype)


@dataclass(frozen=True)
class Spec:
    """An abstract program input: a type whose lengths may be symbolic. Made by `ft.spec`."""

    type: FTType

    @property
    def depth(self):
        return self.type.depth

    @property
    def element_shape(self):
        return self.type.element_shape

    @property
    def dtype(self):
        return self.type.dtype

    def __str__(self):
        return str(self.type)

    __repr__ = __str__


def spec(text: str) -> Spec:
    """`ft.spec("[N, L]float32[1, 512]")`: an abstract input with symbolic lengths."""
    return Spec(parse_type(text))
