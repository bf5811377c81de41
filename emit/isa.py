"""The instruction set the generated C is built for, and what follows from it.

The C target's code is compiled with `-march=<level>`: `native` (this CPU) unless
$POLYFT_MARCH names another level, so that one host can build and measure the code another
machine would get (an AVX-512 host measuring the AVX2 code most laptops and cloud VMs run).
The level decides the vector width and so the GEMM micro-kernel: its accumulators must fit in
the vector registers of that ISA, or the compiler keeps them on the stack and every FMA reads
and writes memory (a 64-byte GCC vector type on an AVX2 core: 20x slower). The level's
instruction-set macros are part of the compile cache key (runtime_c.build).

Micro-kernels (rows x vectors of accumulators, a vector holding `lanes` floats), in the style
of BLIS: AVX-512 8 x 2 of 16 floats (16 of 32 zmm registers, the rest for the right matrix's
row and the broadcast), AVX2 and AVX 6 x 2 of 8 (12 of 16 ymm, the 6 x 16 of BLIS and
OpenBLAS), SSE2 4 x 2 of 4 (8 of 16 xmm: without FMA each product needs a register of its
own before the add; 4 x 3 spills; SSE has no broadcast load, so a row block's left elements
are splatted into vectors once, `Isa.splat`), NEON 8 x 2 of 4 (16 of
32 q registers), and a portable 4 x 2 of 4 where the compiler knows no vector unit (GCC lowers
its vector types to whatever the target has).
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import shutil
from typing import NamedTuple

from polyft.errors import CompileError

from . import tool

ENV = "POLYFT_MARCH"

# the -march levels a test or benchmark builds for on each machine, from the oldest
LEVELS = {"x86_64": ("x86-64", "haswell", "skylake-avx512"), "aarch64": ("armv8-a",)}


class Isa(NamedTuple):
    """What the generated C may use: the level's name (`avx512`, `avx2`, ...), the floats in
    one vector register, the GEMM micro-kernel (rows, vectors) and whether it fuses
    multiply-adds (the peak counts two flops per lane and FMA unit, else one per unit)."""
    name: str
    lanes: int
    kernel: tuple
    fma: bool

    @property
    def splat(self) -> bool:
        """SSE has no load that broadcasts a float to a vector: the micro-kernel would spend a
        load and a shuffle on every left element it multiplies, in the inner loop (59% of the
        peak on a Zen 4 core at 4 x 2, 71-72% with the elements splatted once per row block)."""
        return self.name in ("sse2", "sse4")

    @property
    def micro_kernel(self) -> "Kernel":
        """The GEMM micro-kernel the generated C uses on this ISA."""
        return Kernel(*self.kernel, self.lanes, self.splat)


class Kernel(NamedTuple):
    """The GEMM micro-kernel of the generated C: rows x vectors of accumulators, floats per
    vector, and whether a row block's left elements are splatted into vectors before its
    columns are walked (Isa.splat)."""
    rows: int
    vectors: int
    lanes: int
    splat: bool = False


def march() -> str:
    """The -march level of the generated C: $POLYFT_MARCH, else native."""
    return os.environ.get(ENV, "").strip() or "native"


def compiler(cc=None) -> str:
    cc = cc or os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise CompileError(f"no C compiler {cc!r} on PATH (set CC)", op="compile")
    return cc


@functools.lru_cache(maxsize=None)
def features(level: str | None = None, cc: str | None = None) -> frozenset:
    """The instruction-set macros `cc -march=level` defines (`__AVX512F__`, `__AVX2__`,
    `__FMA__`, `__SSE2__`, `__ARM_NEON`, ...). Empty when there is no compiler to ask, or
    when it fails on native too (the build reports what is wrong with it); another level it
    rejects raises CompileError (a misspelt $POLYFT_MARCH must not build for some default
    silently)."""
    level = level or march()
    try:
        cc = compiler(cc)
    except CompileError:
        return frozenset()
    r = tool.run([cc, f"-march={level}", "-dM", "-E", "-x", "c", os.devnull], where=cc)
    if r.returncode != 0 and (level == "native" or not features("native", cc)):
        return frozenset()  # the compiler fails whatever the level: its build says what is wrong
    if r.returncode != 0:
        raise CompileError(f"{cc} does not know -march={level} (from ${ENV}={os.environ.get(ENV, '')!r}): "
                           f"{r.stderr.strip().splitlines()[0] if r.stderr.strip() else 'no message'}",
                           op="compile", where=ENV)
    return frozenset(m.group(1) for m in re.finditer(r"#define (__\w+) 1$", r.stdout, re.M)
                     if re.fullmatch(r"__(SSE|AVX|FMA|F16C|AMX|BMI)\w*__|__ARM_(NEON|FEATURE_\w+)", m.group(1)))


def isa(feats: frozenset) -> Isa:
    """The Isa of a set of instruction-set macros (`features`)."""
    fma = "__FMA__" in feats or "__ARM_FEATURE_FMA" in feats
    if "__AVX512F__" in feats:
        return Isa("avx512", 16, (8, 2), True)
    if "__AVX__" in feats:
        return Isa("avx2" if "__AVX2__" in feats and fma else "avx", 8, (6, 2), fma)
    if "__ARM_NEON" in feats:
        return Isa("neon", 4, (8, 2), fma)
    if "__SSE2__" in feats:
        return Isa("sse2" if "__SSE4_1__" not in feats else "sse4", 4, (4, 2), False)
    return Isa("generic", 4, (4, 2), False)


def current(cc=None) -> Isa:
    """The Isa of the level the generated C is built for now."""
    return isa(features(march(), cc))


def runnable_levels(cc=None) -> list:
    """The levels of LEVELS this machine can execute (every macro of the level is one of
    native's), plus native itself: what tests and the gemm benchmark build for."""
    here = features("native", cc)
    levels = [lv for lv in LEVELS.get(platform.machine(), ()) if features(lv, cc) <= here]
    return levels + ["native"]


@contextlib.contextmanager
def building_for(level: str):
    """Generate and compile for -march=`level` inside the block ($POLYFT_MARCH set, then
    restored): how a test or benchmark builds the code of another ISA level."""
    old = os.environ.get(ENV)
    os.environ[ENV] = level
    try:
        features(level)  # an unknown level fails here, not at the first compile
        yield isa(features(level))
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old
