"""FractalTensor types: depth, programmable lengths (concrete or symbolic), element shape, dtype.

The type string is the paper's notation: `[N, L]float32[1, 512]` is a depth-2 list with
programmable lengths N (outer) and L, whose elements are static float32 tensors of shape
[1, 512]. `float32[512, 512]` (no brackets in front) is a plain static-shape tensor.

Lengths are `Length` expressions: integers, parameter names, and the few operations that
access operators need (+, -, floor division by a positive integer, max with a constant).
They print as ISL quasi-affine expressions, so the same object is both shown to the user
and handed to islpy.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .errors import SpecError

DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
          "int32": np.int32, "int64": np.int64}


def dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def add_terms(a: dict, b: dict) -> dict:
    """The coefficients of a sum of two linear forms ({name: coefficient} each)."""
    terms = dict(a)
    for k, v in b.items():
        terms[k] = terms.get(k, 0) + v
    return terms


class Length:
    """A programmable length: a quasi-affine expression over named parameters."""

    __slots__ = ("terms", "const", "floors")

    def __init__(self, terms=None, const=0, floors=()):
        # value = const + sum(c * param) + sum(c * floor(inner / d)) + max-terms
        self.terms = {k: v for k, v in (terms or {}).items() if v != 0}
        self.const = int(const)
        self.floors = tuple(floors)  # tuples (coef, inner Length, divisor) or (coef, "max", a, b)

    @staticmethod
    def of(x) -> "Length":
        if isinstance(x, Length):
            return x
        if isinstance(x, (int, np.integer)):
            return Length(const=int(x))
        if isinstance(x, str):
            if not re.fullmatch(r"[A-Za-z_]\w*", x):
                raise SpecError(f"a length name must be an identifier, not {x!r}")
            return Length({x: 1})
        raise SpecError(f"a length must be an int or a name, not {type(x).__name__}")

    # -- algebra ---------------------------------------------------------------------
    def __add__(self, other):
        o = Length.of(other)
        return Length(add_terms(self.terms, o.terms), self.const + o.const, self.floors + o.floors)

    __radd__ = __add__

    def __neg__(self):
        return Length({k: -v for k, v in self.terms.items()}, -self.const,
                      tuple((-f[0],) + f[1:] for f in self.floors))

    def __sub__(self, other):
        return self + (-Length.of(other))

    def __rsub__(self, other):
        return Length.of(other) - self

    def __mul__(self, k):
        k = int(k)
        return Length({n: v * k for n, v in self.terms.items()}, self.const * k,
                      tuple((f[0] * k,) + f[1:] for f in self.floors))

    __rmul__ = __mul__

    def __floordiv__(self, d):
        d = int(d)
        if d <= 0:
            raise SpecError(f"floor division of a length by {d}")
        if d == 1:
            return self
        if self.is_concrete:
            return Length(const=self.const // d)
        return Length(floors=((1, self, d),))

    def clamp0(self) -> "Length":
        """max(self, 0): lengths never go negative."""
        if self.is_concrete:
            return Length(const=max(self.const, 0))
        if self.is_nonnegative:
            return self  # a sum of lengths (parameters are >= 0) is never negative: `L`, not `max(L, 0)`
        return Length(floors=((1, "max", self, 0),))

    @property
    def is_nonnegative(self) -> bool:
        """Certainly >= 0 for every value of the parameters (which are >= 0), judged by a lower
        bound: so clamping `max(L - 1, 0)` (reversing `xs.shift(1)`) or `floor((L - 1)/2) + 1`
        (the length of a strided window) keeps it as is."""
        return self.lower_bound() >= 0

    def lower_bound(self) -> float:
        """A lower bound over all parameter values >= 0 (-inf when a term can decrease)."""
        lb = float(self.const)
        if any(v < 0 for v in self.terms.values()):
            return float("-inf")
        for f in self.floors:
            if f[0] < 0:
                return float("-inf")
            if f[1] == "max":
                lb += f[0] * max(f[2].lower_bound(), f[3])
            else:
                inner = f[1].lower_bound()
                if inner == float("-inf"):
                    return inner
                lb += f[0] * (int(inner) // f[2])
        return lb

    # -- inspection ------------------------------------------------------------------
    @property
    def is_concrete(self) -> bool:
        return not self.terms and not self.floors

    @property
    def params(self) -> set:
        out = set(self.terms)
        for f in self.floors:
            out |= f[1].params if f[1] != "max" else f[2].params
        return out

    def evaluate(self, env: dict | None = None) -> int:
        env = env or {}
        val = self.const
        for k, v in self.terms.items():
            if k not in env:
                raise SpecError(f"no value for the length parameter {k}")
            val += v * int(env[k])
        for f in self.floors:
            if f[1] == "max":
                val += f[0] * max(f[2].evaluate(env), f[3])
            else:
                val += f[0] * (f[1].evaluate(env) // f[2])
        return val

    def substitute(self, env: dict) -> "Length":
        """Replace the parameters that env names by integers; keep the others symbolic."""
        out = Length(const=self.const)
        for k, v in self.terms.items():
            out = out + (Length(const=v * int(env[k])) if k in env else Length({k: v}))
        for f in self.floors:
            if f[1] == "max":
                inner = f[2].substitute(env)
                out = out + (inner.clamp0() * f[0] if f[3] == 0 else Length(floors=((f[0], "max", inner, f[3]),)))
            else:
                out = out + (f[1].substitute(env) // f[2]) * f[0]
        return out

    def __int__(self):
        if not self.is_concrete:
            raise SpecError(f"the length {self} is symbolic")
        return self.const

    def __index__(self):
        return int(self)

    def __eq__(self, other):
        try:
            o = Length.of(other)
        except SpecError:
            return NotImplemented
        return str(self) == str(o)

    def __hash__(self):
        return hash(str(self))

    def __str__(self):
        parts = []
        for k, v in sorted(self.terms.items()):
            parts.append((k if v == 1 else f"-{k}" if v == -1 else f"{v}*{k}", v))
        for f in self.floors:
            if f[1] == "max":
                s = f"max({f[2]}, {f[3]})"
            else:
                s = f"floor(({f[1]})/{f[2]})"
            parts.append((s if f[0] == 1 else f"-{s}" if f[0] == -1 else f"{f[0]}*{s}", f[0]))
        if self.const or not parts:
            parts.append((str(self.const), self.const))
        text = parts[0][0]
        for s, v in parts[1:]:
            text += f" - {s[1:]}" if s.startswith("-") else f" + {s}"
        return text

    __repr__ = __str__


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
        prog = f"[{', '.join(str(n) for n in self.lengths)}]" if self.lengths else ""
        return f"{prog}{self.dtype}[{', '.join(str(s) for s in self.element_shape)}]"

    @property
    def is_concrete(self) -> bool:
        return all(Length.of(n).is_concrete for n in self.lengths)

    def same_structure(self, other: "FTType") -> bool:
        """Equal depth, element shape and dtype (lengths may differ)."""
        return (self.depth == other.depth and tuple(self.element_shape) == tuple(other.element_shape)
                and self.dtype == other.dtype)


_TYPE_RE = re.compile(r"^\s*(?:\[(?P<prog>[^\]]*)\])?\s*(?P<dtype>[a-z]+\d*)\s*\[(?P<static>[^\]]*)\]\s*$")


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
            lengths.append(Length.of(int(tok)) if tok.isdigit() else Length.of(tok))
        if not lengths:
            raise SpecError(f"a FractalTensor type needs at least one programmable length: {text!r}", op="spec")
    static = []
    for tok in m.group("static").split(","):
        tok = tok.strip()
        if not tok.isdigit():
            raise SpecError(f"static dims must be integers, got {tok!r} in {text!r}", op="spec")
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
