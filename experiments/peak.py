"""The theoretical single-core peak of an ISA level, from nothing the generated code shares.

peak = GHz x flops per cycle, where
* GHz is the core's clock, measured by a chain of dependent integer adds (one cycle each on
  every x86 and ARM core): the best of many short runs, since a run the scheduler preempts only
  looks slower. No vector code is involved, so a GEMM that spills cannot lower the reference;
* flops per cycle = FMA units x lanes of one unit x 2 with FMA (AVX2, AVX-512, NEON), or
  (FMA units + add units) x lanes without (SSE2, AVX: a multiply and an add are two
  instructions), where one unit's lanes are the ISA's vector width or the core's datapath,
  whichever is narrower (Zen 4 runs a 512-bit FMA on two 256-bit halves). Units and datapath
  come from the CPU's vendor and family (FP_UNITS); a core it does not know is counted as two
  FMA units as wide as the ISA, and the table says "assumed".

A measured rate above this peak is a measurement error (a wrong clock, a wrong flop count,
work not done): the gemm experiment flags such rows.
"""
from __future__ import annotations

import ctypes
import platform
import time
from typing import NamedTuple

from polyft.emit import runtime_c

CLOCK_PROBE = """double polyft_add_chain(long n)
{  /* 100 dependent adds an iteration: n * 100 cycles */
  long x = 0;
  for (long k = 0; k < n; k++)
    __asm__ volatile(
#if defined(__x86_64__)
      ".rept 100\\n\\taddq $1, %0\\n\\t.endr"
#elif defined(__aarch64__)
      ".rept 100\\n\\tadd %0, %0, #1\\n\\t.endr"
#else
#error "no clock probe for this architecture"
#endif
      : "+r"(x));
  return (double)x;
}
"""


class Units(NamedTuple):
    """A core's floating-point units: FMA units, the bits of their datapath, add-only units."""
    fma: int
    datapath: int
    adds: int
    source: str  # where the numbers come from


def cpu_identity() -> tuple:
    """(vendor, family, model, flags) from /proc/cpuinfo; empty strings and 0 where unknown."""
    vendor, family, model, flags = "", 0, 0, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "vendor_id":
                    vendor = value
                elif key == "cpu family":
                    family = int(value)
                elif key == "model":
                    model = int(value) if value.isdigit() else model
                elif key in ("flags", "Features"):
                    flags = set(value.split())
                if not line.strip() and vendor:
                    break
    except OSError:
        pass
    return vendor, family, model, flags


def fp_units(identity=None) -> Units:
    """FP_UNITS for this CPU (cpu_identity())."""
    vendor, family, model, flags = identity or cpu_identity()
    if vendor == "AuthenticAMD":
        # two FMA pipes and two add pipes since Zen 1; datapath 128 (Zen 1), 256 (Zen 2-4), 512 (Zen 5)
        datapath = 512 if family >= 0x1A else 256 if family == 0x19 or (family == 0x17 and model >= 0x30) else 128
        return Units(2, datapath, 2, f"AMD family {family:#x}")
    if vendor == "GenuineIntel":
        # two FMA ports (which also add) since Haswell; 512 bits where AVX-512 is there
        return Units(2, 512 if "avx512f" in flags else 256, 0, "Intel core")
    return Units(2, 0, 0, f"assumed ({platform.machine()})")  # datapath 0: as wide as the ISA


def flops_per_cycle(isa, units: Units) -> int:
    """Single-precision flops one core can issue a cycle at the ISA level `isa` (emit.isa.Isa)."""
    lanes = isa.lanes if not units.datapath else min(isa.lanes, units.datapath // 32)
    return 2 * units.fma * lanes if isa.fma else (units.fma + units.adds) * lanes


def clock_ghz(runs: int = 300, n: int = 5000) -> float:
    """The core's clock in GHz: the best of `runs` runs of n * 100 dependent adds."""
    lib = ctypes.CDLL(runtime_c.build(CLOCK_PROBE, ["-O1", "-fPIC", "-shared"]))
    lib.polyft_add_chain.restype, lib.polyft_add_chain.argtypes = ctypes.c_double, [ctypes.c_long]
    lib.polyft_add_chain(n)
    best = 0.0
    for _ in range(runs):
        t0 = time.perf_counter()
        lib.polyft_add_chain(n)
        best = max(best, n * 100 / (time.perf_counter() - t0) / 1e9)
    return best


def theoretical_gflops(isa, ghz: float, units: Units | None = None) -> float:
    """One core's peak GFLOP/s at the ISA level `isa` and `ghz`."""
    return ghz * flops_per_cycle(isa, units or fp_units())
