"""The affine expression algebra: symbolic lengths, iteration dims, quasi-affine expressions.

* `Length`: a programmable length, a quasi-affine expression over named parameters (the
  symbolic lengths `N`, `L`, ...): integers, names, +, -, floor division by a positive
  integer, max with a constant. It prints as an ISL expression, so the same object is shown
  to the user and handed to islpy.
* `IterDim`: one iteration dim of a block node (or a placeholder for a list view's own dim).
* `Aff`: a quasi-affine expression over iteration dims with a `Length` offset: the rows of
  an access map and the sides of a `Constraint` (`expr >= 0` or `expr = 0`; `ge`, `eq`).
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np

from .errors import SpecError


def add_terms(a: dict, b: dict) -> dict:
    """The coefficients of a sum of two linear forms ({name: coefficient} each)."""
    terms = dict(a)
    for k, v in b.items():
        terms[k] = terms.get(k, 0) + v
    return terms


def _term(c: int, s: str) -> str:
    """The term `c * s` as printed: `s`, `-s` or `c*s`."""
    return s if c == 1 else f"-{s}" if c == -1 else f"{c}*{s}"


def _join(parts: list) -> str:
    """Printed terms as a sum: `a - b`, not `a + -b`."""
    text = parts[0]
    for s in parts[1:]:
        text += f" - {s[1:]}" if s.startswith("-") else f" + {s}"
    return text


class _Sum:
    """The operators a sum of terms derives from its own `of`, `+` and `* int` (Length, Aff)."""

    __slots__ = ()

    def __radd__(self, other):
        return self + other

    def __neg__(self):
        return self * -1

    def __sub__(self, other):
        return self + (-self.of(other))

    def __rsub__(self, other):
        return self.of(other) - self

    def __rmul__(self, k):
        return self * k


class Length(_Sum):
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

    def __mul__(self, k):
        k = int(k)
        return Length({n: v * k for n, v in self.terms.items()}, self.const * k,
                      tuple((f[0] * k,) + f[1:] for f in self.floors))

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
        parts = [_term(v, k) for k, v in sorted(self.terms.items())]
        parts += [_term(f[0], f"max({f[2]}, {f[3]})" if f[1] == "max" else f"floor(({f[1]})/{f[2]})")
                  for f in self.floors]
        if self.const or not parts:
            parts.append(str(self.const))
        return _join(parts)

    __repr__ = __str__


class IterDim:
    """One iteration dim of a block node (or a placeholder for a list view's own dim)."""

    _ids = itertools.count()

    def __init__(self, name: str, extent: Length, op: str | None = None):
        self.name = name
        self.extent = Length.of(extent)
        self.op = op  # "map", "scanl", ...; None for a view placeholder
        self.uid = next(IterDim._ids)

    @property
    def reversed(self) -> bool:
        """Right aggregates run their dim from the last index down."""
        return self.op in ("foldr", "scanr")

    def __repr__(self):
        return self.name


class Aff(_Sum):
    """sum(c * dim) + sum(c * floor(aff / d)) + offset, offset a (symbolic) `Length`."""

    __slots__ = ("terms", "offset", "divs")

    def __init__(self, terms=None, offset=0, divs=()):
        self.terms = {k: v for k, v in (terms or {}).items() if v != 0}
        self.offset = Length.of(offset)
        self.divs = tuple(d for d in divs if d[0] != 0)  # (coef, Aff, divisor)

    @staticmethod
    def of(x) -> "Aff":
        if isinstance(x, Aff):
            return x
        if isinstance(x, IterDim):
            return Aff({x: 1})
        return Aff(offset=x)

    def __add__(self, other):
        o = Aff.of(other)
        return Aff(add_terms(self.terms, o.terms), self.offset + o.offset, self.divs + o.divs)

    def __mul__(self, c: int):
        c = int(c)
        return Aff({k: v * c for k, v in self.terms.items()}, self.offset * c,
                   tuple((d[0] * c, d[1], d[2]) for d in self.divs))

    def floordiv(self, d: int) -> "Aff":
        if d == 1:
            return self
        if not self.terms and not self.divs and self.offset.is_concrete:
            return Aff(offset=self.offset.const // d)
        return Aff(divs=((1, self, d),))

    def mod(self, d: int) -> "Aff":
        return self - self.floordiv(d) * d

    def substitute(self, env: dict) -> "Aff":
        """Replace dims by Affs (dims not in env stay)."""
        out = Aff(offset=self.offset)
        for k, v in self.terms.items():
            out = out + (Aff.of(env[k]) * v if k in env else Aff({k: v}))
        for c, inner, d in self.divs:
            out = out + inner.substitute(env).floordiv(d) * c
        return out

    @property
    def dims(self) -> set:
        out = set(self.terms)
        for _, inner, _ in self.divs:
            out |= inner.dims
        return out

    @property
    def is_affine(self) -> bool:
        return not self.divs

    @property
    def constant_value(self):
        """The integer value when no dim and no parameter is left, else None."""
        if self.terms or self.divs or not self.offset.is_concrete:
            return None
        return self.offset.const

    def coefficient(self, dim) -> int:
        return self.terms.get(dim, 0)

    def evaluate(self, env: dict, params: dict | None = None) -> int:
        val = self.offset.evaluate(params or {})
        for k, v in self.terms.items():
            val += v * env[k]
        for c, inner, d in self.divs:
            val += c * (inner.evaluate(env, params) // d)
        return val

    def __str__(self):
        parts = [_term(v, k.name) for k, v in sorted(self.terms.items(), key=lambda kv: kv[0].uid)]
        parts += [_term(c, f"floor(({inner})/{d})") for c, inner, d in self.divs]
        off = str(self.offset)
        if off != "0" or not parts:
            parts.append(off)
        return _join(parts)

    __repr__ = __str__


@dataclass(frozen=True)
class Constraint:
    """`expr >= 0` (kind "ge") or `expr = 0` (kind "eq")."""

    expr: Aff
    kind: str = "ge"

    def substitute(self, env):
        return Constraint(self.expr.substitute(env), self.kind)

    def truth(self):
        """True/False when decidable without dims or parameters, else None."""
        v = self.expr.constant_value
        if v is None:
            return None
        return v >= 0 if self.kind == "ge" else v == 0

    def holds(self, env, params=None) -> bool:
        v = self.expr.evaluate(env, params)
        return v >= 0 if self.kind == "ge" else v == 0

    def __str__(self):
        # print "k >= 1" rather than "k - 1 >= 0" where the shape allows
        e = self.expr
        op = ">=" if self.kind == "ge" else "="
        off = e.offset
        if (e.terms or e.divs) and off.is_concrete and off.const != 0:
            lhs = Aff(e.terms, 0, e.divs)
            return f"{lhs} {op} {-off.const}"
        return f"{e} {op} 0"


def eq(a, b) -> Constraint:
    return Constraint(Aff.of(a) - Aff.of(b), "eq")


def ge(a, b) -> Constraint:
    return Constraint(Aff.of(a) - Aff.of(b), "ge")
